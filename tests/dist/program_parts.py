"""What the test programs share: their OPTION=VALUE arguments, a net's arrays by their place,
a digest of every array at each epoch's end (to compare the ranks epoch by epoch), and a
dataset whose chosen samples cannot be read (the documented BadSample protocol)."""
import hashlib

from mxnet import gluon

from hvdtrain import BadSample
from hvdtrain.estimator import EpochEnd


def value(text):
    """An option's value: an int, else a float, else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def options(args):
    """``["a=1", "b=x"]`` -> ``{"a": 1, "b": "x"}``."""
    return dict((k, value(v)) for k, v in (a.split("=", 1) for a in args))


def arrays_of(net):
    """Every array of `net` by its place ("0.weight"), as numpy arrays."""
    return {name: p.data().asnumpy()
            for name, p in net._collect_params_with_prefix().items()}  # pylint: disable=protected-access


class EpochDigests(EpochEnd):
    """A digest of every array (running statistics included: averaged by then) at each
    epoch's end, as this rank holds them."""

    def __init__(self):
        self.digests = []

    def epoch_end(self, estimator, *args, **kwargs):
        digest = hashlib.sha256()
        for name, array in sorted(arrays_of(estimator.net).items()):
            digest.update(name.encode() + array.tobytes())
        self.digests.append(digest.hexdigest()[:16])


class Unusable(gluon.data.Dataset):
    """`dataset` whose samples `bad` cannot be read: they raise BadSample."""

    def __init__(self, dataset, bad):
        self.dataset, self.bad = dataset, set(int(i) for i in bad)

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        if index in self.bad:
            raise BadSample(f"sample {index} (made unusable by the test)")
        return self.dataset[index]
