"""The optimizer class defined in the main script after `import mxnet`: a server (stopped inside
that import) cannot unpickle it, with launch.py as with hvdtrain-launch."""
import mxnet as mx


@mx.optimizer.register
class InlineSGD(mx.optimizer.SGD):
    """Defined in the script itself: a server, stopped inside 'import mxnet', never sees it."""


kv = mx.kv.create("dist_sync")
kv.set_optimizer(mx.optimizer.create("inlinesgd", learning_rate=0.5))
kv.init(0, mx.nd.ones(3))
kv.push(0, mx.nd.ones(3))
w = mx.nd.zeros(3)
kv.pull(0, out=w)
print(f"worker {kv.rank}: w = {w.asnumpy().tolist()}", flush=True)
