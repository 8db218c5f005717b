"""Horovod's own horovodrun, with its build check asked once for the whole test suite.

Before every launch horovodrun asks whether Horovod was built with MPI (and, for ``--gloo``
or elastic runs, with Gloo) by importing each framework's extension in a forked child; for
MXNet's that imports MXNet: a second of a core, and a second of waiting, at every launch.
``horovodrun -np 2 -H localhost:2 true`` took 1.25-1.33 s (1.35-1.55 s of CPU) against
0.27-0.38 s (0.35-0.42 s) with the answer known (the 2-core VM, 2026-12-06): about 35 s of
CPU over a `make test` (docs/development.md), where the launcher is the subject. The answer depends only on the Horovod that is
installed, so the first launch asks Horovod's own check and writes the answer to a file,
keyed by Horovod's version and its MXNet extension's size and time; later launches read it.
Everything else, the launch itself included, is horovodrun's own code.

helpers.py writes the ``horovodrun`` that the tests run (first on their PATH): this Python,
this module, and the file for the answers.
"""
import glob
import json
import os

import horovod
import horovod.runner.launch as launch

CHECKS = ("mpi_built", "gloo_built")  # the two that horovodrun asks before a launch


def installed_key():
    """What the answers depend on: Horovod's version and its MXNet extension's file."""
    libs = sorted(glob.glob(os.path.join(os.path.dirname(horovod.__file__), "mxnet",
                                         "mpi_lib*.so")))
    stats = [(os.path.basename(p), os.stat(p).st_size, os.stat(p).st_mtime_ns) for p in libs]
    return json.dumps([horovod.__version__, stats])


def remembered(name, check, answers_file):
    """`check` (one of Horovod's), its answer read from `answers_file` when known there."""

    def answer(verbose=False):
        if verbose:  # --verbose asks for the check's own lines
            return check(verbose=verbose)
        key = installed_key()
        try:
            with open(answers_file) as src:
                saved = json.load(src)
        except (OSError, ValueError):
            saved = {}
        if not isinstance(saved, dict) or not isinstance(saved.get("answers"), dict):
            saved = {}
        if saved.get("key") == key and name in saved.get("answers", {}):
            return saved["answers"][name]
        value = check(verbose=verbose)
        if value is not True:  # a failed or negative check (an import that broke) is asked again
            return value
        if saved.get("key") != key:
            saved = {"key": key, "answers": {}}
        saved["answers"][name] = value
        part = f"{answers_file}.{os.getpid()}"
        try:
            with open(part, "w") as out:
                json.dump(saved, out)
            os.replace(part, answers_file)  # concurrent launches: each write is whole
        except OSError:  # unwritable: the launch goes on, the next one asks again
            if os.path.exists(part):
                os.remove(part)
        return value

    return answer


def main(answers_file):
    """Run horovodrun's command line with its build checks remembered in `answers_file`."""
    for name in CHECKS:
        setattr(launch, name, remembered(name, getattr(launch, name), answers_file))
    return launch.run_commandline()
