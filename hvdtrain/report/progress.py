"""What a person watching a run sees: the progress bar, TensorBoard scalars, the summary."""
from __future__ import annotations

import shutil
import sys
from typing import Dict, List, Optional

from ..config import ConfigError


def progress_bar(enabled: bool, total: int, desc: str):
    """A tqdm bar on stderr, or None when disabled (not a terminal, not rank 0, or asked)."""
    if not enabled:
        return None
    from tqdm import tqdm  # pylint: disable=import-outside-toplevel
    # A terminal that reports a size of 0x0 (a fresh pty, some CI consoles) would make tqdm
    # draw nothing at all: it skips rows at or past the height.
    size = shutil.get_terminal_size(fallback=(100, 24))
    return tqdm(total=total, desc=desc, unit="step", leave=False, ncols=size.columns,
                nrows=size.lines, file=sys.stderr)


class TensorBoardWriter:
    """Epoch scalars for TensorBoard (tensorboardX), written by the root rank only.

    Parameters
    ----------
    logdir : str or None
        Folder for the event files; None (or ``enabled=False``) writes nothing.
    """

    def __init__(self, logdir: Optional[str], enabled: bool = True):
        self.writer = None
        if logdir and enabled:
            try:
                from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
            except ImportError:
                raise ConfigError("--tensorboard needs tensorboardX: "
                                  "pip install tensorboardX (make install does)") from None
            self.writer = SummaryWriter(logdir)

    def epoch(self, epoch: int, **scalars) -> None:
        if self.writer is None:
            return
        for name, value in scalars.items():
            self.writer.add_scalar(name.replace("_", "/", 1), value, epoch)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def summary_lines(epochs: List[Dict], total_time: float, num_workers: int, devices: int,
                  backend: str, written: List[str]) -> List[str]:
    """The short table rank 0 prints at the end of a run; `written` lists its outputs."""
    if not epochs:
        return ["run summary: no epoch completed"]
    best = max(epochs, key=lambda e: e["test_acc"])
    rates = [e["samples_per_sec"] for e in epochs]
    rows = [
        ("epochs", f"{len(epochs)} this run, {epochs[-1]['epoch'] + 1} in all "
                   f"({epochs[-1]['step']} steps)"),
        ("test accuracy", f"final {epochs[-1]['test_acc']:.4f}, best {best['test_acc']:.4f} "
                          f"(epoch {best['epoch'] + 1}); top-5 final "
                          f"{epochs[-1].get('test_top5', 0):.4f}"),
        ("total time", f"{total_time:.1f} s"),
        ("throughput", f"{sum(rates) / len(rates):.1f} samples/s (global, mean over epochs)"),
        ("workers", f"{num_workers} x {devices} device(s), {backend}"),
        ("outputs", ", ".join(written) if written else "none (no --output-dir)"),
    ]
    width = max(len(k) for k, _ in rows)
    return ["run summary"] + [f"  {k.ljust(width)}  {v}" for k, v in rows]
