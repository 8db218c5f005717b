import os
import sys

# Test helper modules (helpers.py, dist/jobs.py) are imported by name.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# The suite starts about a thousand Python processes, and each imports MXNet, which imports
# distutils.version. setuptools' distutils shim (installed at interpreter start unless this
# variable says otherwise) then imports setuptools and pkg_resources: 0.15 s of a core a
# process, 8-12% of its start-up. The standard library's distutils (Python < 3.12) gives
# MXNet the same LooseVersion. Set here, every process the tests start inherits it.
if sys.version_info < (3, 12):
    os.environ.setdefault("SETUPTOOLS_USE_DISTUTILS", "stdlib")

import pytest  # noqa: E402

import ecosystem  # noqa: E402
import helpers  # noqa: E402

# GluonCV and GluonNLP, for the tests that import them here (the programs they start put
# them on their own path): apart from the venv, which the other processes see without scipy.
ecosystem.on_path()


def pytest_collection_modifyitems(items):
    """test_slow_ranks.py last: its tests wait for jobs that start with the first
    multi-process test and pause for minutes (tests/dist/conftest.py), so by the end they
    have finished while the other tests ran.

    Under several test processes (``make test`` starts three: each file whole in one of
    them, in this order, ``--no-loadscope-reorder``): before it, files holding a test marked
    `slow` first, then the other multi-process files, then the unit files, so the long files
    start early and the many short unit files fill the end, instead of one process finishing
    a long file alone. In one process the order is otherwise pytest's own."""
    waits = {item.path for item in items if item.module.__name__ == "test_slow_ranks"}
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: item.path in waits)  # a stable sort
        return
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    dist_files = {item.path for item in items if item.get_closest_marker("dist")}
    rank = {id(item): (item.path in waits, item.path not in slow_files,
                       item.path not in dist_files, index)
            for index, item in enumerate(items)}
    items.sort(key=lambda item: rank[id(item)])


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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With ``HVDTRAIN_TEST_CPU=<file>``, append each test's CPU seconds (this process, and
    the processes it started and reaped: their launchers reap the ranks) to `file`, setup and
    teardown included: where the suite's two cores go (docs/development.md)."""
    path = os.environ.get("HVDTRAIN_TEST_CPU")
    if not path:
        yield
        return
    import resource  # pylint: disable=import-outside-toplevel
    import time  # pylint: disable=import-outside-toplevel

    def cpu(who):
        usage = resource.getrusage(who)
        return usage.ru_utime + usage.ru_stime
    before = (cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN), time.monotonic())
    yield
    spent = (cpu(resource.RUSAGE_SELF) - before[0], cpu(resource.RUSAGE_CHILDREN) - before[1],
             time.monotonic() - before[2])
    with open(path, "a") as log:
        log.write(f"{item.nodeid}\t{spent[0]:.2f}\t{spent[1]:.2f}\t{spent[2]:.2f}\n")
