from __future__ import annotations

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_import_mmreplay_loads_numpy_only(tmp_path):
    code = (
        "import sys, mmreplay; heavy = {'click', 'torch', 'zarr', 'gymnasium'} & set(sys.modules); "
        "print(sorted(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.strip() == "[]"


def test_library_never_imports_click_or_bare_cli():
    for path in (ROOT / "mmreplay").rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"^\s*(import click|from click)", text, re.M), path
    for path in [*(ROOT / "mmreplay").rglob("*.py"), *(ROOT / "cli").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]:
        assert not re.search(r"^\s*(import cli\b|from cli\b)", path.read_text(), re.M), path
    assert not (ROOT / "mmreplay" / "cli.py").exists() and not (ROOT / "mmreplay" / "cli").exists()


def test_import_mmreplay_loads_no_trainer_library(tmp_path):
    """The integrations load SB3 / TorchRL only when their own module is imported."""
    code = (
        "import sys, mmreplay, mmreplay.integrations; "
        "heavy = {'stable_baselines3', 'torchrl', 'tensordict', 'torch'} & set(sys.modules); print(sorted(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
    names = sorted(p.stem for p in (ROOT / "mmreplay" / "integrations").glob("*.py"))
    assert names == ["__init__", "_lanes", "sb3", "torch_data", "torchrl"]
    for name in ("_lanes", "torch_data"):  # neither needs an extra
        code = f"import sys, mmreplay.integrations.{name}; print(sorted({{'stable_baselines3', 'torchrl'}} & set(sys.modules)))"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
        assert out.stdout.strip() == "[]", name
