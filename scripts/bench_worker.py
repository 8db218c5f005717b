"""One process of a benchmark run.

    python scripts/bench_worker.py --impl plain|hvdtrain --data synthetic|cifar [...]

Run alone (one rank) or under horovodrun (several); each rank writes its figures to
``<--out>.rank<R>.json``. ``plain`` is the loop Horovod's and
MXNet's examples teach, kept here as the comparison point: ``hvd.DistributedTrainer`` on an
imperative (not hybridized) model, Gluon's DataLoader with per-sample transforms, and the
accuracy metric updated every batch. ``hvdtrain`` is this package's loop.
"""
import argparse
import json
import logging
import os
import resource
import sys
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon.data.vision import transforms

import horovod.mxnet as hvd
import hvdtrain
from hvdtrain import ConfigError, TrainConfig
from hvdtrain.data.datasets import CIFAR_MEAN, CIFAR_STD, load_cifar10, make_synthetic
from hvdtrain.store.broadcast import broadcast_
from hvdtrain.store.dist import DistContext, share_cpu_threads
from hvdtrain.store.buckets import BucketedTrainer
from hvdtrain.models import ZOO_MODELS, model_names
from hvdtrain.classify.build import classifier_loop
from hvdtrain.loop.engine.epoch import train_epoch
from hvdtrain.loop.recipe.mixing import Mixing
from hvdtrain.loop.recipe.parts import Recipe
from hvdtrain.state.train_state import TrainState


MAX_IMAGES_PER_RANK = 100_000


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--impl", choices=("plain", "hvdtrain"), required=True)
    p.add_argument("--data", choices=("synthetic", "cifar"), required=True)
    p.add_argument("--data-dir")
    p.add_argument("--model", default="resnet18_v1")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--instrument", action="store_true",
                   help="wait after backward and after the allreduce to time the exchange")
    p.add_argument("--fp16-allreduce", action="store_true")
    p.add_argument("--compression", choices=("none", "powersgd"), default="none",
                   help="hvdtrain only: powersgd sends gradient matrices as low-rank factors")
    p.add_argument("--powersgd-rank", type=int, default=4)
    p.add_argument("--powersgd-start-step", type=int, default=0,
                   help="steps sent whole first (default %(default)s: every timed step "
                        "compressed; the run's own default is 1000)")
    p.add_argument("--accumulate", type=int, default=1,
                   help="hvdtrain only: micro-batches of --batch-size per step (one exchange)")
    # Ablations: hvdtrain's loop with one of its changes undone.
    p.add_argument("--no-hybridize", dest="hybridize", action="store_false",
                   help="the imperative model")
    p.add_argument("--grad-bucket-mb", type=float, default=TrainConfig.grad_bucket_mb,
                   help="0: one allreduce per parameter, fused by Horovod's timing")
    p.add_argument("--log-interval", type=int, default=0,
                   help="1: the host reads loss and accuracy after every step")
    p.add_argument("--data-workers", type=int, default=TrainConfig.data_workers,
                   help="0: batches prepared in the training thread, no prefetch")
    # Options of the training recipe (issue 38), each measured as a row of its own.
    p.add_argument("--mixup", type=float, default=0.0)
    p.add_argument("--cutmix", type=float, default=0.0)
    p.add_argument("--no-wd", action="store_true")
    p.add_argument("--ema", type=float, default=None)
    p.add_argument("--ema-every", type=int, default=32)  # hvdtrain's own default
    p.add_argument("--clip-grad-norm", type=float, default=None)
    p.add_argument("--copied-buckets", action="store_true",
                   help="buckets as grouped allreduces of separate gradients, copied into "
                        "Horovod's fusion buffer and back (hvdtrain before zero-copy buckets)")
    p.add_argument("--out", required=True, help="write PREFIX.rank<R>.json")
    args = p.parse_args()
    if min(args.batch_size, args.steps, args.warmup + 1) < 1:
        p.error("--batch-size and --steps must be at least 1, --warmup at least 0")
    if args.compression != "none" and args.impl != "hvdtrain":
        p.error("--compression is hvdtrain's (Horovod's MXNet binding has no PowerSGD)")
    recipe = (args.mixup, args.cutmix, args.no_wd, args.ema, args.clip_grad_norm)
    if args.impl != "hvdtrain" and recipe != (0.0, 0.0, False, None, None):
        p.error("the training recipe's options are hvdtrain's: they need --impl hvdtrain")
    if args.accumulate < 1 or (args.accumulate > 1 and args.impl != "hvdtrain"):
        p.error("--accumulate must be at least 1, and above 1 only with --impl hvdtrain "
                "(Horovod's MXNet binding has no accumulation)")
    if args.batch_size * args.accumulate * (args.warmup + args.steps) > MAX_IMAGES_PER_RANK:
        p.error(f"--batch-size x (--warmup + --steps) is over {MAX_IMAGES_PER_RANK} images "
                "per rank, more than a benchmark needs (the data would not fit in memory)")
    # The plain loop builds from Gluon's model zoo only; hvdtrain also has its small models.
    known = list(ZOO_MODELS) if args.impl == "plain" else model_names()
    if args.model not in known:
        p.error(f"--model {args.model}: not one of {', '.join(known)}")
    if args.data == "cifar" and not args.data_dir:
        p.error("--data cifar needs --data-dir")
    if not os.access(os.path.dirname(os.path.abspath(args.out)), os.W_OK):
        p.error(f"--out {args.out}: its folder does not exist or cannot be written")
    return args


def step_samples(args):
    """Samples one rank trains on per optimizer step."""
    return args.batch_size * args.accumulate


def link_bytes():
    """Bytes sent so far on this network namespace's loopback device (every byte between
    the ranks when they run in a private namespace: scripts/bench_link.py), or None.

    From /proc/net/dev, which shows the reading process's namespace; /sys/class/net shows
    the namespace sysfs was mounted in, which ``unshare -n`` does not change."""
    try:
        with open("/proc/net/dev") as table:
            for line in table:
                name, _, fields = line.partition(":")
                if name.strip() == "lo":
                    return int(fields.split()[8])  # 8 receive columns, then transmit bytes
    except OSError:
        pass
    return None


def gradient_bytes(net, args, trainer=None):
    """Bytes of one rank's gradients as exchanged (float16 with --fp16-allreduce); with
    PowerSGD, the factors P and Q of the compressed matrices plus the other gradients."""
    values = sum(p.data().size for p in net.collect_params().values() if p.grad_req != "null")
    compression = getattr(trainer, "compression", None)
    if compression is not None:
        values = compression.values_sent(values)
    return values * (2 if args.fp16_allreduce else 4)


def dataset(args):
    if args.data == "cifar":
        return load_cifar10(args.data_dir)
    # Enough for every step to see a full batch within one pass, at up to 2 ranks.
    images = max(8192, 2 * step_samples(args) * (args.warmup + args.steps))
    return make_synthetic(num_train=images, num_test=64)


def check_enough(data, args, ranks):
    """Every timed step must see a full batch within one pass over this rank's share."""
    per_rank = len(data.train_y) // ranks
    needed = step_samples(args) * (args.warmup + args.steps)
    if per_rank < needed:
        sys.exit(f"bench_worker: {len(data.train_y)} training images give {per_rank} per "
                 f"rank; --warmup + --steps need {needed}")


class PadCrop(gluon.Block):
    """Per-sample random crop with 4-pixel padding (Gluon 1.9.1 has no RandomCrop(pad=))."""

    def forward(self, x):  # pylint: disable=arguments-differ
        chw = x.astype("float32").transpose((2, 0, 1)).expand_dims(0)
        padded = mx.nd.pad(chw, mode="constant", pad_width=(0, 0, 0, 0, 4, 4, 4, 4))[0]
        top, left = np.random.randint(0, 9, size=2)
        return padded[:, top:top + 32, left:left + 32].transpose((1, 2, 0))


def plain_loop(args, data):
    """The examples' loop: per-sample transforms, DistributedTrainer, no hybridize."""
    hvd.init()
    check_enough(data, args, hvd.size())
    ctx = mx.cpu()
    net = gluon.model_zoo.vision.get_model(args.model, classes=10)
    net.initialize(mx.init.Xavier(), ctx=ctx)
    # In training mode, as hvdtrain.initialize: after an inference pass MKL-DNN may have
    # reordered a convolution's weights into its own layout, which Horovod's allreduce
    # cannot read ("We can't generate TBlob for MKLDNN data", seen in make bench --quick).
    with autograd.train_mode():
        net(mx.nd.zeros((1, 3, 32, 32), ctx=ctx))
    params = net.collect_params()
    # Users write hvd.broadcast_parameters(params, root_rank=0) here. Its broadcast can
    # crash a rank now and then (hvdtrain/store/broadcast.py); a sum-allreduce sets the
    # same values without that risk, and is not timed.
    for index, (_, param) in enumerate(sorted(params.items())):
        broadcast_(hvd, param.data(), f"plain.init.{index}")
    mx.nd.waitall()
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    trainer = hvd.DistributedTrainer(params, "sgd", {"learning_rate": 0.01, "momentum": 0.9,
                                                     "wd": 1e-4}, compression=compression)
    augment = [PadCrop(), transforms.RandomFlipLeftRight()] if data.augment else []
    transform = transforms.Compose(augment + [transforms.ToTensor(),
                                              transforms.Normalize(CIFAR_MEAN, CIFAR_STD)])
    images = mx.nd.array(data.train_x.transpose(0, 2, 3, 1), dtype=np.uint8)  # HWC, as files
    train = gluon.data.ArrayDataset(images, data.train_y.astype(np.float32))
    sampler = hvdtrain.SplitSampler(len(train), hvd.size(), hvd.rank(), shuffle=True)
    loader = gluon.data.DataLoader(train.transform_first(transform), args.batch_size,
                                   sampler=sampler, last_batch="discard")
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    metric = mx.metric.Accuracy()
    timings = []
    batches = iter(loader)
    sent = []
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            sent.append(link_bytes())
        start = time.perf_counter()
        x, y = next(batches)
        x, y = x.as_in_context(ctx), y.as_in_context(ctx)
        with autograd.record():
            out = net(x)
            loss = loss_fn(out, y)
        loss.backward()
        if args.instrument:
            exchange = timed_exchange(trainer, args.batch_size)
        else:
            trainer.step(args.batch_size)
        metric.update([y], [out])  # reads the output: a host sync every batch
        mx.nd.waitall()
        if step >= args.warmup:
            end = time.perf_counter()
            timings.append((end - start, exchange if args.instrument else 0.0))
    sent.append(link_bytes())
    return hvd.rank(), hvd.size(), timings, dict(sent=sent,
                                                 gradient_bytes=gradient_bytes(net, args))


class CopiedBuckets(BucketedTrainer):
    """The bucketed exchange as it was before zero-copy buckets: the same plan, but each
    bucket is one grouped allreduce of the parameters' own gradient arrays, which Horovod
    copies into its fusion buffer and back out."""

    def _flatten(self, bucket):
        return []

    def _allreduce_grads(self):
        if not self.buckets:
            super()._allreduce_grads()
            return
        for bucket in self.buckets:
            self._kvstore.pushpull(bucket, [self._params[i].list_grad() for i in bucket],
                                   priority=-min(bucket))


def hvdtrain_loop(args, data):
    """hvdtrain's own loop (train_epoch) on its store, loader and hybridized model."""
    # As the hvdtrain command creates it: buckets are never fused with each other.
    store = hvdtrain.create_store("horovod", compression="fp16" if args.fp16_allreduce
                                  else "none",
                                  fuse_calls=args.grad_bucket_mb == 0 or args.copied_buckets)
    dist = DistContext.from_store(store)
    check_enough(data, args, dist.num_workers)
    share_cpu_threads(dist.local_size)
    powersgd = dict(compression="powersgd", powersgd_rank=args.powersgd_rank,
                    powersgd_start_step=args.powersgd_start_step) \
        if args.compression == "powersgd" else {}
    try:
        cfg = TrainConfig(dataset="synthetic", model=args.model, batch_size=args.batch_size,
                          data_workers=args.data_workers, seed=0,
                          grad_bucket_mb=args.grad_bucket_mb, accumulate=args.accumulate,
                          mixup=args.mixup, cutmix=args.cutmix, no_wd=args.no_wd,
                          ema=args.ema, ema_every=args.ema_every,
                          clip_grad_norm=args.clip_grad_norm, **powersgd)
    except ConfigError as err:
        sys.exit(f"bench_worker: {err}")
    net = hvdtrain.build_model(args.model, data.num_classes)
    devices = [mx.cpu()]
    hvdtrain.initialize(net, devices, data.image_shape, cfg.seed, dist.rank, args.hybridize)
    trainer = hvdtrain.build_trainer(net, cfg, dist)
    if args.copied_buckets:
        trainer.__class__ = CopiedBuckets  # before the store is set up, which plans buckets
    hvdtrain.broadcast_parameters(trainer, step_samples(args) * dist.num_workers)
    train_loader, _ = hvdtrain.build_loaders(data, cfg, dist)
    # After the broadcast, as the job makes it; no warm-up here.
    recipe = Recipe.of(cfg, net, dist, len(train_loader))
    state = TrainState()
    loop = classifier_loop(net, trainer, devices, dist, state,
                           mixing=Mixing.of(cfg, data.num_classes),
                           log_interval=args.log_interval, accumulate=args.accumulate,
                           clipper=recipe.clipper, ema=recipe.ema)
    if args.instrument:
        if args.accumulate > 1:
            sys.exit("bench_worker: --instrument times one micro-batch per step; it does not "
                     "take --accumulate")
        return dist.rank, dist.num_workers, instrumented(loop, train_loader, args), {}
    loop.max_steps = args.warmup
    train_epoch(loop, train_loader, state)
    loop.max_steps = args.warmup + args.steps
    # The timed steps start a fresh pass over the data, so none of them is a short last
    # batch (check_enough made sure the pass is long enough).
    sent = [link_bytes()]
    stats = train_epoch(loop, train_loader, state)
    sent.append(link_bytes())
    assert stats.samples == args.steps * step_samples(args) * dist.num_workers, stats
    per_step = stats.seconds / args.steps
    return dist.rank, dist.num_workers, [(per_step, 0.0)] * args.steps, dict(
        sent=sent, gradient_bytes=gradient_bytes(net, args, trainer), buckets=trainer.buckets)


def timed_exchange(trainer, batch_size):
    """Finish the step in three timed parts: wait for backward, exchange gradients and wait,
    update. Returns the seconds spent in the exchange."""
    mx.nd.waitall()
    computed = time.perf_counter()
    trainer.allreduce_grads()
    mx.nd.waitall()
    reduced = time.perf_counter()
    trainer.update(batch_size)
    return reduced - computed


def instrumented(loop, loader, args):
    """hvdtrain's step, split by waits into compute and gradient exchange."""
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    timings = []
    batches = iter(loader)
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        images, labels = next(batches)
        x, y = mx.nd.array(images), mx.nd.array(labels)
        with autograd.record():
            loss = loss_fn(loop.net(x), y)
        loss.backward()
        exchange = timed_exchange(loop.trainer, len(labels) * loop.dist.num_workers)
        mx.nd.waitall()
        if step >= args.warmup:
            timings.append((time.perf_counter() - start, exchange))
    return timings


def main():
    args = parse()
    try:
        run_and_report(args)
    except ConfigError as err:  # a data folder without the files, and the like
        print(f"bench_worker: {err}", file=sys.stderr)
        sys.exit(2)


def run_and_report(args):
    if args.log_interval:
        # The loop reads its metrics at log intervals only when INFO is on; keep it quiet.
        logging.getLogger("hvdtrain").setLevel(logging.INFO)
        logging.getLogger("hvdtrain").addHandler(logging.NullHandler())
    data = dataset(args)
    run = plain_loop if args.impl == "plain" else hvdtrain_loop
    rank, size, timings, link = run(args, data)
    sent = link.get("sent", [None])
    step_time = sum(t for t, _ in timings)
    timed_samples = step_samples(args) * len(timings)
    with open(f"{args.out}.rank{rank}.json", "w") as out:
        json.dump({
        "impl": args.impl, "data": args.data, "rank": rank, "ranks": size,
        "img_per_sec": timed_samples / step_time,
        "step_seconds": step_time / len(timings),
        # Bytes sent on this network namespace's loopback over the timed steps, per sample
        # trained by all ranks (= what each rank sends per sample it trains, the ranks being
        # symmetric): meaningful only where the ranks are alone in a namespace
        # (scripts/bench_link.py), and read by rank 0.
        "link_bytes_per_sample": None if None in sent else
        (sent[1] - sent[0]) / (timed_samples * size),
        "gradient_bytes": link.get("gradient_bytes"),
        # hvdtrain's gradient buckets, as parameter positions (none: no buckets).
        "buckets": link.get("buckets") or [],
        "allreduce_share": sum(a for _, a in timings) / step_time,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "omp_threads": os.environ.get("OMP_NUM_THREADS")}, out)
    mx.nd.waitall()
    hvd.shutdown()  # MPI must be finalized, or mpirun calls the exit abnormal
    os._exit(0)  # skip MXNet's teardown, which can take seconds


if __name__ == "__main__":
    main()
