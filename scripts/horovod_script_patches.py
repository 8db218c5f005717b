"""What scripts/run_horovod_scripts.py changes in the field's Horovod scripts, and why.

The import of ``horovod.mxnet`` is the one change a user makes (:data:`IMPORTS`). The other
patches are what each script needs to run at all on a CPU host with small generated data,
and are applied whichever module the script is run with (``horovod.mxnet`` too), so that
the two runs differ in the import alone. Each patch names the text it expects and how often:
a file that differs (another release) is refused, never half patched. docs/horovod-field.md
lists them with the command lines they were measured with.
"""
import re
from typing import NamedTuple, Tuple

# `import horovod.mxnet as hvd`, `from horovod.mxnet import X`, `import horovod.mxnet`
# (then used as horovod.mxnet.X: the name is bound to the new module).
IMPORTS = (
    (re.compile(r"^(\s*)import\s+horovod\.mxnet\s+as\s+(\w+)", re.M), r"\1import {module} as \2"),
    (re.compile(r"^(\s*)from\s+horovod\.mxnet(\.\w+)*\s+import\b", re.M),
     r"\1from {module}\2 import"),
)


class Patch(NamedTuple):
    why: str
    pattern: str   # a regular expression (re.M)
    repl: str
    count: int     # how often the pattern is in the release's file


# GluonCV 0.10's scripts/classification/imagenet/train_horovod.py.
TRAIN_HOROVOD = (
    Patch("autogluon is imported unconditionally but only used for --input-size >= 320 "
          "(and --auto_aug); GluonCV does not depend on it",
          r"^(\s*)from autogluon\.utils import pil_transforms$",
          r"\1try:\n\1    from autogluon.utils import pil_transforms\n"
          r"\1except ImportError:  # run_horovod_scripts.py: used for --input-size >= 320 only\n"
          r"\1    pil_transforms = None", 2),
    Patch("the class count is ImageNet's 1000, fixed: the generated data's count from "
          "HVDFIELD_CLASSES (default 1000)",
          r"^num_classes = 1000$",
          "num_classes = int(os.environ.get('HVDFIELD_CLASSES', '1000'))", 1),
    Patch("input_size is passed to every model's constructor, and resnet18_v1 and "
          "mobilenet1.0 take none (TypeError): not passed (the transforms still use it)",
          r"^(\s*'classes': num_classes),\n\s*'input_size': args\.input_size\}$",
          r"\1}", 1),
)

# GluonCV 0.10's scripts/detection/ssd/train_ssd.py.
TRAIN_SSD = (
    Patch("--horovod pins a GPU (mx.gpu(local_rank)) whatever --gpus says: the CPU of the "
          "same index instead",
          r"ctx = \[mx\.gpu\(hvd\.local_rank\(\)\)\]", "ctx = [mx.cpu(hvd.local_rank())]", 1),
    Patch("the base network's ImageNet weights are downloaded (pretrained_base=True): "
          "random weights instead, nothing is downloaded",
          r"get_model\(net_name, pretrained_base=True, norm_layer=gluon\.nn\.BatchNorm\)",
          "get_model(net_name, pretrained_base=False, norm_layer=gluon.nn.BatchNorm)", 1),
    Patch("VOC is read from ~/.mxnet/datasets/voc whatever --dataset-root says, VOC2007 and "
          "VOC2012: from --dataset-root (as COCO is), the generated set's VOC2007 only",
          r"gdata\.VOCDetection\(\n(\s*)splits=\[\(2007, 'trainval'\), \(2012, 'trainval'\)\]\)",
          r"gdata.VOCDetection(root=os.path.join(os.path.expanduser(args.dataset_root), 'voc'),"
          r"\n\1splits=[(2007, 'trainval')])", 1),
    Patch("(the same for the validation set)",
          r"gdata\.VOCDetection\(\n(\s*)splits=\[\(2007, 'test'\)\]\)",
          r"gdata.VOCDetection(root=os.path.join(os.path.expanduser(args.dataset_root), 'voc'),"
          r"\n\1splits=[(2007, 'test')])", 1),
    Patch("(for measuring only; no effect unless HVDFIELD_SEED_PER_RANK=1) every rank is "
          "seeded alike and reads the whole training set, so the ranks train on the same "
          "batches: with the variable set each rank's seed is --seed + rank",
          r"^(\s*)gutils\.random\.seed\(args\.seed\)$",
          r"\1gutils.random.seed(args.seed + (hvd.rank() if args.horovod and os.environ.get("
          r"'HVDFIELD_SEED_PER_RANK') == '1' else 0))", 1),
)

# Horovod 0.28.1's examples/mxnet/mxnet_imagenet_resnet50.py (its synthetic-data mode).
IMAGENET_RESNET50 = (
    Patch("the class count is ImageNet's 1000, fixed: from HVDFIELD_CLASSES (default 1000)",
          r"^num_classes = 1000$",
          "num_classes = int(os.environ.get('HVDFIELD_CLASSES', '1000'))", 1),
    Patch("an epoch is sized from ImageNet's 1,281,167 samples (about 40,000 steps a rank "
          "at batch 16): from HVDFIELD_SAMPLES (default 1281167)",
          r"^num_training_samples = 1281167$",
          "num_training_samples = int(os.environ.get('HVDFIELD_SAMPLES', '1281167'))", 1),
    Patch("the synthetic images are 224 x 224: HVDFIELD_IMAGE_SIZE (default 224) a side",
          r"^(\s*)image_shape = \(3, 224, 224\)$",
          r"\1image_shape = (3,) + (int(os.environ.get('HVDFIELD_IMAGE_SIZE', '224')),) * 2",
          1),
)

PATCHES = {
    "train_horovod.py": TRAIN_HOROVOD,
    "train_ssd.py": TRAIN_SSD,
    "mxnet_imagenet_resnet50.py": IMAGENET_RESNET50,
}


RELEASES = {"mxnet_imagenet_resnet50.py": "Horovod 0.28.1"}  # the others: GluonCV 0.10's


class PatchError(Exception):
    """A file that is not the release's: a patch's text found another number of times."""


def change_imports(text: str, module: str) -> Tuple[str, int]:
    """`text` with its imports of horovod.mxnet changed to `module`, and how many."""
    total = 0
    for pattern, repl in IMPORTS:
        text, count = pattern.subn(repl.format(module=module), text)
        total += count
    return text, total


def apply_patches(name: str, text: str) -> Tuple[str, Tuple[Patch, ...]]:
    """`text` (the file `name`) with its patches applied; raises PatchError when one's text
    is not there as often as in the release."""
    patches = PATCHES.get(name, ())
    for patch in patches:
        text, count = re.subn(patch.pattern, patch.repl, text, flags=re.M)
        if count != patch.count:
            raise PatchError(f"{name}: expected {patch.count} of {patch.pattern!r}, found "
                             f"{count}: not the release run_horovod_scripts.py knows "
                             f"({RELEASES.get(name, 'GluonCV 0.10')})")
    return text, patches
