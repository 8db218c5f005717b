import io
import re

import mxnet as mx
import pytest

from helpers import main_in_process
from hvdtrain.config import ConfigError
from hvdtrain.store.dist import DistContext, select_devices, share_cpu_threads
from hvdtrain.report.log import setup_logging


def test_single_worker_context():
    dist = DistContext.from_store(None)
    assert (dist.rank, dist.local_rank, dist.num_workers, dist.local_size) == (0, 0, 1, 1)
    assert dist.is_root
    values = mx.nd.array([1, 2])
    assert dist.sum_across_workers("x", values).asnumpy().tolist() == [1, 2]


def test_no_cuda_binds_the_cpu():
    assert select_devices(local_rank=3, no_cuda=True) == [mx.cpu()]


def test_no_visible_gpu_falls_back_to_cpu_with_a_warning(caplog):
    caplog.set_level("WARNING", logger="hvdtrain")
    import logging
    logging.getLogger("hvdtrain").propagate = True
    assert select_devices(local_rank=0) == [mx.cpu()]
    assert "no GPU is visible" in caplog.text


def test_thread_share_respects_user_setting():
    assert share_cpu_threads(2, environ={"OMP_NUM_THREADS": "4"}) is None
    assert share_cpu_threads(1, environ={}) is None
    assert share_cpu_threads(2, environ={}) >= 1


@pytest.mark.parametrize("visible,local_rank,per_worker,expected", [
    (4, 3, None, [3]),         # every GPU of the host visible: gpu(local_rank)
    (1, 3, None, [0]),         # Slurm/Kubernetes/CUDA_VISIBLE_DEVICES: the one GPU it sees
    (2, 3, None, [1]),         # fewer GPUs than ranks: local_rank % visible
    (4, 1, 2, [2, 3]),         # groups of two
    (2, 1, 2, [0, 1]),         # each rank sees its own two
])
def test_ranks_bind_the_gpus_they_can_see(monkeypatch, visible, local_rank, per_worker,
                                          expected):
    monkeypatch.setattr(mx.context, "num_gpus", lambda: visible)
    stream = io.StringIO()
    setup_logging(rank=1, stream=stream)  # not rank 0: the binding is logged anyway
    devices = select_devices(local_rank, gpus_per_worker=per_worker)
    assert devices == [mx.gpu(g) for g in expected]
    assert f"local rank {local_rank} computes on {', '.join(map(str, devices))}" in \
        stream.getvalue()
    assert f"sees {visible} GPU(s)" in stream.getvalue()


@pytest.mark.parametrize("options,message", [
    (dict(gpus=(0, 2)), "--gpus asks for GPU 2 but this process sees 2 GPU(s)"),
    (dict(gpus_per_worker=3), "--gpus-per-worker 3 cannot be met: this process sees 2"),
])
def test_gpus_that_cannot_be_had_are_a_config_error(monkeypatch, options, message):
    monkeypatch.setattr(mx.context, "num_gpus", lambda: 2)
    with pytest.raises(ConfigError, match=re.escape(message)):
        select_devices(0, **options)


@pytest.mark.parametrize("visible,flags,message", [
    (1, ["--gpus", "1"], "--gpus asks for GPU 1 but this process sees 1 GPU(s)"),
    (2, ["--gpus", "0,1", "--kvstore", "none"], "--kvstore none cannot train on 2 devices"),
])
def test_impossible_device_requests_are_one_line_and_exit_2(monkeypatch, capfd, visible,
                                                             flags, message):
    """In this process (cli.main), N GPUs made visible as above; everything fails before
    using one. test_cli's test_a_refusal_is_one_line_from_the_whole_process checks what a
    real process adds around such a line."""
    monkeypatch.setattr(mx.context, "num_gpus", lambda: visible)
    code, lines = main_in_process(["--dataset", "digits", "--log-interval", "0"] + flags,
                                  capfd)
    assert code == 2, lines[-40:]
    errors = [l for l in lines if "error" in l.lower()]
    assert len(errors) == 1 and message in errors[0], lines[-40:]
    assert not any("Traceback" in l for l in lines), lines[-40:]
