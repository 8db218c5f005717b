"""The collector behind tests/dist/test_readme_commands.py: what it finds, and that it finds
every command line of the documents."""
from readme_commands import COVERED, NOT_RUN, all_commands, covered_commands, shell_lines

MARKDOWN = """
Some text `hvdtrain --not-a-command`.

```bash
# a comment
horovodrun -np 2 -H localhost:2 \\
    hvdtrain --dataset digits   # trailing comment
$ make demo

source .venv/bin/activate
```

```python
hvdtrain = 1
```

```
hvdtrain --in-a-block-without-language
```
"""


def test_joins_continuations_and_drops_comments():
    lines = shell_lines(MARKDOWN, "x.md")
    assert [c.text for c in lines] == [
        "horovodrun -np 2 -H localhost:2 hvdtrain --dataset digits # trailing comment",
        "make demo", "source .venv/bin/activate"]
    assert lines[0].argv[-1] == "digits" and lines[0].line == 6
    assert [c.first for c in lines] == ["horovodrun", "make", "source"]


def test_every_documented_line_is_covered_or_named():
    commands = all_commands()
    unknown = [str(c) for c in commands if c.first not in COVERED and c.first not in NOT_RUN]
    assert not unknown, "add a way to test these lines, or name them in NOT_RUN:\n" + \
        "\n".join(unknown)


def test_the_documents_hold_the_commands_users_type():
    texts = [c.text for c in covered_commands()]
    assert "make demo make test" not in texts
    assert any(t.startswith("make demo") for t in texts)
    assert any(t.startswith("horovodrun -np 8 -H d1:4,d2:4 hvdtrain") for t in texts)
    assert any(t.startswith("mpirun ") for t in texts)
    assert any(t.startswith("docker run ") for t in texts)
    assert len(texts) == len(set(texts)) >= 20


def test_flag_table_is_the_one_made_from_the_option_definitions():
    """README's flag table is generated from TrainConfig's definitions (the one source of
    truth); a stale copy fails here with the command that rewrites it."""
    import os
    import subprocess
    import sys

    from helpers import REPO

    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "update_flag_table.py"),
                           "--check"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_the_table_and_the_parser_come_from_one_definition():
    """Independent of the generator: every flag the parser accepts has a README row naming
    the parser's own default, and every row names a flag the parser accepts."""
    import os
    import re

    from helpers import REPO
    from hvdtrain.cli import build_parser

    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    rows = {}
    for flags, default in re.findall(r"^\| (`--[^|]*?) \|\s*([^|]*?)\s*\|", readme, re.M):
        for flag in re.findall(r"`(--[\w-]+)", flags):
            rows[flag] = default.strip().strip("`")
    accepted = set()
    for action in build_parser()._actions:  # pylint: disable=protected-access
        if "--help" in action.option_strings:
            continue
        accepted.update(action.option_strings)
        flag = action.option_strings[0]
        assert flag in rows, f"README's flag table has no row for {flag}"
        default = action.default
        if default in (None, False, (), "") or action.nargs == 0:  # switches: no default
            continue
        if flag == "--model":
            continue
        shown = rows[flag]
        if isinstance(default, float):
            assert float(shown) == default, (flag, shown, default)
        else:
            assert shown == str(default), (flag, shown, default)
    assert set(rows) == accepted, "README rows and the parser's flags differ"
