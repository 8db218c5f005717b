"""Layout errors of image folders and RecordIO packs found before training: one line
``hvdtrain: error: ...`` naming the path and the problem, exit status 2 (run in-process)."""
import os
import shutil

import pytest

from helpers import main_in_process

ARGS = ["--no-cuda", "--kvstore", "none", "--epochs", "1", "--image-size", "16"]


def _refusal(kind, root, capfd):
    code, lines = main_in_process(["--dataset", kind, "--data-dir", root, *ARGS], capfd)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("hvdtrain: error: "), lines
    return lines[0]


@pytest.fixture
def pack_copy(digit_images, tmp_path):
    root = str(tmp_path / "pack")
    shutil.copytree(digit_images[1], root)
    return root


@pytest.fixture
def folder_copy(digit_images, tmp_path):
    root = str(tmp_path / "images")
    shutil.copytree(digit_images[0], root)
    return root


@pytest.mark.parametrize("names,needle", [
    # Labels 5-9 have no name: the model would get 5 outputs for 10 labels.
    ([f"c{i}" for i in range(5)], "names 5 classes (labels 0-4) but"),
    # A name no record has: an output that never trains.
    ([f"c{i}" for i in range(11)], "has no record of label(s) 10"),
])
def test_a_class_list_that_does_not_fit_the_labels_is_refused(pack_copy, capfd, names,
                                                               needle):
    with open(os.path.join(pack_copy, "classes.txt"), "w") as out:
        out.write("".join(n + "\n" for n in names))
    line = _refusal("recordio", pack_copy, capfd)
    assert "classes.txt" in line and needle in line and "re-pack" in line, line


def test_a_train_lst_that_disagrees_with_classes_txt_is_refused(pack_copy, capfd):
    with open(os.path.join(pack_copy, "train.lst"), "w") as out:
        out.write("0\t11.000000\tdigit0/a.jpg\n")
    line = _refusal("recordio", pack_copy, capfd)
    assert "names 10 classes but" in line and "labels 0-11" in line, line


def test_a_symlink_loop_in_a_class_folder_is_one_line(folder_copy, capfd):
    link = os.path.join(folder_copy, "train", "digit3", "loop.jpg")
    os.symlink("loop.jpg", link)
    line = _refusal("imagefolder", folder_copy, capfd)
    assert f"cannot follow {link}" in line and "levels of symbolic links" in line, line


def test_a_symlinked_class_folder_loop_is_one_line(folder_copy, capfd):
    link = os.path.join(folder_copy, "val", "digit10")
    os.symlink("digit10", link)
    line = _refusal("imagefolder", folder_copy, capfd)
    assert f"cannot follow {link}" in line, line


@pytest.mark.parametrize("where", ["class folder", "image"])
def test_a_link_to_nothing_is_one_line_not_a_silent_drop(folder_copy, capfd, where):
    """A class folder (or image) linked from a share that is not mounted: is_dir() and
    is_file() just say False, which dropped the class (every later label moved by one)."""
    if where == "class folder":
        links = [os.path.join(folder_copy, split, "digitA") for split in ("train", "val")]
    else:
        links = [os.path.join(folder_copy, "train", "digit3", "remote.jpg")]
    for link in links:
        os.symlink("/mnt/not-mounted/x", link)
    line = _refusal("imagefolder", folder_copy, capfd)
    assert f"cannot follow {links[0]}" in line and "/mnt/not-mounted/x" in line, line
    assert "does not exist" in line, line


@pytest.mark.parametrize("content,needle", [("", "is empty"), ("\n\n", "is empty"),
                                            ("a\nb\na\n", "names a more than once")])
def test_an_empty_or_repeating_class_list_is_refused(pack_copy, capfd, content, needle):
    """An empty classes.txt was taken for a missing one (classes numbered, a wrong warning);
    a repeated name trained two outputs under one name."""
    with open(os.path.join(pack_copy, "classes.txt"), "w") as out:
        out.write(content)
    line = _refusal("recordio", pack_copy, capfd)
    assert "classes.txt" in line and needle in line, line


@pytest.mark.parametrize("cut", ["half", "inside the last record"])
def test_a_truncated_rec_is_refused_at_open(pack_copy, capfd, cut):
    rec = os.path.join(pack_copy, "train.rec")
    size = os.path.getsize(rec)
    with open(rec, "r+b") as out:
        out.truncate(size // 2 if cut == "half" else size - 10)
    line = _refusal("recordio", pack_copy, capfd)
    assert f"{rec} is truncated" in line and "re-pack" in line, line


@pytest.mark.parametrize("cut", [1, 3])
def test_an_idx_cut_inside_a_line_is_refused_at_open(pack_copy, capfd, cut):
    """Cut inside the last offset (1 byte off: a smaller offset that may point into another
    record) or just after its tab: the last offset cannot be trusted either way."""
    idx = os.path.join(pack_copy, "train.idx")
    last = open(idx).read().splitlines()[-1]
    with open(idx, "r+b") as out:
        out.truncate(os.path.getsize(idx) - 1 - (cut if cut < 3 else len(last.split()[1])))
    line = _refusal("recordio", pack_copy, capfd)
    assert f"{idx} ends inside a line (cut short?)" in line, line


@pytest.mark.parametrize("case,needle", [
    ("missing", "does not exist"),
    ("file", "is not a folder"),
    ("unreadable", "cannot be read (permission denied)"),
])
def test_an_unusable_data_dir_says_what_is_wrong(folder_copy, tmp_path, capfd, monkeypatch,
                                                 case, needle):
    root = folder_copy
    if case == "missing":
        root = str(tmp_path / "nowhere")
    elif case == "file":
        root = str(tmp_path / "a-file")
        open(root, "w").close()
    else:
        # Tests may run as root, whom chmod does not stop: the permission check is what
        # os.access answers for a user without read permission.
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, m, **kw: False if p == root
                            else real(p, m, **kw))
    line = _refusal("imagefolder", root, capfd)
    assert f"--data-dir {root} {needle}" in line, line


def test_pack_errors_name_the_path(digit_images, tmp_path, capsys):
    """hvdtrain-pack into a file said only "File exists"; from a folder that does not exist
    it named IMAGES_DIR/train, not the folder."""
    from hvdtrain.data.pack import run
    taken = tmp_path / "a-file"
    taken.write_text("x")
    assert run([digit_images[0], str(taken)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"hvdtrain-pack: error: PACK_DIR {taken} is not a folder: give the folder "
                   f"to write the pack into (it is made if missing)"), err
    nowhere = tmp_path / "nowhere"
    assert run([str(nowhere), str(tmp_path / "pack")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"hvdtrain-pack: error: IMAGES_DIR {nowhere} does not exist"), err
    assert "--dataset" not in err and "\n" not in err, err
    (nowhere / "train").mkdir(parents=True)
    assert run([str(nowhere), str(tmp_path / "pack")]) == 2
    err = capsys.readouterr().err.strip()
    assert "an image folder needs" in err and "--dataset" not in err, err


@pytest.mark.parametrize("rename", ["digit0", "digit9"])
def test_a_resume_on_other_class_names_is_refused_and_leaves_the_folder(folder_copy, tmp_path,
                                                                        capfd, rename):
    """Renaming a class folder keeps the count (10) but moves every class after it to
    another output index (digit0 -> zzz sorts last); renaming the last keeps the order but
    not the names. Either way the checkpoint's outputs no longer mean the data's classes:
    refused in one line naming the newest checkpoint, before anything is written."""
    from helpers import folder_digest
    out_dir = str(tmp_path / "run")
    code, _ = main_in_process(["--dataset", "imagefolder", "--data-dir", folder_copy,
                               "--output-dir", out_dir, "--model", "mlp", *ARGS], capfd)
    assert code == 0
    for split in ("train", "val"):
        os.rename(os.path.join(folder_copy, split, rename),
                  os.path.join(folder_copy, split, "zzz"))
    before = folder_digest(out_dir)
    code, lines = main_in_process(["--dataset", "imagefolder", "--data-dir", folder_copy,
                                   "--output-dir", out_dir, "--model", "mlp", "--resume",
                                   "auto", "--no-cuda", "--kvstore", "none", "--epochs", "2",
                                   "--image-size", "16"], capfd)
    assert code == 2 and len(lines) == 1, lines
    assert "epoch-0001" in lines[0] and "trained on 10 classes" in lines[0], lines[0]
    assert f"only in the checkpoint: {rename}; only in --data-dir: zzz" in lines[0], lines[0]
    assert folder_digest(out_dir) == before


def _damage_records(pack, count):
    """Overwrite `count` records of train.rec in the middle (their heads included)."""
    with open(os.path.join(pack, "train.idx")) as src:
        offsets = sorted(int(line.split("\t")[1]) for line in src if line.strip())
    middle = len(offsets) // 2
    with open(os.path.join(pack, "train.rec"), "r+b") as rec:
        rec.seek(offsets[middle])
        rec.write(os.urandom(offsets[middle + count] - offsets[middle]))


def test_a_pack_without_class_names_trains_past_damaged_records(pack_copy, capfd):
    """No classes.txt (as im2rec leaves a pack once train.lst is gone): the classes are
    counted from the records' labels, and a damaged record is passed over there as in
    training (it ended the run with a traceback)."""
    os.remove(os.path.join(pack_copy, "classes.txt"))
    _damage_records(pack_copy, 4)
    code, lines = main_in_process(["--dataset", "recordio", "--data-dir", pack_copy,
                                   "--model", "mlp", *ARGS], capfd)
    assert code == 0, lines
    assert not any("Traceback" in line for line in lines), lines


@pytest.mark.parametrize("classes", [True, False], ids=["classes.txt", "no-classes"])
def test_an_index_not_made_for_its_pack_is_named(pack_copy, capfd, classes):
    """Every offset of train.idx moved by 8 bytes (an index of another pack): refused as an
    index that does not match, not blamed on the class list."""
    idx = os.path.join(pack_copy, "train.idx")
    with open(idx) as src:
        rows = [line.split("\t") for line in src if line.strip()]
    with open(idx, "w") as out:
        out.writelines(f"{key}\t{int(offset) + 8}\n" for key, offset in rows)
    if not classes:
        os.remove(os.path.join(pack_copy, "classes.txt"))
    code, lines = main_in_process(["--dataset", "recordio", "--data-dir", pack_copy, *ARGS],
                                  capfd)
    # Without classes.txt the warning that labels are being counted comes first.
    assert code == 2 and len(lines) == (1 if classes else 2), lines
    line = lines[-1]
    assert line.startswith("hvdtrain: error: "), lines
    assert f"does not match its index {idx}" in line and "re-pack" in line, line


def test_lines_before_the_store_carry_the_launchers_rank(pack_copy, capfd, monkeypatch):
    """A warning logged while the data opens, before the store knows the rank, is tagged
    with the rank the launcher gave this process (it said [rank 0] on every rank)."""
    from hvdtrain.report.log import launch_rank
    assert launch_rank({}) == 0
    assert launch_rank({"OMPI_COMM_WORLD_RANK": "3"}) == 3
    assert launch_rank({"HOROVOD_RANK": "2", "OMPI_COMM_WORLD_RANK": "5"}) == 2
    os.remove(os.path.join(pack_copy, "classes.txt"))
    monkeypatch.setenv("HOROVOD_RANK", "1")
    code, lines = main_in_process(["--dataset", "recordio", "--data-dir", pack_copy,
                                   "--model", "mlp", *ARGS], capfd)
    assert code == 0, lines
    warning = [l for l in lines if "has no classes.txt" in l]
    assert len(warning) == 1 and "[rank 1] WARNING" in warning[0], lines
