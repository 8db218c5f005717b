"""What hvdtrain knows of other packages lives in one room (hvdtrain/ecosystem.py), and
importing hvdtrain patches no class of theirs."""
import ast
import os
import subprocess
import sys
import textwrap

import ecosystem as suite_ecosystem  # tests/ecosystem.py: where GluonCV and GluonNLP are

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Every class of these packages, every attribute of each, as one fresh process holds them
# before and after importing each of hvdtrain's rooms a program imports.
UNTOUCHED = """
    import importlib, sys, types
    import mxnet, mxnet.gluon.contrib.estimator, mxnet.gluon.contrib.estimator.event_handler
    import mxnet.metric, mxnet.optimizer, mxnet.gluon
    import horovod.mxnet
    import gluoncv.loss, gluoncv.utils.metrics, gluonnlp.optimizer

    def classes():
        out = {}
        for name, module in list(sys.modules.items()):
            if not name.split(".")[0] in ("mxnet", "horovod", "gluoncv", "gluonnlp"):
                continue
            for value in list(vars(module).values()):
                if isinstance(value, type) and value.__module__ == name:
                    out[f"{name}.{value.__qualname__}"] = {
                        key: id(item) for key, item in vars(value).items()}
        return out

    before = classes()
    for room in ("hvdtrain", "hvdtrain.estimator", "hvdtrain.horovod", "hvdtrain.cli",
                 "hvdtrain.classify", "hvdtrain.serve", "hvdtrain.job"):
        importlib.import_module(room)
    after = classes()
    changed = sorted(f"{cls}.{key}" for cls, held in before.items()
                     for key in set(held) | set(after[cls])
                     if held.get(key) != after[cls].get(key))
    print(len(before), "classes;", "changed:", changed)
"""


def test_importing_hvdtrain_leaves_every_class_of_mxnet_gluoncv_gluonnlp_horovod_as_it_was():
    """It replaced MXNet's CheckpointHandler.__init__ at import (a cure for a folder race,
    now made when a program makes its Estimator: estimator/checkpoint_handler.py)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT, os.environ.get("PYTHONPATH", ""), suite_ecosystem.DIR]))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(UNTOUCHED)], env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    count, rest = proc.stdout.strip().splitlines()[-1].split(" classes;")
    assert int(count) > 500, proc.stdout  # the packages' classes were seen
    assert rest.strip() == "changed: []", rest


def _string_constants(path):
    with open(path, encoding="utf-8") as src:
        tree = ast.parse(src.read(), path)
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def test_names_of_other_packages_classes_are_held_by_the_room_alone():
    """No module but hvdtrain/ecosystem.py holds a class of GluonCV or GluonNLP by its
    dotted name, or the names of GluonCV's losses and metrics hvdtrain recognises (they
    were in the metric registry, the loss divisors and the sharded update)."""
    from hvdtrain import ecosystem
    names = {*ecosystem.GLUONCV_SOFTMAX_FAMILY, *ecosystem.GLUONCV_OHEM,
             ecosystem.GLUONCV_SSD_LOSS, ecosystem.HOROVOD_SHUT_DOWN}
    found = []
    for folder, _, files in os.walk(os.path.join(ROOT, "hvdtrain")):
        for name in files:
            path = os.path.join(folder, name)
            if not name.endswith(".py") or path.endswith(os.path.join("hvdtrain", "ecosystem.py")):
                continue
            for text in _string_constants(path):
                if text.startswith(("gluoncv.", "gluonnlp.")) or text in names:
                    found.append(f"{os.path.relpath(path, ROOT)}: {text!r}")
    assert not found, found


def test_the_room_is_data_of_the_standard_library_only():
    """Every level may read it (tests/unit/test_layout.py puts it at the lowest): it imports
    nothing and defines no function or class."""
    path = os.path.join(ROOT, "hvdtrain", "ecosystem.py")
    with open(path, encoding="utf-8") as src:
        tree = ast.parse(src.read(), path)
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert all(isinstance(node, ast.ImportFrom) and node.module == "__future__"
               for node in imports)
    assert not [node for node in ast.walk(tree)
                if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Lambda))]
