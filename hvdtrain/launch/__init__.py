"""``hvdtrain-launch``: the parameter-server launcher (scheduler, servers, workers).

Standard library only: no MXNet, no Horovod, nothing from the rest of hvdtrain but
:mod:`hvdtrain.config`'s ``ConfigError`` (itself standard library only). ``remote.py`` (on
each host) and ``runner.py`` (the user's command in every worker and server) are run by path,
under interpreters that may have no hvdtrain on their ``PYTHONPATH``; ``tests/unit/test_layout.py``
checks this rule.
"""
