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
