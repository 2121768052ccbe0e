"""Crash states of writer sessions with ``durability="batch"`` (every acknowledged row durable) and
``"process"`` (nothing durable until a ``flush()``, which covers the sealed segments too)."""

from __future__ import annotations

import pytest
from _crash import check_states

from mmreplay.testing import crash


@pytest.mark.parametrize("durability", ["batch", "process"])
def test_crash_states_of_each_durability(tmp_path, durability):
    rec = crash.record_session(tmp_path / "s", durability=durability)
    states = rec.recorder.session_states()
    with crash.Checker(rec) as ck:
        labels = check_states(ck, crash.stratified(states, 75, seed=54), tmp_path / "work")
    assert labels["kill-9"] and labels["power-loss"] and labels["page-stale"]
