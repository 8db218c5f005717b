"""Image folders and RecordIO packs: layout, reading against MXNet's own readers and a plain
Pillow decode, augmentation determinism, bad samples."""
import logging
import os
import shutil

import mxnet as mx
import numpy as np
import pytest

from helpers import bad_copy, main_in_process, run_command, tool
from hvdtrain.data import images
from hvdtrain.data.sampler import SplitSampler
from hvdtrain.data.streamed import ImageLoader, load_images
from hvdtrain.data.transforms import IMAGENET_MEAN, IMAGENET_STD


def test_pack_holds_the_folder_as_mxnet_reads_it(digit_images):
    """Every record, read by MXNet's own MXIndexedRecordIO, is the folder's file of the same
    position, byte for byte, with its class index as label."""
    folder, pack = digit_images
    data = load_images("recordio", pack)
    files = load_images("imagefolder", folder)
    assert data.classes == files.classes == [f"digit{d}" for d in range(10)]
    for split, mine, theirs in (("train", data.train, files.train),
                                ("val", data.test, files.test)):
        reader = mx.recordio.MXIndexedRecordIO(os.path.join(pack, f"{split}.idx"),
                                               os.path.join(pack, f"{split}.rec"), "r")
        assert sorted(reader.keys) == list(range(len(theirs))) and len(mine) == len(theirs)
        for index in range(len(theirs)):
            header, payload = mx.recordio.unpack(reader.read_idx(index))
            with open(theirs.describe(index), "rb") as src:
                assert payload == src.read()
            assert int(header.label) == theirs.labels[index] == mine.read(index)[1]
            assert mine.read(index)[0] == payload
        reader.close()


def test_mxnet_image_record_iter_shards_the_pack_into_the_same_sample_set(digit_images):
    """MXNet's C++ reader, split with num_parts/part_index as Horovod's example does, sees
    the labels our splits hold (the pack is a valid RecordIO for the reference reader)."""
    _, pack = digit_images
    data = load_images("recordio", pack)
    ours = sorted(data.test.read(i)[1] for i in range(len(data.test)))
    seen = []
    for part in range(2):
        it = mx.io.ImageRecordIter(path_imgrec=os.path.join(pack, "val.rec"),
                                   path_imgidx=os.path.join(pack, "val.idx"),
                                   data_shape=(3, 32, 32), batch_size=1, resize=32,
                                   num_parts=2, part_index=part, round_batch=False,
                                   preprocess_threads=1)
        for batch in it:
            seen.extend(batch.label[0].asnumpy().astype(int).tolist())
    assert sorted(seen) == ours


def _plain_eval(path, size):
    """The evaluation transform written plainly with Pillow: full decode, shorter side to
    size*256/224, centre crop, normalise."""
    from PIL import Image
    image = Image.open(path).convert("RGB")
    scale = size * 256 / 224 / min(image.size)
    image = image.resize((round(image.size[0] * scale), round(image.size[1] * scale)),
                         Image.BILINEAR)
    left, top = (image.size[0] - size) // 2, (image.size[1] - size) // 2
    pixels = np.asarray(image.crop((left, top, left + size, top + size)), np.float32)
    return ((pixels / 255 - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1)


def test_evaluation_batches_match_a_plain_pillow_decode(digit_images):
    folder, _ = digit_images
    data = load_images("imagefolder", folder, image_size=32)
    loader = ImageLoader(data.test, SplitSampler(len(data.test)), 40, train=False,
                         image_size=32, data_workers=2)
    batch, labels = next(iter(loader))
    for index in range(len(labels)):
        reference = _plain_eval(data.test.describe(index), 32)
        # Pixel grids differ by up to half a pixel (our crop box is rounded to whole pixels),
        # OpenCV's bilinear resize does not antialias as Pillow's does, JPEGs may be decoded
        # at a reduced scale and two libjpeg builds round the inverse DCT differently: close
        # in the mean (0.25 on the normalised scale is about 14 grey levels), not identical.
        assert np.abs(batch[index] - reference).mean() < 0.25, data.test.describe(index)
        assert np.corrcoef(batch[index].ravel(), reference.ravel())[0, 1] > 0.9
        assert labels[index] == data.test.labels[index]


def test_augmentation_depends_on_seed_epoch_and_sample_not_on_data_workers_or_rank_count(
        digit_images):
    """A sample is augmented alike whichever rank reads it, however many ranks there are,
    and however many data workers decode it: the loaders of every rank of 1, 2 and 3 ranks
    (each rank's own sampler part, in this process) give each of the epoch's first 48
    positions the same array. Real jobs at 2 and 3 ranks: tests/dist/test_image_training.py
    (test_augmentation_is_the_same_on_2_and_3_ranks)."""
    _, pack = digit_images
    data = load_images("recordio", pack, image_size=24)

    def augmented(ranks, workers, epoch=2, seed=1):
        """{sample index: its array} over the first 3 batches of 16 of every rank."""
        out = {}
        for rank in range(ranks):
            sampler = SplitSampler(len(data.train), ranks, rank, shuffle=True, seed=seed)
            sampler.set_epoch(epoch)
            loader = ImageLoader(data.train, sampler, 16, train=True, image_size=24,
                                 data_workers=workers, seed=seed)
            batches = [b for b, _ in list(loader)[:3]]
            out.update(zip(sampler.indices()[:48].tolist(), np.concatenate(batches)))
        return out

    one, two, three = augmented(1, 0), augmented(2, 3), augmented(3, 2)
    assert len(one) == 48 and set(one) <= set(two) and set(one) <= set(three)
    for index, array in one.items():
        np.testing.assert_array_equal(two[index], array)
        np.testing.assert_array_equal(three[index], array)
    # ... and differently in another epoch, or with another seed.
    first = next(iter(one))
    for epoch, seed in ((3, 1), (2, 2)):
        other = ImageLoader(data.train, SplitSampler(len(data.train)), 16, train=True,
                            image_size=24, seed=seed).sample(first, epoch)[0]
        assert not np.allclose(one[first], other), (epoch, seed)


def test_a_corrupt_jpeg_and_a_damaged_record_are_skipped_and_named(digit_images, tmp_path,
                                                                   caplog):
    bad_folder, bad_pack, path, key = bad_copy(*digit_images, tmp_path)
    caplog.set_level(logging.WARNING, logger="hvdtrain")
    for kind, root, needle in (("imagefolder", bad_folder, path),
                               ("recordio", bad_pack, f"train.rec record {key}")):
        data = load_images(kind, root, image_size=24)
        loader = ImageLoader(data.train, SplitSampler(len(data.train)), 64, train=True,
                             image_size=24, data_workers=2)
        sizes = [len(labels) for _, labels in loader]
        assert len(sizes) == len(loader) and sum(sizes) == len(data.train) - 1
        assert len(loader.skipped) == 1 and needle in loader.skipped[0]
        assert any(needle in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("kind,breakage,needle", [
    ("recordio", "no idx", "has no index"),
    ("recordio", "no pack", "--dataset recordio needs"),
    ("imagefolder", "empty class", "holds no image (.jpg/.jpeg/.png/.bmp/.webp"),
    ("imagefolder", "classes differ", "only in train: digit9; only in val: none"),
    ("imagefolder", "no val", "val does not exist"),
    ("imagefolder", "missing dir", "nowhere does not exist"),
])
def test_layout_errors_are_one_line_and_exit_2(digit_images, tmp_path, kind, breakage,
                                               needle, capfd):
    """In this process (cli.main), but for "no idx": a real `hvdtrain` process, which
    shows that the whole process prints that one line and nothing else."""
    folder, pack = digit_images
    root = str(tmp_path / "data")
    shutil.copytree(pack if kind == "recordio" else folder, root)
    if breakage == "no idx":
        os.remove(os.path.join(root, "val.idx"))
    elif breakage == "no pack":
        os.remove(os.path.join(root, "train.rec"))
    elif breakage == "empty class":
        for name in os.listdir(os.path.join(root, "val", "digit4")):
            os.remove(os.path.join(root, "val", "digit4", name))
    elif breakage == "classes differ":
        shutil.rmtree(os.path.join(root, "val", "digit9"))
    elif breakage == "no val":
        shutil.rmtree(os.path.join(root, "val"))
    elif breakage == "missing dir":
        root = str(tmp_path / "nowhere")
    argv = ["--dataset", kind, "--data-dir", root, "--no-cuda", "--kvstore", "none",
            "--epochs", "1"]
    if breakage == "no idx":
        proc = run_command([tool("hvdtrain"), *argv], timeout=120)
        code, lines = proc.returncode, [l for l in proc.stdout.splitlines() if l.strip()]
    else:
        code, lines = main_in_process(argv, capfd)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("hvdtrain: error: ") and needle in lines[0], lines[0]


def test_label_smoothing_and_top5_against_numpy():
    from hvdtrain.classify.processor import training_loss
    from hvdtrain.loop.engine.device_metrics import DeviceTopK
    rng = np.random.default_rng(0)
    logits, labels = rng.normal(size=(6, 7)).astype(np.float32), np.arange(6) % 7
    loss = training_loss(0.1)(mx.nd.array(logits), mx.nd.array(labels)).asnumpy()
    log_p = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    target = np.full((6, 7), 0.1 / 7)
    target[np.arange(6), labels] += 0.9
    np.testing.assert_allclose(loss, -(target * log_p).sum(1), rtol=1e-5)
    ranks = (-logits).argsort(1)[:, :5]
    expected = sum(labels[i] in ranks[i] for i in range(6))
    top5 = DeviceTopK(5)
    top5.update([mx.nd.array(labels)], [mx.nd.array(logits)])
    assert top5.sum_metric == expected and top5.num_inst == 6


def test_check_names_a_rank_whose_pack_differs(digit_images, tmp_path):
    from hvdtrain.check import rankfacts
    _, pack = digit_images
    other = str(tmp_path / "pack")
    shutil.copytree(pack, other)
    with open(os.path.join(other, "val.idx")) as src:
        lines = src.readlines()
    with open(os.path.join(other, "val.idx"), "w") as out:
        out.writelines(lines[:-1])  # one validation image fewer on "rank 1"
    facts = [rankfacts.collect(0, 0, pack, no_cuda=True), rankfacts.collect(1, 1, pack, True),
             rankfacts.collect(2, 0, other, no_cuda=True)]
    assert facts[0]["data"] == "recordio(480+120)" and facts[2]["data"] == "recordio(480+119)"
    report, failed = rankfacts.format_report(facts)
    assert failed == [2] and "data_id" in report.splitlines()[-2]


# The training transform's definition, with the constants of its sources (GluonCV's
# train_imagenet.py and fb.resnet.torch; MXNet's ColorJitterAug), not hvdtrain's.
_MEAN, _STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
_GRAY = np.array([0.299, 0.587, 0.114])
_EIGVAL = np.array([55.46, 4.794, 1.148])
_EIGVEC = np.array([[-0.5675, 0.7192, 0.4009],
                    [-0.5808, -0.0045, -0.8140],
                    [-0.5836, -0.6948, 0.4203]])


def _plain_train(encoded, size, rng, area=(0.08, 1.0), ratio=(3 / 4, 4 / 3), jitter=0.4,
                 lighting=0.1):
    """ImageNet's training transform written out with MXNet's own image functions and
    numpy, drawing from `rng` in the documented order (crop box, flip, colour order and
    factors, lighting): decode (``mx.image.imdecode``), GluonCV's random resized crop
    (ten tries at a uniform area and log-uniform aspect, else a centre crop) resized by
    ``mx.image.fixed_crop``, flip, then brightness, contrast and saturation one after
    another in random order, as ColorJitterAug does, and AlexNet's PCA lighting; clipped
    and rounded to whole levels, normalised. Returns (CHW array, whether the crop is at
    least twice `size` on both sides: where a JPEG may be decoded at reduced scale)."""
    src = mx.image.imdecode(encoded)  # RGB, HWC, uint8: a full decode
    height, width = src.shape[:2]
    for _ in range(10):
        target = rng.uniform(*area) * width * height
        aspect = np.exp(rng.uniform(np.log(ratio[0]), np.log(ratio[1])))
        w, h = int(round(np.sqrt(target * aspect))), int(round(np.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            x0, y0 = int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1))
            large = min(w, h) >= 2 * size
            # Bilinear (interp 1); area averaging (3) for a shrink of 2 or more.
            crop = mx.image.fixed_crop(src, x0, y0, w, h, size=(size, size),
                                       interp=3 if large else 1)
            break
    else:
        crop, large = mx.image.center_crop(src, (size, size), interp=1)[0], False
    pixels = crop.asnumpy().astype(np.float64)
    if rng.random() < 0.5:
        pixels = pixels[:, ::-1]
    for which in rng.permutation(3):
        alpha = 1.0 + rng.uniform(-jitter, jitter)
        gray = pixels @ _GRAY
        if which == 0:  # brightness
            pixels = pixels * alpha
        elif which == 1:  # contrast, towards the mean grey level
            pixels = pixels * alpha + gray.mean() * (1 - alpha)
        else:  # saturation, towards each pixel's grey
            pixels = pixels * alpha + gray[..., None] * (1 - alpha)
    pixels = pixels + _EIGVEC @ (rng.normal(0, lighting, size=3) * _EIGVAL)
    normalised = (np.clip(np.round(pixels), 0, 255) / 255 - _MEAN) / _STD
    return normalised.transpose(2, 0, 1), large


def test_training_transform_equals_the_steps_written_out(digit_images):
    """hvdtrain's training transform (crop and resize by its own rules, one-pass colour
    map) against the definition written out with mx.image and numpy (_plain_train), on
    JPEGs and PNGs of 40-120 pixels made 48 pixels square."""
    from hvdtrain.data import transforms as T
    folder, _ = digit_images
    data = load_images("imagefolder", folder)
    level = 1 / (255 * _STD.min())  # one grey level after normalisation (<= 0.0175)
    exact = 0
    for index in range(40):
        encoded, _ = data.train.read(index)
        got = T.train_transform(encoded, 48, np.random.default_rng([3, 1, index]), "x")
        expected, large = _plain_train(encoded, 48, np.random.default_rng([3, 1, index]))
        what = data.train.describe(index)
        diff = np.abs(got - expected)
        if large:
            # hvdtrain decodes such a JPEG at half scale (libjpeg's DCT scaling) and
            # resizes that: the same picture, not the same pixels. Seen over the 480
            # training images: mean difference up to 3.7 levels, correlation >= 0.984.
            assert diff.mean() < 6 * level, what
            assert np.corrcoef(got.ravel(), expected.ravel())[0, 1] > 0.97, what
            continue
        exact += 1
        # Whole levels, as ImageRecordIter's. OpenCV's uint8 transform rounds its
        # coefficients to 1/1024: on three pixels <= 255 that moves a value by < 0.75 of
        # a level, so the rounded result is the exact one or a neighbour, one level away,
        # never more. (Seen over the 480 training images: never more than one level, the
        # mean under 0.46 of a level; the decoders agree to the pixel on these files.)
        assert diff.max() <= level + 1e-4, what
        assert diff.mean() < level / 2, what  # neighbours are the exception, not the rule
    assert exact >= 30  # most crops here are below twice the output size


_DECODE_IN_ORDER = """
import sys
first = sys.argv[1].split(",")
for name in first:
    __import__(name)
import cv2, numpy as np, mxnet as mx
from hvdtrain.data import transforms as T
T.check_jpeg_codec()
encoded = open(sys.argv[2], "rb").read()
full = T._decode(T.open_image(encoded, "x"), 1, "x")
theirs = mx.image.imdecode(encoded).asnumpy()  # RGB
print("DECODER", T.jpeg_decoder())
print("MAXDIFF", int(np.abs(full.astype(int) - theirs).max()))
"""


@pytest.mark.parametrize("first,decoder", [("hvdtrain,horovod.mxnet", "pillow"),
                                           ("PIL.Image,mxnet,horovod.mxnet", "pillow"),
                                           ("cv2,mxnet,horovod.mxnet", "opencv"),
                                           ("mxnet,horovod.mxnet,cv2", "opencv"),
                                           ("horovod.mxnet", "opencv")])
def test_jpegs_decode_whether_imported_before_or_after_horovod_mxnet(digit_images, first,
                                                                     decoder):
    """horovod.mxnet loads libmxnet's symbols (its own OpenCV and libjpeg) globally: Pillow,
    loaded after it, would call that libjpeg and fail, so OpenCV (whose libjpeg is built in)
    decodes instead; loaded before it (as ``import hvdtrain`` does), Pillow decodes. Either
    way the pixels match MXNet's own decoder, the independent reference."""
    folder, _ = digit_images
    data = load_images("imagefolder", folder)
    path = data.train.describe(0)
    out = run_command([tool("python"), "-c", _DECODE_IN_ORDER, first, path],
                      timeout=300).stdout
    line = [l for l in out.splitlines() if l.startswith("MAXDIFF")]
    assert line, out
    assert f"DECODER {decoder}" in out, out
    # Two libjpeg builds may round the inverse DCT differently: a few grey levels.
    assert int(line[0].split()[1]) <= 4, out


def test_pack_skips_and_counts_images_that_do_not_decode(digit_images, tmp_path, capsys):
    """hvdtrain-pack leaves out a corrupt JPEG and a file that is no image, names each in a
    warning and counts them in its summary; MXNet's own reader finds only the others."""
    from hvdtrain.data import pack
    bad_folder, _, corrupt, _ = bad_copy(*digit_images, tmp_path)
    not_image = os.path.join(bad_folder, "val", "digit5", "zz-notes.png")
    with open(not_image, "wb") as out:
        out.write(b"not an image at all")
    out_dir = str(tmp_path / "repacked")
    assert pack.run([bad_folder, out_dir]) == 0
    captured = capsys.readouterr()
    files = load_images("imagefolder", bad_folder)
    assert (f"packed {len(files.train) - 1} train and {len(files.test) - 1} val images"
            in captured.out and "skipped 2 that cannot be read or decoded (1 train, 1 val" in
            captured.out), captured.out
    warnings = [l for l in captured.err.splitlines() if l.startswith("hvdtrain-pack: warning")]
    assert len(warnings) == 2 and corrupt in warnings[0] and not_image in warnings[1], warnings
    for split, folder_split, bad in (("train", files.train, corrupt),
                                     ("val", files.test, not_image)):
        reader = mx.recordio.MXIndexedRecordIO(os.path.join(out_dir, f"{split}.idx"),
                                               os.path.join(out_dir, f"{split}.rec"), "r")
        packed = sorted(reader.keys)
        reader.close()
        expected = [i for i in range(len(folder_split)) if folder_split.describe(i) != bad]
        assert packed == expected


def test_jpeg_size_read_from_the_frame_header_equals_pillows(tmp_path):
    """open_image reads a JPEG's size itself (Pillow's open costs a tenth of the decode);
    against Pillow on baseline, progressive, EXIF-carrying and grey JPEGs, and anything
    whose markers do not parse goes to Pillow (a PNG opens, garbage is a BadSample)."""
    import io
    from PIL import Image
    from hvdtrain.data import transforms as T
    from hvdtrain.data.errors import BadSample
    rng = np.random.default_rng(0)
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: a real APP1 segment before the frame
    cases = []
    for size, mode, options in [((500, 375), "RGB", {}), ((37, 211), "RGB", {"progressive": True}),
                                ((640, 480), "RGB", {"exif": exif.tobytes()}),
                                ((64, 48), "L", {"quality": 50})]:
        pixels = rng.integers(0, 256, size=size[::-1] + ((3,) if mode == "RGB" else ()),
                              dtype=np.uint8)
        out = io.BytesIO()
        Image.fromarray(pixels, mode).save(out, "JPEG", **options)
        cases.append(out.getvalue())
    for encoded in cases:
        with Image.open(io.BytesIO(encoded)) as image:
            assert T._jpeg_size(encoded) == image.size
        assert T.open_image(encoded, "x").size == T._jpeg_size(encoded)
    png = io.BytesIO()
    Image.fromarray(np.zeros((5, 7, 3), np.uint8)).save(png, "PNG")
    assert T._jpeg_size(png.getvalue()) is None
    assert T.open_image(png.getvalue(), "x").size == (7, 5)
    assert T._jpeg_size(cases[0][:40]) is None  # cut before its frame header
    with pytest.raises(BadSample, match="x: cannot decode"):
        T.open_image(cases[0][:40], "x")


def test_a_pack_made_by_mxnets_im2rec_reads_as_its_folder(digit_images, tmp_path):
    """docs/data.md: packs made by MXNet's own im2rec.py (a list, then --pass-through)
    train as they are: the classes come from its train.lst, and the records are the
    folder's files, byte for byte, each with its file's class (im2rec numbers the sorted
    class folders as hvdtrain does)."""
    import collections
    import sys
    folder, _ = digit_images
    im2rec = os.path.join(os.path.dirname(mx.__file__), "tools", "im2rec.py")
    pack = tmp_path / "pack"
    pack.mkdir()
    for split in ("train", "val"):
        for step in (["--list", "--recursive"], ["--pass-through", "--num-thread", "1"]):
            proc = run_command([sys.executable, im2rec, *step, split,
                                os.path.join(folder, split)], timeout=300, cwd=str(pack))
            assert proc.returncode == 0, proc.stdout
    data = load_images("recordio", str(pack))
    files = load_images("imagefolder", folder)
    assert data.classes == [str(label) for label in range(10)]  # train.lst has no names
    for mine, theirs in ((data.train, files.train), (data.test, files.test)):
        expected = collections.Counter()
        for index in range(len(theirs)):
            with open(theirs.describe(index), "rb") as src:
                expected[(src.read(), int(theirs.labels[index]))] += 1
        assert collections.Counter(mine.read(i) for i in range(len(mine))) == expected


def test_reduced_jpeg_decodes_match_opencvs(tmp_path):
    """Pillow's DCT-scaled decode (``draft``) against OpenCV's ``IMREAD_REDUCED_COLOR_N``,
    an independent decoder: the same size at 1/1, 1/2, 1/4 and 1/8, and the same picture."""
    import cv2
    from hvdtrain.data import transforms as T
    rng = np.random.default_rng(0)
    small = rng.integers(0, 256, size=(12, 16, 3), dtype=np.uint8)
    photo = cv2.resize(small, (500, 375), interpolation=cv2.INTER_CUBIC)
    encoded = cv2.imencode(".jpg", photo, [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes()
    image = T.open_image(encoded, "photo.jpg")
    for reduce in (1, 2, 4, 8):
        ours = T._pillow_decode(image, reduce, "photo.jpg")
        theirs = T._opencv_decode(image, reduce, "photo.jpg")
        assert ours.shape == theirs.shape == (-(-375 // reduce), -(-500 // reduce), 3)
        # Both are libjpeg-turbo's integer IDCT: identical here (Pillow 13, OpenCV 4.8);
        # two grey levels leave room for another release's rounding, no more.
        difference = np.abs(ours.astype(int) - theirs)
        assert difference.max() <= 2, (reduce, difference.max())


@pytest.mark.parametrize("mode,fmt", [("L", "JPEG"), ("RGBA", "PNG"), ("P", "PNG"),
                                      ("I;16", "PNG"), ("RGB", "BMP"), ("RGB", "WEBP")])
def test_other_image_kinds_decode_as_opencv_decodes_them(mode, fmt):
    """Grey, alpha, palette and 16-bit images become the RGB pixels OpenCV's colour read
    (the independent reference) gives; a 16-bit grey keeps its top 8 bits (Pillow's own
    conversion would turn everything above 255 white)."""
    import io
    from PIL import Image
    from hvdtrain.data import transforms as T
    rng = np.random.default_rng(1)
    if mode == "I;16":
        image = Image.fromarray(rng.integers(0, 65536, (30, 40)).astype(np.uint16))
    else:
        image = Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)).convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, fmt, **({"lossless": True} if fmt == "WEBP" else {}))
    encoded = T.open_image(buffer.getvalue(), f"x.{fmt.lower()}")
    ours = T._pillow_decode(encoded, 1, "x")
    theirs = T._opencv_decode(encoded, 1, "x")
    assert ours.shape == theirs.shape == (30, 40, 3)
    assert np.abs(ours.astype(int) - theirs).max() <= 2, mode
