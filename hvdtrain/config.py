"""The training configuration: every option defined once, and one frozen, validated dataclass.

Each field of :class:`TrainConfig` carries its whole definition in ``field(metadata=...)``,
made by :func:`hvdtrain.options.option`: its help text, ``--help`` group, choices and
numeric range. From that one place :func:`validate` checks a configuration,
:mod:`hvdtrain.cli` builds the parser and :func:`flag_table` writes README's flag table
(``scripts/update_flag_table.py``; a test fails when the README's copy is stale). Adding a
flag is one ``option(...)`` field here plus its behaviour. Standard library only: the parameter-server launcher imports this module.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterator, Optional, Tuple, Union

from .options import (GROUPS, NON_NEGATIVE, POSITIVE, ConfigError, check_range, count_or_percent,
                      default_of, epochs_steps_or_time, flag_name, int_list, option)
from .options import flag_table as options_table

HALF_NEEDS_GPU = ("--amp and --dtype float16 need a GPU: MXNet 1.9.1's CPU kernels have no "
                  "float16 (its CPU AMP is bfloat16); train in float32 on CPUs")
COMMIT_EVERY = 20  # --commit-every's default, in steps
# sysexits.h's EX_TEMPFAIL ("a temporary failure; the user is invited to retry"): the status
# of every rank of a run stopped by a signal, its checkpoint saved (docs/reliability.md,
# "Preemption"). Here, standard library only, because hvdtrain-launch reads it too.
EXIT_PREEMPTED = 75
# --powersgd-rank's default: the paper's ResNet-18/CIFAR-10 runs matched SGD from rank 2; 4
# leaves a margin for larger models at still about 1/100 of the bytes (docs/performance.md).
POWERSGD_RANK = 4
POWERSGD_START_STEP = 1000  # PyTorch DDP's start_powerSGD_iter default
IMAGE_LAYOUTS = {"imagefolder": "train/<class>/*.jpg and val/<class>/*",
                 "recordio": "train.rec, train.idx, val.rec and val.idx"}


# The names --model accepts, here (standard library) so that --help and README's flag table
# list them; hvdtrain/models.py builds each.
SMALL_MODEL_NAMES = ("simple_cnn", "bn_cnn", "pool_cnn", "mlp")
# MXNet 1.9.1's vision.get_model accepts these names but offers no way to list them.
ZOO_MODELS = (
    "alexnet", "densenet121", "densenet161", "densenet169", "densenet201", "inceptionv3",
    "mobilenet0.25", "mobilenet0.5", "mobilenet0.75", "mobilenet1.0", "mobilenetv2_0.25",
    "mobilenetv2_0.5", "mobilenetv2_0.75", "mobilenetv2_1.0", "resnet101_v1", "resnet101_v2",
    "resnet152_v1", "resnet152_v2", "resnet18_v1", "resnet18_v2", "resnet34_v1",
    "resnet34_v2", "resnet50_v1", "resnet50_v2", "squeezenet1.0", "squeezenet1.1", "vgg11",
    "vgg11_bn", "vgg13", "vgg13_bn", "vgg16", "vgg16_bn", "vgg19", "vgg19_bn",
)



@dataclass(frozen=True)
class RunConfig:
    """What decides how a run trains, for any model: the step (batch, accumulation, clipping,
    the moving average, the schedule over the optimizer's rate), the distribution (store,
    wire, PowerSGD, elastic) and the run's outputs and guards (checkpoints, resume, the stall
    watchdog, the finite check). :class:`~hvdtrain.estimator.Estimator` acts on each field;
    the ``hvdtrain`` command's :class:`TrainConfig` adds the data, model and optimizer it
    builds. Each field is one option: its metadata hold the help text, choices and range
    (see :func:`option`), from which ``hvdtrain --help`` and README's flag table are made.

    batch_size
        Samples per device per step. With Horovod a worker drives one device, so this is
        per worker; the global batch is ``batch_size * devices per worker * num_workers``.
    sampling
        ``strided`` makes N workers with batch b see exactly the samples of one worker with
        batch N*b, step by step.
    """

    max_bad_samples: str = option(
        "1%", "imagefolder/recordio: unreadable or undecodable samples a split may have in an "
        "epoch (a count, or a percentage of the split) before the job ends naming them; a "
        "split with no usable sample always ends it", group="data", parse=count_or_percent,
        metavar="N|P%")
    data_workers: int = option(
        2, "threads preparing (for image formats: decoding and augmenting) batches ahead of "
        "the step, per process", group="data",
        range=NON_NEGATIVE)
    sampling: str = option(
        "strided", "how each epoch's shuffle is split over workers; strided makes N workers x "
        "batch b see what 1 worker x batch N*b sees", group="data",
        choices=("strided", "contiguous"))
    amp: bool = option(
        False, "MXNet automatic mixed precision with loss scaling (GPU only)", group="model",
        kind="switch")
    batch_size: int = option(
        64, "samples per device per step (with Horovod: per worker); global batch = this x "
        "devices per worker x workers", group="optimisation", range=POSITIVE)
    epochs: int = option(
        5, "passes over the training set", group="optimisation", range=POSITIVE)
    accumulate: int = option(
        1, "micro-batches whose gradients are summed locally before one exchange and "
        "update; global batch = batch size x devices per worker x workers x this",
        group="optimisation", range=POSITIVE)
    lr_scaling: str = option(
        "none", "linear: multiply --lr by the number of workers", group="optimisation",
        choices=("none", "linear"))
    warmup_epochs: float = option(
        0.0, "linear learning-rate warm-up, in epochs", group="optimisation",
        range=NON_NEGATIVE)
    lr_schedule: str = option(
        "step", "after the warm-up: step (x --lr-decay-factor at each --lr-decay-epochs), "
        "cosine or poly (power 2) decay to 0 at the last step", group="optimisation",
        choices=("step", "cosine", "poly"))
    lr_decay_epochs: Tuple[int, ...] = option(
        (), "comma-separated epochs at which the learning rate is multiplied by "
        "--lr-decay-factor", group="optimisation", parse=int_list)
    lr_decay_factor: float = option(
        0.1, "factor the learning rate is multiplied by at each --lr-decay-epochs epoch",
        group="optimisation", range=(0, 1, True, False))
    no_wd: bool = option(
        False, "no weight decay on biases and on normalisation layers' gamma and beta (found "
        "by the layer they belong to)", group="optimisation", kind="switch")
    ema: Optional[float] = option(
        None, "keep an exponential moving average of the model (weights and BatchNorm "
        "statistics), ema = DECAY**N x ema + (1 - DECAY**N) x model every --ema-every N "
        "optimizer steps (the time constant of DECAY at every step); evaluated beside the "
        "model and saved as model-ema.params", group="optimisation",
        range=(0, 1, True, True), metavar="DECAY")
    ema_every: int = option(
        32, "update the --ema average every N optimizer steps, with DECAY**N (torchvision's "
        "reference default; 1: every step, at N times the cost)", group="optimisation",
        range=POSITIVE, metavar="N")
    clip_grad_norm: Optional[float] = option(
        None, "scale each step's averaged gradient down to this global L2 norm when it is "
        "larger (the norm over all parameters, the same on every rank)",
        group="optimisation", range=POSITIVE, metavar="MAX")
    # The seed is bounded by what MXNet's and numpy's generators take (seed + rank).
    seed: int = option(
        42, "seeds shuffling, augmentation, initialisation and each step's random numbers "
        "(dropout: drawn from the seed, rank and step, so a resume draws what the run "
        "never stopped drew)", group="optimisation",
        range=(0, 2 ** 31 - 1, False, False))
    max_steps: Optional[int] = option(
        None, "stop after this many optimizer steps in total", group="optimisation",
        range=POSITIVE)
    kvstore: str = option(
        "horovod", "horovod (allreduce), none, or MXNet's local, device and dist_* stores",
        group="distribution", choices=("horovod", "local", "device", "none", "dist_sync",
                                       "dist_device_sync", "dist_async"))
    fp16_allreduce: bool = option(
        False, "send gradients as float16 (horovod store)", group="distribution", kind="switch")
    compression: str = option(
        "none", "powersgd: each large gradient matrix travels as two low-rank factors, with "
        "error feedback (horovod store; docs/performance.md#powersgd-compression); none: "
        "gradients travel whole", group="distribution", choices=("none", "powersgd"))
    powersgd_rank: Optional[int] = option(
        None, "--compression powersgd: columns of the factors; higher sends more and "
        "approximates closer", group="distribution", range=POSITIVE, shown=str(POWERSGD_RANK))
    powersgd_start_step: Optional[int] = option(
        None, "--compression powersgd: the first N optimizer steps of the run send gradients "
        "whole (a warm start, as PyTorch DDP's start_powerSGD_iter)", group="distribution",
        range=NON_NEGATIVE, shown=str(POWERSGD_START_STEP))
    powersgd_no_error_feedback: bool = option(
        False, "--compression powersgd without error feedback: for study only, it costs "
        "accuracy", group="distribution", kind="switch")
    grad_bucket_mb: float = option(
        25.0, "gradients live in flat buckets of at most this many MiB, each reduced by one "
        "in-place allreduce as soon as backward fills it; 0: one allreduce per parameter "
        "(horovod store)", group="distribution", range=NON_NEGATIVE)
    shard_optimizer: bool = option(
        False, "each rank keeps and applies the optimizer state of 1/N of the elements "
        "(ZeRO-1): the gradient buckets are reduce-scattered, each rank updates its slice, the "
        "weights are all-gathered; an allreduce's bytes on the wire, the same weights, "
        "checkpoints that hold the whole state, and --elastic resets that cut it again "
        "(docs/performance.md#sharded-optimizer-state)",
        group="distribution", kind="switch")
    elastic: bool = option(
        False, "survive lost and added hosts under horovodrun --min-np/--max-np "
        "--host-discovery-script: on a failure the others roll back to the last commit and "
        "go on (docs/elastic.md)", group="distribution", kind="switch")
    commit_every: Optional[int] = option(
        None, "with --elastic: keep a copy of the model, optimizer and position in memory "
        "every N steps (and at every epoch's end); a failure costs at most N steps, and a "
        "host that joins enters at the next commit", group="distribution", range=POSITIVE,
        shown=str(COMMIT_EVERY))
    output_dir: Optional[str] = option(
        None, "where rank 0 writes metrics.jsonl, checkpoints/ and model.params",
        group="output")
    progress: Optional[bool] = option(
        None, "a live progress bar on rank 0 (default: when stderr is a terminal; plain log "
        "lines otherwise)", group="output", kind="on-off", shown="auto")
    tensorboard: Optional[str] = option(
        None, "write TensorBoard scalars (rank 0) to DIR", group="output", metavar="DIR")
    horovod_timeline: Optional[str] = option(
        None, "write Horovod's timeline of every collective (rank 0) to FILE, a Chrome trace "
        "for chrome://tracing or Perfetto (docs/performance.md)", group="output",
        metavar="FILE")
    checkpoint_every: Union[int, str] = option(
        1, "save a checkpoint every N epochs, every N steps (500steps) or every so long by "
        "rank 0's clock (90s, 30m, 2h), and after the last; written in the background while "
        "training goes on (docs/reliability.md)", group="output", parse=epochs_steps_or_time,
        metavar="N|Nsteps|TIME")
    keep_checkpoints: int = option(
        3, "keep the newest K checkpoints", group="output", range=POSITIVE)
    resume: Optional[str] = option(
        None, "'auto' (newest checkpoint in --output-dir, or start fresh) or a checkpoint "
        "path", group="output")
    finite_check_every: int = option(
        10, "check every N steps that no rank's loss is NaN or infinite", group="output",
        range=POSITIVE)
    replica_check: str = option(
        "resync", "at each epoch's end and checkpoint the ranks compare a digest of every "
        "array (weights on every device, optimizer state, running statistics); a difference "
        "is named in one line and a metrics.jsonl record, then resync: every rank takes rank "
        "0's values and trains on; strict: every rank stops (exit 1); off: no check "
        "(docs/reliability.md)", group="output", choices=("resync", "strict", "off"))
    # The default, 10 minutes, leaves room for what a healthy GPU job does between two
    # steps: cuDNN autotuning on the first step and writing a large checkpoint.
    stall_timeout: float = option(
        600.0, "when no rank makes progress for this long (no step, evaluation batch or "
        "start-up milestone, no checkpoint being written), each rank logs its phase and "
        "exits, ending the job (a frozen rank would otherwise hang it); a slow rank 0 is "
        "never cut short; also sets Horovod's stall warning unless set; 0: off",
        group="output",
        range=NON_NEGATIVE, metavar="SECONDS")
    log_interval: int = option(
        50, "log every N steps within an epoch, 0 for epoch lines only", group="output",
        range=NON_NEGATIVE)

    def __post_init__(self):
        type(self).check(self)
        # One spelling per value ("2epochs" is 2), as the parser gives it: checkpoints compare
        # configurations on resume.
        object.__setattr__(self, "checkpoint_every", epochs_steps_or_time(self.checkpoint_every))

    @staticmethod
    def check(cfg) -> None:
        """Raise :class:`ConfigError` naming the first invalid field of `cfg`."""
        validate_run(cfg)

    def replace(self, **changes):
        """Return a copy with `changes` applied (and validated)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """A JSON-ready view, as written to metrics and checkpoints."""
        out = dataclasses.asdict(self)
        for name, value in out.items():
            if isinstance(value, tuple):
                out[name] = list(value)
        return out

    def global_batch(self, worker_batch: int, num_workers: int) -> int:
        """Samples in one optimizer step: every worker's batch (`worker_batch`, over its
        devices), times the ``--accumulate`` micro-batches it sums."""
        return worker_batch * num_workers * self.accumulate

    @property
    def commit_interval(self) -> int:
        """Steps between two elastic commits (``--commit-every``, or its default)."""
        return self.commit_every or COMMIT_EVERY

    @property
    def powersgd(self) -> Tuple[int, int]:
        """(rank, start step) of ``--compression powersgd``, defaults filled in."""
        return (self.powersgd_rank or POWERSGD_RANK,
                POWERSGD_START_STEP if self.powersgd_start_step is None
                else self.powersgd_start_step)


@dataclass(frozen=True)
class TrainConfig(RunConfig):
    """Everything that decides what a run of the ``hvdtrain`` command does: a
    :class:`RunConfig` and the data it loads, the model it builds and the optimizer it
    makes for them. One that is easy to misread:

    lr
        Learning rate for the *global* batch: gradients are averaged over it.
    """

    dataset: str = option(
        "cifar10", "cifar10 (binary files in --data-dir), digits (bundled 8x8 digits), "
        "synthetic (random, for throughput), imagefolder (--data-dir/train/<class>/*.jpg and "
        "val/<class>/*) or recordio (--data-dir/train.rec+.idx and val.rec+.idx)",
        group="data", choices=("cifar10", "digits", "synthetic", "imagefolder", "recordio"))
    data_dir: Optional[str] = option(
        None, "folder with the CIFAR-10 binary files, the image folder or the RecordIO pack "
        "(docs/data.md)", group="data")
    image_size: Optional[int] = option(
        None, "side of the square images imagefolder and recordio train and evaluate on; "
        "synthetic makes its random images this size (--dataset synthetic --image-size 224 "
        "measures a run without its input work)", group="data", range=POSITIVE,
        shown="224 (synthetic: 32)")
    min_crop_area: float = option(
        0.08, "imagefolder/recordio training crops cover at least this share of the image "
        "(random resized crop)", group="data", range=(0, 1, True, False))
    colour_jitter: float = option(
        0.4, "imagefolder/recordio training: brightness, contrast and saturation vary by up "
        "to this factor", group="data", range=(0, 1, False, True))
    pca_noise: float = option(
        0.1, "imagefolder/recordio training: std of AlexNet's PCA lighting noise",
        group="data", range=NON_NEGATIVE)
    model: Optional[str] = option(
        None, f"one of {', '.join(SMALL_MODEL_NAMES)} (small, for digits and CIFAR) or a "
        f"Gluon model-zoo name: {', '.join(ZOO_MODELS)}; simple_cnn for digits, else "
        "resnet18_v1", group="model", shown="per dataset")
    pretrained: bool = option(
        False, "start from the Gluon model zoo's ImageNet weights for --model, from MXNet's "
        "model store ($MXNET_HOME/models, downloaded there when missing; docs/fine-tuning.md)",
        group="model", kind="switch")
    init_from: Optional[str] = option(
        None, "start from these weights: a .params file, a checkpoint or output folder of an "
        "earlier run, or an exported model folder; a new run from epoch 0 (weights only, not "
        "--resume); the output layer is replaced when the classes differ",
        group="model", metavar="PATH")
    eval_only: bool = option(
        False, "evaluate the weights of --init-from (or --pretrained) on the validation split "
        "and stop: no training step; top-1, top-5, per-class accuracy, the confusion matrix "
        "and the worst-classified samples, written to --output-dir (docs/after-training.md)",
        group="model", kind="switch")
    hybridize: bool = option(
        True, "run the model imperatively (for debugging)", group="model", kind="off-switch")
    dtype: str = option(
        "float32", "float16 trains a float16 model with float32 master weights (GPU only)",
        group="model", choices=("float32", "float16"))
    last_gamma: bool = option(
        False, "start each residual block's last BatchNorm gamma at zero, so every block "
        "begins as the identity (model-zoo ResNets, v1 and v2)", group="model",
        kind="switch")
    lr: float = option(
        0.01, "learning rate for the GLOBAL batch: gradients are averaged over all workers' "
        "samples", group="optimisation", range=POSITIVE)
    head_lr_mult: float = option(
        1.0, "the output layer learns this many times faster than --lr (with --init-from or "
        "--pretrained)", group="optimisation", range=POSITIVE)
    freeze_epochs: int = option(
        0, "for the first N epochs only the output layer trains; the rest of the model is "
        "neither updated nor exchanged (with --init-from or --pretrained)",
        group="optimisation", range=NON_NEGATIVE)
    label_smoothing: float = option(
        0.0, "train on targets 1 - e for the true class and e / classes spread over all",
        group="optimisation", range=(0, 1, False, True))
    mixup: float = option(
        0.0, "mixup with Beta(ALPHA, ALPHA) weights: each training batch is blended with "
        "itself shifted by one sample, and so are its (smoothed) targets; 0: off "
        "(docs/training.md)", group="optimisation", range=NON_NEGATIVE, metavar="ALPHA")
    cutmix: float = option(
        0.0, "cutmix with Beta(ALPHA, ALPHA) areas: a box of each training image is pasted "
        "from the batch's previous sample, targets weighted by area; with --mixup, each batch "
        "takes one of the two at random; 0: off", group="optimisation",
        range=NON_NEGATIVE, metavar="ALPHA")
    mix_off_epoch: Optional[int] = option(
        None, "--mixup and --cutmix stop after this many epochs (the later epochs train on "
        "plain batches)", group="optimisation", range=POSITIVE, metavar="N")
    optimizer: str = option(
        "sgd", "Gluon optimizer applying the averaged gradients", group="optimisation",
        choices=("sgd", "nag", "adam", "rmsprop"))  # MXNet 1.9.1 registers no AdamW
    momentum: float = option(
        0.9, "momentum, for sgd and nag", group="optimisation", range=(0, 1, False, True))
    wd: float = option(1e-4, "weight decay", group="optimisation", range=NON_NEGATIVE)
    no_cuda: bool = option(
        False, "train on the CPU even if GPUs are visible", group="distribution",
        kind="switch")
    gpus: Tuple[int, ...] = option(
        (), "comma-separated GPU ids this worker drives (parameter server: one worker per "
        "host, several GPUs)", group="distribution", parse=int_list)
    gpus_per_worker: Optional[int] = option(
        None, "each worker drives this many GPUs, picked by its local rank",
        group="distribution", range=POSITIVE)

    @staticmethod
    def check(cfg) -> None:
        validate(cfg)

    @property
    def model_name(self) -> str:
        """The model to build: `model`, or the dataset's default."""
        return model_for(self.model, self.dataset)


def model_for(model: Optional[str], dataset: Optional[str]) -> str:
    """The model a run with these ``--model`` and ``--dataset`` values builds."""
    if model:
        return model
    return "simple_cnn" if dataset == "digits" else "resnet18_v1"


def options() -> Iterator[dataclasses.Field]:
    """Every option in ``--help`` and README order: by group (data, model, optimisation,
    distribution, output), and within a group what the command builds (TrainConfig's own:
    the data, the model, the optimizer) before what decides how any run trains
    (RunConfig's), each in the order it is defined."""
    run = {f.name for f in dataclasses.fields(RunConfig)}
    fields = list(dataclasses.fields(TrainConfig))
    return iter(sorted(fields, key=lambda f: (GROUPS.index(f.metadata["group"]),
                                              f.name in run)))


def flag_table() -> str:
    """README's flag table (markdown), made from :class:`TrainConfig`'s definitions."""
    return options_table(options())


def choices_of(name: str) -> Tuple[str, ...]:
    """The accepted values of option `name` (a field of :class:`TrainConfig`)."""
    return next(spec.metadata["choices"] for spec in options() if spec.name == name)


def _one_of(cfg, name, choices):
    value = getattr(cfg, name)
    if value not in choices:
        raise ConfigError(f"{flag_name(name)} must be one of {', '.join(choices)}; got {value!r}")


def validate_run(cfg: RunConfig) -> None:
    """Raise :class:`ConfigError` naming the first invalid field of `cfg`, for what any
    model's run needs of its settings."""
    for spec in dataclasses.fields(cfg):
        if spec.metadata["range"]:
            check_range(cfg, spec.name, *spec.metadata["range"])
        if spec.metadata["choices"]:
            _one_of(cfg, spec.name, spec.metadata["choices"])
    try:
        epochs_steps_or_time(cfg.checkpoint_every)
    except ValueError as err:
        raise ConfigError(f"--checkpoint-every: {err}") from None
    if cfg.resume == "auto" and not cfg.output_dir:
        raise ConfigError("--resume auto looks for checkpoints in --output-dir; give one")
    if cfg.lr_schedule != "step" and cfg.lr_decay_epochs:
        raise ConfigError(f"--lr-decay-epochs are the steps of --lr-schedule step; "
                          f"--lr-schedule {cfg.lr_schedule} decays smoothly: drop one of them")
    if cfg.kvstore == "dist_async" and cfg.accumulate > 1:
        raise ConfigError("--kvstore dist_async applies every push on its own on the servers: "
                          "--accumulate needs a synchronous store (drop one of them)")
    if cfg.kvstore == "dist_async" and cfg.lr_schedule != "step":
        raise ConfigError("--kvstore dist_async runs the optimizer on the servers, which "
                          "never see a learning-rate schedule: drop --lr-schedule")
    if cfg.kvstore == "dist_async" and (cfg.warmup_epochs or cfg.lr_decay_epochs):
        raise ConfigError("--kvstore dist_async runs the optimizer on the servers, which "
                          "never see a learning-rate schedule: drop --warmup-epochs and "
                          "--lr-decay-epochs")
    if any(e <= 0 for e in cfg.lr_decay_epochs):
        raise ConfigError("--lr-decay-epochs must be positive epoch numbers")
    if list(cfg.lr_decay_epochs) != sorted(set(cfg.lr_decay_epochs)):
        raise ConfigError("--lr-decay-epochs must be increasing")
    if cfg.elastic:
        check_elastic(cfg)
    elif cfg.commit_every is not None:
        raise ConfigError("--commit-every is the interval of --elastic's commits: add "
                          "--elastic, or drop it")
    check_compression(cfg)
    check_recipe(cfg)
    if cfg.shard_optimizer:
        check_shard_optimizer(cfg)
    if cfg.horovod_timeline and cfg.kvstore != "horovod":
        raise ConfigError("--horovod-timeline records Horovod's collectives: it needs "
                          "--kvstore horovod")


def validate(cfg: TrainConfig) -> None:
    """Raise :class:`ConfigError` naming the first invalid field of `cfg`: the run's
    settings (:func:`validate_run`), then what the command's data, model and optimizer need."""
    validate_run(cfg)
    if cfg.amp and cfg.dtype == "float16":
        raise ConfigError("--amp already runs in mixed float16/float32: drop --dtype float16")
    if cfg.no_cuda and (cfg.amp or cfg.dtype == "float16"):
        raise ConfigError(HALF_NEEDS_GPU)
    if cfg.dataset == "cifar10" and not cfg.data_dir:
        raise ConfigError("--dataset cifar10 needs --data-dir: the folder holding "
                          "data_batch_1.bin .. data_batch_5.bin and test_batch.bin")
    if cfg.gpus and cfg.gpus_per_worker:
        raise ConfigError("give either --gpus or --gpus-per-worker, not both")
    if cfg.dataset in ("imagefolder", "recordio") and not cfg.data_dir:
        raise ConfigError(f"--dataset {cfg.dataset} needs --data-dir: the folder holding "
                          f"{IMAGE_LAYOUTS[cfg.dataset]} (docs/data.md)")
    if cfg.data_dir and cfg.dataset not in ("cifar10", "imagefolder", "recordio"):
        raise ConfigError(f"--data-dir is read by --dataset cifar10, imagefolder and recordio "
                          f"only; --dataset {cfg.dataset} would ignore it: drop one of them")
    if cfg.image_size and cfg.dataset not in ("imagefolder", "recordio", "synthetic"):
        raise ConfigError(f"--image-size is for --dataset imagefolder, recordio and "
                          f"synthetic; --dataset {cfg.dataset} has images of a fixed size: "
                          f"drop it")
    if cfg.no_cuda and (cfg.gpus or cfg.gpus_per_worker):
        raise ConfigError("--no-cuda trains on the CPU: drop --gpus and --gpus-per-worker, or "
                          "--no-cuda")
    if any(g < 0 for g in cfg.gpus):
        raise ConfigError(f"--gpus must be GPU ids >= 0, got {list(cfg.gpus)}")
    check_start_weights(cfg)
    check_command_compression(cfg)
    check_command_recipe(cfg)
    if cfg.eval_only:
        check_eval_only(cfg)


def check_command_recipe(cfg: TrainConfig) -> None:
    """What the command's parts of the training recipe (mixing, --last-gamma) need of the
    others (docs/training.md, "The training recipe")."""
    if cfg.mix_off_epoch is not None and not (cfg.mixup or cfg.cutmix):
        raise ConfigError("--mix-off-epoch ends --mixup and --cutmix: give one of them, or "
                          "drop it")
    if cfg.last_gamma and (cfg.pretrained or cfg.init_from):
        # GluonCV zeroes them at initialisation only: trained gammas are the weights' own.
        raise ConfigError("--last-gamma zeroes freshly initialised BatchNorm gammas; "
                          f"{'--pretrained' if cfg.pretrained else '--init-from'} brings "
                          "trained ones: drop one of them")


def check_recipe(cfg: RunConfig) -> None:
    """What the training recipe's options for any model (--no-wd, --ema, clipping) need of
    the others (docs/training.md, "The training recipe")."""
    ema_every = next(spec for spec in dataclasses.fields(RunConfig) if spec.name == "ema_every")
    if cfg.ema_every != default_of(ema_every) and cfg.ema is None:
        raise ConfigError("--ema-every is how often --ema updates its average: add --ema, "
                          "or drop it")
    if cfg.kvstore != "dist_async":
        return
    # Under dist_async the servers apply each worker's gradient as it arrives.
    if cfg.clip_grad_norm is not None:
        raise ConfigError("--clip-grad-norm clips the gradient averaged over all workers, "
                          "which --kvstore dist_async never forms (the servers apply each "
                          "worker's gradient on its own): drop one of them")
    if cfg.ema is not None:
        raise ConfigError("--ema averages the weights every worker holds alike; under "
                          "--kvstore dist_async each worker holds its own: drop one of them")
    if cfg.no_wd:
        raise ConfigError("--no-wd sets each parameter's weight decay on the workers; under "
                          "--kvstore dist_async the servers' optimizer applies it without "
                          "them: drop one of them")


def check_elastic(cfg: RunConfig) -> None:
    """What ``--elastic`` needs of the other options (docs/elastic.md)."""
    if cfg.kvstore != "horovod":
        raise ConfigError(f"--elastic runs under Horovod's elastic driver: it needs --kvstore "
                          f"horovod, not {cfg.kvstore}")
    if cfg.sampling != "strided":
        # A contiguous part skips processed // num_parts of its own block: right only with
        # the worker count the epoch started with.
        raise ConfigError("--elastic re-splits an epoch's remaining samples over the workers "
                          "left: it needs --sampling strided")
    if cfg.output_dir and not cfg.resume:
        raise ConfigError("--elastic with --output-dir needs --resume auto: a worker that "
                          "joins later, or a relaunch, must continue from the checkpoints "
                          "the job wrote, not refuse them")


def check_shard_optimizer(cfg: RunConfig) -> None:
    """What ``--shard-optimizer`` cannot be combined with yet, each refused in one line: the
    sharded update takes exactly the flat bucket slices it reduce-scatters, one device per
    rank, and its state lives on the ranks in slices (docs/performance.md)."""
    refused = (
        (cfg.kvstore != "horovod", f"--kvstore {cfg.kvstore}: it reduce-scatters through "
                                   "Horovod; use --kvstore horovod"),
        (not cfg.grad_bucket_mb, "--grad-bucket-mb 0: it slices the gradient buckets; give "
                                 "--grad-bucket-mb above 0"),
        (cfg.compression != "none", f"--compression {cfg.compression}: it exchanges whole "
                                    "slices; drop one of them"),
    )
    for refuse, why in refused:
        if refuse:
            raise ConfigError(f"--shard-optimizer cannot be combined with {why}")


def check_compression(cfg: RunConfig) -> None:
    """What ``--compression powersgd`` needs of the run's other options."""
    if cfg.compression != "powersgd":
        given = [flag for flag, value in (("--powersgd-rank", cfg.powersgd_rank),
                                          ("--powersgd-start-step", cfg.powersgd_start_step),
                                          ("--powersgd-no-error-feedback",
                                           cfg.powersgd_no_error_feedback or None))
                 if value is not None]
        if given:
            raise ConfigError(f"{given[0]} sets up --compression powersgd: add it, or drop "
                              f"{given[0]}")
        return
    if cfg.kvstore != "horovod":
        raise ConfigError(f"--compression powersgd sends its factors by Horovod allreduce "
                          f"inside hvdtrain's gradient buckets: it needs --kvstore horovod, "
                          f"not {cfg.kvstore}")
    if not cfg.grad_bucket_mb:
        raise ConfigError("--compression powersgd compresses inside the gradient buckets: "
                          "--grad-bucket-mb must be above 0")


def check_command_compression(cfg: TrainConfig) -> None:
    """What ``--compression powersgd`` needs of the command's model and devices."""
    if cfg.compression != "powersgd":
        return
    if cfg.dtype == "float16":
        raise ConfigError("--compression powersgd works on float32 gradients: drop --dtype "
                          "float16 (--amp keeps float32 gradients and works with it)")
    if len(cfg.gpus) > 1 or (cfg.gpus_per_worker or 1) > 1:
        raise ConfigError("--compression powersgd compresses one device's gradients per "
                          "worker: run one worker per GPU (horovodrun -np <GPUs>) instead of "
                          "--gpus/--gpus-per-worker")


def check_eval_only(cfg: TrainConfig) -> None:
    """What ``--eval-only`` needs: weights to evaluate, and no flag that only training reads."""
    if not (cfg.init_from or cfg.pretrained):
        raise ConfigError("--eval-only evaluates existing weights: add --init-from (a run's "
                          "output folder, a checkpoint, an export or a .params file) or "
                          "--pretrained")
    if cfg.resume or cfg.elastic:
        raise ConfigError(f"--eval-only trains nothing: drop --"
                          f"{'resume' if cfg.resume else 'elastic'}")
    if cfg.dataset == "synthetic":
        raise ConfigError("--eval-only on --dataset synthetic would score random images: "
                          "evaluate on digits, cifar10, imagefolder or recordio")


def check_start_weights(cfg: TrainConfig) -> None:
    """What ``--pretrained``, ``--init-from`` and the fine-tuning flags need of the others
    (docs/fine-tuning.md)."""
    if cfg.pretrained and cfg.init_from:
        raise ConfigError("give either --pretrained or --init-from, not both: a run starts "
                          "from one set of weights")
    if cfg.pretrained and cfg.model_name in SMALL_MODEL_NAMES:
        raise ConfigError(f"--pretrained: the model zoo has ImageNet weights for its own "
                          f"models only, not for {cfg.model_name}; start from a run of yours "
                          f"with --init-from, or pick a zoo --model")
    starts = "--pretrained" if cfg.pretrained else "--init-from" if cfg.init_from else None
    if starts and cfg.resume and cfg.resume != "auto":
        # --resume auto stays allowed: it continues this run after a restart (and --elastic
        # needs it), and starts from the weights while the folder holds no checkpoint.
        raise ConfigError(f"{starts} starts a new run from weights, --resume {cfg.resume} "
                          f"continues an earlier one with its optimizer state: give one of "
                          f"them")
    for name, value, plain in (("--freeze-epochs", cfg.freeze_epochs, 0),
                               ("--head-lr-mult", cfg.head_lr_mult, 1.0)):
        if value != plain and not starts:
            raise ConfigError(f"{name} fine-tunes the weights a run starts from: add "
                              f"--init-from or --pretrained")
