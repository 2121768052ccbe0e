"""Crash states of a writer of two lanes whose rows are published in commit groups of three (a
torn row inside a group costs that row alone)."""

from __future__ import annotations

from _crash import check_states

from mmreplay.testing import crash


def test_crash_states_of_a_two_lane_session_with_commit_groups(tmp_path):
    rec = crash.record_session(tmp_path / "s", lanes=2, publish_rows=3, steps=40)
    states = rec.recorder.session_states()
    with crash.Checker(rec) as ck:
        labels = check_states(ck, crash.stratified(states, 130, seed=55), tmp_path / "work")
    assert len(labels) == 7
