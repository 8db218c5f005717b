"""scripts/run_mxnet_estimator_tests.py under a launcher, on two stand-in test files of its
own (MXNet's are not part of the repository): every rank runs the tests in step, each
line tagged by rank; a test that fails on one rank alone fails the job and is named; a
rank that leaves a test early ends the job in one line within the time limit, not never;
the tests' TemporaryDirectory is one folder for the ranks."""
import os
import re
import sys
import time

import pytest

from helpers import run_command
from jobs import HERE, JOB_TIMEOUT, launcher

pytestmark = pytest.mark.dist
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "run_mxnet_estimator_tests.py")

# Written as MXNet's tests are (the Estimator imported from MXNet, which the script changes;
# common.TemporaryDirectory); the rank from the variable the script gives each rank.
ESTIMATOR_TESTS = '''
import os
import mxnet as mx
from mxnet import gluon
from mxnet.gluon.contrib.estimator import Estimator
from common import TemporaryDirectory

RANK = int(os.environ["MXTESTS_RANK"])


def fit():
    net = gluon.nn.Dense(2)
    net.initialize()
    data = gluon.data.DataLoader(gluon.data.ArrayDataset(mx.nd.ones((16, 3)),
                                                         mx.nd.zeros((16,))), batch_size=4)
    est = Estimator(net, loss=gluon.loss.SoftmaxCrossEntropyLoss())
    est.fit(data, epochs=1)
    return est


def test_passes_on_every_rank():
    assert fit().num_workers == 2


def test_fails_on_rank_1_alone():
    assert fit().rank == 0


def test_one_folder_for_the_ranks():
    with TemporaryDirectory() as path:
        if RANK == 0:
            open(os.path.join(path, "rank0-wrote"), "w").close()
        fit()  # its collectives: rank 1 looks after rank 0 has written
        assert os.path.isfile(os.path.join(path, "rank0-wrote"))
'''
HANDLER_TESTS = '''
import os
from test_gluon_estimator import RANK, fit


def test_rank_1_may_leave_early():
    assert not (RANK == 1 and os.environ.get("LEAVE_EARLY")), "rank 1 leaves this test"
    fit()  # rank 0 waits here for a rank that has gone on to the next test
'''


# mpirun's --tag-output puts its tag before each piece it reads of a rank's output, and a
# piece may end inside a line: CI's run of 2026-12-07 read "...test_fails_on_r" then
# "[1,0]<stdout>:ank_1_alone". The script tags its own lines ("[rank R] "); mpirun's tags
# are dropped wherever they fall, so that a line is whole again.
MPIRUN_TAG = re.compile(r"\[\d+,\d+\]<std(?:out|err)>:")


def run_script(tests_dir, *args, env=None):
    proc = _run_script(tests_dir, *args, env=env)
    proc.stdout = MPIRUN_TAG.sub("", proc.stdout)
    return proc


def _run_script(tests_dir, *args, env=None):
    return run_command(launcher("ranks", 2) + ["-x", "MXTESTS_TEST_TIMEOUT", "-x", "LEAVE_EARLY",
                                               sys.executable, SCRIPT, str(tests_dir),
                                               "-p", "no:logging", *args],
                       timeout=JOB_TIMEOUT,
                       env=dict(os.environ, **{"LEAVE_EARLY": "", "MXTESTS_TEST_TIMEOUT": "300",
                                               **(env or {})}))


@pytest.fixture
def tests_dir(tmp_path):
    (tmp_path / "test_gluon_estimator.py").write_text(ESTIMATOR_TESTS)
    (tmp_path / "test_gluon_event_handler.py").write_text(HANDLER_TESTS)
    return tmp_path


def test_a_failure_on_one_rank_fails_the_job_and_is_named(tests_dir):
    proc = run_script(tests_dir)
    out = proc.stdout
    assert proc.returncode != 0, out[-3000:]
    for rank in (0, 1):  # each rank's report, tagged, and every rank's counts in it
        assert f"[rank {rank}] PASSED test_gluon_estimator.py::test_one_folder_for_the_ranks" \
            in out
        assert f"[rank {rank}] rank 0: 4 passed\n" in out
        assert f"[rank {rank}] rank 1: 1 failed, 3 passed; failed: " \
            f"test_gluon_estimator.py::test_fails_on_rank_1_alone\n" in out
        assert f"[rank {rank}] test_gluon_estimator.py::test_fails_on_rank_1_alone: passed " \
            f"on rank 0, failed on rank 1\n" in out


def test_a_rank_that_leaves_a_test_early_ends_the_job(tests_dir):
    """Rank 1 fails at the test's first line, rank 0 trains and waits for it: the job ends
    with the line naming the test after MXTESTS_TEST_TIMEOUT, not at the job's timeout."""
    began = time.monotonic()
    proc = run_script(tests_dir, "-k", "test_passes_on_every_rank or test_rank_1_may_leave_early",
                      env={"LEAVE_EARLY": "1", "MXTESTS_TEST_TIMEOUT": "10"})
    took = time.monotonic() - began
    assert proc.returncode != 0, proc.stdout[-3000:]
    # Both ranks wait from the same moment: whichever says so first ends the job.
    assert re.search(r"run_mxnet_estimator_tests.py: rank [01]: error: test_gluon_event_handler"
                     r".py::test_rank_1_may_leave_early still running after 10 s", proc.stdout)
    assert took < JOB_TIMEOUT / 2, f"{took:.0f} s"
