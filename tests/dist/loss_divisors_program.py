"""One rank of a job that trains, one after the other, models whose losses divide their own
gradient by a count of the batch (GluonCV's SoftmaxCrossEntropyLoss at its default,
MixSoftmaxCrossEntropyLoss with an auxiliary head, SSDMultiBoxLoss) and two whose batch
processor counts its batches in objects or in tokens, each by hvdtrain's Estimator as MXNet
Estimator code would. test_loss_divisors.py compares every rank's weights with one process
over the global batch (a plain Gluon loop written there).

Usage: python loss_divisors_program.py OUT_DIR [SCENARIO ...] (under a launcher)

Every scenario trains one epoch of 2 * ranks * BATCH samples, BATCH a rank and micro-batch,
in order (no shuffle: rank r takes samples r, r + N, ...), SGD at LR with momentum 0.9:

- ``seg``: a 1x1-convolution "segmenter", GluonCV's SoftmaxCrossEntropyLoss() (its default,
  size_average=True: the gradient divided by each call's labels that are not ignored), the
  Estimator's default batch processor; ignored pixels spread unevenly (one sample all
  ignored);
- ``mix``, ``mix_clip``: two heads and MixSoftmaxCrossEntropyLoss(aux=True), a processor
  of the program's own (``loss(main, aux, label)``, as GluonCV's scripts call it);
  ``mix_clip`` clips by a global norm small enough to clip every step;
- ``ssd``, ``ssd_accumulate``: a tiny detector (class scores and box offsets for ANCHORS
  anchors from a feature vector), targets made by hand, SSDMultiBoxLoss held by the
  processor; the last rank's first micro-batch holds no object; ``ssd_accumulate``
  trains with accumulate=2;
- ``objects``, ``tokens``: sequences of up to SLOTS items, a per-item regression; the
  processor's batch_samples counts the items (objects: 0-2 a sample, fewer than the
  samples; tokens: 1-5, more) and its loss is one value per item; samples BAD raise
  BadSample; metrics.jsonl is written to OUT_DIR/<scenario>-run.

:func:`reference` is the one-process run test_loss_divisors.py compares with. Writes
OUT_DIR/rank<R>-<scenario>.npz (every array after training), rank 0 also
OUT_DIR/start-<scenario>.npz (every array before), and OUT_DIR/rank<R>.json (each
scenario's error, if it raised one).
"""
import json
import os
import sys

import mxnet as mx
import numpy as np
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ecosystem  # noqa: E402  (tests/ecosystem.py)
ecosystem.on_path()  # GluonCV and GluonNLP live apart from the venv
from gluoncv.loss import MixSoftmaxCrossEntropyLoss, SoftmaxCrossEntropyLoss, SSDMultiBoxLoss
from mxnet import autograd, gluon

from hvdtrain import BadSample
from hvdtrain.estimator import BatchProcessor, Estimator
from hvdtrain.estimator.batch_processor import split_over

BATCH, LR, SEED = 4, 0.1, 5
HEIGHT, WIDTH, CLASSES, CHANNELS = 3, 4, 3, 2
ANCHORS, DET_CLASSES, FEATURES = 6, 3, 5
SLOTS = 5
BAD = (1, 6)  # unusable samples of the objects and tokens scenarios
CLIP = 0.002
SCENARIOS = ["seg", "mix", "mix_clip", "ssd", "ssd_accumulate", "objects", "tokens"]


def size(ranks):
    return 2 * ranks * BATCH


def seg_data(ranks):
    """(inputs, labels) of the segmentation scenarios: -1 marks an ignored pixel; sample i
    has a share of ignored pixels depending on i (sample 0: every pixel ignored)."""
    rng = np.random.default_rng([SEED, ranks])
    n = size(ranks)
    x = rng.normal(size=(n, CHANNELS, HEIGHT, WIDTH)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=(n, HEIGHT, WIDTH)).astype(np.float32)
    share = [1.0, 0.9, 0.05, 0.5, 0.0, 0.7, 0.2]
    for i in range(n):
        y[i][rng.random((HEIGHT, WIDTH)) < share[i % len(share)]] = -1
    return x, y


def ssd_data(ranks):
    """(features, class targets, box targets): 0 is the background; every sample of the
    last rank's first micro-batch has no positive anchor, the others 0-3."""
    rng = np.random.default_rng([SEED, ranks, 1])
    n = size(ranks)
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    cls = np.zeros((n, ANCHORS), np.float32)
    box = rng.normal(size=(n, ANCHORS, 4)).astype(np.float32)
    for i in range(n):
        if i % ranks == ranks - 1 and i < ranks * BATCH:
            continue
        positive = rng.choice(ANCHORS, size=rng.integers(0, 4), replace=False)
        cls[i, positive] = rng.integers(1, DET_CLASSES, size=len(positive))
    return x, cls, box


def items_data(ranks, kind):
    """(inputs, targets, mask) of the objects (0-2 items a sample) and tokens (1-5)
    scenarios."""
    rng = np.random.default_rng([SEED, ranks, 2])
    n = size(ranks)
    x = rng.normal(size=(n, SLOTS, 3)).astype(np.float32)
    y = rng.normal(size=(n, SLOTS)).astype(np.float32)
    low, high = (0, 2) if kind == "objects" else (1, 5)
    counts = rng.integers(low, high + 1, size=n)
    mask = (np.arange(SLOTS)[None, :] < counts[:, None]).astype(np.float32)
    return x, y, mask


class SegNet(gluon.HybridBlock):
    """Per-pixel class scores from a 1x1 convolution (and an auxiliary head's, `aux`)."""

    def __init__(self, aux=False, **kwargs):
        super().__init__(**kwargs)
        self.aux = aux
        with self.name_scope():
            self.head = gluon.nn.Conv2D(CLASSES, 1)
            self.aux_head = gluon.nn.Conv2D(CLASSES, 1) if aux else None

    def hybrid_forward(self, F, x):  # pylint: disable=arguments-differ
        main = self.head(x)
        return (main, self.aux_head(F.tanh(x))) if self.aux else main


class Detector(gluon.HybridBlock):
    """Class scores (N, ANCHORS, DET_CLASSES) and box offsets (N, ANCHORS, 4)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.cls = gluon.nn.Dense(ANCHORS * DET_CLASSES)
            self.box = gluon.nn.Dense(ANCHORS * 4)

    def hybrid_forward(self, F, x):  # pylint: disable=arguments-differ
        return (self.cls(x).reshape((0, ANCHORS, DET_CLASSES)),
                self.box(x).reshape((0, ANCHORS, 4)))


def make_net(scenario):
    """The scenario's net, initialised alike in every process, its shapes settled."""
    mx.random.seed(SEED)
    if scenario.startswith("seg") or scenario.startswith("mix"):
        net = SegNet(aux=scenario.startswith("mix"))
        net.initialize(mx.init.Xavier())
        net(mx.nd.zeros((1, CHANNELS, HEIGHT, WIDTH)))
    elif scenario.startswith("ssd"):
        net = Detector()
        net.initialize(mx.init.Xavier())
        net(mx.nd.zeros((1, FEATURES)))
    else:
        net = gluon.nn.Dense(1, flatten=False)
        net.initialize(mx.init.Xavier())
        net(mx.nd.zeros((1, SLOTS, 3)))
    return net


def arrays(net):
    return {name: p.data().asnumpy()
            for name, p in net._collect_params_with_prefix().items()}  # pylint: disable=protected-access


def item_indices(mask):
    """The flat positions of a batch's items (its mask's ones), in order."""
    return mx.nd.array(np.nonzero(np.asarray(mask).reshape(-1))[0])


class TwoHeads(BatchProcessor):
    """GluonCV's segmentation scripts' step: ``criterion(*outputs, target)``."""

    def fit_batch(self, estimator, train_batch, batch_axis=0):
        data, label = self._get_data_and_label(train_batch, estimator.context, batch_axis)
        with autograd.record():
            pred = [estimator.net(x) for x in data]
            loss = [estimator.loss(*p, y) for p, y in zip(pred, label)]
        estimator.backward(loss)
        return data, label, [p[0] for p in pred], loss


class Boxes(BatchProcessor):
    """GluonCV's SSD step: the multibox loss over every device's part at once."""

    def __init__(self):
        super().__init__()
        self.mbox = SSDMultiBoxLoss()

    def fit_batch(self, estimator, train_batch, batch_axis=0):
        x, cls, box = (split_over(a, estimator.context) for a in train_batch)
        with autograd.record():
            pred = [estimator.net(part) for part in x]
            sum_loss, _, _ = self.mbox([p[0] for p in pred], [p[1] for p in pred], cls, box)
        estimator.backward(sum_loss)
        return x, cls, [p[0] for p in pred], sum_loss


class Items(BatchProcessor):
    """A batch counted in its items (objects or tokens): one loss value per item."""

    def batch_samples(self, batch, batch_axis=0):
        return int(batch[2].sum().asscalar())

    def fit_batch(self, estimator, train_batch, batch_axis=0):
        x, y, mask = (a.as_in_context(estimator.context[0]) for a in train_batch)
        index = item_indices(mask.asnumpy())
        with autograd.record():
            pred = estimator.net(x).reshape((-1,))
            loss = estimator.loss(mx.nd.take(pred, index).reshape((-1, 1)),
                                  mx.nd.take(y.reshape((-1,)), index).reshape((-1, 1)))
        estimator.backward([loss])
        return [x], [y], [pred], [loss]


class Unusable(gluon.data.Dataset):
    """`dataset` whose samples BAD raise BadSample (the documented protocol)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        if index in BAD:
            raise BadSample(f"sample {index} (made unusable by the test)")
        return self.dataset[index]


def build(scenario, ranks, out, context=None, **options):
    """(the Estimator of `scenario`, its training loader); `options` are RunConfig's."""
    net = make_net(scenario)
    if context is not None:
        net.collect_params().reset_ctx(context)
    processor, loss = None, gluon.loss.L2Loss()
    if scenario == "seg":
        data = gluon.data.ArrayDataset(*seg_data(ranks))
        loss = SoftmaxCrossEntropyLoss()
    elif scenario.startswith("mix"):
        data = gluon.data.ArrayDataset(*seg_data(ranks))
        loss, processor = MixSoftmaxCrossEntropyLoss(aux=True), TwoHeads()
        if scenario == "mix_clip":
            options["clip_grad_norm"] = CLIP
    elif scenario.startswith("ssd"):
        data = gluon.data.ArrayDataset(*ssd_data(ranks))
        processor = Boxes()
        if scenario == "ssd_accumulate":
            options["accumulate"] = 2
    else:
        data = Unusable(gluon.data.ArrayDataset(*items_data(ranks, scenario)))
        processor = Items()
        options.update(output_dir=os.path.join(out, f"{scenario}-run"),
                       max_bad_samples=str(len(BAD)))
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": LR, "momentum": 0.9})
    estimator = Estimator(net, loss, trainer=trainer, batch_processor=processor,
                          context=context or mx.cpu(), **dict(dict(log_interval=0), **options))
    estimator.logger.disabled = True
    return estimator, gluon.data.DataLoader(data, batch_size=BATCH * len(estimator.context))


def set_arrays(net, start):
    for name, param in net._collect_params_with_prefix().items():  # pylint: disable=protected-access
        param.set_data(mx.nd.array(start[name]))


def reference(scenario, ranks, start):
    """One process: each step one backward pass over the global batch (ranks * BATCH *
    accumulate samples, the unusable ones left out), then ``trainer.step`` over its samples
    (its items for the objects and tokens scenarios), clipped as torchvision clips."""
    net = make_net(scenario)
    set_arrays(net, start)
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": LR, "momentum": 0.9})
    step = ranks * BATCH * (2 if scenario == "ssd_accumulate" else 1)
    if scenario.startswith(("seg", "mix")):
        data = seg_data(ranks)
    elif scenario.startswith("ssd"):
        data = ssd_data(ranks)
    else:
        data = items_data(ranks, scenario)
    for first in range(0, size(ranks), step):
        index = [i for i in range(first, first + step)
                 if scenario not in ("objects", "tokens") or i not in BAD]
        batch = [mx.nd.array(a[index]) for a in data]
        count = len(index)
        with autograd.record():
            if scenario == "seg":
                losses = SoftmaxCrossEntropyLoss()(net(batch[0]), batch[1])
            elif scenario.startswith("mix"):
                losses = MixSoftmaxCrossEntropyLoss(aux=True)(*net(batch[0]), batch[1])
            elif scenario.startswith("ssd"):
                cls, box = net(batch[0])
                losses = SSDMultiBoxLoss()([cls], [box], [batch[1]], [batch[2]])[0]
            else:
                mask = data[2][index]
                items = item_indices(mask)
                pred = net(batch[0]).reshape((-1,))
                losses = gluon.loss.L2Loss()(mx.nd.take(pred, items).reshape((-1, 1)),
                                             mx.nd.take(batch[1].reshape((-1,)), items)
                                             .reshape((-1, 1)))
                count = int(mask.sum())
        autograd.backward(losses if isinstance(losses, list) else [losses])
        factor = 1.0
        if scenario == "mix_clip":
            grads = [p.grad() for p in net.collect_params().values()]
            norm = np.sqrt(sum(float((g.astype("float64") ** 2).sum().asscalar())
                               for g in grads)) / count
            factor = min(1.0, CLIP / (norm + 1e-6))
            assert factor < 1.0  # the scenario clips
        trainer.step(count / factor)
    return arrays(net)


def main():
    out, chosen = sys.argv[1], sys.argv[2:] or SCENARIOS
    env = os.environ  # the data depends on the world size: known before Horovod starts
    rank = int(env.get("OMPI_COMM_WORLD_RANK", env.get("HOROVOD_RANK", 0)))
    ranks = int(env.get("OMPI_COMM_WORLD_SIZE", env.get("HOROVOD_SIZE", 1)))
    report = {}
    for scenario in chosen:
        try:
            estimator, loader = build(scenario, ranks, out)
            if rank == 0:
                np.savez(os.path.join(out, f"start-{scenario}.npz"), **arrays(estimator.net))
            estimator.fit(loader, epochs=1)
        except Exception as err:  # pylint: disable=broad-except
            report[scenario] = f"{type(err).__name__}: {err}"
            continue
        np.savez(os.path.join(out, f"rank{rank}-{scenario}.npz"), **arrays(estimator.net))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
