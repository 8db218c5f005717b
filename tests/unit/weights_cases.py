"""What the tests of starting from weights share (test_start_weights*.py, test_finetune.py):
flags, nets with recognisable values, and comparisons. The fixtures `five` and `start` are
in conftest.py."""
import mxnet as mx
import numpy as np

from hvdtrain.models import build_model

DIGITS = ["--dataset", "digits", "--no-cuda", "--kvstore", "none", "--log-interval", "0"]
FIVE = ["--dataset", "imagefolder", "--image-size", "16", "--model", "pool_cnn", "--no-cuda",
        "--kvstore", "none", "--log-interval", "0", "--data-workers", "0"]
HEAD = ("13.weight", "13.bias")  # pool_cnn's output layer


def arrays_of(net):
    """Every array of `net` by place (as save_parameters names them), as numpy."""
    return {place: p.data().asnumpy() for place, p in net._collect_params_with_prefix().items()}


def file_arrays(path):
    """Every array of parameter file `path`, by key, as numpy."""
    return {key: array.asnumpy() for key, array in mx.nd.load(str(path)).items()}


def made(name, classes, shape, seed=3):
    """Model `name` for `classes` with every array (running statistics too) random and far
    from what hvdtrain's initialisation gives."""
    net = build_model(name, classes)
    net.initialize(ctx=mx.cpu())
    net(mx.nd.zeros((1,) + shape))
    rng = np.random.default_rng(seed)
    for param in net.collect_params().values():
        param.set_data(mx.nd.array(rng.uniform(0.5, 1.5, param.shape)))
    return net


def assert_from(arrays, source, places=None):
    """`arrays` hold `source`'s values at `places` (default: all of source's)."""
    for place in places or source:
        np.testing.assert_array_equal(arrays[place], source[place], err_msg=place)


def weights_lines(lines):
    """The logged lines about the start weights, without their time and rank."""
    return [line.split(" INFO ", 1)[-1] for line in lines
            if "--init-from" in line or "--pretrained" in line]
