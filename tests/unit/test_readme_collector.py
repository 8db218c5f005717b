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


def test_flag_table_matches_the_parser():
    """README's flag table lists every flag of `hvdtrain --help` with the parser's default
    (the parser is the one source of truth; the table is checked against it)."""
    import os
    import re

    from helpers import REPO
    from hvdtrain.cli import build_parser

    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    rows = {}
    for flags, default in re.findall(r"^\| (`--[^|]*?) \|\s*([^|]*?)\s*\|", readme, re.M):
        for flag in re.findall(r"`(--[\w-]+)", flags):
            rows[flag] = default.strip().strip("`")
    documented = set()
    for action in build_parser()._actions:  # pylint: disable=protected-access
        flag = next((o for o in action.option_strings if o.startswith("--")), None)
        if flag in (None, "--help"):
            continue
        documented.add(flag)
        assert flag in rows, f"README's flag table has no row for {flag}"
        default = action.default
        if default in (None, False, (), "") or action.nargs == 0:  # switches: no default
            continue
        shown = rows[flag]
        if isinstance(default, float):
            assert float(shown) == default, (flag, shown, default)
        elif flag != "--model":
            assert shown == str(default), (flag, shown, default)
    negatives = {f for f in rows if f.startswith("--no-") and f"--{f[5:]}" in rows}
    assert set(rows) - documented - negatives == set(), "rows for flags hvdtrain does not have"
