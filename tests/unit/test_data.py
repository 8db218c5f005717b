import os

import numpy as np
import pytest

from hvdtrain.data.datasets import (CIFAR_RECORD, DatasetError, digits_arrays, load_cifar10,
                                   load_digits, SYNTHETIC_BYTES, make_synthetic,
                                   write_cifar_files)
from hvdtrain.data.load import load_dataset
from hvdtrain.data.loader import BatchLoader, normalize, random_crop_flip
from hvdtrain.data.sampler import SplitSampler


def test_digits_fixed_split():
    data = load_digits()
    assert data.train_x.shape == (1437, 1, 8, 8) and data.test_x.shape == (360, 1, 8, 8)
    assert data.num_classes == 10 and 0.0 <= data.train_x.min() and data.train_x.max() <= 1.0
    again = load_digits()
    assert np.array_equal(data.test_y, again.test_y)


def test_bundled_digits_are_ucis_test_set():
    """The bundled file against what UCI publishes of "Optical Recognition of Handwritten
    Digits": its test set (optdigits.tes, the 1,797 images scikit-learn's load_digits gives)
    has this many images of each class (optdigits.names), each 8x8 with values 0-16, and
    its first image is a zero."""
    images, labels = digits_arrays()
    assert images.shape == (1797, 8, 8) and images.dtype == np.uint8
    assert images.min() == 0 and images.max() == 16
    assert np.bincount(labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    assert labels[0] == 0 and images[0, 0].tolist() == [0, 0, 5, 13, 9, 1, 0, 0]


def test_cifar_binary_round_trip(tmp_path):
    write_cifar_files(str(tmp_path), num_train=23, num_test=7)
    data = load_cifar10(str(tmp_path))
    assert data.train_x.shape == (23, 3, 32, 32) and data.train_x.dtype == np.uint8
    assert data.test_y.shape == (7,) and data.augment
    raw = np.fromfile(os.path.join(tmp_path, "test_batch.bin"), np.uint8).reshape(-1, CIFAR_RECORD)
    assert np.array_equal(data.test_x[3].reshape(-1), raw[3, 1:])
    assert data.test_y[3] == raw[3, 0]


def test_cifar_in_the_extracted_subfolder(tmp_path):
    write_cifar_files(str(tmp_path / "cifar-10-batches-bin"), num_train=5, num_test=2)
    assert len(load_dataset("cifar10", str(tmp_path)).train_y) == 5


def test_cifar_missing_files_says_where_and_how(tmp_path):
    with pytest.raises(DatasetError) as err:
        load_cifar10(str(tmp_path))
    message = str(err.value)
    assert str(tmp_path) in message and "data_batch_1.bin" in message and "cifar" in message
    assert "\n" not in message


def test_cifar_truncated_file(tmp_path):
    write_cifar_files(str(tmp_path), num_train=10, num_test=2)
    path = tmp_path / "data_batch_3.bin"
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(DatasetError, match="data_batch_3.bin .*truncated"):
        load_cifar10(str(tmp_path))


def test_crop_flip_moves_pixels_only_within_padding():
    rng = np.random.default_rng(0)
    images = rng.integers(1, 255, size=(64, 3, 8, 8), dtype=np.uint8)
    out = random_crop_flip(images, np.random.default_rng(1), pad=2)
    assert out.shape == images.shape and out.dtype == images.dtype
    assert not np.array_equal(out, images)
    # With no padding, a crop is the identity and a flip reverses the columns.
    same = random_crop_flip(images, np.random.default_rng(2), pad=0)
    for a, b in zip(same, images):
        assert np.array_equal(a, b) or np.array_equal(a, b[:, :, ::-1])
    assert np.array_equal(random_crop_flip(images, np.random.default_rng(1), pad=2), out)


def test_normalize_per_channel():
    images = np.full((2, 3, 2, 2), 255, np.uint8)
    out = normalize(images, (0.5, 0.5, 0.0), (0.5, 0.25, 1.0))
    assert out.dtype == np.float32
    assert np.allclose(out[:, 0], 1.0) and np.allclose(out[:, 1], 2.0) and np.allclose(out[:, 2], 1.0)


@pytest.mark.parametrize("data_workers", [0, 1, 3])
def test_loader_batches_follow_the_sampler(data_workers):
    data = make_synthetic(num_train=50, num_test=4)
    sampler = SplitSampler(50, 2, 1, shuffle=True, seed=5)
    loader = BatchLoader(data.train_x, data.train_y, sampler, 8, augment=True, mean=data.mean,
                         std=data.std, data_workers=data_workers, seed=5)
    batches = list(loader)
    assert len(batches) == len(loader) == 4
    assert [len(y) for _, y in batches] == [8, 8, 8, 1]
    assert np.array_equal(np.concatenate([y for _, y in batches]), data.train_y[sampler.indices()])
    inline = list(BatchLoader(data.train_x, data.train_y, sampler, 8, augment=True,
                              mean=data.mean, std=data.std, data_workers=0, seed=5))
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(batches, inline))


def test_synthetic_images_take_the_image_size_within_a_memory_bound():
    """`--dataset synthetic --image-size 224` (a run's figure without its input work) must
    not allocate 8192 ImageNet-sized images (4.6 GiB) as the 32-pixel default does."""
    default = load_dataset("synthetic")
    assert default.image_shape == (3, 32, 32) and default.num_train == 8192
    assert default.num_test == 1024
    large = load_dataset("synthetic", image_size=224)
    assert large.image_shape == (3, 224, 224)
    assert 64 <= large.num_train and large.train_x.nbytes <= SYNTHETIC_BYTES
    assert large.num_test == large.num_train // 8 and large.test_x.shape[1:] == (3, 224, 224)
