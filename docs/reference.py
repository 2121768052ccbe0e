"""Build the API reference from the docstrings (pdoc) and check it: ``python docs/reference.py [OUT]``.

``make docs`` runs it (``build/reference/`` by default; open ``index.html``). It exits 1, one line per
problem, when

* a public name has no docstring: public means ``mmreplay.__all__``, each room's ``__all__`` (for a
  room without one, the ``__all__`` of its public modules), and the public methods and properties of
  the classes among them;
* a public attribute has no docstring on its page: the attributes of those classes as pdoc renders
  them (dataclass fields, class variables, properties, ``self.x = ...`` in ``__init__``, ``x: T`` in
  the class body), every public name ``__init__`` assigns to ``self`` (also in a branch or a tuple
  assignment, which pdoc does not render: declare it in the class body with a docstring), and the
  constants and type aliases of those ``__all__`` lists (a docstring string right after the
  assignment, in the module that assigns it; a room's page shows the docstring of what it
  re-exports);
* a module has no page, or a page with no text (no module docstring);
* a docstring cross-reference does not resolve: a name written ``mmreplay.room.thing`` in backticks,
  or through a role (``:mod:`...```, ``:class:`...```, ``:func:`...```, ``:meth:`...```, relative
  ``.module`` names included), that no module or attribute answers to;
* a link of the rendered pages points at a page or an anchor that is not there.

``tests/docs/test_reference.py`` runs :func:`build` and :func:`problems` on every ``make test``.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import sys
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROOMS = ("core", "storage", "sampling", "archive", "stats", "interop", "loader", "integrations", "agent",
         "actors", "cluster", "train", "testing")
UNDOCUMENTED_TODO = frozenset()


def modules() -> list[str]:
    """The modules the reference renders: the package, each room, and every public module of a room."""
    import mmreplay

    names = ["mmreplay"]
    for room in ROOMS:
        names.append(f"mmreplay.{room}")
        mod = importlib.import_module(f"mmreplay.{room}")
        if hasattr(mod, "__path__"):
            names += [f"mmreplay.{room}.{m.name}" for m in pkgutil.iter_modules(mod.__path__)
                      if not m.name.startswith("_")]
    assert mmreplay.__file__
    return names


def _materialize_lazy(names: list[str]) -> None:
    """Rooms load some names on first use (module ``__getattr__``); pdoc reads a module's
    ``__dict__``, so resolve them there first."""
    for name in names:
        mod = importlib.import_module(name)
        if "__getattr__" in vars(mod):
            for attr in getattr(mod, "__all__", ()):
                if attr not in vars(mod):
                    setattr(mod, attr, getattr(mod, attr))


def build(out: Path) -> list[str]:
    """Render the reference into ``out`` (HTML, one page per module); returns the modules rendered."""
    import pdoc
    import pdoc.render

    names = modules()
    _materialize_lazy(names)
    pdoc.render.configure(docformat="restructuredtext", show_source=False, search=True,
                          footer_text="mmreplay API reference")
    # every module by name: pdoc walks a package's modules only when it has no ``__all__``, so the
    # modules of the rooms that have one (storage, sampling, loader, ...) would get no page
    with warnings.catch_warnings():  # pdoc's notes on other libraries' annotations are not ours to fix
        warnings.simplefilter("ignore")
        for name in names:
            _doc_module(name)  # re-exported constants carry their docstrings (before pdoc reads them)
        pdoc.pdoc(*names, output_directory=Path(out))
    return names


def _assigned_docstring(modname: str, name: str, depth: int = 0) -> str:
    """The docstring written after the assignment of ``name`` in ``modname``, following the module's
    ``from .x import name`` re-exports to the module that assigns it ("" if none)."""
    import ast

    import pdoc.doc_ast

    mod = importlib.import_module(modname)
    own = pdoc.doc_ast.walk_tree(mod).var_docstrings.get(name, "")
    if own or depth > 4:
        return own
    package = modname if hasattr(mod, "__path__") else modname.rsplit(".", 1)[0]
    for node in pdoc.doc_ast.parse(mod).body:  # (pdoc's cached parse)
        if isinstance(node, ast.ImportFrom) and node.level:
            base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
            source = f"{base}.{node.module}" if node.module else base
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return _assigned_docstring(source, alias.name, depth + 1)
    return ""


def _doc_module(modname: str):
    """pdoc's model of ``modname`` (the one ``pdoc.pdoc`` renders: pdoc caches it by name), with the
    docstrings of the constants the module re-exports filled in from the modules that assign them
    (pdoc reads a variable's docstring from the source of the module it renders)."""
    import pdoc.doc

    doc = pdoc.doc.Module.from_name(modname)
    mod = doc.obj
    if "members" not in doc.__dict__:  # not rendered yet: its members read these docstrings
        docstrings = dict(doc._var_docstrings)  # a copy: pdoc's parse cache keeps the source's own
        for attr in getattr(mod, "__all__", ()):
            if attr not in docstrings and not _is_code(getattr(mod, attr, None)):
                found = _assigned_docstring(modname, attr)
                if found:
                    docstrings[attr] = found
        doc.__dict__["_var_docstrings"] = docstrings  # (a cached_property: this instance's value)
    return doc


def _is_code(obj: object) -> bool:
    return inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj)


def public_objects() -> Iterator[tuple[str, object]]:
    """``(qualified name, object)`` for every public name (see the module docstring), each once."""
    seen: set[int] = set()
    for modname in modules():
        mod = importlib.import_module(modname)
        room_level = modname.count(".") <= 1
        public = getattr(mod, "__all__", None)
        if public is None:
            continue
        if not room_level and importlib.import_module(modname.rsplit(".", 1)[0]).__dict__.get("__all__"):
            continue  # a room with __all__ says what is public; its modules' own lists are internal
        for attr in public:
            obj = getattr(mod, attr)
            if id(obj) in seen or inspect.ismodule(obj):
                continue
            seen.add(id(obj))
            if not (inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj)):
                continue  # constants and type aliases: documented by their module
            home = getattr(obj, "__module__", "") or ""
            if not home.startswith("mmreplay"):
                continue
            yield f"{home}.{obj.__qualname__}", obj
            if inspect.isclass(obj):
                yield from _members(obj, f"{home}.{obj.__qualname__}")


def _members(cls: type, qual: str) -> Iterator[tuple[str, object]]:
    for attr, value in vars(cls).items():
        if attr.startswith("_") or any(_has_doc(getattr(base, attr, None)) for base in cls.__mro__[1:]):
            continue  # private, or an override that keeps a base class's documented contract
        if isinstance(value, property):
            yield f"{qual}.{attr}", value.fget
        elif isinstance(value, (staticmethod, classmethod)):
            yield f"{qual}.{attr}", value.__func__
        elif inspect.isfunction(value):
            yield f"{qual}.{attr}", value


def _has_doc(obj: object) -> bool:
    if obj is None:
        return False
    if isinstance(obj, property):
        obj = obj.fget
    return bool((getattr(obj, "__doc__", None) or "").strip())


def missing_docstrings() -> list[str]:
    """Public names (outside ``UNDOCUMENTED_TODO``) whose own docstring is empty."""
    out = []
    for name, obj in public_objects():
        own = obj.__doc__ if inspect.isclass(obj) else getattr(obj, "__doc__", None)
        if inspect.isclass(obj) and own and own.startswith(f"{obj.__name__}("):
            own = None  # a dataclass's generated signature is no docstring
        if not (own or "").strip() and name not in UNDOCUMENTED_TODO:
            out.append(f"no docstring: {name}")
    return out


def undocumented_attributes(objects: Iterable[tuple[str, object]] | None = None) -> list[str]:
    """Public attributes of the public classes (``objects``: these ``(name, object)`` pairs instead of
    :func:`public_objects`) with no docstring on their page, or not rendered at all; see the module
    docstring for what counts."""
    import pdoc.doc

    out = []
    for name, obj in public_objects() if objects is None else objects:
        if not inspect.isclass(obj):
            continue
        doc = pdoc.doc.Class(obj.__module__, obj.__qualname__, obj, (obj.__module__, obj.__qualname__))
        with warnings.catch_warnings():  # pdoc's notes on other libraries' annotations, as in build()
            warnings.simplefilter("ignore")
            rendered = {m.name: m for m in doc.members.values() if isinstance(m, pdoc.doc.Variable)}
        ours = obj.__module__.split(".")[0]
        for attr in sorted(set(rendered) | _init_attributes(obj)):
            member = rendered.get(attr)
            if attr.startswith("_") or member is not None and member.taken_from[0].split(".")[0] != ours:
                continue  # private, or another library's (an exception's ``args``)
            if member is None:
                out.append(f"attribute not rendered (declare it in the class body, with a docstring): {name}.{attr}")
            elif not member.docstring.strip():
                out.append(f"no docstring: {'.'.join(member.taken_from)}")  # an inherited one once, at its class
    return sorted(set(out), key=out.index)


def undocumented_constants(names: Iterable[str] | None = None) -> list[str]:
    """The constants and type aliases of the ``__all__`` lists that say what is public, in the
    modules (``names``: these modules instead of :func:`modules`) with no docstring on their page."""
    out = []
    for modname in modules() if names is None else names:
        mod = importlib.import_module(modname)
        if not _owns_public(modname):
            continue
        doc = _doc_module(modname)
        for attr in getattr(mod, "__all__", ()):
            if _is_code(getattr(mod, attr)):
                continue
            member = doc.get(attr)
            if member is None or not member.docstring.strip():
                out.append(f"no docstring: {modname}.{attr}")
    return out


def _owns_public(modname: str) -> bool:
    """Whether the ``__all__`` of ``modname`` says what is public (see the module docstring)."""
    if modname.count(".") <= 1:
        return True
    return not importlib.import_module(modname.rsplit(".", 1)[0]).__dict__.get("__all__")


def _init_attributes(cls: type) -> set[str]:
    """The names ``cls.__init__`` (its own, not a base's) assigns to ``self``, wherever in its body."""
    import ast
    import textwrap

    init = vars(cls).get("__init__")
    if not inspect.isfunction(init):
        return set()
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
    except (OSError, TypeError):
        return set()
    names = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    names.add(t.attr)
    return names


def missing_pages(out: Path) -> list[str]:
    """Modules with no page in ``out``, or with no docstring for its text."""
    bad = []
    for modname in modules():
        if not (Path(out) / (modname.replace(".", "/") + ".html")).is_file():
            bad.append(f"no page: {modname}")
        if not (importlib.import_module(modname).__doc__ or "").strip():
            bad.append(f"no module docstring: {modname}")
    return bad


_REF = re.compile(r":(?:mod|class|func|meth|attr|data|exc):`~?([.\w]+)`|``?(mmreplay(?:\.\w+)+)(?:\(\))?``?")


def _resolves(target: str, context: str) -> bool:
    if target.startswith("."):  # relative to the package the docstring's module is in
        mod = importlib.import_module(context)
        base = context.split(".") if hasattr(mod, "__path__") else context.split(".")[:-1]
        level = len(target) - len(target.lstrip("."))
        target = ".".join(base[: len(base) - level + 1] + [target.lstrip(".")])
    elif not target.startswith("mmreplay"):
        return True  # a name of another library, or a bare name: not checked
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def broken_references() -> list[str]:
    """Docstring references to ``mmreplay`` names that do not resolve."""
    out = []
    for modname in modules():
        mod = importlib.import_module(modname)
        docs = [(modname, mod.__doc__ or "")]
        for obj in vars(mod).values():
            if getattr(obj, "__module__", None) == modname and (inspect.isclass(obj) or inspect.isfunction(obj)):
                docs.append((modname, obj.__doc__ or ""))
                if inspect.isclass(obj):
                    docs += [(modname, m.__doc__ or "") for _, m in _members(obj, "")]
        for context, doc in docs:
            for m in _REF.finditer(doc):
                target = m.group(1) or m.group(2)
                if not _resolves(target, context):
                    out.append(f"broken reference in {context}: {m.group(0)}")
    return sorted(set(out))


_HREF = re.compile(r'href="([^"#:]*\.html)?(?:#([^"]*))?"')
_ID = re.compile(r'id="([^"]+)"')


def broken_links(out: Path) -> list[str]:
    """Links between the rendered pages that point at a missing page or anchor."""
    pages = {p: p.read_text() for p in Path(out).rglob("*.html")}
    ids = {p.resolve(): set(_ID.findall(text)) for p, text in pages.items()}
    bad = []
    for page, text in pages.items():
        for href, anchor in _HREF.findall(text):
            if anchor and anchor.split(".")[0].startswith("_"):
                continue  # pdoc lists members inherited from a private base class, which it does not render
            target = (page.parent / href).resolve() if href else page.resolve()
            if target not in ids:
                bad.append(f"broken link in {page.name}: {href}")
            elif anchor and anchor not in ids[target]:
                bad.append(f"broken link in {page.name}: {href}#{anchor}")
    return sorted(set(bad))


def problems(out: Path) -> list[str]:
    """Everything the check finds in a reference built into ``out``; empty when it is clean."""
    return missing_docstrings() + undocumented_attributes() + undocumented_constants() + missing_pages(out) \
        + broken_references() + broken_links(out)


def main(argv: list[str]) -> int:
    """Build into ``argv[0]`` (default ``build/reference``), print the problems, exit 1 if any."""
    out = Path(argv[0]) if argv else ROOT / "build" / "reference"
    names = build(out)
    found = problems(out)
    for line in found:
        print(line, file=sys.stderr)
    print(f"{len(names)} modules rendered into {out}/ (index.html); {len(found)} problems")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
