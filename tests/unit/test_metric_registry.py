"""The registry of metric states (hvdtrain/loop/engine/metric_states.py) and the book that
reduces them (metrics.py): each kind maps to its state, GluonCV is matched by name and never
imported, what cannot be reduced is refused in one line before the first step, a user's
own class is reduced once registered, record names never take the run's fields, and MAE
keeps its sums per element whoever updates it. Several ranks are simulated here by threads
around a store that sums in rank order (real jobs: tests/dist/test_metric_states.py)."""
import copy
import json
import pickle
import subprocess
import sys
import threading

import mxnet as mx
import numpy as np
import pytest
from gluoncv.utils.metrics.segmentation import SegmentationMetric
from gluoncv.utils.metrics.voc_detection import VOC07MApMetric
from mxnet import gluon

from hvdtrain import ConfigError, DeviceAccuracy, DeviceLoss, DistContext
from hvdtrain.estimator import Estimator, MetricState, register_metric_state
from hvdtrain.loop.engine.metric_states import MEAN, state_of
from hvdtrain.loop.engine.metrics import TRAIN_FIELDS, VAL_FIELDS, MetricBook

ONE_PROCESS = dict(kvstore="none", log_interval=0)


class Exchange:
    """What `ranks` threads sum: each puts its array, all wait, each takes the sum (in rank
    order, as a collective gives every rank the same)."""

    def __init__(self, ranks):
        self.ranks, self.parts = ranks, {}
        self.barrier = threading.Barrier(ranks, timeout=60)


class ThreadStore:
    type = "horovod"

    def __init__(self, exchange, rank):
        self.exchange, self.rank, self.num_workers = exchange, rank, exchange.ranks

    def sum_exact(self, name, values):
        exchange = self.exchange
        exchange.parts[self.rank] = (name, values.asnumpy())
        exchange.barrier.wait()
        names = {exchange.parts[r][0] for r in range(exchange.ranks)}
        assert len(names) == 1, names
        total = exchange.parts[0][1].copy()
        for rank in range(1, exchange.ranks):
            total = total + exchange.parts[rank][1]
        exchange.barrier.wait()
        values[:] = total


def reduced(ranks, make, update):
    """Every rank's book values once each rank updated `make()`'s metrics with its shard
    (``update(metrics, rank, ranks)``) and the book reduced them."""
    exchange, results, errors = Exchange(ranks), [None] * ranks, []

    def run(rank):
        try:
            metrics = make()
            book = MetricBook(metrics, "simulated")
            update(metrics, rank, ranks)
            book.reduce(DistContext(rank=rank, num_workers=ranks,
                                    store=ThreadStore(exchange, rank)))
            results[rank] = book.values()
        except BaseException as err:  # pylint: disable=broad-except
            errors.append(err)
            exchange.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(ranks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def test_the_package_never_imports_gluoncv():
    code = ("import sys, hvdtrain, hvdtrain.estimator, hvdtrain.loop.engine.metric_states; "
            "print([m for m in sys.modules if m.split('.')[0] == 'gluoncv'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_each_kind_of_metric_maps_to_its_state():
    assert state_of(mx.metric.Accuracy()) is MEAN and state_of(DeviceAccuracy()) is MEAN
    # Macro: each batch's counts, summed by batch number (the global batches' scores).
    assert state_of(mx.metric.F1(average="macro")).arrays == ("_hvdtrain_batch_counts",)
    assert "metrics.true_positives" in state_of(mx.metric.F1(average="micro")).sums
    assert "_metrics.global_true_negatives" in state_of(mx.metric.MCC(average="micro")).sums
    assert state_of(mx.metric.PCC()).arrays == ("lcm", "gcm")
    assert state_of(mx.metric.Perplexity(None)) is MEAN
    assert state_of(SegmentationMetric(3)).arrays == ("total_inter", "total_union")
    assert state_of(VOC07MApMetric()).records == ("_n_pos", "_score", "_match",
                                                  "_hvdtrain_samples")
    assert state_of(mx.metric.MAE()).prepare is not None

    class Shifted(mx.metric.MAE):  # its own update: MXNet's per-batch means, summed
        def update(self, labels, preds):
            super().update(labels, [p + 1 for p in preds])

    assert state_of(Shifted()) is MEAN


class ClassHits(mx.metric.EvalMetric):
    """A user's metric with state of its own: hits and samples per class (arrays that grow
    with the classes seen) and the scores of the misses (a record). Reports the worst
    class's recall and the median score of a miss."""

    def __init__(self):
        super().__init__("class hits")

    def reset(self):
        self.hits, self.seen, self.misses = np.zeros(0), np.zeros(0), []

    def update(self, labels, preds):
        for label, pred in zip(labels, preds):
            label, pred = label.asnumpy().astype(int), pred.asnumpy()
            guess = pred.argmax(1)
            size = max(len(self.hits), label.max() + 1)
            self.hits = np.pad(self.hits, (0, size - len(self.hits)))
            self.seen = np.pad(self.seen, (0, size - len(self.seen)))
            np.add.at(self.hits, label[guess == label], 1)
            np.add.at(self.seen, label, 1)
            self.misses.extend(pred.max(1)[guess != label])

    def get(self):
        recall = self.hits / np.maximum(self.seen, 1)
        return ["worst class", "median miss"], [float(recall.min()),
                                                float(np.median(self.misses))]


def refusal(make):
    with pytest.raises(ConfigError) as raised:
        make()
    message = str(raised.value)
    assert "\n" not in message
    return message


def test_what_the_ranks_cannot_reduce_is_refused_in_one_line_before_the_first_step():
    net = gluon.nn.Dense(2)

    def estimator(metric):
        return lambda: Estimator(net, gluon.loss.L2Loss(), val_metrics=[metric],
                                 context=mx.cpu(), **ONE_PROCESS)

    class Unregistered(ClassHits):
        def get(self):
            return super().get()

    message = refusal(estimator(Unregistered()))
    assert "'validation class hits'" in message and "own get" in message
    assert "register_metric_state(" in message
    message = refusal(estimator(mx.metric.PearsonCorrelation(average="micro")))
    assert "average='macro'" in message and "pearsonr" in message
    # Refused inside a composite too, and a state naming what the metric does not have.
    assert "own get" in refusal(estimator(mx.metric.CompositeEvalMetric(
        [mx.metric.Accuracy(), Unregistered()])))

    class Misnamed(ClassHits):
        pass

    register_metric_state(Misnamed, MetricState(sums=("hits_total",)))
    assert "'hits_total'" in refusal(estimator(Misnamed()))


def shard(rank, ranks, count):
    return np.arange(rank, count, ranks)


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_users_own_state_once_registered_is_the_whole_splits_over_the_ranks(ranks):
    register_metric_state(ClassHits, arrays=["hits", "seen"], records=["misses"],
                          fields=["worst_class", "median_miss"])
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 4, 37).astype(np.float32)
    labels[0] = 4  # class 4 on rank 0 alone: its arrays are longer than the others'
    scores = rng.random((37, 5)).astype(np.float32)
    one = ClassHits()
    one.update([mx.nd.array(labels)], [mx.nd.array(scores)])
    want = dict(zip(["worst_class", "median_miss"], one.get()[1]))

    def update(metrics, rank, count):
        index = shard(rank, count, 37)
        for part in np.array_split(index, 3):  # batches of any size, one maybe empty
            if len(part):
                metrics[0].update([mx.nd.array(labels[part])], [mx.nd.array(scores[part])])

    for values in reduced(ranks, lambda: [ClassHits()], update):
        assert values == want


@pytest.mark.parametrize("ranks", [2, 3])
def test_mxnet_and_gluoncv_states_sum_and_gather_as_one_process_computes_them(ranks):
    rng = np.random.default_rng(9)
    count = 23
    label = rng.integers(0, 3, count).astype(np.float32)
    label[1] = 5  # PCC's matrix grows on one rank alone
    score = rng.random((count, 6)).astype(np.float32)
    binary = (rng.random(count) < 0.5).astype(np.float32)
    two = rng.random((count, 2)).astype(np.float32)
    gt = np.concatenate([rng.uniform(0, 50, (count, 2, 2)), rng.uniform(60, 90, (count, 2, 2))],
                        -1).astype(np.float32)
    det = (gt + rng.normal(0, 8, gt.shape)).astype(np.float32)
    det_id = rng.integers(0, 2, (count, 2)).astype(np.float32)
    gt_id = rng.integers(0, 2, (count, 2)).astype(np.float32)
    det_score = rng.random((count, 2)).astype(np.float32)

    def make():
        return [mx.metric.PCC(), mx.metric.F1(average="micro"), VOC07MApMetric(),
                mx.metric.create([mx.metric.Accuracy(), mx.metric.MCC(average="micro")])]

    def feed(metrics, index):
        nd = lambda a: mx.nd.array(a[index])  # noqa: E731
        pcc, f1, voc, composite = metrics
        pcc.update([nd(label)], [nd(score)])
        f1.update([nd(binary)], [nd(two)])
        voc.update(nd(det), nd(det_id), nd(det_score), nd(gt), nd(gt_id))
        composite.update([nd(binary)], [nd(two)])

    one = make()
    feed(one, np.arange(count))
    book = MetricBook(one)
    want = book.values()
    assert list(want) == ["pcc", "f1", "vocmeanap", "accuracy", "mcc"]
    for values in reduced(ranks, make, lambda m, r, n: feed(m, shard(r, n, count))):
        assert values == pytest.approx(want, abs=1e-12)


def test_record_names_never_take_the_runs_fields_nor_each_others():
    train = MetricBook([mx.metric.Accuracy(), mx.metric.Loss(), mx.metric.Loss()],
                       reserved=TRAIN_FIELDS)
    assert train.names() == ["accuracy", "loss_metric", "loss_metric_2"]
    val = MetricBook([mx.metric.Loss(), DeviceLoss(), SegmentationMetric(2)],
                     reserved=VAL_FIELDS)
    assert val.names() == ["loss", "loss_metric", "pixacc", "miou"]


def test_an_mae_updated_outside_the_estimator_reports_per_element():
    """MXNet's MAE adds each batch's mean; a handler that calls ``metric.update`` itself
    still leaves the sums per element, a copy keeps its own, a direct reset clears them."""
    mae = mx.metric.MAE()
    book = MetricBook([mae])
    label, pred = np.arange(7.0), np.arange(7.0) * 1.5
    mae.update([mx.nd.array(label[:5])], [mx.nd.array(pred[:5])])
    twin = pickle.loads(pickle.dumps(copy.deepcopy(mae)))
    mae.update([mx.nd.array(label[5:])], [mx.nd.array(pred[5:])])
    book.reduce(DistContext())
    assert mae.get()[1] == pytest.approx(np.abs(label - pred).mean())  # not (1+5.5)/2
    twin_book = MetricBook([twin])
    twin_book.reduce(DistContext())
    assert twin.get()[1] == pytest.approx(np.abs(label[:5] - pred[:5]).mean())
    mae.reset()
    book.reduce(DistContext())
    assert np.isnan(mae.get()[1])


def test_the_fit_api_idiom_writes_its_records_in_one_process(tmp_path):
    """``train_metrics=[Accuracy(), Loss()]``: the metric's loss is ``train_loss_metric``
    beside the run's ``train_loss``, not a second ``train_loss``."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(20, 3)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.float32)
    net = gluon.nn.Dense(2)
    net.initialize()
    estimator = Estimator(net, gluon.loss.SoftmaxCrossEntropyLoss(), context=mx.cpu(),
                          train_metrics=[mx.metric.Accuracy(), mx.metric.Loss()],
                          output_dir=str(tmp_path), **ONE_PROCESS)
    data = gluon.data.ArrayDataset(x, y)
    estimator.fit(gluon.data.DataLoader(data, batch_size=6), val_data=data, epochs=2)
    epochs = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text()
              .splitlines() if json.loads(line)["event"] == "epoch"]
    assert len(epochs) == 2
    for record in epochs:
        assert record["train_loss_metric"] == pytest.approx(record["train_loss"], rel=1e-6)
        assert {"train_accuracy", "val_accuracy", "val_loss", "val_samples"} <= set(record)


class Twice:
    """A store for two ranks whose other rank holds what this one does."""
    type = "horovod"

    def sum_exact(self, name, values):
        values[:] = values * 2


def test_a_reduction_leaves_the_objects_a_copy_of_the_attributes_holds():
    """What a peek at the whole split's value inside an epoch relies on: a shallow copy of
    each metric's attributes, taken before a reduction, restores this rank's own counts
    (F1's counts object, MAE's sums are replaced, not changed)."""
    f1, mae = mx.metric.F1(average="micro"), mx.metric.MAE()
    book = MetricBook([f1, mae])
    f1.update([mx.nd.array([0, 1, 1])], [mx.nd.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3]])])
    mae.update([mx.nd.array([1.0, 2.0])], [mx.nd.array([1.5, 2.0])])
    held = [(m, copy.copy(vars(m))) for m in book.metrics]
    counts, sums = f1.metrics, getattr(mae, "_hvdtrain_element_errors")
    before = (vars(counts).copy(), sums.elements)
    book.reduce(DistContext(num_workers=2, store=Twice()))  # another rank counted the same
    assert f1.metrics.true_positives == 2 * counts.true_positives
    for kept, attributes in held:
        kept.__dict__.clear()
        kept.__dict__.update(attributes)
    assert f1.metrics is counts and vars(counts) == before[0]
    assert getattr(mae, "_hvdtrain_element_errors") is sums and sums.elements == before[1]
