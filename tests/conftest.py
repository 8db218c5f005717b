import os
import sys

# Test helper modules (helpers.py, dist/jobs.py) are imported by name.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pytest  # noqa: E402

import helpers  # noqa: E402


@pytest.fixture(autouse=True)
def _forget_jobs():
    helpers.clear_jobs()
    yield
    helpers.clear_jobs()  # after the failure report (made before teardown) has read them


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report ends with the last lines of every process it started."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and report.when == "call":
        text = helpers.job_report()
        if text:
            report.sections.append(("output of the jobs this test started", text))


@pytest.fixture(scope="session")
def digit_images(tmp_path_factory):
    """A small generated image folder (60 digits a class: 480 train, 120 val) and its
    RecordIO pack, shared by the tests of one session: (folder, pack)."""
    from helpers import image_sets
    return image_sets(str(tmp_path_factory.mktemp("digit-images")), per_class=60)
