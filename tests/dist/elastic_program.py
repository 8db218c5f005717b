"""Spike: a Gluon worker under Horovod's elastic driver (``horovodrun --gloo --min-np ...``).

Horovod has no ``horovod.mxnet.elastic``; this program builds the smallest MXNet state on
``horovod.common.elastic`` (``ObjectState`` + ``run_fn``) to find out whether the driver can
run MXNet workers: a reset after ``kill -9`` of a rank, ``hvd.shutdown()``/``hvd.init()``
with MXNet's engine holding in-flight work, and a broadcast of the parameters after it.

Each event is one JSON line on stdout (``{"event": ..., "t": time.time(), ...}``) so the
driver (``tests/dist/elastic_spike.py``) can measure from the kill to training again.

Run (by the driver)::

    horovodrun --gloo -np 2 --min-np 1 --max-np 4 --host-discovery-script discover.sh \
        python tests/dist/elastic_program.py --steps 300 --kill-step 120 --marker m
"""
import argparse
import json
import os
import signal
import sys
import time
import zlib

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import horovod.mxnet as hvd
from horovod.common.elastic import ObjectState, run_fn
from horovod.common.exceptions import HorovodInternalError

from hvdtrain.store.broadcast import broadcast_object
from say import say


def emit(event, **fields):
    say(json.dumps(dict(event=event, t=time.time(), pid=os.getpid(),
                        host=os.environ.get("HOROVOD_HOSTNAME", "?"), **fields)))


def digest(net):
    """CRC of every parameter's bytes: equal on all ranks iff the parameters are equal."""
    crc = 0
    for name, p in sorted(net.collect_params().items()):
        crc = zlib.crc32(p.data().asnumpy().tobytes(), crc)
    return crc


class SpikeState(ObjectState):
    """Parameters and optimizer state of one Gluon net and trainer, plus plain counters."""

    def __init__(self, net, trainer, **counters):
        self.net, self.trainer = net, trainer
        self._params = self._read_params()
        self._opt = self._read_opt()
        # hvdtrain's broadcast_object: horovod.mxnet's can crash a rank (see
        # hvdtrain/store/broadcast.py), which this spike would count as a lost rank.
        super().__init__(bcast_object=lambda obj: broadcast_object(
                             hvd, obj, "spike." + type(obj).__name__),
                         get_rank=hvd.rank, **counters)

    def _read_params(self):
        return {n: p.data().asnumpy() for n, p in self.net.collect_params().items()}

    def _read_opt(self):
        return self.trainer._updaters[0].get_states(dump_optimizer=True)

    def _write_params(self, values):
        for name, p in self.net.collect_params().items():
            p.set_data(mx.nd.array(values[name]))

    def _write_opt(self, blob):
        t = self.trainer
        for u in t._updaters:
            u.set_states(blob)
            u.optimizer = t._updaters[0].optimizer
        t._optimizer = t._updaters[0].optimizer
        t._optimizer.param_dict = {i: p for i, p in enumerate(t._params)}

    def save(self):
        self._params, self._opt = self._read_params(), self._read_opt()
        super().save()

    def restore(self):
        self._write_params(self._params)
        self._write_opt(self._opt)
        super().restore()

    def sync(self):
        # Values via broadcast_object (pickled numpy): no parameter array on a new or a
        # reset rank has to be readable by the engine before this point. Every rank must
        # pass the same name, or the ranks wait for each other's differently named tensors.
        self._params = broadcast_object(hvd, self._params, "spike.params")
        self._opt = broadcast_object(hvd, self._opt, "spike.opt")
        self._write_params(self._params)
        self._write_opt(self._opt)
        super().sync()


def reset():
    # Anything still queued in MXNet's engine refers to the old communicator: let it finish
    # (or fail) before Horovod goes down, or its callback fires into a shut-down Horovod.
    try:
        mx.nd.waitall()
    except mx.base.MXNetError as err:
        emit("waitall_error", error=str(err).splitlines()[0][:200])
    hvd.shutdown()
    hvd.init()
    emit("reinit", rank=hvd.rank(), size=hvd.size())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--commit-every", type=int, default=10)
    parser.add_argument("--kill-step", type=int, default=-1)
    parser.add_argument("--kill-host", default="127.0.0.3")
    parser.add_argument("--marker", default="")
    parser.add_argument("--pause", type=float, default=0.05)
    parser.add_argument("--keep-stale-scale", action="store_true")
    parser.add_argument("--trainer", choices=["horovod", "hvdtrain", "sharded"],
                        default="horovod",
                        help="horovod.mxnet's DistributedTrainer, or hvdtrain's "
                             "BucketedTrainer (or ShardedTrainer) on its HorovodKVStore")
    parser.add_argument("--bucket-mb", type=float, default=0.0)
    parser.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    parser.add_argument("--weights-out", default="",
                        help="rank 0 writes its final weights here (.npz)")
    parser.add_argument("--reference", default="",
                        help="no Horovod: a plain Gluon loop in this one process, each step "
                             "on the batches of every rank of the world size this JSON list "
                             "gives for it (the elastic job's), into --weights-out")
    parser.add_argument("--state", choices=["spike", "gluon"], default="spike",
                        help="spike: this file's SpikeState; gluon: hvdtrain's GluonState")
    args = parser.parse_args()
    if args.reference:
        return reference(args)

    hvd.init()
    emit("start", rank=hvd.rank(), size=hvd.size())
    net = make_net()
    settings = SETTINGS[args.optimizer]
    if args.trainer in ("hvdtrain", "sharded"):
        # hvdtrain's own store and trainer: the store sums, so the step takes the global
        # batch, read from the current world size at every step.
        from hvdtrain.store.buckets import BucketedTrainer
        from hvdtrain.store.kvstore import HorovodKVStore
        from hvdtrain.store.sharded import ShardedTrainer
        kind = ShardedTrainer if args.trainer == "sharded" else BucketedTrainer
        trainer = kind(net.collect_params(), args.optimizer, settings,
                       kvstore=HorovodKVStore(), update_on_kvstore=False,
                       bucket_mb=args.bucket_mb)
        step_samples = lambda: 16 * hvd.size()  # noqa: E731
    else:
        trainer = hvd.DistributedTrainer(net.collect_params(), args.optimizer, settings)
        step_samples = lambda: 16  # noqa: E731  (it averages)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    if args.state == "gluon":
        from hvdtrain.loop.elastic.state import GluonState
        state = GluonState(net, trainer, step=0, resets=0)
    else:
        state = SpikeState(net, trainer, step=0, resets=0)

    def on_reset():
        # horovod.mxnet's DistributedTrainer averages in the framework on a CPU build (no
        # NCCL): it folds 1/size into _scale once, in its constructor. A survivor's trainer
        # would keep the old world size (seen in the spike: ranks on the old and the new
        # host diverged after a scale-up). --keep-stale-scale reproduces that.
        if getattr(trainer, "_average_in_framework", False) and not args.keep_stale_scale:
            trainer._scale = 1.0 / hvd.size()
        state.resets += 1
        emit("reset", rank=hvd.rank(), size=hvd.size(), step=state.step)
    state.register_reset_callbacks([on_reset])

    if args.state == "gluon":
        from hvdtrain.runtime import elastic_run
        run, step_errors = elastic_run.run, elastic_run.collective_errors
    else:
        run, step_errors = run_fn_mx, None

    @run
    def train(state):
        emit("synced", rank=hvd.rank(), size=hvd.size(), step=state.step, digest=digest(net))
        while state.step < args.steps:
            x, y = batch(state.step, hvd.rank())
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(step_samples())
            try:
                if step_errors:  # hvdtrain's translation (and reset) under test
                    with step_errors():
                        mx.nd.waitall()
                else:
                    mx.nd.waitall()  # an allreduce that failed raises here, not in .step
            except (mx.base.MXNetError, HorovodInternalError) as err:
                emit("step_error", rank=hvd.rank(), step=state.step,
                     error=str(err).splitlines()[0][:200])
                if isinstance(err, HorovodInternalError):
                    raise
                raise HorovodInternalError(err)
            state.step += 1
            emit("step", rank=hvd.rank(), size=hvd.size(), step=state.step)
            if state.step % args.commit_every == 0:
                state.commit()
                emit("commit", rank=hvd.rank(), size=hvd.size(), step=state.step,
                     digest=digest(net))
            if (state.step == args.kill_step and os.environ.get("HOROVOD_HOSTNAME") ==
                    args.kill_host and hvd.local_rank() == 0 and args.marker
                    and not os.path.exists(args.marker)):
                with open(args.marker, "w") as out:
                    json.dump(dict(t=time.time(), rank=hvd.rank(), step=state.step), out)
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(args.pause)
        emit("done", rank=hvd.rank(), size=hvd.size(), step=state.step, digest=digest(net))
        if args.weights_out and hvd.rank() == 0:
            save_weights(net, args.weights_out)

    train(state)
    # Let MXNet's engine finish what is queued (the last step's collectives): shut down with
    # one of them pending and a slower rank still in it fails.
    mx.nd.waitall()
    hvd.shutdown()
    return 0


SETTINGS = {"sgd": {"learning_rate": 0.1, "momentum": 0.9},
            "adam": {"learning_rate": 0.01, "wd": 0.001}}


def make_net():
    """The worker's model, its weights from seed 1 (every rank's, and the reference's)."""
    mx.random.seed(1)
    net = gluon.nn.HybridSequential(prefix="spike_")
    with net.name_scope():
        net.add(gluon.nn.Dense(32, activation="relu", in_units=64),
                gluon.nn.Dense(10, in_units=32))
    net.initialize(mx.init.Xavier())
    return net


def batch(step, rank):
    """Rank `rank`'s 16 samples of step `step` (0-based)."""
    rng = np.random.RandomState(step * 1000 + rank)
    return mx.nd.array(rng.rand(16, 64)), mx.nd.array(rng.randint(0, 10, 16))


def save_weights(net, path):
    np.savez(path, **{name: p.data().asnumpy() for name, p in net.collect_params().items()})


def reference(args):
    """What the elastic job computes, without it: one process, a plain ``gluon.Trainer``
    (no store), each step on the concatenated batches of ranks 0..size-1 of that step's
    world size (the summed loss over the global batch, as the ranks' summed gradients)."""
    with open(args.reference) as src:
        sizes = json.load(src)
    net = make_net()
    trainer = gluon.Trainer(net.collect_params(), args.optimizer, SETTINGS[args.optimizer])
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for step, size in enumerate(sizes):
        parts = [batch(step, rank) for rank in range(size)]
        x = mx.nd.concat(*[p[0] for p in parts], dim=0)
        y = mx.nd.concat(*[p[1] for p in parts], dim=0)
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(16 * size)
    save_weights(net, args.weights_out)
    return 0


def run_fn_mx(func):
    return run_fn(func, reset)


if __name__ == "__main__":
    sys.exit(main())
