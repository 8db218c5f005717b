#!/usr/bin/env python3
"""Run the field's ``horovod.mxnet`` scripts and tests with hvdtrain.horovod, their import changed.

Usage: scripts/run_horovod_scripts.py [--module M] [--dump DIR] [--seed S] FOLDER FILE [ARGS...]
       mpirun -np 2 ... python scripts/run_horovod_scripts.py ... FOLDER FILE [ARGS...]

FOLDER is where the user fetched the scripts (they are not part of hvdtrain), FILE a path in
it: GluonCV 0.10's ``train_horovod.py`` or ``train_ssd.py``, Horovod 0.28.1's
``test/parallel/test_mxnet1.py`` (with ``base_test_mxnet.py`` beside it and
``test/utils/common.py``), or a script of one's own. FOLDER is copied into a temporary
folder; in every ``.py`` file of the copy the imports of ``horovod.mxnet`` become imports of
``--module`` (default ``hvdtrain.horovod``; ``horovod.mxnet`` leaves them as they are, for
the side-by-side runs) and nothing else is changed but the patches the GluonCV scripts need
to run at all on a CPU host (scripts/horovod_script_patches.py, docs/horovod-field.md),
applied under either module. Horovod's test helper imports ``mock``: a shim gives it
``unittest.mock``. GluonCV is put on the path from .ecosystem/ (``make ecosystem``).

FILE named ``test_*.py`` is run by pytest (ARGS are pytest's), any other by Python (ARGS
are the script's), in a child process in FILE's folder of the copy. Alone it is one process;
under a launcher (mpirun, horovodrun) every rank runs it, its output tagged ``[rank R]``.

``--dump DIR`` puts the measurement hook (scripts/horovod_field_hook) on the path: each rank
writes its trainer's arrays before and after the first step and after each epoch, and its
step times, into DIR (scripts/compare_horovod_dumps.py reads them). ``--seed S`` seeds the
generators at start-up (S + rank), so that the runs under the two modules start alike.

Exit status: the child's; 2 for a FOLDER or FILE that is not there, or a file the patches do
not fit (another release), with one line saying so.
"""
import argparse
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)
from horovod_script_patches import PatchError, apply_patches, change_imports  # noqa: E402
from run_mxnet_estimator_tests import launch_size, run_tagged  # noqa: E402
from hvdtrain.report.log import launch_rank  # noqa: E402

PROG = "run_horovod_scripts.py"
SHIMS = {"mock.py": '"""The `mock` package Horovod\'s test helpers import, as unittest\'s."""\n'
                    "from unittest.mock import *  # noqa: F401,F403\n"}
HOOK = os.path.join(HERE, "horovod_field_hook")
ECOSYSTEM = os.path.join(REPO, ".ecosystem")


def copy_folder(source, work, module, say):
    """Copy `source` into `work`, every .py file's imports changed and its patches applied;
    the shims beside. Says what changed in each file changed."""
    copy = os.path.join(work, "src")
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__", ".git"))
    for folder, _, names in os.walk(copy):
        for name in names:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as src:
                text = src.read()
            text, imports = change_imports(text, module)
            text, patches = apply_patches(name, text)
            if imports or patches:
                say(f"{os.path.relpath(path, copy)}: {imports} import(s) of horovod.mxnet "
                    f"now of {module}, {len(patches)} patch(es)")
            with open(path, "w", encoding="utf-8") as out:
                out.write(text)
    shims = os.path.join(work, "shims")
    os.makedirs(shims)
    for name, text in SHIMS.items():
        with open(os.path.join(shims, name), "w", encoding="utf-8") as out:
            out.write(text)
    return copy, shims


def parse(argv):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", default="hvdtrain.horovod",
                        choices=("hvdtrain.horovod", "horovod.mxnet"))
    parser.add_argument("--dump", metavar="DIR",
                        help="write each rank's arrays and step times into DIR")
    parser.add_argument("--seed", type=int, help="seed the generators with SEED + rank")
    parser.add_argument("folder")
    parser.add_argument("file")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    return parser.parse_args(argv)


def main(argv):
    args = parse(argv)
    rank, size = launch_rank(), launch_size()
    tag = f"[rank {rank}] " if size > 1 else ""
    if not os.path.isfile(os.path.join(args.folder, args.file)):
        print(f"{PROG}: error: {args.folder} holds no {args.file}: fetch the scripts there "
              f"first (docs/horovod-field.md)", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="horovod-scripts-")
    try:
        try:
            copy, shims = copy_folder(args.folder, work, args.module,
                                      lambda line: print(tag + line, flush=True))
        except PatchError as err:
            print(f"{PROG}: error: {err}", file=sys.stderr)
            return 2
        path = os.path.join(copy, args.file)
        paths = [shims, REPO] + ([HOOK] if args.dump or args.seed is not None else [])
        env = dict(os.environ, HVDFIELD_RANK=str(rank),
                   PYTHONPATH=os.pathsep.join(paths + [os.environ.get("PYTHONPATH", ""),
                                                       ECOSYSTEM]))
        if args.dump:
            env["HVDFIELD_DUMP"] = os.path.abspath(args.dump)
        if args.seed is not None:
            env["HVDFIELD_SEED"] = str(args.seed)
        if os.path.basename(path).startswith("test_"):
            cmd = [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", path,
                   *args.args]
        else:
            cmd = [sys.executable, path, *args.args]
        return run_tagged(cmd, os.path.dirname(path), env, tag)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
