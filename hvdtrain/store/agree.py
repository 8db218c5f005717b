"""Agree, then act: the one way the ranks decide something together.

Every decision that more than one rank takes (save now, stop now, a refused sampler, a
stale gradient, which checkpoint to resume) goes through :func:`agree`: each rank brings
its verdict (ok, or a reason; an exception raised while it formed the verdict is one) and
optionally a payload of numbers, and one collective, named by the site alone, gives every
rank the same result: the payloads summed, and, where any rank had a reason, the same
:class:`AgreedError` raised on every rank with the same one line.

The rule (docs/reliability.md, "Agree, then act"):

- no rank raises, returns or skips alone between two collectives its peers will enter:
  what can fail before a collective is formed inside :class:`Agreement` (or passed to
  :func:`agree` as a reason), so the failure travels in the collective instead;
- a collective's name never depends on a rank's own data (a size, a count, a path): it is
  the site's name, plus a key every rank has alike;
- state that is saved or restored is computed into locals first, then assigned together.

Adding a collective: an entry in :data:`SITES` (an unregistered name is refused on every
rank alike), and the site in tests/dist/test_agree_faults.py's list: the fault switch
(``HVDTRAIN_FAULT_AT=<site>:<rank>``, set only by that test's harness) makes that rank fail
there, and every rank must leave within the stall timeout with one line.
"""
from __future__ import annotations

import logging
import os
from typing import Callable, Optional, Sequence

import mxnet as mx
import numpy as np

from ..config import ConfigError
from .sites import FAULT_ENV, SITES, site_of

logger = logging.getLogger("hvdtrain")

REASON_WORDS = 128  # a reason travels as 4 bytes a float64 word: up to 512 bytes of UTF-8
_OK, _USAGE, _FAILED = 0, 1, 2  # a rank's verdict: its kind of failure picks the exit status


class _Agreed:
    """What every agreed error holds: the line (its message), the site, the ranks that
    failed there, and the way out."""

    status = 1

    def __init__(self, line: str, site: str = "", ranks: Sequence[int] = (), dist=None):
        super().__init__(line)
        self.site, self.ranks, self._dist = site, list(ranks), dist

    @property
    def line(self) -> str:
        return str(self)

    def leave(self) -> None:
        """After the line is printed: :func:`leave`."""
        leave(self._dist)


class AgreedError(_Agreed, RuntimeError):
    """Some rank could not go on at a site; every rank raises this at the same point, with
    the same one line (:attr:`line`). Exit status 1; :meth:`leave` (a last collective,
    then the store's orderly shutdown) after the line is printed."""


class AgreedConfigError(_Agreed, ConfigError):
    """:class:`AgreedError` where the failing rank's reason was bad input (exit status 2)."""

    status = 2


class FaultInjected(RuntimeError):
    """The failure ``HVDTRAIN_FAULT_AT`` asks for (tests only)."""


# Calls of the faulted site so far (``<site>:<rank>:<n>`` fails the n-th): counted only
# while the test harness's variable is set, in this process alone.
_FAULT_CALLS = {}


def fault_due(site: str, rank: int, environ=os.environ) -> bool:
    """Whether the test harness asked this rank to fail at `site` now
    (``HVDTRAIN_FAULT_AT=<site>:<rank>[:<n>]``: at its n-th call there, 1 by default)."""
    wanted = environ.get(FAULT_ENV, "")
    if not wanted:
        return False
    name, at, nth = (wanted.split(":") + ["1"])[:3]
    if name != site or not at.isdigit() or int(at) != rank:
        return False
    _FAULT_CALLS[site] = _FAULT_CALLS.get(site, 0) + 1
    return _FAULT_CALLS[site] == int(nth)


def fault_named(name: str, rank: int) -> None:
    """:func:`fault_point` for a store sum named `name` (its site's name, and a key);
    the primitive's own sums (``agree.*``) are faulted by :func:`agree`."""
    site = site_of(name)
    if site is not None and not name.startswith("agree.") and fault_due(site, rank):
        raise FaultInjected(f"fault injected at {site} on rank {rank} ({FAULT_ENV})")


def fault_point(site: str, rank: int) -> None:
    """Raise :class:`FaultInjected` here if asked to: before a data exchange no verdict
    rides (a failing rank leaves, and the launcher or the stall bound ends the others), or
    where the failure is kept and agreed later (the training step's pass,
    loop/engine/step_verdict.py)."""
    _registered(site)
    if fault_due(site, rank):
        raise FaultInjected(f"fault injected at {site} on rank {rank} ({FAULT_ENV})")


def _registered(site: str) -> None:
    if site not in SITES:
        raise RuntimeError(f"collective site {site!r} has no entry in hvdtrain/store/sites.py "
                           f"(add one, and its fault test)")


def agree(dist, site: str, reason=None, payload=None, key: str = "") -> np.ndarray:
    """Every rank: contribute this rank's verdict and `payload`; return the payloads summed.

    Parameters
    ----------
    dist : DistContext
    site : str
        The call site, an entry of :data:`SITES`; with `key` (the same on every rank, e.g. a
        metric's name) it names the collective.
    reason : str or BaseException, optional
        Why this rank cannot go on (None: it can).
    payload : array-like, optional
        Numbers of the same length on every rank, summed exactly (float64).

    Raises
    ------
    AgreedError, AgreedConfigError
        On every rank alike where any rank had a reason.
    """
    _registered(site)
    if reason is None and fault_due(site, dist.rank):
        reason = FaultInjected(f"fault injected at {site} on rank {dist.rank} ({FAULT_ENV})")
    kind = _OK if reason is None else _USAGE if isinstance(reason, ConfigError) else _FAILED
    if kind == _FAILED and isinstance(reason, Exception) and not isinstance(
            reason, (FaultInjected, _Agreed)):  # its traceback, for whoever debugs it
        logger.debug("rank %d at %s", dist.rank, site, exc_info=reason)
    text = "" if reason is None else _text(reason)
    values = np.zeros(0) if payload is None else np.asarray(payload, np.float64).ravel()
    ranks = dist.num_workers
    if ranks == 1 or not dist.synchronous:
        if isinstance(reason, BaseException):
            raise reason
        if reason is not None:
            raise _error(kind, text, site, [dist.rank], dist, alone=True)
        return values
    head = np.zeros(ranks + REASON_WORDS)
    head[dist.rank] = kind
    if kind:
        head[ranks:] = _words(text)
    name = f"agree.{site}" + (f".{key}" if key else "")
    summed = dist.sum_across_workers(name, mx.nd.array(
        np.concatenate([head, values]), dtype="float64")).asnumpy()
    kinds = summed[:ranks].astype(int)
    failed = [r for r in range(ranks) if kinds[r]]
    if not failed:
        return summed[ranks + REASON_WORDS:]
    if len(failed) == 1:
        text = _from_words(summed[ranks:ranks + REASON_WORDS])
    else:  # several reasons summed into one: each rank's, in a table every rank enters
        table = np.zeros((ranks, REASON_WORDS))
        if kind:
            table[dist.rank] = _words(text)
        table = dist.sum_across_workers(name + ".reasons", mx.nd.array(
            table, dtype="float64")).asnumpy()
        text = _from_words(table[failed[0]])
    worst = _USAGE if all(kinds[r] == _USAGE for r in failed) else _FAILED
    raise _error(worst, text, site, failed, dist)


class Agreement:
    """:func:`agree` around the code that forms this rank's verdict::

        with Agreement(dist, "site", size=3) as verdict:
            verdict.payload = compute()   # an exception here is this rank's reason
        summed = verdict.result

    An exception inside the block is not raised alone: it travels as this rank's reason,
    and every rank raises the agreed error as the block ends. BaseExceptions that are not
    Exceptions (KeyboardInterrupt) pass through.
    """

    def __init__(self, dist, site: str, size: int = 0, key: str = ""):
        _registered(site)
        self.dist, self.site, self.key = dist, site, key
        self.payload = np.zeros(size)
        self.result: Optional[np.ndarray] = None

    def __enter__(self) -> "Agreement":
        return self

    def __exit__(self, kind, error, trace) -> bool:
        if error is not None and not isinstance(error, Exception):
            return False
        payload = np.zeros(np.asarray(self.payload).size) if error is not None \
            else self.payload
        self.result = agree(self.dist, self.site, error, payload, self.key)
        return True


def leave(dist) -> None:
    """After an agreed error's line is printed: a last collective (no rank exits, and so
    gets the others killed, before each has printed), then the store's orderly shutdown.
    Never raises: a peer gone meanwhile leaves nothing to wait for."""
    if dist is None:
        return
    try:
        if dist.num_workers > 1 and dist.synchronous:
            dist.sum_across_workers("leave", mx.nd.zeros(1)).asnumpy()
        shutdown = getattr(dist.store, "shutdown", None)
        if shutdown is not None:
            shutdown()
    except Exception:  # pylint: disable=broad-except
        pass


def _text(reason) -> str:
    if isinstance(reason, BaseException):
        text = str(reason) or type(reason).__name__
        if not isinstance(reason, (ConfigError, FaultInjected, AgreedError)):
            text = f"{type(reason).__name__}: {text}"
        return " ".join(text.split())
    return " ".join(str(reason).split())


def _words(text: str) -> np.ndarray:
    raw = text.encode("utf-8")[:4 * REASON_WORDS].ljust(4 * REASON_WORDS, b"\0")
    return np.frombuffer(raw, "<u4").astype(np.float64)


def _from_words(words: np.ndarray) -> str:
    return words.astype("<u4").tobytes().rstrip(b"\0").decode("utf-8", "replace")


def _error(kind: int, text: str, site: str, ranks, dist, alone: bool = False):
    where = "" if alone else (f" (rank {', '.join(map(str, ranks))}; every rank stopped "
                              f"at {site})")
    cls: Callable = AgreedConfigError if kind == _USAGE else AgreedError
    return cls(text + where, site, ranks, None if alone else dist)
