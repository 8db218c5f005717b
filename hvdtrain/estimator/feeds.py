"""The data an Estimator is given, as the engine reads it: each object (a Gluon Dataset or
DataLoader, on any batch sampler) made once into this rank's share of every epoch
(:mod:`hvdtrain.data.reshard`), and split again when an elastic job's ranks change."""
from __future__ import annotations

import logging
from typing import Dict, Optional, Tuple

from mxnet import gluon

from ..config import ConfigError, RunConfig
from ..data.batch_shards import BatchSplit, check_same_draw
from ..data.reshard import ShardedLoader, as_loader
from ..store.dist import DistContext

logger = logging.getLogger("hvdtrain")

# Said once a run that can resume (an output folder) trains on a user's Dataset or
# DataLoader: the engine replays the model's draws (.loop.engine.step_seeds) and the
# samples' order, but nothing seeds the generators a loader's transforms draw from.
NOT_REPLAYED = ("resume: a loader's own random draws are not replayed (its transforms' draws "
                "from NumPy's or MXNet's generators, in this process or its workers, differ "
                "after a resume); the samples' order and the model's draws are")


class Feeds:
    """The feeds made so far, by the object they were made of and their split."""

    def __init__(self):
        # (id(data), train) -> (data, feed): the object is kept, so its id stays its own.
        self._made: Dict[Tuple[int, bool], Tuple[object, object]] = {}

    def of(self, data, train: bool, dist: DistContext, config: RunConfig):
        """This rank's share of `data` for training (padded to equal steps, shuffled when a
        loader shuffled or when `data` is a Dataset) or validation (each sample once, on one
        rank; every rank scores the whole split under ``dist_async``). A loader on a batch
        sampler of its own keeps its batches whole, dealt out by rank, and every rank checks
        once that it drew the same ones. hvdtrain's own loaders, split already, are taken as
        they are; anything else is refused as MXNet's Estimator refuses it."""
        found = self._made.get((id(data), train))
        if found is not None:
            return found[1]
        if hasattr(data, "sampler") and hasattr(getattr(data, "sampler"), "set_epoch") and \
                hasattr(data, "batch_size"):
            feed = data
        elif isinstance(data, (gluon.data.DataLoader, gluon.data.Dataset)):
            parts, part = (dist.num_workers, dist.rank) if dist.synchronous or train else (1, 0)
            loader = as_loader(data, config.batch_size, shuffle=train)
            feed = ShardedLoader(loader, parts, part, train, config.seed, config.sampling)
            if train and config.output_dir:
                logger.info(NOT_REPLAYED)
            if isinstance(feed.sampler, BatchSplit) and parts > 1 and dist.synchronous \
                    and not config.elastic:
                # Every rank is here alike (a worker joining an elastic job is not; dist_async
                # workers never meet at a collective).
                check_same_draw(feed.sampler, dist)
        else:
            raise ConfigError("Estimator only support input as Gluon DataLoader or Dataset. "
                             "Alternatively, you can transform your DataIter or any NDArray "
                             "into Gluon DataLoader. Refer to gluon.data.DataLoader")
        self._made[(id(data), train)] = (data, feed)
        return feed

    def reshard(self, dist: DistContext) -> None:
        """Every feed split over the ranks there are now (an elastic reset)."""
        for (_, train), (_, feed) in self._made.items():
            if train or dist.synchronous:
                feed.sampler.reshard(dist.num_workers, dist.rank)

    @property
    def validation(self) -> Optional[object]:
        """The validation feed made last (its unusable samples are counted), or None."""
        made = [feed for (_, train), (_, feed) in self._made.items() if not train]
        return made[-1] if made else None


def split_size(feed) -> int:
    """The samples of the split `feed` reads."""
    return int(getattr(feed, "num_samples", 0) or getattr(feed.sampler, "length", 0))
