"""The command lines that README.md and the docs/ pages tell users to type.

Every line of a fenced ``bash``/``sh``/``shell``/``console`` block is collected (backslash
continuations joined, ``#`` comments dropped). Lines that start with one of :data:`COVERED`
are run or parsed by ``tests/dist/test_readme_commands.py``; lines that start with one of
:data:`NOT_RUN` are set-up steps a test cannot stand in for (they are named here so that a
new kind of line fails ``tests/unit/test_readme_collector.py`` until somebody decides).
"""
import glob
import os
import re
import shlex
from dataclasses import dataclass
from typing import List

from helpers import REPO

#: First words of the lines the suite runs or parses.
COVERED = ("hvdtrain", "horovodrun", "mpirun", "hvdtrain-launch", "hvdtrain-plot", "scripts/",
           "examples/", "sbatch", "docker", "make", "hvdtrain-pack", "python",
           "hvdtrain-export", "hvdtrain-predict")
#: First words of lines no test can stand in for, with the reason.
NOT_RUN = {
    "source": "activates the virtual environment the tests already run in",
    "ssh-copy-id": "copies a key to real hosts",
    "kubectl": "the manifest is validated against Kubernetes' schema in test_deploy_files.py",
    "tensorboard": "a viewer; the event files are checked in test_log_and_outputs.py",
    "pip": "installs; make install is what the suite runs",
}
SHELL_LANGUAGES = ("bash", "sh", "shell", "console")


def documents() -> List[str]:
    """README.md and every Markdown page under docs/ and hostfiles/, repo-relative."""
    found = ["README.md"] + sorted(glob.glob("docs/*.md", root_dir=REPO)) \
        + sorted(glob.glob("hostfiles/*.md", root_dir=REPO))
    return [path for path in found if os.path.exists(os.path.join(REPO, path))]


@dataclass(frozen=True)
class Command:
    """One command line of a document."""

    document: str
    line: int
    text: str

    @property
    def argv(self) -> List[str]:
        return shlex.split(self.text, comments=True)

    @property
    def first(self) -> str:
        word = self.argv[0]
        return word.split("/")[0] + "/" if "/" in word else word

    def __str__(self):
        return f"{self.document}:{self.line}: {self.text}"


def shell_lines(text: str, document: str = "?") -> List[Command]:
    """Every command line inside the fenced shell blocks of Markdown `text`."""
    commands, fence, pending, start = [], None, "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        match = re.match(r"^(`{3,}|~{3,})\s*(\S*)", stripped)
        if match and fence is None:
            fence = (match.group(1), match.group(2).lower())
            continue
        if match and fence is not None and stripped.startswith(fence[0]) \
                and not stripped[len(fence[0]):].strip():
            fence = None
            continue
        if fence is None or fence[1] not in SHELL_LANGUAGES:
            continue
        line = stripped[2:] if stripped.startswith("$ ") else stripped
        if not pending:
            start = number
            if not line or line.startswith("#"):
                continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = re.sub(r"\s+", " ", pending + line).strip()
        pending = ""
        if shlex.split(full, comments=True):
            commands.append(Command(document, start, full))
    return commands


def python_blocks(text: str) -> List[str]:
    """The fenced ``python`` blocks of Markdown `text`."""
    return re.findall(r"^```python\n(.*?)^```", text, re.M | re.S)


def all_commands() -> List[Command]:
    """The command lines of every document, in document order."""
    out = []
    for document in documents():
        with open(os.path.join(REPO, document), encoding="utf-8") as src:
            out.extend(shell_lines(src.read(), document))
    return out


def covered_commands() -> List[Command]:
    """The lines the suite runs or parses, without repeats (the first place names each)."""
    seen, out = set(), []
    for command in all_commands():
        if command.first in COVERED and command.text not in seen:
            seen.add(command.text)
            out.append(command)
    return out
