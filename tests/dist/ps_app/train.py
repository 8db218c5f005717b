"""A worker program whose optimizer lives in its own module (myopt.py), run by hvdtrain-launch:
the servers must load it to apply it. SGD with lr 0.5 from w = 1 and two pushed gradients of 1:
w = 1 - 0.5 * 2 = 0 (a server without the optimizer stores the sum, 2)."""
import mxnet as mx
import myopt  # noqa: F401  registers 'mysgd'

kv = mx.kv.create("dist_sync")
kv.set_optimizer(mx.optimizer.create("mysgd", learning_rate=0.5, rescale_grad=1.0))
kv.init(0, mx.nd.ones(3))
kv.push(0, mx.nd.ones(3))
w = mx.nd.zeros(3)
kv.pull(0, out=w)
print(f"worker {kv.rank}: w = {w.asnumpy().tolist()}", flush=True)
