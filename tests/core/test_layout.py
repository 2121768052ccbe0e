"""The package is a house of rooms: imports point only down, no circles, modules of one job.

Rooms, lowest first (a room may import itself and any room before it)::

    core < storage < sampling < archive < stats < interop < loader < integrations < agent
         < actors < cluster < train < testing

``mmreplay/__init__.py``, ``__main__.py`` and the ``errors`` / ``schema`` re-export modules are
the facade: they may import any room, and no room imports them. Imports inside functions
count; imports under ``if TYPE_CHECKING:`` do not (they never run).

``cli/`` (installed as ``mmreplay.cli``) stands above every room and uses only what a user is told
to import (README, ``docs/reference.py``); its whole public surface, types and modules included:

* ``mmreplay``: the names in ``mmreplay.__all__`` (the quickstart's; ``__version__``), and the
  facade modules ``mmreplay.errors`` and ``mmreplay.schema`` with the names in their ``__all__``;
* a room that says what is public with an ``__all__`` (``mmreplay.storage``, ``mmreplay.train``,
  ...): the names in it, imported from the room's package, never from one of its modules;
* a room without one (``interop``, ``integrations``, ``loader``): its modules whose names do not
  start with ``_`` (``mmreplay.interop.minari``, ``mmreplay.integrations.sb3``), with the names in
  their ``__all__`` (or every name not starting with ``_`` where a module has none);
* ``core`` is reached through the facade only (``mmreplay.errors``, ``mmreplay.schema``, ``mmreplay``).

No ``_private`` name, module or attribute anywhere, and the same rule for an attribute read off an
imported module (``mmreplay.open_store``, ``E.SchemaError``). What the CLI needs and no room exports
is exported by that room, with a docstring saying what it is for users, or done by the CLI itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "mmreplay"
ORDER = ["core", "storage", "sampling", "archive", "stats", "interop", "loader", "integrations", "agent",
         "actors", "cluster", "train", "testing"]
FACADE = {"__init__", "__main__", "errors", "schema"}


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """Absolute mmreplay module names that ``path`` imports at run time."""
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for n in child.orelse:
                    visit(n)
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.split(".")[0] == "mmreplay")
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = here[: len(here) - child.level + 1]
                    mod = ".".join(base + ([child.module] if child.module else []))
                else:
                    mod = child.module or ""
                if mod.split(".")[0] != "mmreplay":
                    continue
                subs = [f"{mod}.{a.name}" for a in child.names if f"{mod}.{a.name}" in modules]
                found.update(subs or [mod])
            visit(child)

    visit(ast.parse(path.read_text()))
    found.discard(name)
    return found


def _room(mod: str) -> str:
    parts = mod.split(".")
    if len(parts) == 1:
        return "facade"
    return "facade" if parts[1] in FACADE and len(parts) == 2 else parts[1]


def test_every_room_is_known_and_documented():
    for p in PKG.iterdir():
        if p.is_dir() and (p / "__init__.py").exists():
            assert p.name in ORDER, f"room {p.name} is not in the layout order"
            assert ast.get_docstring(ast.parse((p / "__init__.py").read_text())), f"{p.name}/__init__.py has no docstring"
        elif p.suffix == ".py":
            assert p.stem in FACADE or p.stem in ORDER, f"mmreplay/{p.name} belongs to no room"


def test_imports_point_down_and_close_no_circle():
    modules = _modules()
    graph = {m: _imports(p, m, modules) for m, p in modules.items()}
    up = []
    for src, targets in graph.items():
        rs = _room(src)
        for t in targets:
            rt = _room(t)
            if rt == "facade" and rs != "facade":
                up.append(f"{src} -> {t} (rooms never import the facade)")
            elif rs != "facade" and ORDER.index(rt) > ORDER.index(rs):
                up.append(f"{src} -> {t} ({rs} is below {rt})")
    assert up == [], "imports pointing up:\n" + "\n".join(sorted(up))

    # circles between modules (inside a room too): Tarjan's strongly connected components
    index, low, stack, on, sccs = {}, {}, [], set(), []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    import sys

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index and _room(v) != "facade":
            strong(v)
    assert sccs == [], "import circles:\n" + "\n".join(" <-> ".join(c) for c in sccs)


def _all_imports(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """Like ``_imports``, type-only imports (``if TYPE_CHECKING:``) included."""
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            mod = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else (node.module or "")
            if mod.split(".")[0] != "mmreplay":
                continue
            subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in modules]
            found.update(subs or [mod])
    found.discard(name)
    return found


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            strong(v)
    return out


def test_the_storage_room_has_no_circle_even_counting_type_only_imports():
    """Its floors show the order (format < write < read < store); a type-only import back up is a
    circle too: it is where the protocol leaked into a satellite that takes the whole store."""
    modules = _modules()
    storage = {m: p for m, p in modules.items() if _room(m) == "storage" and m != "mmreplay.storage"}
    graph = {m: {t for t in _all_imports(p, m, modules) if t in storage} for m, p in storage.items()}
    assert _circles(graph) == [], "import circles in storage/:\n" + "\n".join(" <-> ".join(c) for c in _circles(graph))


def test_no_private_name_crosses_modules_inside_storage():
    """Inside ``storage/``, a module uses no other module's ``_private`` names: not imported, and
    (as far as the syntax shows) not read as an attribute of an object it got from another module.
    Attributes a module reads on ``self`` or on its own classes are its own business."""
    crossing = []
    for p in sorted((PKG / "storage").glob("*.py")):
        tree = ast.parse(p.read_text())
        own = {n.name for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
        own_attrs = {t.attr for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))
                     for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Attribute)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level and node.module is not None:
                names = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                if node.module.startswith("_") and node.level == 1:
                    names.append(f"module {node.module}")
                crossing += [f"{p.name}: from .{node.module} import {n}" for n in names]
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                base = node.value
                if isinstance(base, ast.Name) and (base.id in ("self", "cls") or base.id in own):
                    continue
                if node.attr in own_attrs:  # an attribute of this module's own objects
                    continue
                crossing.append(f"{p.name}:{node.lineno}: .{node.attr}")
    assert crossing == [], "\n".join(crossing)


def test_other_rooms_reach_storage_only_through_its_exports():
    """Other rooms import storage through the names ``mmreplay.storage`` exports, never one of its
    modules (the seams: the user's objects, rows in and out as whole segments, the read contract)."""
    import mmreplay.storage as storage

    exports = set(storage.__all__)
    bad = []
    for name, path in _modules().items():
        if _room(name) in ("storage", "facade"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                mod = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else [])) \
                    if node.level else (node.module or "")
                if mod == "mmreplay.storage":
                    bad += [f"{name}: {a.name}" for a in node.names if a.name not in exports]
                elif mod.startswith("mmreplay.storage."):
                    bad.append(f"{name}: from {mod} import ...")
    assert bad == [], "\n".join(bad)


def test_few_private_names_cross_rooms():
    """Rooms talk through public names: at most a handful of ``_private`` names (modules
    included) are imported from another room."""
    modules = _modules()
    crossing = []
    for name, path in modules.items():
        rs = _room(name)
        is_pkg = path.name == "__init__.py"
        here = name.split(".") if is_pkg else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            mod = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else (node.module or "")
            if mod.split(".")[0] != "mmreplay" or _room(mod) in (rs, "facade") or rs == "facade":
                continue
            private = [p for p in mod.split(".")[2:] if p.startswith("_")]
            private += [a.name for a in node.names if a.name.startswith("_") and a.name != "__version__"]
            if private:
                crossing.append(f"{name}: from {mod} import {', '.join(a.name for a in node.names)}")
    assert len(crossing) < 8, "\n".join(crossing)


def test_no_docstring_cites_a_file_outside_the_repo():
    for p in [*PKG.rglob("*.py"), *(ROOT / "cli").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]:
        if p == Path(__file__):
            continue
        text = p.read_text()
        for ref in ("RELIABILITY.md", "ARCHITECTURE.md", "STYLE.md", "../shared"):
            assert ref not in text, f"{p.relative_to(ROOT)} cites {ref}, which users do not have"


def test_every_room_is_packaged():
    """A subpackage missing from pyproject's explicit list is left out of the wheel (an editable
    install hides it)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    rooms = {"mmreplay." + p.name for p in PKG.iterdir() if (p / "__init__.py").exists()}
    assert rooms | {"mmreplay", "mmreplay.cli"} <= listed, sorted(rooms - listed)


# -- the upper floors: actors, cluster, train, agent and the CLI ------------------------------------------
UPPER = [PKG / "actors", PKG / "cluster", PKG / "train", PKG / "agent", ROOT / "cli"]
MAX_PARAMS = 10
MAX_LINES = 80
WRAPPERS = {("actors/pool.py", "collect"), ("cluster/driver.py", "ray_collect")}
"""The public keyword conveniences the README shows: their keywords are the fields of the specs they
build (any number), their bodies at most 15 lines."""


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
            if params and params[0].arg in ("self", "cls"):
                params = params[1:]
            body = node.body[1:] if ast.get_docstring(node) is not None else node.body
            lines = body[-1].end_lineno - body[0].lineno + 1 if body else 0
            yield node.name, len(params), lines


def test_no_long_function_or_parameter_list_on_the_upper_floors():
    """No function of actors/, cluster/, train/, agent/ or cli/ takes more than 10 parameters or runs
    over ~80 lines (docstring aside): a run is described by typed specs (EnvSpec, WriterSpec,
    CollectSpec, ShipSpec, TrainConfig) passed whole, and the click commands read their options in
    one spec builder."""
    bad = []
    for room in UPPER:
        for p in sorted(room.rglob("*.py")):
            rel = str(p.relative_to(PKG if p.is_relative_to(PKG) else ROOT))
            for name, params, lines in _functions(p):
                if (rel, name) in WRAPPERS:
                    if lines > 15:
                        bad.append(f"{rel}: {name} is a keyword wrapper of {lines} lines (at most 15)")
                    continue
                if params > MAX_PARAMS:
                    bad.append(f"{rel}: {name} takes {params} parameters (at most {MAX_PARAMS})")
                if lines > MAX_LINES:
                    bad.append(f"{rel}: {name} runs {lines} lines (at most {MAX_LINES})")
    assert bad == [], "\n".join(bad)


def test_the_train_room_has_no_circle_even_counting_type_only_imports():
    """algos.base < settings < q_learner, box_learner < the algorithms' modules < algos < config <
    checkpoint, runlog, batches, stores < run < loops: a type-only import back up is a circle too (the
    run state, the learners and the batch source each in a module named after it)."""
    modules = _modules()
    train = {m: p for m, p in modules.items() if _room(m) == "train" and m != "mmreplay.train"}
    graph = {m: {t for t in _all_imports(p, m, modules) if t in train} for m, p in train.items()}
    assert _circles(graph) == [], "import circles in train/:\n" + "\n".join(" <-> ".join(c) for c in _circles(graph))
    for name in ("q_learner", "box_learner", "settings", "run", "batches"):
        assert f"mmreplay.train.{name}" in train, f"train/{name}.py is missing"
    text = {m.rsplit(".", 1)[1]: p.read_text() for m, p in train.items()}
    assert "class QLearner" in text["q_learner"] and "class BoxLearner" in text["box_learner"]
    assert "class TrainConfig" in text["settings"] and "class Batches" in text["batches"]
    assert "class Run" in text["run"] and "class TrainResult" in text["run"]


def test_cluster_uses_only_the_public_names_of_actors():
    """``cluster`` imports ``mmreplay.actors`` (the package), names in its ``__all__``, never one of
    its modules or a ``_private`` name; and ``actors`` reaches no ``_private`` name of ``agent``."""
    import mmreplay.actors as actors

    public = set(actors.__all__)
    modules = _modules()
    bad = []
    for name, path in modules.items():
        room = _room(name)
        if room not in ("cluster", "actors"):
            continue
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            mod = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else (node.module or "")
            names = [a.name for a in node.names]
            if room == "cluster" and mod.startswith("mmreplay.actors"):
                if mod != "mmreplay.actors":
                    bad.append(f"{name}: from {mod} import {', '.join(names)} (import from mmreplay.actors)")
                bad += [f"{name}: {n} is not in mmreplay.actors.__all__" for n in names if n not in public]
            if room == "actors" and mod.startswith("mmreplay.agent"):
                bad += [f"{name}: from {mod} import {n}" for n in names if n.startswith("_")]
    assert bad == [], "\n".join(bad)


def test_room_docstrings_name_every_module_of_their_room():
    for room in ("actors", "cluster", "train", "agent"):
        doc = ast.get_docstring(ast.parse((PKG / room / "__init__.py").read_text())) or ""
        missing = [p.stem for p in sorted((PKG / room).glob("*.py")) if p.stem != "__init__" and f"``{p.stem}``" not in doc]
        assert missing == [], f"{room}/__init__.py does not name its modules {missing}"


def test_one_meaning_per_exported_name():
    """A name exported by two rooms (or a room and the facade) is the same object in both: no two
    different things called ``Policy`` or ``open_or_create``."""
    import importlib

    seen: dict[str, list[tuple[str, object]]] = {}
    for room in ["mmreplay", *(f"mmreplay.{r}" for r in ORDER if (PKG / r / "__init__.py").exists())]:
        mod = importlib.import_module(room)
        for n in getattr(mod, "__all__", []):
            seen.setdefault(n, []).append((room, getattr(mod, n)))
    clashes = [f"{n}: {', '.join(r for r, _ in found)}" for n, found in seen.items()
               if len({id(o) for _, o in found}) > 1]
    assert clashes == [], "names with two meanings:\n" + "\n".join(clashes)


# what changes a store's files, outside mmreplay/core/fs.py (which every such call goes through, so that the
# crash-state recorder of mmreplay.testing.crash sees them all), and why each exception is not store data
_PERSISTING_OS = {"pwrite", "write", "fsync", "fdatasync", "rename", "replace", "unlink", "remove", "mkdir", "makedirs",
                  "truncate", "ftruncate", "posix_fallocate", "link", "symlink"}
_PERSISTING_PATH = {"unlink", "rename", "replace", "mkdir", "write_bytes", "write_text", "touch", "truncate"}
_ALLOWED = {
    ("locks.py", "ftruncate"), ("locks.py", "pwrite"),  # a lock file's owner line: diagnostics, never read back
    ("store.py", "mkdir"),  # create_store's directories: durable with the manifest's atomic write (fsynced after)
    ("opening.py", "rmtree"),  # a creation that died before its manifest: nothing of a store in it
    ("exchange.py", "rmtree"),  # the ingest staging directory: never part of the store
}


def test_every_persisting_call_of_the_storage_room_goes_through_core_fs():
    found = []
    for path in sorted((PKG / "storage").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            attr, owner = node.func.attr, node.func.value
            owner_name = owner.id if isinstance(owner, ast.Name) else ""
            hit = ((owner_name == "os" and attr in _PERSISTING_OS) or (owner_name == "shutil" and attr in ("rmtree", "move"))
                   or (owner_name not in ("os", "fs", "shutil") and attr in _PERSISTING_PATH
                       and not (attr == "replace" and len(node.args) == 2)))  # (str.replace)
            if hit and (path.name, attr) not in _ALLOWED:
                found.append(f"{path.name}:{node.lineno} {owner_name or '<expr>'}.{attr}")
    assert not found, f"persisting calls not routed through mmreplay.core.fs: {found}"


# -- the command line: public names only ----------------------------------------------------------------
FACADE_MODULES = ("mmreplay.errors", "mmreplay.schema")


def _public_names(mod: str) -> set[str] | None:
    """The names a user imports from module ``mod``; ``None`` when ``mod`` is no public module (see
    the module docstring)."""
    import importlib

    parts = mod.split(".")
    if parts[0] != "mmreplay" or any(p.startswith("_") for p in parts[1:]):
        return None
    if mod == "mmreplay":
        m = importlib.import_module(mod)
        return {*m.__all__, *(f.split(".")[1] for f in FACADE_MODULES)}
    if mod in FACADE_MODULES:
        return set(importlib.import_module(mod).__all__)
    room = parts[1]
    if room not in ORDER or room == "core" or len(parts) > 3:
        return None
    pkg = importlib.import_module(f"mmreplay.{room}")
    public = vars(pkg).get("__all__")
    modules = {p.stem for p in (PKG / room).glob("*.py") if not p.stem.startswith("_")}
    if len(parts) == 2:
        return set(public) if public is not None else modules
    if public is not None or parts[2] not in modules:
        return None  # a room with __all__ is imported from its package
    m = importlib.import_module(mod)
    return set(vars(m).get("__all__") or (n for n in vars(m) if not n.startswith("_")))


def _cli_violations(source: str, where: str = "<cli>") -> list[str]:
    """Every place ``source`` (a module of cli/) reaches below the public surface or a private name."""
    bad: list[str] = []
    bound: dict[str, str] = {}  # local name -> the public mmreplay module it is bound to

    def check(mod: str, names: list[str], line: int) -> None:
        public = _public_names(mod)
        if public is None:
            bad.append(f"{where}:{line}: {mod} is not a public module")
            return
        bad.extend(f"{where}:{line}: {mod}.{n} is not public" for n in names if n not in public)

    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] != "mmreplay":
                    continue
                parent, _, last = a.name.rpartition(".")
                if parent:
                    check(parent, [last], node.lineno)
                bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else "mmreplay"
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "mmreplay":
            check(node.module, [a.name for a in node.names], node.lineno)  # type: ignore[arg-type]
            for a in node.names:
                if _public_names(f"{node.module}.{a.name}") is not None:
                    bound[a.asname or a.name] = f"{node.module}.{a.name}"
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        if node.attr.startswith("_") and not node.attr.startswith("__"):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                bad.append(f"{where}:{node.lineno}: .{node.attr} is private")
            continue
        chain, base = [node.attr], node.value
        while isinstance(base, ast.Attribute):
            chain.append(base.attr)
            base = base.value
        if isinstance(base, ast.Name) and base.id in bound and len(chain) == 1:  # (longer chains: their inner node)
            check(bound[base.id], chain, node.lineno)
    return bad


def test_the_cli_uses_only_public_names():
    """``cli/`` imports only the public surface of the module docstring: no module path below a
    room's exports, no ``_private`` name, module or attribute."""
    bad = []
    for p in sorted((ROOT / "cli").rglob("*.py")):
        bad += _cli_violations(p.read_text(), str(p.relative_to(ROOT)))
    assert bad == [], "\n".join(bad)


def test_the_cli_check_finds_what_it_looks_for():
    ok = """
import mmreplay
import mmreplay.errors as E
from mmreplay import open_store, errors
from mmreplay.storage import disk_footprint
from mmreplay.interop.minari import export_minari
from mmreplay.integrations.sb3 import MMReplayBuffer
x = mmreplay.open_store, E.SchemaError, mmreplay.__version__, errors.DiskFullError
"""
    assert _cli_violations(ok) == []
    bad = {
        "from mmreplay.storage.info import disk_usage": "mmreplay.storage.info is not a public module",
        "from mmreplay.storage.catalog import Catalog": "mmreplay.storage.catalog is not a public module",
        "from mmreplay.core import errors": "mmreplay.core is not a public module",
        "import mmreplay.core.errors as E": "mmreplay.core is not a public module",
        "from mmreplay.train.config import box_actions": "mmreplay.train.config is not a public module",
        "from mmreplay.storage import Catalog": "mmreplay.storage.Catalog is not public",
        "from mmreplay.actors import _x": "mmreplay.actors._x is not public",
        "from mmreplay.cluster._fleet import Fleet": "mmreplay.cluster._fleet is not a public module",
        "from mmreplay.integrations._lanes import x": "mmreplay.integrations._lanes is not a public module",
        "import mmreplay\nmmreplay.storage_info": "mmreplay.storage_info is not public",
        "import mmreplay.errors as E\nE.Nope": "mmreplay.errors.Nope is not public",
        "store._reader": "._reader is private",
    }
    for src, want in bad.items():
        found = _cli_violations(src)
        assert any(want in f for f in found), (src, found)
