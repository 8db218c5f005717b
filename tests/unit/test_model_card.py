"""The model card (hvdtrain.data.card): what it says for each kind of dataset, that its
transform is the one training evaluated with, and that every checkpoint and a finished run
carry it."""
import json
import os

import numpy as np
import pytest

from hvdtrain.data.card import CardError, check_card, model_card, read_card
from hvdtrain.data.datasets import (CIFAR_MEAN, CIFAR_STD, load_cifar10, load_digits,
                                    make_synthetic, write_cifar_files)
from hvdtrain.data.loader import normalize
from hvdtrain.data.sampler import SplitSampler
from hvdtrain.data.streamed import ImageLoader, load_images
from hvdtrain.data.transforms import eval_transform


def test_an_image_folder_card_names_its_classes_size_and_imagenet_rule(digit_images):
    folder, pack = digit_images
    for kind, root in (("imagefolder", folder), ("recordio", pack)):
        card = check_card(model_card("resnet18_v1", load_images(kind, root, 48), "float16"),
                          kind)
        assert card["model"] == "resnet18_v1" and card["dataset"] == kind
        assert card["classes"] == [f"digit{d}" for d in range(10)] and card["num_classes"] == 10
        assert card["input"] == {"shape": [3, 48, 48], "layout": "NCHW", "dtype": "float16"}
        rule = card["eval_transform"]
        assert rule["crop_fraction"] == 0.875 and rule["channel_order"] == "RGB"
        assert rule["mean"] == pytest.approx([0.485, 0.456, 0.406])
        assert rule["std"] == pytest.approx([0.229, 0.224, 0.225])
        json.dumps(card)  # travels in meta.json and model.json


def test_in_memory_datasets_have_fixed_class_names(tmp_path):
    write_cifar_files(str(tmp_path), 10, 10)
    cifar = model_card("resnet18_v1", load_cifar10(str(tmp_path)))
    assert cifar["classes"][:3] == ["airplane", "automobile", "bird"] and cifar["num_classes"] == 10
    assert cifar["input"]["shape"] == [3, 32, 32]
    assert cifar["eval_transform"]["crop_fraction"] == 1.0  # CIFAR is evaluated whole
    assert cifar["eval_transform"]["mean"] == pytest.approx(CIFAR_MEAN)
    assert cifar["eval_transform"]["std"] == pytest.approx(CIFAR_STD)
    digits = model_card("simple_cnn", load_digits())
    assert digits["classes"] == [str(d) for d in range(10)]
    assert digits["input"]["shape"] == [1, 8, 8] and digits["eval_transform"] is None
    assert model_card("mlp", make_synthetic(64, 8, image_size=40))["input"]["shape"] == [3, 40, 40]


def test_the_cards_rule_is_what_training_evaluates_an_image_folder_with(digit_images):
    """eval_transform set from the card gives, bit for bit, the batches training's evaluation
    (ImageLoader, train=False) makes; the card is read back from JSON, as predict reads it."""
    folder, _ = digit_images
    data = load_images("imagefolder", folder, 40)
    card = json.loads(json.dumps(model_card("pool_cnn", data)))
    rule = card["eval_transform"]
    loader = ImageLoader(data.test, SplitSampler(len(data.test)), 16, train=False,
                         image_size=40, data_workers=0)
    batch, _ = next(iter(loader))
    for index in range(len(batch)):
        encoded, _ = data.test.read(index)
        mine = eval_transform(encoded, card["input"]["shape"][1], "x", card["input"]["dtype"],
                              crop_fraction=rule["crop_fraction"], mean=rule["mean"],
                              std=rule["std"])
        np.testing.assert_array_equal(mine, batch[index])


def test_the_cards_rule_is_what_training_evaluates_cifar_with(tmp_path):
    """For CIFAR the rule reads a 32x32 image file as training reads the array: whole,
    normalised with CIFAR's mean and std (loader.normalize), to float32 rounding."""
    import cv2
    write_cifar_files(str(tmp_path), 10, 4)
    data = load_cifar10(str(tmp_path))
    rule = model_card("resnet18_v1", data)["eval_transform"]
    expected = normalize(data.test_x, data.mean, data.std)
    for index, image in enumerate(data.test_x):
        ok, png = cv2.imencode(".png", cv2.cvtColor(image.transpose(1, 2, 0), cv2.COLOR_RGB2BGR))
        mine = eval_transform(png.tobytes(), 32, "x", crop_fraction=rule["crop_fraction"],
                              mean=rule["mean"], std=rule["std"])
        np.testing.assert_allclose(mine, expected[index], atol=1e-5)
    # The ImageNet rule would have cropped and resized it: the card's values matter.
    other = eval_transform(png.tobytes(), 32, "x")
    assert np.abs(other - expected[-1]).max() > 0.1


def test_checkpoints_and_the_finished_run_carry_the_card(two_epochs):
    """The `hvdtrain` command's run (tests/unit/conftest.py): each checkpoint's meta.json and
    the model.json beside model.params hold the same card."""
    card = read_card(os.path.join(two_epochs, "model.json"))
    assert card == model_card("simple_cnn", load_digits())
    for name in ("epoch-0001", "epoch-0002"):
        with open(os.path.join(two_epochs, "checkpoints", name, "meta.json")) as src:
            assert json.load(src)["card"] == card


@pytest.mark.parametrize("change,needle", [
    (lambda c: c.update(version=2), "version 2"),
    (lambda c: c.pop("classes"), "no 'classes'"),
    (lambda c: c.update(num_classes=3), "num_classes names"),
    (lambda c: c["input"].update(shape=[3, 32]), "not [channels, height, width]"),
    (lambda c: c["eval_transform"].update(crop_fraction=0), "crop_fraction 0"),
    (lambda c: c["eval_transform"].update(std=[1, 0, 1]), "std is not above 0"),
])
def test_a_card_this_hvdtrain_cannot_use_is_refused_naming_the_field(tmp_path, digit_images,
                                                                     change, needle):
    card = model_card("pool_cnn", load_images("imagefolder", digit_images[0], 32))
    change(card)
    path = tmp_path / "model.json"
    path.write_text(json.dumps(card))
    with pytest.raises(CardError, match="not a usable hvdtrain model card") as err:
        read_card(str(path))
    assert needle in str(err.value) and str(path) in str(err.value)
    path.write_text("{not json")
    with pytest.raises(CardError, match="not JSON"):
        read_card(str(path))
