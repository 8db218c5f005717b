"""``hvdtrain.horovod`` against ``horovod.mxnet`` 0.28.1: every public name, each signature;
what it refuses, in one line (one process: size 1)."""
import inspect
import os
import subprocess
import sys
import textwrap
import types

import pytest

hvd_theirs = pytest.importorskip("horovod.mxnet")
import hvdtrain.horovod as hvd_ours  # noqa: E402

# Horovod's own names: its public API is what horovod.mxnet defines or re-exports from
# Horovod, not what it imported for itself (OrderedDict, split_list, ...).
PUBLIC = sorted(name for name in dir(hvd_theirs)
                if not name.startswith("_")
                and not isinstance(getattr(hvd_theirs, name), types.ModuleType)
                and (getattr(getattr(hvd_theirs, name), "__module__", "horovod") or ""
                     ).startswith("horovod")
                and name not in ("check_extension", "split_list"))
OURS = {"init", "shutdown", "DistributedTrainer", "broadcast_parameters", "broadcast_object"}


def test_the_api_is_horovods_public_api():
    assert len(PUBLIC) > 40
    assert set(OURS) <= set(PUBLIC)
    missing = [name for name in PUBLIC if not hasattr(hvd_ours, name)]
    assert not missing
    assert set(hvd_ours.__all__) == set(PUBLIC) | {"allreduce_metric"}


@pytest.mark.parametrize("name", PUBLIC)
def test_each_name_has_horovods_signature(name):
    theirs, ours = getattr(hvd_theirs, name), getattr(hvd_ours, name)
    if name in OURS:
        assert ours is not theirs
    elif not callable(theirs) or isinstance(theirs, type):
        assert ours is theirs  # constants, Compression, ProcessSet: Horovod's own
    if callable(theirs):
        assert inspect.signature(ours) == inspect.signature(theirs), name


def _one_process(code, env=None):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, **(env or {})))


def test_refusals_are_one_line_each():
    proc = _one_process("""
        import mxnet as mx
        import hvdtrain.horovod as hvd
        from hvdtrain.config import ConfigError
        try:
            hvd.DistributedTrainer([], "sgd")
        except ValueError as err:
            print("before init:", err)
        hvd.init()
        net = mx.gluon.nn.Dense(2, in_units=3)
        net.initialize()
        for kwargs in ({"compression": "bf16"},
                       {"compression": hvd.Compression.fp16, "gradient_predivide_factor": 2.0},
                       {"process_set": hvd.ProcessSet([0])}):
            try:
                hvd.DistributedTrainer(net.collect_params(), "sgd", **kwargs)
            except ConfigError as err:
                print("refused:", err)
        try:
            hvd.broadcast_parameters([1, 2])
        except ValueError as err:
            print("refused:", err)
        hvd.shutdown()
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("before init: Horovod has not been initialized"), lines
    assert len([line for line in lines if line.startswith("refused:")]) == 4, lines
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("name, value", [("HVDTRAIN_STALL_TIMEOUT", "-5"),
                                         ("HVDTRAIN_STALL_TIMEOUT", "abc"),
                                         ("HVDTRAIN_STALL_TIMEOUT", "nan"),
                                         ("HVDTRAIN_REPLICA_CHECK_EVERY", "-1"),
                                         ("HVDTRAIN_REPLICA_CHECK_EVERY", "1.5")])
def test_a_bad_setting_is_refused_at_init_naming_its_variable(name, value):
    """A negative stall timeout once ended every healthy job at its start, blaming a
    peer; a negative interval was taken silently."""
    proc = _one_process("""
        import hvdtrain.horovod as hvd
        from hvdtrain.config import ConfigError
        try:
            hvd.init()
        except ConfigError as err:
            print("refused:", err)
    """, env={name: value})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith(f"refused: {name}={value}: expected a number"), proc.stdout
    other = ({"HVDTRAIN_STALL_TIMEOUT", "HVDTRAIN_REPLICA_CHECK_EVERY"} - {name}).pop()
    assert other not in proc.stdout


def test_a_lone_process_trains_and_exits_cleanly():
    """size 1: a step divides by the batch it was given (as a plain Trainer); warnings
    come tagged with the rank."""
    proc = _one_process("""
        import warnings
        import mxnet as mx
        from mxnet import autograd
        import hvdtrain.horovod as hvd
        hvd.init()
        mx.random.seed(1)
        net = mx.gluon.nn.Dense(1, in_units=2)
        net.initialize(mx.init.One())
        hvd.broadcast_parameters(net.collect_params())
        trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 1.0})
        x = mx.nd.array([[1.0, 2.0], [3.0, 4.0]])
        with autograd.record():
            loss = net(x).sum()
        loss.backward()
        trainer.step(2)
        print("weight", net.weight.data().asnumpy().tolist())
        warnings.warn("look here")
    """, env={"OMPI_COMM_WORLD_RANK": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "weight [[-1.0, -2.0]]" in proc.stdout  # 1 - (1+3)/2, 1 - (2+4)/2
    assert "[rank 0] WARNING" in proc.stderr and "look here" in proc.stderr, proc.stderr


@pytest.mark.parametrize("where", ["trainer", "setting"])
def test_an_uncaught_usage_error_is_one_line_and_exit_status_2(where):
    """A refused DistributedTrainer argument, or a bad HVDTRAIN_* value at hvd.init(), that
    the script does not catch: ``PROGRAM: error: MESSAGE``, status 2, no traceback (it was
    Python's traceback and status 1); the script's own hook still sees other errors."""
    proc = _one_process("""
        import sys
        import mxnet as mx
        import hvdtrain.horovod as hvd
        sys.excepthook = lambda *exc: print("the script's hook:", exc[1])
        hvd.init()
        net = mx.gluon.nn.Dense(2, in_units=3)
        net.initialize()
        hvd.DistributedTrainer(net.collect_params(), "sgd", compression="bf16")
    """, env={"HVDTRAIN_STALL_TIMEOUT": "abc" if where == "setting" else "600"})
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    want = ("HVDTRAIN_STALL_TIMEOUT=abc: expected a number" if where == "setting" else
            "compression='bf16': hvdtrain.horovod sends gradients as Compression.none")
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"-c: error: {want}"), proc.stderr
    assert "script's hook" not in proc.stdout


def test_a_peer_gone_is_one_line_naming_it_and_other_errors_reach_the_previous_hook(
        monkeypatch, capfd):
    """Horovod's "has been shut down" under a rank whose peer failed: one line naming the
    peer the job's pulse saw end, exit 1 (it was a 15-line traceback from inside hvdtrain);
    any other error goes to the hook that was there before, the session marked failed."""
    import mxnet as mx
    from hvdtrain.horovod import failures

    seen, exits = [], []
    monkeypatch.setattr(sys, "excepthook", lambda *exc: seen.append(exc[1]))
    monkeypatch.setattr(os, "_exit", exits.append)
    pulse = types.SimpleNamespace(ended=[1])
    session = types.SimpleNamespace(failed=False, dist=types.SimpleNamespace(rank=0),
                                    watchdog=types.SimpleNamespace(pulse=pulse))
    failures.install(lambda: session)
    mine = RuntimeError("the script's own")
    sys.excepthook(RuntimeError, mine, None)
    assert seen == [mine] and not exits and session.failed
    gone = mx.base.MXNetError("MXNetError: Horovod has been shut down. This was caused by an "
                              "exception on one of the ranks or an attempt to allreduce")
    sys.excepthook(mx.base.MXNetError, gone, None)
    assert seen == [mine] and exits == [1]
    line, = capfd.readouterr().err.strip().splitlines()
    assert line.endswith("error: rank 0: rank 1 has failed or left the job (its own output "
                         "says why); Horovod has been shut down, so this rank stops too"), line
    pulse.ended = []
    killed = mx.base.MXNetError("[13:45:40] /gloo/transport/tcp/pair.cc:589: Read error "
                                "[127.0.0.1]:33285: Connection reset by peer")
    sys.excepthook(mx.base.MXNetError, killed, None)
    assert exits == [1, 1] and seen == [mine]
    assert "rank 0: another rank has failed or left the job (its own output says why); a " \
           "collective failed (Connection reset by peer), so this rank stops too" in capfd.readouterr().err
