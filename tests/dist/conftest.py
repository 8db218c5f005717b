"""Fixtures of the multi-process tests."""
import pytest

from paused_jobs import start_paused_jobs


@pytest.fixture(scope="session")
def paused_jobs(tmp_path_factory):
    """test_slow_ranks.py's jobs (paused_jobs.py). Each spends minutes asleep while its rank
    0 pauses, so they start with the first multi-process test (see
    :func:`_start_paused_jobs_first`) and run beside the others: the suite pays for their
    start-up, not for their pauses."""
    jobs = start_paused_jobs(tmp_path_factory)
    yield jobs
    for started, _ in jobs.values():
        started.kill()  # a test that failed early leaves nothing running


@pytest.fixture(scope="session", autouse=True)
def _start_paused_jobs_first(request):
    """Start the paused jobs when the session's first multi-process test starts, if a test
    of test_slow_ranks.py is selected. Their pauses are sleeps, and every other test waits
    for events rather than for time, so the other tests do not notice them."""
    if any(item.module.__name__ == "test_slow_ranks" for item in request.session.items):
        request.getfixturevalue("paused_jobs")
