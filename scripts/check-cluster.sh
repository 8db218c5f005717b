#!/usr/bin/env bash
# Check every host of a hostfile before a multi-host run:
#   scripts/check-cluster.sh [-p SSH_PORT] [-i SSH_KEY] HOSTFILE
# For each host: passwordless ssh, the same Python path with the same hvdtrain (same
# install path), mxnet and horovod versions, `import horovod.mxnet; hvd.init()` working,
# MXNet built with CUDA and Horovod with NCCL (as here), the number of visible GPUs and each
# GPU's name and compute capability (refused outside what mxnet-cu112 runs on). Prints a table
# and a line per GPU; exits non-zero if any host fails.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${HVDTRAIN_PYTHON:-}
if [ -z "$python" ]; then
  if [ -x "$here/.venv/bin/python" ]; then python="$here/.venv/bin/python"; else python=python3; fi
fi
exec "$python" -m hvdtrain.check.cluster "$@"
