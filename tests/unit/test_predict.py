"""``hvdtrain-predict``: its probabilities against a reference that shares none of hvdtrain's
code (the export read by MXNet's SymbolBlock, images prepared from the model card with
Pillow and NumPy), the CSV it writes for folders, packs and bad images, and what it refuses.

Most cases run ``predict.main`` in this process; one real process checks that a refusal is
the whole output.
"""
import configparser
import csv
import io
import os
import shutil
import sys

import mxnet as mx
import numpy as np
import pytest
from PIL import Image

from helpers import REPO, run_command
from model_runs import make_run
from hvdtrain.data.streamed import load_images
from hvdtrain.serve.export import export
from hvdtrain.serve.predict import main as predict_main

pytestmark = pytest.mark.filterwarnings("ignore:Cannot decide type:UserWarning")

SIZE = 56  # the digit images' centre crops (35-105 px) then stay below 2 x SIZE: see _crop


@pytest.fixture(scope="module")
def exported(digit_images, tmp_path_factory):
    """pool_cnn (BatchNorm with running statistics) exported at 56 px; its last layer
    doubled, so that the best class gets 0.65-0.75 rather than a near-uniform 0.35, and a
    change of the input shows more in the probabilities without saturating them. Returns
    (export folder, its card)."""
    import json
    root = tmp_path_factory.mktemp("predict")
    data = load_images("imagefolder", digit_images[0], SIZE)
    make_run(str(root / "run"), "pool_cnn", data, output_scale=2.0)
    export(str(root / "run"), str(root / "export"))
    with open(root / "export" / "model.json") as src:
        return root / "export", json.load(src)


@pytest.fixture(scope="module")
def exact_images(digit_images, tmp_path_factory):
    """Digit images redrawn at sizes whose centre crop is exactly 56 px (shorter side 64:
    no resize at all), as PNG and JPEG, landscape and portrait, in nested folders."""
    root = tmp_path_factory.mktemp("exact")
    val = os.path.join(digit_images[0], "val")
    sources = sorted(os.path.join(val, c, f) for c in sorted(os.listdir(val))
                     for f in sorted(os.listdir(os.path.join(val, c))))[::12][:8]
    shapes = [(64, 64), (96, 64), (64, 90), (72, 64)]
    for number, source in enumerate(sources):
        folder = root / ("a" if number % 2 else os.path.join("b", "c"))
        folder.mkdir(parents=True, exist_ok=True)
        image = Image.open(source).convert("RGB").resize(shapes[number % 4], Image.BICUBIC)
        image.save(folder / f"{number}.{'png' if number % 3 == 0 else 'jpg'}", quality=92)
    return root


def predict(capfd, *argv):
    """(exit status, CSV rows of stdout, non-empty stderr lines) of predict.main(argv)."""
    capfd.readouterr()
    try:
        code = predict_main(list(map(str, argv)))
    except SystemExit as stop:
        code = stop.code
    captured = capfd.readouterr()
    rows = list(csv.reader(io.StringIO(captured.out)))
    return code, rows, [line for line in captured.err.splitlines() if line.strip()]


def _crop(path, card, channels="RGB", crop_fraction=None):
    """The card's rule written plainly: decode (Pillow), centred square of crop_fraction of
    the shorter side, resize to the input size if needed, (pixel / 255 - mean) / std."""
    import cv2
    rule, size = card["eval_transform"], card["input"]["shape"][1]
    pixels = np.asarray(Image.open(path).convert("RGB"))
    height, width = pixels.shape[:2]
    side = min(height, width) * (crop_fraction or rule["crop_fraction"])
    left, top = (width - side) / 2, (height - side) / 2  # the box's edges, to whole pixels
    crop = pixels[round(top):round(top + side), round(left):round(left + side)]
    if crop.shape[:2] != (size, size):
        # Bilinear, as the card says, in OpenCV's implementation (ImageRecordIter's too): a
        # float bilinear lands a grey level away in 7% of pixels, up to 6e-4 in probability.
        # A shrink by 2 or more would be area-averaged: these images stay below it.
        assert min(crop.shape[:2]) < 2 * size, path
        crop = cv2.resize(crop, (size, size), interpolation=cv2.INTER_LINEAR)
    if channels == "BGR":
        crop = crop[:, :, ::-1]
    x = (crop * rule["pixel_scale"] - np.array(rule["mean"])) / np.array(rule["std"])
    return x.transpose(2, 0, 1).astype(np.float32)


def reference_probabilities(folder, card, paths, **kwargs):
    """Softmax of the logits MXNet's SymbolBlock gives for `paths` prepared by :func:`_crop`."""
    net = mx.gluon.SymbolBlock.imports(str(folder / "model-symbol.json"), ["data"],
                                       str(folder / "model-0000.params"))
    batch = np.stack([_crop(path, card, **kwargs) for path in paths])
    logits = net(mx.nd.array(batch)).asnumpy().astype(np.float64)
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    return exp / exp.sum(axis=1, keepdims=True)


def _worst(rows, expected, classes, k):
    """Largest |CSV probability - expected| over each row's k classes; the CSV's classes
    must be the expected top k in order."""
    worst = 0.0
    for row, probs in zip(rows, expected):
        names, values = row[2:2 + 2 * k:2], np.array(row[3:3 + 2 * k:2], float)
        assert names == [classes[i] for i in np.argsort(-probs, kind="stable")[:k]], row
        worst = max(worst, np.abs(values - probs[[classes.index(n) for n in names]]).max())
    return worst


@pytest.mark.parametrize("runtime", ["mxnet", "onnx"])
def test_probabilities_equal_an_independent_reference(exported, exact_images, digit_images,
                                                      capfd, runtime):
    folder, card = exported
    val = os.path.join(digit_images[0], "val")
    code, rows, err = predict(capfd, folder, exact_images, val, "--top-k", "3",
                              "--batch-size", "7", *(["--onnx"] if runtime == "onnx" else []))
    assert code == 0 and not err, err
    assert rows[0] == ["path", "record", "class_1", "prob_1", "class_2", "prob_2", "class_3",
                       "prob_3", "error"]
    rows = rows[1:]
    paths = [row[0] for row in rows]
    exact = [p for p in paths if p.startswith(str(exact_images))]
    assert exact == sorted(exact) and len(exact) == 8  # recursively, sorted
    assert len(paths) == 8 + sum(len(files) for _, _, files in os.walk(val))
    assert all(row[1] == "" and row[-1] == "" for row in rows)
    expected = reference_probabilities(folder, card, paths)
    classes = card["classes"]
    print(f"\n{runtime}: max |predict - reference| = {_worst(rows, expected, classes, 3):.2g}")
    assert _worst(rows, expected, classes, 3) <= 1e-4
    print(f"best-class probabilities {expected.max(axis=1).min():.3f}-{expected.max():.3f}")
    assert expected.max() < 0.99  # not saturated: a difference would show
    # The comparison sees a wrong transform: the other channel order, or the whole image.
    for wrong in ({"channels": "BGR"}, {"crop_fraction": 1.0}):
        off = reference_probabilities(folder, card, exact, **wrong)
        print(f"{wrong}: off by {np.abs(off - expected[:len(exact)]).max():.2g}")
        assert np.abs(off - expected[:len(exact)]).max() > 1e-3, wrong


def test_a_pack_gives_its_folders_rows_with_record_keys(exported, digit_images, capfd):
    folder, _ = exported
    images, pack = digit_images
    code, from_folder, _ = predict(capfd, folder, os.path.join(images, "val"), "--threads", "1")
    assert code == 0
    code, from_pack, err = predict(capfd, folder, os.path.join(pack, "val.rec"), "--threads", "3")
    assert code == 0 and not err, err
    assert len(from_pack) == len(from_folder)
    for number, (mine, theirs) in enumerate(zip(from_pack[1:], from_folder[1:])):
        assert mine[0] == os.path.join(pack, "val.rec") and mine[1] == str(number)
        assert mine[2:] == theirs[2:]  # hvdtrain-pack keeps the folder's order


def test_a_corrupt_image_gets_its_error_line_and_the_run_goes_on(exported, digit_images,
                                                                 tmp_path, capfd):
    folder, _ = exported
    images = tmp_path / "images"
    shutil.copytree(os.path.join(digit_images[0], "val", "digit3"), images)
    victim = sorted(images.iterdir())[1]
    victim.write_bytes(victim.read_bytes()[:300])  # cut short: no end marker
    (images / "notes.jpg").write_text("not an image")
    code, rows, err = predict(capfd, folder, images, "--top-k", "2")
    assert code == 0
    assert err == [f"hvdtrain-predict: warning: 2 of {len(rows) - 1} images could not be read "
                   f"or decoded (the error column says why)"]
    bad = {row[0]: row for row in rows[1:] if row[-1]}
    assert set(bad) == {str(victim), str(images / "notes.jpg")}
    assert bad[str(victim)][2:-1] == [""] * 4
    assert "truncated JPEG" in bad[str(victim)][-1]
    assert "not an image format" in bad[str(images / "notes.jpg")][-1]
    good = [row for row in rows[1:] if not row[-1]]
    assert len(good) == len(rows) - 3 and all(row[2].startswith("digit") for row in good)


def test_nothing_readable_fails_with_one_line(exported, tmp_path, capfd):
    folder, _ = exported
    (tmp_path / "a.jpg").write_bytes(b"\xff\xd8 no jpeg")
    code, rows, err = predict(capfd, folder, tmp_path / "a.jpg")
    assert code == 1 and len(rows) == 2 and rows[1][-1]
    assert err == ["hvdtrain-predict: error: none of the 1 images could be read or decoded "
                   "(the error column says why)"]


def test_output_file_and_a_top_k_beyond_the_classes(exported, exact_images, tmp_path, capfd):
    folder, _ = exported
    out = tmp_path / "predictions.csv"
    code, rows, err = predict(capfd, folder, exact_images, "--top-k", "50", "--output", out)
    assert code == 0 and rows == [] and not err
    with open(out) as src:
        written = list(csv.reader(src))
    assert written[0][-3:] == ["class_10", "prob_10", "error"] and len(written) == 9
    total = sum(float(p) for p in written[1][3:22:2])
    assert abs(total - 1) < 1e-5  # every class, so the probabilities add up


@pytest.fixture(scope="module")
def digits_export(two_epochs, tmp_path_factory):
    out = tmp_path_factory.mktemp("digits") / "export"
    export(str(two_epochs), str(out), onnx=False)
    return out


@pytest.mark.parametrize("case,needle", [
    ("empty folder", "no image in"),
    ("missing path", "does not exist"),
    ("run folder", "is a training run (no model-symbol.json): export it first"),
    ("digits model", "takes 1x8x8 arrays, not images"),
    ("pack without index", "has no index"),
    ("onnx missing", "model.onnx does not exist: export without --no-onnx"),
    ("top-k 0", "--top-k: must be at least 1"),
])
def test_usage_errors_are_one_line_and_exit_2(exported, digits_export, two_epochs, digit_images,
                                              tmp_path, capfd, case, needle):
    folder, _ = exported
    images = tmp_path / "empty"
    images.mkdir()
    args = {"empty folder": [folder, images],
            "missing path": [folder, tmp_path / "nowhere"],
            "run folder": [two_epochs, images],
            "digits model": [digits_export, images],
            "pack without index": [folder, tmp_path / "pack.rec"],
            "onnx missing": [tmp_path / "no-onnx", images, "--onnx"],
            "top-k 0": [folder, images, "--top-k", "0"]}[case]
    if case == "pack without index":
        shutil.copy(os.path.join(digit_images[1], "val.rec"), tmp_path / "pack.rec")
    if case == "onnx missing":  # exported with --no-onnx
        shutil.copytree(folder, tmp_path / "no-onnx")
        os.remove(tmp_path / "no-onnx" / "model.onnx")
    out = tmp_path / "out.csv"
    code, rows, err = predict(capfd, *args, "--output", out)
    assert code == 2 and rows == [] and len(err) == 1, err
    assert err[0].startswith("hvdtrain-predict: error: ") and needle in err[0], err[0]
    assert not out.exists()  # refused before anything was written


def test_an_empty_folder_is_the_whole_processs_one_line(exported, tmp_path):
    folder, _ = exported
    proc = run_command([sys.executable, "-m", "hvdtrain.serve.predict", str(folder),
                        str(tmp_path)], timeout=120)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    from hvdtrain.data.images import IMAGE_EXTENSIONS
    assert proc.returncode == 2 and lines == [f"hvdtrain-predict: error: no image in "
                                              f"{tmp_path}: looked for "
                                              f"{'/'.join(IMAGE_EXTENSIONS)} files "
                                              f"(in sub-folders too) and .rec packs"]


def test_the_programs_are_console_scripts_and_their_onnx_pins_install():
    """setup.cfg installs both programs; the test extra (CI's) brings onnx and onnxruntime,
    at the versions constraints.txt pins and this environment runs."""
    from importlib import import_module
    from importlib.metadata import version
    setup = configparser.ConfigParser()
    setup.read(os.path.join(REPO, "setup.cfg"))
    scripts = dict(line.replace(" ", "").split("=") for line in
                   setup["options.entry_points"]["console_scripts"].splitlines() if line)
    for name, module in (("hvdtrain-export", "export"), ("hvdtrain-predict", "predict")):
        assert scripts[name] == f"hvdtrain.serve.{module}:run"
        assert callable(import_module(f"hvdtrain.serve.{module}").run)
    extras = setup["options.extras_require"]
    for extra in ("test", "onnx"):
        assert {"onnx", "onnxruntime"} <= {line.split("=")[0].split("<")[0].split(">")[0]
                                           for line in extras[extra].split()}, extra
    with open(os.path.join(REPO, "constraints.txt")) as src:
        pins = dict(line.strip().split("==") for line in src
                    if "==" in line and not line.startswith("#"))
    assert pins["onnx"] == version("onnx") and pins["onnxruntime"] == version("onnxruntime")
