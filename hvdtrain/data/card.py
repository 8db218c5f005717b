"""The model card: what a trained model needs besides its parameters to be used.

Training writes it into every checkpoint's ``meta.json`` (``card``) and, at the end of a run,
as ``model.json`` beside ``model.params``; ``hvdtrain-export`` copies it into an export and
``hvdtrain-predict`` reads it there. Nothing downstream guesses what the model takes::

    {"format": "hvdtrain-model-card", "version": 1,
     "model": "resnet18_v1", "dataset": "imagefolder",
     "classes": ["cat", "dog"], "num_classes": 2,
     "input": {"shape": [3, 224, 224], "layout": "NCHW", "dtype": "float32"},
     "eval_transform": {"name": "centre_crop_resize", "crop_fraction": 0.875,
                        "interpolation": "bilinear", "channel_order": "RGB",
                        "pixel_scale": 0.00392156862745098,
                        "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}}

``eval_transform`` is :func:`hvdtrain.data.transforms.eval_transform`'s rule as data: keep the
centred square of ``crop_fraction`` of the image's shorter side (ImageNet's 0.875: the shorter
side resized to 256/224 of the size, then the centre crop), resize it to the input's height
and width, then ``(pixel * pixel_scale - mean) / std`` per RGB channel, channels first. The
digits are 8x8 grey arrays (values 0-16, divided by 16), not images: their card says
``"eval_transform": null``.
"""
from __future__ import annotations

import json
from typing import Dict, Optional

from ..config import ConfigError
from .datasets import CIFAR_CLASSES
from .transforms import EVAL_CROP_FRACTION, IMAGENET_MEAN, IMAGENET_STD

CARD_FORMAT = "hvdtrain-model-card"
CARD_VERSION = 1
CARD_FILE = "model.json"
TRANSFORM = "centre_crop_resize"
DTYPES = ("float32", "float16")

# The in-memory datasets name their labels here; streamed ones carry their class folders.
FIXED_CLASSES = {"digits": tuple(str(d) for d in range(10)), "cifar10": CIFAR_CLASSES,
                 "synthetic": tuple(str(d) for d in range(10))}


class CardError(ConfigError):
    """A model card that cannot be used; the message names the file and the field."""


def model_card(model: str, data, dtype: str = "float32") -> Dict:
    """The card of model `model` trained on `data` (a loaded dataset) fed in `dtype`.

    Parameters
    ----------
    model : str
        A name :func:`hvdtrain.models.build_model` knows.
    data : Dataset or ImageDataset
        What :func:`hvdtrain.data.datasets.load_dataset` returned.
    dtype : str
        The dtype of the batches the model takes (``--dtype``).
    """
    classes = list(data.classes) if data.streamed else list(FIXED_CLASSES[data.name])
    return {"format": CARD_FORMAT, "version": CARD_VERSION, "model": model,
            "dataset": data.name, "classes": classes, "num_classes": len(classes),
            "input": {"shape": [int(n) for n in data.image_shape], "layout": "NCHW",
                      "dtype": dtype},
            "eval_transform": _eval_rule(data)}


def _eval_rule(data) -> Optional[Dict]:
    """How evaluation turns an image into the model's input, as data."""
    if data.streamed:  # transforms.eval_transform with its defaults
        crop, mean, std = EVAL_CROP_FRACTION, IMAGENET_MEAN, IMAGENET_STD
    elif data.mean is not None:  # uint8 images (CIFAR, synthetic) used whole, normalised
        crop, mean, std = 1.0, data.mean, data.std
    else:
        return None  # the digits: grey arrays, not images
    return {"name": TRANSFORM, "crop_fraction": float(crop), "interpolation": "bilinear",
            "channel_order": "RGB", "pixel_scale": 1 / 255,
            "mean": [float(m) for m in mean], "std": [float(s) for s in std]}


def write_card(path: str, card: Dict) -> None:
    """Write `card` as JSON to `path` (use it through an atomic write)."""
    with open(path, "w", encoding="utf-8") as out:
        json.dump(card, out, indent=1)
        out.write("\n")


def read_card(path: str) -> Dict:
    """The validated card in JSON file `path` (raises :class:`CardError`)."""
    try:
        with open(path, encoding="utf-8") as src:
            card = json.load(src)
    except (OSError, ValueError) as err:
        reason = err.strerror if isinstance(err, OSError) else "not JSON"
        raise CardError(f"cannot read the model card {path}: {reason}") from None
    return check_card(card, path)


def check_card(card, where: str) -> Dict:
    """`card` if it is a model card this hvdtrain reads; else CardError naming `where`."""
    try:
        _check(card)
    except (KeyError, TypeError, ValueError) as err:
        text = f"no {err.args[0]!r}" if isinstance(err, KeyError) else str(err)
        raise CardError(f"{where} is not a usable hvdtrain model card: {text}") from None
    return card


def _check(card) -> None:
    if not isinstance(card, dict) or card.get("format") != CARD_FORMAT:
        raise ValueError(f"'format' is not {CARD_FORMAT!r}")
    if card["version"] != CARD_VERSION:
        raise ValueError(f"version {card['version']!r}; this hvdtrain reads version "
                         f"{CARD_VERSION} (a newer hvdtrain wrote it?)")
    if not isinstance(card["model"], str):
        raise ValueError("'model' is not a name")
    classes = card["classes"]
    if not (isinstance(classes, list) and classes and all(isinstance(c, str) for c in classes)
            and len(classes) == card["num_classes"]):
        raise ValueError("'classes' is not a list of num_classes names")
    shape = card["input"]["shape"]
    if not (isinstance(shape, list) and len(shape) == 3
            and all(isinstance(n, int) and n > 0 for n in shape)):
        raise ValueError(f"input shape {shape!r} is not [channels, height, width]")
    if card["input"]["dtype"] not in DTYPES:
        raise ValueError(f"input dtype {card['input']['dtype']!r} is not one of {DTYPES}")
    rule = card["eval_transform"]
    if rule is None:
        return
    if rule["name"] != TRANSFORM:
        raise ValueError(f"eval_transform {rule['name']!r} is not {TRANSFORM!r}")
    if not 0 < rule["crop_fraction"] <= 1:
        raise ValueError(f"crop_fraction {rule['crop_fraction']!r} is not in (0, 1]")
    if shape[0] != 3 or shape[1] != shape[2]:
        raise ValueError(f"input shape {shape} is not a square RGB image")
    for key in ("mean", "std"):
        if len(rule[key]) != 3 or not all(isinstance(v, (int, float)) for v in rule[key]):
            raise ValueError(f"{key} is not three numbers (R, G, B)")
    if min(rule["std"]) <= 0:
        raise ValueError("a std is not above 0")
    if abs(rule["pixel_scale"] - 1 / 255) > 1e-12:
        raise ValueError(f"pixel_scale {rule['pixel_scale']!r} is not 1/255")
