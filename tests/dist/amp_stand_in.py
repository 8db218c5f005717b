"""rank_worker.py with AMP's dynamic loss scaling on the CPU, standing in for a GPU's.

Usage: python amp_stand_in.py OUT_DIR [hvdtrain flags...] (under a launcher).

MXNet 1.9.1 has no float16 CPU kernels, so ``--amp`` is refused on a CPU. What decides
whether replicas stay one model under AMP is not float16 but the loss scale: each backward
pass runs on losses multiplied by it (``amp.scale_loss``, MXNet's own), and each update
divides the summed gradients by it and skips itself when the scaler finds an overflow. Here
the policy is hvdtrain's own AMP policy (:class:`~hvdtrain.loop.engine.precision.Precision` with
``amp=True``), without ``amp.init()`` (no operator is cast to float16) and with a scaler
whose scale changes every update (2**8, 2**9, 2**10, ...) and which reports an overflow at
every fifth, the same on every rank (its decision is made from the reduced gradients, which
every rank holds alike).
"""
import os
import sys

from mxnet.contrib.amp.loss_scaler import LossScaler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hvdtrain.loop.engine import precision  # noqa: E402


class ChangingScaler(LossScaler):
    """AMP's LossScaler with a scale that changes at every update and an overflow at every
    fifth."""

    def __init__(self):
        super().__init__()
        self.updates = 0

    @property
    def loss_scale(self):
        return 2.0 ** (8 + self.updates % 3)

    def has_overflow(self, params):
        self.updates += 1
        return self.updates % 5 == 0


class StandInAmp(precision.Precision):
    def check_devices(self, devices):  # the CPU stands in for a GPU
        pass

    def before_model(self):  # no amp.init(): nothing is cast to float16
        pass

    def prepare_trainer(self, trainer):  # as amp.init_trainer sets a trainer up
        trainer._amp_loss_scaler = ChangingScaler()  # pylint: disable=protected-access
        trainer._amp_original_scale = trainer._scale  # pylint: disable=protected-access


precision.Precision.of = classmethod(lambda cls, cfg: StandInAmp(cfg.dtype, amp=True))

if __name__ == "__main__":
    import rank_worker
    rank_worker.main()
