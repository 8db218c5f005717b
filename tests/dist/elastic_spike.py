"""Drive ``elastic_program.py`` under ``horovodrun --gloo`` elastic on two loopback hosts.

Scenarios (``--scenario``):

``kill``    4 ranks on 127.0.0.2:2 + 127.0.0.3:2; rank local 0 on 127.0.0.3 ``kill -9``s
            itself at ``--kill-step``; the driver blacklists that host, the rest go on.
``resize``  start on 127.0.0.2:2 only; the discovery output gains 127.0.0.3:2 at step
            ``--grow-at`` (scale up to 4) and loses it at ``--shrink-at`` (scale down to 2).

Prints one JSON summary: exit code, wall time, resets seen, seconds from the kill (or the
discovery change) to the first step after it, and whether every rank reported the same
parameter digest at each commit and at the end.

    python tests/dist/elastic_spike.py --scenario kill --out /tmp/spike1
"""
import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers import job_path, tool  # noqa: E402
from loopback_hosts import loopback_hosts  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# horovodrun's option that has its elastic driver log each worker's recorded state, the
# hosts it blacklists and why it stops: what a chance failure needs to explain itself.
DRIVER_LOG = ["--log-level", "INFO"]


def write_hosts(path, lines):
    with open(path + ".tmp", "w") as out:
        out.write("".join(line + "\n" for line in lines))
    os.replace(path + ".tmp", path)  # the driver polls: never let it read half a file


def run(args, folder):
    hosts_file = os.path.join(folder, "hosts")
    discover = os.path.join(folder, "discover.sh")
    with open(discover, "w") as out:
        out.write(f"#!/bin/sh\ncat {hosts_file}\n")
    os.chmod(discover, 0o755)
    marker = os.path.join(folder, "killed.json")
    both = ["127.0.0.2:2", "127.0.0.3:2"]
    write_hosts(hosts_file, both[:1] if args.scenario == "resize" else both)
    np_start = 2 if args.scenario == "resize" else 4
    with loopback_hosts(os.path.join(folder, "ssh")) as hosts:
        command = [tool("horovodrun"), "--gloo", "-np", str(np_start),
                   "--min-np", "2", "--max-np", "4", "--host-discovery-script", discover,
                   "--elastic-timeout", str(args.elastic_timeout), "--network-interface", "lo",
                   *DRIVER_LOG, "-p", str(hosts.port), "-i", hosts.key,
                   sys.executable, os.path.join(HERE, "elastic_program.py"),
                   "--steps", str(args.steps), "--commit-every", str(args.commit_every),
                   "--kill-step", str(args.kill_step if args.scenario == "kill" else -1),
                   "--marker", marker, "--state", args.state,
                   "--trainer", args.trainer, "--bucket-mb", str(args.bucket_mb),
                   "--optimizer", args.optimizer, "--weights-out", args.weights_out]
        env = dict(os.environ, PATH=job_path())
        if args.gloo_timeout:
            # How long a rank waits on a dead peer before its collective fails (Horovod's
            # default is 30 s); horovodrun passes HOROVOD_* variables to the workers.
            env["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(args.gloo_timeout)
        start = time.time()
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env)
        events, raw = [], []
        changes = []

        def reader():
            for line in proc.stdout:
                raw.append(line)
                if "{" in line and '"event"' in line:
                    try:
                        events.append(json.loads(line[line.index("{"):]))
                    except ValueError:
                        pass
                    step = events[-1].get("step", 0) if events else 0
                    if args.scenario == "vanish" and step >= 30 and not changes:
                        write_hosts(hosts_file, [])  # no usable host any more
                        changes.append(("vanish", time.time()))
                    if args.scenario == "sigterm" and step >= 30 and not changes:
                        changes.append(("sigterm", time.time()))
                        proc.send_signal(signal.SIGTERM)
                    if args.scenario == "resize":
                        if step >= args.grow_at and not changes:
                            write_hosts(hosts_file, both)
                            changes.append(("grow", time.time()))
                        elif step >= args.shrink_at and len(changes) == 1 and \
                                max_size(events) == 4:
                            write_hosts(hosts_file, both[:1])
                            changes.append(("shrink", time.time()))
        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        try:
            code = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            code = "timeout"
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        thread.join(timeout=10)
        wall = time.time() - start
        stopped = time.time()
        alive = _alive(events)  # workers left 5 s after horovodrun itself ended
        while alive and time.time() < stopped + 5:
            time.sleep(0.2)
            alive = _alive(events)
        _end_leftovers(events)
    with open(os.path.join(folder, "horovodrun.log"), "w") as out:
        out.writelines(raw)
    if os.path.exists(marker):
        with open(marker) as m:
            killed = json.load(m)
        changes.append(("kill", killed["t"]))
    result = summarise(code, wall, events, sorted(changes, key=lambda c: c[1]))
    result["workers_alive_5s_after_exit"] = len(alive)
    if args.scenario in ("sigterm", "vanish") and changes:
        result["launcher_exit_after_change_s"] = round(stopped - changes[0][1], 2)
    return result


def _alive(events):
    alive = []
    for pid in {e["pid"] for e in events}:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"elastic_program.py" in f.read():
                    alive.append(pid)
        except OSError:
            pass
    return alive


def _end_leftovers(events):
    """Kill workers of this run still alive: a worker started over ssh outlives a
    horovodrun that was stopped (seen in the spike), and would load the machine."""
    for pid in {e["pid"] for e in events}:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"elastic_program.py" in f.read():
                    os.kill(pid, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


def max_size(events):
    return max((e.get("size", 0) for e in events if e["event"] == "step"), default=0)


def step_sizes(events):
    """The world size each step of the finished run was trained at (index: 0-based step),
    from rank 0's step lines: a step trained again after a rollback counts as the last
    time."""
    sizes = {}
    for e in events:
        if e["event"] == "step" and e.get("rank") == 0:
            sizes[e["step"] - 1] = e["size"]
    return [sizes[step] for step in sorted(sizes)]


def summarise(code, wall, events, changes):
    recoveries = []
    for kind, t in changes:
        after = [e for e in events if e["event"] == "step" and e["t"] > t]
        resets = [e for e in events if e["event"] == "reset" and e["t"] > t]
        first_reset = min((e["t"] for e in resets), default=None)
        resumed = [e for e in after if first_reset and e["t"] > first_reset]
        recoveries.append(dict(
            change=kind,
            reset_after_s=round(first_reset - t, 2) if first_reset else None,
            training_again_after_s=round(resumed[0]["t"] - t, 2) if resumed else None,
            resumed_at_step=resumed[0]["step"] if resumed else None,
            size_after=resumed[0]["size"] if resumed else None))
    digests = collections.defaultdict(set)
    for e in events:
        if e["event"] in ("commit", "done", "synced"):
            digests[(e["event"], e["step"], e.get("size"))].add(e["digest"])
    # A rollback is right when every rank's parameters after the reset are bit for bit the
    # ones all ranks committed at that step before it (recorded then, not recomputed).
    kill = next((t for kind, t in changes if kind == "kill"), None)
    committed = collections.defaultdict(set)
    for e in events:
        if e["event"] == "commit" and (kill is None or e["t"] < kill):
            committed[e["step"]].add(e["digest"])
    after_kill = [e for e in events if kill and e["event"] == "synced" and e["t"] > kill]
    rollbacks = [dict(rank=e["rank"], step=e["step"],
                      matches_commit=committed.get(e["step"]) == {e["digest"]})
                 for e in after_kill]
    return dict(exit=code, wall_s=round(wall, 1),
                resets=sum(1 for e in events if e["event"] == "reset"),
                errors=[e for e in events if e["event"] in ("step_error", "waitall_error")][:4],
                sizes=sorted({e["size"] for e in events if e["event"] == "step"}),
                done=[(e["rank"], e["size"], e["step"]) for e in events if e["event"] == "done"],
                recoveries=recoveries, rollbacks=rollbacks, step_sizes=step_sizes(events),
                digest_disagreements=[list(k) for k, v in digests.items() if len(v) > 1])


def parse(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", choices=["kill", "resize", "sigterm", "vanish"], default="kill")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--commit-every", type=int, default=10)
    parser.add_argument("--kill-step", type=int, default=55)
    parser.add_argument("--grow-at", type=int, default=40)
    parser.add_argument("--shrink-at", type=int, default=120)
    parser.add_argument("--elastic-timeout", type=int, default=60)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--gloo-timeout", type=int, default=0)
    parser.add_argument("--state", choices=["spike", "gluon"], default="spike")
    parser.add_argument("--trainer", choices=["horovod", "hvdtrain", "sharded"],
                        default="horovod")
    parser.add_argument("--bucket-mb", type=float, default=0.0)
    parser.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    parser.add_argument("--weights-out", default="")
    parser.add_argument("--out", default="")
    return parser.parse_args(argv)


def command_line(parse_args, run_in, prefix):
    """What a driver's ``main`` does: parse, run in ``--out`` (or a new temporary folder),
    print the JSON summary; the exit status says whether the job exited 0."""
    args = parse_args()
    folder = args.out or tempfile.mkdtemp(prefix=prefix)
    os.makedirs(folder, exist_ok=True)
    result = dict(run_in(args, folder), folder=folder)
    print(json.dumps(result, indent=1))
    return 0 if result["exit"] == 0 else 1


def main():
    return command_line(parse, run, "elastic-spike-")


if __name__ == "__main__":
    sys.exit(main())
