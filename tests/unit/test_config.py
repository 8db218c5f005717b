import re
import pytest

from hvdtrain.cli import parse_config
from hvdtrain.config import ConfigError, TrainConfig


def test_defaults_are_valid_and_documented():
    cfg = TrainConfig(dataset="digits")
    assert (cfg.batch_size, cfg.epochs, cfg.lr, cfg.kvstore) == (64, 5, 0.01, "horovod")
    assert cfg.model_name == "simple_cnn"
    assert TrainConfig(dataset="synthetic").model_name == "resnet18_v1"


def test_parse_config_reads_flags():
    cfg = parse_config(["--dataset", "digits", "--batch-size", "8", "--lr-decay-epochs", "2,4",
                        "--max-steps", "3", "--no-cuda", "--model", "mlp"])
    assert cfg.batch_size == 8 and cfg.lr_decay_epochs == (2, 4) and cfg.max_steps == 3
    assert cfg.no_cuda and cfg.model_name == "mlp"


@pytest.mark.parametrize("changes,needle", [
    (dict(batch_size=0), "--batch-size must be positive"),
    (dict(epochs=-1), "--epochs must be positive"),
    (dict(lr=0.0), "--lr must be positive"),
    (dict(max_steps=0), "--max-steps"),
    (dict(data_workers=-1), "--data-workers must be >= 0"),
    (dict(grad_bucket_mb=-1.0), "--grad-bucket-mb must be >= 0"),
    (dict(kvstore="nccl"), "--kvstore must be one of"),
    (dict(dataset="mnist"), "--dataset must be one of"),
    (dict(dataset="cifar10"), "needs --data-dir"),
    (dict(lr_decay_epochs=(4, 2)), "increasing"),
    (dict(amp=True, no_cuda=True), "need a GPU"),
    (dict(dtype="float16", no_cuda=True), "need a GPU"),
    (dict(amp=True, dtype="float16"), "drop --dtype float16"),
    (dict(dtype="bfloat16"), "--dtype must be one of"),
    (dict(resume="auto"), "--resume auto looks for checkpoints in --output-dir"),
    (dict(kvstore="dist_async", warmup_epochs=1), "dist_async"),
    (dict(gpus=(0,), gpus_per_worker=2), "either --gpus or --gpus-per-worker"),
])
def test_invalid_configs_name_the_flag(changes, needle):
    base = dict(dataset="digits")
    base.update(changes)
    with pytest.raises(ConfigError, match=needle):
        TrainConfig(**base)


def test_replace_validates():
    with pytest.raises(ConfigError):
        TrainConfig(dataset="digits").replace(batch_size=-3)


def test_half_precision_refused_on_cpu_devices():
    import mxnet as mx

    from hvdtrain.loop.engine.precision import Precision
    Precision.of(TrainConfig(dataset="digits")).check_devices([mx.cpu()])
    with pytest.raises(ConfigError, match="need a GPU"):
        Precision.of(TrainConfig(dataset="digits", amp=True)).check_devices([mx.cpu()])
    Precision.of(TrainConfig(dataset="digits", amp=True)).check_devices([mx.gpu(0)])


def test_one_precision_policy_answers_every_builder():
    """--dtype float16: float32 master weights in the optimizer, batches fed as float16;
    float32: nothing added, the model left as built."""
    import mxnet as mx
    import numpy as np

    from hvdtrain.loop.engine.precision import Precision
    half = Precision.of(TrainConfig(dataset="digits", dtype="float16"))
    assert half.half and half.optimizer_options() == {"multi_precision": True}
    assert half.input_dtype == "float16"
    full = Precision.of(TrainConfig(dataset="digits"))
    assert not full.half and full.optimizer_options() == {} and full.input_dtype == "float32"
    net = mx.gluon.nn.Dense(2, in_units=3)
    net.initialize()
    full.prepare_model(net)
    assert net.weight.data().dtype == np.float32
    half.prepare_model(net)
    assert net.weight.data().dtype == np.float16


@pytest.mark.parametrize("flags,expected", [([], None), (["--progress"], True),
                                            (["--no-progress"], False)])
def test_progress_is_an_on_off_flag_with_an_automatic_default(flags, expected):
    assert parse_config(["--dataset", "digits"] + flags).progress is expected


def test_timeline_needs_the_horovod_store():
    assert parse_config(["--dataset", "digits", "--horovod-timeline", "t.json"]).horovod_timeline == "t.json"
    with pytest.raises(ConfigError, match="--horovod-timeline .* needs --kvstore horovod"):
        parse_config(["--dataset", "digits", "--horovod-timeline", "t.json", "--kvstore", "local"])


def test_every_flag_reaches_hvdtrain_through_horovodrun():
    """horovodrun parses its own options with argparse, which matches abbreviations even
    after the training command: an hvdtrain flag that is a prefix of one of horovodrun's
    (`--timeline` of `--timeline-filename`) would stop the launch with "ambiguous option"."""
    import sys

    from horovod.runner.launch import parse_args

    from hvdtrain.cli import build_parser
    for action in build_parser()._actions:  # pylint: disable=protected-access
        for flag in action.option_strings:
            tail = [flag] if action.nargs == 0 else [flag, "1"]
            saved = sys.argv
            sys.argv = ["horovodrun", "-np", "2", "-H", "localhost:2", "hvdtrain"] + tail
            try:
                args = parse_args()
            except SystemExit:
                pytest.fail(f"horovodrun takes {flag} for one of its own options")
            finally:
                sys.argv = saved
            assert args.command == ["hvdtrain"] + tail


# Every numeric flag at and past its edges, as the command line gives them (argparse's
# float() takes inf, nan and 1e999). Each must be refused with the flag named.
EDGE_VALUES = [
    ("--lr", ["inf", "nan", "-inf", "1e999", "0", "-0.1"]),
    ("--wd", ["inf", "nan", "-1e-4"]),
    ("--momentum", ["5", "1", "1.0000001", "-0.1", "nan", "inf"]),
    ("--lr-decay-factor", ["inf", "nan", "0", "-0.5", "1.5"]),
    ("--warmup-epochs", ["inf", "nan", "-1"]),
    ("--grad-bucket-mb", ["inf", "nan", "-1"]),
    ("--stall-timeout", ["inf", "nan", "-1"]),
    ("--batch-size", ["0", "-4"]),
    ("--epochs", ["0", "-1"]),
    ("--max-steps", ["0", "-3"]),
    ("--gpus-per-worker", ["0", "-1"]),
    ("--keep-checkpoints", ["0", "-1"]),
    ("--finite-check-every", ["0", "-1"]),
    ("--log-interval", ["-1"]),
    ("--data-workers", ["-1"]),
    ("--seed", ["-1", str(2 ** 31), str(10 ** 30)]),
]
# --checkpoint-every takes epochs, steps or a time: tests/unit/test_stop_signals.py.


@pytest.mark.parametrize("flag,value", [(f, v) for f, values in EDGE_VALUES for v in values])
def test_numeric_flags_refuse_values_that_cannot_train(flag, value):
    with pytest.raises(ConfigError, match=f"^{flag} must be "):
        parse_config(["--dataset", "digits", f"{flag}={value}"])


@pytest.mark.parametrize("flag,value", [
    ("--momentum", "0"), ("--momentum", "0.999"), ("--lr-decay-factor", "1"),
    ("--wd", "0"), ("--warmup-epochs", "0"), ("--grad-bucket-mb", "0"),
    ("--stall-timeout", "0"), ("--seed", "0"), ("--log-interval", "0"),
    ("--data-workers", "0"), ("--lr", "1e-9")])
def test_numeric_flags_accept_their_edges(flag, value):
    parse_config(["--dataset", "digits", flag, value])


@pytest.mark.parametrize("gpus", [["--gpus", "0"], ["--gpus-per-worker", "2"]])
def test_no_cuda_with_gpus_is_refused(gpus):
    """Both ask for opposite things: training silently on the CPU would waste a GPU job."""
    with pytest.raises(ConfigError, match="--no-cuda trains on the CPU"):
        parse_config(["--dataset", "digits", "--no-cuda"] + gpus)


def test_data_dir_without_cifar10_is_refused():
    """A folder the run would silently ignore is most likely a mistyped --dataset."""
    with pytest.raises(ConfigError, match="--data-dir is read by --dataset cifar10, "
                                          "imagefolder and recordio only"):
        parse_config(["--dataset", "digits", "--data-dir", "/data/cifar"])


@pytest.mark.parametrize("flags,needle", [
    (["--dataset", "recordio"], "--dataset recordio needs --data-dir"),
    (["--dataset", "digits", "--image-size", "64"], "--image-size is for --dataset imagefolder"),
    (["--lr-schedule", "cosine", "--lr-decay-epochs", "3"], "--lr-decay-epochs are the steps"),
    (["--label-smoothing", "1"], "--label-smoothing must be in [0, 1)"),
])
def test_image_and_schedule_options_are_checked(flags, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        parse_config(["--dataset", "digits"] + flags if "--dataset" not in flags else flags)


def test_model_help_lists_every_model_that_builds():
    """--help names each model build_model accepts (pool_cnn was missing once); the names a
    model builds under are found by building, not read from the help's own list."""
    from hvdtrain.cli import build_parser
    from hvdtrain.models import build_model, model_names
    text = " ".join(build_parser().format_help().split())
    for name in ("simple_cnn", "bn_cnn", "pool_cnn", "mlp", "resnet50_v1"):
        build_model(name, 10)
        assert name in text
    assert all(name in text for name in model_names())


def test_every_optimizer_offered_is_one_mxnet_builds():
    """--optimizer offers only names MXNet 1.9.1 registers: 'adamw' was offered and ended a
    run in a traceback ("Cannot find optimizer adamw")."""
    import dataclasses
    import mxnet as mx
    [spec] = [f for f in dataclasses.fields(TrainConfig) if f.name == "optimizer"]
    choices = spec.metadata["choices"]
    assert "adam" in choices
    for name in choices:
        mx.optimizer.create(name, learning_rate=0.1)
