#!/bin/sh
# Host discovery for horovodrun's elastic mode inside a Slurm allocation:
#   horovodrun -np 8 --min-np 4 --max-np 8 --host-discovery-script examples/elastic/discover-slurm.sh ...
# Names each node of the allocation that Slurm still reports as responding and allocated,
# mixed, idle or completing (not down or drained), with ELASTIC_SLOTS slots each (default:
# SLURM_GPUS_ON_NODE, the GPUs of the node running this script when the job asked for GPUs,
# else 1; set ELASTIC_SLOTS when nodes differ). Submit with "sbatch --no-kill" so that
# Slurm keeps the job when one of its nodes fails.
set -eu
slots="${ELASTIC_SLOTS:-${SLURM_GPUS_ON_NODE:-1}}"
nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST")
# A failing sinfo (the controller unreachable) must fail this script: Horovod keeps the
# current hosts after a failed discovery, but takes an empty list for "no host left".
listed=$(sinfo --noheader --Node --responding --nodes="$SLURM_JOB_NODELIST" \
         --states=allocated,mixed,idle,completing --format=%N) || {
    echo "discover-slurm.sh: sinfo failed; hosts unchanged" >&2
    exit 1
}
healthy=$(printf '%s\n' "$listed" | sort -u)
for node in $nodes; do
    if printf '%s\n' "$healthy" | grep -qx "$node"; then
        echo "$node:$slots"
    fi
done
