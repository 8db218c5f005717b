"""Which errors of a decoder make a bad sample (skipped and counted) and which stop the run."""
import io

import numpy as np
import pytest
from PIL import Image

from hvdtrain.data import transforms as T
from hvdtrain.data.errors import BadSample


@pytest.mark.parametrize("raised,skipped", [
    (MemoryError, False), (RecursionError, False), (SyntaxError, True), (ValueError, True),
    (OSError, True), (Image.DecompressionBombError, True)])
def test_only_errors_of_bad_data_make_a_bad_sample(monkeypatch, raised, skipped):
    """The decoders caught every Exception, MemoryError included, and skipped the sample:
    a process out of memory went on skipping image after image. Pillow's errors for bad
    data (those its own fuzzing tests accept) still skip it."""
    png = io.BytesIO()
    Image.fromarray(np.zeros((18, 26, 3), np.uint8)).save(png, "PNG")
    image = T.open_image(png.getvalue(), "x.png")

    def failing(*args, **kwargs):
        raise raised("raised in Image.open")

    monkeypatch.setattr(Image, "open", failing)
    for call in (lambda: T.open_image(png.getvalue(), "x.png"),
                 lambda: T._pillow_decode(image, 1, "x.png")):
        if skipped:
            with pytest.raises(BadSample, match="x.png: cannot decode"):
                call()
        else:
            with pytest.raises(raised):
                call()


def test_an_opencv_decoder_error_is_a_bad_sample(monkeypatch):
    """Where OpenCV decodes (Pillow unusable in the process), most bad data gives None, but
    some of its decoders raise cv2.error instead: that too is one bad sample."""
    import cv2
    png = io.BytesIO()
    Image.fromarray(np.zeros((18, 26, 3), np.uint8)).save(png, "PNG")
    image = T.open_image(png.getvalue(), "x.png")

    def failing(*args, **kwargs):
        raise cv2.error("raised in imdecode")

    monkeypatch.setattr(cv2, "imdecode", failing)
    with pytest.raises(BadSample, match="x.png: cannot decode"):
        T._opencv_decode(image, 1, "x.png")
