"""ImageNet's train and evaluation transforms, one encoded image at a time.

Training: random resized crop to `size` (area 8-100 %, aspect 3/4-4/3, as GluonCV's
``RandomResizedCrop``), horizontal flip, colour jitter (brightness, contrast, saturation 0.4,
in random order) and PCA lighting noise (0.1), as GluonCV's ``train_imagenet.py`` does.
Evaluation: resize the shorter side to ``size * 256 / 224``, centre crop `size`. Both end
with ImageNet's mean/std normalisation, channels first.

Every random draw comes from ``numpy.random.default_rng([seed, epoch, sample])``, so an image
is transformed the same whichever thread or process does it, and a resumed epoch repeats it.

Decoding is Pillow's; JPEGs are decoded at a reduced scale (``draft``: libjpeg's DCT
scaling) when the crop is at least twice the output size, which is most of the cost saved
on large photos. Pillow releases the GIL while it decodes and resizes, so threads scale.
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Tuple

import numpy as np
# Imported with this module, before the store loads Horovod: horovod.mxnet loads libmxnet's
# symbols globally, among them a libjpeg of another version than Pillow's, and a Pillow
# loaded after that decodes no JPEG ("broken data stream"). See check_jpeg_codec.
from PIL import Image

from .images import BadSample

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)
# GluonCV / fb.resnet.torch's PCA of ImageNet's RGB pixels (on the 0-255 scale).
EIGVAL = np.array([55.46, 4.794, 1.148], np.float32)
EIGVEC = np.array([[-0.5675, 0.7192, 0.4009],
                   [-0.5808, -0.0045, -0.8140],
                   [-0.5836, -0.6948, 0.4203]], np.float32)
GRAY = np.array([0.299, 0.587, 0.114], np.float32)
JITTER = 0.4
LIGHTING = 0.1


def open_image(encoded: bytes, what: str):
    """A lazily decoded Pillow image of `encoded` (raises :class:`BadSample` naming `what`)."""
    try:
        image = Image.open(io.BytesIO(encoded))
        image.size  # pylint: disable=pointless-statement
        return image
    except Exception as err:  # Pillow raises many kinds for bad files
        raise BadSample(f"{what}: cannot decode ({type(err).__name__}: {err})") from None


def _crop_resize(image, box: Tuple[float, float, float, float], size: int, what: str):
    """Crop `box` (in the full image's pixels) and resize it to size x size, RGB uint8 HWC.

    A JPEG is first decoded at 1/2, 1/4 or 1/8 scale when the crop stays at least `size`.
    """
    width, height = image.size
    crop_w, crop_h = box[2] - box[0], box[3] - box[1]
    try:
        if image.format == "JPEG":
            wanted = (math.ceil(width * size / crop_w), math.ceil(height * size / crop_h))
            image.draft("RGB", wanted)
        scale_x, scale_y = image.size[0] / width, image.size[1] / height
        image = image.convert("RGB")
        scaled = (box[0] * scale_x, box[1] * scale_y, box[2] * scale_x, box[3] * scale_y)
        out = image.resize((size, size), Image.BILINEAR, box=scaled)
        return np.asarray(out, dtype=np.uint8)
    except Exception as err:  # truncated or corrupt data surfaces here, at decode time
        raise BadSample(f"{what}: cannot decode ({type(err).__name__}: {err})") from None


def check_jpeg_codec() -> None:
    """Refuse, in one line, a process whose Pillow cannot code JPEGs (every image would be
    skipped as undecodable): Pillow was first imported after horovod.mxnet."""
    from .datasets import DatasetError
    try:
        out = io.BytesIO()
        Image.new("RGB", (8, 8), (200, 30, 60)).save(out, "JPEG")
        Image.open(io.BytesIO(out.getvalue())).load()
    except OSError as err:
        raise DatasetError(f"Pillow cannot decode JPEGs in this process ({err}): it was "
                           f"imported after horovod.mxnet, whose libjpeg replaces Pillow's; "
                           f"import hvdtrain (or PIL) before horovod.mxnet") from None


def random_box(width: int, height: int, rng: np.random.Generator,
               area=(0.08, 1.0), ratio=(3 / 4, 4 / 3)) -> Tuple[float, float, float, float]:
    """GluonCV's random resized crop box: 10 tries at a random area and log-uniform aspect,
    then the centred largest box of the allowed aspect."""
    total = width * height
    for _ in range(10):
        target = rng.uniform(*area) * total
        aspect = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            x0 = int(rng.integers(0, width - w + 1))
            y0 = int(rng.integers(0, height - h + 1))
            return (x0, y0, x0 + w, y0 + h)
    return centre_box(width, height, 1.0)


def centre_box(width: int, height: int, fraction: float) -> Tuple[float, float, float, float]:
    """The centred square covering `fraction` of the shorter side."""
    side = min(width, height) * fraction
    x0, y0 = (width - side) / 2, (height - side) / 2
    return (x0, y0, x0 + side, y0 + side)


def colour_matrix(mean: np.ndarray, rng: np.random.Generator, jitter: float = JITTER,
                  pca_noise: float = LIGHTING):
    """Colour jitter and lighting noise as one affine map of RGB rows: ``p @ m + c``.

    Brightness, contrast and saturation (each by a factor in 1 +- `jitter`, in random order,
    as MXNet's ``ColorJitterAug``) are linear in the pixels: brightness ``a p``, contrast
    ``a p + (1 - a) gray_mean``, saturation ``a p + (1 - a) gray(p)``; contrast's grey mean
    follows from the image's `mean` colour through the maps before it. AlexNet's PCA
    lighting noise adds ``eigvec @ (alpha * eigval)``, alpha ~ N(0, `pca_noise`). One pass
    over the pixels then does what four did.
    """
    matrix, shift = np.eye(3), np.zeros(3)
    for which in rng.permutation(3):
        alpha = 1.0 + rng.uniform(-jitter, jitter)
        step, offset = alpha * np.eye(3), 0.0
        if which == 1:
            offset = (1 - alpha) * float((mean @ matrix + shift) @ GRAY)
        elif which == 2:
            step = step + (1 - alpha) * np.outer(GRAY, np.ones(3))
        matrix, shift = matrix @ step, shift @ step + offset
    noise = rng.normal(0, pca_noise, size=3)
    return matrix, shift + EIGVEC @ (noise * EIGVAL)


@dataclass(frozen=True)
class Augment:
    """How strongly training transforms vary an image (ImageNet's defaults)."""

    min_area: float = 0.08
    jitter: float = JITTER
    pca_noise: float = LIGHTING


def train_transform(encoded: bytes, size: int, rng: np.random.Generator, what: str,
                    dtype="float32", augment: Augment = Augment()) -> np.ndarray:
    """Decode `encoded` and apply the training augmentation; a CHW array of `dtype`.

    The draws happen in a fixed order whatever the options, so a setting of 0 changes
    only its own effect."""
    image = open_image(encoded, what)
    box = random_box(image.size[0], image.size[1], rng, area=(augment.min_area, 1.0))
    flip = rng.random() < 0.5
    pixels = _crop_resize(image, box, size, what)
    if flip:
        pixels = pixels[:, ::-1]
    rows = pixels.reshape(-1, 3)
    matrix, shift = colour_matrix(rows.mean(axis=0), rng, augment.jitter, augment.pca_noise)
    out = rows.astype(np.float32) @ matrix.astype(np.float32)
    out += shift.astype(np.float32)
    np.clip(out, 0, 255, out=out)
    return _to_tensor(out.reshape(size, size, 3), dtype)


def _to_tensor(pixels: np.ndarray, dtype) -> np.ndarray:
    """float32 HWC pixels in 0-255 (modified in place) to normalised CHW of `dtype`."""
    pixels *= np.float32(1 / 255) / IMAGENET_STD
    pixels -= IMAGENET_MEAN / IMAGENET_STD
    return np.ascontiguousarray(pixels.transpose(2, 0, 1), dtype=dtype)


def eval_transform(encoded: bytes, size: int, what: str, dtype="float32") -> np.ndarray:
    """Decode `encoded`, resize its shorter side to ``size * 256/224`` and centre crop."""
    image = open_image(encoded, what)
    box = centre_box(image.size[0], image.size[1], 224 / 256)
    return _to_tensor(_crop_resize(image, box, size, what).astype(np.float32), dtype)
