"""Recovery and repair crash too: the states a crash in the middle of a writable open and a
``verify --repair`` may leave, each checked against what the first crash had been promised."""

from __future__ import annotations

from _crash import check_states

from mmreplay.testing import crash


def test_crash_states_of_recovery_and_repair(tmp_path):
    rec = crash.record_session(tmp_path / "s", durability="segment")
    bases = crash.stratified([s for s in rec.recorder.session_states() if s.label != "kill-9"], 24, seed=56)
    with crash.Checker(rec) as ck:
        states = [st for b in bases for st in ck.recovery_states(b, tmp_path / "recovering")]
        assert len(states) > 300
        labels = check_states(ck, crash.stratified(states, 150, seed=56), tmp_path / "work")
    assert labels["kill-9"] and labels["page-lost"] and labels["dir-lost"]
