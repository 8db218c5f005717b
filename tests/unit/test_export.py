"""``hvdtrain-export``: the export read by independent runtimes (MXNet's SymbolBlock and
onnxruntime) gives the logits of the Gluon net it came from, and what it refuses.

Most cases run ``export.main`` in this process (``main_in_process``); one real process
checks that a refusal prints exactly one line.
"""
import json
import os
import shutil
import sys

import mxnet as mx
import numpy as np
import pytest

from helpers import assert_arrays_close, folder_digest, main_in_process, run_command
from model_runs import make_run, validation_batch
from hvdtrain.data.streamed import load_images
from hvdtrain.models import build_model
from hvdtrain.serve import onnx_file
from hvdtrain.serve.export import main as export_main

pytestmark = pytest.mark.filterwarnings("ignore:Cannot decide type:UserWarning")
SIZE = 64  # every model below exports at 64 pixels, and evaluates a batch in seconds


def export(capfd, *argv):
    return main_in_process(list(map(str, argv)), capfd, main=export_main)


def assert_refused(result, *needles):
    code, lines = result
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("hvdtrain-export: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]


def onnxruntime_logits(path, batch):
    import onnxruntime
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: batch})[0]


# resnet50_v1 takes about 10 s here (export, ONNX, both runtimes): not `slow` (minutes).
@pytest.mark.parametrize("name", ["resnet18_v1", "mobilenetv2_1.0", "resnet50_v1"])
def test_symbolblock_and_onnxruntime_give_the_gluon_nets_logits(name, digit_images, tmp_path,
                                                                capfd):
    """On real validation images, as training's evaluation prepares them: the pair read by
    ``SymbolBlock.imports`` within 1e-5, the ONNX file in onnxruntime within 1e-4 (per unit
    of magnitude above 1), of a plain Gluon net holding the run's parameters, in inference
    mode; a batch of 12 crosses the ONNX file's dynamic batch axis."""
    data = load_images("imagefolder", digit_images[0], SIZE)
    run, out = tmp_path / "run", tmp_path / "export"
    make_run(str(run), name, data)
    code, lines = export(capfd, run, out)
    assert code == 0 and len(lines) == 1 and lines[0].startswith(f"exported {run} to {out}")
    assert sorted(os.listdir(out)) == ["model-0000.params", "model-symbol.json", "model.json",
                                       "model.onnx"]

    reference = build_model(name, data.num_classes)  # hvdtrain's net, loaded by Gluon itself
    reference.load_parameters(str(run / "model.params"), ctx=mx.cpu())
    batch = validation_batch(data, 12)
    expected = reference(mx.nd.array(batch)).asnumpy()

    pair = mx.gluon.SymbolBlock.imports(str(out / "model-symbol.json"), ["data"],
                                        str(out / "model-0000.params"), ctx=mx.cpu())
    from_pair = pair(mx.nd.array(batch)).asnumpy()
    from_onnx = onnxruntime_logits(str(out / "model.onnx"), batch)
    print(f"\n{name} at {SIZE} px: logits up to {np.abs(expected).max():.3g}; max |diff| "
          f"SymbolBlock {np.abs(from_pair - expected).max():.3g}, onnxruntime "
          f"{np.abs(from_onnx - expected).max():.3g}")
    assert_arrays_close(from_pair, expected, 1e-5, f"{name} SymbolBlock")
    assert_arrays_close(from_onnx, expected, 1e-4, f"{name} onnxruntime")
    assert len(set(expected.argmax(axis=1))) > 1 or np.ptp(expected) > 0.1  # not a constant

    with open(out / "model.json") as src:
        card = json.load(src)
    with open(run / "model.json") as src:
        assert dict(card, export=None) == dict(json.load(src), export=None)
    assert card["export"]["files"] == ["model-symbol.json", "model-0000.params", "model.onnx",
                                       "model.json"]
    # BatchNorm's running statistics are what the runtimes used: batch statistics (training
    # mode; last, as it moves the running ones) give other logits.
    with mx.autograd.train_mode():
        training = reference(mx.nd.array(batch)).asnumpy()
    assert np.abs(training - expected).max() > 0.1


@pytest.fixture(scope="module")
def small_run(digit_images, tmp_path_factory):
    """A run folder of pool_cnn (BatchNorm, 10 classes) at 32 pixels, and its dataset."""
    data = load_images("imagefolder", digit_images[0], 32)
    run = tmp_path_factory.mktemp("small") / "run"
    make_run(str(run), "pool_cnn", data)
    return run, data


@pytest.fixture
def run_copy(small_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(small_run[0], copy)
    return copy


def _replace_params(run, data, model, classes=None):
    """Put another net's parameters into `run` under its unchanged card."""
    other = run.parent / "other"
    make_run(str(other), model, data, classes=classes)
    shutil.copy(other / "model.params", run / "model.params")


def test_weights_of_another_architecture_are_refused(run_copy, small_run, tmp_path, capfd):
    _replace_params(run_copy, small_run[1], "bn_cnn")
    assert_refused(export(capfd, run_copy, tmp_path / "out"),
                   "model.params does not hold the parameters of pool_cnn with 10 classes",
                   "another model")
    assert not (tmp_path / "out").exists()


def test_weights_for_another_class_count_name_the_shape_that_differs(run_copy, small_run,
                                                                     tmp_path, capfd):
    _replace_params(run_copy, small_run[1], "pool_cnn", classes=7)
    assert_refused(export(capfd, run_copy, tmp_path / "out"),
                   "is 7x128 in the file, 10x128 in the model", "2 shapes differ")


def test_a_truncated_params_file_is_refused(run_copy, tmp_path, capfd):
    params = run_copy / "model.params"
    params.write_bytes(params.read_bytes()[:params.stat().st_size // 2])
    assert_refused(export(capfd, run_copy, tmp_path / "out"),
                   "is truncated or not an MXNet parameter file")


def test_a_run_that_never_finished_names_its_newest_checkpoint(two_epochs, tmp_path, capfd):
    run = tmp_path / "run"
    shutil.copytree(two_epochs, run)
    os.remove(run / "model.params")
    assert_refused(export(capfd, run, tmp_path / "out"), "the run never finished",
                   str(run / "checkpoints" / "epoch-0002"))
    shutil.rmtree(run / "checkpoints")
    assert_refused(export(capfd, run, tmp_path / "out"), "holds no checkpoint")
    assert_refused(export(capfd, tmp_path / "nowhere", tmp_path / "out"), "does not exist")


def test_a_checkpoint_exports_with_its_card_and_one_without_is_refused(two_epochs, tmp_path,
                                                                      capfd):
    checkpoint = two_epochs / "checkpoints" / "epoch-0001"
    code, lines = export(capfd, checkpoint, tmp_path / "out")
    assert code == 0, lines
    with open(checkpoint / "meta.json") as src:
        meta = json.load(src)
    with open(tmp_path / "out" / "model.json") as src:
        card = json.load(src)
    assert card["export"]["from"] == f"checkpoint {checkpoint}"
    assert dict(card, export=None) == dict(meta["card"], export=None)
    # The pair holds the checkpoint's parameters.
    reference = build_model("simple_cnn", 10)
    reference.load_parameters(str(checkpoint / "model.params"))
    pair = mx.gluon.SymbolBlock.imports(str(tmp_path / "out" / "model-symbol.json"), ["data"],
                                        str(tmp_path / "out" / "model-0000.params"))
    x = mx.nd.array(np.random.default_rng(0).uniform(0, 1, (4, 1, 8, 8)))
    assert_arrays_close(pair(x).asnumpy(), reference(x).asnumpy(), 1e-5, "checkpoint")

    old = tmp_path / "old"
    shutil.copytree(checkpoint, old / "checkpoints" / "epoch-0001")
    del meta["card"]
    with open(old / "checkpoints" / "epoch-0001" / "meta.json", "w") as out:
        json.dump(meta, out)
    assert_refused(export(capfd, old / "checkpoints" / "epoch-0001", tmp_path / "out2"),
                   "has no model card")


def test_an_output_folder_with_files_needs_force_which_replaces_the_export(run_copy, tmp_path,
                                                                          capfd):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    before = folder_digest(str(out))
    assert_refused(export(capfd, run_copy, out), "already holds files (notes.txt)", "--force")
    assert folder_digest(str(out)) == before
    code, lines = export(capfd, run_copy, out, "--force")
    assert code == 0, lines
    assert (out / "model.onnx").exists() and (out / "notes.txt").read_text() == "mine"
    # A later export without ONNX does not leave the earlier ONNX file beside it.
    code, lines = export(capfd, run_copy, out, "--force", "--no-onnx")
    assert code == 0 and not (out / "model.onnx").exists(), lines
    assert_refused(export(capfd, run_copy, run_copy, "--force"), "is the folder being exported")


def test_an_output_that_cannot_be_a_folder_is_refused(run_copy, tmp_path, capfd):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert_refused(export(capfd, run_copy, blocker), "is a file, not a folder")
    assert_refused(export(capfd, run_copy, blocker / "out"), "is not writable")


def test_without_onnx_the_pair_is_the_export_with_one_warning(run_copy, tmp_path, capfd,
                                                             monkeypatch):
    def missing():
        raise onnx_file.OnnxUnavailable("No module named 'onnx'")
    monkeypatch.setattr(onnx_file, "onnx_module", missing)
    code, lines = export(capfd, run_copy, tmp_path / "out")
    assert code == 0 and len(lines) == 2, lines
    assert "hvdtrain-export: warning: no model.onnx: No module named 'onnx'" in lines
    assert sorted(os.listdir(tmp_path / "out")) == ["model-0000.params", "model-symbol.json",
                                                    "model.json"]


def test_a_failed_onnx_conversion_keeps_the_pair_and_fails(run_copy, tmp_path, capfd,
                                                          monkeypatch):
    def broken(*args, **kwargs):
        raise NotImplementedError("No conversion function registered for op type Foo yet.")
    monkeypatch.setattr(mx.onnx, "export_model", broken)
    code, lines = export(capfd, run_copy, tmp_path / "out")
    assert code == 1 and len(lines) == 1, lines
    assert "the ONNX conversion failed (NotImplementedError: No conversion function" in lines[0]
    assert sorted(os.listdir(tmp_path / "out")) == ["model-0000.params", "model-symbol.json",
                                                    "model.json"]


def test_a_refusal_is_the_whole_processs_one_line(two_epochs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(two_epochs, run)
    os.remove(run / "model.params")
    proc = run_command([sys.executable, "-m", "hvdtrain.serve.export", str(run),
                        str(tmp_path / "out")], timeout=120)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout
    assert "never finished" in lines[0]


def test_ema_exports_the_runs_average_and_a_run_without_one_is_refused(two_epochs, tmp_path,
                                                                       capfd):
    """``--ema``: the pair holds the run's ``model-ema.params`` (a checkpoint's
    ``ema.params``), as a plain Gluon net loading that file computes it; not the model's own
    parameters. A run trained without ``--ema`` is refused in one line."""
    from conftest import QUICK
    from helpers import tool
    run = tmp_path / "ema-run"
    proc = run_command([tool("hvdtrain"), *QUICK, "--model", "bn_cnn", "--epochs", "2",
                        "--ema", "0.9", "--output-dir", str(run)], timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:]
    card = json.load(open(run / "model.json"))
    batch = np.random.RandomState(0).normal(size=(4,) + tuple(card["input"]["shape"]))
    checkpoint = run / "checkpoints" / "epoch-0002"
    for source, average in ((run, run / "model-ema.params"), (checkpoint,
                                                              checkpoint / "ema.params")):
        out = tmp_path / f"export-{source.name}"
        code, lines = export(capfd, source, out, "--ema", "--no-onnx")
        assert code == 0, lines
        pair = mx.gluon.SymbolBlock.imports(str(out / "model-symbol.json"), ["data"],
                                            str(out / "model-0000.params"), ctx=mx.cpu())
        from_pair = pair(mx.nd.array(batch)).asnumpy()
        logits = {}
        for name, path in (("ema", average), ("own", run / "model.params")):
            reference = build_model("bn_cnn", len(card["classes"]))
            reference.load_parameters(str(path), ctx=mx.cpu())
            logits[name] = reference(mx.nd.array(batch)).asnumpy()
        assert_arrays_close(from_pair, logits["ema"], 1e-5, f"{source.name} --ema")
        assert np.abs(logits["own"] - logits["ema"]).max() > 1e-3  # another model
        assert "its --ema average" in json.load(open(out / "model.json"))["export"]["from"]
    assert_refused(export(capfd, two_epochs, tmp_path / "none", "--ema", "--no-onnx"),
                   "holds no model-ema.params: it was trained without --ema")
