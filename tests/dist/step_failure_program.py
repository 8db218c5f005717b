"""One rank's training step fails inside the Estimator's fit: the batch processor of the
rank named on the command line raises at its 3rd training batch, as a processor's own check
of its data would (``ValueError``). Every rank must stop at that step with the same line,
and no rank may apply it.

Usage: python step_failure_program.py OUT_DIR FAILING_RANK [divided] [KWARG=VALUE ...]
(under a launcher; the KWARGs go to the Estimator, e.g. clip_grad_norm=5; ``divided``: the
processor says its loss divides by the batch's count, ``loss_divisor``, so the step's
counts travel with the divisors)

The line is ``step_failure_program.py: error: ...`` (exit status 1). Writes
OUT_DIR/rank<R>.npz: every array when the error came out (``now.*``) and after the last
step this rank ended (``before.*``, kept at each batch_end), and the batch_end count.
"""
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import gluon

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))

import regression  # noqa: E402
from hvdtrain.estimator import BatchEnd, BatchProcessor, Estimator  # noqa: E402
from say import say  # noqa: E402

TRAIN, BATCH, FAILING_BATCH = 64, 4, 3


def arrays_of(net):
    return {name: p.data().asnumpy()
            for name, p in net._collect_params_with_prefix().items()}  # pylint: disable=protected-access


class Refusing(BatchProcessor):
    """hvdtrain's processor, refusing this rank's 3rd training batch when `fails`."""

    def __init__(self, fails):
        super().__init__()
        self.fails, self.calls = fails, 0

    def fit_batch(self, estimator, train_batch, batch_axis=0):
        self.calls += 1
        if self.fails and self.calls == FAILING_BATCH:
            raise ValueError(f"batch {self.calls} holds a label outside the model's range")
        return super().fit_batch(estimator, train_batch, batch_axis)


class RefusingDivided(Refusing):
    """:class:`Refusing` whose loss (it says) divides its gradient by the batch's count."""

    def loss_divisor(self, batch, out):
        return float(batch[0].shape[0])


class Keeper(BatchEnd):
    """Every array after each step this rank ended."""

    def __init__(self):
        self.before, self.ends = {}, 0

    def batch_end(self, estimator, *args, **kwargs):
        self.before, self.ends = arrays_of(estimator.net), self.ends + 1


def main():
    out, failing, rest = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    divided = rest[:1] == ["divided"]
    options = {k: float(v) for k, v in (a.split("=", 1) for a in rest[divided:])}
    mx.random.seed(7)
    net = regression.make_net()
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05})
    keeper = Keeper()
    estimator = Estimator(net, gluon.loss.L2Loss(), trainer=trainer, **options,
                          batch_processor=(RefusingDivided if divided else Refusing)(
                              fails=False))
    estimator.batch_processor.fails = estimator.rank == failing
    train = gluon.data.ArrayDataset(*regression.make_data(TRAIN, 2))
    try:
        estimator.fit(gluon.data.DataLoader(train, batch_size=BATCH), epochs=1,
                      event_handlers=[keeper])
        status = 0
    except (ValueError, RuntimeError) as err:
        say(f"step_failure_program.py: error: {err}")
        status = getattr(err, "status", 1)
        np.savez(os.path.join(out, f"rank{estimator.rank}.npz"), ends=keeper.ends,
                 **{f"now.{k}": v for k, v in arrays_of(net).items()},
                 **{f"before.{k}": v for k, v in keeper.before.items()})
        getattr(err, "leave", lambda: None)()
    os._exit(status)  # pylint: disable=protected-access


if __name__ == "__main__":
    main()
