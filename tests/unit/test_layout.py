"""The package's folders are its architecture: lower levels never import higher ones.

Read from the source with :mod:`ast` (nothing is imported), so a module that breaks the rule
fails here even when the import sits inside a function.
"""
import ast
import os
import sys

import pytest

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                   "hvdtrain")

# Lowest first. A module may import its own sub-package and anything on a lower level, never
# a sibling on its own level or anything above it (docs/development.md draws this picture).
LEVELS = [
    {"options", "ecosystem"},
    {"config"},
    {"launch", "state"},
    {"report"},
    {"store", "data", "runtime"},
    {"loop", "models"},
    {"estimator"},
    {"classify"},
    {"check", "job", "serve", "horovod"},
    {"eval_job"},
    {"cli", "__init__"},
]
LEVEL = {part: index for index, parts in enumerate(LEVELS) for part in parts}

# The launcher runs on hosts that may lack MXNet (and remote.py runs by path): standard
# library only, and nothing of hvdtrain but the standard-library-only config module.
LAUNCH_MAY_IMPORT = {"hvdtrain.config", "hvdtrain.options"}


def _modules():
    for folder, _, files in os.walk(PKG):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, os.path.dirname(PKG))[:-3].replace(os.sep, ".")
                yield path, dotted


def _imports(path, dotted):
    """Every module `path` imports, relative imports resolved to absolute names."""
    package = dotted.split(".") if dotted.endswith("__init__") else dotted.split(".")[:-1]
    if dotted.endswith("__init__"):
        package = package[:-1]
    with open(path, encoding="utf-8") as src:
        tree = ast.parse(src.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            if node.module:
                yield module
            else:  # from . import a, b: each name is a module
                for alias in node.names:
                    yield f"{module}.{alias.name}"


def _part(dotted):
    """The layout part a module belongs to: its sub-package, or its own name at top level."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


ALL = sorted(_modules())


def test_every_part_of_the_package_has_a_level():
    parts = {_part(dotted) for _, dotted in ALL}
    assert parts == set(LEVEL), "a new sub-package or top-level module needs a level here"


@pytest.mark.parametrize("path,dotted", ALL, ids=[d for _, d in ALL])
def test_no_module_imports_its_level_or_above(path, dotted):
    own = _part(dotted)
    wrong = sorted(target for target in _imports(path, dotted)
                   if target.startswith("hvdtrain") and _part(target) != own
                   and LEVEL[_part(target)] >= LEVEL[own])
    assert not wrong, f"{dotted} (level {LEVEL[own]}: {own}) imports {wrong}"


@pytest.mark.parametrize("path,dotted", [m for m in ALL if _part(m[1]) == "launch"],
                         ids=[d for _, d in ALL if _part(d) == "launch"])
def test_the_launcher_uses_the_standard_library_only(path, dotted):
    stdlib = set(sys.stdlib_module_names)
    wrong = sorted(
        target for target in _imports(path, dotted)
        if not (target.split(".")[0] in stdlib or target == "__future__"
                or target.startswith("hvdtrain.launch") or target in LAUNCH_MAY_IMPORT))
    assert not wrong, f"{dotted} imports {wrong}: hvdtrain-launch must not need them"


@pytest.mark.parametrize("name", ["config", "options"])
def test_config_is_standard_library_only(name):
    """The launcher imports config (and config options), so neither may bring in MXNet."""
    path = os.path.join(PKG, f"{name}.py")
    stdlib = set(sys.stdlib_module_names)
    wrong = [t for t in _imports(path, f"hvdtrain.{name}")
             if t.split(".")[0] not in stdlib and t != "__future__" and
             t not in ("hvdtrain.options",)]
    assert not wrong


def _cycle(graph):
    """One circle of imports in `graph` ({module: modules it imports}) as a list that starts
    and ends with the same module, or None."""
    state, path = {}, []

    def visit(node):
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = "done"
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def _package_graph(package):
    """{module of `package`: the modules of the same package it imports (anywhere in it)}."""
    members = {d for _, d in ALL if d.rsplit(".", 1)[0] == package}
    return {dotted: {t for t in _imports(path, dotted) if t in members and t != dotted}
            for path, dotted in ALL if dotted in members}


PACKAGES = sorted({d.rsplit(".", 1)[0] for _, d in ALL})


@pytest.mark.parametrize("package", PACKAGES)
def test_no_package_imports_itself_in_a_circle(package):
    """Inside a package, modules read bottom-up too: no circle, even through an import
    placed inside a function to get around one."""
    circle = _cycle(_package_graph(package))
    assert circle is None, f"{package} imports in a circle: {' -> '.join(circle)}"


def test_the_circle_check_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_rule_catches_an_upward_import(tmp_path):
    """The checker itself: a store module importing the loop is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("from ..loop.fit import fit\n")
    found = list(_imports(str(bad), "hvdtrain.store.bad"))
    assert found == ["hvdtrain.loop.fit"]
    assert LEVEL[_part(found[0])] >= LEVEL["store"]


def test_development_md_names_every_program_and_no_file_outside_the_repo():
    """docs/development.md's layout counts and names setup.cfg's console scripts, and cites
    no file this repository does not hold."""
    import configparser
    import re
    root = os.path.dirname(PKG)
    setup = configparser.ConfigParser()
    setup.read(os.path.join(root, "setup.cfg"))
    scripts = [line.split("=")[0].strip() for line in
               setup["options.entry_points"]["console_scripts"].splitlines() if line.strip()]
    with open(os.path.join(root, "docs", "development.md")) as src:
        text = src.read()
    words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight"]
    layout = " ".join(text.split("```")[0].split())
    assert f"{words[len(scripts)]} programs" in layout, layout
    assert all(f"`{name}`" in layout for name in scripts), scripts
    held = set()
    for top, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]  # not .venv, .git
        held.update(os.path.relpath(os.path.join(top, name), root) for name in files)
    for cited in re.findall(r"`([\w./-]+\.(?:md|py|cfg|sh))`", text):
        assert any(path == cited or path.endswith("/" + cited) for path in held), cited


def test_importing_the_package_loads_no_horovod(tmp_path):
    """`import hvdtrain` (the Estimator included) must work where Horovod does not load:
    hvdtrain-check imports it on such a rank to name it (tests/dist/test_preflight.py)."""
    import subprocess  # pylint: disable=import-outside-toplevel
    (tmp_path / "horovod").mkdir()
    (tmp_path / "horovod" / "__init__.py").write_text('raise ImportError("no Horovod here")\n')
    proc = subprocess.run([sys.executable, "-c", "import hvdtrain, hvdtrain.estimator"],
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                              [str(tmp_path), os.path.dirname(PKG)])),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


# loop/'s rooms, lowest first (loop/__init__.py): a room may import a lower one, never a
# sibling on its level or a higher one.
LOOP_ROOMS = [{"engine"}, {"recipe", "weights"}, {"run"}, {"elastic"}]
LOOP_ROOM = {room: index for index, rooms in enumerate(LOOP_ROOMS) for room in rooms}
LOOP = [(p, d) for p, d in ALL if d.startswith("hvdtrain.loop.") and len(d.split(".")) > 3]


def test_every_room_of_the_loop_has_a_level():
    assert {d.split(".")[2] for _, d in LOOP} == set(LOOP_ROOM)


@pytest.mark.parametrize("path,dotted", LOOP, ids=[d for _, d in LOOP])
def test_no_room_of_the_loop_imports_its_level_or_above(path, dotted):
    own = dotted.split(".")[2]
    wrong = sorted(t for t in _imports(path, dotted) if t.startswith("hvdtrain.loop.")
                   and len(t.split(".")) > 3 and t.split(".")[2] != own
                   and LOOP_ROOM[t.split(".")[2]] >= LOOP_ROOM[own])
    assert not wrong, f"{dotted} (room {own}) imports {wrong}"
