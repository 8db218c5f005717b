"""Every script scripts/bench.py starts takes the ``--out PREFIX`` its runner appends
(scripts/bench_runs.py) and writes its record there: one that did not (the replica check's,
2026-12-07) stopped ``make bench`` at its row with an argparse error."""
import os
import re
import subprocess
import sys

import pytest

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "scripts")
STARTED = sorted(set(re.findall(r'os\.path\.join\(HERE, "(bench_\w+\.py)"\)',
                                open(os.path.join(SCRIPTS, "bench.py")).read())))


def test_the_bench_starts_scripts():
    assert "bench_replica_check.py" in STARTED and "bench_shard_optimizer.py" in STARTED


@pytest.mark.parametrize("script", STARTED)
def test_each_script_takes_the_runners_out(script):
    text = open(os.path.join(SCRIPTS, script)).read()
    assert '"--out"' in text and ".rank" in text, f"{script} writes no PREFIX.rank*.json"
    proc = subprocess.run([sys.executable, os.path.join(SCRIPTS, script), "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--out" in proc.stdout, proc.stdout + proc.stderr
