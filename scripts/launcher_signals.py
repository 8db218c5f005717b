"""What each launcher does with a signal sent to it: which processes receive what, whether
it forwards the signal or kills its ranks, how long before SIGKILL, and the status it ends
with when its ranks exit 75 (hvdtrain's "stopped by a signal, checkpoint saved").

Each trial starts a launcher with two probe ranks in a session of its own (as a supervisor
does), sends one signal to the launcher's pid (or to its whole process group, as Ctrl-C in a
terminal does), and watches for --watch seconds. A probe rank logs every signal it gets;
then, in mode ``ignore``, it goes on (so the time until it dies is the launcher's SIGKILL
delay) and, in mode ``exit75``, it exits 75 --save-s seconds after its first signal (a rank
saving a checkpoint, then leaving with hvdtrain's status).

    python scripts/launcher_signals.py [--launchers horovodrun,mpirun] [--modes ignore]

Prints one markdown row per trial (docs/reliability.md, "Preemption", holds the table).
Standard library only, but the probe imports mxnet in hvdtrain-launch's server role.
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

PROBE = r'''
import os, signal, sys, time
log = os.path.join(sys.argv[1], f"events-{os.getpid()}.log")
mode, save_s = sys.argv[2], float(sys.argv[3])
if os.environ.get("DMLC_ROLE") in ("server", "scheduler"):
    import mxnet  # a parameter server runs inside this import
# hvdtrain-launch numbers its workers by HVDTRAIN_LOCAL_RANK (one host here).
rank = next((os.environ[v] for v in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK",
                                     "HVDTRAIN_LOCAL_RANK") if v in os.environ), "?")
got = []
def note(text):
    with open(log, "a") as out:
        out.write(f"{time.time():.3f} {rank} {text}\n")
def on_signal(signum, _frame):
    note("got " + signal.Signals(signum).name)
    got.append(time.monotonic())
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
    signal.signal(sig, on_signal)
note(f"ready pid={os.getpid()} pgid={os.getpgid(0)}")
while True:
    time.sleep(0.05)
    if mode == "exit75" and got and time.monotonic() - got[0] >= save_s:
        note("exit 75")
        os._exit(75)
'''

BIN = os.path.dirname(sys.executable)


def command(name, probe, folder, mode, save_s):
    rank = [sys.executable, probe, folder, mode, str(save_s)]
    if name == "horovodrun":
        return [os.path.join(BIN, "horovodrun"), "-np", "2", "-H", "localhost:2"] + rank
    if name == "horovodrun-gloo":
        return [os.path.join(BIN, "horovodrun"), "--gloo", "-np", "2", "-H", "localhost:2"] + rank
    if name == "mpirun":
        return ["mpirun", "--allow-run-as-root", "--bind-to", "none", "-np", "2"] + rank
    if name == "mpirun-sigkill-30":  # mpirun with 30 s between its TERM and its KILL
        return ["mpirun", "--allow-run-as-root", "--bind-to", "none", "--mca",
                "odls_base_sigkill_timeout", "30", "-np", "2"] + rank
    if name == "hvdtrain-launch":
        return [os.path.join(BIN, "hvdtrain-launch"), "-n", "2", "-s", "1"] + rank
    raise ValueError(name)


def events(folder):
    """[(time, rank, pid, text)] from every probe's log, oldest first."""
    out = []
    for entry in os.listdir(folder):
        if entry.startswith("events-"):
            pid = int(entry[7:-4])
            with open(os.path.join(folder, entry)) as src:
                for line in src:
                    when, rank, text = line.rstrip("\n").split(" ", 2)
                    out.append((float(when), rank, pid, text))
    return sorted(out)


def trial_pids(folder):
    """Pids of the processes whose command line names `folder`."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as src:
                if entry.isdigit() and folder.encode() in src.read():
                    found.append(int(entry))
        except OSError:
            pass
    return found


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as src:
            return src.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def trial(name, signum, target, mode, watch, save_s):
    folder = tempfile.mkdtemp(prefix="sigprobe-")
    probe = os.path.join(folder, "probe.py")
    with open(probe, "w") as out:
        out.write(PROBE)
    log = open(os.path.join(folder, "launcher.log"), "w")
    proc = subprocess.Popen(command(name, probe, folder, mode, save_s), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while True:
        ranks = {pid: r for _, r, pid, text in events(folder) if text.startswith("ready")
                 and r != "?"}
        if len(ranks) >= 2 or time.monotonic() > deadline or proc.poll() is not None:
            break
        time.sleep(0.2)
    time.sleep(1.0)  # past the ranks' start
    sent = time.time()
    if target == "pid":
        os.kill(proc.pid, signum)
    else:
        os.killpg(proc.pid, signum)
    died, launcher_exit = {}, None
    end = time.monotonic() + watch
    while time.monotonic() < end:
        for pid in ranks:
            if pid not in died and not alive(pid):
                died[pid] = time.time() - sent
        if launcher_exit is None and proc.poll() is not None:
            launcher_exit = (proc.returncode, time.time() - sent)
        if launcher_exit is not None and len(died) == len(ranks):
            break
        time.sleep(0.05)
    left = [pid for pid in ranks if pid not in died]
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    # Whatever of the trial is left, in any session (hvdtrain-launch starts each process in
    # one of its own): every process whose command line names the trial's folder.
    for pid in left + trial_pids(folder):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    log.close()
    seen = {}
    for when, rank, pid, text in events(folder):
        if pid in ranks and text.startswith(("got", "exit")):
            what = text[4:] if text.startswith("got") else text
            seen.setdefault(ranks[pid], []).append(f"{what} +{when - sent:.1f}s")
    with open(os.path.join(folder, "launcher.log")) as src:
        tail = src.read()[-300:].replace("\n", " | ")
    shutil.rmtree(folder, ignore_errors=True)
    got = "; ".join(f"rank {r}: {', '.join(v)}" for r, v in sorted(seen.items())) or "nothing"
    deaths = ", ".join([f"rank {ranks[p]} +{t:.1f}s"
                        for p, t in sorted(died.items(), key=lambda item: ranks[item[0]])] +
                       [f"rank {ranks[p]} alive after {watch:.0f}s" for p in left])
    status = (f"{launcher_exit[0]} at +{launcher_exit[1]:.1f}s" if launcher_exit
              else f"running after {watch:.0f}s")
    return (f"| {name} | {signal.Signals(signum).name} to the {target} | {mode} | {got} | "
            f"{deaths} | {status} |", tail)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--launchers", default="horovodrun,horovodrun-gloo,mpirun,hvdtrain-launch")
    parser.add_argument("--signals", default="TERM,INT,USR1")
    parser.add_argument("--modes", default="ignore,exit75")
    parser.add_argument("--group-int", action="store_true",
                        help="also SIGINT to the launcher's whole process group (Ctrl-C)")
    parser.add_argument("--watch", type=float, default=20.0)
    parser.add_argument("--save-s", type=float, default=3.0)
    parser.add_argument("--verbose", action="store_true", help="print the launcher's last words")
    args = parser.parse_args()
    print("| launcher | signal | rank does | what the ranks got | ranks gone | launcher |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in args.launchers.split(","):
        for mode in args.modes.split(","):
            cases = [(getattr(signal, "SIG" + s), "pid") for s in args.signals.split(",")]
            if args.group_int:
                cases.append((signal.SIGINT, "group"))
            for signum, target in cases:
                row, tail = trial(name, signum, target, mode, args.watch, args.save_s)
                print(row, flush=True)
                if args.verbose:
                    print("    launcher said: " + tail, flush=True)


if __name__ == "__main__":
    main()
