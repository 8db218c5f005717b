"""Every cross-rank call site of hvdtrain: one entry each, the site's name -> where it is
and what it decides or moves.

A collective is made through :func:`~hvdtrain.store.agree.agree` (a decision: the sites
marked ``agree``), through :func:`~hvdtrain.store.agree.fault_point` before a data
exchange the verdict cannot ride (``data``: the step's own exchange, where a failing rank
leaves and Horovod's shut-down or the watchdog's stall bound ends the others), or is a
store's own (``store``). tests/unit/test_agree.py fails when a call site names a
collective that has no entry here; tests/dist/test_agree_faults.py makes one rank fail at
each ``agree`` and ``data`` site (in its job, or a program that reaches the site; the few
it does not fault are listed there, with why) and checks every rank leaves within the
bound, one line each. Names here are the sites'; a collective's full name adds a key every rank has alike
(a metric's name), never a rank's own size, count or path.
"""
from __future__ import annotations

FAULT_ENV = "HVDTRAIN_FAULT_AT"  # "<site>:<rank>": set by the fault test's harness only

SITES = {
    # store/
    "leave": ("store", "store/agree.py, loop/run/together.py: the last collective before a "
                       "stopped job's orderly shutdown"),
    "allreduce": ("store", "store/kvstore.py: the gradients' (and pushpull's) allreduce"),
    "broadcast": ("store", "store/broadcast.py: rank 0's parameters and objects"),
    "shard.reducescatter": ("store", "store/sharded.py: a gradient bucket of fewer elements "
                                    "than ranks, reduce-scattered"),
    "shard.alltoall": ("store", "store/shard_exchange.py: a chunk of a gradient bucket, "
                                "each rank's part sent to it (its reduce-scatter)"),
    "shard.allgather": ("store", "store/sharded.py, shard_exchange.py: the updated slices "
                                 "(chunk by chunk), gathered"),
    "shard.state": ("store", "store/sharded.py, shard_checkpoint.py: the whole optimizer "
                             "state gathered from the slices: on every rank (an elastic "
                             "commit, a re-plan), or chunk by chunk on rank 0 alone "
                             "(shard.state.root: a save)"),
    "shard_stale": ("agree", "store/sharded.py: a trained parameter without a fresh gradient "
                             "on some rank, refused on every rank before the exchange"),
    "shard_save": ("agree", "store/sharded.py: save_states, gathered on every rank, written "
                            "by rank 0"),
    # data/
    "batch_sampler_draw": ("agree", "data/batch_shards.py: every rank's sampler drew the "
                                    "same first epoch"),
    # runtime/, state/, check/
    "hvdtrain.pulse": ("data", "runtime/pulse.py: the watchdog's heartbeat, from its own thread"),
    "run_dir_agreement": ("data", "state/run_dir.py: the output folder free, the same "
                                  "checkpoint found (decided alike from the sums)"),
    "check": ("data", "check/preflight.py: the pre-flight's facts and timed allreduce"),
    # loop/engine
    "step_counts": ("data", "loop/engine/counts.py: the step's counts and votes, riding "
                            "the step's exchange"),
    "train_step": ("agree", "loop/engine/step_verdict.py: a rank's batch or forward and "
                            "backward pass failed; its verdict rode the step's counts"),
    "finite_check": ("data", "loop/engine/guard.py: the loss finite on every rank"),
    "train_totals": ("data", "loop/engine/epoch.py: an epoch's loss sum and sample count"),
    "metric_sums": ("data", "loop/engine/metrics.py: metric states summed"),
    "metric_records": ("data", "loop/engine/metric_exchange.py: metric records gathered"),
    "running_stats": ("data", "loop/engine/replicas.py: running statistics averaged"),
    "grad_norm": ("data", "loop/recipe/clipping.py: the global gradient norm"),
    # loop/run
    "stop_vote": ("agree", "loop/run/boundary.py: stop or end training, at an epoch's end"),
    "outputs_written": ("agree", "loop/run/together.py: rank 0's writes succeeded"),
    "skipped_samples": ("data", "loop/run/outputs.py: samples skipped, summed"),
    "replica_digests": ("agree", "loop/run/replica_check.py: every array's digest"),
    "replica_values": ("data", "loop/run/replica_check.py: rank 0's values of arrays "
                               "that differ"),
    "replica_gaps": ("data", "loop/run/replica_check.py: the largest difference on each rank"),
    # loop/elastic
    "elastic.commit": ("data", "loop/elastic/state.py: a commit's gather of the sharded "
                               "optimizer state"),
    "elastic.sync": ("store", "loop/elastic/state.py: rank 0's state after a reset"),
    # estimator/
    "evaluate_usable": ("agree", "estimator/estimator.py: evaluate() outside fit, every rank "
                                 "with a usable sample"),
    "checkpoint_handler.resume": ("agree", "estimator/checkpoint_handler.py: which "
                                           "checkpoint rank 0 found"),
    "checkpoint_handler.files": ("data", "estimator/checkpoint_handler.py: rank 0's "
                                         "checkpoint bytes"),
    # horovod/
    "horovod_step": ("data", "horovod/trainer.py: every rank's batch_size and the running "
                             "statistics, after the step's exchange (horovod_step); at the "
                             "second step, which arrays no gradient reaches moved "
                             "(horovod_step.moved)"),
    # eval_job, classify
    "eval_skipped": ("data", "eval_job.py: samples --eval-only skipped, summed"),
    "eval_report": ("data", "classify/eval_detail.py: the confusion matrix, summed"),
}


def site_of(name: str):
    """The site a collective's full name belongs to (the longest entry it starts with,
    followed by a '.' or '_' and a key), or None."""
    for site in sorted(SITES, key=len, reverse=True):
        if name == site or name.startswith((site + ".", site + "_")):
            return site
    return None
