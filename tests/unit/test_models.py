import mxnet as mx
import pytest

from hvdtrain.config import ConfigError
from hvdtrain.models import build_model, model_names


@pytest.mark.parametrize("name,shape", [("simple_cnn", (2, 1, 8, 8)), ("bn_cnn", (2, 1, 8, 8)),
                                        ("mlp", (2, 1, 8, 8)),
                                        ("resnet18_v1", (2, 3, 32, 32))])
def test_models_have_the_datasets_classes(name, shape):
    net = build_model(name, classes=7)
    net.initialize()
    assert net(mx.nd.zeros(shape)).shape == (2, 7)


def test_unknown_model_lists_the_valid_names():
    with pytest.raises(ConfigError) as err:
        build_model("resnet9000", 10)
    assert "resnet18_v1" in str(err.value) and "simple_cnn" in str(err.value)
    assert "resnet18_v1" in model_names()


def test_zoo_list_matches_mxnet():
    from mxnet.gluon.model_zoo import vision

    from hvdtrain.models import ZOO_MODELS
    with pytest.raises(ValueError) as err:
        vision.get_model("no-such-model")
    listed = [line.strip() for line in str(err.value).splitlines()[1:]]
    assert sorted(listed) == sorted(ZOO_MODELS)
