"""``hvdtrain --eval-only`` in one process: the figures of training's own evaluation of the
same weights, and its refusals (one line, exit 2)."""
import json
import os

import pytest

from helpers import main_in_process

DIGITS = ["--dataset", "digits", "--no-cuda", "--log-interval", "0"]


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    from hvdtrain.cli import main
    run = str(tmp_path_factory.mktemp("eval") / "run")
    assert main(DIGITS + ["--epochs", "2", "--output-dir", run]) == 0
    return run


def test_eval_only_scores_what_training_scored(digits_run, tmp_path, capfd):
    with open(os.path.join(digits_run, "metrics.jsonl")) as src:
        end = [json.loads(line) for line in src][-1]
    out = str(tmp_path / "eval")
    code, lines = main_in_process(DIGITS + ["--eval-only", "--init-from", digits_run,
                                            "--output-dir", out], capfd)
    assert code == 0, lines
    summary = json.load(open(os.path.join(out, "eval.json")))
    assert summary["samples"] == 360 and summary["model"] == "simple_cnn"
    assert summary["top1"] == end["test_acc"] and summary["top5"] == end["test_top5"]
    assert any("evaluated" in line and "top-1" in line for line in lines), lines
    assert not any("training" in line.lower() and "worker" in line for line in lines)


@pytest.mark.parametrize("flags,message", [
    ([], "--eval-only evaluates existing weights: add --init-from"),
    (["--init-from", "RUN", "--resume", "auto", "--output-dir", "OUT"], "drop --resume"),
])
def test_eval_only_refuses_what_it_cannot_do(flags, message, digits_run, tmp_path, capfd):
    flags = [f.replace("RUN", digits_run).replace("OUT", str(tmp_path)) for f in flags]
    code, lines = main_in_process(DIGITS + ["--eval-only"] + flags, capfd)
    assert code == 2 and len(lines) == 1 and message in lines[0], lines


def test_eval_only_refuses_weights_of_other_classes(tmp_path, capfd):
    # CIFAR-shaped weights would need a new output layer for the digits: chance, refused.
    from hvdtrain.cli import main
    run = str(tmp_path / "run")
    assert main(DIGITS + ["--epochs", "1", "--model", "mlp", "--output-dir", run]) == 0
    card_path = os.path.join(run, "model.json")
    card = json.load(open(card_path))
    card["classes"] = [f"other{i}" for i in range(10)]
    json.dump(card, open(card_path, "w"))
    for checkpoint in os.listdir(os.path.join(run, "checkpoints")):
        os.rename(os.path.join(run, "checkpoints", checkpoint),
                  os.path.join(str(tmp_path), checkpoint))  # model.params alone is read
    code, lines = main_in_process(DIGITS + ["--eval-only", "--init-from", run], capfd)
    assert code == 2 and len(lines) == 1 and "output layer would be new" in lines[0], lines
