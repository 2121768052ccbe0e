"""benchmarks/scale.py in its smoke form (tiny stores, a few batches): every measurement made, the
tables, targets and plot printed, nothing left under --dir. About 6 s."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_scale_benchmark_runs_on_tiny_stores(tmp_path):
    work, plot = tmp_path / "work", tmp_path / "scale.png"
    work.mkdir()
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scale.py"), "--sizes", "2e4,4e4", "--atari-rows",
                        "2000", "--batches", "5", "--settle-s", "0", "--cache-gb", "0.01", "--systems", "mmreplay", "--dir", str(work),
                        "--plot", str(plot)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert not [x for x in recs if x["what"] == "error"], r.stdout[-3000:]
    samples = {(x["store"], x["size"], x["system"], x["sampler"]): x for x in recs if x["what"] == "sample"}
    for n in (20_000, 40_000):
        for s in ("uniform", "sequence", "prioritized"):
            assert samples[("vector", n, "mmreplay", s)]["warm_us"] > 0
    assert {k[3] for k in samples if k[:3] == ("vector", 40_000, "mmreplay")} >= {"uniform windowed", "prioritized windowed"}
    assert ("atari", 2000, "mmreplay", "frame stack") in samples
    passes = {(x["store"], x["pass"]): x for x in recs if x["what"] == "pass"}
    for store in ("vector", "atari"):
        assert {p for s, p in passes if s == store} == {"field_stats", "verify", "export", "first check"}
        assert passes[(store, "verify")]["problems"] == 0 and passes[(store, "export")]["archived_rows"] > 0
    for head in ("| store | rows | system | sampler |", "| store | rows | pass |", "| target | measured | met |",
                 "largest / smallest"):
        assert head in r.stdout
    assert plot.stat().st_size > 0 and list(work.iterdir()) == []  # every store and archive deleted
