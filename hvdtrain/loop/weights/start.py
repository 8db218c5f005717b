"""Fit a weights file to the net a run built: which arrays load, which are new, which of the
file's are left out; the outcome said in one line (on rank 0, as every INFO line).

A file names its arrays either by their place in the net (``save_parameters``:
``features.0.weight``, ``13.bias``) or by parameter name (an export:
``arg:resnetv10_conv0_weight``; older Gluon files drop the model's prefix: ``conv0_weight``).
:func:`~hvdtrain.models.build_model` names every net as a new process would, so an export's
names are the net's own.

The rules:

- every array of the file has a place in the net, and every place outside the output layer
  is in the file with the net's shape; anything else is weights for another architecture,
  refused in one line naming the first misfit (nothing is guessed);
- the output layer (:func:`~hvdtrain.loop.weights.finetune.output_layer`) is replaced, keeping the
  fresh values the net was initialised with, when its shape in the file differs in the class
  axis only, when the source names other classes than the data, or when the file has none;
  the file's own is then left out. A class count that differs on a net whose output layer
  cannot be found is refused.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import mxnet as mx

from ...store.gluon_internals import params_by_place
from .finetune import output_layer
from .files import WeightsError, WeightsFile

logger = logging.getLogger("hvdtrain")

NO_HEAD = ("this model has no output layer hvdtrain can replace (an 'output' block, or a "
           "sequential net ending in a layer with parameters)")


@dataclass
class Plan:
    """How a file's arrays go into a net.

    Attributes
    ----------
    loaded : dict
        Place -> the file's array, for every place that takes the file's value.
    new : list of str
        Places initialised afresh (the output layer, when replaced).
    left_out : list of str
        The file's keys not loaded (its output layer, when replaced).
    why_new : str
        Why the output layer is new ("" when it is loaded).
    """

    loaded: Dict[str, mx.nd.NDArray] = field(repr=False)
    new: List[str]
    left_out: List[str]
    why_new: str = ""


def load_start_weights(net, weights: WeightsFile, num_classes: int,
                       classes: Optional[Sequence[str]] = None, model: str = "model") -> Plan:
    """Set `net`'s arrays (initialised, shapes known) from `weights` by :func:`plan`, and
    log what was loaded, what is new and what was left out. Raises WeightsError, before
    any value is set, when the file does not fit; `model` names the net in its message."""
    found = plan(weights, net, num_classes, classes, model)
    params = params_by_place(net)
    for place, array in found.loaded.items():
        params[place].set_data(array.astype(params[place].dtype, copy=False))
    mx.nd.waitall()
    logger.info("%s", report(weights, found, params))
    return found


def plan(weights: WeightsFile, net, num_classes: int,
         classes: Optional[Sequence[str]] = None, model: str = "model") -> Plan:
    """Which of `weights`' arrays go where in `net` (see the module's rules); `classes`,
    when known, are the data's class names, compared with the source's."""
    arrays, keys = by_place(weights, net, model)
    params = params_by_place(net)
    head = output_layer(net)
    what = weights.named
    extra = [place for place in arrays if place not in params]
    if extra:
        raise WeightsError(f"{what} holds {keys[extra[0]]}, which has no place in this {model} "
                           f"({len(extra)} such arrays): weights for another architecture")
    missing = [place for place in params if place not in arrays and place not in head]
    if missing:
        raise WeightsError(f"{what} has no {missing[0]} ({len(missing)} arrays of this {model} "
                           f"missing): weights for another architecture")
    wrong = [place for place in params if place in arrays and place not in head
             and arrays[place].shape != params[place].shape]
    if wrong:
        place = wrong[0]
        shapes = f"{keys[place]} is {arrays[place].shape} there, {params[place].shape} here"
        if not head and all(_class_axis_only(arrays[p].shape, params[p].shape, num_classes)
                            for p in wrong):
            raise WeightsError(f"{what}: {shapes}: the data has {num_classes} classes, the "
                               f"file {arrays[place].shape[0]}, and {NO_HEAD}")
        raise WeightsError(f"{what}: {shapes}: weights for another architecture")
    why = _why_new_head(arrays, params, head, num_classes, weights.classes, classes, what,
                        keys)
    if not why:
        return Plan(dict(arrays), [], [])
    return Plan({p: a for p, a in arrays.items() if p not in head}, list(head),
                [_shaped(keys[p], arrays[p]) for p in head if p in arrays], why)


def by_place(weights: WeightsFile, net, model: str = "model"):
    """The file's arrays by their place in `net`, and each place's key in the file.

    Keys with a dot are places already (Gluon's own test in ``load_parameters``); others
    are parameter names, with an export's ``arg:``/``aux:`` and, in older files, without
    the model's prefix. A name that is no parameter of `net` is refused."""
    stripped = {key.split(":", 1)[1] if key.startswith(("arg:", "aux:")) else key: key
                for key in weights.arrays}
    if any("." in name for name in stripped):
        places = {name: name for name in stripped}
    else:
        by_name = {param.name: place for place, param in params_by_place(net).items()}
        places = {}
        for name in stripped:
            place = by_name.get(name) or by_name.get(net.prefix + name)
            if place is None:
                raise WeightsError(f"{weights.named} holds {stripped[name]}, which names "
                                   f"no parameter of this {model}: weights for another "
                                   f"architecture")
            places[name] = place
    return ({places[name]: weights.arrays[key] for name, key in stripped.items()},
            {places[name]: key for name, key in stripped.items()})


def _class_axis_only(theirs, mine, num_classes: int) -> bool:
    """Whether two shapes differ only in their first (class) axis, `num_classes` here."""
    return (len(theirs) == len(mine) and tuple(theirs[1:]) == tuple(mine[1:])
            and mine[0] == num_classes)


def _why_new_head(arrays, params, head, num_classes, source_classes, classes, what,
                  keys) -> str:
    """Why the output layer must be initialised afresh ("" when the file's fits)."""
    if not head:
        return ""
    present = [place for place in head if place in arrays]
    if not present:
        return "the file has none"
    for place in present:
        theirs, mine = arrays[place].shape, params[place].shape
        if theirs != mine and not _class_axis_only(theirs, mine, num_classes):
            raise WeightsError(f"{what}: the output layer's {keys[place]} is {theirs} there, "
                               f"{mine} here: weights for another architecture")
    if any(arrays[place].shape != params[place].shape for place in present):
        return f"the data has {num_classes} classes, the file {arrays[present[0]].shape[0]}"
    if len(present) < len(head):
        return "the file has only part of it"
    if source_classes and classes and list(source_classes) != list(classes):
        return (f"the same number of classes, other ones: {_few(classes)} here, "
                f"{_few(source_classes)} in the file")
    return ""


def _few(names: Sequence[str]) -> str:
    names = list(names)
    return ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")


def _shaped(place: str, array) -> str:
    return f"{place} {tuple(array.shape)}"


def report(weights: WeightsFile, found: Plan, params) -> str:
    """The one line saying what was loaded, what is new and what was left out."""
    line = f"{weights.flag}: loaded {len(found.loaded)} of the model's {len(params)} arrays " \
           f"from {weights.path}"
    if not found.why_new:
        return line + " (all of them, the output layer included)"
    new = ", ".join(_shaped(place, params[place].data()) for place in found.new)
    left = ", ".join(found.left_out) or "nothing"
    return (f"{line} (all but the output layer); new: {new} (the output layer, initialised "
            f"afresh: {found.why_new}); left out of the file: {left}")
