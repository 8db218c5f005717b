"""The data package's two errors, at its bottom so that every module of it can raise them.

:class:`DatasetError` refuses a dataset before training (one line, exit 2);
:class:`BadSample` is one sample that cannot be used, met while training, which the loader
leaves out and counts.
"""
from __future__ import annotations

from ..config import ConfigError


class DatasetError(ConfigError):
    """A dataset that cannot be read; the message is one line for the user."""


class BadSample(Exception):
    """One sample that cannot be read or decoded; the message names it."""
