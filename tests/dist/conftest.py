"""Fixtures of the multi-process tests."""
import os

import pytest

from paused_jobs import PausedJobs, session_folder


@pytest.fixture(scope="session")
def paused_jobs(tmp_path_factory):
    """test_slow_ranks.py's jobs (paused_jobs.py). Each spends minutes asleep while its rank
    0 pauses, so they start with the first multi-process test (see
    :func:`_start_paused_jobs_first`) and run beside the others, and their tests run last
    (tests/conftest.py): the suite pays for their start-up, not for their pauses. (While a
    rank pauses, its peer's Horovod thread spins; it is given the lowest priority then:
    paused_jobs.py.) Under ``pytest -n`` the first worker to get here starts them and the
    others join them."""
    jobs = PausedJobs(session_folder(tmp_path_factory)).start_or_join()
    yield jobs
    # A test that failed early leaves nothing running; under pytest -n another worker may
    # still be waiting for a job this one started.
    jobs.stop(others_may_wait=bool(os.environ.get("PYTEST_XDIST_WORKER")))


@pytest.fixture(scope="session", autouse=True)
def _start_paused_jobs_first(request):
    """Start the paused jobs when the session's first multi-process test starts, if a test
    of test_slow_ranks.py is selected. Every other test waits for events rather than for
    time, so a job beside it slows it at most."""
    if any(item.module.__name__ == "test_slow_ranks" for item in request.session.items):
        request.getfixturevalue("paused_jobs")
