"""How an Estimator's refusals reach a program: in the program's own terms, and, when the
program does not catch them, as one line and an exit status, as the ``hvdtrain`` command
gives them.

- :func:`in_keywords`: hvdtrain's messages name the command's flags (``--output-dir``,
  ``--resume auto``); a program sets the same settings as the Estimator's keywords
  (``output_dir``, ``resume='auto'``), and its refusals say those.
- :func:`one_line_errors`: an hvdtrain error no code catches (a setting refused: exit 2; an
  output that cannot be written: exit 1) prints ``PROGRAM: error: MESSAGE`` on each rank
  that raised it, instead of a traceback, and the process ends at once: a normal
  interpreter shutdown would wait in Horovod's or ps-lite's finalizers for peers that may
  be gone. Any other exception is left to the hook that was there before.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
import sys

from ..config import ConfigError, RunConfig
from ..report.log import error_line
from ..state.writes import OutputError

EXIT_USAGE, EXIT_FAILED = 2, 1
_FIELDS = {f.name for f in dataclasses.fields(RunConfig)}
_FLAG = re.compile(r"--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")


def in_keywords(message: str) -> str:
    """`message` with each of RunConfig's flags as the Estimator's keyword: ``--resume
    auto`` as ``resume='auto'``, ``--output-dir`` as ``output_dir``."""
    message = message.replace("--resume auto", "resume='auto'")

    def keyword(found):
        name = found.group(1).replace("-", "_")
        return name if name in _FIELDS else found.group(0)
    return _FLAG.sub(keyword, message)


def keyword_errors(method):
    """`method` (the Estimator's constructor, ``fit``) raising its ConfigErrors in the
    program's keywords (:func:`in_keywords`), unless the program is the command."""
    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except ConfigError as err:
            setup = getattr(self, "setup", None)
            if setup is not None and setup.command:
                raise
            reworded = type(err)(in_keywords(str(err)))
            reworded.__dict__.update(err.__dict__)  # an agreed error's ranks and store
            raise reworded from None
    return wrapped


def program_name() -> str:
    """How the program's one lines name it (``regression.py``), as argparse would."""
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"


def in_program(line: str) -> str:
    """A stop's line in the program's terms: an error (the engine writes ``hvdtrain: error:
    ...``) named after the program, as its other one lines are, and the Estimator's
    keywords for the command's flags. (A preemption's ``hvdtrain: stopped at step ...``
    keeps its name: wrappers look for it.)"""
    if line.startswith("hvdtrain: error: "):
        line = f"{program_name()}: error: " + line[len("hvdtrain: error: "):]
    return in_keywords(line)


def one_line_errors() -> None:
    """Install the hook (see the module) once per process."""
    previous = sys.excepthook
    if getattr(previous, "hvdtrain_one_line", False):
        return

    def hook(kind, value, traceback):
        if not issubclass(kind, (ConfigError, OutputError)):
            previous(kind, value, traceback)
            return
        error_line(f"{program_name()}: error: {value}")
        logging.shutdown()
        sys.stdout.flush()
        os._exit(EXIT_USAGE if issubclass(kind, ConfigError) else EXIT_FAILED)  # pylint: disable=protected-access

    hook.hvdtrain_one_line = True
    sys.excepthook = hook
