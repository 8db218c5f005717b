"""What the after-training programs share: one-line usage errors and exit statuses.

The statuses are the ``hvdtrain`` command's: 0 done, 1 failed (an output that could not be
written, a conversion that broke), 2 the user's mistake, said in one line (a
:class:`~hvdtrain.config.ConfigError`), 130 interrupted.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

from ..config import ConfigError
from ..report.log import error_line
from ..state.writes import OutputError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def run_program(prog: str, body: Callable[[], int]) -> int:
    """`body`'s exit status; a ConfigError becomes one line and 2, an OutputError one line
    and 1, Ctrl-C 130."""
    try:
        return body()
    except ConfigError as err:
        error_line(f"{prog}: error: {err}")
        return EXIT_USAGE
    except OutputError as err:
        error_line(f"{prog}: error: {err}")
        return EXIT_FAILED
    except KeyboardInterrupt:
        error_line(f"{prog}: interrupted")
        return 130
    except BrokenPipeError:
        # The reader left (``| head``): as other Unix tools, stop without a word, and keep
        # the interpreter's final flush from failing on the closed pipe again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13  # as if killed by SIGPIPE
