"""``--elastic`` in one process: what it refuses, the folder's lock within one elastic job,
the claim after a reset that renumbered rank 0, and when the loop commits.

The job itself, under Horovod's elastic driver on two loopback hosts, is in
``tests/dist/test_elastic.py``.
"""
import fcntl
import os
import threading
import types

import pytest

from hvdtrain.cli import main, parse_config
from hvdtrain.config import ConfigError
from hvdtrain.state.lock import OutputLock, elastic_job, launch_of
from hvdtrain.state.run_dir import RunDir

QUICK = ["--dataset", "digits", "--no-cuda", "--log-interval", "0"]
ELASTIC_ENV = {"HOROVOD_ELASTIC": "1", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1",
               "HOROVOD_GLOO_RENDEZVOUS_PORT": "4242"}


@pytest.mark.parametrize("flags, message", [
    (["--kvstore", "dist_sync"], "--elastic runs under Horovod's elastic driver: it needs "
                                 "--kvstore horovod"),
    (["--sampling", "contiguous"], "needs --sampling strided"),
    (["--output-dir", "out"], "--elastic with --output-dir needs --resume auto"),
])
def test_what_elastic_needs_of_the_other_options(flags, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(QUICK + ["--elastic"] + flags)


def test_commit_every_without_elastic_is_refused_and_defaults_to_20():
    with pytest.raises(ConfigError, match="--commit-every is the interval of --elastic"):
        parse_config(QUICK + ["--commit-every", "5"])
    assert parse_config(QUICK + ["--elastic"]).commit_interval == 20
    assert parse_config(QUICK + ["--elastic", "--commit-every", "5"]).commit_interval == 5


def test_elastic_outside_the_elastic_driver_is_one_line_and_exit_2(capsys, monkeypatch):
    monkeypatch.delenv("HOROVOD_ELASTIC", raising=False)
    assert main(QUICK + ["--elastic", "--epochs", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["hvdtrain: error: --elastic runs under Horovod's elastic driver: start it "
                   "with horovodrun -np N --min-np M --host-discovery-script SCRIPT "
                   "(docs/elastic.md)"]


@pytest.mark.parametrize("env, flags, refused", [
    ({}, ["--stall-timeout", "30"], "--stall-timeout 30 must be longer than "
                                    "HOROVOD_GLOO_TIMEOUT_SECONDS=30 under --elastic"),
    ({"HOROVOD_GLOO_TIMEOUT_SECONDS": "120"}, [], None),  # 600 > 120: on to the data
    ({"HOROVOD_GLOO_TIMEOUT_SECONDS": "700"}, [], "--stall-timeout 600 must be longer"),
])
def test_the_watchdog_must_wait_longer_than_gloo(capsys, monkeypatch, env, flags, refused):
    """Under --elastic a lost peer is found by Gloo's timeout and the others roll back; a
    watchdog that fired first would end them instead."""
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    monkeypatch.delenv("HOROVOD_GLOO_TIMEOUT_SECONDS", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    import hvdtrain.job as job

    def stop(*_args, **_kwargs):
        raise ConfigError("reached build_dist")
    monkeypatch.setattr(job, "build_dist", stop)
    assert main(QUICK + ["--elastic", "--epochs", "1"] + flags) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert (refused or "reached build_dist") in line, line


def test_the_elastic_job_is_named_by_its_rendezvous():
    assert elastic_job(ELASTIC_ENV) == "10.0.0.1:4242"
    assert elastic_job(dict(ELASTIC_ENV, HOROVOD_ELASTIC="0")) is None
    assert elastic_job({}) is None


def test_a_worker_joining_its_own_elastic_job_is_not_refused_the_folder(tmp_path):
    """The lock rank 0 holds says which elastic job holds it: a worker of that job (which
    joins later and decides on the folder on its own) passes; any other run is refused."""
    holder = OutputLock(str(tmp_path), job="10.0.0.1:4242")
    assert holder.acquire()
    try:
        assert OutputLock(str(tmp_path), job="10.0.0.1:4242").held_by_another() is None
        # settle=0: the holder here is no instant (lock.SETTLE_S).
        other = OutputLock(str(tmp_path), job="10.0.0.1:9999").held_by_another(settle=0)
        assert other and other.endswith("(elastic job 10.0.0.1:4242)")
        assert OutputLock(str(tmp_path)).held_by_another(settle=0) == other
    finally:
        holder.release()


class Layout:
    """A DistContext's claim-facing part: rank `rank` of `count`, the others alike."""

    synchronous = True

    def __init__(self, rank, count=2):
        self.rank, self.num_workers, self.is_root = rank, count, rank == 0
        self.collectives = []

    def sum_across_workers(self, name, values):
        self.collectives.append((name, values.asnumpy().tolist()))
        return values * self.num_workers


def test_a_reset_that_renumbers_rank_0_moves_the_lock(tmp_path, monkeypatch):
    """After a reset the old rank 0, now rank 1, lets the lock go as it claims again, and
    the process that is rank 0 now takes it; positions are not compared (the sync made them
    rank 0's), only the folder's state travels."""
    for name, value in ELASTIC_ENV.items():
        monkeypatch.setenv(name, value)
    cfg = parse_config(QUICK + ["--elastic", "--output-dir", str(tmp_path), "--resume",
                                "auto"])
    first, second = RunDir.decide(cfg), RunDir.decide(cfg)
    old_root = Layout(0)
    first.claim(old_root, elastic=True)
    assert OutputLock(str(tmp_path)).held_by_another(settle=0).endswith(
        "(elastic job 10.0.0.1:4242)")
    assert old_root.collectives == [("run_dir_agreement", [0.0])]
    first.claim(Layout(1), elastic=True)  # renumbered: lets go
    assert OutputLock(str(tmp_path)).held_by_another() is None
    second.claim(Layout(0), elastic=True)  # the new rank 0
    assert OutputLock(str(tmp_path)).held_by_another(settle=0)
    second.claim(Layout(0), elastic=True)  # claiming again while holding it: no refusal
    second.release()
    assert OutputLock(str(tmp_path)).held_by_another() is None


def _classifier_run(cfg, outputs, commit=None, signals=None):
    """The command's run of digits in this process (one rank, no store), as an elastic entry
    makes it: the Estimator's parts handed to the run with `commit` as its hook."""
    import mxnet as mx
    from mxnet import gluon
    from hvdtrain.classify.build import build_loaders, build_trainer, initialize
    from hvdtrain.classify.processor import ClassifierProcessor, train_metrics, val_metrics
    from hvdtrain.data.load import load_dataset
    from hvdtrain.estimator import Estimator, Setup
    from hvdtrain.loop.run.fit import fit
    from hvdtrain.models import build_model
    from hvdtrain.state.train_state import TrainState
    from hvdtrain.store.dist import DistContext

    data = load_dataset("digits", None)
    net = build_model(cfg.model_name, data.num_classes)
    initialize(net, [mx.cpu()], data.image_shape, cfg.seed, 0, cfg.hybridize)
    dist = DistContext()
    trainer = build_trainer(net, cfg, dist)
    train_feed, val_feed = build_loaders(data, cfg, dist, 1)
    estimator = Estimator(net, gluon.loss.SoftmaxCrossEntropyLoss(), train_metrics(),
                          val_metrics(), trainer=trainer, context=[mx.cpu()],
                          batch_processor=ClassifierProcessor(), config=cfg,
                          setup=Setup(dist=dist, prefixes=("train", "test"), base_lr=cfg.lr,
                                      command=True))
    estimator.logger.disabled = True
    run_cfg, feed = estimator.prepare(train_feed, val_feed, epochs=cfg.epochs)
    parts = estimator._run_parts(run_cfg, feed, outputs, TrainState(), None, signals)  # pylint: disable=protected-access
    parts.commit = commit
    return fit(parts), data


def test_the_loop_commits_every_n_steps_and_around_each_epochs_outputs():
    """``fit`` (one process, digits, --accumulate 2) calls the commit hook after every
    optimizer step but an epoch's last, and at each epoch's end before and after its
    outputs (metrics record, checkpoint)."""
    from hvdtrain.loop.run.outputs import Outputs
    from hvdtrain.report.log import MetricsWriter

    cfg = parse_config(QUICK + ["--kvstore", "none", "--epochs", "2", "--batch-size", "256",
                                "--accumulate", "2"])
    calls = []

    class Metrics(MetricsWriter):
        def write(self, event, **fields):
            calls.append(("metrics", event))

    _, data = _classifier_run(cfg, Outputs(Metrics(None)),
                              lambda state, point: calls.append((state.epoch, state.step,
                                                                 state.epoch_samples, point)))
    per_epoch = -(-(-(-data.num_train // 256)) // 2)  # micro-batches, then steps
    expected = [("metrics", "start")]
    for epoch in range(2):
        expected += [(epoch, epoch * per_epoch + s, s * 512, "step")
                     for s in range(1, per_epoch)]
        end = (epoch + 1, (epoch + 1) * per_epoch, 0)
        expected += [end + ("epoch done",), ("metrics", "epoch"), end + ("epoch written",)]
    assert calls == expected + [("metrics", "end")]


def test_a_launch_is_named_alike_on_its_ranks_and_apart_from_another():
    mpirun = {"OMPI_MCA_orte_hnp_uri": "83492864.0;tcp://192.0.2.2:53797"}
    assert launch_of(mpirun) == "mpirun 83492864.0;tcp://192.0.2.2:53797"
    assert launch_of(ELASTIC_ENV) == "gloo 10.0.0.1:4242"
    assert launch_of({"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9091"}) == \
        "scheduler 127.0.0.1:9091"
    assert launch_of({}) is None


def test_a_late_rank_is_not_refused_the_folder_its_own_rank_0_already_locked(tmp_path,
                                                                            monkeypatch):
    """Found in make test: the ranks decide on the folder with no collective, so a rank that
    starts late (a loaded host) found it locked by its own launch's rank 0 and refused to
    run: "--output-dir ... is in use by another run (pid N on HOST)". Another launch is
    still refused."""
    from hvdtrain.config import TrainConfig
    from hvdtrain.options import ConfigError
    from hvdtrain.state.run_dir import RunDir
    for name in ("HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT",
                 "HOROVOD_ELASTIC", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMPI_MCA_orte_hnp_uri", "83492864.0;tcp://192.0.2.2:53797")
    cfg = TrainConfig(dataset="digits", output_dir=str(tmp_path))
    holder = OutputLock(str(tmp_path), launch=launch_of())  # rank 0, as claim() takes it
    assert holder.acquire()
    try:
        RunDir.decide(cfg)  # rank 1 of the same launch, late
        monkeypatch.setenv("OMPI_MCA_orte_hnp_uri", "90000000.0;tcp://192.0.2.2:40000")
        with pytest.raises(ConfigError, match="is in use by another run"):
            RunDir.decide(cfg)  # a rank of another launch
    finally:
        holder.release()


def test_ranks_probing_the_folder_at_once_never_take_each_other_for_its_holder(tmp_path,
                                                                              monkeypatch):
    """A resume's ranks probe the folder at the same moment, while the lock file still names
    the run before (another launch). One rank's probe, or rank 0 that has just taken the
    lock and not yet written its line, holds it for an instant: not another run. (Probes
    took the exclusive lock: a resume under mpirun refused itself by chance, "--output-dir
    ... is in use by another run (pid N ...)", naming the stopped run it was resuming.)"""
    for name in ("HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT",
                 "HOROVOD_ELASTIC", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMPI_MCA_orte_hnp_uri", "83492864.0;tcp://192.0.2.2:53797")
    path = tmp_path / ".hvdtrain.lock"
    path.write_text("pid 1 on vm (launch mpirun 1.0;tcp://192.0.2.2:1)\n")  # the run before
    this_launch = OutputLock(str(tmp_path), launch=launch_of())

    def held_for_an_instant(kind):
        momentary = open(path, encoding="utf-8")  # pylint: disable=consider-using-with
        fcntl.flock(momentary.fileno(), kind | fcntl.LOCK_NB)
        release = threading.Timer(0.3, momentary.close)
        release.start()
        return release

    probe = held_for_an_instant(fcntl.LOCK_SH)  # another rank's probe, at the same moment
    assert this_launch.held_by_another() is None
    probe.join()
    rank_0 = held_for_an_instant(fcntl.LOCK_EX)  # rank 0, its line not yet written
    assert this_launch.held_by_another() is None
    rank_0.join()
    held_for_an_instant(fcntl.LOCK_SH)  # a late rank's probe as rank 0 takes the lock
    assert this_launch.acquire()
    this_launch.release()
    # A run of another launch that holds the lock is still refused.
    with open(path, "a+", encoding="utf-8") as other_run:
        fcntl.flock(other_run.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        other_run.write("pid 1 on vm (launch mpirun 1.0;tcp://192.0.2.2:1)\n")
        other_run.flush()
        assert this_launch.held_by_another(settle=0.2).startswith("pid 1 on vm")
        assert not this_launch.acquire(settle=0.2)


def _elastic_fit_in_process(tmp_path, flags, signals=None):
    """``fit`` as an elastic run calls it (a commit hook), one process, digits; returns the
    hook's calls and the checkpoint folder's names."""
    from hvdtrain.loop.run.outputs import Outputs
    from hvdtrain.report.log import MetricsWriter
    from hvdtrain.state.checkpoint import Checkpointer

    cfg = parse_config(QUICK + ["--kvstore", "none", "--batch-size", "128", "--output-dir",
                                str(tmp_path), "--keep-checkpoints", "50"] + flags)
    # Written in the caller's thread, as an elastic run's checkpoints are.
    saver = Checkpointer(cfg.output_dir, 1, cfg.keep_checkpoints, meta={"config": cfg.to_dict()})
    calls = []
    outputs = Outputs(MetricsWriter(None), saver)
    try:
        _classifier_run(cfg, outputs, lambda state, point: calls.append((state.step, point)),
                        signals)
    finally:
        folder = tmp_path / "checkpoints"
        names = sorted(os.listdir(folder)) if folder.is_dir() else []
    return calls, names


def test_an_elastic_run_saves_at_its_step_interval_after_a_commit(tmp_path):
    """--elastic with --checkpoint-every Nsteps writes those checkpoints inside each epoch (it
    wrote none until the end), each after a commit to memory: a peer that times out waiting
    for rank 0's write rolls back to the step saved, not before it. 12 steps an epoch."""
    calls, names = _elastic_fit_in_process(tmp_path, ["--epochs", "2", "--checkpoint-every",
                                                      "5steps"])
    inside = [n for n in names if "-step-" in n]
    assert inside == ["epoch-0000-step-0000005", "epoch-0000-step-0000010",
                      "epoch-0001-step-0000015", "epoch-0001-step-0000020"], names
    assert [step for step, point in calls if point == "before save"] == [5, 10, 15, 20]


def test_an_elastic_run_stops_on_a_signal_with_a_checkpoint(tmp_path):
    """A stop signal (noted by any rank) stops an elastic run as any run: at the step
    boundary, with the checkpoint saved, Preempted (exit 75). Before, elastic runs
    installed no handler: a preemption lost everything since the last epoch's end."""
    from hvdtrain.loop.run.together import Preempted

    class Asked:
        received = "SIGTERM"
    with pytest.raises(Preempted) as stopped:
        _elastic_fit_in_process(tmp_path, ["--epochs", "2"], signals=Asked())
    assert "(SIGTERM); checkpoint saved:" in stopped.value.line, stopped.value.line
    assert "epoch-0000-step-0000001" in stopped.value.line
    assert os.path.isfile(tmp_path / "checkpoints" / "epoch-0000-step-0000001" / "meta.json")
