"""``hvdtrain`` whose background checkpoint writes fail as the save vote races them.

Usage: python racy_write_program.py [hvdtrain flags...] (under a launcher).

Every write fails at once (a full disk), and the first time anyone asks whether it is still
running after that, the answer is "yes": the moment a real write thread fails between two
reads of its state. A vote that reads "failed?" and "busy?" apart then sees neither, and rank
0 starts the next save alone into the failure it has not reported (the others go on into
their next collective); one that reads the state once sees it busy, then failed.
"""
import sys

from hvdtrain.state import checkpoint
from hvdtrain.state.background import BackgroundWrite
from hvdtrain.state.writes import OutputError


class RacyWrite(BackgroundWrite):
    def __init__(self, write, what="checkpoint"):
        def full_disk():
            raise OutputError("cannot write the checkpoint: no space left on device")
        self._asked = 0
        super().__init__(full_disk, what)
        self._thread.join()  # it has ended, and failed

    @property
    def running(self):
        self._asked += 1
        return self._asked == 1  # the first read after the failure still sees it running


checkpoint.BackgroundWrite = RacyWrite

if __name__ == "__main__":
    from hvdtrain.cli import run
    sys.argv[0] = "hvdtrain"
    run()
