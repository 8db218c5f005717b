"""``hvdtrain-check``: check a job's ranks through the launcher the job itself will use.

Start it exactly like the training::

    horovodrun -np 8 -H d1:4,d2:4 hvdtrain-check --data-dir ~/data/cifar-10-batches-bin
    mpirun -np 8 -H d1:4,d2:4 -x PATH ... hvdtrain-check
    horovodrun --gloo -np 2 -H localhost:2 hvdtrain-check

Every rank collects its facts (host, rank, local rank, hvdtrain / MXNet / Horovod / numpy
versions and install paths, Horovod's build, visible GPUs and the one it would use, whether
``--data-dir`` holds readable dataset files). Under MPI they travel with mpi4py before Horovod
starts, so a rank whose Horovod does not load is still reported; without MPI (``horovodrun
--gloo``) they travel through the Horovod store. Rank 0 prints one table naming every rank
that differs from the rest or cannot run a job. Then a sum-allreduce through the real store
checks the data path and reports its bandwidth.

Exit status (the same on every rank): 0 all ranks ready, 1 some rank is not, 2 bad usage.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, List

import numpy as np

from ..report.log import error_line
from .rankfacts import collect, format_report, one_line

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# Set by mpirun (Open MPI) or a PMI/PMIx launcher: mpi4py can join that MPI world.
MPI_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="hvdtrain-check", description=__doc__.split("\n\n")[0].replace("``", ""),
                epilog="Start it with the launcher, hosts and options of the job.")
    p.add_argument("--data-dir", help="check on every rank that this folder opens as "
                   "training would open it (an image folder train/<class>/, val/<class>/; a "
                   "RecordIO pack train.rec/.idx, val.rec/.idx; else the CIFAR-10 binary "
                   "files) and that every rank holds the same images or pack (sample counts "
                   "and a checksum of the file list or .idx)")
    p.add_argument("--no-cuda", action="store_true", help="the job will run on the CPU")
    p.add_argument("--size-mb", type=float, default=16.0,
                   help="size of the test allreduce (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=5,
                   help="timed allreduce rounds (default: %(default)s)")
    return p


def launched_by_mpi(environ=os.environ) -> bool:
    return any(name in environ for name in MPI_ENV)


def gather_through_store(dist, facts: Dict) -> List[Dict]:
    """Every rank's `facts`, on every rank, through sum-reductions of the store."""
    blob = np.frombuffer(json.dumps(facts).encode(), dtype=np.uint8)
    sizes = np.zeros(dist.num_workers, dtype=np.float64)
    sizes[dist.rank] = blob.size
    sizes = _reduce(dist, "check.fact_sizes", sizes).astype(np.int64)
    table = np.zeros((dist.num_workers, int(sizes.max())), dtype=np.int32)
    table[dist.rank, :blob.size] = blob
    table = _reduce(dist, "check.facts", table)
    return [json.loads(bytes(row[:size].astype(np.uint8)).decode())
            for row, size in zip(table, sizes)]


def _reduce(dist, name: str, values: np.ndarray) -> np.ndarray:
    import mxnet as mx
    return dist.sum_across_workers(name, mx.nd.array(values, dtype=values.dtype)).asnumpy()


def measure_allreduce(dist, device, size_mb: float, rounds: int) -> Dict:
    """Time `rounds` sum-allreduces of `size_mb` MB of float32 and check every sum.

    A collective ends when its slowest rank does, so each round counts with the slowest
    rank's time. Bus bandwidth uses the ring's 2(n-1)/n factor, as NCCL's tests do.
    """
    import mxnet as mx
    count = max(1, int(size_mb * 2 ** 20) // 4)
    data = mx.nd.empty((count,), ctx=device, dtype=np.float32)
    expected = dist.num_workers * (dist.num_workers + 1) / 2
    times = np.zeros((dist.num_workers, rounds))
    correct = True
    for i in range(rounds + 1):  # the first round negotiates and allocates: not timed
        data[:] = dist.rank + 1
        mx.nd.waitall()
        start = time.perf_counter()
        dist.store.pushpull("check.bandwidth", data)  # in place: no copy in the timing
        data.wait_to_read()
        if i:
            times[dist.rank, i - 1] = time.perf_counter() - start
        low, high = mx.nd.min(data).asscalar(), mx.nd.max(data).asscalar()
        correct &= bool(low == high == expected)
    times = _reduce(dist, "check.times", times).max(axis=0)
    wrong = _reduce(dist, "check.wrong", np.array([0.0 if correct else 1.0]))[0]
    nbytes = count * 4
    best, median = float(times.min()), float(np.median(times))
    bus = 2 * (dist.num_workers - 1) / dist.num_workers
    return {"bytes": nbytes, "best_s": best, "median_s": median, "wrong_ranks": int(wrong),
            "algbw_gbs": nbytes / best / 1e9, "busbw_gbs": nbytes / best / 1e9 * bus}


def format_bandwidth(m: Dict, num_workers: int, device, rounds: int) -> str:
    return (f"allreduce of {m['bytes'] / 2 ** 20:g} MB float32 on {device} across "
            f"{num_workers} ranks: best {m['best_s'] * 1e3:.2f} ms, median "
            f"{m['median_s'] * 1e3:.2f} ms over {rounds} rounds; bandwidth {m['algbw_gbs']:.2f}"
            f" GB/s (bus {m['busbw_gbs']:.2f} GB/s); "
            + ("sums correct on every rank" if not m["wrong_ranks"]
               else f"WRONG sums on {m['wrong_ranks']} ranks"))


def _mpi_world(environ):
    """MPI_COMM_WORLD through mpi4py when a launcher started an MPI job, else None."""
    if not launched_by_mpi(environ):
        return None
    try:
        from mpi4py import MPI  # initialises MPI before Horovod, which then reuses it
    except ImportError:  # Horovod still joins the MPI job: the facts go through the store
        return None
    return MPI.COMM_WORLD


def run_check(args, environ=os.environ) -> int:
    """One rank's part of the check; returns the exit status every rank agrees on."""
    from ..store.dist import DistContext
    from ..store.kvstore import create_store

    world = _mpi_world(environ)
    if world is not None:
        from mpi4py import MPI
        local_rank = world.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
        facts = collect(world.rank, local_rank, args.data_dir, args.no_cuda)
        ranks, rank, via = world.gather(facts, root=0), world.rank, "mpi4py"
    else:
        try:
            dist = DistContext.from_store(create_store("horovod"))
        except Exception as err:  # pylint: disable=broad-except
            error_line(f"hvdtrain-check: error: Horovod does not start on this rank: "
                       f"{one_line(err)}")
            return EXIT_FAILED
        facts = collect(dist.rank, dist.local_rank, args.data_dir, args.no_cuda)
        ranks, rank, via = gather_through_store(dist, facts), dist.rank, "the Horovod store"
    failed = None
    if rank == 0:
        table, failed = format_report(ranks)
        _say(f"hvdtrain-check: {len(ranks)} ranks, facts gathered through {via}\n{table}")
    if world is None:
        failed = format_report(ranks)[1]  # every rank holds every rank's facts
    else:
        failed = world.bcast(failed, root=0)
        # A rank whose Horovod does not load would leave the others waiting in hvd.init().
        if not all(world.allgather(facts["build"] != "-")):
            if rank == 0:
                _say("allreduce skipped: Horovod does not load on every rank")
            return EXIT_FAILED
        dist = DistContext.from_store(create_store("horovod", comm=world))
    device = _device(facts)
    measured = measure_allreduce(dist, device, args.size_mb, args.rounds)
    if rank == 0:
        _say(format_bandwidth(measured, dist.num_workers, device, args.rounds))
    return EXIT_FAILED if failed or measured["wrong_ranks"] else EXIT_OK


def _say(text: str) -> None:
    """Print `text` in one write, so a launcher forwards it in as few pieces as it can."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _device(facts: Dict):
    """The device this rank's training would use, where the test allreduce runs."""
    import mxnet as mx
    return mx.gpu(facts["device_id"]) if facts.get("device_id", -1) >= 0 else mx.cpu()


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.size_mb <= 0 or args.rounds < 1:
        error_line("hvdtrain-check: error: --size-mb and --rounds must be positive")
        return EXIT_USAGE
    try:
        return run_check(args)
    except Exception as err:  # pylint: disable=broad-except
        # A rank failing in the check's own sums (the others end by the launcher's kill)
        error_line(f"hvdtrain-check: error: {one_line(err)}")
        return EXIT_FAILED


def run() -> None:
    """Console-script wrapper."""
    sys.exit(main())


if __name__ == "__main__":
    run()
