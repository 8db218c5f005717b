"""The optimizer state's bytes are the same on every rank that holds the same state: pickle
keeps a dict's insertion order, and a sharded rank counts its own pieces' updates first
(store/sharded.py), so at 3 ranks the update counts, equal as values, pickled into other
bytes on each rank (seen by the elastic commit test, issue 63). Saved in index order now."""
import pickle

import mxnet as mx
from mxnet import gluon

from hvdtrain.store.gluon_internals import (optimizer_states, optimizer_states_later,
                                            states_later)


def trainer_counting(order):
    """A Trainer (SGD with momentum) over a 3-layer net whose optimizer counted one update
    of each parameter in `order`, its states made in that order too."""
    mx.random.seed(1)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(3, in_units=2), gluon.nn.Dense(2, in_units=3))
    net.initialize(mx.init.Uniform())
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": 0.1, "momentum": 0.9}, kvstore=None)
    updater = trainer._updaters[0]  # pylint: disable=protected-access
    for index in order:
        trainer._optimizer._update_count(index)  # pylint: disable=protected-access
        updater.states[index] = trainer._optimizer.create_state(  # pylint: disable=protected-access
            index, trainer._params[index].data())  # pylint: disable=protected-access
    return trainer


def test_the_same_counts_counted_in_another_order_give_the_same_bytes():
    ours, theirs = trainer_counting([0, 1, 2, 3]), trainer_counting([2, 3, 0, 1])
    counts = [t._optimizer._index_update_count for t in (ours, theirs)]  # pylint: disable=protected-access
    assert counts[0] == counts[1]  # equal as values
    assert optimizer_states_later(ours)() == optimizer_states_later(theirs)()
    assert optimizer_states(ours) == optimizer_states(theirs)
    updater = theirs._updaters[0]  # pylint: disable=protected-access
    assert states_later(updater.states, updater.optimizer)() == optimizer_states(ours)
    # ... and what is saved loads as it was: every count, every state
    states, optimizer = pickle.loads(optimizer_states(theirs))
    assert optimizer._index_update_count == counts[0]  # pylint: disable=protected-access
    assert sorted(states) == [0, 1, 2, 3]
