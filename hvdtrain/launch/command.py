"""How a worker's or server's command is started: the first stage of ``runner.py``.

``runner.py -- COMMAND...`` loads this file (by path: standard library only) and reads COMMAND
on the host where it runs:

- an argv (``python3 train.py --lr 0.1``), or one string with spaces (``"python3 train.py"``,
  the form of MXNet's ``launch.py``, which runs it through bash), split as bash splits a simple
  command. Leading ``NAME=value`` words, also after ``env``, go into the program's environment
  (``"OMP_NUM_THREADS=1 python3 train.py"``, ``env FOO=1 python3 train.py``);
- a Python program (``python3 [options] script.py``, ``-m module``, ``-c code``, or a file
  whose ``#!`` line names Python, such as the ``hvdtrain`` console script) is replaced
  (``exec``) by its interpreter running ``runner.py --run KIND TARGET ARGS...``; anything else
  (a shell script, a binary) by itself, untouched;
- one string that uses shell syntax (``|``, ``&&``, ``;``, redirections, ``$VAR``...) runs as
  ``bash -c STRING``, with every Python program the string names (``python*``, or a word naming
  a Python ``#!`` file) defined as a shell function that starts it through the runner, and this
  process staying as the shell's parent: the first of those programs to fail ends the command at
  once with its status (even where the shell would go on, as after ``;`` or in a pipe), because
  the job it belonged to cannot go on without it. Functions are not exported: programs the user's
  programs start see none of this.
"""
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time

# The pipe a shell command's Python programs report their failure on (runner.py writes it).
STATUS_FD = "HVDTRAIN_LAUNCH_STATUS_FD"
# Interpreter flags that take no value and keep the program a plain script run.
_PLAIN_FLAGS = set("bBdEIOqsSuv")
_FLAGS_WITH_VALUE = ("-W", "-X")
_SHELL_SYNTAX = set("|&;<>()$`\\*?[]{}~#!\n")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_FUNCTION_NAME = re.compile(r"[\w./+][\w./+-]*")


def split_command(command):
    """(assignments, argv) of `command`: the ``NAME=value`` words before the program, and the
    program's argv, ``["bash", "-c", STRING]`` for one string that uses shell syntax."""
    words = list(command)
    if len(command) == 1 and any(c.isspace() for c in command[0]):
        text = command[0].strip()
        if any(c in _SHELL_SYNTAX for c in text):
            return {}, ["bash", "-c", text]
        words = shlex.split(text)
    assignments = {}
    while len(words) > 1 and _ASSIGNMENT.match(words[0]):
        name, value = words.pop(0).split("=", 1)
        assignments[name] = value
    if len(words) > 2 and os.path.basename(words[0]) == "env" and _ASSIGNMENT.match(words[1]):
        rest = words[1:]
        while len(rest) > 1 and _ASSIGNMENT.match(rest[0]):
            name, value = rest.pop(0).split("=", 1)
            assignments[name] = value
        words = rest
    return assignments, words


def command_argv(command):
    """The argv `command` runs (see :func:`split_command`)."""
    return split_command(command)[1]


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


def python_programs(text):
    """The words of shell `text` that name a Python program (``python3``, ``/usr/bin/python``,
    ``hvdtrain``, ``./train.py`` with a Python ``#!``), with the usual interpreter names."""
    try:
        words = list(shlex.shlex(text, posix=True, punctuation_chars=True))
    except ValueError:  # unbalanced quotes: bash will say so
        words = []
    names = {"python", "python3", f"python3.{sys.version_info[1]}"}
    for word in words:
        runnable = os.sep not in word or os.access(word, os.X_OK)
        if _FUNCTION_NAME.fullmatch(word) and (is_python(word) or (runnable and plan([word]))):
            names.add(word)
    return sorted(names)


def shell_script(text, runner):
    """`text` preceded by a function for each Python program it names, which runs the program
    through `runner` (``command`` bypasses the function inside it)."""
    head = "".join(f'{name}() {{ command {shlex.quote(sys.executable)} {shlex.quote(runner)} -- '
                   f'{name} "$@"; }}\n' for name in python_programs(text))
    return head + text


def _stat(pid):
    """(name, state letter, parent pid) of process `pid` (state ``Z``: a zombie), None if
    gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
        fields = text.rsplit(")", 1)[1].split()
        return text[text.index("(") + 1:text.rindex(")")], fields[0], int(fields[1])
    except (OSError, IndexError, ValueError):
        return None


def _tree(root):
    """Process `root` and its descendants: {pid: name}."""
    procs = {}
    for entry in os.listdir("/proc"):
        found = _stat(entry) if entry.isdigit() else None
        if found:
            procs[int(entry)] = found
    tree, grew = {root}, True
    while grew:
        children = {pid for pid, (_, _, parent) in procs.items() if parent in tree} - tree
        tree |= children
        grew = bool(children)
    return {pid: procs[pid][0] for pid in tree if pid in procs}


def _signal(pids, signum):
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def _kill_descendants(root, settle=1.0):
    """SIGKILL every descendant of `root`, including one forked while they are being listed.

    A SIGKILL to a list read from /proc misses a child its parent forks just after the read:
    the parent dies and the child runs on, an orphan (a program bash was starting when
    ``remote.py`` was killed outlived the job, seen in CI). So the descendants are stopped
    first, and listed again until no new one appears; a process is waited for (up to `settle`
    s) until /proc shows it stopped, which it is only once a fork it was making is complete."""
    stopped = set()
    while True:
        found = set(_tree(root)) - {root} - stopped
        if not found:
            break
        _signal(found, signal.SIGSTOP)
        stopped |= found
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline and any(
                (_stat(pid) or (None, "T", 0))[1] not in "TtZX" for pid in found):
            time.sleep(0.01)
    _signal(stopped, signal.SIGKILL)


# Linux's prctl options for the signal a process gets when its parent dies.
_PR_SET_PDEATHSIG, _PR_GET_PDEATHSIG = 1, 2


def _take_over_the_death_signal():
    """Let this shell's programs die with this process's parent, as this process does.

    ``remote.py`` has the kernel SIGKILL its command when it dies (``PR_SET_PDEATHSIG``); for
    a shell command that command is this process, and a SIGKILL would leave ``bash`` and its
    programs running. So where such a signal was inherited, it becomes a real-time signal whose
    handler SIGKILLs this process's tree, then this process. (Not SIGTERM: a launcher's TERM to
    the group is a stop request the programs must be able to save on.)"""
    if not sys.platform.startswith("linux"):
        return
    import ctypes  # pylint: disable=import-outside-toplevel
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    inherited = ctypes.c_int(0)
    if prctl(_PR_GET_PDEATHSIG, ctypes.byref(inherited)) != 0 or not inherited.value:
        return
    parent_gone = signal.SIGRTMIN + 2  # glibc keeps the first real-time signals for itself

    def end_the_tree(*_):
        _kill_descendants(os.getpid())
        os._exit(128 + signal.SIGKILL)  # pylint: disable=protected-access

    signal.signal(parent_gone, end_the_tree)
    prctl(_PR_SET_PDEATHSIG, int(parent_gone))


def run_shell(text, runner):
    """Run shell `text` (see the module docstring); return its exit status, or the status of the
    first of its Python programs that failed."""
    _take_over_the_death_signal()
    read_end, write_end = os.pipe()  # a failing program's "STATUS PID" comes here
    ack_read, ack_write = os.pipe()  # ... and it waits for the reply: the shell is stopped
    env = dict(os.environ, **{STATUS_FD: f"{write_end},{ack_read}"})
    shell = subprocess.Popen(["bash", "-c", shell_script(text, runner)], env=env,
                             pass_fds=(write_end, ack_read))
    os.close(write_end)
    os.close(ack_read)
    # As a shell waiting for a command: Ctrl-C is for the programs (the launcher stops the job).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    reading = [read_end]
    while True:
        done = shell.poll()
        ready = select.select(reading, [], [], 0 if done is not None else 0.2)[0]
        report = os.read(read_end, 64) if ready else b""
        if report:
            status, pid = (int(word) for word in report.split()[:2])
            # The shell goes no further (no '; next', no '|| retry'), while the program ends as
            # alone (output, atexit) and a pipe's other end still relays what it prints.
            _signal([p for p, name in _tree(shell.pid).items() if name == "bash"], signal.SIGSTOP)
            os.write(ack_write, b"stopped\n")
            while (_stat(pid) or (None, "Z", 0))[1] != "Z":  # gone or a zombie: ended
                time.sleep(0.1)
            _signal(_tree(shell.pid), signal.SIGKILL)
            shell.wait()
            return status
        if ready:
            reading = []  # every writer is gone: wait for the shell alone
        if done is not None:
            return 128 - done if done < 0 else done


def start(command, runner):
    """Replace this process with `command`, through `runner` when it is a Python program; run
    a shell command as its parent. Return a status only when it cannot run."""
    assignments, argv = split_command(command)
    os.environ.update(assignments)
    if argv[:2] == ["bash", "-c"] and len(argv) == 3:
        return run_shell(argv[2], runner)
    how = plan(argv)
    if how is not None:
        interpreter, kind, target, args = how
        argv = interpreter + [runner, "--run", kind, target] + args
    try:
        os.execvp(argv[0], argv)
    except OSError as err:
        print(f"hvdtrain-launch: cannot run {argv[0]}: {err.strerror}", file=sys.stderr)
        return 127 if isinstance(err, FileNotFoundError) else 126
