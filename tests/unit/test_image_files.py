"""Which files of an image folder are samples, and how they decode: torchvision's image
extensions (WebP and BMP included), images in subfolders of a class folder, file names
holding a newline, EXIF orientation. The references are Pillow's own decode, MXNet's reader
and decoders, im2rec.py, and listings made here with os.walk."""
import logging
import os
import shutil
import sys

import mxnet as mx
import numpy as np
from PIL import Image

from helpers import main_in_process, run_command
from hvdtrain.data import transforms as T
from hvdtrain.data.images import open_folder
from hvdtrain.data.pack import run as pack

# Lossless formats (and a JPEG) Pillow writes, each in the extension a user would give it.
FORMATS = {".png": ("PNG", {}), ".bmp": ("BMP", {}), ".webp": ("WEBP", {"lossless": True}),
           ".tif": ("TIFF", {}), ".tiff": ("TIFF", {}), ".ppm": ("PPM", {}),
           ".pgm": ("PPM", {}), ".jpg": ("JPEG", {"quality": 95})}


def _picture(seed, mode="RGB"):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (18, 26, 3), dtype=np.uint8)).convert(mode)


def _write(path, seed):
    ext = os.path.splitext(path)[1].lower()
    fmt, options = FORMATS[ext]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _picture(seed, "L" if ext == ".pgm" else "RGB").save(path, fmt, **options)


def _walk_images(class_folder):
    """Every file below `class_folder` with an extension of FORMATS, found by os.walk."""
    found = set()
    for root, _, files in os.walk(class_folder, followlinks=True):
        found.update(os.path.relpath(os.path.join(root, f), class_folder) for f in files
                     if os.path.splitext(f)[1].lower() in FORMATS)
    return found


def test_webp_bmp_tiff_and_netpbm_images_are_samples_decoded_as_pillow_decodes(tmp_path):
    """.webp and .bmp (and torchvision's other extensions) were left out without a word.
    Each now is a sample, and decodes to the pixels Pillow's own decode gives."""
    root = tmp_path / "images"
    for split in ("train", "val"):
        for number, ext in enumerate(FORMATS):
            _write(str(root / split / "shapes" / f"p{number}{ext.upper() if number % 2 else ext}"),
                   number)
    classes, train, _ = open_folder(str(root))
    assert classes == ["shapes"] and len(train) == len(FORMATS)
    assert {train.name(i) for i in range(len(train))} == \
        {os.path.join("shapes", p) for p in _walk_images(str(root / "train" / "shapes"))}
    for index in range(len(train)):
        encoded, label = train.read(index)
        ours = T._decode(T.open_image(encoded, "x"), 1, "x")
        theirs = np.asarray(Image.open(train.describe(index)).convert("RGB"))
        if train.describe(index).lower().endswith(".jpg"):
            assert np.abs(ours.astype(int) - theirs).max() <= 2  # two libjpeg builds
        else:
            np.testing.assert_array_equal(ours, theirs, err_msg=train.describe(index))


def test_images_in_subfolders_of_a_class_belong_to_it_in_a_fixed_order(tmp_path, caplog):
    """torchvision's ImageFolder takes them; they were left out. The order: a folder's
    files, then its subfolders', each sorted by name, depth first. Files that are not
    images are named in one warning a split, with the rule."""
    root = tmp_path / "images"
    layout = ["b.png", "a/z.png", "a/deeper/y.png", "a/x.png", "c/w.png", "0.png"]
    for split in ("train", "val"):
        for number, name in enumerate(layout):
            _write(str(root / split / "cat" / name), number)
        _write(str(root / split / "dog" / "d.png"), 9)
        (root / split / "cat" / "notes.txt").write_text("not an image")
        Image.new("RGB", (4, 4)).save(root / split / "dog" / "anim.gif")
    caplog.set_level(logging.WARNING, logger="hvdtrain")
    _, train, val = open_folder(str(root))
    names = [train.name(i) for i in range(len(train))]
    assert names == [os.path.join("cat", n) for n in
                     ["0.png", "b.png", "a/x.png", "a/z.png", "a/deeper/y.png", "c/w.png"]] \
        + [os.path.join("dog", "d.png")]
    assert set(names) == {os.path.join(c, p) for c in ("cat", "dog")
                          for p in _walk_images(str(root / "train" / c))}
    assert train.labels.tolist() == [0] * 6 + [1]
    assert train.read(4)[0] == (root / "train" / "cat" / "a" / "deeper" / "y.png").read_bytes()
    warnings = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(warnings) == 2, warnings  # one a split
    assert warnings[0].startswith(f"left out 2 file(s) of {root / 'train'} that are not "
                                  f"images by their extension (1 .gif, 1 .txt)"), warnings[0]


def test_a_subfolder_linking_back_up_is_one_line(tmp_path, capfd):
    root = tmp_path / "images"
    for split in ("train", "val"):
        _write(str(root / split / "cat" / "a.png"), 1)
    link = root / "train" / "cat" / "again"
    os.symlink("..", link)
    code, lines = main_in_process(["--dataset", "imagefolder", "--data-dir", str(root),
                                   "--no-cuda", "--kvstore", "none", "--epochs", "1"], capfd)
    assert code == 2 and len(lines) == 1, lines
    # Walked into train/ (a folder of classes, not a loop yet), it meets cat/ again.
    assert f"cannot follow {link}/cat: it leads back to {root / 'train' / 'cat'}, a folder " \
        f"above it (a loop)" in lines[0], lines[0]


def test_a_file_name_with_a_newline_keeps_every_label_in_the_pack(digit_images, tmp_path):
    """The folder's names were one newline-separated buffer: such a file became two
    samples and every later file of the split took its neighbour's label. The pack, read
    by MXNet's own reader, holds each file's bytes with its class, in the folder's order."""
    folder = str(tmp_path / "images")
    shutil.copytree(digit_images[0], folder)
    victim = os.path.join(folder, "train", "digit3", sorted(os.listdir(
        os.path.join(folder, "train", "digit3")))[2])
    os.rename(victim, victim[:-4] + "\nsecond line.jpg")
    assert pack([folder, str(tmp_path / "pack")]) == 0
    reader = mx.recordio.MXIndexedRecordIO(str(tmp_path / "pack" / "train.idx"),
                                           str(tmp_path / "pack" / "train.rec"), "r")
    expected = []
    classes = sorted(os.listdir(os.path.join(folder, "train")))
    for label, name in enumerate(classes):
        for file in sorted(os.listdir(os.path.join(folder, "train", name))):
            with open(os.path.join(folder, "train", name, file), "rb") as src:
                expected.append((src.read(), label))
    assert sorted(reader.keys) == list(range(len(expected)))
    for key, (data, label) in enumerate(expected):
        header, payload = mx.recordio.unpack(reader.read_idx(key))
        assert (payload, int(header.label)) == (data, label), key
    reader.close()


def test_a_class_name_with_a_line_break_is_refused_by_the_pack(tmp_path, capsys):
    root = tmp_path / "images"
    for split in ("train", "val"):
        _write(str(root / split / "two\nlines" / "a.png"), 1)
    assert pack([str(root), str(tmp_path / "pack")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "has a line break in its name" in err, err
    assert not (tmp_path / "pack" / "classes.txt").exists()


def test_exif_orientation_hvdtrain_trains_the_stored_pixels_mxnets_readers_differ(tmp_path):
    """docs/data.md's EXIF rule, each reader run on one JPEG stored 20x40 whose EXIF tag
    says "rotate 90 degrees clockwise to display": hvdtrain decodes the stored pixels, as
    Pillow and mx.image.imdecode do; MXNet's ImageRecordIter, given the raw bytes in a
    pack, rotates them (its decoder applies the tag), and so does im2rec.py's default
    mode (cv2.imread), which packs the rotated pixels."""
    stored = np.zeros((20, 40, 3), np.uint8)
    stored[:, :20] = (250, 0, 0)
    stored[:, 20:] = (0, 0, 250)
    exif = Image.Exif()
    exif[0x0112] = 6
    folder = tmp_path / "images" / "c"
    folder.mkdir(parents=True)
    Image.fromarray(stored).save(folder / "o.jpg", "JPEG", exif=exif.tobytes(), quality=95)
    encoded = (folder / "o.jpg").read_bytes()
    ours = T._decode(T.open_image(encoded, "o.jpg"), 1, "o.jpg")
    assert ours.shape == (20, 40, 3)
    np.testing.assert_array_equal(ours, np.asarray(Image.open(folder / "o.jpg")))
    assert np.abs(ours.astype(int) - mx.image.imdecode(encoded).asnumpy()).max() <= 8
    writer = mx.recordio.MXIndexedRecordIO(str(tmp_path / "raw.idx"), str(tmp_path / "raw.rec"),
                                           "w")
    writer.write_idx(0, mx.recordio.pack(mx.recordio.IRHeader(0, 0, 0, 0), encoded))
    writer.close()
    batch = next(iter(mx.io.ImageRecordIter(path_imgrec=str(tmp_path / "raw.rec"),
                                            data_shape=(3, 40, 20), batch_size=1,
                                            preprocess_threads=1)))
    upright = batch.data[0].asnumpy()[0].transpose(1, 2, 0)
    assert np.abs(upright - np.rot90(ours, -1)).max() <= 8  # rotated clockwise
    im2rec = os.path.join(os.path.dirname(mx.__file__), "tools", "im2rec.py")
    for step in (["--list", "--recursive"], ["--num-thread", "1"]):
        proc = run_command([sys.executable, im2rec, *step, "o", str(tmp_path / "images")],
                           timeout=120, cwd=str(tmp_path))
        assert proc.returncode == 0, proc.stdout
    reader = mx.recordio.MXRecordIO(str(tmp_path / "o.rec"), "r")
    _, repacked = mx.recordio.unpack(reader.read())
    reader.close()
    assert mx.image.imdecode(repacked).shape == (40, 20, 3)  # packed rotated
