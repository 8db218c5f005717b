"""``hvdtrain-launch``: the parameter-server launcher (scheduler, servers, workers).

Standard library only: no MXNet, no Horovod, nothing from the rest of hvdtrain but
:mod:`hvdtrain.config`'s ``ConfigError`` (itself standard library only). ``remote.py`` runs
on hosts that may have no hvdtrain on their ``PYTHONPATH``; ``tests/unit/test_layout.py``
checks this rule.
"""
