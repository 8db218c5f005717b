"""Rows of `make bench` on a shaped link: two ranks whose every byte crosses a rate-limited
loopback, as between two hosts.

    python scripts/bench_link.py [--rate 1gbit] [--quick] [--rows LABEL,...] [--json PATH]

Each two-rank run starts in a network namespace of its own (``unshare -n``, so root),
where ``lo`` is brought up and given a ``tc`` qdisc: ``netem`` with the rate and delay
where the kernel has it, else ``tbf`` at the rate with no added delay. The ranks run under
``horovodrun --gloo``: Gloo moves Horovod's collectives over TCP only (it has no shared-memory
transport), so the gradients cross the shaped ``lo``. Two figures show they did: the bytes the
namespace's ``lo`` sent during the timed steps, per step and rank, against the gradient bytes
the rank exchanges (a two-rank ring sends each rank's whole gradient once: about 1.0), and
the bytes the qdisc itself counted over the whole run. The denominator of scaling efficiency
is two independent one-rank processes at the same time, outside any namespace (they need no
link). Every process runs with one OpenMP thread, as in `make bench`.

Note: ``lo`` is one device, so both directions of the exchange share the one rate:
two ranks each sending S bytes a step need 2S / rate seconds, where a full-duplex link of
that rate needs S / rate. Read the rate as the link's total, or halve it for one direction.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

from bench_runs import Results, hold_machine_lock, measure_until_stopped

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.dirname(sys.executable)
WORKER = [sys.executable, os.path.join(HERE, "bench_worker.py")]

# The rows issue 26 asks for, side by side: (loop, worker flags).
ROWS = {
    "plain Horovod loop": ("plain", []),
    "hvdtrain": ("hvdtrain", []),
    "hvdtrain --fp16-allreduce": ("hvdtrain", ["--fp16-allreduce"]),
    "hvdtrain --accumulate 4": ("hvdtrain", ["--accumulate", "4"]),
    "hvdtrain --fp16-allreduce --accumulate 4": ("hvdtrain", ["--fp16-allreduce",
                                                              "--accumulate", "4"]),
    # What docs/performance.md recommends at this link's compute-to-transfer ratio.
    "hvdtrain --fp16-allreduce --accumulate 8": ("hvdtrain", ["--fp16-allreduce",
                                                              "--accumulate", "8"]),
    # Issue 39: PowerSGD at an unchanged global batch, then with accumulation (every timed
    # step compressed: the worker's --powersgd-start-step is 0).
    "hvdtrain --compression powersgd --powersgd-rank 2": (
        "hvdtrain", ["--compression", "powersgd", "--powersgd-rank", "2"]),
    "hvdtrain --compression powersgd --powersgd-rank 4": (
        "hvdtrain", ["--compression", "powersgd", "--powersgd-rank", "4"]),
    "hvdtrain --compression powersgd --powersgd-rank 4 --accumulate 4": (
        "hvdtrain", ["--compression", "powersgd", "--powersgd-rank", "4", "--accumulate", "4"]),
}
# A token bucket deeper than lo's 64 KiB packets (TSO), and a queue long enough that TCP is
# slowed by the rate, not by drops.
TBF = "tbf rate {rate} burst 256kb latency 50ms"
NETEM = "netem rate {rate} delay {delay} limit 100000"
# Run in the new namespace: lo up, the qdisc, the command ("$@"), then the qdisc's counters
# into <last argument>.qdisc (the worker's --out prefix, which Runs.start appends).
SHAPE = ('ip link set lo up && {{ tc qdisc add dev lo root {netem} 2>/dev/null || '
         'tc qdisc add dev lo root {tbf}; }} && "$@"; status=$?; '
         'for last; do :; done; tc -s qdisc show dev lo > "$last.qdisc"; exit $status')


def unavailable(rate="1gbit"):
    """Why shaped runs cannot run here (one line), or None when they can."""
    for tool in ("unshare", "ip", "tc"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    probe = subprocess.run(["unshare", "-n", "sh", "-c", "ip link set lo up && tc qdisc add "
                            "dev lo root " + TBF.format(rate=rate)],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return ("cannot shape a private loopback (unshare -n + tc, which need root): " +
                (probe.stderr.strip().splitlines() or ["exit %d" % probe.returncode])[-1])
    return None


def shaped(cmd, rate, delay):
    """`cmd` run in a new network namespace whose loopback is shaped to `rate`."""
    script = SHAPE.format(netem=NETEM.format(rate=rate, delay=delay),
                          tbf=TBF.format(rate=rate))
    return ["unshare", "-n", "sh", "-c", script, "sh"] + list(cmd)


def horovodrun_gloo(np_):
    return [os.path.join(BIN, "horovodrun"), "--gloo", "-np", str(np_), "-H",
            f"localhost:{np_}"]


def bits_per_second(rate):
    """tc's rate syntax ('1gbit', '500mbit', '100kbit') in bit/s."""
    found = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate.strip().lower())
    if not found:
        raise argparse.ArgumentTypeError(f"rate {rate!r}: give e.g. 1gbit or 500mbit")
    return float(found.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[found.group(2)]


def delay_text(delay):
    """An argparse type: a netem delay (``0.1ms``, ``2ms``, ``150us``, ``1s``)."""
    if not re.fullmatch(r"\d+(\.\d+)?(us|ms|s)", delay):
        raise argparse.ArgumentTypeError(f"{delay!r} is not a delay such as 0.1ms, 150us, 1s")
    return delay


def model_name(name):
    """An argparse type: a model hvdtrain builds (checked before anything is measured)."""
    from hvdtrain.config import SMALL_MODEL_NAMES, ZOO_MODELS  # standard library only
    if name not in SMALL_MODEL_NAMES + ZOO_MODELS:
        raise argparse.ArgumentTypeError(f"{name!r} is not a model hvdtrain builds "
                                         f"(hvdtrain --help lists them)")
    return name


def rate_text(rate):
    """An argparse type: `rate` as given, once tc's syntax is checked."""
    bits_per_second(rate)
    return rate


def qdisc_counters(path):
    """(kind, bytes sent) of the root qdisc in `tc -s qdisc show` output at `path`."""
    with open(path) as out:
        text = out.read()
    kind = re.search(r"qdisc (\w+)", text).group(1)
    return kind, int(re.search(r"Sent (\d+) bytes", text).group(1))


def worker_flags(flags, batch_size, micro_batches, warmup, model):
    """The worker's flags for `micro_batches` timed micro-batches per rank, as steps."""
    accumulate = int(flags[flags.index("--accumulate") + 1]) if "--accumulate" in flags else 1
    return flags + ["--batch-size", str(batch_size), "--model", model,
                    "--steps", str(max(1, micro_batches // accumulate)),
                    "--warmup", str(max(1, warmup // accumulate))], accumulate


def measure_link(runs, label, impl, flags, args):
    """One row: the two-rank run on the shaped link and two independent processes,
    alternating for ``args.rounds`` rounds, each keeping its best (other tenants only ever
    slow a run down, as in scripts/bench.py)."""
    extra, accumulate = worker_flags(flags, args.batch_size, args.micro_batches, args.warmup,
                                     args.model)
    cmd = WORKER + ["--impl", impl, "--data", "synthetic"] + extra
    # Gloo gives up on a peer after 30 s by default: on a shared machine one rank can be
    # that much later than the other to its first collective (seen under a test suite).
    gloo = runs.with_env({"HOROVOD_GLOO_TIMEOUT_SECONDS": "300"})
    total = lambda records: sum(r["img_per_sec"] for r in records)  # noqa: E731
    together, independent = None, None
    for _ in range(args.rounds):
        proc, prefix = gloo.start(shaped(horovodrun_gloo(2) + cmd, args.rate, args.delay))
        records = gloo.collect([(proc, prefix)])
        if together is None or total(records) > total(together):
            together = records
            kind, qdisc_bytes = qdisc_counters(prefix + ".qdisc")
        records = runs.collect([runs.start(cmd) for _ in range(2)])
        if independent is None or total(records) > total(independent):
            independent = records
    two, apart = total(together), total(independent)
    root = [r for r in together if r["rank"] == 0][0]
    step_samples = args.batch_size * accumulate
    sent_per_step = root["link_bytes_per_sample"] * step_samples  # by each rank
    return {
        "impl": f"shaped {args.rate}: {label}", "data": "synthetic", "rounds": args.rounds,
        "img_per_sec_1": None, "img_per_sec_2": two, "img_per_sec_per_rank_2": two / 2,
        "independent_2": apart, "scaling_efficiency": two / apart, "allreduce_share": None,
        "peak_rss_mb": max(r["peak_rss_mb"] for r in together),
        "link": {
            "rate": args.rate, "qdisc": kind,
            "delay": args.delay if kind == "netem" else "none (no netem in this kernel)",
            "batch_size": args.batch_size, "accumulate": accumulate,
            "bytes_per_sample": root["link_bytes_per_sample"],
            "bytes_per_step_per_rank": sent_per_step,
            "gradient_bytes": root["gradient_bytes"],
            # Each rank of a two-rank ring sends its whole gradient once per step.
            "wire_over_gradient": sent_per_step / root["gradient_bytes"],
            "qdisc_bytes_whole_run": qdisc_bytes,
            "step_seconds": max(r["step_seconds"] for r in together),
            "compute_seconds_per_step": max(r["step_seconds"] for r in independent),
            # Both directions share lo's one rate (module docstring).
            "link_seconds_per_step": 2 * sent_per_step * 8 / bits_per_second(args.rate),
        },
    }


def link_rows(runs, args, add):
    """Measure the rows named by ``args.rows``, handing each to `add` as it ends."""
    for label in args.rows:
        impl, flags = ROWS[label]
        add(measure_link(runs, label, impl, flags, args))


def table(rows):
    head = ("loop", "img/s 2 ranks", "2 independent", "scaling eff.", "bytes/sample",
            "wire/gradient", "s/step", "compute s/step", "link s/step")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        link = r["link"]
        lines.append(" | ".join([
            r["impl"], f"{r['img_per_sec_2']:.1f}", f"{r['independent_2']:.1f}",
            f"{r['scaling_efficiency']:.2f}", f"{link['bytes_per_sample']:.0f}",
            f"{link['wire_over_gradient']:.3f}", f"{link['step_seconds']:.2f}",
            f"{link['compute_seconds_per_step']:.2f}", f"{link['link_seconds_per_step']:.2f}"]))
    return "\n".join("| " + line + " |" for line in lines)


def add_arguments(p):
    """The shaped-link options (shared with scripts/bench.py)."""
    p.add_argument("--rate", default="1gbit", type=rate_text, help="the loopback's rate, in tc's syntax "
                   "(both directions together; default: %(default)s)")
    p.add_argument("--delay", default="0.1ms", type=delay_text, help="added one-way delay, where the kernel "
                   "has netem (default: %(default)s)")
    p.add_argument("--micro-batches", type=int, default=16,
                   help="timed micro-batches per rank and row (default: %(default)s)")


QUICK = {"batch_size": 16, "micro_batches": 4, "warmup": 1, "rounds": 1}


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.add_argument("--warmup", type=int, default=2,
                   help="untimed micro-batches first (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--model", default="resnet18_v1", type=model_name)
    p.add_argument("--rows", default=",".join(ROWS),
                   help="comma-separated row labels (default: all): " + ", ".join(ROWS))
    p.add_argument("--rounds", type=int, default=1,
                   help="alternations of each row's two runs, best kept (default: "
                        "%(default)s)")
    p.add_argument("--json", default=os.path.join("runs", "bench_link.json"))
    p.add_argument("--quick", action="store_true",
                   help="batch 16, 4 timed micro-batches: for a test that the mode works")
    args = p.parse_args()
    if min(args.rounds, args.micro_batches, args.batch_size) < 1 or args.warmup < 0:
        p.error("--rounds, --micro-batches and --batch-size must be at least 1, --warmup "
                "at least 0")
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in args.rows if r not in ROWS]
    if unknown:
        p.error(f"--rows: unknown {unknown}; known: {', '.join(ROWS)}")
    if args.quick:  # smaller defaults; what the command line gives explicitly stays
        for name, value in QUICK.items():
            if getattr(args, name) == p.get_default(name):
                setattr(args, name, value)
    return args


def main():
    args = parse()
    reason = unavailable(args.rate)
    if reason:
        sys.exit(f"bench_link: {reason}")
    lock = hold_machine_lock()  # noqa: F841  (held until the process ends)
    results = Results(args.json, args.micro_batches, args.model)
    results.check_writable()
    measure_until_stopped(lambda _tmp, runs: link_rows(runs, args, results.add), results,
                          "bench_link", args.json)
    results.write(complete=True)
    print(table(results.rows))
    print(f"\nload average at start {results.head['load_average_at_start']:.2f}, "
          f"now {os.getloadavg()[0]:.2f}; written to {args.json}")


if __name__ == "__main__":
    main()
