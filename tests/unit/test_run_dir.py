"""The run folder's three phases: decide (before any data), restore, claim.

Mostly through :func:`hvdtrain.job.train` in this process (digits, ``--kvstore none``: an
epoch takes well under a second), with the library's own functions wrapped to see when they
are called. The order and the counts are the point: the old start-up loaded the data before
refusing a fresh run, read each checkpoint's metadata several times, checked the first
candidate's compatibility twice and loaded every candidate's parameter file before the data.
Claim's collective is seen from rank 1 of N, the other ranks' sums made in float32.
"""
import collections
import json
import sys
import types

import mxnet as mx
import numpy as np
import pytest

from helpers import folder_digest
from hvdtrain import job  # noqa: F401
from hvdtrain.estimator import estimator
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
    """A list that receives "load_dataset", ("nd.load", path) and ("digest", path) (the
    check of a file's bytes against meta.json's record, before it is loaded) in the order
    they happen."""
    from hvdtrain.state import checkpoint_files
    events = []
    load_dataset, nd_load = job.load_dataset, mx.nd.load
    file_digest = checkpoint_files.file_digest

    def dataset(*args, **kwargs):
        events.append("load_dataset")
        return load_dataset(*args, **kwargs)

    def load(path, *args, **kwargs):
        events.append(("nd.load", str(path)))
        return nd_load(path, *args, **kwargs)

    def digest(path):
        events.append(("digest", str(path)))
        return file_digest(path)

    monkeypatch.setattr(job, "load_dataset", dataset)
    monkeypatch.setattr(mx.nd, "load", load)
    monkeypatch.setattr(checkpoint_files, "file_digest", digest)
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

    def fit(_parts):  # stop counting here: saving reads the checkpoints again
        seen.update(reads=dict(reads), checks=dict(checks))
        return {}

    monkeypatch.setattr(estimator, "run_fit", fit)
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
    assert loads[0] == ("digest", newest)  # its bytes checked first, then loaded
    assert [e for e in loads if e[0] == "nd.load"][0] == ("nd.load", newest)
    assert run.result["steps"] == 3 * 23  # resumed from epoch 2: one more epoch of 23 steps


def test_a_damaged_newest_checkpoint_falls_back_at_restore(run_copy, monkeypatch, capsys):
    _truncate_params(run_copy / "checkpoints" / "epoch-0002")
    older = run_copy / "checkpoints" / "epoch-0001"
    expected = mx.nd.load(str(older / "model.params"))  # MXNet's own reader, not ours
    events = _record_order(monkeypatch)
    cfg = parse_config(QUICK + ["--epochs", "2", "--output-dir", str(run_copy),
                                "--resume", "auto"])
    restored = {}

    def fit(parts):  # the parameters as restore left them
        restored.update({name: p.data().asnumpy()
                         for name, p in parts.net._collect_params_with_prefix().items()})  # pylint: disable=protected-access
        return {"state": parts.state}

    monkeypatch.setattr(estimator, "run_fit", fit)
    run = train(cfg)
    assert (run.result["state"].epoch, run.result["state"].step) == (1, 23)
    assert sorted(restored) == sorted(expected)
    for name, value in expected.items():
        assert np.array_equal(restored[name], value.asnumpy()), name
    damaged = str(run_copy / "checkpoints" / "epoch-0002" / "model.params")
    # Found at restore, after the data is loaded: by the digest meta.json records (a file
    # changed in place), before MXNet reads it.
    assert events.index("load_dataset") < events.index(("digest", damaged))
    assert ("nd.load", damaged) not in events
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


class OtherRanks:
    """This process as rank 1 of `count` ranks; every other rank sends `others` (default:
    what this rank sends), rank 0 with `busy` added to the first value (its folder check).
    Summed in float32 one rank after the other, as a store would."""

    is_root, synchronous = False, True

    def __init__(self, count=2, busy=0, others=None):
        self.num_workers, self.busy, self.others = count, busy, others
        self.sent, self.collectives = [], []

    def sum_across_workers(self, name, values):
        self.collectives.append(name)
        mine = values.asnumpy()
        assert mine.dtype == np.float32
        self.sent.append(mine.copy())
        other = mine.copy() if self.others is None else np.array(self.others, np.float32)
        total = mine.copy()
        for _ in range(self.num_workers - 1):
            total += other
        total[0] += self.busy
        return mx.nd.array(total)


def _resumed(cfg, dist):
    """decide and restore, as a rank of `dist` would (a real model, no trainer)."""
    from hvdtrain.models import build_model  # pylint: disable=import-outside-toplevel
    from hvdtrain.state.run_dir import RunDir  # pylint: disable=import-outside-toplevel
    net = build_model(cfg.model_name, 10)
    net.initialize()
    net(mx.nd.zeros((1,) + job.load_dataset("digits", None).image_shape))  # shapes known
    run_dir = RunDir.decide(cfg)
    return run_dir, run_dir.restore(net, None, [mx.cpu()], dist, 64, 10 ** 6)


def test_claim_agrees_on_the_folder_and_the_position_in_one_collective(run_copy):
    """Rank 0's folder check and the resume position travel together; this rank refuses
    when rank 0 found the folder taken, or when another rank continues elsewhere."""
    flags = QUICK + ["--epochs", "3", "--output-dir", str(run_copy), "--resume"]
    alike = OtherRanks()
    run_dir, state = _resumed(parse_config(flags + ["auto"]), alike)
    assert (state.epoch, state.step) == (2, 46) and alike.collectives == []
    with run_dir.claim(alike):
        pass
    assert alike.collectives == ["run_dir_agreement"]
    with pytest.raises(ConfigError, match="rank 0 found --output-dir .* in use by another"):
        run_dir.claim(OtherRanks(busy=1))
    older = OtherRanks()  # what a rank that resumed from epoch-0001 sends
    _resumed(parse_config(flags + [str(run_copy / "checkpoints" / "epoch-0001")]),
             older)[0].claim(older).release()
    with pytest.raises(ConfigError, match="ranks found different checkpoints to resume "
                                          "from .this rank: .*epoch-0002"):
        run_dir.claim(OtherRanks(others=older.sent[0]))


def test_the_position_agreement_is_exact_beyond_float32_integers(run_copy):
    """64 ranks at step 2**24 + 1: summed whole in float32 the step would round, and ranks
    at the same position would be refused as disagreeing."""
    meta_path = run_copy / "checkpoints" / "epoch-0002" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps(dict(meta, step=2 ** 24 + 1)))
    many = OtherRanks(count=64)
    run_dir, state = _resumed(parse_config(QUICK + ["--epochs", "3", "--output-dir",
                                                    str(run_copy), "--resume", "auto"]), many)
    assert state.step == 2 ** 24 + 1
    run_dir.claim(many).release()  # no refusal
    assert many.collectives == ["run_dir_agreement"]
