"""Hostfiles, in the formats horovodrun and Open MPI read.

One host per line, ``#`` starts a comment::

    d1 slots=4        # Open MPI and horovodrun --hostfile
    d2:4              # horovodrun -H style
    d3                # one slot
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List

from ..config import ConfigError

_LINE = re.compile(r"^(?P<host>[A-Za-z0-9_.\-]+?)(?::(?P<colon>\d+))?"
                   r"(?:\s+slots\s*=\s*(?P<slots>\d+))?(?:\s+max[-_]slots\s*=\s*\d+)?$")


class HostfileError(ConfigError):
    """A hostfile that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class Host:
    """One line of a hostfile: an address and how many processes it takes."""

    address: str
    slots: int = 1

    @property
    def is_loopback(self) -> bool:
        return self.address == "localhost" or self.address.startswith("127.")


def parse_hosts(text: str, source: str = "hostfile") -> List[Host]:
    """Parse hostfile `text`; `source` names it in errors."""
    hosts = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _LINE.match(line)
        if not match or (match.group("colon") and match.group("slots")):
            raise HostfileError(f"{source}:{number}: cannot read {raw.strip()!r}; expected "
                                f"'HOST', 'HOST:SLOTS' or 'HOST slots=N'")
        slots = int(match.group("colon") or match.group("slots") or 1)
        if slots < 1:
            raise HostfileError(f"{source}:{number}: slots must be at least 1")
        hosts.append(Host(match.group("host"), slots))
    if not hosts:
        raise HostfileError(f"{source} lists no hosts")
    return hosts


def read_hostfile(path: str) -> List[Host]:
    """Read and parse the hostfile at `path`."""
    try:
        with open(path, encoding="utf-8") as src:
            text = src.read()
    except OSError as err:
        raise HostfileError(f"cannot read hostfile {path}: {err.strerror}") from None
    return parse_hosts(text, path)


_HOROVODRUN_LINE = re.compile(r"^\S+\s+slots=\d+\s*$")


def horovodrun_unreadable(text: str) -> List[int]:
    """Line numbers of a ``HOST slots=N`` hostfile that ``horovodrun --hostfile`` cannot read.

    Horovod 0.28's reader takes every line as ``HOST slots=N`` and stops with a Python
    traceback at anything else, a comment or a blank line included. A file with no
    ``slots=`` line is in another launcher's form and is not judged.
    """
    lines = text.splitlines()
    if not any("slots=" in line for line in lines):
        return []
    return [number for number, line in enumerate(lines, 1) if not _HOROVODRUN_LINE.match(line)]
