"""How one option is defined: a dataclass field whose metadata hold its help, ``--help``
group, choices and range (:func:`option`), and what the parser, the validation and the
README's flag table read from such a field. Standard library only; knows no option itself
(:class:`hvdtrain.config.TrainConfig` holds them).
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import field
from typing import Callable, Iterable, Optional, Tuple, Union

GROUPS = ("data", "model", "optimisation", "distribution", "output")



class ConfigError(ValueError):
    """A configuration a user can fix; its message is one line meant for them."""


def int_list(text: str) -> Tuple[int, ...]:
    """``"3,6"`` -> ``(3, 6)``: the command-line form of a tuple-of-int option."""
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None


def count_or_percent(text: str) -> str:
    """``"10"`` (a count) or ``"1.5%"`` (a share of a whole), returned as given once it is
    known to be one of them and not negative; a percentage is at most 100."""
    number = text[:-1] if text.endswith("%") else text
    try:
        value = float(number) if text.endswith("%") else int(number)
    except ValueError:
        raise ValueError(f"expected a count (10) or a percentage (1%), got {text!r}") from None
    if not 0 <= value <= (100 if text.endswith("%") else math.inf):
        raise ValueError(f"expected a count >= 0 or a percentage in [0, 100], got {text!r}")
    return text


# --checkpoint-every's units: steps, or a time by the clock (seconds in each).
TIME_UNITS = {"s": 1, "m": 60, "h": 3600}
_INTERVAL = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(epochs?|steps?|[smh])?\s*$")


def epochs_steps_or_time(text) -> Union[int, str]:
    """``"2"`` or ``"2epochs"`` (epochs), ``"500steps"``, or a time (``"90s"``, ``"30m"``,
    ``"1.5h"``), each positive: an int for epochs (the form a plain count always had), else
    the canonical text (``"500steps"``, ``"30m"``)."""
    found = _INTERVAL.match(str(text))
    number, unit = (found.group(1), found.group(2) or "") if found else ("0", "")
    counted = unit not in TIME_UNITS  # epochs and steps are whole numbers; a time need not be
    if float(number) <= 0 or (counted and not number.isdigit()):
        raise ValueError(f"expected epochs (2), steps (500steps) or a time (90s, 30m, 2h), "
                         f"each positive; got {text!r}")
    if unit in ("", "epoch", "epochs"):
        return int(number)
    if unit.startswith("step"):
        return f"{int(number)}steps"
    return f"{number}{unit}"


def interval_of(value) -> Tuple[str, float]:
    """What an :func:`epochs_steps_or_time` value means: ``("epochs", 2)``,
    ``("steps", 500)`` or ``("seconds", 1800.0)``."""
    value = epochs_steps_or_time(value)
    if isinstance(value, int):
        return "epochs", value
    if value.endswith("steps"):
        return "steps", int(value[:-5])
    return "seconds", float(value[:-1]) * TIME_UNITS[value[-1]]


# A range is (low, high, low_open, high_open); high None: no upper bound.
POSITIVE = (0, None, True, False)
NON_NEGATIVE = (0, None, False, False)


def option(default, help: str, *, group: str, choices: Tuple[str, ...] = (),  # noqa: A002
           range: Optional[tuple] = None, parse: Optional[Callable] = None,  # noqa: A002
           kind: str = "value", metavar: Optional[str] = None, shown: Optional[str] = None):
    """One option, defined once: a dataclass field whose metadata the parser, the validation
    and the README table read.

    Parameters
    ----------
    default
        The value when the flag is not given (a tuple default becomes a factory).
    help : str
        One sentence for ``--help`` and the README; choices, range and default are added.
    group : str
        The ``--help`` section (one of :data:`GROUPS`).
    choices : tuple of str
        The accepted values, if the option is a name.
    range : tuple, optional
        ``(low, high, low_open, high_open)`` for a number; ``high`` None is unbounded.
    parse : callable, optional
        Turns the command-line text into the value (default: the default's type).
    kind : {'value', 'switch', 'off-switch', 'on-off'}
        ``switch``: ``--flag`` sets True; ``off-switch``: ``--no-flag`` sets False;
        ``on-off``: both ``--flag`` and ``--no-flag``, neither leaves None.
    metavar : str, optional
        The value's name in ``--help``.
    shown : str, optional
        How the default reads in the README when it is computed (``per dataset``).
    """
    assert group in GROUPS, group
    meta = {"help": help, "group": group, "choices": tuple(choices), "range": range,
            "parse": parse, "kind": kind, "metavar": metavar, "shown": shown}
    if isinstance(default, tuple):
        return field(default_factory=lambda: default, metadata=meta)
    return field(default=default, metadata=meta)


def default_of(spec: dataclasses.Field):
    """The value an option has when its flag is not given."""
    if spec.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return spec.default_factory()  # type: ignore[misc]
    return spec.default


_PARSERS = {"int": int, "float": float, "Optional[int]": int, "Optional[float]": float}


def parse_of(spec: dataclasses.Field) -> Optional[Callable]:
    """What turns an option's command-line text into its value (None: kept as text)."""
    return spec.metadata["parse"] or _PARSERS.get(spec.type)


def flags_of(spec: dataclasses.Field) -> Tuple[str, ...]:
    """The command-line spellings of an option (``--no-hybridize``; ``--progress``,
    ``--no-progress``)."""
    name = flag_name(spec.name)
    kind = spec.metadata["kind"]
    if kind == "off-switch":
        return ("--no-" + name[2:],)
    if kind == "on-off":
        return (name, "--no-" + name[2:])
    return (name,)


def describe_range(spec: dataclasses.Field) -> str:
    """An option's range in words ("> 0", "in [0, 1)"), or "" for none."""
    if not spec.metadata["range"]:
        return ""
    low, high, low_open, high_open = spec.metadata["range"]
    if high is None:
        return f"{'>' if low_open else '>='} {low}"
    return f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"


def shown_default(spec: dataclasses.Field) -> str:
    """An option's default as a person reads it ("" for none, or for a switch)."""
    if spec.metadata["shown"]:
        return spec.metadata["shown"]
    value = default_of(spec)
    if spec.metadata["kind"] != "value" or value in (None, ()):
        return ""
    return f"{value:g}" if isinstance(value, float) else str(value)


def flag_table(specs: Iterable[dataclasses.Field]) -> str:
    """README's flag table (markdown), made from the definitions of `specs`."""
    rows = ["| flag | default | meaning |", "| --- | --- | --- |"]
    for spec in specs:
        default = shown_default(spec)
        if spec.metadata["choices"] and default:
            default = f"`{default}`"
        choices = spec.metadata["choices"]
        named = all(choice in spec.metadata["help"] for choice in choices)
        extra = [f"one of {', '.join(choices)}"] if choices and not named else []
        if describe_range(spec):
            extra.append(describe_range(spec))
        meaning = spec.metadata["help"] + (f" ({'; '.join(extra)})" if extra else "")
        flags = ", ".join(f"`{f}`" for f in flags_of(spec))
        rows.append(f"| {flags} | {default} | {meaning} |")
    return "\n".join(rows) + "\n"


def flag_name(name: str) -> str:
    """The flag of field `name` (``batch_size`` -> ``--batch-size``)."""
    return f"--{name.replace('_', '-')}"


def check_range(cfg, name: str, low, high, low_open: bool, high_open: bool) -> None:
    """Refuse a field (None is "not given") that is not a finite number in the range.

    argparse's float() takes ``inf``, ``nan`` and ``1e999``: none of them can train.
    """
    value = getattr(cfg, name)
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{flag_name(name)} must be a finite number, got {value}")
    below = value <= low if low_open else value < low
    above = high is not None and (value >= high if high_open else value > high)
    if not (below or above):
        return
    if high is None:
        wanted = "positive" if low_open and low == 0 else f"{'>' if low_open else '>='} {low}"
    else:
        wanted = f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    raise ConfigError(f"{flag_name(name)} must be {wanted}, got {value}")
