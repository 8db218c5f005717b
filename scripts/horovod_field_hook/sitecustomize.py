"""Measurement hook of scripts/run_horovod_scripts.py ``--dump DIR``; no part of any script.

Python imports ``sitecustomize`` at start-up; the runner puts this folder on PYTHONPATH of
the script's processes when asked to measure, under either module alike. It records:

- ``rank{R}-step0.npz`` and ``rank{R}-step1.npz``: every array the script's trainer was
  given (weights and running statistics), just before and just after its first ``step``;
- ``rank{R}-epoch{E}.npz``: the same arrays after epoch E, taken when the next pass over
  the training DataLoader begins (after the script's own evaluation and saves, before the
  next epoch's first batch) or at exit. An epoch is a pass over a DataLoader during which
  the trainer stepped; a script that steps without a DataLoader gets one epoch, at exit. At exit the dump waits for the arrays, and so for the last step's
  exchange: a script that leaves without waiting for it (GluonCV's train_ssd.py on ranks
  other than 0) fails under horovod.mxnet without the hook (docs/horovod-field.md);
- ``rank{R}-steps.json``: each step's start time (``time.perf_counter``) and the
  process's CPU seconds then (``time.process_time``: every thread, MXNet's and Horovod's
  included; less sensitive to other jobs on the host than wall time), and the step index
  each epoch ended at.

With HVDFIELD_SEED set it also seeds Python's, NumPy's and MXNet's generators with
SEED + rank at start-up, so that two runs (one per module) draw the same initial weights,
shuffles and augmentations and their first steps can be compared.
"""
import atexit
import json
import os
import time

DUMP = os.environ.get("HVDFIELD_DUMP")
RANK = int(os.environ.get("HVDFIELD_RANK", "0"))


class Recorder:
    """The trainer's arrays and step times of this rank."""

    def __init__(self, folder):
        self.folder = folder
        self.params = None
        self.times = []
        self.cpu = []   # the process's CPU seconds (every thread) at each step's start
        self.epoch_ends = []
        self.pending = False   # a loader pass with steps ended; its epoch not dumped yet
        self.train_loader = None  # the loader of that pass

    def dump(self, label):
        import numpy as np
        arrays = {p.name: p.data().asnumpy() for p in self.params}
        np.savez(os.path.join(self.folder, f"rank{RANK}-{label}.npz"), **arrays)

    def end_epoch(self):
        self.dump(f"epoch{len(self.epoch_ends)}")
        self.epoch_ends.append(len(self.times))
        self.pending = False

    def before_step(self):
        if not self.times:
            self.dump("step0")
        self.times.append(time.perf_counter())
        self.cpu.append(time.process_time())

    def after_step(self):
        if len(self.times) == 1:
            self.dump("step1")

    def at_exit(self):
        if self.params is None:
            return
        # A script that reads no DataLoader (Horovod's example iterates an mx.io.DataIter):
        # its arrays at exit, as its last epoch's.
        if self.pending or (self.times and not self.epoch_ends):
            self.end_epoch()
        with open(os.path.join(self.folder, f"rank{RANK}-steps.json"), "w") as out:
            json.dump({"times": self.times, "cpu": self.cpu, "epoch_ends": self.epoch_ends},
                      out)


def install(recorder):
    from mxnet import gluon

    init = gluon.Trainer.__init__

    def trainer_init(self, params, *args, **kwargs):
        init(self, params, *args, **kwargs)
        if recorder.params is not None:
            return  # the script's first trainer is the one measured
        recorder.params = list(params.values()) if hasattr(params, "values") else list(params)
        # Registered now, after the script imported Horovod: run before Horovod's own exit
        # handler shuts it down (last registered, first run), while the last step's
        # exchange can still finish.
        atexit.register(recorder.at_exit)
        step = self.step

        def measured_step(*a, **k):
            recorder.before_step()
            out = step(*a, **k)
            recorder.after_step()
            return out
        self.step = measured_step

    gluon.Trainer.__init__ = trainer_init
    loader_iter = gluon.data.DataLoader.__iter__

    def iterate(self):
        if recorder.pending and self is recorder.train_loader:
            recorder.end_epoch()  # the next epoch begins: before its first batch
        before = len(recorder.times)
        yield from loader_iter(self)
        if len(recorder.times) > before:
            recorder.train_loader, recorder.pending = self, True
    gluon.data.DataLoader.__iter__ = iterate


def seed(value):
    import random
    import mxnet as mx
    import numpy as np
    random.seed(value + RANK)
    np.random.seed(value + RANK)
    mx.random.seed(value + RANK)


if os.environ.get("HVDFIELD_SEED"):
    seed(int(os.environ["HVDFIELD_SEED"]))
if DUMP:
    os.makedirs(DUMP, exist_ok=True)
    install(Recorder(DUMP))
