#!/bin/sh
# Host discovery for horovodrun's elastic mode inside a Slurm allocation:
#   horovodrun -np 8 --min-np 4 --max-np 8 --host-discovery-script examples/elastic/discover-slurm.sh ...
# Names each node of the allocation that Slurm still reports as responding and not down or
# drained, with ELASTIC_SLOTS slots (default: the GPUs Slurm gave this node, else 1). Submit
# with "sbatch --no-kill" so that Slurm keeps the job when one of its nodes fails.
set -eu
slots="${ELASTIC_SLOTS:-${SLURM_GPUS_ON_NODE:-1}}"
nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST")
healthy=$(sinfo --noheader --Node --responding --nodes="$SLURM_JOB_NODELIST" \
          --states=allocated,mixed,idle,completing --format=%N | sort -u)
for node in $nodes; do
    if printf '%s\n' "$healthy" | grep -qx "$node"; then
        echo "$node:$slots"
    fi
done
