import mxnet as mx


@mx.optimizer.register
class MySGD(mx.optimizer.SGD):
    """Plain SGD, registered under its own name from the program's own module."""
