"""Correct programs that must behave under hvdtrain-launch exactly as they do alone.

``python exit_programs.py MODE`` writes files into the current folder and exits as MODE says.
Under the launcher (a ``DMLC_ROLE`` is set) the program also joins the job with a dist store,
as a real worker does; ``import mxnet`` comes first because on a server it never returns.
"""
import argparse
import atexit
import multiprocessing
import os
import sys
import threading

import mxnet as mx


def write(name, text):
    with open(name, "w") as out:
        out.write(text + "\n")


def caught_exit():
    """An argparse error the program handles itself, then a normal end."""
    try:
        argparse.ArgumentParser(prog="x").parse_args(["--no-such-flag"])
    except SystemExit as stop:
        write("caught.txt", f"caught SystemExit({stop.code})")
    atexit.register(write, "atexit.txt", "ran")


def thread_exit():
    """sys.exit in a thread ends that thread only."""
    thread = threading.Thread(target=sys.exit, args=(4,))
    thread.start()
    thread.join()
    write("main.txt", "went on after the thread")


def buffered_exit():
    """Buffered writes never flushed by the program, then sys.exit(3)."""
    out = open("buffered.txt", "w")  # pylint: disable=consider-using-with
    out.write("written, never flushed by the program\n")
    sys.exit(3)


def atexit_exit():
    atexit.register(write, "atexit.txt", "ran")
    sys.exit(5)


def child():
    try:
        sys.exit(6)
    except SystemExit:
        pass
    write("child.txt", "the child caught its SystemExit")


def mp_child():
    """A multiprocessing child (a fresh interpreter: 'spawn') that catches its own exit."""
    process = multiprocessing.get_context("spawn").Process(target=child)
    process.start()
    process.join()
    write("parent.txt", f"child exit code {process.exitcode}")


MODES = dict(caught_exit=caught_exit, thread_exit=thread_exit, buffered_exit=buffered_exit,
             atexit_exit=atexit_exit, mp_child=mp_child)

if __name__ == "__main__":
    store = mx.kv.create("dist_sync") if os.environ.get("DMLC_ROLE") == "worker" else None
    MODES[sys.argv[1]]()
