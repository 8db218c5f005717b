"""What one rank of a job knows about itself, and how rank 0 judges all of them.

Used by ``hvdtrain-check`` (:mod:`hvdtrain.check.preflight`). Facts are plain JSON-able dicts, so
they travel through mpi4py or through the store alike.
"""
from __future__ import annotations

import collections
import importlib
import os
import platform
import socket
import sys
from typing import Dict, List, Optional, Sequence, Tuple

from ..data.datasets import (CIFAR_RECORD, CIFAR_TEST_FILE, CIFAR_TRAIN_FILES, DatasetError,
                             _cifar_dir)
# Imported before horovod.mxnet is (Pillow must load its libjpeg first: data/transforms.py).
from ..data.streamed import load_images

# Facts every rank must share: a rank that differs runs another install than the rest.
COMPARED = ("python", "hvdtrain", "hvdtrain_path", "mxnet", "mxnet_path", "horovod",
            "horovod_path", "numpy", "numpy_path", "build", "device_kind", "data_id")
PACKAGES = ("hvdtrain", "mxnet", "horovod", "numpy")
COLUMNS = ("rank", "host", "local", "hvdtrain", "mxnet", "horovod", "numpy", "build", "GPUs",
           "device", "data", "status")


def one_line(err: BaseException) -> str:
    """`err`'s type and its message's first line (once: MXNet's errors already start with
    their type)."""
    text = str(err).strip().splitlines()
    first, name = (text[0] if text else ""), type(err).__name__
    return first if first.startswith(f"{name}: ") else f"{name}: {first}"


def image_format(data_dir: str) -> Optional[str]:
    """'recordio' or 'imagefolder' when `data_dir` looks like one, else None (CIFAR-10)."""
    if os.path.exists(os.path.join(data_dir, "train.rec")):
        return "recordio"
    if os.path.isdir(os.path.join(data_dir, "train")):
        return "imagefolder"
    return None


def check_image_dir(data_dir: str, kind: str) -> Tuple[str, str, Optional[str]]:
    """Whether `data_dir` is a readable image folder or pack: (cell text, identity, problem).

    The identity (sample counts and checksums of the file list or ``.idx``) must be the same
    on every rank; its first record of each split is read."""
    try:
        data = load_images(kind, data_dir)
        for split in (data.train, data.test):
            split.read(0)
    except (DatasetError, Exception) as err:  # pylint: disable=broad-except
        return "FAIL", "-", str(err) if isinstance(err, DatasetError) else one_line(err)
    identity = data.fingerprint().replace(" ", "").replace(",", "/")
    return f"{kind}({data.num_train}+{data.num_test})", identity, None


def check_data_dir(data_dir: str) -> Tuple[str, Optional[str]]:
    """Whether `data_dir` holds readable CIFAR-10 binary files: (cell text, problem or None).

    Reads each file's first record and checks its size, without loading the whole set.
    """
    folder = _cifar_dir(data_dir)
    if not os.path.isdir(folder):
        return "FAIL", f"--data-dir {data_dir} is not a folder on this host"
    total = 0
    for name in CIFAR_TRAIN_FILES + (CIFAR_TEST_FILE,):
        path = os.path.join(folder, name)
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as handle:
                handle.read(CIFAR_RECORD)
        except OSError as err:
            return "FAIL", f"cannot read {path}: {err.strerror}"
        if size == 0 or size % CIFAR_RECORD:
            return "FAIL", f"{path} is not a whole number of CIFAR-10 records"
        total += size
    return f"ok({total / 1e6:.1f}MB)", None


def collect(rank: int, local_rank: int, data_dir: Optional[str] = None,
            no_cuda: bool = False) -> Dict:
    """This process's facts: where it runs, what it imports, what it would compute on."""
    facts = {"rank": rank, "local": local_rank, "host": socket.gethostname(),
             "python": f"{platform.python_version()} {sys.executable}", "problems": []}
    problems = facts["problems"]
    for name in PACKAGES:
        try:
            module = importlib.import_module(name)
            facts[name] = str(module.__version__)
            facts[f"{name}_path"] = os.path.dirname(os.path.abspath(module.__file__))
        except Exception as err:  # pylint: disable=broad-except  (reported, not raised)
            facts[name] = "-"
            problems.append(f"cannot import {name}: {one_line(err)}")
    facts["build"] = _horovod_build(problems)
    facts.update(_device(local_rank, no_cuda, problems))
    facts["data"], facts["data_id"] = "-", "-"
    if data_dir and image_format(data_dir):
        facts["data"], facts["data_id"], problem = check_image_dir(data_dir,
                                                                   image_format(data_dir))
        if problem:
            problems.append(problem)
    elif data_dir:
        facts["data"], problem = check_data_dir(data_dir)
        if problem:
            problems.append(problem)
    return facts


def _horovod_build(problems: List[str]) -> str:
    """Which controllers and GPU collectives Horovod was built with, e.g. ``MPI+Gloo``."""
    try:
        import horovod.mxnet as hvd  # fails unless Horovod was built with MXNet support
    except Exception as err:  # pylint: disable=broad-except
        problems.append(f"horovod.mxnet does not load: {one_line(err)}")
        return "-"
    parts = [name for name, built in (("MPI", hvd.mpi_built()), ("Gloo", hvd.gloo_built()),
                                      ("NCCL", hvd.nccl_built())) if built]
    return "+".join(parts) or "none"


def _device(local_rank: int, no_cuda: bool, problems: List[str]) -> Dict:
    """Visible GPUs and the device a training of this rank would use (the rule of
    :func:`hvdtrain.store.dist.select_devices`)."""
    try:
        import mxnet as mx
        from ..store.dist import select_devices
        visible = mx.context.num_gpus()
    except Exception as err:  # pylint: disable=broad-except
        problems.append(f"cannot list devices: {one_line(err)}")
        return {"GPUs": "-", "device": "-", "device_kind": "-"}
    try:
        # No GPU visible: select_devices' own CPU fallback, without its warning.
        device = select_devices(local_rank, no_cuda=no_cuda or visible == 0)[0]
    except ValueError as err:  # its GPU is not there (more ranks than GPUs on the host)
        problems.append(str(err))
        return {"GPUs": str(visible), "device": "FAIL", "device_kind": "gpu"}
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    return {"GPUs": str(visible) + (f"(CUDA_VISIBLE_DEVICES={cvd})" if cvd is not None else ""),
            "device": str(device), "device_kind": device.device_type,
            "device_id": device.device_id if device.device_type == "gpu" else -1}


def _reference(values: Sequence):
    """The value most ranks hold; on a tie, the one of the lowest rank among the tied."""
    counts = collections.Counter(values)
    return max(values, key=lambda v: (counts[v], -values.index(v)))


def judge(ranks: Sequence[Dict]) -> Tuple[Dict[str, str], Dict[int, List[str]]]:
    """Compare every rank with the rest.

    Returns
    -------
    reference : dict
        The value most ranks share, for each compared fact.
    problems : dict
        rank -> what is wrong with it (its own problems and where it differs); empty if fine.
    """
    reference = {key: _reference([r.get(key, "-") for r in ranks]) for key in COMPARED}
    problems = {r["rank"]: list(r["problems"]) for r in ranks}
    for r in ranks:
        for key in COMPARED:
            if r.get(key, "-") != reference[key]:
                problems[r["rank"]].append(f"{key} {r.get(key, '-')} (most ranks: "
                                           f"{reference[key]})")
    return reference, problems


def format_report(ranks: Sequence[Dict]) -> Tuple[str, List[int]]:
    """The table rank 0 prints, and the ranks that differ or cannot run a job.

    No cell holds a space, so each row splits into its columns.
    """
    reference, problems = judge(ranks)
    rows = []
    for r in ranks:
        row = {c: str(r.get(c, "-")) for c in COLUMNS}
        row["status"] = "ok" if not problems[r["rank"]] else "FAIL"
        rows.append(row)
    widths = {c: max(len(c), *(len(row[c]) for row in rows)) for c in COLUMNS}
    lines = ["install most ranks share: python " + reference["python"]]
    lines += [f"  {name} {reference[name]} at {reference[name + '_path']}" for name in PACKAGES]
    lines.append("  ".join(c.ljust(widths[c]) for c in COLUMNS).rstrip())
    lines += ["  ".join(row[c].ljust(widths[c]) for c in COLUMNS).rstrip() for row in rows]
    failed = [rank for rank in sorted(problems) if problems[rank]]
    for rank in failed:
        host = next(r["host"] for r in ranks if r["rank"] == rank)
        lines.append(f"rank {rank} ({host}): " + "; ".join(problems[rank]))
    lines.append(f"{len(ranks) - len(failed)} of {len(ranks)} ranks ready" +
                 (f"; ranks that differ or cannot run a job: {', '.join(map(str, failed))}"
                  if failed else ""))
    return "\n".join(lines), failed
