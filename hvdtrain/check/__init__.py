"""Pre-flight checks: ``hvdtrain-check`` (every rank, through the job's own launcher) and
``scripts/check-cluster.sh`` (every host of a hostfile, over ssh)."""
