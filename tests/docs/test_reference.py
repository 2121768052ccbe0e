"""The API reference builds (pdoc, ``make docs``) with a page for every module and a docstring on every
public name and attribute, and every cross-reference in it resolves (and the check finds what it
looks for); the guide's pages name only files that exist."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest

pytest.importorskip("pdoc")  # the `docs` extra, which the `test` extra includes

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("reference", ROOT / "docs" / "reference.py")
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)


def test_the_reference_builds_with_every_public_name_documented_and_every_reference_resolving(tmp_path):
    modules = reference.build(tmp_path)
    # the modules of rooms with an ``__all__`` have pages too (pdoc alone walks no further than it)
    for name in ("mmreplay", "mmreplay.storage", "mmreplay.sampling", "mmreplay.archive", "mmreplay.stats",
                 "mmreplay.loader", "mmreplay.storage.writer", "mmreplay.sampling.window_kernels",
                 "mmreplay.loader.batch_loader", "mmreplay.stats.fields", "mmreplay.actors.pool"):
        assert name in modules
        assert (tmp_path / (name.replace(".", "/") + ".html")).is_file()
    page = (tmp_path / "mmreplay.html").read_text()
    for public in ("UniformSampler", "BatchLoader", "open_archive", "SchemaError", "Writer"):
        assert f'id="{public}"' in page, f"{public} is not on the package's page"
    # a room's page shows the docstring of a constant it re-exports (written where it is assigned)
    assert "Segment-table column" in (tmp_path / "mmreplay" / "storage.html").read_text()
    assert reference.problems(tmp_path) == []

    (tmp_path / "mmreplay" / "storage" / "writer.html").unlink()
    assert reference.missing_pages(tmp_path) == ["no page: mmreplay.storage.writer"]


class Planted:
    """A class the attribute check must find fault with (it looks at what pdoc renders, and at ``__init__``)."""

    documented: int = 0
    """Documented."""
    bare: int = 0

    def __init__(self) -> None:
        self.set_here = 1
        self.described = 2
        """Documented."""
        self.pair, self._private = 3, 4
        if self.set_here:
            self.in_branch = 5
        self._hidden = 6

    @property
    def prop(self) -> int:
        return 1


def test_the_attribute_check_finds_planted_undocumented_attributes():
    import mmreplay.errors

    found = reference.undocumented_attributes([("Planted", Planted)])
    assert sorted(found) == sorted([
        f"no docstring: {__name__}.Planted.bare",
        f"no docstring: {__name__}.Planted.set_here",
        f"no docstring: {__name__}.Planted.prop",
        "attribute not rendered (declare it in the class body, with a docstring): Planted.pair",
        "attribute not rendered (declare it in the class body, with a docstring): Planted.in_branch",
    ])
    # an exception's inherited ``args`` is not ours; the real public classes are clean
    assert reference.undocumented_attributes([("SchemaError", mmreplay.errors.SchemaError)]) == []


def test_the_constant_check_finds_a_planted_undocumented_constant(monkeypatch):
    import mmreplay.stats

    monkeypatch.setattr(mmreplay.stats, "PLANTED", 3, raising=False)
    monkeypatch.setattr(mmreplay.stats, "__all__", [*mmreplay.stats.__all__, "PLANTED"])
    assert reference.undocumented_constants(["mmreplay.stats"]) == ["no docstring: mmreplay.stats.PLANTED"]
    # a re-exported constant is documented where it is assigned, and a room's page shows that
    assert reference._assigned_docstring("mmreplay.storage", "MASKED").startswith("The ``is_last`` byte")
    assert reference.undocumented_constants(["mmreplay.storage"]) == []


def test_no_room_is_exempt():
    # every room's modules get a page and the attribute checks, the train and agent rooms included
    assert not hasattr(reference, "ROOMS_PENDING")
    modules = reference.modules()
    for name in ("mmreplay.train.run", "mmreplay.train.q_learner", "mmreplay.agent.policy", "mmreplay.agent.envs"):
        assert name in modules
    import mmreplay.train

    assert reference.undocumented_attributes([("Run", mmreplay.train.Run)]) == []


def test_the_check_finds_what_it_looks_for(tmp_path):
    assert not reference._resolves("mmreplay.storage.NoSuchThing", "mmreplay")
    assert not reference._resolves("._no_such_module", "mmreplay.integrations.sb3")
    assert reference._resolves("._lanes", "mmreplay.integrations.sb3")
    assert reference._resolves("mmreplay.sampling.UniformSampler.sample", "mmreplay")
    (tmp_path / "a.html").write_text('<a href="b.html#There">x</a><a href="#Here">y</a><p id="Here"></p>')
    (tmp_path / "b.html").write_text('<p id="Elsewhere"></p>')
    assert reference.broken_links(tmp_path) == ["broken link in a.html: b.html#There"]


def test_the_todo_list_names_only_undocumented_names():
    # the exemptions of the rooms being changed on other branches shrink, never hide a documented name
    public = dict(reference.public_objects())
    for name in reference.UNDOCUMENTED_TODO:
        assert name in public, f"{name} is not public any more: drop it from UNDOCUMENTED_TODO"
        assert not (public[name].__doc__ or "").strip(), f"{name} has a docstring now: drop it from UNDOCUMENTED_TODO"


# files of other projects the text names as theirs (MinAtar's reference DQN, SB3's buffer tests)
OTHER_PROJECTS = {"examples/dqn.py", "tests/test_buffers.py"}
_PATH = re.compile(r"(?<![\w./-])((?:tests|benchmarks|examples|docs|mmreplay|cli)/[\w./-]*\w\.(?:py|sh|md|png|toml))")


@pytest.mark.parametrize("page", ["README.md", "docs/results.md", "pyproject.toml", "Makefile"])
def test_the_guide_names_only_files_that_exist(page):
    text = (ROOT / page).read_text()
    missing = sorted({p for p in _PATH.findall(text) if not (ROOT / p).exists()} - OTHER_PROJECTS)
    assert missing == [], f"{page} names files that do not exist: {missing}"


def test_docstrings_name_only_files_that_exist():
    missing = []
    for src in [*(ROOT / "mmreplay").rglob("*.py"), *(ROOT / "cli").rglob("*.py")]:
        for p in _PATH.findall(src.read_text()):
            if p.startswith(("tests/", "benchmarks/", "examples/", "docs/")) and p not in OTHER_PROJECTS \
                    and not (ROOT / p).exists():
                missing.append(f"{src.relative_to(ROOT)}: {p}")
    assert missing == []


def test_each_room_docstring_names_every_module_of_its_room():
    import pkgutil

    for room in reference.ROOMS:
        mod = importlib.import_module(f"mmreplay.{room}")
        if not hasattr(mod, "__path__"):
            continue  # a one-module room
        doc = mod.__doc__ or ""
        missing = [m.name for m in pkgutil.iter_modules(mod.__path__) if not re.search(rf"\b{m.name}\b", doc)]
        assert missing == [], f"the docstring of mmreplay.{room} does not name its modules {missing}"


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    heads = re.findall(r"^#+ (.+)$", page.read_text(), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("page", ["README.md", "docs/results.md", "docs/guarantees.md", "docs/integrations.md"])
def test_the_guide_links_to_pages_and_headings_that_exist(page):
    src = ROOT / page
    bad = []
    for target, anchor in re.findall(r"\]\(([^)#\s:]*)(?:#([^)\s]+))?\)", src.read_text()):
        dest = (src.parent / target) if target else src
        if not dest.exists():
            bad.append(f"{target} (no such file)")
        elif anchor and anchor not in _anchors(dest):
            bad.append(f"{target}#{anchor} (no such heading)")
    assert bad == [], f"{page} links to {bad}"
