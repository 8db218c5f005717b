"""One line to stdout in one write, for the test programs that run under a launcher.

``print`` writes its text and its newline in two writes when Python runs unbuffered
(``PYTHONUNBUFFERED=1``, as here and in CI); mpirun's ``--tag-output`` tags each write it
reads, so two ranks printing at once ran their lines together and a test that counts lines
saw one where there were two.
"""
import sys


def say(text: str) -> None:
    """Write `text` and its newline to stdout in one write, then flush."""
    sys.stdout.write(f"{text}\n")
    sys.stdout.flush()
