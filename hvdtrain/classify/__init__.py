"""Image classification, the ``hvdtrain`` command's: its batch processor on the one engine,
its builders (trainer, initialisation, loaders) and its detailed evaluation."""
