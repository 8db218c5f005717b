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
                  backend: str, written: List[str], stopped: Optional[Dict] = None,
                  val: str = "test") -> List[str]:
    """The short table rank 0 prints at the end of a run; `written` lists its outputs.

    `epochs` are the records of the epochs completed; `stopped` the record of an epoch cut
    short (``--max-steps``), whose steps, time and throughput are reported too: a short run
    (a new host's smoke test) is often run for its throughput alone. `val` is the records'
    name of the validation split; its accuracy rows are there when the records have one."""
    if not epochs and not stopped:
        return ["run summary: no epoch completed"]
    last = stopped or epochs[-1]
    done = last["epoch"] if stopped else last["epoch"] + 1  # whole epochs, earlier runs included
    rows = [("epochs", f"{len(epochs)} completed this run, {done} in all ({last['step']} steps)")]
    if stopped:
        rows.append(("stopped", f"inside epoch {stopped['epoch'] + 1} after "
                                f"{stopped['steps']} steps of it ({stopped['epoch_time']:.1f} s, "
                                f"{stopped['samples_per_sec']:.1f} samples/s)"))
    acc, top5 = f"{val}_acc", f"{val}_top5"
    top5_text = f"; top-5 final {last[top5]:.4f}" if last.get(top5) is not None else ""
    scored = [e for e in epochs if e.get(acc) is not None]
    if scored:
        best = max(scored, key=lambda e: e[acc])
        rows.append((f"{val} accuracy", f"final {scored[-1][acc]:.4f}, best {best[acc]:.4f} "
                                        f"(epoch {best['epoch'] + 1}){top5_text}"))
    elif last.get(acc) is not None:
        rows.append((f"{val} accuracy", f"final {last[acc]:.4f}{top5_text}"))
    if last.get(f"ema_{acc}") is not None:  # --ema: its average, evaluated beside
        text = f"final {last[f'ema_{acc}']:.4f}"
        averaged = [e for e in epochs if e.get(f"ema_{acc}") is not None]
        if averaged:
            best = max(averaged, key=lambda e: e[f"ema_{acc}"])
            text += f", best {best[f'ema_{acc}']:.4f} (epoch {best['epoch'] + 1})"
        rows.append((f"EMA {val} accuracy", text))
    # Weighted by time: a short partial epoch counts for what it ran, not as much as a whole one.
    timed = epochs + ([stopped] if stopped else [])
    seconds = sum(e["epoch_time"] for e in timed)
    rate = sum(e["samples_per_sec"] * e["epoch_time"] for e in timed) / seconds if seconds else 0.0
    rows += [
        ("total time", f"{total_time:.1f} s"),
        ("throughput", f"{rate:.1f} samples/s (global, over {seconds:.1f} s of training)"),
        ("workers", f"{num_workers} x {devices} device(s), {backend}"),
        ("outputs", ", ".join(written) if written else "none (no --output-dir)"),
    ]
    width = max(len(k) for k, _ in rows)
    return ["run summary"] + [f"  {k.ljust(width)}  {v}" for k, v in rows]
