"""Several trainings side by side in one MPI job, each on its own sub-communicator.

    mpirun -np 4 python examples/sweep_mpi.py --lr 0.05 --lr 0.2 --runs-dir runs/sweep \\
        --dataset digits --no-cuda --epochs 5

The processes of MPI_COMM_WORLD are split into as many equal groups as there are ``--lr``
values. Group g trains with the g-th rate on its own communicator (``train(cfg, comm=group)``
initialises Horovod on it, so ranks, collectives and the global batch are the group's), with
RUNS_DIR/lr<rate>/ as its --output-dir. Every other flag goes to each training as to
``hvdtrain``. At the end each group checks that its replicas hold identical parameters and
its rank 0 prints one line. Exit status: 0, 1 if a group's replicas disagree, 2 for bad usage.
"""
import argparse
import os
import sys

import numpy as np
from mpi4py import MPI  # initialises MPI before Horovod, which then reuses it

from hvdtrain import ConfigError
from hvdtrain.cli import parse_config
from hvdtrain.job import train


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lr", type=float, action="append", required=True,
                        help="learning rate of one training; repeat for each")
    parser.add_argument("--runs-dir", required=True,
                        help="each training's --output-dir is RUNS_DIR/lr<rate>")
    return parser.parse_known_args(argv)


def replica_difference(net, group) -> float:
    """Largest difference between any parameter on any rank of `group` and its rank 0."""
    largest = 0.0
    for param in net.collect_params().values():
        mine = param.data().asnumpy()
        reference = group.bcast(mine if group.rank == 0 else None, root=0)
        largest = max(largest, float(np.max(np.abs(mine - reference))))
    return group.allreduce(largest, op=MPI.MAX)


def main(argv=None) -> int:
    world = MPI.COMM_WORLD
    args, train_argv = parse_args(argv)
    if world.size % len(args.lr):
        if world.rank == 0:
            print(f"sweep_mpi: error: {world.size} processes cannot be split into "
                  f"{len(args.lr)} equal groups", file=sys.stderr)
        return 2
    per_group = world.size // len(args.lr)
    index = world.rank // per_group
    group = world.Split(color=index, key=world.rank)
    lr = args.lr[index]
    output_dir = os.path.join(args.runs_dir, f"lr{lr:g}")
    try:
        run = train(parse_config(train_argv + ["--lr", str(lr), "--output-dir", output_dir]),
                    comm=group)
    except ConfigError as err:
        if group.rank == 0:
            print(f"sweep_mpi: error: {err}", file=sys.stderr)
        return 2
    difference = replica_difference(run.net, group)
    if group.rank == 0:
        ranks = ",".join(str(r) for r in range(index * per_group, (index + 1) * per_group))
        verdict = "agree" if difference == 0 else f"DIFFER by up to {difference:g}"
        print(f"sweep: lr {lr:g} on world ranks {ranks} ({run.dist.num_workers} workers): "
              f"test accuracy {run.result['test_acc']:.4f}, replicas {verdict}, "
              f"outputs in {output_dir}", flush=True)
    return 0 if difference == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
