"""Show the crash in Horovod 0.28.1's MXNet broadcast, and that hvdtrain's sum does not crash.

One process (or every rank of a launched job) broadcasts 64 small named arrays,
--rounds times, either through ``horovod.mxnet.broadcast_`` or through
``hvdtrain.store.broadcast.broadcast_`` (a sum-allreduce). The first can die with a
segmentation fault in ``EnqueueTensorBroadcast``; see hvdtrain/store/broadcast.py for why.
Run it several times: the crash is a race, so one clean run proves nothing::

    for i in 1 2 3 4 5 6; do python scripts/horovod_broadcast_race.py --via horovod; echo $?; done

An exit status of 0 is a clean run, 134 or 139 a crash.
"""
import argparse

import mxnet as mx

import horovod.mxnet as hvd
from hvdtrain.store.broadcast import broadcast_


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--via", choices=("horovod", "sum"), required=True,
                        help="horovod.mxnet.broadcast_, or hvdtrain's sum-allreduce")
    parser.add_argument("--rounds", type=int, default=200,
                        help="times the 64 arrays are broadcast (default 200)")
    args = parser.parse_args()
    hvd.init()
    arrays = [mx.nd.ones((4,)) * i for i in range(64)]
    for _ in range(args.rounds):
        for index, array in enumerate(arrays):
            name = f"parameter-with-a-typical-name-{index}.weight"  # longer than 15 bytes
            if args.via == "horovod":
                hvd.broadcast_(array, root_rank=0, name=name)
            else:
                broadcast_(hvd, array, name)
        mx.nd.waitall()  # every name is free again for the next round
    print(f"rank {hvd.rank()}: {args.rounds * len(arrays)} broadcasts via {args.via}, no crash")


if __name__ == "__main__":
    main()
