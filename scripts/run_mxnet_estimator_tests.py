#!/usr/bin/env python3
"""Run MXNet 1.9.1's own Estimator tests against hvdtrain's Estimator, their import changed.

Usage: scripts/run_mxnet_estimator_tests.py TESTS_DIR [pytest options...]
       mpirun -np N ... python scripts/run_mxnet_estimator_tests.py TESTS_DIR [...]

TESTS_DIR holds ``test_gluon_estimator.py`` and ``test_gluon_event_handler.py`` as the
apache/mxnet repository has them at tag 1.9.1 (``tests/python/unittest/``): fetch them
there; they are not part of hvdtrain. Each is copied into a temporary folder with its
imports of ``mxnet.gluon.contrib.estimator`` changed to ``hvdtrain.estimator`` (and nothing
else changed), beside shims for the two helpers they import from MXNet's own test tree
(``nose.tools.assert_raises``, which is ``pytest.raises``; ``common.TemporaryDirectory``,
below), and run by pytest in a child process. ``resnet18_v1(pretrained=True)`` (one test
asks for the model zoo's download) gets a stand-in file of random weights through MXNet's
own model store, as tests/zoo_stand_in does for the documented ``--pretrained`` lines:
nothing is downloaded.

Alone, it is one process. Under a launcher (mpirun, horovodrun) every rank runs the same
tests in the same order, its Estimators training together with the other ranks'; the
plugin ``mxnet_tests_in_step.py`` (beside this script) checks after each test that the
ranks ran the same one, ends a rank whose test waits for ever (a peer that left it early),
and exchanges the failures at the end. ``TemporaryDirectory`` is one folder shared by the
ranks of one host, as a model_dir on a shared disk would be: rank 0 alone writes a
CheckpointHandler's files, and the tests look for them on every rank.

Prints pytest's report, each line tagged ``[rank R]`` under a launcher, and a summary of
every rank's counts. Exit status: pytest's, non-zero on every rank when any rank failed
(MXTESTS_TEST_TIMEOUT: seconds a test may take before its rank is ended, default 300).
"""
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

FILES = ("test_gluon_estimator.py", "test_gluon_event_handler.py")
IMPORT = re.compile(r"^(\s*from\s+)mxnet\.gluon\.contrib\.estimator\b", re.M)
# MXNet's common.TemporaryDirectory makes and removes a folder of its own. Here the n-th one
# of a test run is the same folder on every rank (the ranks run the same tests in the same
# order), so that a rank other than 0 finds the files rank 0 wrote; it is removed with the
# whole shared folder once no rank uses it (mxnet_tests_in_step.py).
COMMON = '''"""MXNet's tests/python/unittest/common.py, the one helper these tests import."""
import contextlib
import itertools
import os

_made = itertools.count()


@contextlib.contextmanager
def TemporaryDirectory():
    path = os.path.join(os.environ["MXTESTS_SHARED_DIR"], str(next(_made)))
    os.makedirs(path, exist_ok=True)
    yield path
'''
SHIMS = {
    "nose/__init__.py": "",
    "nose/tools.py": "from pytest import raises as assert_raises  # noqa: F401\n",
    "common.py": COMMON,
}
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
from hvdtrain.report.log import launch_rank  # noqa: E402
from hvdtrain.state.lock import launch_of  # noqa: E402

# Where launchers put the number of ranks: horovodrun with Gloo, Open MPI, MPICH/PMI.
SIZE_VARIABLES = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def launch_size(environ=os.environ):
    """The number of ranks the launcher started (1 when none did)."""
    for name in SIZE_VARIABLES:
        if environ.get(name, "").isdigit():
            return int(environ[name])
    return 1


def shared_folder(size):
    """A folder every rank of this launch on this host names alike, with no collective
    (Horovod is not initialised yet, and must be initialised by the tests' own Estimators):
    named after the launch (``launch_of``: mpirun's URI, Gloo's rendezvous)."""
    launch = launch_of()
    if size == 1 or launch is None:
        return tempfile.mkdtemp(prefix="mxnet-estimator-tests-shared-")
    digest = hashlib.sha1(launch.encode()).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"mxnet-estimator-tests-shared-{digest}")
    os.makedirs(path, exist_ok=True)
    return path


def stand_in_zoo(env):
    """A random resnet18_v1 parameter file where MXNet's model store looks, its checksum
    told to the store (tests/zoo_stand_in/sitecustomize.py). Returns the MXNET_HOME made."""
    import mxnet as mx
    from mxnet.gluon.model_zoo import model_store, vision
    home = tempfile.mkdtemp(prefix="mxnet-home-")
    net = vision.resnet18_v1()
    net.initialize()
    net(mx.nd.zeros((1, 3, 32, 32)))
    models = os.path.join(home, "models")
    os.makedirs(models)
    path = os.path.join(models, "stand-in.params")
    net.save_parameters(path)
    sha1 = hashlib.sha1(open(path, "rb").read()).hexdigest()
    os.rename(path, os.path.join(models, f"resnet18_v1-{sha1[:8]}.params"))
    env.update(MXNET_HOME=home, HVDTRAIN_TEST_ZOO=f"resnet18_v1={sha1}")
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(REPO, "tests", "zoo_stand_in"),
                                         env.get("PYTHONPATH", "")])
    del model_store
    return home


def copy_tests(source, work):
    """The two test files with their imports changed, and the shims, into `work`."""
    for name in FILES:
        with open(os.path.join(source, name), encoding="utf-8") as src:
            text = src.read()
        changed, count = IMPORT.subn(r"\1hvdtrain.estimator", text)
        print(f"{name}: {count} import(s) of mxnet.gluon.contrib.estimator changed to "
              f"hvdtrain.estimator", flush=True)
        with open(os.path.join(work, name), "w", encoding="utf-8") as out:
            out.write(changed)
    for name, text in SHIMS.items():
        os.makedirs(os.path.dirname(os.path.join(work, name)) or work, exist_ok=True)
        with open(os.path.join(work, name), "w", encoding="utf-8") as out:
            out.write(text)


def run_tagged(cmd, cwd, env, tag):
    """Run `cmd`, its output line by line on standard output, each line after `tag`.

    A SIGTERM or SIGINT (the launcher ending this rank) is passed on to the child, which
    would otherwise outlive its rank."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)

    def pass_on(signum, _frame):
        proc.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, pass_on)
    for raw in proc.stdout:
        sys.stdout.write(tag + raw.decode(errors="replace"))
        sys.stdout.flush()
    return proc.wait()


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    source, pytest_args = argv[0], argv[1:]
    missing = [f for f in FILES if not os.path.isfile(os.path.join(source, f))]
    if missing:
        print(f"run_mxnet_estimator_tests.py: error: {source} holds no {', '.join(missing)}: "
              f"fetch them from apache/mxnet at tag 1.9.1, tests/python/unittest/",
              file=sys.stderr)
        return 2
    rank, size = launch_rank(), launch_size()
    work = tempfile.mkdtemp(prefix="mxnet-estimator-tests-")
    shared = shared_folder(size)
    home = None
    try:
        copy_tests(source, work)
        env = dict(os.environ, MXTESTS_RANK=str(rank), MXTESTS_SIZE=str(size),
                   MXTESTS_SHARED_DIR=shared,
                   PYTHONPATH=os.pathsep.join([work, HERE, os.environ.get("PYTHONPATH", "")]))
        home = stand_in_zoo(env)
        cmd = [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider",
               "-p", "mxnet_tests_in_step", *FILES, *pytest_args]
        return run_tagged(cmd, work, env, f"[rank {rank}] " if size > 1 else "")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if home:
            shutil.rmtree(home, ignore_errors=True)
        # Normally gone already (the plugin removes it once every rank has left the last
        # test); this is for a job that ended early, where no rank will read it again.
        if rank == 0:
            shutil.rmtree(shared, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
