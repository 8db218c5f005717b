"""``hvdtrain.estimator``: MXNet's ``gluon.contrib.estimator``, distributed. Code written for
MXNet 1.9.1's Estimator runs here with its import changed (docs/estimator.md)."""
# pylint: disable=wildcard-import
from .estimator import *  # noqa: F401,F403
from .event_handler import *  # noqa: F401,F403
from .batch_processor import *  # noqa: F401,F403
from .setup import Setup  # noqa: F401
