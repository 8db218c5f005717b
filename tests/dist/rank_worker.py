"""One rank of a test job: train through hvdtrain's CLI path, then dump what tests compare.

Usage: python rank_worker.py OUT_DIR [hvdtrain flags...]
Writes OUT_DIR/rank<R>.json (layout and results) and OUT_DIR/rank<R>.npz (parameters).
"""
import json
import os
import socket
import sys

import numpy as np

from hvdtrain.cli import parse_config
from hvdtrain.job import train


def main():
    out_dir, argv = sys.argv[1], sys.argv[2:]
    run = train(parse_config(argv))
    dist = run.dist
    params = {f"p{i:03d}": p.data().asnumpy()
              for i, p in enumerate(run.net.collect_params().values())}
    np.savez(os.path.join(out_dir, f"rank{dist.rank}.npz"), **params)
    with open(os.path.join(out_dir, f"rank{dist.rank}.json"), "w") as out:
        json.dump({"rank": dist.rank, "local_rank": dist.local_rank,
                   "num_workers": dist.num_workers, "local_size": dist.local_size,
                   "host": socket.gethostname(),
                   "grad_buckets": len(getattr(run.trainer, "buckets", [])),
                   # over ssh: "client_ip client_port server_ip server_port"
                   "ssh_connection": os.environ.get("SSH_CONNECTION"), **run.result}, out)


if __name__ == "__main__":
    main()
