"""Run the user's command in one worker or server of a parameter-server job, as it runs alone.

``hvdtrain-launch`` starts every worker and server as ``python .../hvdtrain/launch/runner.py --
COMMAND...`` (run by path, standard library only, like ``remote.py``). That first stage is
``command.py`` (beside this file): it reads COMMAND on the host where it runs and replaces
itself (``exec``) with the program, a Python program being run as
``python3 [options] runner.py --run KIND TARGET ARGS...``, which runs TARGET with :mod:`runpy`
as Python would (``sys.argv``, ``sys.path[0]``, ``__main__``); a command with shell syntax runs
under ``bash -c`` with its Python programs routed here too (see ``command.py``).

Why: a worker program that fails would hang at interpreter exit, because the finalizer of
MXNet's dist KVStore waits at a ps-lite barrier for the other workers, which wait in a pull
for this one. When TARGET ends with a non-zero status (an uncaught exception, ``sys.exit(n)``)
this runner keeps every live MXNet ``KVStore`` from being finalized (one reference more, never
released) and lets Python exit as it would: ``atexit`` handlers, flushed files, the traceback
through ``sys.excepthook``, the same status. Anything that ends well, or ends only a thread, is
untouched; child processes never see this file.

In the server role (``DMLC_ROLE=server``, where ``import mxnet`` runs the server and never
returns) it also turns a failure in MXNet's server callbacks, which MXNet would print and
ignore (e.g. the optimizer the workers sent cannot be unpickled), into one line and exit 1,
and refuses a program that ends without ever importing ``mxnet``.
"""
import os
import runpy
import sys

RUNNER = os.path.abspath(__file__)
_SERVER_MODULE = "mxnet.kvstore.kvstore_server"
_STATUS_FD = "HVDTRAIN_LAUNCH_STATUS_FD"  # command.STATUS_FD (this file imports no sibling)
_KEPT = []  # the program's globals, freed at shutdown as they would be alone


def runner_argv(command, python=sys.executable):
    """The argv that starts `command` through this runner."""
    return [python, RUNNER, "--"] + list(command)


def _first_stage():
    """``command.py`` beside this file, loaded by path (this file runs outside any package)."""
    import importlib.util  # pylint: disable=import-outside-toplevel
    spec = importlib.util.spec_from_file_location(
        "hvdtrain_launch_command", os.path.join(os.path.dirname(RUNNER), "command.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def exit_code(code):
    """The status Python exits with for ``SystemExit(code)``."""
    if code is None:
        return 0
    return code & 0xFF if isinstance(code, int) else 1


def skip_exit_barriers():
    """Let every live MXNet KVStore shut down without ps-lite's exit barrier.

    A dist store's finalizer otherwise waits at that barrier for workers that are waiting for
    this one. MXNet's C API has the switch (``MXKVStoreSetBarrierBeforeExit``, declared in
    ``c_api.h``); its Python API does not wrap it.
    """
    kvstore = sys.modules.get("mxnet.kvstore.kvstore")
    if kvstore is None:
        return
    import ctypes  # pylint: disable=import-outside-toplevel
    import gc  # pylint: disable=import-outside-toplevel
    lib = sys.modules["mxnet.base"]._LIB  # pylint: disable=protected-access
    for obj in gc.get_objects():
        if isinstance(obj, kvstore.KVStore):
            lib.MXKVStoreSetBarrierBeforeExit(obj.handle, ctypes.c_int(0))


def _status_channel():
    """(report fd, reply fd) of a shell command's first stage (command.py), kept from the
    program's children; None when the command is the program itself."""
    fds = os.environ.pop(_STATUS_FD, None)
    try:
        channel = tuple(int(fd) for fd in fds.split(","))
        for fd in channel:
            os.set_inheritable(fd, False)
        return channel
    except (AttributeError, OSError, ValueError):
        return None


def _failed(status, channel):
    """Let the program exit with `status` without ps-lite's barrier. In a shell command, tell
    its first stage, which ends the command (a shell would go on after ``;`` or in a pipe),
    and wait until it has stopped the shell."""
    skip_exit_barriers()
    if channel is not None:
        try:
            os.write(channel[0], f"{status} {os.getpid()}\n".encode())
            os.read(channel[1], 64)
        except OSError:
            pass


def _user_traceback(tb):
    """`tb` without this file's and runpy's frames, as Python alone would print it."""
    while tb is not None and (tb.tb_frame.f_code.co_filename == __file__
                              or tb.tb_frame.f_globals is vars(runpy)):
        tb = tb.tb_next
    return tb


def _watch_server_callbacks(previous=sys.unraisablehook):
    def on_unraisable(unraisable):
        if "ctypes callback" in (unraisable.err_msg or ""):
            exc = unraisable.exc_value
            print(f"hvdtrain-launch: error: parameter server: MXNet's server failed on what the "
                  f"workers sent (their optimizer): {type(exc).__name__}: {exc}; the servers run "
                  "the worker command, so its optimizer class must be importable there (not "
                  "defined in the script after 'import mxnet')", file=sys.stderr, flush=True)
            os._exit(1)  # pylint: disable=protected-access
        previous(unraisable)
    sys.unraisablehook = on_unraisable


def _run_target(kind, target):
    if kind == "script":
        if not os.path.exists(target):  # as Python itself says it, with its status 2
            python = getattr(sys, "orig_argv", [sys.executable])[0]  # as it was invoked
            print(f"{python}: can't open file "
                  f"{os.path.abspath(target)!r}: [Errno 2] No such file or directory",
                  file=sys.stderr)
            raise SystemExit(2)
        if not (sys.flags.isolated or getattr(sys.flags, "safe_path", False)):
            sys.path[0] = os.path.dirname(os.path.realpath(target))
        return runpy.run_path(target, run_name="__main__")
    if kind == "module":
        sys.path[0] = os.getcwd()
        return runpy.run_module(target, run_name="__main__", alter_sys=True)
    sys.path[0] = ""
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    exec(compile(target, "<string>", "exec"), namespace)  # pylint: disable=exec-used
    return namespace


def run(kind, target, args):
    """Second stage: run `target` (a script path, a module name or code) with `args`."""
    server = os.environ.get("DMLC_ROLE") == "server"
    if server:
        _watch_server_callbacks()
    channel = _status_channel()
    sys.argv = ["-c" if kind == "code" else target] + list(args)
    try:
        kept = _run_target(kind, target)  # its globals live until shutdown, as alone
    except SystemExit as stop:
        if exit_code(stop.code):
            _failed(exit_code(stop.code), channel)
        elif server and not _from_server(stop.__traceback__):
            _not_a_server()
        raise
    except BaseException as exc:  # pylint: disable=broad-except
        _failed(130 if isinstance(exc, KeyboardInterrupt) else 1, channel)
        tb = _user_traceback(exc.__traceback__)
        exc.with_traceback(tb)  # Python prints the exception's own traceback, not `tb`
        if isinstance(exc, KeyboardInterrupt):
            raise exc.with_traceback(tb)
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
        sys.excepthook(type(exc), exc, tb)
        sys.exit(1)
    if server:
        _not_a_server()  # a server's 'import mxnet' never returns
    return kept


def _from_server(tb):
    """Whether `tb` passes through MXNet's server module (which exits when the server is
    done; a failed import leaves no trace in sys.modules)."""
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__") == _SERVER_MODULE:
            return True
        tb = tb.tb_next
    return False


def _not_a_server():
    print("hvdtrain-launch: error: parameter server: the worker command ended without "
          "importing mxnet; a server runs inside 'import mxnet' (DMLC_ROLE=server), so the "
          "program must import it", file=sys.stderr, flush=True)
    sys.exit(1)


def main(argv):
    if argv[:1] == ["--"] and len(argv) > 1:
        return _first_stage().start(argv[1:], RUNNER)
    if argv[:1] == ["--run"] and len(argv) >= 3:
        _KEPT.append(run(argv[1], argv[2], argv[3:]))
        return 0
    print("usage: runner.py -- COMMAND... | runner.py --run script|module|code TARGET ARGS...",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
