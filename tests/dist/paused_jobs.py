"""The jobs of test_slow_ranks.py: a rank 0 that pauses for minutes, under MPI and Gloo."""
import os
import sys

from helpers import StartedCommand
from jobs import DIGITS, launcher

HERE = os.path.dirname(os.path.abspath(__file__))
GLOO_AND_MPI = ["horovodrun", "horovodrun-gloo"]
PAUSE_S, SLOW_CHECKPOINT_S = 200, 150


def start_paused_jobs(tmp_path_factory):
    """Start the four jobs (two programs x MPI and Gloo) and return them:
    {(program, launcher): (the started command, its folder or None)}."""
    jobs = {}
    for name in GLOO_AND_MPI:
        jobs[("library", name)] = (StartedCommand(launcher(name) + [
            sys.executable, os.path.join(HERE, "paused_program.py"), str(PAUSE_S)]), None)
        folder = tmp_path_factory.mktemp(f"slow-checkpoint-{name}")
        jobs[("checkpoint", name)] = (StartedCommand(launcher(name) + [
            sys.executable, os.path.join(HERE, "slow_storage_worker.py"),
            str(SLOW_CHECKPOINT_S), str(folder), *DIGITS, "--model", "mlp", "--batch-size",
            "32", "--epochs", "2", "--stall-timeout", "60", "--output-dir",
            str(folder / "run")]), folder)
    return jobs
