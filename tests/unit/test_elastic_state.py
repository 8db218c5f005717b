

def test_after_a_sync_the_first_step_broadcasts_nothing():
    """A trainer with a store broadcasts every parameter on its first step; a worker that
    joins a running job must not (the others are past theirs: it would wait alone)."""
    store = mx.kv.create("local")
    broadcasts = []
    original = store.broadcast
    store.broadcast = lambda *a, **k: (broadcasts.append(a[0]), original(*a, **k))
    net, _ = build()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                            kvstore=store, update_on_kvstore=False)
    state = one_process(net, trainer)
    state.sync()
    train(net, trainer, range(1))
    assert broadcasts == []

    # Without the sync the same trainer does broadcast: the check above can fail.
    net, _ = build()
    plain = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                          kvstore=store, update_on_kvstore=False)
    train(net, plain, range(1))
    assert broadcasts
