"""``hvdtrain`` that also records every elastic commit and restore, for the elastic fault test.

Run as ``python elastic_commits.py RECORD_DIR <hvdtrain flags>``: the job is the ``hvdtrain``
command itself; only :class:`~hvdtrain.loop.elastic.state.GluonState`'s commit (its
``_save_model``) and ``restore`` are wrapped, each appending one JSON line to
``RECORD_DIR/<pid>.jsonl`` once it has returned (a commit that raised records nothing)::

    {"event": "commit" | "restored", "rank": R, "alone": A, "epoch": E, "step": S,
     "arrays": CRC, "optimizer": CRC}

``arrays`` is the CRC of every array of the net, in the order and the format of the digest
each rank logs after a sync (``loop/elastic/fit.py``'s ``params_digest``): for a commit, of
the arrays the commit holds; after a restore, of the net's live arrays. ``optimizer`` is the
CRC of the optimizer state's bytes the commit holds (after a restore: the bytes restored).
"""
import json
import os
import sys
import zlib

import numpy as np


def _crc_arrays(arrays):
    crc = 0
    for _, value in sorted(arrays.items()):
        crc = zlib.crc32(value.tobytes(), crc)
    return f"{crc:08x}"


def _crc_bytes(blob):
    return f"{zlib.crc32(np.asarray(memoryview(blob), dtype=np.uint8).tobytes()):08x}"


def install(record_dir):
    from hvdtrain.loop.elastic.state import GluonState
    from hvdtrain.store.gluon_internals import params_by_place

    path = os.path.join(record_dir, f"{os.getpid()}.jsonl")

    def record(state, event, arrays, alone=False):
        try:
            rank = state._rank()
        except ValueError:  # Horovod down already (a restore after a failed collective)
            rank = None
        with open(path, "a") as out:
            out.write(json.dumps(dict(
                event=event, rank=rank, alone=alone,
                epoch=state._saved_position.epoch, step=state._saved_position.step,
                arrays=arrays, optimizer=_crc_bytes(state._saved_optimizer))) + "\n")

    save_model, restore = GluonState._save_model, GluonState.restore

    def recording_save_model(self, alone=False):
        save_model(self, alone=alone)
        if hasattr(self, "_rank"):  # not the constructor's first copy: no rank yet
            record(self, "commit", _crc_arrays(self._saved_arrays), alone)

    def recording_restore(self):
        restore(self)
        live = {name: p.data().asnumpy() for name, p in params_by_place(self.net).items()}
        record(self, "restored", _crc_arrays(live))

    GluonState._save_model = recording_save_model
    GluonState.restore = recording_restore


def records(record_dir):
    """{pid: [record, ...]} in the order each process wrote them."""
    found = {}
    for name in os.listdir(record_dir):
        with open(os.path.join(record_dir, name)) as src:
            found[int(name.split(".")[0])] = [json.loads(line) for line in src
                                              if line.endswith("\n")]
    return found


if __name__ == "__main__":
    install(sys.argv[1])
    from hvdtrain.cli import run
    sys.argv = ["hvdtrain"] + sys.argv[2:]
    run()
