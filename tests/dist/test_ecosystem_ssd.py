"""GluonCV's SSD (``ssd_300_mobilenet0.25_custom``, ``pretrained_base=False``, 128 px,
synthetic boxes) trained by hvdtrain's Estimator at 2 ranks under
``replica_check='strict'`` (ssd_program.py): 3 epochs, every array identical on both
ranks, and the 16 FeatureExpander BatchNorm statistics (a SymbolBlock's auxiliary states)
the mean of what each rank's own were after its last step. Before (issue 63, finding 7)
they were never averaged: the strict check stopped both ranks after epoch 1."""
import json
import os
import sys

import numpy as np
import pytest

from helpers import run_command
from jobs import HERE, JOB_TIMEOUT, assert_same_params, launcher

pytestmark = pytest.mark.dist
EPOCHS = 3


def test_gluoncv_ssd_trains_as_one_model_with_its_expander_statistics_averaged(tmp_path):
    proc = run_command(launcher("ranks", 2) + [
        sys.executable, os.path.join(HERE, "ssd_program.py"), str(tmp_path), str(EPOCHS)],
        timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "replicas differ" not in proc.stdout
    loaded = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in (0, 1)]
    reports = [json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1)]
    arrays = [{k: v for k, v in a.items() if not k.startswith("own:")} for a in loaded]
    assert_same_params(arrays[0], arrays[1])
    assert len(reports[0]["digests"]) == EPOCHS
    assert reports[0]["digests"] == reports[1]["digests"]
    names = reports[0]["statistics"]
    assert len(names) == 16, names
    for name in names:
        own = [loaded[r][f"own:{name}"] for r in (0, 1)]
        assert not np.array_equal(own[0], own[1]), name  # each rank moved its own
        np.testing.assert_allclose(arrays[0][name], (own[0] + own[1]) / 2, rtol=1e-5,
                                   atol=1e-7, err_msg=name)
