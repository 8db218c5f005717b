"""Checks on the folders and links of an image layout, each refusal one line naming the path
(:class:`~hvdtrain.data.errors.DatasetError`, exit 2)."""
from __future__ import annotations

import os
from collections import Counter
from typing import Dict, List, Tuple

from .errors import DatasetError


def scan(folder: str) -> List[os.DirEntry]:
    """The entries of `folder` (refused in one line when it cannot be listed)."""
    try:
        return list(os.scandir(folder))
    except OSError as err:
        raise DatasetError(f"cannot read {folder}: {err.strerror}; check the path and "
                           f"its permissions") from None


def entry_is(entry: os.DirEntry, kind: str) -> bool:
    """Whether `entry` is a file (or folder), following symbolic links.

    A link that cannot be followed (a loop: ELOOP; no permission; a target that does not
    exist) stops with one line naming
    it rather than being skipped: unlike a corrupt image met mid-epoch, it is a layout error
    found before training, fixed in a second, and skipping it would silently change the
    sample count (torchvision's ImageFolder lists such an entry and fails when it reads it)."""
    try:
        found = entry.is_file() if kind == "file" else entry.is_dir()
        if not found and entry.is_symlink() and not os.path.exists(entry.path):
            # is_file()/is_dir() say False for a link to nothing (an unmounted share):
            # the same layout error, which would drop a class or its images unsaid.
            raise DatasetError(f"cannot follow {entry.path}: it links to "
                               f"{os.readlink(entry.path)}, which does not exist; mount "
                               f"it, or remove or fix that link")
        return found
    except OSError as err:
        raise DatasetError(f"cannot follow {entry.path}: {err.strerror}; remove or fix "
                           f"that link") from None


def class_names(folder: str) -> List[str]:
    """The sorted names of the class folders in `folder`."""
    return sorted(e.name for e in scan(folder) if entry_is(e, "dir"))


def image_files(folder: str, extensions: Tuple[str, ...]) -> Tuple[List[str], Counter]:
    """The image files below `folder` at any depth, as paths relative to it, and a count of
    the files left out (by extension, lowercase; "" for none).

    As torchvision's ``ImageFolder``, an image in a subfolder of a class folder belongs to
    the class. The order is fixed by the names alone: a folder's files (sorted), then each
    subfolder's (sorted by name, depth first). A file is an image when its name ends with
    one of `extensions`, in any case. A linked subfolder that leads back to a folder above
    it is refused in one line: walking it would never end."""
    files: List[str] = []
    left_out: Counter = Counter()
    _walk(folder, "", {_identity(folder): folder}, extensions, files, left_out)
    return files, left_out


def _identity(path: str) -> Tuple[int, int]:
    try:
        found = os.stat(path)
    except OSError as err:
        raise DatasetError(f"cannot read {path}: {err.strerror}; check the path and its "
                           f"permissions") from None
    return found.st_dev, found.st_ino


def _walk(folder: str, prefix: str, above: Dict[Tuple[int, int], str], extensions, files,
          left_out) -> None:
    entries = sorted(scan(folder), key=lambda e: e.name)
    subfolders = []
    for entry in entries:
        if entry.name.lower().endswith(extensions) and entry_is(entry, "file"):
            files.append(prefix + entry.name)
        elif entry_is(entry, "dir"):
            subfolders.append(entry)
        else:
            left_out[os.path.splitext(entry.name)[1].lower()] += 1
    for entry in subfolders:
        identity = _identity(entry.path)
        if identity in above:  # a link (or a bind mount) back up: the walk would not end
            raise DatasetError(f"cannot follow {entry.path}: it leads back to "
                               f"{above[identity]}, a folder above it (a loop); remove or "
                               f"fix that link")
        _walk(entry.path, prefix + entry.name + os.sep, {**above, identity: entry.path},
              extensions, files, left_out)


def check_folder(path: str, what: str) -> None:
    """Refuse `path` in one line saying what is wrong with it: missing, not a folder, or a
    folder this user cannot list (`what` says what it was meant to be)."""
    if not os.path.lexists(path):
        problem = "does not exist"
    elif not os.path.isdir(path):
        problem = "is not a folder"
    elif not os.access(path, os.R_OK | os.X_OK):
        problem = "cannot be read (permission denied)"
    else:
        return
    raise DatasetError(f"{what} {path} {problem}: check the path and its permissions on "
                       f"this host (see docs/data.md)")
