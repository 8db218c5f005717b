"""A validation DataLoader's ``last_batch='discard'`` is not followed (every sample is scored
once over the ranks), and that is said in a warning rather than done silently."""
import logging

import numpy as np
from mxnet import gluon

from hvdtrain.data.reshard import ShardedLoader


def test_a_validation_loaders_discard_is_named_in_a_warning_and_every_sample_scored(caplog):
    data = gluon.data.ArrayDataset(np.arange(21, dtype=np.float32))
    loader = gluon.data.DataLoader(data, batch_size=4, last_batch="discard")
    with caplog.at_level(logging.WARNING, logger="hvdtrain"):
        shards = [ShardedLoader(loader, 2, rank, False, 42) for rank in (0, 1)]
    assert sum("last_batch='discard' is not followed" in r.message for r in caplog.records) == 2
    scored = sorted(float(v) for shard in shards for batch in shard for v in batch.asnumpy())
    assert scored == list(range(21))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hvdtrain"):
        ShardedLoader(loader, 2, 0, True, 42)  # training follows it: no warning
    assert not caplog.records
