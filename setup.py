"""Lets pip older than 21.3 (Ubuntu 20.04 ships 20.0.2) run ``pip install -e .``.

Everything else is in setup.cfg; scripts/install-deps.sh upgrades pip first anyway.
"""
from setuptools import setup

setup()
