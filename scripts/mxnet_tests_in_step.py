"""pytest plugin of run_mxnet_estimator_tests.py: the ranks of a job run MXNet's tests in step.

Every rank runs the same tests in the same order, each rank's Estimator meeting the others'
in its collectives. This plugin, loaded into each rank's pytest by the script
(``-p mxnet_tests_in_step``), keeps them honest about it:

- After each test, once Horovod is initialised (the first Estimator does it), the ranks
  exchange which test they ran and how it ended: a rank that ran another test ends the job
  in one line, and a test that ended differently on different ranks is named in the
  summary.
- A test still running after ``MXTESTS_TEST_TIMEOUT`` seconds (default 300; each takes a few
  seconds) ends its rank with one line and its threads' stacks (where it waits), and the
  launcher then ends the others: a rank that left a test early (an assertion that failed
  on it alone) leaves its peers waiting in a collective that would never complete, and
  Horovod's own default is to wait for ever.
- At the end the ranks exchange their failures: each rank's pytest exits non-zero when any
  rank failed, and the summary lists each rank's counts.
- Rank 0 removes the folder the tests' ``TemporaryDirectory`` shares among the ranks
  (``MXTESTS_SHARED_DIR``), once every rank has left the last test.

Alone (no launcher, or Horovod never initialised) it only keeps the per-test time limit.
"""
import faulthandler
import os
import shutil
import sys
import threading

import pytest

RANK = int(os.environ.get("MXTESTS_RANK", "0"))
SIZE = int(os.environ.get("MXTESTS_SIZE", "1"))
TEST_TIMEOUT = float(os.environ.get("MXTESTS_TEST_TIMEOUT", "300"))
PROGRAM = "run_mxnet_estimator_tests.py"

# This process's standard error as it was when pytest loaded the plugin (``-p``), before
# pytest's capture took file descriptor 2 over: a line written from the timer's thread in
# the middle of a test would otherwise go to the test's captured output and be lost when the
# rank ends.
_STDERR = os.dup(2)
_outcomes = {}  # nodeid -> 'passed' | 'failed' | 'error' | 'skipped', this rank's
_disagreements = []  # (nodeid, [each rank's outcome])
_ranks_summary = None  # [(rank, {outcome: count}, [failed nodeids])] once exchanged


def _say(line):
    """One line on standard error, in one write, on a line of its own (pytest's progress
    line, a dot a test, has no newline yet)."""
    os.write(_STDERR, f"\n{PROGRAM}: rank {RANK}: {line}\n".encode())


def _horovod():
    """Horovod's MXNet module when it is initialised (by an Estimator's store), else None.
    Imported from sys.modules only: this plugin must not be the one that initialises it, or
    the tests would not run as a user's program runs."""
    hvd = sys.modules.get("horovod.mxnet")
    if hvd is None or not hvd.is_initialized():
        return None
    return hvd


def _exchange(name, obj):
    """Every rank's `obj`, by rank, or None when the ranks cannot be asked (Horovod is not
    initialised: before the first Estimator, or no test made one)."""
    if SIZE == 1:
        return [obj]
    hvd = _horovod()
    if hvd is None:
        return None
    return hvd.allgather_object(obj, name=f"mxtests.{name}")


def _stuck(nodeid):
    _say(f"error: {nodeid} still running after {TEST_TIMEOUT:g} s (another rank may have "
         f"left it early and this one waits for it in a collective); its threads' stacks "
         f"follow; ending this rank")
    faulthandler.dump_traceback(_STDERR, all_threads=True)
    os._exit(3)  # pylint: disable=protected-access  # the launcher then ends the others


def pytest_runtest_logreport(report):
    """This rank's outcome of each test, from its setup, call and teardown reports."""
    if report.failed:
        _outcomes[report.nodeid] = "failed" if report.when == "call" else "error"
    elif report.skipped:
        _outcomes.setdefault(report.nodeid, "skipped")
    else:
        _outcomes.setdefault(report.nodeid, "passed")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):  # pylint: disable=unused-argument
    """The time limit around each test and its exchange; the exchange meets the ranks after
    every test, so that a rank that ran ahead is found at the next test, not in the next
    Estimator's collectives."""
    timer = threading.Timer(TEST_TIMEOUT, _stuck, args=(item.nodeid,))
    timer.daemon = True
    timer.start()
    yield
    try:
        ran = _exchange(f"after.{item.nodeid}", (item.nodeid, _outcomes.get(item.nodeid)))
    finally:
        timer.cancel()
    if ran is None:
        return
    if len({nodeid for nodeid, _ in ran}) > 1:
        _say(f"error: the ranks ran different tests: {[nodeid for nodeid, _ in ran]}; "
             f"ending this rank")
        os._exit(3)  # pylint: disable=protected-access
    if len({outcome for _, outcome in ran}) > 1:
        _disagreements.append((item.nodeid, [outcome for _, outcome in ran]))


def pytest_sessionfinish(session):
    """Every rank's failures; this rank's exit status non-zero when any rank failed."""
    global _ranks_summary  # pylint: disable=global-statement
    counts = {}
    for outcome in _outcomes.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    failed = sorted(n for n, o in _outcomes.items() if o in ("failed", "error"))
    ranks = _exchange("end", (RANK, counts, failed))
    if ranks is not None:
        _ranks_summary = ranks
        if any(f for _, _, f in ranks) and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    shared = os.environ.get("MXTESTS_SHARED_DIR")
    # After the exchange every rank has left the last test; without one, only a lone
    # process knows that no other rank still reads the folder.
    if shared and RANK == 0 and (ranks is not None or SIZE == 1):
        shutil.rmtree(shared, ignore_errors=True)


def pytest_terminal_summary(terminalreporter):
    """Each rank's counts, and the tests that ended differently on different ranks."""
    write = terminalreporter.write_line
    terminalreporter.section(f"{SIZE} rank(s)")
    if _ranks_summary is None:
        write(f"this rank's results only: Horovod was never initialised, so the {SIZE} "
              f"ranks could not be compared")
        return
    for rank, counts, failed in _ranks_summary:
        figures = ", ".join(f"{n} {o}" for o, n in sorted(counts.items()))
        write(f"rank {rank}: {figures or 'no test'}"
              + (f"; failed: {', '.join(failed)}" if failed else ""))
    for nodeid, outcomes in _disagreements:
        write(f"{nodeid}: " + ", ".join(f"{o} on rank {r}" for r, o in enumerate(outcomes)))
