"""``--init-from`` and ``--pretrained``: each form of weights loads, the output layer is
replaced when the classes differ (one line says what was loaded, what is new and what was
left out), and every bad input is one line and exit 2.

Through ``hvdtrain``'s ``cli.main`` in this process, with ``fit`` replaced by a stub that
keeps the arrays the net holds when training would start (after the first broadcast).
"""
import os
import shutil

import mxnet as mx
import numpy as np
import pytest

from hvdtrain.models import build_model
from weights_cases import (DIGITS, FIVE, HEAD, arrays_of, assert_from, file_arrays, made,
                           weights_lines)

# -- the forms -------------------------------------------------------------------------------

def test_a_run_folder_starts_from_its_newest_checkpoint(start, two_epochs):
    code, lines, arrays = start(DIGITS + ["--init-from", str(two_epochs)])
    assert code == 0, lines
    newest = file_arrays(two_epochs / "checkpoints" / "epoch-0002" / "model.params")
    assert_from(arrays, newest)
    older = file_arrays(two_epochs / "checkpoints" / "epoch-0001" / "model.params")
    assert not np.array_equal(arrays["0.weight"], older["0.weight"])
    assert weights_lines(lines) == [
        f"--init-from {two_epochs}: loaded 8 of the model's 8 arrays from "
        f"{two_epochs}/checkpoints/epoch-0002/model.params (all of them, the output layer "
        f"included)"], lines


@pytest.mark.parametrize("form", ["checkpoint folder", "checkpoints folder", "params file",
                                  "run folder without checkpoints"])
def test_each_form_of_an_earlier_run_loads(start, run_copy, form):
    first = run_copy / "checkpoints" / "epoch-0001"
    path = {"checkpoint folder": first, "checkpoints folder": run_copy / "checkpoints",
            "params file": run_copy / "model.params",
            "run folder without checkpoints": run_copy}[form]
    if form == "run folder without checkpoints":
        shutil.rmtree(run_copy / "checkpoints")
    expected = file_arrays(first / "model.params" if form == "checkpoint folder"
                            else run_copy / "model.params")
    code, lines, arrays = start(DIGITS + ["--init-from", str(path)])
    assert code == 0, lines
    assert_from(arrays, expected)


@pytest.mark.parametrize("form", ["export folder", "export params file"])
def test_an_exported_model_loads(start, tmp_path, form, five):
    """HybridBlock.export's pair: keys ``arg:``/``aux:`` and parameter names; here of a
    10-class pool_cnn, loaded into a 5-class one (the output layer replaced)."""
    source = made("pool_cnn", 10, (3, 16, 16))
    source.hybridize()
    source(mx.nd.zeros((1, 3, 16, 16)))
    (tmp_path / "out").mkdir()
    source.export(str(tmp_path / "out" / "model"))
    exported = tmp_path / "out" / "model-0000.params"
    assert any(key.startswith("aux:") for key in mx.nd.load(str(exported)))
    path = tmp_path / "out" if form == "export folder" else exported
    code, lines, arrays = start(FIVE + ["--data-dir", five[0], "--init-from", str(path)])
    assert code == 0, lines
    expected = arrays_of(source)
    assert_from(arrays, expected, [p for p in expected if p not in HEAD])
    assert arrays["13.weight"].shape == (5, 128)
    [line] = weights_lines(lines)
    assert "left out of the file: arg:dense0_weight (10, 128), arg:dense0_bias (10,)" in line


def test_older_gluon_names_without_the_models_prefix_load(tmp_path):
    """ParameterDict.save(strip_prefix=...): the form of Gluon's first model-zoo files."""
    from hvdtrain.loop.weights.start import load_start_weights
    from hvdtrain.loop.weights.files import read
    source = made("mobilenet0.25", 4, (3, 16, 16))
    path = str(tmp_path / "legacy.params")
    source.collect_params().save(path, strip_prefix=source.prefix)
    assert "conv0_weight" in mx.nd.load(path)
    net = build_model("mobilenet0.25", 4)
    net.initialize()
    net(mx.nd.zeros((1, 3, 16, 16)))
    found = load_start_weights(net, read(path, "--init-from legacy"), 4)
    assert found.new == []
    assert_from(arrays_of(net), arrays_of(source))


# -- the output layer ------------------------------------------------------------------------

def test_other_classes_get_a_fresh_output_layer_and_one_line_says_so(start, tmp_path, five):
    source = made("pool_cnn", 10, (3, 16, 16))
    source.save_parameters(str(tmp_path / "ten.params"))
    code, lines, arrays = start(FIVE + ["--data-dir", five[0], "--init-from",
                                        str(tmp_path / "ten.params")])
    assert code == 0, lines
    expected = arrays_of(source)
    assert_from(arrays, expected, [p for p in expected if p not in HEAD])
    assert weights_lines(lines) == [
        f"--init-from {tmp_path}/ten.params: loaded 15 of the model's 17 arrays from "
        f"{tmp_path}/ten.params (all but the output layer); new: 13.weight (5, 128), "
        f"13.bias (5,) (the output layer, initialised afresh: the data has 5 classes, the "
        f"file 10); left out of the file: 13.weight (10, 128), 13.bias (10,)"], lines
    # Initialised afresh by the rule every run initialises with (the seed): what the same
    # run without --init-from starts with.
    code, lines, fresh = start(FIVE + ["--data-dir", five[0]])
    assert code == 0, lines
    assert_from(arrays, fresh, HEAD)


@pytest.mark.parametrize("source", ["run folder", "hvdtrain-export folder"])
def test_the_same_classes_keep_the_output_layer_and_other_names_replace_it(start, tmp_path,
                                                                         five, source):
    """The model card of a run (its checkpoints' meta.json) or of an export (model.json)
    names the classes: the same number of other classes (digit5.. for digit0..) is a new
    output layer; the same classes keep it; a card of another model is refused."""
    from hvdtrain.serve.export import export
    low, high = five
    run = str(tmp_path / "low")
    code, lines, _ = start(FIVE + ["--data-dir", low, "--epochs", "1", "--output-dir", run],
                           train=True)
    assert code == 0, lines
    saved = file_arrays(os.path.join(run, "model.params"))
    path = run
    if source == "hvdtrain-export folder":
        path = str(tmp_path / "export")
        export(run, path, onnx=False)
    code, lines, same = start(FIVE + ["--data-dir", low, "--init-from", path])
    assert code == 0, lines
    assert_from(same, saved)
    assert "(all of them, the output layer included)" in weights_lines(lines)[0]
    code, lines, other = start(FIVE + ["--data-dir", high, "--init-from", path])
    assert code == 0, lines
    assert_from(other, saved, [p for p in saved if p not in HEAD])
    assert not np.array_equal(other["13.weight"], saved["13.weight"])
    assert ("the output layer, initialised afresh: the same number of classes, other ones: "
            "digit5, digit6, digit7 ... here, digit0, digit1, digit2 ... in the file"
            ) in weights_lines(lines)[0]
    code, lines, _ = start(FIVE + ["--data-dir", low, "--model", "bn_cnn", "--init-from", path])
    assert code == 2 and len(lines) == 1, lines
    assert "holds a pool_cnn" in lines[0] and "not --model bn_cnn: give --model pool_cnn" \
        in lines[0], lines


def test_resume_auto_continues_its_checkpoint_instead(start, tmp_path, two_epochs):
    """--init-from with --resume auto: the weights start the run; once the folder holds this
    run's checkpoints, a restart continues them (as --elastic needs)."""
    run = str(tmp_path / "run")
    code, lines, _ = start(DIGITS + ["--init-from", str(two_epochs), "--resume", "auto",
                                     "--epochs", "1", "--output-dir", run], train=True)
    assert code == 0, lines
    [line] = weights_lines(lines)
    assert "loaded 8 of the model's 8 arrays" in line
    code, lines, arrays = start(DIGITS + ["--init-from", str(two_epochs), "--resume", "auto",
                                          "--epochs", "2", "--output-dir", run])
    assert code == 0, lines
    assert f"--resume auto continues from {run}/checkpoints/epoch-0001: --init-from " \
           f"{two_epochs} is not read" in "\n".join(lines)
    assert_from(arrays, file_arrays(os.path.join(run, "checkpoints", "epoch-0001",
                                                  "model.params")))
