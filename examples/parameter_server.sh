#!/usr/bin/env bash
# The same job on MXNet's parameter server: one scheduler, two servers, two workers, all on
# this machine (use -H HOSTFILE for several hosts, see docs/parameter-server.md).
#   examples/parameter_server.sh [more hvdtrain flags...]
set -euo pipefail
exec hvdtrain-launch -n 2 -s 2 \
    hvdtrain --kvstore dist_sync --dataset digits --no-cuda --epochs 10 --lr 0.05 "$@"
