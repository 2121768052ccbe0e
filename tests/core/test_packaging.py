"""Build the wheel from a clean copy of the tree, install it in a fresh venv, run it outside the repo."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_installs_and_runs_outside_the_repo(tmp_path):
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    for f in files:
        if (ROOT / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, src / f)
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(src)],
                   check=True, capture_output=True)
    (wheel,) = dist.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "mmreplay/cli/main.py" in names and "mmreplay/py.typed" in names
    assert not any(n.startswith("cli/") for n in names)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True)
    # dependencies come from this test environment's site-packages (no network, no torch copy)
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    out_dir = tmp_path / "elsewhere"
    out_dir.mkdir()
    r = subprocess.run([str(venv / "bin" / "mmreplay"), "--help"], cwd=out_dir, capture_output=True, text=True, check=True)
    assert "Usage: mmreplay" in r.stdout
    r = subprocess.run([str(py), "-m", "mmreplay", "--help"], cwd=out_dir, capture_output=True, text=True, check=True)
    assert "info" in r.stdout
    r = subprocess.run([str(py), "-c", "import mmreplay; print(mmreplay.__file__)"], cwd=out_dir, capture_output=True,
                       text=True, check=True)
    assert str(venv) in r.stdout  # the installed wheel, not the source tree
    r = subprocess.run([str(py), "-c", "import cli"], cwd=out_dir, capture_output=True, text=True)
    assert r.returncode != 0
