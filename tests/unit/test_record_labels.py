"""The labels of a RecordIO pack: checked against its class list at open (classes.txt or
im2rec's train.lst), one class a record (a label array of more is refused, as MXNet's
ImageRecordIter refuses it), and a label outside the classes met at read time skipped and
counted, never fed to the loss. Packs are written with MXNet's own writer
(``mx.recordio``) and read back with its own readers as the reference."""
import errno
import io
import logging
import os

import mxnet as mx
import numpy as np
import pytest

from helpers import main_in_process
from hvdtrain.data import pack_labels
from hvdtrain.data.errors import BadSample
from hvdtrain.data.sampler import SplitSampler
from hvdtrain.data.streamed import ImageLoader, load_images

ARGS = ["--no-cuda", "--kvstore", "none", "--epochs", "1", "--image-size", "16",
        "--model", "mlp", "--batch-size", "4"]


def _jpeg(shade):
    from PIL import Image
    out = io.BytesIO()
    Image.new("RGB", (20, 16), (shade, 80, 160)).save(out, "JPEG")
    return out.getvalue()


def write_pack(root, train, val=None, listing=None):
    """A pack of small JPEGs whose labels are `train` and `val` (a number, or a list for a
    label array), written by MXNet's writer; `listing`: the labels of a train.lst."""
    os.makedirs(root, exist_ok=True)
    for split, labels in (("train", train), ("val", train if val is None else val)):
        writer = mx.recordio.MXIndexedRecordIO(os.path.join(root, f"{split}.idx"),
                                               os.path.join(root, f"{split}.rec"), "w")
        for key, label in enumerate(labels):
            header = mx.recordio.IRHeader(0, label, key, 0)
            writer.write_idx(key, mx.recordio.pack(header, _jpeg(key * 37 % 256)))
        writer.close()
    if listing is not None:
        with open(os.path.join(root, "train.lst"), "w") as out:
            out.writelines(f"{i}\t{label:f}\tc{label}/{i}.jpg\n" for i, label in enumerate(listing))
    return str(root)


def _refusal(root, capfd):
    code, lines = main_in_process(["--dataset", "recordio", "--data-dir", root, *ARGS], capfd)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("hvdtrain: error: "), lines
    return lines[0]


def test_records_past_the_labels_of_train_lst_are_refused(tmp_path, capfd):
    """Records labelled 0-3 with a train.lst naming 0-1 trained a 2-class model (exit 0)
    and fed labels 2 and 3 to the loss."""
    root = write_pack(tmp_path / "pack", [0, 1, 2, 3] * 3, listing=[0, 1] * 6)
    line = _refusal(root, capfd)
    assert "train.lst has labels 0-1 but" in line and "has label 3" in line, line


@pytest.mark.parametrize("listing,needle", [
    # Nine labels numbered up to 9: label 8 has no image, yet it made a 10-class model.
    ([0, 1, 2, 3, 4, 5, 6, 7, 9] * 2, "has labels 0-9 but no image of label(s) 8"),
    # The list names 0-9, the records hold 0-8: class 9 would never train.
    (list(range(10)) * 2, "train.rec has no record of label(s) 9"),
], ids=["gap in the list", "class without records"])
def test_a_train_lst_naming_a_class_nothing_trains_is_refused(tmp_path, capfd, listing, needle):
    root = write_pack(tmp_path / "pack", list(range(9)) * 2, listing=listing)
    line = _refusal(root, capfd)
    assert "train.lst" in line and needle in line, line


def test_a_malformed_train_lst_is_one_line(tmp_path, capfd):
    root = write_pack(tmp_path / "pack", [0, 1] * 4)
    with open(os.path.join(root, "train.lst"), "w") as out:
        out.write("0\t0.000000\ta.jpg\n1\tcat\tb.jpg\n")
    line = _refusal(root, capfd)
    assert "line 2 of" in line and "train.lst" in line, line


def _sampled_open(monkeypatch, root):
    """Open `root` with 4 records a split read at open (as 2000 of a large pack), so that
    a record in between is met only when training reads it."""
    monkeypatch.setattr(pack_labels, "LABELS_CHECKED", 4)
    data = load_images("recordio", root, image_size=16)
    # 12 records: positions 0, 3, 7 and 11 are read at open; 5 is not.
    assert len(data.train) == 12
    return data


def _one_epoch(data):
    loader = ImageLoader(data.train, SplitSampler(len(data.train)), 5, train=False,
                         image_size=16, data_workers=0)
    labels = np.concatenate([batch_labels for _, batch_labels in loader])
    return labels, loader.skipped


def _mxnet_labels(root, split="train"):
    """Every record's label as MXNet's own reader unpacks it, in key order."""
    reader = mx.recordio.MXIndexedRecordIO(os.path.join(root, f"{split}.idx"),
                                           os.path.join(root, f"{split}.rec"), "r")
    labels = [mx.recordio.unpack(reader.read_idx(key))[0].label for key in sorted(reader.keys)]
    reader.close()
    return labels


def test_a_label_outside_the_classes_is_skipped_and_counted_not_trained(tmp_path, monkeypatch):
    """classes.txt names 4 classes; record 5 (not among those checked at open) has label 7.
    It was read as 7 and went to the loss (or `pick` clipped it to class 3)."""
    labels = [0, 1, 2, 3, 0, 7, 1, 2, 3, 0, 1, 2]
    root = write_pack(tmp_path / "pack", labels)
    with open(os.path.join(root, "classes.txt"), "w") as out:
        out.write("a\nb\nc\nd\n")
    data = _sampled_open(monkeypatch, root)
    assert _mxnet_labels(root)[5] == 7.0  # the reference reader sees the record as written
    with pytest.raises(BadSample, match="record 5: label 7 is not one of the 4 classes"):
        data.train.read(5)
    got, skipped = _one_epoch(data)
    assert got.tolist() == labels[:5] + labels[6:]
    assert len(skipped) == 1 and "record 5" in skipped[0], skipped


@pytest.mark.parametrize("where", ["checked at open", "met in training"])
def test_multi_label_records_are_refused_as_image_record_iter_refuses_them(tmp_path, capfd,
                                                                           monkeypatch, where):
    """A record of two labels was trained on its first. MXNet's ImageRecordIter (label_width
    1) stops on it; hvdtrain refuses the pack at open, or skips the record met later."""
    labels = [0, 1, 2, 3] * 3
    labels[0 if where == "checked at open" else 5] = [2.0, 3.0]
    root = write_pack(tmp_path / "pack", labels)
    with open(os.path.join(root, "classes.txt"), "w") as out:
        out.write("a\nb\nc\nd\n")
    with pytest.raises(mx.base.MXNetError, match="label_width"):
        for _ in mx.io.ImageRecordIter(path_imgrec=os.path.join(root, "train.rec"),
                                       data_shape=(3, 16, 16), batch_size=1,
                                       preprocess_threads=1):
            pass
    if where == "checked at open":
        line = _refusal(root, capfd)
        assert "train.rec record 0 holds 2 labels (a multi-label pack)" in line, line
        return
    got, skipped = _one_epoch(_sampled_open(monkeypatch, root))
    assert got.tolist() == labels[:5] + labels[6:]
    assert len(skipped) == 1 and "record 5 holds 2 labels" in skipped[0], skipped


def test_a_label_array_of_one_value_is_that_class(tmp_path):
    """``mx.recordio.pack`` given a one-element list writes flag 1 and a label array of
    one: one class, read as ImageRecordIter reads it (the reference)."""
    labels = [[float(label)] for label in [0, 1, 2, 3] * 3]
    root = write_pack(tmp_path / "pack", labels)
    data = load_images("recordio", root, image_size=16)
    theirs = []
    for batch in mx.io.ImageRecordIter(path_imgrec=os.path.join(root, "train.rec"),
                                       data_shape=(3, 16, 16), batch_size=1,
                                       preprocess_threads=1):
        theirs.append(int(batch.label[0].asnumpy()[0]))
    assert theirs == [0, 1, 2, 3] * 3
    assert [data.train.read(i)[1] for i in range(len(data.train))] == theirs
    assert data.classes == ["0", "1", "2", "3"]


def test_a_fractional_label_is_refused_at_open(tmp_path, capfd):
    root = write_pack(tmp_path / "pack", [0, 1, 2.5, 3] * 3, listing=[0, 1, 2, 3])
    line = _refusal(root, capfd)
    assert "has label 2.5, not a class number" in line, line


def test_an_io_error_on_a_record_is_a_skipped_sample(tmp_path, monkeypatch, caplog):
    """os.pread failing on one record (a bad sector, a dropped network disk) ended the job
    with a traceback; an unreadable image file of a folder is skipped, so is this."""
    root = write_pack(tmp_path / "pack", [0, 1, 2, 3] * 3)
    data = load_images("recordio", root, image_size=16)
    bad_offset = int(data.train.offsets[6])
    real = os.pread

    def failing(fd, length, offset):
        if offset == bad_offset:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(fd, length, offset)

    monkeypatch.setattr(os, "pread", failing)
    caplog.set_level(logging.WARNING, logger="hvdtrain")
    got, skipped = _one_epoch(data)
    assert got.tolist() == ([0, 1, 2, 3] * 3)[:6] + ([0, 1, 2, 3] * 3)[7:]
    assert len(skipped) == 1, skipped
    assert "record 6: cannot read (Input/output error)" in skipped[0], skipped
