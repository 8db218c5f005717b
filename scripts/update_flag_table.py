#!/usr/bin/env python3
"""Rewrite README.md's flag table from the option definitions in hvdtrain/config.py.

    python scripts/update_flag_table.py          # rewrite README.md in place
    python scripts/update_flag_table.py --check  # exit 1 when README.md is stale

The table sits between the markers ``<!-- flags:begin -->`` and ``<!-- flags:end -->``.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from hvdtrain.config import flag_table  # noqa: E402  pylint: disable=wrong-import-position

BEGIN, END = "<!-- flags:begin -->\n", "<!-- flags:end -->\n"


def updated(text: str) -> str:
    """`text` with the table between the markers replaced by the generated one."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + flag_table() + text[end:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report a stale table")
    parser.add_argument("--readme", default=os.path.join(os.path.dirname(HERE), "README.md"))
    args = parser.parse_args()
    with open(args.readme, encoding="utf-8") as src:
        text = src.read()
    new = updated(text)
    if args.check:
        if new != text:
            print(f"{args.readme}: the flag table is stale; run scripts/update_flag_table.py",
                  file=sys.stderr)
            return 1
        return 0
    if new != text:
        with open(args.readme, "w", encoding="utf-8") as out:
            out.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
