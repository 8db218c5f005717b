"""One rank of a text classifier trained by hvdtrain's Estimator from a DataLoader built on
GluonNLP's FixedBucketSampler (variable-length sequences, padded per batch), dumping what
test_batch_samplers.py compares with a plain one-process Gluon loop.

Usage: python batch_samplers.py OUT_DIR [OPTION=VALUE ...] (under a launcher)

Options are RunConfig fields passed to the Estimator (``output_dir=...``, ``resume=auto``,
``max_steps=5``; numbers parsed), ``epochs=N`` and ``iterate_unseeded=1`` (each rank
iterates the training sampler before fit with numpy seeded by its rank, which shuffles it
in place differently on each). Writes OUT_DIR/rank0-start.npz (rank 0:
every array before the first step), OUT_DIR/rank<R>.npz (every array after) and
OUT_DIR/rank<R>.json (the metrics as this rank reports them, the validation count, the
fit's result, and the sample count of each batch this rank trained on, in order).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ecosystem  # noqa: E402  (tests/ecosystem.py)
ecosystem.on_path()  # GluonCV and GluonNLP live apart from the venv
import gluonnlp as nlp
import mxnet as mx
import numpy as np
from mxnet import gluon

from hvdtrain.estimator import BatchEnd, Estimator
from program_parts import options as options_of  # noqa: E402

TRAIN, VAL, VOCAB, CLASSES, EPOCHS, LR, SEED = 75, 21, 20, 3, 3, 0.5, 42
# Buckets of several batch sizes (ratio: shorter sequences, larger batches), each bucket's
# last batch short: the batches of one step differ in size.
BUCKETS = dict(batch_size=4, num_buckets=3, ratio=1.0)


def make_data(count, seed):
    """`count` token sequences of 2-12 tokens (1 .. VOCAB-1; 0 pads) and their classes (a
    rule the model can learn: the most frequent token's residue)."""
    rng = np.random.RandomState(seed)
    samples = []
    for _ in range(count):
        tokens = rng.randint(1, VOCAB, size=rng.randint(2, 13)).astype(np.float32)
        samples.append((tokens, np.float32(np.bincount(tokens.astype(int)).argmax() % CLASSES)))
    return samples


class MeanPool(gluon.HybridBlock):
    """Token embeddings averaged over the (padded) sequence, then a linear classifier."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embed = gluon.nn.Embedding(VOCAB, 6)
            self.out = gluon.nn.Dense(CLASSES)

    def hybrid_forward(self, F, tokens):  # pylint: disable=arguments-differ
        return self.out(F.mean(self.embed(tokens), axis=1))


def batchify():
    """Each batch padded to its own longest sequence (as GluonNLP's scripts batch)."""
    return nlp.data.batchify.Tuple(nlp.data.batchify.Pad(axis=0, pad_val=0),
                                   nlp.data.batchify.Stack())


def bucket_sampler(data, shuffle):
    return nlp.data.FixedBucketSampler([len(tokens) for tokens, _ in data], shuffle=shuffle,
                                       **BUCKETS)


def make_net():
    net = MeanPool()
    net.initialize(mx.init.Xavier())
    net(mx.nd.ones((1, 3)))
    return net


class BatchSizes(BatchEnd):
    """The samples of every batch this rank trained on, in order."""

    def __init__(self):
        self.sizes = []

    def batch_end(self, estimator, *args, **kwargs):
        label = kwargs.get("label")  # None for a batch with no usable sample
        self.sizes.append(0 if label is None else sum(int(part.shape[0]) for part in label))


def main():
    out = sys.argv[1]
    options = options_of(sys.argv[2:])
    epochs = options.pop("epochs", EPOCHS)
    iterated = options.pop("iterate_unseeded", 0)
    mx.random.seed(SEED)
    net = make_net()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": LR})
    estimator = Estimator(net, gluon.loss.SoftmaxCrossEntropyLoss(),
                          train_metrics=[mx.metric.Accuracy()], trainer=trainer, seed=SEED,
                          **options)
    arrays = {name: p.data().asnumpy()
              for name, p in net._collect_params_with_prefix().items()}  # pylint: disable=protected-access
    if estimator.rank == 0:  # the run starts from rank 0's arrays (broadcast in fit)
        np.savez(os.path.join(out, "rank0-start.npz"), **arrays)
    train, val = make_data(TRAIN, 1), make_data(VAL, 2)
    sizes, sampler = BatchSizes(), bucket_sampler(train, True)
    if iterated:  # shuffled in place with each rank's own generator: the ranks differ
        np.random.seed(estimator.rank)
        list(sampler)
    estimator.fit(gluon.data.DataLoader(train, batch_sampler=sampler, batchify_fn=batchify()),
                  val_data=gluon.data.DataLoader(val, batch_sampler=bucket_sampler(val, False),
                                                 batchify_fn=batchify()),
                  epochs=epochs, event_handlers=[sizes])
    arrays = {name: p.data().asnumpy()
              for name, p in net._collect_params_with_prefix().items()}  # pylint: disable=protected-access
    np.savez(os.path.join(out, f"rank{estimator.rank}.npz"), **arrays)
    reported = {m.name: float(m.get()[1]) for m in estimator.train_metrics + estimator.val_metrics}
    with open(os.path.join(out, f"rank{estimator.rank}.json"), "w") as dump:
        json.dump({"metrics": reported, "val_count": estimator.val_count,
                   "result": estimator.result, "num_workers": estimator.num_workers,
                   "batch_sizes": sizes.sizes}, dump)


if __name__ == "__main__":
    main()
