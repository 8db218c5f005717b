#!/usr/bin/env python3
"""Run MXNet 1.9.1's own Estimator tests against hvdtrain's Estimator, their import changed.

Usage: scripts/run_mxnet_estimator_tests.py TESTS_DIR [pytest options...]

TESTS_DIR holds ``test_gluon_estimator.py`` and ``test_gluon_event_handler.py`` as the
apache/mxnet repository has them at tag 1.9.1 (``tests/python/unittest/``): fetch them
there; they are not part of hvdtrain. Each is copied into a temporary folder with its
imports of ``mxnet.gluon.contrib.estimator`` changed to ``hvdtrain.estimator`` (and nothing
else changed), beside shims for the two helpers they import from MXNet's own test tree
(``nose.tools.assert_raises``, which is ``pytest.raises``; ``common.TemporaryDirectory``,
which is ``tempfile.TemporaryDirectory``), and run by pytest in this process: one rank, no
launcher. ``resnet18_v1(pretrained=True)`` (one test asks for the model zoo's download) gets
a stand-in file of random weights through MXNet's own model store, as tests/zoo_stand_in
does for the documented ``--pretrained`` lines: nothing is downloaded.

Prints pytest's report; exit status is pytest's.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

FILES = ("test_gluon_estimator.py", "test_gluon_event_handler.py")
IMPORT = re.compile(r"^(\s*from\s+)mxnet\.gluon\.contrib\.estimator\b", re.M)
SHIMS = {
    "nose/__init__.py": "",
    "nose/tools.py": "from pytest import raises as assert_raises  # noqa: F401\n",
    "common.py": "from tempfile import TemporaryDirectory  # noqa: F401\n",
}
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def stand_in_zoo(env):
    """A random resnet18_v1 parameter file where MXNet's model store looks, its checksum
    told to the store (tests/zoo_stand_in/sitecustomize.py)."""
    import hashlib
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
    work = tempfile.mkdtemp(prefix="mxnet-estimator-tests-")
    try:
        for name in FILES:
            with open(os.path.join(source, name), encoding="utf-8") as src:
                text = src.read()
            changed, count = IMPORT.subn(r"\1hvdtrain.estimator", text)
            print(f"{name}: {count} import(s) of mxnet.gluon.contrib.estimator changed to "
                  f"hvdtrain.estimator")
            with open(os.path.join(work, name), "w", encoding="utf-8") as out:
                out.write(changed)
        for name, text in SHIMS.items():
            os.makedirs(os.path.dirname(os.path.join(work, name)) or work, exist_ok=True)
            with open(os.path.join(work, name), "w", encoding="utf-8") as out:
                out.write(text)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [work, os.environ.get("PYTHONPATH", "")]))
        stand_in_zoo(env)
        return subprocess.call([sys.executable, "-m", "pytest", "-rA", "-p",
                                "no:cacheprovider", *FILES, *pytest_args], cwd=work, env=env)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
