"""Fetch Stable-Baselines3's own ``tests/test_buffers.py`` for the installed version, once.

``tests/integrations/test_sb3_upstream.py`` runs that file against ``MMReplayBuffer``. SB3's file is
not copied into this repository: the stable-baselines3 source distribution of the installed
version (on the package index, it ships ``tests/``) is fetched with pip and the one file is cached
under the virtual environment (``<sys.prefix>/share/mmreplay-test-cache/``). ``make test`` runs this
before the suite, so the tests themselves talk to nothing but loopback; when the index cannot be
reached it says why and exits 0 (the test module is then skipped with that reason).

    python tests/integrations/fetch_sb3_tests.py
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

MEMBER = "tests/test_buffers.py"


def cache_path() -> Path:
    """Where SB3's file of the installed version is cached."""
    version = importlib.metadata.version("stable-baselines3")
    return Path(sys.prefix) / "share" / "mmreplay-test-cache" / f"stable-baselines3-{version}" / "test_buffers.py"


def fetch() -> str | None:
    """Fetch and cache SB3's file; None when it is cached, else why it could not be."""
    target = cache_path()
    version = target.parent.name.removeprefix("stable-baselines3-")
    if target.exists():
        return None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"no cache folder for SB3's test file ({exc})"
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():  # another process fetched it meanwhile
            return None
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
                   "--quiet", "--timeout", "15", "--retries", "1", "--dest", tmp, f"stable-baselines3=={version}"]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
            except subprocess.TimeoutExpired:
                return f"the stable-baselines3=={version} sdist could not be fetched in 180 s (pip download timed out)"
            sdists = list(Path(tmp).glob("*.tar.gz"))
            if r.returncode != 0 or not sdists:
                why = (r.stderr.strip().splitlines() or ["no output"])[-1]
                return f"the stable-baselines3=={version} sdist could not be fetched (pip download: {why})"
            with tarfile.open(sdists[0]) as tar:
                names = [m for m in tar.getmembers() if m.isfile() and m.name.split("/", 1)[-1] == MEMBER]
                if not names:  # the index answered: a missing file is a failure
                    raise SystemExit(f"{sdists[0].name} has no {MEMBER}: SB3's buffer tests cannot run against "
                                     "MMReplayBuffer for this version")
                data = tar.extractfile(names[0]).read()  # type: ignore[union-attr]
            part = Path(tmp) / "test_buffers.py"
            part.write_bytes(data)
            os.replace(part, target)
    return None


if __name__ == "__main__":
    try:
        importlib.metadata.version("stable-baselines3")
    except importlib.metadata.PackageNotFoundError:
        print("stable-baselines3 is not installed: nothing to fetch")
        raise SystemExit(0)
    why = fetch()
    if why is not None:
        if cache_path().parent.exists():
            (cache_path().parent / "SKIP").write_text(why)  # the reason the test module's skip gives
        print(f"SB3's buffer tests not fetched: {why}")
