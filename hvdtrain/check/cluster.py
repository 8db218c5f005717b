"""Check that every host of a hostfile can run an hvdtrain job (``scripts/check-cluster.sh``).

For each host: passwordless ssh works; the Python that runs here exists at the same path
there, with the same hvdtrain (same install path), mxnet and horovod versions;
``import horovod.mxnet; hvd.init()`` succeeds (``horovodrun --check-build`` only reports how
Horovod was built, not whether it loads against the installed MXNet); whether MXNet is built
with CUDA and Horovod with NCCL (as on this machine); how many GPUs MXNet sees, and each
GPU's compute capability, which must be one mxnet-cu112 has kernels for. Prints one table
and a line per GPU; exits 1 if any host fails, 2 on bad input.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Dict, List

from ..config import ConfigError
from ..store.gpus import SUPPORTED_RANGE
from ..launch.hostfile import horovodrun_unreadable, read_hostfile

PROBE = r"""
import json, os, sys
out = {"python": sys.executable}
try:
    import hvdtrain
    out["hvdtrain"] = hvdtrain.__version__
    out["hvdtrain_path"] = os.path.dirname(hvdtrain.__file__)
    import mxnet
    from mxnet.runtime import Features
    out["mxnet"] = mxnet.__version__
    out["cuda"] = Features().is_enabled("CUDA")
    out["gpus"] = mxnet.context.num_gpus()
    from hvdtrain.store.gpus import read_gpus, runs_on
    out["gpu_list"] = [[g.index, g.name, g.capability_text, runs_on(g.capability)]
                       for g in read_gpus()]
    import horovod
    out["horovod"] = horovod.__version__
    import horovod.mxnet as hvd
    out["nccl"] = bool(hvd.nccl_built())
    hvd.init()
    out["hvd_init"] = "ok"
except Exception as err:
    out["error"] = "%s: %s" % (type(err).__name__, str(err).splitlines()[0] if str(err) else "")
sys.stdout.write("HVDTRAIN-PROBE " + json.dumps(out) + "\n")  # one write, as the launcher tags each
"""

COLUMNS = ("host", "ssh", "hvdtrain", "mxnet", "horovod", "hvd.init", "CUDA", "NCCL", "GPUs",
           "capability", "status")


def probe_command(python: str) -> List[str]:
    return [python, "-c", PROBE]


def parse_probe(output: str) -> Dict:
    for line in output.splitlines():
        if line.startswith("HVDTRAIN-PROBE "):
            return json.loads(line[len("HVDTRAIN-PROBE "):])
    return {}


def ssh_command(host: str, port, key, command: List[str]) -> List[str]:
    cmd = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
           "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
           "-o", "LogLevel=ERROR"]
    if port:
        cmd += ["-p", str(port)]
    if key:
        cmd += ["-i", key]
    return cmd + [host, " ".join(_quote(a) for a in command)]


def _quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\"'\"'") + "'"


def check_host(host: str, expected: Dict, port=None, key=None, timeout=120) -> Dict:
    """One table row for `host`, compared against this machine's `expected` probe."""
    row = dict.fromkeys(COLUMNS, "-")
    row["host"] = host
    try:
        proc = subprocess.run(ssh_command(host, port, key, probe_command(expected["python"])),
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        row.update(ssh="timeout", status=f"FAIL: no answer in {timeout}s")
        return row
    if proc.returncode == 255:
        row.update(ssh="FAIL", status="FAIL: " + (proc.stderr.strip().splitlines() or
                                                  ["ssh failed"])[-1])
        return row
    row["ssh"] = "ok"
    found = parse_probe(proc.stdout)
    if not found:
        row["status"] = (f"FAIL: {expected['python']} did not run there: "
                         + (proc.stderr.strip().splitlines() or ["no output"])[-1])
        return row
    gpu_list = found.get("gpu_list", [])
    row.update(hvdtrain=found.get("hvdtrain", "-"), mxnet=found.get("mxnet", "-"),
               horovod=found.get("horovod", "-"), GPUs=str(found.get("gpus", "-")),
               CUDA=_yes_no(found.get("cuda")), NCCL=_yes_no(found.get("nccl")),
               capability=",".join(cap for _, _, cap, _ in gpu_list) or "-")
    row["hvd.init"] = found.get("hvd_init", "FAIL")
    row["gpu_list"] = gpu_list
    problems = []
    if "error" in found:
        problems.append(found["error"])
    for name in ("hvdtrain", "mxnet", "horovod", "hvdtrain_path"):
        if name in found and found[name] != expected.get(name):
            problems.append(f"{name} {found[name]} here is {expected.get(name)} locally")
    for name, label in (("cuda", "CUDA in MXNet"), ("nccl", "NCCL in Horovod")):
        if name in found and found[name] != expected.get(name):
            problems.append(f"{label}: {_yes_no(found[name])} here, "
                            f"{_yes_no(expected.get(name))} locally")
    problems += [f"GPU {index} ({name}) has compute capability {cap}, outside "
                 f"{SUPPORTED_RANGE}" for index, name, cap, runs in gpu_list if not runs]
    row["status"] = "FAIL: " + "; ".join(problems) if problems else "ok"
    return row


def _yes_no(value) -> str:
    return "-" if value is None else ("yes" if value else "no")


def format_gpus(rows: List[Dict]) -> str:
    """One line per GPU: host, CUDA index, name and compute capability."""
    return "\n".join(
        f"{row['host']}  GPU {index}: {name}, compute capability {cap}"
        + ("" if runs else f" (unsupported: mxnet-cu112 runs on {SUPPORTED_RANGE})")
        for row in rows for index, name, cap, runs in row.get("gpu_list", []))


def format_table(rows: List[Dict]) -> str:
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in COLUMNS}
    lines = ["  ".join(c.ljust(widths[c]) for c in COLUMNS)]
    lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in COLUMNS) for r in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="check-cluster.sh", description=__doc__.split("\n\n")[0])
    p.add_argument("-p", "--ssh-port", type=int)
    p.add_argument("-i", "--ssh-identity-file")
    p.add_argument("hostfile")
    args = p.parse_args(argv)
    try:
        hosts = read_hostfile(args.hostfile)
    except ConfigError as err:
        print(f"check-cluster: error: {err}", file=sys.stderr)
        return 2
    with open(args.hostfile, encoding="utf-8") as src:
        unreadable = horovodrun_unreadable(src.read())
    if unreadable:
        print(f"check-cluster: warning: horovodrun --hostfile cannot read {args.hostfile} "
              f"(line {', '.join(map(str, unreadable))}): it takes only 'HOST slots=N' lines, "
              f"no comments or blank lines", file=sys.stderr)
    local = subprocess.run(probe_command(sys.executable), capture_output=True, text=True)
    expected = parse_probe(local.stdout)
    if "error" in expected or "hvd_init" not in expected:
        print(f"check-cluster: error: this machine fails its own check: "
              f"{expected.get('error', local.stderr.strip()[-200:])}", file=sys.stderr)
        return 1
    rows = [check_host(h.address, expected, args.ssh_port, args.ssh_identity_file)
            for h in hosts]
    print(format_table(rows))
    gpu_lines = format_gpus(rows)
    if gpu_lines:
        print(gpu_lines)
    failed = [r["host"] for r in rows if r["status"] != "ok"]
    print(f"{len(rows) - len(failed)} of {len(rows)} hosts ready"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
