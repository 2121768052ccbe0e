"""Crash states of a writer session with the default durability (``segment``): several segments,
an eviction, a flush and a close, crashed after every persisting call (``mmreplay.testing.crash``)."""

from __future__ import annotations

from _crash import check_states

from mmreplay.testing import crash


def test_every_kind_of_crash_state_of_a_segment_durability_session(tmp_path):
    rec = crash.record_session(tmp_path / "s", durability="segment")
    states = rec.recorder.session_states()
    assert len(states) > 1000  # (5,484 distinct states when this was written)
    kinds = {s.kind for s in rec.recorder.snaps}
    assert kinds == {"write", "sync", "dirsync", "dir"}, kinds
    with crash.Checker(rec) as ck:
        labels = check_states(ck, crash.stratified(states, 150, seed=53), tmp_path / "work")
    assert set(labels) == {"kill-9", "power-loss", "page-lost", "page-stale", "size-lost", "size-cut", "dir-lost"}
