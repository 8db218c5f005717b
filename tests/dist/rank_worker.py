"""One rank of a test job: train through hvdtrain's CLI path, then dump what tests compare.

Usage: python rank_worker.py OUT_DIR [hvdtrain flags...]
Writes OUT_DIR/rank<R>.json (layout and results) and OUT_DIR/rank<R>.npz (every array of
the model, BatchNorm running statistics included, named as in model.params, and with --ema
every array of its moving average, named ``ema:<name>``). With
HVDTRAIN_DUMP_START=1 it also writes OUT_DIR/rank<R>-start.npz: the arrays as training
starts (after the first broadcast). With HVDTRAIN_DUMP_EPOCHS=1, OUT_DIR/rank<R>-epoch<E>.npz
after each epoch E (from 0) and OUT_DIR/rank<R>-exchanged.json: per epoch, the bytes of each
call of the Horovod store's pushpull (gradients only: bookkeeping sums go by sum_exact).
"""
import json
import os
import socket
import sys

import numpy as np

from hvdtrain.cli import parse_config
from hvdtrain.estimator import estimator
from hvdtrain.job import train


def model_arrays(net):
    """Every array of `net` (each device copy of it), named as ``save_parameters`` names
    them; device copies after the first get a ``@<n>`` suffix."""
    arrays = {}
    for name, param in net._collect_params_with_prefix().items():  # pylint: disable=protected-access
        for index, copy in enumerate(param.list_data()):
            arrays[name if index == 0 else f"{name}@{index}"] = copy.asnumpy()
    return arrays


def dump_at_start(fit):
    def wrapped(parts):
        np.savez(os.path.join(sys.argv[1], f"rank{parts.dist.rank}-start.npz"),
                 **model_arrays(parts.net))
        return fit(parts)
    return wrapped


def dump_epochs(out_dir):
    """Wrap the epoch loop and the store's pushpull to dump what HVDTRAIN_DUMP_EPOCHS asks."""
    import hvdtrain.loop.run.fit
    from hvdtrain.store.kvstore import HorovodKVStore
    exchanged, now = {}, {"epoch": None}
    pushpull, train_epoch = HorovodKVStore.pushpull, hvdtrain.loop.run.fit.train_epoch

    def counted(self, key, value, out=None, priority=0):
        arrays = value if isinstance(value, (list, tuple)) else [value]
        exchanged.setdefault(str(now["epoch"]), []).append(
            sum(int(a.size) * np.dtype(a.dtype).itemsize for a in arrays))
        return pushpull(self, key, value, out, priority)

    def epoch(loop, loader, state):
        now["epoch"] = state.epoch
        stats = train_epoch(loop, loader, state)
        rank = loop.dist.rank
        np.savez(os.path.join(out_dir, f"rank{rank}-epoch{now['epoch']}.npz"),
                 **model_arrays(loop.net))
        with open(os.path.join(out_dir, f"rank{rank}-exchanged.json"), "w") as out:
            json.dump(exchanged, out)
        return stats

    HorovodKVStore.pushpull = counted
    hvdtrain.loop.run.fit.train_epoch = epoch


def main():
    out_dir, argv = sys.argv[1], sys.argv[2:]
    if os.environ.get("HVDTRAIN_DUMP_START") == "1":
        estimator.run_fit = dump_at_start(estimator.run_fit)
    if os.environ.get("HVDTRAIN_DUMP_EPOCHS") == "1":
        dump_epochs(out_dir)
    run = train(parse_config(argv))
    dist = run.dist
    arrays = model_arrays(run.net)
    if run.ema is not None:
        arrays.update({f"ema:{name}": array for name, array in run.ema.state().items()})
    np.savez(os.path.join(out_dir, f"rank{dist.rank}.npz"), **arrays)
    with open(os.path.join(out_dir, f"rank{dist.rank}.json"), "w") as out:
        json.dump({"rank": dist.rank, "local_rank": dist.local_rank,
                   "num_workers": dist.num_workers, "local_size": dist.local_size,
                   "host": socket.gethostname(),
                   "grad_buckets": len(getattr(run.trainer, "buckets", [])),
                   # over ssh: "client_ip client_port server_ip server_port"
                   "ssh_connection": os.environ.get("SSH_CONNECTION"), **run.result}, out)


if __name__ == "__main__":
    main()
