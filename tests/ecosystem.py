"""Where ``make ecosystem`` installs what the suite runs of the ecosystem's code (GluonCV,
GluonNLP, and what their imports need: scipy, portalocker): a folder of its own, apart from
the venv, that only the processes that use them put on their path (:func:`on_path`).

Why apart: MXNet 1.9.1's ``mxnet.contrib.quantization`` imports ``scipy.stats`` whenever
scipy can be imported, which made every ``import mxnet`` cost about 0.45 s more CPU (1.5 s
against 1.1 s, measured 2026-12-07), in each of the suite's many training processes
(docs/development.md).
"""
import os
import sys

DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".ecosystem")


def on_path() -> None:
    """Make GluonCV and GluonNLP importable in this process (after the venv's packages: its
    numpy and MXNet stay the ones imported)."""
    if DIR not in sys.path:
        sys.path.append(DIR)
