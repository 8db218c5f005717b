"""Read a Dockerfile the way ``docker build`` splits it: instructions and stages."""
import shlex
from dataclasses import dataclass, field
from typing import List, Optional, Tuple


@dataclass
class Stage:
    base: str
    name: Optional[str]
    instructions: List[Tuple[str, str]] = field(default_factory=list)

    def find(self, keyword: str) -> List[str]:
        """Arguments of every `keyword` instruction in this stage, in order."""
        return [args for kw, args in self.instructions if kw == keyword]


def instructions(path: str) -> List[Tuple[str, str]]:
    """(KEYWORD, arguments) per instruction: backslash continuations joined, comment lines
    (parser directives and hadolint pragmas included) dropped, as Docker does."""
    found, current = [], ""
    for raw in open(path, encoding="utf-8"):
        line = raw.rstrip("\n")
        if line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current = (current + line).strip()
        if current:
            keyword, _, rest = current.partition(" ")
            found.append((keyword.upper(), " ".join(rest.split())))
        current = ""
    return found


def stages(path: str) -> List[Stage]:
    """The build stages, each with the instructions after its FROM."""
    result = []
    for keyword, args in instructions(path):
        if keyword == "FROM":
            words = [w for w in args.split() if not w.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            result.append(Stage(words[0], name))
        else:
            result[-1].instructions.append((keyword, args))
    return result


def copy_sources(args: str) -> Tuple[List[str], str, dict]:
    """Sources, destination and --flags of a COPY instruction."""
    words = shlex.split(args)
    flags = dict(w[2:].partition("=")[::2] for w in words if w.startswith("--"))
    paths = [w for w in words if not w.startswith("--")]
    return paths[:-1], paths[-1], flags


def step_running(stage: Stage, text: str) -> int:
    """Index in `stage.instructions` of the one RUN whose arguments contain `text`."""
    found = [i for i, (kw, args) in enumerate(stage.instructions)
             if kw == "RUN" and text in args]
    assert len(found) == 1, f"expected one RUN containing {text!r}, found {len(found)}"
    return found[0]
