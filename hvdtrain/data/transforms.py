"""ImageNet's train and evaluation transforms, one encoded image at a time.

Training: random resized crop to `size` (area 8-100 %, aspect 3/4-4/3, as GluonCV's
``RandomResizedCrop``), horizontal flip, colour jitter (brightness, contrast, saturation 0.4,
in random order) and PCA lighting noise (0.1), as GluonCV's ``train_imagenet.py`` does.
Evaluation: resize the shorter side to ``size * 256 / 224``, centre crop `size`. Both end
with ImageNet's mean/std normalisation, channels first.

Every random draw comes from ``numpy.random.default_rng([seed, epoch, sample])``, so an image
is transformed the same whichever thread or process does it, and a resumed epoch repeats it.

Decoding is Pillow's (libjpeg-turbo; a 500x375 JPEG takes about half the instructions
of ``cv2.imdecode`` here, and comes out RGB), resizing OpenCV's (``cv2.resize``); both
release the GIL, so ``--data-workers`` threads decode in parallel. A JPEG is decoded at 1/2,
1/4 or 1/8 scale (libjpeg's DCT scaling, Pillow's ``draft``) when the crop stays at least
the output size, which is most of the cost saved on large photos. Where Pillow's decoder
is unusable in the process (see :func:`jpeg_decoder`), OpenCV decodes instead. The image's
size, needed before the crop box is drawn, is read from its header alone.
"""
from __future__ import annotations

import functools
import io
import math
import struct
from dataclasses import dataclass
from typing import Optional, Tuple

import cv2
import numpy as np
from PIL import Image

from .errors import BadSample, DatasetError

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
# Normalisation of 0-255 pixels: x * scale - offset.
NORM_SCALE = (1 / 255) / IMAGENET_STD
NORM_OFFSET = IMAGENET_MEAN / IMAGENET_STD
# Evaluation keeps the centred square of this share of the shorter side, resized to the
# input size: the shorter side resized to size * 256/224, then a size x size centre crop.
EVAL_CROP_FRACTION = 224 / 256


# What Pillow raises for data it cannot decode: the list its own fuzzing tests accept
# (Tests/oss-fuzz/test_fuzzers.py; UnidentifiedImageError is an OSError), and what its
# plugins let through. Anything else (MemoryError above all, or a bug) is not a bad image
# and must stop the job, not be skipped image after image.
PILLOW_DATA_ERRORS = (OSError, SyntaxError, ValueError, NotImplementedError, OverflowError,
                      EOFError, struct.error, Image.DecompressionBombError)

# DCT scale factors of a JPEG decode, largest reduction first. EXIF orientation is not
# applied (Pillow's open and mx.image.imdecode do not; ImageRecordIter does: docs/data.md).
REDUCTIONS = (8, 4, 2, 1)
_OPENCV_REDUCED = {8: cv2.IMREAD_REDUCED_COLOR_8, 4: cv2.IMREAD_REDUCED_COLOR_4,
                   2: cv2.IMREAD_REDUCED_COLOR_2, 1: cv2.IMREAD_COLOR}


@dataclass(frozen=True)
class Encoded:
    """An encoded image and what its header says: ``size`` (width, height) and ``format``."""

    data: bytes
    size: Tuple[int, int]
    format: str


# JPEG start-of-frame markers (SOF0-SOF15 but DHT, JPG and DAC), where the size is.
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg_size(encoded: bytes) -> Optional[Tuple[int, int]]:
    """(width, height) from a JPEG's frame header, or None where the markers up to it do
    not parse (Pillow then judges the file)."""
    if not encoded.startswith(b"\xff\xd8"):
        return None
    at = 2
    while at + 9 <= len(encoded):
        if encoded[at] != 0xFF:
            return None
        marker = encoded[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in _SOF:
            height, width = struct.unpack_from(">HH", encoded, at + 5)
            return (width, height) if width and height else None
        if marker in (0xD9, 0xDA):  # end of image or start of scan before any frame
            return None
        at += 2 + struct.unpack_from(">H", encoded, at + 2)[0]
    return None


def open_image(encoded: bytes, what: str) -> Encoded:
    """Read the header of `encoded` (raises :class:`BadSample` naming `what`).

    A JPEG's size is read from its frame header directly (a tenth of what Pillow's open
    costs, a twentieth of the decode); anything else, or a JPEG whose markers do not parse,
    is opened by Pillow."""
    if not encoded:
        raise BadSample(f"{what}: cannot decode (the file is empty: 0 bytes)")
    size = _jpeg_size(encoded)
    if size is not None:
        return Encoded(encoded, size, "JPEG")
    try:
        with Image.open(io.BytesIO(encoded)) as image:
            return Encoded(encoded, image.size, image.format)
    except PILLOW_DATA_ERRORS as err:
        # Pillow's "cannot identify image file <_io.BytesIO object at 0x...>" names our
        # buffer, not the file: `what` names the file.
        reason = "not an image format Pillow or OpenCV reads" \
            if type(err).__name__ == "UnidentifiedImageError" else f"{type(err).__name__}: {err}"
        raise BadSample(f"{what}: cannot decode ({reason})") from None


def _decode(image: Encoded, reduce: int, what: str) -> np.ndarray:
    """RGB uint8 HWC pixels of `image`, a JPEG at 1/`reduce` scale."""
    # libjpeg only warns on a truncated JPEG (both decoders return it grey-filled): one
    # without its end marker after the scan is refused here, as Pillow's strict load does.
    if image.format == "JPEG" and image.data.find(b"\xff\xd9", image.data.find(b"\xff\xda")) < 0:
        raise BadSample(f"{what}: cannot decode (truncated JPEG: no end marker)")
    if jpeg_decoder() == "pillow":
        return _pillow_decode(image, reduce, what)
    return _opencv_decode(image, reduce, what)


def _pillow_decode(image: Encoded, reduce: int, what: str) -> np.ndarray:
    try:
        with Image.open(io.BytesIO(image.data)) as opened:
            if image.format == "JPEG" and reduce > 1:
                width, height = image.size
                opened.draft("RGB", (max(1, width // reduce), max(1, height // reduce)))
            if opened.mode == "RGB":
                return np.asarray(opened)
            if opened.mode.startswith("I"):
                # 16-bit grey (a PNG's I;16, or I): its top 8 bits, as OpenCV reads it;
                # Pillow's convert would clip every value above 255 to white.
                grey = (np.asarray(opened).astype(np.uint32) >> 8).clip(0, 255)
                return np.repeat(grey.astype(np.uint8)[:, :, None], 3, axis=2)
            # Grey, palette, CMYK or alpha images become RGB, as OpenCV's colour read does.
            return np.asarray(opened.convert("RGB"))
    except PILLOW_DATA_ERRORS as err:
        raise BadSample(f"{what}: cannot decode ({type(err).__name__}: {err})") from None


def _opencv_decode(image: Encoded, reduce: int, what: str) -> np.ndarray:
    flag = _OPENCV_REDUCED[reduce if image.format == "JPEG" else 1]
    try:
        pixels = cv2.imdecode(np.frombuffer(image.data, np.uint8),
                              flag | cv2.IMREAD_IGNORE_ORIENTATION)
    except cv2.error:  # most bad data gives None; some decoders raise instead
        pixels = None
    if pixels is None:
        raise BadSample(f"{what}: cannot decode (OpenCV could not read it as "
                        f"{image.format or 'an image'})")
    return cv2.cvtColor(pixels, cv2.COLOR_BGR2RGB)


def _probe_jpeg() -> Tuple[bytes, np.ndarray]:
    """A small colour JPEG (encoded by OpenCV, whose libjpeg is its own) and its pixels."""
    pixels = np.zeros((16, 16, 3), np.uint8)
    pixels[:] = (200, 30, 60)  # RGB
    ok, encoded = cv2.imencode(".jpg", cv2.cvtColor(pixels, cv2.COLOR_RGB2BGR))
    assert ok, "OpenCV cannot encode a JPEG"
    return encoded.tobytes(), pixels


@functools.lru_cache(maxsize=None)
def jpeg_decoder() -> str:
    """The JPEG decoder this process uses: ``"pillow"``, or ``"opencv"`` where Pillow's is
    unusable, checked once per process on a small JPEG.

    Pillow's C module binds its libjpeg calls when it is loaded: if libmxnet's own libjpeg
    was loaded globally before it (``import horovod.mxnet`` does so), those calls reach the
    wrong library and every decode fails. OpenCV's libjpeg is built into its module and
    works in any import order. hvdtrain's own programs import Pillow first."""
    encoded, pixels = _probe_jpeg()
    for name, decode in (("pillow", _pillow_decode), ("opencv", _opencv_decode)):
        try:
            decoded = decode(Encoded(encoded, (16, 16), "JPEG"), 1, "probe")
        except BadSample:
            continue
        if np.abs(decoded.astype(int) - pixels).max() <= 8:
            return name
    raise DatasetError("neither Pillow nor OpenCV can decode JPEGs in this process: "
                       "reinstall them (scripts/install-deps.sh)")


def decodes(encoded: bytes, what: str) -> None:
    """Raise :class:`BadSample` naming `what` unless `encoded` decodes as training decodes
    it (a JPEG at 1/8 scale: a fraction of a full decode's cost)."""
    _decode(open_image(encoded, what), 8, what)


def _crop_resize(image: Encoded, box: Tuple[float, float, float, float], size: int,
                 what: str) -> np.ndarray:
    """Crop `box` (in the full image's pixels) and resize it to size x size, RGB uint8 HWC.

    A JPEG is first decoded at 1/2, 1/4 or 1/8 scale when the crop stays at least `size`;
    the box is then rounded to whole pixels of the decoded image (at most half a pixel).
    """
    width, height = image.size
    crop_w, crop_h = box[2] - box[0], box[3] - box[1]
    reduce = next(f for f in REDUCTIONS if crop_w / f >= size and crop_h / f >= size or f == 1)
    pixels = _decode(image, reduce, what)
    scale_x, scale_y = pixels.shape[1] / width, pixels.shape[0] / height
    x0, x1 = round(box[0] * scale_x), max(round(box[2] * scale_x), round(box[0] * scale_x) + 1)
    y0, y1 = round(box[1] * scale_y), max(round(box[3] * scale_y), round(box[1] * scale_y) + 1)
    crop = pixels[y0:y1, x0:x1]
    # Bilinear, as ImageRecordIter: after a reduced decode a JPEG crop shrinks by less than
    # 2x, where it aliases little; area averaging (10x slower) only for larger shrinks.
    shrink = min(crop.shape[0], crop.shape[1]) / size
    return cv2.resize(crop, (size, size),
                      interpolation=cv2.INTER_AREA if shrink >= 2 else cv2.INTER_LINEAR)


def check_jpeg_codec() -> None:
    """Refuse, in one line, a process where no decoder can read JPEGs (every image would be
    skipped as undecodable); otherwise settle which decoder it uses."""
    jpeg_decoder()


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
    matrix, shift = _IDENTITY, _ZEROS
    for which in rng.permutation(3):
        alpha = 1.0 + rng.uniform(-jitter, jitter)
        if which == 2:  # saturation mixes the channels
            step = alpha * _IDENTITY + (1 - alpha) * _GRAY_ROWS
            matrix, shift = matrix @ step, shift @ step
            continue
        offset = (1 - alpha) * float((mean @ matrix + shift) @ GRAY) if which == 1 else 0.0
        matrix, shift = alpha * matrix, alpha * shift + offset
    noise = rng.normal(0, pca_noise, size=3)
    return matrix, shift + EIGVEC @ (noise * EIGVAL)


# colour_matrix's constants (3x3 products are microseconds; making these each time was not).
_IDENTITY, _ZEROS = np.eye(3), np.zeros(3)
_GRAY_ROWS = np.outer(GRAY, np.ones(3))


@dataclass(frozen=True)
class Augment:
    """How strongly training transforms vary an image (ImageNet's defaults)."""

    min_area: float = 0.08
    jitter: float = JITTER
    pca_noise: float = LIGHTING


def train_transform(encoded: bytes, size: int, rng: np.random.Generator, what: str,
                    dtype="float32", augment: Augment = Augment(),
                    out: Optional[np.ndarray] = None) -> np.ndarray:
    """Decode `encoded` and apply the training augmentation; a CHW array of `dtype`
    (written into `out` when given, e.g. a batch's slot).

    The draws happen in a fixed order whatever the options, so a setting of 0 changes
    only its own effect. Colour map and clipping are one saturating pass of OpenCV
    (``cv2.transform`` on uint8), normalisation one more."""
    image = open_image(encoded, what)
    box = random_box(image.size[0], image.size[1], rng, area=(augment.min_area, 1.0))
    flip = rng.random() < 0.5
    pixels = _crop_resize(image, box, size, what)
    if flip:
        pixels = cv2.flip(pixels, 1)
    mean = np.array(cv2.mean(pixels)[:3])
    matrix, shift = colour_matrix(mean, rng, augment.jitter, augment.pca_noise)
    # Row form p @ m + c to OpenCV's column form [m.T | c]. On uint8 pixels the result
    # saturates to 0-255 (the clip) and rounds to whole levels, as ImageRecordIter's
    # uint8 augmenters do: one pass where float pixels needed five.
    coloured = cv2.transform(pixels, np.hstack([matrix.T, shift[:, None]]).astype(np.float32))
    return _normalized_chw(coloured, dtype, out)


def _normalized_chw(pixels: np.ndarray, dtype, out: Optional[np.ndarray],
                    scale: np.ndarray = NORM_SCALE,
                    offset: np.ndarray = NORM_OFFSET) -> np.ndarray:
    """uint8 HWC `pixels` normalised as ``pixel * scale - offset`` per channel (ImageNet's
    mean and std by default), a CHW array of `dtype` (in `out` when given); each plane
    computed in float32 and rounded to `dtype` once."""
    if out is None:
        out = np.empty((3,) + pixels.shape[:2], dtype)
    for channel, plane in enumerate(cv2.split(pixels)):
        if out.dtype == np.float32:
            np.multiply(plane, scale[channel], out=out[channel], dtype=np.float32)
            out[channel] -= offset[channel]
        else:
            out[channel] = np.multiply(plane, scale[channel], dtype=np.float32) \
                - offset[channel]
    return out


def eval_transform(encoded: bytes, size: int, what: str, dtype="float32",
                   out: Optional[np.ndarray] = None, crop_fraction: float = EVAL_CROP_FRACTION,
                   mean=IMAGENET_MEAN, std=IMAGENET_STD) -> np.ndarray:
    """Decode `encoded`, keep the centred square of `crop_fraction` of its shorter side
    (ImageNet's: the shorter side resized to ``size * 256/224``, a `size` centre crop),
    resize it to `size` and normalise it as ``(pixel / 255 - mean) / std``.

    Training's evaluation uses the defaults; ``hvdtrain-predict`` passes what a model's card
    (:mod:`hvdtrain.data.card`) says, which is what its training used."""
    image = open_image(encoded, what)
    box = centre_box(image.size[0], image.size[1], crop_fraction)
    std = np.asarray(std, np.float32)
    scale, offset = (1 / 255) / std, np.asarray(mean, np.float32) / std  # as NORM_SCALE/_OFFSET
    return _normalized_chw(_crop_resize(image, box, size, what), dtype, out, scale, offset)
