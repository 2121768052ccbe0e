"""The statistics the MinAtar benchmark prints next to its targets (benchmarks/minatar_dqn.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

_spec = importlib.util.spec_from_file_location(  # loaded from its file: benchmarks/ stays off sys.path
    "minatar_dqn", Path(__file__).resolve().parents[2] / "benchmarks" / "minatar_dqn.py")
_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bench)
curve_test = _bench.curve_test


def test_a_curve_below_every_other_seed_gets_the_least_p_there_is():
    ref = np.array([[5.0, 8.0, 12.0], [6.0, 9.0, 13.0], [7.0, 10.0, 14.0]])
    t = curve_test(ref - 4.0, ref)  # every mmreplay seed below every reference seed, at every evaluation
    assert t["splits"] == 20 and t["gap"] == -4.0
    assert t["p"] == t["p_final"] == 1 / 20


def test_curves_of_the_same_seeds_show_no_gap_and_identical_runs_always_meet_the_targets():
    ref = np.array([[5.0, 8.0, 12.0], [6.0, 9.0, 13.0], [7.0, 10.0, 14.0]])
    t = curve_test(ref.copy(), ref)
    assert t["gap"] == 0.0 and 0.5 <= t["p"] < 1.0  # the observed split is the median one, not an extreme
    same = np.full((3, 3), 7.0)  # no spread at all: chance cannot miss a target
    assert curve_test(same, same)["null"] == {"final": 1.0, "curve": 1.0, "both": 1.0}
    spread = curve_test(ref, ref)["null"]  # with a spread, a 3-seed mean falls below the other's range sometimes
    assert 0.0 < spread["curve"] < 1.0 and spread["both"] <= min(spread["final"], spread["curve"])
