"""One rank of a tiny GluonNLP 0.10 BERT classifier (``BERTEncoder`` + ``BERTModel`` +
``BERTClassifier``) trained by hvdtrain's Estimator as MXNet Estimator code trains it: token
ids, segment ids and valid lengths padded per batch by GluonNLP's batchify, batches drawn by
GluonNLP's ``FixedBucketSampler``, a batch processor of the program's own. For
test_ecosystem_bert.py, which compares it with a plain one-process loop.

Usage: python bert_program.py OUT_DIR (under a launcher)

Writes OUT_DIR/rank0-start.npz (rank 0: every array before the first step), OUT_DIR/rank<R>.npz
(every array after) and OUT_DIR/rank<R>.json (the metrics this rank reports, the
validation count, and a digest of every array at each epoch's end).
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
from mxnet import autograd, gluon
from gluonnlp.model import BERTClassifier, BERTEncoder, BERTModel

from hvdtrain.estimator import BatchProcessor, Estimator
from program_parts import EpochDigests, arrays_of

TRAIN, VAL, VOCAB, CLASSES, EPOCHS, LR, SEED = 60, 23, 24, 3, 2, 0.1, 42
BUCKETS = dict(batch_size=6, num_buckets=3, ratio=1.0)


def make_data(count, seed):
    """`count` samples (token ids of 3-14 tokens, segment ids, valid length, class): two
    segments, the class a rule the model can learn (the first token's residue)."""
    rng = np.random.RandomState(seed)
    samples = []
    for _ in range(count):
        length = rng.randint(3, 15)
        tokens = rng.randint(1, VOCAB, size=length).astype(np.float32)
        segments = (np.arange(length) >= length // 2).astype(np.float32)
        samples.append((tokens, segments, np.float32(length), np.float32(tokens[0] % CLASSES)))
    return samples


def make_net():
    encoder = BERTEncoder(num_layers=2, units=16, hidden_size=32, max_length=16, num_heads=2,
                          dropout=0.0)
    bert = BERTModel(encoder, vocab_size=VOCAB, token_type_vocab_size=2, units=16,
                     embed_size=16, use_pooler=True, use_decoder=False, use_classifier=False)
    net = BERTClassifier(bert, num_classes=CLASSES, dropout=0.0)
    net.initialize(mx.init.Normal(0.2))
    net(mx.nd.ones((1, 4)), mx.nd.zeros((1, 4)), mx.nd.array([4]))
    return net


def batchify():
    """Each batch padded to its own longest sequence, as GluonNLP's scripts batch."""
    pad = nlp.data.batchify.Pad(axis=0, pad_val=0)
    return nlp.data.batchify.Tuple(pad, pad, nlp.data.batchify.Stack("float32"),
                                   nlp.data.batchify.Stack("float32"))


def bucket_sampler(data, shuffle):
    return nlp.data.FixedBucketSampler([len(sample[0]) for sample in data], shuffle=shuffle,
                                       **BUCKETS)


def forward(net, batch):
    tokens, segments, valid, label = batch
    return net(tokens, segments, valid), label


class BertBatches(BatchProcessor):
    """(tokens, segments, valid lengths, labels) batches on one device."""

    def fit_batch(self, estimator, batch, batch_axis=0):
        batch = [part.as_in_context(estimator.context[0]) for part in batch]
        with autograd.record():
            pred, label = forward(estimator.net, batch)
            loss = estimator.loss(pred, label)
        estimator.backward(loss)
        return [batch[0]], [label], [pred], [loss]

    def evaluate_batch(self, estimator, batch, batch_axis=0):
        batch = [part.as_in_context(estimator.context[0]) for part in batch]
        pred, label = forward(estimator.val_net, batch)
        return [batch[0]], [label], [pred], [estimator.val_loss(pred, label)]


def main():
    out = sys.argv[1]
    mx.random.seed(SEED)
    net = make_net()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": LR, "momentum": 0.9})
    estimator = Estimator(net, gluon.loss.SoftmaxCrossEntropyLoss(),
                          train_metrics=[mx.metric.Accuracy()], val_metrics=[mx.metric.Accuracy()],
                          trainer=trainer, batch_processor=BertBatches(), log_interval=0)
    if estimator.rank == 0:  # the run starts from rank 0's arrays (broadcast in fit)
        np.savez(os.path.join(out, "rank0-start.npz"), **arrays_of(net))
    train, val = make_data(TRAIN, 1), make_data(VAL, 2)
    digests = EpochDigests()
    estimator.fit(gluon.data.DataLoader(train, batch_sampler=bucket_sampler(train, True),
                                        batchify_fn=batchify()),
                  val_data=gluon.data.DataLoader(val, batch_sampler=bucket_sampler(val, False),
                                                 batchify_fn=batchify()),
                  epochs=EPOCHS, event_handlers=[digests])
    np.savez(os.path.join(out, f"rank{estimator.rank}.npz"), **arrays_of(net))
    with open(os.path.join(out, f"rank{estimator.rank}.json"), "w") as dump:
        json.dump({"metrics": {m.name: float(m.get()[1])
                               for m in estimator.train_metrics + estimator.val_metrics},
                   "val_count": estimator.val_count, "digests": digests.digests}, dump)


if __name__ == "__main__":
    main()
