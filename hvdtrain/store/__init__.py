"""The stores gradients travel through: the Horovod KVStore, zero-copy gradient buckets, the
job's layout (:class:`~hvdtrain.store.dist.DistContext`) and the one adapter over MXNet's
private Gluon internals. Knows nothing of the training job that uses it."""
