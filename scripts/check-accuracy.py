#!/usr/bin/env python3
"""Print a run's final test accuracy and fail when it is below a floor.

    scripts/check-accuracy.py runs/demo/metrics.jsonl 0.95

`make demo` ends with it, so a silent regression of the main job fails CI instead of
printing a poor figure that nobody reads.
"""
import json
import sys


def final_test_acc(path):
    """The last ``end`` record's test accuracy, else the last ``epoch`` record's."""
    found = None
    with open(path, encoding="utf-8") as src:
        for line in src:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut short by a crash says nothing about the result
            if isinstance(record, dict) and record.get("event") in ("epoch", "end") \
                    and isinstance(record.get("test_acc"), (int, float)):
                found = float(record["test_acc"])
    return found


def main(argv):
    if len(argv) != 2:
        print("usage: check-accuracy.py METRICS_JSONL MIN_TEST_ACC", file=sys.stderr)
        return 2
    path, floor = argv[0], float(argv[1])
    try:
        acc = final_test_acc(path)
    except OSError as err:
        print(f"check-accuracy: cannot read {path}: {err.strerror}", file=sys.stderr)
        return 1
    if acc is None:
        print(f"check-accuracy: {path} holds no test accuracy", file=sys.stderr)
        return 1
    verdict = "ok" if acc >= floor else f"FAILED: below {floor}"
    print(f"final test accuracy {acc:.4f} ({path}): {verdict}")
    return 0 if acc >= floor else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
