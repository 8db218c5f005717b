"""One rank fails at each cross-rank site (store/sites.py), through the harness's switch
``HVDTRAIN_FAULT_AT=<site>:<rank>:<n>``: every rank of the job is out, non-zero, within
``--stall-timeout`` + 30 s, with a line naming the cause, and every checkpoint and metrics
line written before the fault is whole.

At an ``agree`` site the failure travels in the site's collective: every rank prints the
same line. At a ``data`` site (the step's own exchange: no verdict rides it) the failing rank
prints its line and leaves; mpirun then stops the others (their line: the SIGTERM it sent),
as a rank that dies there would. Sites this small job cannot reach are faulted in a
program that reaches them (PROGRAM_SITES), or listed in ELSEWHERE with the test that makes a
rank fail there (or, said so, only reaches the site); the pulse's failure the job outlives
(OUTLIVED); a registry entry in none fails test_every_site_has_a_fault_test. The job: digits, bn_cnn, 2 epochs of 2 ranks (the sharded
sites: 3), a checkpoint every 5 steps, --clip-grad-norm, --stall-timeout 20: about 16 s a
site at a load of 10 (docs/reliability.md, "Agree, then act")."""
import json
import os
import re
import sys
import time

import mxnet as mx
import numpy as np
import pytest
from PIL import Image

from hvdtrain.models import build_model
from hvdtrain.state.checkpoint_files import changed_files, is_complete, read_meta
from hvdtrain.store.sites import FAULT_ENV, SITES
from helpers import run_command, tool
from jobs import DIGITS, HERE, launcher

pytestmark = pytest.mark.dist
STALL_S = 20
TAG = re.compile(r"\[1,\d+\]<std\w+>:")  # mpirun's tags, wherever they fall
FLAGS = DIGITS + ["--model", "bn_cnn", "--epochs", "2", "--batch-size", "64",
                  "--checkpoint-every", "5steps", "--clip-grad-norm", "5",
                  "--stall-timeout", str(STALL_S)]
# site -> (its n-th call fails, ranks, extra flags); kept in the suite's default run: one
# of each kind (the rest are marked slow: a job each).
SITES_IN_JOB = {
    "run_dir_agreement": (1, 2, []),
    "stop_vote": (1, 2, []),
    "outputs_written": (2, 2, []),
    "replica_digests": (2, 2, []),
    "step_counts": (3, 2, []),
    "train_step": (3, 2, []),  # counts made before the last pass (clipping), sent after
    "finite_check": (3, 2, []),
    "grad_norm": (3, 2, []),
    "train_totals": (1, 2, []),
    "metric_sums": (2, 2, []),
    "running_stats": (2, 2, []),
    "shard_stale": (3, 3, ["--shard-optimizer"]),
}
FAST = {"stop_vote", "step_counts", "shard_stale"}
ELSEWHERE = {
    "batch_sampler_draw": "test_batch_samplers.py::test_a_sampler_shuffled_otherwise_on_each_"
                          "rank_before_fit_is_refused_on_every_rank",
    "checkpoint_handler.resume": "test_estimator_handlers.py::test_a_checkpoint_rank_0_"
                                 "cannot_read_stops_every_rank_in_one_line",
    "evaluate_usable": "test_evaluate_alone.py::test_evaluate_alone_on_a_rank_with_no_usable_"
                       "sample_stops_every_rank_alike",
    "shard_save": "test_shard_agree.py::test_a_failed_save_on_one_of_three_ranks_stops_"
                  "every_rank_with_the_same_line",
    "horovod_step": "test_horovod_face.py::test_a_frozen_or_dead_rank_ends_every_rank_"
                    "within_the_stall_timeout[fault] (hvdtrain.horovod's step)",
    "elastic.commit": "test_elastic.py::test_a_rank_failing_inside_a_sharded_commit_leaves_"
                      "the_others_the_last_whole_commit (3 ranks, --elastic "
                      "--shard-optimizer: the others roll back and go on)",
}


IMAGE_FLAGS = ["--dataset", "imagefolder", "--data-dir", "IMAGES", "--image-size", "16",
               "--no-cuda", "--log-interval", "0", "--stall-timeout", str(STALL_S)]
# Sites the job above does not reach, faulted in a program that does (its command after the
# launcher; OUT: a fresh folder): the same checks, without the job's stall bound and outputs.
# The peers stopped by the launcher say so in a line where hvdtrain's signal handling runs
# (fit, hvdtrain-check); a bare program, or evaluate() alone, dies silently (mpirun names
# the failed rank): PEERS_SILENT.
PROGRAM_SITES = {
    "replica_values": [sys.executable, os.path.join(HERE, "replica_sizes_program.py"),
                       "values"],  # values that differ: the check sums rank 0's, then gaps
    "replica_gaps": [sys.executable, os.path.join(HERE, "replica_sizes_program.py"),
                     "values"],
    "checkpoint_handler.files": [sys.executable, os.path.join(HERE, "handler_program.py"),
                                 "resume", "OUT"],  # rank 0's checkpoint, broadcast
    "check": [tool("hvdtrain-check"), "--rounds", "1", "--size-mb", "0.1"],
    "metric_records": [sys.executable, os.path.join(HERE, "metric_fault_program.py")],
    # WEIGHTS: an untrained bn_cnn's parameters, written by the test
    "eval_report": [tool("hvdtrain"), "--eval-only", "--init-from", "WEIGHTS", "--model",
                    "bn_cnn"] + DIGITS + ["--stall-timeout", str(STALL_S)],
    # IMAGES: a small image folder the test writes (a streamed loader: what it left out is
    # counted), WEIGHTS then an untrained pool_cnn's
    "eval_skipped": [tool("hvdtrain"), "--eval-only", "--init-from", "WEIGHTS", "--model",
                     "pool_cnn"] + IMAGE_FLAGS,
    "skipped_samples": [tool("hvdtrain"), "--model", "pool_cnn", "--epochs", "1",
                        "--batch-size", "4", "--output-dir", "OUT"] + IMAGE_FLAGS,
}
PEERS_SILENT = {"replica_values", "replica_gaps", "metric_records", "eval_report",
                "eval_skipped"}
# Sites whose failure on one rank the job outlives: faulted in the job, which must end well.
OUTLIVED = {"hvdtrain.pulse": "test_a_pulse_round_failing_on_one_rank_is_made_again"}


def test_every_site_has_a_fault_test():
    """Every ``agree`` and ``data`` entry of the registry is faulted here or elsewhere."""
    decided = {name for name, (kind, _) in SITES.items() if kind != "store"}
    tested = set(SITES_IN_JOB) | set(ELSEWHERE) | set(OUTLIVED) | set(PROGRAM_SITES)
    assert decided == tested, decided ^ tested


def _cases():
    for site, (nth, ranks, extra) in SITES_IN_JOB.items():
        marks = () if site in FAST else (pytest.mark.slow,)
        yield pytest.param(site, nth, ranks, extra, marks=marks, id=site)


@pytest.mark.parametrize("site, nth, ranks, extra", list(_cases()))
def test_one_rank_failing_at_a_site_ends_every_rank_in_one_line(tmp_path, site, nth, ranks,
                                                                 extra):
    out = tmp_path / "run"
    env = dict(os.environ, **{FAULT_ENV: f"{site}:1:{nth}"})
    started = time.monotonic()
    proc = run_command(launcher("ranks", ranks) + ["-x", FAULT_ENV, tool("hvdtrain")]
                       + FLAGS + extra + ["--output-dir", str(out)],
                       timeout=STALL_S + 30 + 60, env=env)
    took = time.monotonic() - started
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout, proc.stdout[-3000:]
    cause = f"fault injected at {site} on rank 1 ({FAULT_ENV})"
    lines = {rank: [TAG.sub("", l.split(">:", 1)[1]) for l in proc.stdout.splitlines()
                    if l.startswith(f"[1,{rank}]") and re.search(r"error|SIGTERM", l)]
             for rank in range(ranks)}
    assert lines[1] and cause in lines[1][-1], lines
    if SITES[site][0] == "agree":  # the same line on every rank
        want = f"hvdtrain: error: {cause} (rank 1; every rank stopped at {site})"
        assert all(lines[r] == [want] for r in range(ranks)), lines
    else:  # the others: stopped by the launcher (mpirun's SIGTERM), saying so
        assert all(lines[r] for r in range(ranks)), lines
    # Every rank out within the bound (the job's start-up included).
    assert took < STALL_S + 30 + 30, took
    _assert_outputs_whole(out)


@pytest.mark.slow
@pytest.mark.parametrize("site", sorted(PROGRAM_SITES))
def test_one_rank_failing_at_a_site_of_a_program_ends_every_rank_in_one_line(tmp_path,
                                                                             site):
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, **{FAULT_ENV: f"{site}:1"})
    weights, images = tmp_path / "weights.params", tmp_path / "images"
    if "IMAGES" in PROGRAM_SITES[site]:
        _write_images(images)
    if "WEIGHTS" in PROGRAM_SITES[site]:
        model, shape = ("pool_cnn", (1, 3, 16, 16)) if "IMAGES" in PROGRAM_SITES[site] \
            else ("bn_cnn", (1, 1, 8, 8))
        net = build_model(model, len(CLASSES) if model == "pool_cnn" else 10)
        net.initialize(mx.init.Xavier())
        net(mx.nd.zeros(shape))
        net.save_parameters(str(weights))
    command = [{"OUT": str(out), "WEIGHTS": str(weights), "IMAGES": str(images)}.get(p, p)
               for p in PROGRAM_SITES[site]]
    proc = run_command(launcher("ranks", 2) + ["-x", FAULT_ENV] + command, timeout=90,
                       env=env)
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout, proc.stdout[-3000:]
    lines = {rank: [TAG.sub("", l.split(">:", 1)[1]) for l in proc.stdout.splitlines()
                    if l.startswith(f"[1,{rank}]") and re.search(r"error|SIGTERM", l)]
             for rank in range(2)}
    cause = f"fault injected at {site} on rank 1 ({FAULT_ENV})"
    assert lines[1] and cause in lines[1][-1], lines
    assert lines[0] or site in PEERS_SILENT, lines  # stopped in the program's sum


CLASSES = ("ant", "bee", "cat")


def _write_images(root):
    """16x16 PNGs: 4 a class to train on, 2 to validate, and an empty file among the
    latter (left out, counted)."""
    rng = np.random.default_rng(2)
    for split, count in (("train", 4), ("val", 2)):
        for name in CLASSES:
            os.makedirs(root / split / name)
            for i in range(count):
                Image.fromarray(rng.integers(0, 255, (16, 16, 3)).astype(np.uint8)).save(
                    root / split / name / f"{i}.png")
    (root / "val" / "bee" / "9-empty.png").write_bytes(b"")


def _assert_outputs_whole(out):
    """Every metrics line parses; every checkpoint folder is complete and matches its
    digests; ``latest`` names one of them."""
    metrics = out / "metrics.jsonl"
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            json.loads(line)
    folder = out / "checkpoints"
    if not folder.exists():
        return
    names = sorted(n for n in os.listdir(folder) if n.startswith("epoch-"))
    for name in names:
        path = str(folder / name)
        assert is_complete(path) and not changed_files(path, read_meta(path)), name
    if (folder / "latest").exists():
        assert (folder / "latest").read_text().strip() in names


@pytest.mark.slow
def test_a_pulse_round_failing_on_one_rank_is_made_again(tmp_path):
    """The watchdog's pulse (its own thread and sum) fails one round on rank 1: rank 1 says
    so in one line and makes the round again, and the job ends well. Before, rank 1's pulse
    left and rank 0's waited in that round for ever: at the healthy job's end every rank's
    watchdog fired after --stall-timeout, each blaming the other, and the job exited 1."""
    out = tmp_path / "run"
    env = dict(os.environ, **{FAULT_ENV: "hvdtrain.pulse:1:2"})
    proc = run_command(launcher("ranks", 2) + ["-x", FAULT_ENV, tool("hvdtrain")]
                       + FLAGS + ["--output-dir", str(out)], timeout=STALL_S + 30 + 60, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:]
    said = [l for l in proc.stdout.splitlines() if "job's pulse" in l]
    assert len(said) == 1 and said[0].startswith("[1,1]") and (
        "a round of the job's pulse failed here (fault injected at hvdtrain.pulse on rank 1"
        in said[0]), said
    _assert_outputs_whole(out)
