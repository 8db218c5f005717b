"""The training recipe's bad input: one line, exit status 2, before anything is written."""
import pytest

from helpers import main_in_process

BASE = ["--dataset", "digits", "--no-cuda", "--kvstore", "none", "--epochs", "1"]
ASYNC = ["--kvstore", "dist_async"]


@pytest.mark.parametrize("flags,needle", [
    (["--mixup", "-0.2"], "--mixup must be >= 0, got -0.2"),
    (["--cutmix", "-1"], "--cutmix must be >= 0, got -1.0"),
    (["--ema", "0"], "--ema must be in (0, 1), got 0.0"),
    (["--ema", "1"], "--ema must be in (0, 1), got 1.0"),
    (["--ema", "1.5"], "--ema must be in (0, 1), got 1.5"),
    (["--ema", "-0.9"], "--ema must be in (0, 1), got -0.9"),
    (["--ema", "nan"], "--ema must be a finite number"),
    (["--clip-grad-norm", "0"], "--clip-grad-norm must be positive"),
    (ASYNC + ["--clip-grad-norm", "1"], "--clip-grad-norm clips the gradient averaged over "
                                         "all workers, which --kvstore dist_async never forms"),
    (ASYNC + ["--ema", "0.99"], "under --kvstore dist_async each worker holds its own"),
    (ASYNC + ["--no-wd"], "--no-wd sets each parameter's weight decay on the workers"),
    (["--mix-off-epoch", "2"], "--mix-off-epoch ends --mixup and --cutmix"),
    (["--mixup", "0.2", "--mix-off-epoch", "0"], "--mix-off-epoch must be positive"),
    (["--ema-every", "4"], "--ema-every is how often --ema updates its average"),
    (["--model", "simple_cnn", "--last-gamma"],
     "--model simple_cnn has no model-zoo ResNet blocks"),
    (["--model", "mobilenet0.25", "--last-gamma"],
     "--model mobilenet0.25 has no model-zoo ResNet blocks"),
    (["--model", "resnet18_v1", "--last-gamma", "--init-from", "model.params"],
     "--last-gamma zeroes freshly initialised BatchNorm gammas; --init-from brings trained"),
], ids=["mixup", "cutmix", "ema-0", "ema-1", "ema-above", "ema-negative", "ema-nan", "clip-0",
        "clip-async", "ema-async", "no-wd-async", "off-epoch-alone", "off-epoch-0",
        "ema-every-alone", "last-gamma-cnn", "last-gamma-mobilenet", "last-gamma-init-from"])
def test_bad_recipe_input_is_one_line_and_exit_2(flags, needle, capfd, tmp_path):
    out = tmp_path / "run"
    code, lines = main_in_process(BASE + flags + ["--output-dir", str(out)], capfd)
    assert code == 2, lines
    assert len(lines) == 1, lines
    assert lines[0].startswith("hvdtrain: error: ") and needle in lines[0], lines
    assert not out.exists() or not any(out.iterdir())  # nothing written
