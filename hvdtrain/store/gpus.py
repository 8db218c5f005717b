"""Which GPUs this host has, and whether MXNet's CUDA build can run on them.

mxnet-cu112 1.9.1 carries machine code (SASS) for compute capabilities 5.0, 6.0, 7.0, 8.0
and 8.6 and no PTX, so the driver cannot compile kernels for a newer architecture. CUDA runs
code built for X.y on any GPU of capability X.z with z >= y; hence the range below. On a GPU
outside it (Hopper 9.0 and newer, or Kepler), the first GPU operation would fail with "no
kernel image is available for execution on the device"; hvdtrain stops before that with one
line instead.
"""
from __future__ import annotations

import ctypes
import subprocess
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from ..config import ConfigError

# Read off the .nv_fatbin section of mxnet-cu112 1.9.1's libmxnet.so (SASS only, no PTX).
KERNEL_ARCHS: Tuple[Tuple[int, int], ...] = ((5, 0), (6, 0), (7, 0), (8, 0), (8, 6))
SUPPORTED_RANGE = "5.0-8.9"  # every X.z with a kernel for some X.y, y <= z (see runs_on)

# cuDeviceGetAttribute attribute ids (cuda.h).
_CU_ATTR_CC_MAJOR, _CU_ATTR_CC_MINOR = 75, 76


@dataclass(frozen=True)
class Gpu:
    """One GPU as CUDA numbers it (the ordinal ``mx.gpu(index)`` uses)."""

    index: int
    name: str
    capability: Tuple[int, int]

    @property
    def capability_text(self) -> str:
        return "%d.%d" % self.capability


def runs_on(capability: Tuple[int, int]) -> bool:
    """Whether MXNet's kernels run on a GPU of compute `capability` (major, minor)."""
    major, minor = capability
    return any(k_major == major and k_minor <= minor for k_major, k_minor in KERNEL_ARCHS)


def read_gpus() -> List[Gpu]:
    """The GPUs CUDA shows this process (honours CUDA_VISIBLE_DEVICES), or [] if none.

    Asks the CUDA driver (libcuda) directly: no context is created and no GPU memory used.
    Falls back to ``nvidia-smi`` (which numbers GPUs in PCI order) when libcuda does not load.
    """
    try:
        return _read_from_driver()
    except (OSError, RuntimeError):
        return _read_from_nvidia_smi()


def _read_from_driver() -> List[Gpu]:
    cuda = ctypes.CDLL("libcuda.so.1")

    def call(result):
        if result != 0:
            raise RuntimeError("CUDA driver error %d" % result)

    call(cuda.cuInit(0))
    count = ctypes.c_int()
    call(cuda.cuDeviceGetCount(ctypes.byref(count)))
    found = []
    for index in range(count.value):
        device, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        name = ctypes.create_string_buffer(256)
        call(cuda.cuDeviceGet(ctypes.byref(device), index))
        call(cuda.cuDeviceGetName(name, len(name), device))
        call(cuda.cuDeviceGetAttribute(ctypes.byref(major), _CU_ATTR_CC_MAJOR, device))
        call(cuda.cuDeviceGetAttribute(ctypes.byref(minor), _CU_ATTR_CC_MINOR, device))
        found.append(Gpu(index, name.value.decode(errors="replace"),
                         (major.value, minor.value)))
    return found


def _read_from_nvidia_smi() -> List[Gpu]:
    try:
        proc = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if proc.returncode != 0:
        return []
    found = []
    for index, line in enumerate(l for l in proc.stdout.splitlines() if l.strip()):
        name, _, cap = line.rpartition(",")
        try:
            major, minor = (int(v) for v in cap.strip().split("."))
        except ValueError:  # an old driver answers "[Not Supported]" for compute_cap
            continue
        found.append(Gpu(index, name.strip(), (major, minor)))
    return found


def check_supported(indices: Sequence[int], gpus: Optional[List[Gpu]] = None) -> None:
    """Raise :class:`ConfigError` naming the first GPU in `indices` MXNet cannot run on.

    `gpus` defaults to :func:`read_gpus`; a GPU whose capability cannot be read passes.
    """
    by_index = {gpu.index: gpu for gpu in (read_gpus() if gpus is None else gpus)}
    for index in indices:
        gpu = by_index.get(index)
        if gpu is not None and not runs_on(gpu.capability):
            raise ConfigError(
                f"GPU {index} ({gpu.name}) has compute capability {gpu.capability_text}; "
                f"mxnet-cu112 1.9.1 runs on compute capability {SUPPORTED_RANGE} only "
                f"(Maxwell to Ada; not Hopper or newer): use such GPUs, or --no-cuda")
