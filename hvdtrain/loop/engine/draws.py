"""Does a training step draw random numbers from MXNet's generator? Read from the model.

A block draws when its graph holds a random operator (Dropout with p > 0, an RNN with
dropout, ``_random_*``, ``_sample_*``, the ``np.random`` family, a random image
augmentation, a ``Custom`` operator, which may do anything). The graph is read where there
is one: a ``SymbolBlock``'s, or a hybridized block's once its first forward pass built it.
Elsewhere the block tree is walked: Gluon's own layers and losses are known (``Dropout``
and the RNN layers and cells draw when their rate is above 0, ``ZoneoutCell`` always,
``Lambda`` and ``HybridLambda`` run the user's function: unknown); any other block runs
its own Python, which may draw: unknown. Unknown counts as drawing: a step is seeded rather
than left unreplayable.

A model (or a batch processor) says so itself with a ``draws_random`` attribute, True or
False, which is taken as it is.
"""
from __future__ import annotations

import json
import re
from typing import Optional

from ...store.gluon_internals import block_graph, child_blocks, dropout_rate, hybridized

# Operators that draw whatever their arguments (besides the name patterns below).
RANDOM_OPS = frozenset({
    "normal", "uniform", "Custom", "_npi_bernoulli", "_npi_choice", "_npi_exponential",
    "_npi_gamma", "_npi_gumbel", "_npi_logistic", "_npi_multinomial", "_npi_normal",
    "_npi_normal_n", "_npi_pareto", "_npi_powerd", "_npi_rayleigh", "_npi_uniform",
    "_npi_uniform_n", "_npi_weibull"})
# Operators that draw when their dropout probability (attribute, default) is above 0.
DROPOUT_OPS = {"Dropout": 0.5, "_npx_dropout": 0.5, "RNN": 0.0, "_npx_rnn": 0.0}
# _random_normal, _sample_uniform, _image_random_flip_left_right, _shuffle, ...; not the
# densities (random_pdf_*), which compute.
RANDOM_NAME = re.compile(r"(^|_)(random|sample|shuffle)(_|$)")

# Gluon's modules whose blocks draw nothing of their own (their children are walked).
KNOWN_MODULES = ("mxnet.gluon.nn.", "mxnet.gluon.loss", "mxnet.gluon.block",
                 "mxnet.gluon.rnn.", "mxnet.gluon.model_zoo.")
UNKNOWN_CLASSES = ("Lambda", "HybridLambda", "ZoneoutCell")
RATED_CLASSES = ("Dropout", "DropoutCell", "RNN", "LSTM", "GRU")  # by their rate


def op_draws(op: str, attrs: dict) -> bool:
    """Whether operator `op` with `attrs` (a graph node's) draws random numbers."""
    if op in DROPOUT_OPS:
        return float(attrs.get("p", DROPOUT_OPS[op])) > 0
    if op in RANDOM_OPS:
        return True
    return bool(RANDOM_NAME.search(op)) and "pdf" not in op


def graph_draws(symbol) -> bool:
    """Whether any operator of `symbol` (an MXNet Symbol) draws random numbers."""
    nodes = json.loads(symbol.tojson())["nodes"]
    return any(op_draws(node["op"], node.get("attrs") or {}) for node in nodes
               if node.get("op") not in (None, "null"))


def block_draws(block) -> Optional[bool]:
    """Whether a forward pass of `block` draws random numbers: True, False, or None when
    that is not known yet (a hybridized block before its first pass builds its graph)."""
    declared = getattr(block, "draws_random", None)
    if isinstance(declared, bool):
        return declared
    graph = block_graph(block)
    if graph is not None:
        return graph_draws(graph)
    kind = type(block)
    if kind.__name__ in UNKNOWN_CLASSES or not kind.__module__.startswith(KNOWN_MODULES):
        # The user's own forward or hybrid_forward, or a function it calls: unknown (a
        # hybridized one is read from its graph above once built).
        return None if hybridized(block) else True
    if kind.__name__ in RATED_CLASSES and dropout_rate(block) > 0:
        return True
    verdict: Optional[bool] = False
    for child in child_blocks(block):
        found = block_draws(child)
        if found:
            return True
        if found is None:
            verdict = None
    return verdict


def step_draws(net, processor=None) -> Optional[bool]:
    """Whether a training step of `net` through `processor` draws random numbers (see the
    module): True, False, or None while not known yet. A processor says whether its
    ``fit_batch`` (its losses included) draws with ``draws_random`` (True, False, or None:
    not known yet); one that does not say may draw: True."""
    said = getattr(processor, "draws_random", True) if processor is not None else False
    if said:
        return True
    found = block_draws(net)
    return None if said is None and not found else found


def blocks_draw(*blocks) -> Optional[bool]:
    """Whether a forward pass of any of `blocks` (None ones left out) draws: True, False,
    or None (not known yet), as :func:`block_draws`."""
    verdicts = [block_draws(b) for b in blocks if b is not None]
    return True if any(verdicts) else (None if None in verdicts else False)
