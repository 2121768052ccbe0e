"""The benchmark kit: ``python -m benchmarks`` lists every benchmark script, and the scripts stay short
(no function over ~80 lines: a script is a thin description of its workload; shared code is in kit.py)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
# parts of other benchmarks, not entries of their own (see benchmarks/__main__.py)
PARTS = {"__main__", "cleanrl_dqn", "offline_continuous_data", "offline_continuous_ref", "offline_continuous_big"}


def test_the_entry_lists_every_benchmark_with_what_it_measures_and_how_long_it_takes():
    out = subprocess.run([sys.executable, "-m", "benchmarks"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    listed = {line.split()[0] for line in out.stdout.splitlines()[1:] if line and not line.startswith(("python", " "))}
    scripts = {p.stem for p in BENCH.glob("*.py")} - PARTS
    assert listed == scripts
    for line in out.stdout.splitlines()[1:len(scripts) + 1]:
        assert len(line.split(None, 2)) == 3 and ("min" in line or " h" in line or "hours" in line), line


def test_no_function_in_benchmarks_is_much_over_80_lines():
    long = []
    for path in BENCH.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 85:
                long.append(f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert long == []
