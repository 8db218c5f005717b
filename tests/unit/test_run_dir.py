"""The run folder's three phases: decide (before any data), claim, restore.

Through :func:`hvdtrain.job.train` in this process (digits, ``--kvstore none``: an epoch takes
well under a second), with the library's own functions wrapped to see when they are called.
The order and the counts are the point: the old start-up loaded the data before refusing a
fresh run, read each checkpoint's metadata several times, checked the first candidate's
compatibility twice and loaded every candidate's parameter file before the data.
"""
import collections
import sys
import types

import mxnet as mx
import numpy as np
import pytest

from helpers import folder_digest
from hvdtrain import job
from hvdtrain.cli import parse_config
from hvdtrain.config import ConfigError
from hvdtrain.job import train

QUICK = ["--dataset", "digits", "--no-cuda", "--kvstore", "none", "--log-interval", "0"]


def _truncate_params(checkpoint):
    params = checkpoint / "model.params"
    params.write_bytes(params.read_bytes()[:100])


def _wrap_everywhere(monkeypatch, name, record):
    """Wrap function `name` in every hvdtrain module that holds it (each module imports it
    by name), calling `record(*args)` first."""
    modules = [m for key, m in list(sys.modules.items())
               if key.startswith("hvdtrain") and isinstance(getattr(m, name, None),
                                                            types.FunctionType)]
    original = getattr(modules[0], name)

    def wrapped(*args, **kwargs):
        record(*args)
        return original(*args, **kwargs)

    for module in modules:
        if getattr(module, name) is original:
            monkeypatch.setattr(module, name, wrapped)


def _record_order(monkeypatch):
    """A list that receives "load_dataset" and ("nd.load", path) in the order they happen."""
    events = []
    load_dataset, nd_load = job.load_dataset, mx.nd.load

    def dataset(*args, **kwargs):
        events.append("load_dataset")
        return load_dataset(*args, **kwargs)

    def load(path, *args, **kwargs):
        events.append(("nd.load", str(path)))
        return nd_load(path, *args, **kwargs)

    monkeypatch.setattr(job, "load_dataset", dataset)
    monkeypatch.setattr(mx.nd, "load", load)
    return events


def test_a_fresh_run_into_a_folder_with_checkpoints_is_refused_before_the_data_is_loaded(
        run_copy, monkeypatch):
    def no_data(*_args, **_kwargs):
        raise AssertionError("the data was loaded before the refusal")

    monkeypatch.setattr(job, "load_dataset", no_data)
    before = folder_digest(run_copy)
    with pytest.raises(ConfigError, match="already holds checkpoints .*newest: epoch-0002"):
        train(parse_config(QUICK + ["--epochs", "3", "--output-dir", str(run_copy)]))
    assert folder_digest(run_copy) == before


def test_each_candidate_is_read_and_checked_once(run_copy, monkeypatch):
    """The newest is damaged, so both candidates are reached; each one's metadata is read
    once and its compatibility checked once, from decide to the first step."""
    _truncate_params(run_copy / "checkpoints" / "epoch-0002")
    reads, checks = collections.Counter(), collections.Counter()
    _wrap_everywhere(monkeypatch, "read_meta", lambda path: reads.update([str(path)]))
    _wrap_everywhere(monkeypatch, "check_compatible",
                     lambda path, *_: checks.update([str(path)]))
    seen = {}

    def fit(*_args, **_kwargs):  # stop counting here: saving reads the checkpoints again
        seen.update(reads=dict(reads), checks=dict(checks))
        return {}

    monkeypatch.setattr(job, "fit", fit)
    train(parse_config(QUICK + ["--epochs", "3", "--output-dir", str(run_copy),
                                "--resume", "auto"]))
    both = {str(run_copy / "checkpoints" / name): 1 for name in ("epoch-0002", "epoch-0001")}
    assert seen["reads"] == both
    assert seen["checks"] == both


def test_decide_loads_no_parameter_file(run_copy, monkeypatch):
    """Parameter files are read at restore, after the data, and only until one loads."""
    events = _record_order(monkeypatch)
    run = train(parse_config(QUICK + ["--epochs", "3", "--output-dir", str(run_copy),
                                      "--resume", "auto"]))
    loads = [event for event in events if event != "load_dataset"]
    assert events.index("load_dataset") < events.index(loads[0])
    newest = str(run_copy / "checkpoints" / "epoch-0002" / "model.params")
    assert loads[0] == ("nd.load", newest)
    assert run.result["steps"] == 3 * 23  # resumed from epoch 2: one more epoch of 23 steps


def test_a_damaged_newest_checkpoint_falls_back_at_restore(run_copy, monkeypatch, capsys):
    _truncate_params(run_copy / "checkpoints" / "epoch-0002")
    older = run_copy / "checkpoints" / "epoch-0001"
    expected = mx.nd.load(str(older / "model.params"))  # MXNet's own reader, not ours
    events = _record_order(monkeypatch)
    cfg = parse_config(QUICK + ["--epochs", "2", "--output-dir", str(run_copy),
                                "--resume", "auto"])
    restored = {}

    def fit(net, *_args, **_kwargs):  # the parameters as restore left them
        restored.update({name: p.data().asnumpy()
                         for name, p in net._collect_params_with_prefix().items()})  # pylint: disable=protected-access
        return {"state": _args[6]}  # (trainer, data, devices, dist, cfg, outputs, state...)

    monkeypatch.setattr(job, "fit", fit)
    run = train(cfg)
    assert (run.result["state"].epoch, run.result["state"].step) == (1, 23)
    assert sorted(restored) == sorted(expected)
    for name, value in expected.items():
        assert np.array_equal(restored[name], value.asnumpy()), name
    damaged = str(run_copy / "checkpoints" / "epoch-0002" / "model.params")
    assert events.index("load_dataset") < events.index(("nd.load", damaged))
    err = capsys.readouterr().err
    assert "epoch-0002 is corrupt" in err and "falling back to an older checkpoint" in err
    assert "resuming from " + str(older) + ", the newest checkpoint that loads" in err


def test_decide_writes_nothing_and_claim_takes_the_folder(run_copy):
    """Leftovers of an interrupted save stay until claim; claim locks the folder against a
    second run's decide, and leaving the block frees it."""
    from hvdtrain.state.run_dir import RunDir  # pylint: disable=import-outside-toplevel
    leftover = run_copy / "checkpoints" / ".tmp-epoch-0003-999999"
    leftover.mkdir()
    cfg = parse_config(QUICK + ["--epochs", "3", "--output-dir", str(run_copy),
                                "--resume", "auto"])
    before = folder_digest(run_copy)
    run_dir = RunDir.decide(cfg)
    assert folder_digest(run_copy) == before
    assert [c.path for c in run_dir.candidates] == [
        str(run_copy / "checkpoints" / name) for name in ("epoch-0002", "epoch-0001")]
    one_rank = types.SimpleNamespace(is_root=True, num_workers=1, synchronous=True)
    with run_dir.claim(one_rank):
        assert not leftover.exists()
        with pytest.raises(ConfigError, match="is in use by another run"):
            RunDir.decide(cfg)
    assert RunDir.decide(cfg).candidates == run_dir.candidates


class RankOneOfTwo:
    """Rank 1 of a two-rank job whose rank 0 contributes `other` to every sum."""

    is_root, num_workers, synchronous = False, 2, True

    def __init__(self, other):
        self.other, self.collectives = other, []

    def sum_across_workers(self, name, values):
        self.collectives.append(name)
        return values + mx.nd.array(self.other)


def test_claim_agrees_on_the_folder_and_the_position_in_one_collective(run_copy):
    """The folder-free flag (rank 0's) and the resume position travel together; rank 1
    refuses when rank 0 found the folder taken, or continues from another position."""
    from hvdtrain.models import build_model  # pylint: disable=import-outside-toplevel
    from hvdtrain.state.run_dir import RunDir  # pylint: disable=import-outside-toplevel
    cfg = parse_config(QUICK + ["--epochs", "3", "--output-dir", str(run_copy),
                                "--resume", "auto"])
    net = build_model(cfg.model_name, 10)
    net.initialize()
    net(mx.nd.zeros((1,) + job.load_dataset("digits", None).image_shape))  # shapes known
    run_dir = RunDir.decide(cfg)
    rank_one = RankOneOfTwo([0, 3, 46, 0])  # free; epoch-0002: epoch 2 done (+1), step 46
    state = run_dir.restore(net, None, [mx.cpu()], rank_one, 64, 10 ** 6)
    assert (state.epoch, state.step) == (2, 46) and rank_one.collectives == []
    with run_dir.claim(rank_one):
        pass
    assert rank_one.collectives == ["run_dir_agreement"]
    with pytest.raises(ConfigError, match="rank 0 found --output-dir .* in use by another"):
        run_dir.claim(RankOneOfTwo([1, 3, 46, 0]))
    with pytest.raises(ConfigError, match="ranks found different checkpoints to resume "
                                          "from .this rank: .*epoch-0002"):
        run_dir.claim(RankOneOfTwo([0, 2, 23, 0]))
