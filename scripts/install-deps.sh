#!/usr/bin/env bash
# Install everything hvdtrain needs into ./.venv: Debian's Open MPI and sshd, MXNet 1.9.1,
# and Horovod 0.28.1 built from source against that MXNet. Idempotent: a second run only
# checks, and the Horovod wheel is cached so it is built once per machine.
#
# Usage: scripts/install-deps.sh [--gpu] [--no-apt] [--venv DIR] [--system]
#   --gpu      mxnet-cu112 and Horovod with NCCL (needs CUDA 11.2 and NCCL, as in our Dockerfile)
#   --no-apt   skip the Debian packages (they are already there, or you are not root)
#   --venv DIR virtual environment to create or reuse (default: .venv in the repo)
#   --system   install into the current Python instead of a venv (the Docker image does this)
# Environment: HVDTRAIN_WHEEL_CACHE (default ~/.cache/hvdtrain/wheels) holds built wheels.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
gpu=0
apt=1
venv="$here/.venv"
system=0
while [ $# -gt 0 ]; do
  case "$1" in
    --gpu) gpu=1 ;;
    --no-apt) apt=0 ;;
    --venv) venv="$2"; shift ;;
    --system) system=1 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
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

if [ "$gpu" = 1 ]; then mx_pkg=mxnet-cu112; extra=gpu; else mx_pkg=mxnet; extra=cpu; fi

# What the Python side was installed from; when it has not changed, there is nothing to do.
stamp_file="$("$py" -c 'import sys; print(sys.prefix)')/.hvdtrain-deps"
stamp=$(cat "$0" "$constraints" "$here/setup.cfg" | sha256sum | cut -c1-16)-$extra
if [ "$(cat "$stamp_file" 2>/dev/null)" = "$stamp" ] && "$py" -c 'import hvdtrain' 2>/dev/null; then
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

hvd_ok() {
  "$py" - <<'PY' 2>/dev/null
import horovod
import horovod.mxnet as hvd  # fails unless Horovod was built with MXNet support
assert horovod.__version__ == "0.28.1" and hvd.gloo_built() and hvd.mpi_built()
PY
}

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
  hvd_ok || { log "Horovod installed but horovod.mxnet does not import with MXNet, Gloo and MPI"; exit 1; }
fi

"${pip[@]}" install -c "$constraints" -e "$here[$extra,test,demo]"
echo "$stamp" > "$stamp_file"
log "ready: $("$py" -c 'import mxnet, horovod, numpy; print("mxnet", mxnet.__version__, "horovod", horovod.__version__, "numpy", numpy.__version__)')"
