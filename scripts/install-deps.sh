#!/usr/bin/env bash
# Install everything hvdtrain needs into ./.venv: Debian's Open MPI and sshd, MXNet 1.9.1,
# and Horovod 0.28.1 built from source against that MXNet. Idempotent: a second run only
# checks, and the Horovod wheel is cached so it is built once per machine.
#
# Usage: scripts/install-deps.sh [--gpu] [--no-apt] [--venv DIR] [--system] [--deps-only]
#                                [--extras LIST]
#   --gpu         mxnet-cu112 and Horovod with NCCL (needs CUDA 11.2 and NCCL, as in our
#                 Dockerfile); checks that MXNet has CUDA and Horovod has NCCL
#   --no-apt      skip the Debian packages (they are already there, or you are not root)
#   --venv DIR    virtual environment to create or reuse (default: .venv in the repo)
#   --system      install into the current Python instead of a venv
#   --deps-only   everything but hvdtrain itself; needs only this script, check_build.py,
#                 setup.cfg and constraints.txt (the Dockerfile's cached Horovod layer)
#   --extras LIST hvdtrain extras besides cpu/gpu (default: test,demo)
# Environment: HVDTRAIN_WHEEL_CACHE (default ~/.cache/hvdtrain/wheels) holds built wheels.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
gpu=0
apt=1
venv="$here/.venv"
system=0
deps_only=0
extras=test,demo
while [ $# -gt 0 ]; do
  case "$1" in
    --gpu) gpu=1 ;;
    --no-apt) apt=0 ;;
    --venv) venv="$2"; shift ;;
    --system) system=1 ;;
    --deps-only) deps_only=1 ;;
    --extras) extras="$2"; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "install-deps.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

log() { echo "install-deps: $*" >&2; }

debs=(openmpi-bin libopenmpi-dev openssh-server openssh-client rsync procps)
if [ "$apt" = 1 ]; then
  missing=()
  for pkg in "${debs[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "apt-get install ${missing[*]}"
    sudo_=""
    [ "$(id -u)" = 0 ] || sudo_="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo_ apt-get update -qq
    $sudo_ apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

if [ "$system" = 1 ]; then
  py=$(command -v python3)
else
  if [ ! -x "$venv/bin/python" ]; then
    log "creating $venv"
    python3 -m venv "$venv"
  fi
  py="$venv/bin/python"
fi
pip=("$py" -m pip --disable-pip-version-check -q)
constraints="$here/constraints.txt"
check_build="$here/scripts/check_build.py"

if [ "$gpu" = 1 ]; then mx_pkg=mxnet-cu112; extra=gpu; else mx_pkg=mxnet; extra=cpu; fi
build_flags=()
if [ "$gpu" = 1 ]; then build_flags=(--gpu); fi

# What the Python side was installed from; when it has not changed, there is nothing to do.
stamp_file="$("$py" -c 'import sys; print(sys.prefix)')/.hvdtrain-deps"
stamp=$(cat "$0" "$check_build" "$constraints" "$here/setup.cfg" | sha256sum | cut -c1-16)-$extra-$extras
if [ "$deps_only" = 0 ] && [ "$(cat "$stamp_file" 2>/dev/null)" = "$stamp" ] \
    && "$py" -c 'import hvdtrain' 2>/dev/null; then
  log "up to date ($stamp_file)"
  exit 0
fi

# pip, setuptools and wheel before anything else: Ubuntu 20.04's venv (the CUDA 11.2 image)
# starts with pip 20.0.2, which cannot install a pyproject.toml project in editable mode.
# constraints.txt pins them to the versions Horovod 0.28.1 is known to build with.
"${pip[@]}" install -c "$constraints" --upgrade pip setuptools wheel
# Build tools next: Horovod is built with --no-build-isolation against them.
"${pip[@]}" install -c "$constraints" 'cmake>=3.13'
"${pip[@]}" install -c "$constraints" "$mx_pkg" "numpy>=1.16,<1.24"

# Horovod 0.28.1 with MXNet, Gloo and MPI (and, with --gpu, NCCL in Horovod, CUDA in MXNet).
hvd_ok() { "$py" "$check_build" "${build_flags[@]}" >/dev/null 2>&1; }

if ! hvd_ok; then
  cache="${HVDTRAIN_WHEEL_CACHE:-$HOME/.cache/hvdtrain/wheels}/$extra-$("$py" -c 'import sys; print("py%d%d" % sys.version_info[:2])')"
  mkdir -p "$cache"
  wheel=$(ls "$cache"/horovod-0.28.1-*.whl 2>/dev/null | head -n 1 || true)
  if [ -z "$wheel" ]; then
    log "building Horovod 0.28.1 against $mx_pkg (a few minutes; cached in $cache)"
    export HOROVOD_WITH_MXNET=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 \
           HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1
    # pip's cmake 4 refuses the cmake_minimum_required of Horovod's bundled gloo otherwise.
    export CMAKE_POLICY_VERSION_MINIMUM=3.5
    if [ "$gpu" = 1 ]; then export HOROVOD_GPU_OPERATIONS=NCCL; fi
    export MAKEFLAGS="-j$(nproc)"
    "${pip[@]}" wheel --no-build-isolation --no-deps --no-binary horovod \
        -c "$constraints" -w "$cache" horovod==0.28.1
    wheel=$(ls "$cache"/horovod-0.28.1-*.whl | head -n 1)
  fi
  # --no-deps: Horovod's own requirements are installed below from hvdtrain's, never an mxnet
  # extra that would pull the CPU wheel over mxnet-cu112.
  "${pip[@]}" install --no-deps --force-reinstall "$wheel"
  "${pip[@]}" install -c "$constraints" cloudpickle psutil pyyaml packaging
  "$py" "$check_build" "${build_flags[@]}" || { log "MXNet or Horovod is not built as hvdtrain needs (above)"; exit 1; }
fi

# mpi4py (hvdtrain-check, HorovodKVStore(comm=...)) built from source with the system's mpicc,
# so it talks to the same Open MPI as Horovod and mpirun, not to an MPI a binary wheel expects.
# A wheel built here is tagged linux_*, PyPI's are manylinux_*. pip caches the wheel it builds:
# later venvs on this machine install it in seconds.
mpi4py_ok() {
  "$py" - <<'PY' 2>/dev/null
from importlib.metadata import distribution
from mpi4py import MPI
assert MPI.Get_library_version().startswith("Open MPI")
assert "manylinux" not in distribution("mpi4py").read_text("WHEEL")
PY
}
if ! mpi4py_ok; then
  log "building mpi4py against $(command -v mpicc || echo 'no mpicc: install libopenmpi-dev')"
  "${pip[@]}" install -c "$constraints" --force-reinstall --no-deps --no-binary mpi4py 'mpi4py>=3.1'
  mpi4py_ok || { log "mpi4py installed but does not load the system Open MPI"; exit 1; }
fi

if [ "$deps_only" = 1 ]; then
  # hvdtrain's requirements, read from setup.cfg: install_requires and the extras.
  mapfile -t reqs < <("$py" - "$here/setup.cfg" "$extra" ${extras//,/ } <<'PY'
import configparser
import sys

cfg = configparser.ConfigParser()
cfg.read(sys.argv[1])
lines = cfg["options"]["install_requires"].splitlines()
for name in sys.argv[2:]:
    lines += cfg["options.extras_require"][name].splitlines()
print("\n".join(sorted({line.strip() for line in lines if line.strip()})))
PY
)
  "${pip[@]}" install -c "$constraints" "${reqs[@]}"
  summary=$("$py" "$check_build" "${build_flags[@]}")
  log "ready without hvdtrain itself: ${summary#check_build: ok: }"
  exit 0
fi

"${pip[@]}" install -c "$constraints" -e "$here[$extra${extras:+,$extras}]"
summary=$("$py" "$check_build" "${build_flags[@]}")
echo "$stamp" > "$stamp_file"
log "ready: ${summary#check_build: ok: }"
