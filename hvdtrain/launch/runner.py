"""Run the user's command in one worker or server of a parameter-server job, as it runs alone.

``hvdtrain-launch`` starts every worker and server as ``python .../hvdtrain/launch/runner.py --
COMMAND...`` (run by path, standard library only, like ``remote.py``). That first stage looks
at COMMAND on the host where it runs and replaces itself (``exec``) with:

- for a Python program (``python3 [options] script.py``, ``python3 -m module``,
  ``python3 -c code``, or a file whose ``#!`` line names Python, such as the ``hvdtrain``
  console script): the program's own interpreter running this file again,
  ``python3 [options] runner.py --run KIND TARGET ARGS...``, which runs TARGET with
  :mod:`runpy` as Python would (``sys.argv``, ``sys.path[0]``, ``__main__``);
- for anything else (a shell script, a binary): COMMAND itself, untouched;
- for COMMAND given as one string with spaces (``"python3 prog.py"``, the form of MXNet's
  ``launch.py``, which joins its arguments and runs them through bash): the words of a
  simple command as bash would split them, or ``bash -c STRING`` when it uses shell syntax
  (pipes, variables, ``;``, globs).

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
import re
import runpy
import shlex
import shutil
import sys

RUNNER = os.path.abspath(__file__)
# Interpreter flags that take no value and keep the program a plain script run.
_PLAIN_FLAGS = set("bBdEIOqsSuv")
_FLAGS_WITH_VALUE = ("-W", "-X")
_SHELL_SYNTAX = set("|&;<>()$`\\*?[]{}~#!\n")
_SERVER_MODULE = "mxnet.kvstore.kvstore_server"
_KEPT = []  # the program's globals, freed at shutdown as they would be alone


def runner_argv(command, python=sys.executable):
    """The argv that starts `command` through this runner."""
    return [python, RUNNER, "--"] + list(command)


def command_argv(command):
    """`command` as an argv: one string with spaces is read as ``launch.py`` reads it (by bash):
    split into words when it is a simple command, else ``bash -c STRING``."""
    if len(command) != 1 or not any(c.isspace() for c in command[0]):
        return list(command)
    text = command[0].strip()
    words = text.split()
    if any(c in _SHELL_SYNTAX for c in text) or "=" in words[0]:
        return ["bash", "-c", text]
    return shlex.split(text)


def is_python(program):
    return re.fullmatch(r"python[0-9.]*", os.path.basename(program)) is not None


def _python_args(argv):
    """(interpreter argv, kind, target, args) of ``python [options] script|-m mod|-c code``, or
    None for a form run as is (``-i``, ``-x``, stdin, combined options)."""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg in ("-m", "-c") and i + 1 < len(argv):
            return argv[:i], "module" if arg == "-m" else "code", argv[i + 1], argv[i + 2:]
        if arg in _FLAGS_WITH_VALUE:
            i += 2
        elif arg.startswith(_FLAGS_WITH_VALUE) or (
                arg.startswith("-") and not arg.startswith("--") and len(arg) > 1
                and set(arg[1:]) <= _PLAIN_FLAGS):
            i += 1
        elif arg.startswith("-"):
            return None
        else:
            return argv[:i], "script", arg, argv[i + 1:]
    return None


def _shebang(path):
    """The interpreter argv of `path`'s ``#!`` line, or None."""
    try:
        with open(path, "rb") as src:
            line = src.readline(256)
    except OSError:
        return None
    if not line.startswith(b"#!"):
        return None
    parts = line[2:].decode(errors="replace").strip().split(None, 1)
    return parts or None


def plan(argv):
    """How to run `argv`: (interpreter argv, kind, target, args) for a Python program, None
    for a program run as is."""
    if is_python(argv[0]):
        return _python_args(argv)
    path = argv[0] if os.sep in argv[0] else shutil.which(argv[0])
    interpreter = _shebang(path) if path else None
    if not interpreter:
        return None
    if os.path.basename(interpreter[0]) == "env" and len(interpreter) == 2:
        interpreter = interpreter[1:]  # "#!/usr/bin/env python3": python3 from PATH
    if not is_python(interpreter[0]) or any(" " in a for a in interpreter[1:]):
        return None
    return interpreter, "script", path, argv[1:]


def start(command):
    """First stage: replace this process with `command`, through the runner when it is a
    Python program."""
    argv = command_argv(command)
    how = plan(argv)
    if how is not None:
        interpreter, kind, target, args = how
        argv = interpreter + [RUNNER, "--run", kind, target] + args
    try:
        os.execvp(argv[0], argv)
    except OSError as err:
        print(f"hvdtrain-launch: cannot run {argv[0]}: {err.strerror}", file=sys.stderr)
        return 127 if isinstance(err, FileNotFoundError) else 126


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
    sys.argv = ["-c" if kind == "code" else target] + list(args)
    try:
        kept = _run_target(kind, target)  # its globals live until shutdown, as alone
    except SystemExit as stop:
        if exit_code(stop.code):
            skip_exit_barriers()
        elif server and not _from_server(stop.__traceback__):
            _not_a_server()
        raise
    except BaseException as exc:  # pylint: disable=broad-except
        skip_exit_barriers()
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
        return start(argv[1:])
    if argv[:1] == ["--run"] and len(argv) >= 3:
        _KEPT.append(run(argv[1], argv[2], argv[3:]))
        return 0
    print("usage: runner.py -- COMMAND... | runner.py --run script|module|code TARGET ARGS...",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
