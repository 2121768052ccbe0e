"""Examples run (shortened) and the Dyna-Q planning update handles duplicate (s, a) pairs."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_vectorized_planning_matches_the_sequential_loop_with_duplicates():
    dq = _load("dyna_q")
    rng = np.random.default_rng(0)
    # transitions whose next states are never updated in the batch: the sequential loop's order
    # cannot matter, so the grouped update must equal it exactly, duplicates included
    s = rng.integers(0, 5, 200)
    a = rng.integers(0, 3, 200)
    # a deterministic model: one (s2, r, term) per (s, a), so duplicates share their target
    r = ((s * 3 + a) % 4).astype(float)
    s2 = 5 + (s + a) % 5
    term = (s + a) % 7 == 0
    Q0 = rng.normal(size=(10, 3))
    assert len(np.unique(s * 3 + a)) < len(s)  # duplicates present
    q_seq, q_vec = Q0.copy(), Q0.copy()
    dq.plan_sequential(q_seq, s, a, r, s2, term, 0.3, 0.9)
    dq.plan_vectorized(q_vec, s, a, r, s2, term, 0.3, 0.9)
    np.testing.assert_allclose(q_vec, q_seq, rtol=1e-12, atol=1e-12)
    # the naive fancy-indexed update keeps one update per duplicate pair: it differs
    q_naive = Q0.copy()
    td = r + 0.9 * (~term) * q_naive[s2].max(axis=1) - q_naive[s, a]
    q_naive[s, a] += 0.3 * td
    assert not np.allclose(q_naive, q_seq)


def test_dyna_q_example_runs():
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "dyna_q.py"), "--episodes", "12", "--planning", "16"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "planning speed-up" in out.stdout and "Dyna-Q, vectorized planning" in out.stdout


def test_custom_agent_example_runs_and_resumes(tmp_path):
    cmd = [sys.executable, str(ROOT / "examples" / "custom_agent.py"), "--steps", "2000", "--store", str(tmp_path / "s")]
    for rows in (2004, 4008):  # the second run appends to the same store, with the saved priorities
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert f"{rows} rows" in out.stdout
    assert (tmp_path / "s" / "priorities" / "default.npz").exists()


def _sh(name: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # this venv's mmreplay
    return subprocess.run(["bash", str(ROOT / "examples" / name), *args], capture_output=True, text=True,
                          timeout=600, env=env)


def test_offline_cartpole_script_runs(tmp_path):
    out = _sh("offline_cartpole.sh", str(tmp_path / "w"), "3000", "200")
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "w" / "random.zarr").is_dir() and (tmp_path / "w" / "cql" / "learning_curve.png").exists()


@pytest.mark.slow
def test_atari_pong_script_runs(tmp_path):
    pytest.importorskip("ale_py")
    out = _sh("atari_pong.sh", str(tmp_path / "w"), "256", "400")
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "w" / "run" / "metrics.csv").exists()


def test_gpu_loader_benchmark_runs_without_a_gpu(tmp_path):
    """benchmarks/loader_gpu.py is the one script a CUDA machine runs for the loader: keep it working."""
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "loader_gpu.py"), "--device", "cpu", "--rows", "2048",
                        "--seconds", "0.2", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    import json

    res = json.loads(out.read_text())
    for b in (32, 256):
        assert res[f"sync_{b}"]["updates_per_s"] > 0 and res[f"loader_{b}"]["updates_per_s"] > 0
        assert res[f"h2d_{b}"]["pageable_gbps"] > 0 and res[f"loader_{b}"]["pinned"] is False  # no CUDA: no pinning
    assert "| 256 | BatchLoader workers=1 |" in r.stdout
