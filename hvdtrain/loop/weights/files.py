"""Which file a new run's weights come from (``--init-from``, ``--pretrained``), read once.

``--init-from PATH`` takes:

- a parameter file: Gluon ``save_parameters`` (a run's ``model.params``) or an export's
  ``NAME-0000.params`` (``arg:``/``aux:`` keys naming the parameters);
- a checkpoint folder (``epoch-0003/``), or an output folder or its ``checkpoints/``: the
  newest complete checkpoint, else the run's final ``model.params``;
- an exported model folder (``NAME-symbol.json`` beside ``NAME-0000.params``, as
  ``HybridBlock.export`` writes them).

``--pretrained`` asks MXNet's own model store for the model zoo's ImageNet weights
(``get_model_file``: ``$MXNET_HOME/models``, downloaded there when missing, checked against
the zoo's SHA-1); when it cannot, the refusal names the file to place and the folder.

Where the source has a model card (a checkpoint's ``meta.json``, the ``model.json`` beside a
run's ``model.params`` or in an export: :mod:`hvdtrain.data.card`), its model must be
``--model``, and its class names are compared with the data's.

Every rank reads the file (as every rank reads a checkpoint it resumes), and a file that
does not read (truncated, not MXNet's format) is refused in one line before any data loads.
"""
from __future__ import annotations

import contextlib
import glob
import io
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import mxnet as mx
from mxnet.gluon.model_zoo import model_store

from ...config import ConfigError, TrainConfig
from ...data.card import CARD_FILE, check_card, read_card
from ...state.checkpoint_files import META, PARAMS, missing_files, read_meta
from ...state.resume_from import resume_candidates
from ...store.gluon_internals import model_store_url

logger = logging.getLogger("hvdtrain")

EXPORTED_PARAMS = re.compile(r"^(.+)-(\d{4})\.params$")


class WeightsError(ConfigError):
    """Weights a run cannot start from; the message says which file and why."""


@dataclass
class WeightsFile:
    """A parameter file read into memory, with what is known of where it came from.

    Attributes
    ----------
    path : str
        The file read.
    flag : str
        How the user named it (``--init-from runs/a``, ``--pretrained``), for messages.
    arrays : dict
        Its arrays by key, as stored (``features.0.weight``, ``arg:conv0_weight``).
    classes : list of str, optional
        The class names the weights were trained on, when the source records them (its
        model card).
    model : str, optional
        The model the source says it holds (its model card or checkpoint), if it says.
    card : dict, optional
        The source's model card (:mod:`hvdtrain.data.card`), if it has one.
    """

    path: str
    flag: str
    arrays: Dict[str, mx.nd.NDArray] = field(repr=False)
    classes: Optional[List[str]] = None
    model: Optional[str] = None
    card: Optional[Dict] = None

    @property
    def named(self) -> str:
        """The flag, and the file when the flag names a folder: how messages name it."""
        return self.flag if self.flag.endswith(" " + self.path) else f"{self.flag}: {self.path}"


def resolve(cfg: TrainConfig) -> Optional[WeightsFile]:
    """The weights `cfg` starts from, read (None when it names none)."""
    if cfg.pretrained:
        return read(pretrained_file(cfg.model_name), "--pretrained")
    if cfg.init_from:
        return init_from(cfg.init_from, cfg.model_name)
    return None


def models_folder() -> str:
    """Where MXNet's model store keeps the zoo's files: ``$MXNET_HOME/models`` (read now;
    ``get_model_file``'s default was fixed when MXNet was imported)."""
    return os.path.join(os.path.expanduser(mx.base.data_dir()), "models")


def pretrained_file(model: str) -> str:
    """The path of the zoo's ImageNet weights for `model`, through MXNet's model store
    (its cache, download and SHA-1 check); refused in one line naming the file to place
    and where, when the store cannot provide it."""
    folder = models_folder()
    name = f"{model}-{model_store.short_hash(model)}.params"
    there = os.path.exists(os.path.join(folder, name))
    try:
        # The store prints each download attempt, and logs on the root logger: hvdtrain
        # says the outcome once instead.
        with contextlib.redirect_stdout(io.StringIO()), _quiet_store_log():
            path = model_store.get_model_file(model, root=folder)
    except Exception as err:  # pylint: disable=broad-except  (requests, OSError, zip, hash)
        found = (f"the {name} there does not match the zoo's checksum, and " if there else "")
        raise WeightsError(
            f"--pretrained: {found}MXNet's model store could not download {model}'s ImageNet "
            f"weights ({type(err).__name__}: {_cause(err)}); place {name} in {folder} "
            f"($MXNET_HOME/models), unzipped from {model_store_url(name[:-len('.params')])}"
        ) from None
    if not there:
        logger.info("--pretrained: MXNet's model store downloaded %s", path)
    return path


def _cause(err: Exception) -> str:
    """The root of a download failure in a few words ("Name or service not known")."""
    text = str(err).strip()
    found = re.search(r"\[Errno [-\d]+\] ([^'\")\]]+)", text)
    if found:
        return found.group(1).strip()
    first = (text.splitlines() or [type(err).__name__])[0]
    return first if len(first) <= 160 else first[:160] + "..."


@contextlib.contextmanager
def _quiet_store_log():
    """Keep the store's own log lines ("Model file not found", "Mismatch ... Downloading
    again", on the root logger) off the console while it works: hvdtrain says the outcome
    once. With a handler on the root logger, logging's last resort stays silent."""
    quiet = logging.NullHandler()
    logging.getLogger().addHandler(quiet)
    try:
        yield
    finally:
        logging.getLogger().removeHandler(quiet)


def init_from(path: str, model: Optional[str]) -> WeightsFile:
    """Read what ``--init-from PATH`` names (see the module's docstring for the forms); a
    source that names its model must name `model` (None: any, the caller then builds the
    source's)."""
    flag = f"--init-from {path}"
    if not os.path.exists(path):
        raise WeightsError(f"{flag} does not exist")
    if os.path.isfile(path):
        return _carded(read(path, flag), model)
    if os.path.exists(os.path.join(path, META)):  # a checkpoint folder
        return _checkpoint(path, read_meta(path), flag, model)
    damaged: List[str] = []
    found = resume_candidates(path, damaged)
    for reason in damaged:
        logger.warning("%s; passing over it", reason)
    if found:
        return _checkpoint(found[0].path, found[0].meta, flag, model)
    exported = _exported(path)
    if exported:
        return _carded(read(exported, flag), model)
    if os.path.isfile(os.path.join(path, PARAMS)):
        return _carded(read(os.path.join(path, PARAMS), flag), model)
    raise WeightsError(f"{flag} holds no weights: no complete checkpoint, {PARAMS}, or "
                       f"exported model (NAME-symbol.json and NAME-0000.params)")


def _checkpoint(path: str, meta: Dict, flag: str, model: Optional[str]) -> WeightsFile:
    """The parameters of checkpoint `path`, refused when it is incomplete or holds another
    model than `model`."""
    if missing_files(path):
        raise WeightsError(f"{flag}: checkpoint {path} is incomplete: files are missing")
    saved = meta.get("model")
    if saved and model and saved != model:
        raise WeightsError(f"{flag}: checkpoint {path} holds a {saved}, not --model {model}: "
                           f"give --model {saved}")
    weights = read(os.path.join(path, PARAMS), flag)
    card = check_card(meta["card"], os.path.join(path, META)) if "card" in meta else {}
    weights.classes = card.get("classes") or meta.get("classes")
    weights.model, weights.card = saved, card or None
    return weights


def _carded(weights: WeightsFile, model: Optional[str]) -> WeightsFile:
    """`weights` with the class names of the model card beside its file (a run's or an
    export's ``model.json``), if there is one; refused when the card names another model."""
    path = os.path.join(os.path.dirname(os.path.abspath(weights.path)), CARD_FILE)
    if not os.path.isfile(path):
        return weights
    card = read_card(path)
    if model and card["model"] != model:
        raise WeightsError(f"{weights.named} holds a {card['model']} (its {CARD_FILE}), not "
                           f"--model {model}: give --model {card['model']}")
    weights.classes, weights.model, weights.card = card["classes"], card["model"], card
    return weights


def _exported(folder: str) -> Optional[str]:
    """The parameter file of the model exported to `folder` (the newest epoch of the one
    name with a ``-symbol.json``), or None; two exported models are refused as ambiguous."""
    pairs = {}
    for path in glob.glob(os.path.join(folder, "*.params")):
        found = EXPORTED_PARAMS.match(os.path.basename(path))
        if found and os.path.isfile(os.path.join(folder, found.group(1) + "-symbol.json")):
            pairs.setdefault(found.group(1), []).append(path)
    if len(pairs) > 1:
        raise WeightsError(f"--init-from {folder} holds {len(pairs)} exported models "
                           f"({', '.join(sorted(pairs))}): name the .params file to use")
    return max(next(iter(pairs.values()))) if pairs else None


def read_params(path: str, named: Optional[str] = None,
                advice: str = "") -> Dict[str, mx.nd.NDArray]:
    """Every array of parameter file `path` by key, as stored (``features.0.weight``,
    ``arg:conv0_weight``): the one reader of parameter files, for start weights and exports
    alike. A file MXNet cannot read (cut short, another format) or one holding no named
    arrays is refused in one line (:class:`WeightsError`), which starts with `named` (how
    the user named it, e.g. ``--init-from runs/a``) when given and ends with `advice`."""
    prefix = f"{named}: " if named and named != path else ""
    try:
        arrays = mx.nd.load(path)
    except Exception as err:  # pylint: disable=broad-except  (MXNetError, OSError)
        size = os.path.getsize(path) if os.path.isfile(path) else 0
        last = (str(err).strip().splitlines() or [type(err).__name__])[-1]
        last = last.split("MXNetError: ", 1)[-1][:200]
        raise WeightsError(f"{prefix}{path} ({size} bytes) is truncated or not an MXNet "
                           f"parameter file: MXNet cannot read it ({last})"
                           f"{'; ' + advice if advice else ''}") from None
    if not isinstance(arrays, dict) or not arrays:
        raise WeightsError(f"{prefix}{path} holds no named parameters (save them with "
                           f"save_parameters or HybridBlock.export)")
    return arrays


def read(path: str, flag: str) -> WeightsFile:
    """Read parameter file `path` (every array, by key), named `flag` in messages."""
    return WeightsFile(path, flag, read_params(path, flag))
