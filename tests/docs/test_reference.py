"""The API reference builds (pdoc, ``make docs``) with a docstring on every public name, and every
cross-reference in it resolves; the guide's pages name only files that exist."""

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
    for name in ("mmreplay", "mmreplay.storage", "mmreplay.sampling", "mmreplay.archive", "mmreplay.stats",
                 "mmreplay.loader"):
        assert name in modules
        assert (tmp_path / (name.replace(".", "/") + ".html")).is_file()
    page = (tmp_path / "mmreplay.html").read_text()
    for public in ("UniformSampler", "BatchLoader", "open_archive", "SchemaError", "Writer"):
        assert f'id="{public}"' in page, f"{public} is not on the package's page"
    assert reference.problems(tmp_path) == []


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
