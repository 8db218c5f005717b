"""One KVStore contract, checked on every store: horovod at 2 and 3 ranks, MXNet's own
local and device stores in one process (tests/dist/store_contract.py runs the cases)."""
import json
import os
import sys

import numpy as np
import pytest

from helpers import run_command
from jobs import JOB_TIMEOUT, launcher

pytestmark = pytest.mark.dist
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "store_contract.py")
DEVICES = ["cpu(0)", "cpu(1)"]


def expected_cases(rank, n):
    """What rank `rank` of `n` must see in each case of store_contract.py."""
    total = n * (n + 1) / 2  # every rank sends rank + 1
    return {
        "broadcast": [100.0] * 4,
        "broadcast_copies": [[100.0] * 2, [100.0] * 2, DEVICES],
        "inplace": [total, 10.0 * n],
        "out": [total] * 3, "out_value": [rank + 1.0] * 3,
        "keys_inplace": [[total] * 3, [2.0 * n] * 2],
        "keys_out": [[total] * 3, [2.0 * n] * 2],
        "keys_out_value": [[rank + 1.0] * 3, [2.0] * 2],
        # copies rank and 1 on two devices: sum over copies and ranks
        "copies_inplace": [[total] * 2, [total] * 2, DEVICES],
        "copies_out": [[total] * 2, [total] * 2],
        "copies_out_value": [[float(rank)] * 2, [1.0] * 2],
        "large_inplace": [total, total],
        "large_out": [total, total], "large_out_value": [rank + 1.0, rank + 1.0],
    }


def check_dump(dump, rank, n):
    assert (dump["rank"], dump["num_workers"]) == (rank, n)
    for kind in ("int", "str"):
        for case, want in expected_cases(rank, n).items():
            assert dump[f"{kind}.{case}"] == want, f"{dump['type']} {kind}.{case}"


def run_contract(prefix, store, out_dir, ranks):
    """Run store_contract.py for `store` (several: comma-separated, one after the other in one
    process); the dumps of each rank, for each store."""
    proc = run_command(list(prefix) + [sys.executable, SCRIPT, store, str(out_dir)],
                       timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return {name: [json.load(open(out_dir / f"{name}.store{r}.json")) for r in range(ranks)]
            for name in store.split(",")}


@pytest.mark.parametrize("ranks", [2, 3])
def test_horovod_store_keeps_the_contract(ranks, tmp_path):
    dumps = run_contract(launcher("ranks", ranks), "horovod", tmp_path, ranks)["horovod"]
    for rank, dump in enumerate(dumps):
        check_dump(dump, rank, ranks)
        assert dump["same_key"] == [[100.0] * 4, [float(ranks)] * 4]
        # float16 on the wire: each 1.0001 is rounded to 1.0 before the sum; the caller's
        # value stays float32, and with `out` it is left as it was
        assert dump["fp16"] == [float(ranks), "<class 'numpy.float32'>", 2.0 * ranks,
                                float(ranks), pytest.approx(1.0001)]
        # -0.0 arrives as 0.0 (-0.0 + 0.0), on rank 0 too: the replicas stay bit-identical.
        assert dump["broadcast_exact"] == [np.array([0.1, 0.0, 3e38], "float32").tobytes().hex(),
                                           [2**40 + 1, -5]]
        assert dump["exact_totals"] == [70000.5 * ranks + sum(range(ranks)), 3001.0 * ranks,
                                        1e6 * ranks]


def test_mxnet_stores_keep_the_same_contract(tmp_path):
    """MXNet's local and device stores, one after the other in one process (they were one
    process each, test_mxnet_stores_keep_the_same_contract[local] and [device])."""
    # The expectations were written for MXNet's stores as much as ours: run them there too.
    dumps = run_contract([], "local,device", tmp_path, 1)
    for store in ("local", "device"):
        dump, = dumps[store]
        assert dump["type"] == store
        check_dump(dump, 0, 1)
