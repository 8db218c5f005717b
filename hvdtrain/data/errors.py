"""The data package's errors, at its bottom so that every module of it can raise them.

:class:`DatasetError` refuses a dataset before training (one line, exit 2);
:class:`BadSample` is one sample that cannot be used, met while training, which the loader
leaves out and counts; :class:`UnusableLabel`, a record whose label is not one class.
"""
from __future__ import annotations

from ..config import ConfigError


class DatasetError(ConfigError):
    """A dataset that cannot be read; the message is one line for the user."""


class BadSample(Exception):
    """One sample that cannot be read or decoded; the message names it."""


class UnusableLabel(BadSample):
    """A record whose label is not one class number (a label array, a fraction): skipped
    when met in training, but refused at open, where it means the pack is not made for
    single-label classification."""
