"""MXNet 1.9.1's Fit API tutorial (docs/python_docs/python/tutorials/packages/gluon/training/
fit_api_tutorial.md at tag 1.9.1 of apache/mxnet), run by every rank of a job with
hvdtrain's Estimator: test_fit_api_tutorial.py launches it and checks what it leaves.

Usage: python fit_api_tutorial.py OUT_DIR (under a launcher, from the folder the tutorial's
``model_dir='./'`` names)

The tutorial's code as written, in its order, with these changes only:

- its Estimator's import names ``hvdtrain.estimator`` instead of
  ``mxnet.gluon.contrib.estimator``; the event handlers (``CheckpointHandler`` and the
  base classes) are MXNet's own, imported as the tutorial imports them, so hvdtrain has to
  give MXNet's CheckpointHandler its distributed behaviour (docs/estimator.md);
- ``metrics=`` reads ``train_metrics=`` (MXNet 1.9.1's own Estimator refuses ``metrics=``);
- Fashion-MNIST is a stand-in of its shape (28x28 grayscale uint8 images, int32 labels of
  10 classes; TRAIN and VAL of them, a pattern per class under noise), not a download; and
  the sizes are this machine's: images resized to IMAGE_SIZE, not 224, BATCH a batch;
- a rank other than 0 gives its CheckpointHandler the folder
  ``$FIT_API_OTHER_RANKS_MODEL_DIR`` (``{rank}`` replaced), when set, instead of ``'./'``:
  rank 0 alone writes the handler's files, so that folder must stay empty; anything a
  rank other than 0 wrote there would show it did not.

Then it writes OUT_DIR/rank<R>.npz (every array of the trained net, by structural name) and
OUT_DIR/rank<R>.json (the figures this rank reports: validation and training accuracy,
the LossRecordHandler's history), once the tutorial's last lines have reloaded the best
model from './my_model-best.params' (rank 0's file, on every rank).
"""
import json
import os
import sys

import numpy as np

TRAIN, VAL, BATCH, IMAGE_SIZE, SEED = 320, 160, 32, 32, 7


def fashion_mnist_stand_in(train):
    """A FashionMNIST(train=...) of the real one's item format: (uint8 image 28x28x1, int32
    label). Class c lights rows 2c..2c+7 under noise: a few epochs learn it, so the
    accuracies are neither 0 nor 1, and the split depends only on `train` (the same on
    every rank, and in the test's reference)."""
    from mxnet import gluon, nd  # pylint: disable=import-outside-toplevel
    rng = np.random.default_rng([SEED, int(train)])
    count = TRAIN if train else VAL
    labels = rng.integers(0, 10, count).astype(np.int32)
    images = rng.integers(0, 160, (count, 28, 28, 1))
    for i, label in enumerate(labels):
        images[i, 2 * label:2 * label + 8] += 90
    return gluon.data.ArrayDataset(nd.array(images.clip(0, 255), dtype=np.uint8),
                                   nd.array(labels, dtype=np.int32))


def arrays_of(net):
    """Every array of `net` by its structural name, as numpy."""
    params = net._collect_params_with_prefix()  # pylint: disable=protected-access
    return {name: param.data().asnumpy() for name, param in params.items()}


def main(out_dir):
    """The tutorial, top to bottom (its imports inside, where its first cell has them),
    then this rank's figures and arrays into `out_dir`."""
    # --- the tutorial: prerequisites --------------------------------------------------
    import mxnet as mx
    from mxnet import gluon
    from mxnet.gluon.model_zoo import vision
    from hvdtrain.estimator import estimator
    from mxnet.gluon.contrib.estimator.event_handler import TrainBegin, TrainEnd, EpochEnd, CheckpointHandler  # noqa: E501  # pylint: disable=line-too-long

    gpu_count = mx.context.num_gpus()
    ctx = [mx.gpu(i) for i in range(gpu_count)] if gpu_count > 0 else mx.cpu()

    # --- dataset ----------------------------------------------------------------------
    # Get the training data
    fashion_mnist_train = fashion_mnist_stand_in(train=True)

    # Get the validation data
    fashion_mnist_val = fashion_mnist_stand_in(train=False)

    transforms = [gluon.data.vision.transforms.Resize(IMAGE_SIZE),
                  gluon.data.vision.transforms.ToTensor()]

    # Now we will stack all these together.
    transforms = gluon.data.vision.transforms.Compose(transforms)

    # Apply the transformations
    fashion_mnist_train = fashion_mnist_train.transform_first(transforms)
    fashion_mnist_val = fashion_mnist_val.transform_first(transforms)

    batch_size = BATCH  # Batch size of the images
    num_workers = 4  # The number of parallel workers for loading the data using Data Loaders.

    train_data_loader = gluon.data.DataLoader(fashion_mnist_train, batch_size=batch_size,
                                              shuffle=True, num_workers=num_workers)
    val_data_loader = gluon.data.DataLoader(fashion_mnist_val, batch_size=batch_size,
                                            shuffle=False, num_workers=num_workers)

    # --- model and optimizers ---------------------------------------------------------
    resnet_18_v1 = vision.resnet18_v1(pretrained=False, classes=10)
    resnet_18_v1.initialize(init=mx.init.Xavier(), ctx=ctx)

    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    learning_rate = 0.04  # You can experiment with your own learning rate here
    num_epochs = 2  # You can run training for more epochs
    trainer = gluon.Trainer(resnet_18_v1.collect_params(),
                            'sgd', {'learning_rate': learning_rate})

    # --- basic usage ------------------------------------------------------------------
    train_acc = mx.metric.Accuracy()  # Metric to monitor

    # Define the estimator, by passing to it the model, loss function, metrics, trainer
    # object and context
    est = estimator.Estimator(net=resnet_18_v1,
                              loss=loss_fn,
                              train_metrics=train_acc,
                              trainer=trainer,
                              context=ctx)

    # ignore warnings for nightly test on CI only
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Magic line
        est.fit(train_data=train_data_loader,
                epochs=num_epochs)

    # --- advanced usage: a custom event handler ---------------------------------------
    class LossRecordHandler(TrainBegin, TrainEnd, EpochEnd):
        def __init__(self):
            super(LossRecordHandler, self).__init__()
            self.loss_history = {}

        def train_begin(self, estimator, *args, **kwargs):
            print("Training begin")

        def train_end(self, estimator, *args, **kwargs):
            # Print all the losses at the end of training
            print("Training ended")
            for loss_name in self.loss_history:
                for i, loss_val in enumerate(self.loss_history[loss_name]):
                    print("Epoch: {}, Loss name: {}, Loss value: {}".format(i, loss_name, loss_val))

        def epoch_end(self, estimator, *args, **kwargs):
            for metric in estimator.train_metrics:
                # look for train Loss in training metrics
                # we wrapped loss value as a metric to record it
                if isinstance(metric, mx.metric.Loss):
                    loss_name, loss_val = metric.get()
                    # append loss value for this epoch
                    self.loss_history.setdefault(loss_name, []).append(loss_val)

    # Let's reset the model, trainer and accuracy objects from above

    resnet_18_v1.initialize(force_reinit=True, init=mx.init.Xavier(), ctx=ctx)
    trainer = gluon.Trainer(resnet_18_v1.collect_params(),
                            'sgd', {'learning_rate': learning_rate})
    train_acc = mx.metric.Accuracy()

    # Define the estimator, by passing to it the model, loss function, metrics, trainer
    # object and context
    est = estimator.Estimator(net=resnet_18_v1,
                              loss=loss_fn,
                              train_metrics=train_acc,
                              trainer=trainer,
                              context=ctx)

    # The test's one addition: ranks other than 0 point their handler elsewhere.
    model_dir = './'
    if est.rank != 0 and os.environ.get("FIT_API_OTHER_RANKS_MODEL_DIR"):
        model_dir = os.environ["FIT_API_OTHER_RANKS_MODEL_DIR"].format(rank=est.rank)

    # Define the handlers, let's say in built Checkpointhandler
    checkpoint_handler = CheckpointHandler(model_dir=model_dir,
                                           model_prefix='my_model',
                                           monitor=train_acc,  # Monitors a metric
                                           save_best=True)  # Save the best model in terms of
    # Let's instantiate another handler which we defined above
    loss_record_handler = LossRecordHandler()
    # ignore warnings for nightly test on CI only
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Magic line
        est.fit(train_data=train_data_loader,
                val_data=val_data_loader,
                epochs=num_epochs,
                event_handlers=[checkpoint_handler, loss_record_handler])  # Add the event handlers

    trained = est.net
    resnet_18_v1 = vision.resnet18_v1(pretrained=False, classes=10)
    resnet_18_v1.load_parameters('./my_model-best.params', ctx=ctx)

    # --- what the test reads ----------------------------------------------------------
    np.savez(os.path.join(out_dir, f"rank{est.rank}.npz"), **arrays_of(trained))
    with open(os.path.join(out_dir, f"rank{est.rank}.json"), "w") as out:
        json.dump({"rank": est.rank, "num_workers": est.num_workers,
                   "val": dict([m.get() for m in est.val_metrics]),
                   "train": dict([m.get() for m in est.train_metrics]),
                   "loss_history": loss_record_handler.loss_history}, out)


if __name__ == "__main__":
    main(sys.argv[1])
