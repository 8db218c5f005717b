"""The training loop: :func:`~hvdtrain.loop.run.fit.fit` runs epochs (:mod:`.epoch`), evaluates
(:mod:`.evaluate`), keeps replicas identical (:mod:`.replicas`) and guards against a
diverging loss (:mod:`.guard`), under one precision policy and learning-rate schedule."""
