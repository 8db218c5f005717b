"""Make a failing parameter-server worker exit, whatever Python program it runs.

hvdtrain-launch puts this folder first on every worker's ``PYTHONPATH``, so Python imports
this module at start-up. A worker program that fails would otherwise hang at interpreter
shutdown: MXNet's ps-lite finalizer waits at a barrier for the other workers, which are
blocked in a pull waiting for this one, and the launcher never sees the exit status.

Here a failing exit leaves through ``os._exit`` with its status, before any finalizer:

- an uncaught exception: status 1 (130 for KeyboardInterrupt), right after the traceback;
- ``sys.exit(n)``, ``exit(n)`` or ``quit(n)`` with a non-zero status: that status, once
  the program has unwound (``finally`` blocks run) and the interpreter starts shutting
  down. The frames that called it are kept alive until then: freeing their local
  variables as the ``SystemExit`` is cleared would free a local KVStore, whose finalizer
  is the barrier that hangs. A program that catches that ``SystemExit`` and then ends
  normally would still exit with the recorded status; a bare ``raise SystemExit(n)`` is
  not seen.

A normal exit is untouched. Standard library only: this runs in every Python process the
worker starts, before anything else. A ``sitecustomize`` this one shadows still runs.
"""
import builtins
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_requested = [0]  # the non-zero status asked for through sys.exit, exit or quit
_kept_frames = []  # the frames that asked for it, kept alive until shutdown


def _status(code):
    """The exit status Python gives ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    return 1  # a message: Python prints it and exits with 1


def _leave(status):
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # pylint: disable=broad-except
            pass
    os._exit(status)  # pylint: disable=protected-access


def _on_uncaught(exc_type, exc, tb, _previous=sys.excepthook):
    _previous(exc_type, exc, tb)  # the traceback, as usual
    _leave(130 if issubclass(exc_type, KeyboardInterrupt) else 1)


def _recording(exit_function):
    def exit_and_record(*args):
        code = args[0] if args else None
        if _status(code):
            _requested[0] = _status(code)
            frame = sys._getframe(1)  # pylint: disable=protected-access
            while frame is not None:
                _kept_frames.append(frame)
                frame = frame.f_back
        return exit_function(*args)
    return exit_and_record


def _at_shutdown():
    if _requested[0]:
        _leave(_requested[0])


def _install():
    sys.excepthook = _on_uncaught
    sys.exit = _recording(sys.exit)
    for name in ("exit", "quit"):
        if hasattr(builtins, name):
            setattr(builtins, name, _recording(getattr(builtins, name)))
    try:
        # Runs as shutdown begins, before atexit handlers (MXNet's among them) and before
        # non-daemon threads are joined (Python 3.9+).
        import threading  # pylint: disable=import-outside-toplevel
        threading._register_atexit(_at_shutdown)  # pylint: disable=protected-access
    except (AttributeError, RuntimeError):
        import atexit  # pylint: disable=import-outside-toplevel
        atexit.register(_at_shutdown)


def _run_shadowed_sitecustomize():
    """Run the ``sitecustomize`` that this module hides (e.g. the system Python's)."""
    from importlib.machinery import PathFinder  # pylint: disable=import-outside-toplevel
    from importlib.util import module_from_spec  # pylint: disable=import-outside-toplevel
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(module_from_spec(spec))


_install()
_run_shadowed_sitecustomize()
