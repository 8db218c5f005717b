import mxnet as mx

from hvdtrain.dist import DistContext, select_devices, share_cpu_threads


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
