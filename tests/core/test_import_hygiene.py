from __future__ import annotations

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _loaded(modules: str, heavy: set[str], cwd: pathlib.Path) -> str:
    """Which of ``heavy`` a fresh interpreter has loaded after ``import {modules}``."""
    code = f"import sys, {modules}; print(sorted(set({sorted(heavy)!r}) & set(sys.modules)))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=cwd).stdout.strip()


def test_import_mmreplay_loads_numpy_only(tmp_path):
    assert _loaded("mmreplay", {"click", "torch", "zarr", "gymnasium"}, tmp_path) == "[]"


def test_library_never_imports_click_or_bare_cli():
    for path in (ROOT / "mmreplay").rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"^\s*(import click|from click)", text, re.M), path
    for path in [*(ROOT / "mmreplay").rglob("*.py"), *(ROOT / "cli").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]:
        assert not re.search(r"^\s*(import cli\b|from cli\b)", path.read_text(), re.M), path
    assert not (ROOT / "mmreplay" / "cli.py").exists() and not (ROOT / "mmreplay" / "cli").exists()


def test_import_mmreplay_loads_no_trainer_library(tmp_path):
    """The integrations load SB3 / TorchRL only when their own module is imported."""
    assert _loaded("mmreplay, mmreplay.integrations", {"stable_baselines3", "torchrl", "tensordict", "torch"}, ROOT) == "[]"
    names = sorted(p.stem for p in (ROOT / "mmreplay" / "integrations").glob("*.py"))
    assert names == ["__init__", "_lanes", "sb3", "torch_data", "torchrl"]
    for name in ("_lanes", "torch_data"):  # neither needs an extra
        assert _loaded(f"mmreplay.integrations.{name}", {"stable_baselines3", "torchrl"}, ROOT) == "[]", name
