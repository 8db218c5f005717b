"""``hvdtrain`` that also records which samples each rank trained, for the elastic tests.

Run as ``python elastic_ids.py RECORD_DIR <hvdtrain flags>``: the job is the ``hvdtrain``
command itself; only each call of the epoch loop is wrapped so that every batch it takes
appends one JSON line to ``RECORD_DIR/<pid>.jsonl`` before it is trained:
``{"call": [t0, epoch, start, workers], "pos": P, "ids": [...]}``, where ``call`` names the
epoch loop's call (its start time, epoch, the position it started from and the world size)
and ``P`` is the
position in the epoch's order where the step begins (``TrainState.epoch_samples``). The
ids come from the sampler the loader iterates, sliced as the loader slices it.

:func:`trained_ids` turns the records into what was trained: a rollback or a resize starts
a new call at position ``s`` on every rank (one generation: the same epoch, start and
world size); every batch an earlier generation recorded at ``s`` or later in that epoch was
undone (or never happened), so only the latest generation's batches count there. (Two
rollbacks to the same commit at the same world size would look like one generation.)
"""
import collections
import json
import os
import sys
import time


def install(record_dir):
    import hvdtrain.loop.run.fit as fit_module

    original = fit_module.train_epoch
    path = os.path.join(record_dir, f"{os.getpid()}.jsonl")

    def recording_train_epoch(loop, loader, state):
        ids = loader.sampler.indices()
        call = [time.time(), state.epoch, state.epoch_samples, loader.sampler.num_parts]

        class Recording:
            batch_size = loader.batch_size
            sampler = loader.sampler

            def __len__(self):
                return len(loader)

            def __iter__(self):
                b = loader.batch_size
                with open(path, "a") as out:
                    for number, batch in enumerate(loader):
                        out.write(json.dumps(dict(call=call, pos=state.epoch_samples,
                                                  ids=ids[number * b:(number + 1) * b]
                                                  .tolist())) + "\n")
                        out.flush()  # a rank killed later has still recorded this batch
                        yield batch
        return original(loop, Recording(), state)

    fit_module.train_epoch = recording_train_epoch


def trained_ids(record_dir):
    """{epoch: Counter of sample ids trained in it}, rolled-back batches left out."""
    records = []
    for name in os.listdir(record_dir):
        with open(os.path.join(record_dir, name)) as src:
            records += [json.loads(line) for line in src if line.endswith("\n")]
    first_seen = {}  # generation (epoch, start, workers) -> when its first call began
    for r in records:
        t0, epoch, start, workers = r["call"]
        key = (epoch, start, workers)
        first_seen[key] = min(t0, first_seen.get(key, t0))
    trained = collections.defaultdict(collections.Counter)
    for r in records:
        t0, epoch, start, workers = r["call"]
        mine = first_seen[(epoch, start, workers)]
        # Undone: a later generation of the same epoch began at or before this position.
        if any(key[0] == epoch and t > mine and key[1] <= r["pos"]
               for key, t in first_seen.items()):
            continue
        trained[epoch].update(r["ids"])
    return trained


if __name__ == "__main__":
    install(sys.argv[1])
    from hvdtrain.cli import run
    sys.argv = ["hvdtrain"] + sys.argv[2:]
    run()
