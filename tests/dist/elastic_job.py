"""Drive ``hvdtrain --elastic`` under ``horovodrun --gloo`` elastic on two loopback hosts.

The job trains digits on 127.0.0.2:2 + 127.0.0.3:2 (4 ranks). Events happen at points of
rank 0's log (``--log-interval 1``: a line per step), named ``EPOCH:STEP`` (1-based epoch,
step within it), in order, each once its point has passed and the reset the one before
caused has been logged:

``--leave E:S``   127.0.0.3 leaves the discovery output (the job goes on with 2 ranks)
``--back E:S``    it returns (the job grows back to 4 at the next commit)
``--kill E:S``    ``kill -9`` of the worker with local rank 0 on 127.0.0.3 (or
                  ``--kill-host``; its host is blacklisted; the job goes on with 2 ranks)
``--freeze E:S``  ``SIGSTOP`` to that worker instead: alive, but silent
``--vanish E:S``  the discovery output becomes empty
``--sigterm E:S`` SIGTERM to horovodrun

``--hosts`` names other loopback hosts (``127.0.0.2:1,127.0.0.3:1,127.0.0.4:1``: 3 ranks, one
a host, so that the driver's blacklisting of a failed worker's host leaves 2); ``--fault``
sets the fault switch (``HVDTRAIN_FAULT_AT``, hvdtrain/store/sites.py) on every worker, and
the first line naming the fault is an event (``fault``) too; ``--commits DIR`` runs
``elastic_commits.py``, which records each commit and restore there.

Prints one JSON summary: exit code, wall time, when each event happened and when rank 0
next logged a training step after it, the ``elastic`` lines of every rank, the records of
``metrics.jsonl``, how long after horovodrun ended its last worker was gone, and how many
were still alive ``LEFTOVER_BOUND_S`` after it (then killed).

    python tests/dist/elastic_job.py --kill 2:10 --out /tmp/ej1
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from elastic_spike import DRIVER_LOG, command_line, write_hosts  # noqa: E402
from helpers import job_path, tool  # noqa: E402
from loopback_hosts import loopback_hosts  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BOTH = ["127.0.0.2:2", "127.0.0.3:2"]
EPOCH_LINE = re.compile(r"\] INFO epoch (\d+)/\d+ ")
STEP_LINE = re.compile(r"\] INFO   step (\d+)/\d+ ")
RESET_LINE = re.compile(r"\] INFO elastic reset: ")
SYNC_LINE = re.compile(r"elastic: rank (\d+) of (\d+) synced at step (\d+), arrays (\w+)")
# Horovod 0.28.1's Gloo at times aborts a surviving worker as its peer dies (docs/elastic.md,
# "A survivor that Gloo aborts"): the line such a worker leaves.
GLOO_ABORT = "terminate called after throwing an instance of 'gloo::EnforceNotMet'"
LEFTOVER_BOUND_S = 30  # a worker still alive this long after horovodrun ended was left behind
FAULT_LINE = "fault injected at "  # store/agree.py's FaultInjected


def job_pids(marker):
    """Pids of this job's workers: hvdtrain processes whose command names `marker`."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            if marker.encode() not in cmd or b"horovodrun" in cmd:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if b"HOROVOD_RANK" in env and b"python" in cmd.split(b"\0")[0]:
            found[int(pid)] = (env.get(b"HOROVOD_HOSTNAME", b"").decode(),
                               int(env.get(b"HOROVOD_LOCAL_RANK", b"-1")))
    return found


def point(text):
    if not text:
        return None
    epoch, step = text.split(":")
    return int(epoch), int(step)


def run(args, folder):
    os.makedirs(folder, exist_ok=True)
    hosts_file = os.path.join(folder, "hosts")
    discover = os.path.join(folder, "discover.sh")
    with open(discover, "w") as out:
        out.write(f"#!/bin/sh\ncat {hosts_file}\n")
    os.chmod(discover, 0o755)
    hosts_given = args.hosts.split(",")
    workers = sum(int(host.split(":")[1]) for host in hosts_given)
    write_hosts(hosts_file, hosts_given)
    output = os.path.join(folder, "out")
    events = [(name, point(getattr(args, name))) for name in
              ("leave", "back", "kill", "freeze", "vanish", "sigterm") if getattr(args, name)]
    events.sort(key=lambda e: e[1])
    addresses = tuple(host.split(":")[0] for host in hosts_given)
    with loopback_hosts(os.path.join(folder, "ssh"), addresses=addresses) as hosts:
        if args.plain:  # the reference: the same job, not elastic, never disturbed
            launch = ["-H", args.hosts]
        else:
            launch = ["--min-np", "2", "--max-np", str(workers),
                      "--host-discovery-script", discover,
                      "--elastic-timeout", str(args.elastic_timeout)]
        if args.record:
            os.makedirs(args.record, exist_ok=True)
            program = [sys.executable, os.path.join(HERE, "elastic_ids.py"), args.record]
        elif args.commits:
            os.makedirs(args.commits, exist_ok=True)
            program = [sys.executable, os.path.join(HERE, "elastic_commits.py"), args.commits]
        elif args.program == "estimator":
            program = [sys.executable, os.path.join(HERE, "estimator_elastic.py")]
        else:
            program = [tool("hvdtrain")]
        command = [tool("horovodrun"), "--gloo", "-np", str(workers)] + launch + [
                   "--network-interface", "lo", *DRIVER_LOG, "-p", str(hosts.port),
                   "-i", hosts.key] + \
            program + ["--dataset", "digits", "--no-cuda"] + \
            ([] if args.plain else ["--elastic", "--commit-every", str(args.commit_every)]) + [
                   "--epochs", str(args.epochs), "--batch-size", "8",
                   "--lr", "0.05", "--log-interval", "1", "--no-progress",
                   "--output-dir", output,
                   "--resume", "auto", "--data-workers", "0"] + args.extra
        env = dict(os.environ, PATH=job_path(),
                   HOROVOD_GLOO_TIMEOUT_SECONDS=str(args.gloo_timeout))
        if args.fault:
            env["HVDTRAIN_FAULT_AT"] = args.fault  # horovodrun passes it to every worker
        start = time.time()
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env, start_new_session=True)
        raw, happened, steps, resets, faulted = [], [], [], [], []
        epoch_done = [0]

        def act(name):
            if name == "leave":
                write_hosts(hosts_file, hosts_given[:1])
            elif name == "back":
                write_hosts(hosts_file, hosts_given)
            elif name == "vanish":
                write_hosts(hosts_file, [])
            elif name == "sigterm":
                proc.send_signal(signal.SIGTERM)
            elif name in ("kill", "freeze"):
                victims = [pid for pid, (host, local) in job_pids(output).items()
                           if host == args.kill_host and local == 0]
                for pid in victims[:1]:
                    os.kill(pid, signal.SIGKILL if name == "kill" else signal.SIGSTOP)
            happened.append((name, time.time()))

        def reader():
            for line in proc.stdout:
                raw.append(line)
                if FAULT_LINE in line and not faulted:
                    faulted.append(("fault", time.time()))
                if RESET_LINE.search(line):
                    resets.append(time.time())
                match = EPOCH_LINE.search(line)
                if match:
                    epoch_done[0] = int(match.group(1))
                match = STEP_LINE.search(line)
                if match:
                    steps.append(time.time())
                    where = (epoch_done[0] + 1, int(match.group(1)))
                    # An event waits for its point and for the reset the one before it
                    # caused (else a host could return before the driver saw it leave).
                    while len(happened) < len(events) and where >= events[len(happened)][1] \
                            and (not happened or any(r > happened[-1][1] for r in resets)):
                        act(events[len(happened)][0])
        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        try:
            code = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            code = "timeout"
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        ended = time.time()
        thread.join(timeout=10)
        # A bound, not a measurement: each worker's lifeline checks its launchers once a
        # second, and on a busy machine its exit can take seconds more.
        alive = job_pids(output)
        while alive and time.time() - ended < LEFTOVER_BOUND_S:
            time.sleep(0.5)
            alive = job_pids(output)
        gone_after = round(time.time() - ended, 1) if not alive else None
        for pid in alive:  # leave nothing behind to load the machine (a stopped one too)
            os.kill(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGCONT)
    with open(os.path.join(folder, "horovodrun.log"), "w") as out:
        out.writelines(raw)
    metrics = []
    if os.path.exists(os.path.join(output, "metrics.jsonl")):
        with open(os.path.join(output, "metrics.jsonl")) as src:
            metrics = [json.loads(line) for line in src if line.strip()]
    syncs = [dict(zip(("rank", "size", "step", "digest"), m.groups()))
             for m in (SYNC_LINE.search(line) for line in raw) if m]
    return dict(
        exit=code, wall_s=round(ended - start, 1), folder=folder,
        events=[dict(name=name, at_s=round(t - start, 1),
                     training_again_after_s=_training_again(t, resets, steps),
                     launcher_exit_after_s=round(ended - t, 2))
                for name, t in happened + faulted],
        syncs=syncs, metrics=metrics, alive_after_exit=len(alive),
        workers_gone_after_s=gone_after,
        errors=[line.strip() for line in raw if "error" in line.lower()][-6:],
        gloo_aborted_a_survivor=any(GLOO_ABORT in line for line in raw),
        fault_lines=[line.strip() for line in raw if FAULT_LINE in line],
        tracebacks=sum("Traceback" in line for line in raw))


def _training_again(t, resets, steps):
    """Seconds from `t` to rank 0's first training step after the first reset since `t`."""
    reset = next((r for r in resets if r > t), None)
    step = next((s for s in steps if reset is not None and s > reset), None)
    return None if step is None else round(step - t, 2)


def parse(argv=None):
    parser = argparse.ArgumentParser()
    for name in ("leave", "back", "kill", "freeze", "vanish", "sigterm"):
        parser.add_argument("--" + name, default="", metavar="EPOCH:STEP")
    parser.add_argument("--kill-host", default="127.0.0.3",
                        help="--kill's victim: the worker with local rank 0 on this host "
                             "(127.0.0.2's is rank 0)")
    parser.add_argument("--hosts", default=",".join(BOTH),
                        help="the loopback hosts and their slots (every slot a worker)")
    parser.add_argument("--fault", default="", metavar="SITE:RANK:N",
                        help="HVDTRAIN_FAULT_AT for every worker")
    parser.add_argument("--commits", default="",
                        help="run elastic_commits.py, recording each commit and restore here")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--commit-every", type=int, default=5)
    parser.add_argument("--gloo-timeout", type=int, default=10)
    parser.add_argument("--elastic-timeout", type=int, default=60)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--out", default="")
    parser.add_argument("--plain", action="store_true",
                        help="the reference: horovodrun -np 4 -H both hosts, no --elastic")
    parser.add_argument("--program", choices=("hvdtrain", "estimator"), default="hvdtrain",
                        help="estimator: a user's model through the Estimator "
                             "(estimator_elastic.py) instead of the hvdtrain command")
    parser.add_argument("--record", default="",
                        help="run elastic_ids.py, recording each trained batch's ids here")
    parser.add_argument("extra", nargs="*", help="more hvdtrain flags, after --")
    return parser.parse_args(argv)


def main():
    return command_line(parse, run, "elastic-job-")


if __name__ == "__main__":
    sys.exit(main())
