from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import step

import mmreplay
from mmreplay.storage.snapshot import (SEG_BUCKET, SEG_COLS, SEG_COMMITTED, SEG_CUM_END, SEG_NBUCKETS, SEG_SHIFT,
                                    index_draws)
from mmreplay import (
    EmptyStoreError,
    InvalidValueError,
    ReadOnlyStoreError,
    SchemaError,
    StoreExistsError,
    StoreNotFoundError,
    UniformSampler,
    WriterBusyError,
)


def _tree_digest(path) -> str:
    h = hashlib.sha256()
    for root, _, files in sorted(os.walk(path)):
        for f in sorted(files):
            if f.endswith(".lock"):
                continue
            p = os.path.join(root, f)
            h.update(p.encode())
            with open(p, "rb") as fh:
                h.update(fh.read())
    return h.hexdigest()


def test_create_and_open_errors(tmp_path, schema):
    s = mmreplay.create_store(tmp_path / "s", schema)
    s.close()
    with pytest.raises(StoreExistsError):
        mmreplay.create_store(tmp_path / "s", schema)
    with pytest.raises(StoreNotFoundError):
        mmreplay.open_store(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreNotFoundError, match="not an mmreplay store"):
        mmreplay.open_store(tmp_path / "empty")
    with pytest.raises(ValueError, match="mode"):
        mmreplay.open_store(tmp_path / "s", mode="w")


def test_transitions_follow_lanes_and_episodes(store):
    lanes = 3
    with store.writer(lanes=lanes) as w:
        for t in range(20):
            # lane 1 terminates at t=4, lane 2 truncates at t=9
            w.add(**step(lanes, t, term=[False, t == 4, False], trunc=[False, False, t == 9]))
    store.refresh()
    ids = store.transition_ids()
    b = store.transitions(ids)
    t = b.obs[:, 0].astype(int)
    lane = b.obs[:, 1].astype(int)
    # next_obs is always the same lane's next row
    assert (b.next_obs[:, 1] == lane).all()
    assert (b.next_obs[:, 0] == t + 1).all()
    assert (b.action == t * 100 + lane).all()
    # the row after a done is the final observation (is_last): it never starts a transition
    starts = set(zip(t.tolist(), lane.tolist()))
    assert (5, 1) not in starts and (10, 2) not in starts
    assert (4, 1) in starts and (6, 1) in starts
    assert b.terminated[(t == 4) & (lane == 1)].all()
    assert b.truncated[(t == 9) & (lane == 2)].all()
    # 20 rows per lane, 19 with a next row, minus one is_last row in lanes 1 and 2
    assert len(ids) == 3 * 19 - 2


def test_transitions_cross_segment_boundaries(store):
    # segment_records=32 and 3 lanes: 30 usable rows per segment, so 10 steps each
    with store.writer(lanes=3) as w:
        for t in range(35):
            w.add(**step(3, t))
    store.refresh()
    assert len(store.reader.segments) == 4
    b = store.transitions(store.transition_ids())
    assert len(b) == 3 * 34
    assert (b.next_obs[:, 0] == b.obs[:, 0] + 1).all()
    assert (b.next_obs[:, 1] == b.obs[:, 1]).all()


def test_add_batch_time_major_equals_step_by_step(tmp_path, schema):
    a = mmreplay.create_store(tmp_path / "a", schema, segment_records=16)
    b = mmreplay.create_store(tmp_path / "b", schema, segment_records=16)
    steps = [step(2, t, term=[t % 7 == 6, False]) for t in range(30)]
    with a.writer(lanes=2) as w:
        for s in steps:
            w.add(**s)
    with b.writer(lanes=2) as w:
        w.add_batch({k: np.stack([s[k] for s in steps]) for k in steps[0]})
    for s in (a, b):
        s.refresh()
    ia, ib = a.transition_ids(), b.transition_ids()
    assert len(ia) == len(ib) > 0
    ta, tb = a.transitions(ia), b.transitions(ib)
    np.testing.assert_array_equal(ta.obs, tb.obs)
    np.testing.assert_array_equal(ta.next_obs, tb.next_obs)
    with b.writer(lanes=2) as w, pytest.raises(SchemaError, match=r"\(T, lanes=2\)"):
        w.add_batch(**step(2, 0))
    a.close()
    b.close()


def test_last_obs_on_close_makes_the_tail_sampleable(store):
    w = store.writer(lanes=2)
    for t in range(3):
        w.add(**step(2, t))
    store.refresh()
    assert len(store.transition_ids()) == 2 * 2
    w.close(last_obs=step(2, 3)["obs"])
    store.refresh()
    b = store.transitions(store.transition_ids())
    assert len(b) == 2 * 3 and b.next_obs[:, 0].max() == 3


def test_end_episodes_ends_every_lane_and_keeps_writing(store):
    w = store.writer(lanes=2)
    for t in range(3):
        w.add(**step(2, t))
    w.end_episodes(step(2, 100)["obs"])  # the episodes end at obs t=100, unflagged
    for t in range(3, 5):
        w.add(**step(2, t))
    w.close()
    b = store.transitions(store.transition_ids())
    assert len(b) == 2 * 3 + 2 * 1  # t=0..2 of the first episodes, t=3 of the new ones (t=4: no next row)
    last = b.obs[:, 0] == 2
    assert (b.next_obs[last, 0] == 100).all() and not (b.terminated | b.truncated).any()
    assert (b.next_obs[b.obs[:, 0] == 3, 0] == 4).all()  # no transition from the final row to t=3
    assert store.info()["episodes_incomplete"] >= 2  # the two end_episodes ended (no flag)


# one lane: the generated single-row check (_steps.row_bytes); lane segments: every lane checked before any is written
@pytest.mark.parametrize(("lanes", "lane_segments"), [(1, None), (2, None), (2, True)])
def test_bad_input_writes_nothing(store, lanes, lane_segments):
    L = lanes
    w = store.writer(lanes=L, lane_segments=lane_segments)
    w.add(**step(L, 0))
    w.flush()
    store.refresh()
    before = (store.num_rows, _tree_digest(store.path))
    bad = [
        {**step(L, 1), "obs": np.zeros((L, 4), np.float32)},
        {**step(L, 1), "reward": np.array([1.0, np.nan][-L:], np.float32)},
        {**step(L, 1), "obs": np.where(np.arange(3 * L).reshape(L, 3) == 3 * L - 1, np.inf, 0).astype(np.float32)},
        {**step(L, 1), "action": np.zeros(L, np.float64)},
        {**step(L, 1), "terminated": np.zeros(L, np.uint8)},
        {k: v for k, v in step(L, 1).items() if k != "reward"},
        {**step(L, 1), "extra": np.zeros(L)},
        {**step(L, 1), "reward": np.zeros(L + 1, np.float32)},
        {**step(L, 1), "obs": step(L, 1)["obs"].tolist()},
    ]
    for b in bad:
        with pytest.raises((SchemaError, InvalidValueError)):
            w.add(**b)
    store.refresh()
    assert (store.num_rows, _tree_digest(store.path)) == before
    w.add(**step(L, 1))  # the writer still works after refused batches
    w.close()


def test_noncontiguous_and_readonly_inputs_are_copied_correctly(store):
    big = np.arange(2 * 6, dtype=np.float32).reshape(2, 6)
    obs = big[:, ::2]  # non-contiguous
    ro = np.array([5, 6], np.int64)
    ro.setflags(write=False)
    with store.writer(lanes=2) as w:
        w.add(**{**step(2, 0), "obs": obs, "action": ro})
        w.add(**step(2, 1))
    store.refresh()
    ids = store.transition_ids()
    np.testing.assert_array_equal(store.rows("obs", ids), obs)
    np.testing.assert_array_equal(store.rows("action", ids), ro)


def test_empty_store_sampling_raises(store):
    with pytest.raises(EmptyStoreError):
        UniformSampler(store).sample(4)
    with store.writer(lanes=2) as w:
        w.add(**step(2, 0))  # rows, but no next row yet: still no transition
    with pytest.raises(EmptyStoreError, match="no sampleable transition"):
        UniformSampler(store).sample(4)


def test_a_sampler_waits_for_the_first_rows_of_a_store_being_checked(tmp_path, schema, monkeypatch):
    """A copied store (every file a new identity) larger than the at-open check is checked in the
    background: a sampler's first batch waits for the first checked rows instead of finding it empty."""
    import time

    from mmreplay.storage import checks, reader

    path = tmp_path / "s"
    with mmreplay.create_store(path, schema, capacity=10_000, segment_records=64) as st, st.writer() as w:
        for t in range(300):
            w.add(**step(1, t, term=[t % 50 == 49]))
    for f in (path / "segments").iterdir():
        os.utime(f)  # as a copy does: no check recorded applies
    monkeypatch.setattr(reader, "SYNC_CHECK_BYTES", 0)  # (as for a store of more than 64 MiB)
    real = checks.check_file
    monkeypatch.setattr(checks, "check_file", lambda *a: (time.sleep(0.2), real(*a))[1])
    with mmreplay.open_store(path, mode="r") as st:
        assert st.reader.snapshot.total_rows == 0 and st.check_counts()["unchecked_segments"] == 5
        assert len(UniformSampler(st, seed=0).sample(8).ids) == 8
        assert mmreplay.SequenceSampler(st, length=4, seed=0).sample(4).mask.all()
        assert st.wait_for_rows()
    with mmreplay.create_store(tmp_path / "empty", schema) as st:
        assert not st.wait_for_rows(timeout=0.1)  # nothing pending: no wait, and it says so


def test_uniform_sampler_is_seeded_and_uniform(store):
    with store.writer(lanes=4) as w:
        for t in range(50):
            w.add(**step(4, t, term=[t % 9 == 8, False, False, t % 13 == 12]))
    valid = set(store.transition_ids().tolist())
    a = UniformSampler(store, seed=1).sample_ids(20_000)
    b = UniformSampler(store, seed=1).sample_ids(20_000)
    np.testing.assert_array_equal(a, b)
    assert set(a.tolist()) == valid  # every valid transition drawn, nothing else
    counts = np.unique(a, return_counts=True)[1]
    expected = len(a) / len(valid)
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < len(valid) + 6 * np.sqrt(2 * len(valid))  # far inside the chi-square tail


def test_eviction_keeps_capacity_and_never_reaches_deleted_rows(tmp_path, schema):
    s = mmreplay.create_store(tmp_path / "s", schema, capacity=64, segment_records=16)
    with s.writer(lanes=2) as w:
        for t in range(200):
            w.add(**step(2, t))
            if t == 100:
                s.refresh()
                old = UniformSampler(s, seed=0, refresh_interval_s=None)
                before = old.sample(64)
    # the reader still maps evicted segments until its next refresh: reads stay valid
    np.testing.assert_array_equal(s.transitions(before.ids).obs, before.obs)
    s.refresh()
    info = s.info()
    assert 64 <= info["rows"] <= 64 + 16
    assert info["evicted_segments"] > 0
    b = UniformSampler(s, seed=0).sample(500)
    assert b.obs[:, 0].min() >= 200 - (64 + 16) // 2
    assert (b.next_obs[:, 0] == b.obs[:, 0] + 1).all()
    with pytest.raises(KeyError):
        s.transitions(before.ids[:1])  # evicted rows are gone after refresh
    s.close()


def test_on_full_error(tmp_path, schema):
    s = mmreplay.create_store(tmp_path / "s", schema, capacity=16, segment_records=16, on_full="error")
    w = s.writer(lanes=1)
    # full once a new segment would be needed beyond capacity + one segment + the writer's open one;
    # whether the background allocation notices at row 32 or 48 depends on when it ran
    with pytest.raises(mmreplay.StoreFullError):
        for t in range(16 + 2 * 16 + 1):
            w.add(**step(1, t))
    assert 32 <= t <= 48  # noqa: B023
    w.publish()
    s.refresh()
    assert s.num_rows == t  # every row added before the error is kept
    s.close()


@pytest.mark.parametrize("capacity", [16, 20])
def test_a_full_store_refuses_a_row_before_writing_it_and_the_writer_stays_usable(tmp_path, schema, capacity):
    """on_full='error': the StoreFullError comes before the refused row is written (a full store
    never holds a row its writer was told failed), the writer can still be closed cleanly, and
    its last segment is sealed."""
    s = mmreplay.create_store(tmp_path / "s", schema, capacity=capacity, segment_records=16, on_full="error")
    w = s.writer(lanes=1)
    added = 0
    with pytest.raises(mmreplay.StoreFullError):
        for t in range(200):
            w.add(**step(1, t))
            added += 1
    with pytest.raises(mmreplay.StoreFullError):  # still refused, not WriterFailedError
        w.add(**step(1, added))
    w.close()
    with mmreplay.open_store(tmp_path / "s") as r:
        assert r.num_rows == added and r.info()["segments_open"] == 0
    s.close()


def test_writer_ids(store):
    a = store.writer()
    b = store.writer()
    assert (a.writer_id, b.writer_id) == (0, 1)
    with pytest.raises(WriterBusyError):
        store.writer(writer_id=0)
    a.close()
    c = store.writer(writer_id=0)  # free again at once
    c.close()
    b.close()


def test_read_only_mode_refuses_writers(store):
    with store.writer(lanes=1) as w:
        w.add(**step(1, 0))
    r = mmreplay.open_store(store.path, mode="r")
    with pytest.raises(ReadOnlyStoreError):
        r.writer()
    assert r.num_rows == 1
    r.close()


def test_read_only_directory_needs_no_writes(tmp_path, schema):
    s = mmreplay.create_store(tmp_path / "s", schema, segment_records=16)
    with s.writer(lanes=2) as w:
        for t in range(10):
            w.add(**step(2, t))
    s.close()
    before = sorted(p.name for p in (tmp_path / "s").rglob("*"))
    for p in [tmp_path / "s", *(tmp_path / "s").rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    try:
        r = mmreplay.open_store(tmp_path / "s", mode="r")
        assert len(UniformSampler(r, seed=0).sample(8)) == 8
        r.close()
        if os.geteuid() != 0:  # root ignores permission bits
            with pytest.raises(ReadOnlyStoreError):
                mmreplay.open_store(tmp_path / "s", mode="a")
    finally:
        for p in [tmp_path / "s", *(tmp_path / "s").rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
    assert sorted(p.name for p in (tmp_path / "s").rglob("*")) == before


def test_reopen_in_another_process_returns_identical_data(tmp_path, schema):
    s = mmreplay.create_store(tmp_path / "s", schema, segment_records=16)
    with s.writer(lanes=3) as w:
        for t in range(40):
            w.add(**step(3, t, term=[t % 11 == 10, False, False]))
    ids = s.transition_ids()
    b = s.transitions(ids)
    digest = hashlib.sha256(b.obs.tobytes() + b.next_obs.tobytes() + b.action.tobytes() + ids.tobytes()).hexdigest()
    s.close()
    code = (
        "import sys, hashlib, mmreplay; s = mmreplay.open_store(sys.argv[1]); ids = s.transition_ids(); "
        "b = s.transitions(ids); "
        "print(hashlib.sha256(b.obs.tobytes() + b.next_obs.tobytes() + b.action.tobytes() + ids.tobytes()).hexdigest())"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s")], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == digest


def test_dict_observations(tmp_path):
    import gymnasium as gym

    obs_space = gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (2,), np.float32), "id": gym.spaces.Discrete(4)})
    schema = mmreplay.Schema.from_spaces(obs_space, gym.spaces.Discrete(2))
    s = mmreplay.create_store(tmp_path / "d", schema)
    with s.writer(lanes=2) as w:
        for t in range(5):
            w.add(**{"obs/pos": np.full((2, 2), t, np.float32), "obs/id": np.array([t, t]), "action": np.array([0, 1]),
                     "reward": np.zeros(2), "terminated": np.zeros(2, bool), "truncated": np.zeros(2, bool)})
        w.close(last_obs={"pos": np.full((2, 2), 5, np.float32), "id": np.array([5, 5])})
    b = UniformSampler(s, seed=0).sample(16)
    assert set(b.obs) == {"pos", "id"}
    assert (b.next_obs["id"] == b.obs["id"] + 1).all()
    assert (b.next_obs["pos"][:, 0] == b.obs["pos"][:, 0] + 1).all()
    s.close()


def test_writer_rejects_bad_arguments(store):
    with pytest.raises(ValueError, match="lanes"):
        store.writer(lanes=0)
    with pytest.raises(ValueError, match="durability"):
        store.writer(durability="sometimes")
    with pytest.raises(ValueError, match="more than the store's segment_records"):
        store.writer(lanes=33)
    with pytest.raises(ValueError, match="`lane_segments` must be True, False or None"):
        store.writer(lanes=2, lane_segments="yes")
    with store.writer(lanes=2):  # the refused writers took no writer id
        pass


@pytest.mark.parametrize("lane_segments", [False, True])
@pytest.mark.parametrize("durability", ["process", "segment", "batch"])
def test_durability_levels_all_store_the_same_rows(tmp_path, schema, durability, lane_segments):
    s = mmreplay.create_store(tmp_path / durability, schema, segment_records=16)
    with s.writer(lanes=2, durability=durability, lane_segments=lane_segments) as w:
        for t in range(20):
            w.add(**step(2, t))
        w.flush()
        assert mmreplay.open_store(s.path, mode="r").num_rows == 40  # flushed: visible elsewhere
    s.close()
    r = mmreplay.open_store(tmp_path / durability)
    assert r.num_rows == 40 and len(r.transition_ids()) == 38
    assert {int(r.reader.segments[k].header.lanes) for k in r.reader.segments} == ({1} if lane_segments else {2})
    r.close()


def test_lane_segments_keep_each_lanes_steps_consecutive_and_are_the_default_for_frames(tmp_path):
    """With lane segments every segment holds one lane, its consecutive steps as consecutive rows
    (a frame stack is one contiguous read); the default for frame-sized rows when the capacity holds
    4 segments per lane, else rows stay (time, lane). Groups count every lane's rows (publish_rows)."""
    frames = mmreplay.Schema.transition(obs_shape=(64, 64), obs_dtype=np.uint8)  # 4 KiB rows
    s = mmreplay.create_store(tmp_path / "f", frames, capacity=4 * 3 * 32, segment_records=32)
    lane_t = lambda t: np.stack([np.full((64, 64), j * 70 + t, np.uint8) for j in range(3)])  # noqa: E731
    # (no timed publish: on a loaded machine the 5 ms timer would publish a few steps early)
    with s.writer(lanes=3, publish_rows=30, publish_interval_s=60) as w:
        assert w.lane_segments and w.stats()["lane_segments"]
        for t in range(10):
            w.add(obs=lane_t(t), action=np.zeros(3, np.int64), reward=np.full(3, t, np.float32),
                  terminated=np.zeros(3, bool), truncated=np.zeros(3, bool))
        assert w.stats()["unpublished_rows"] == 0  # 3 lanes x 10 steps: a full group of 30 rows
        for t in range(10, 70):
            w.add(obs=lane_t(t), action=np.zeros(3, np.int64), reward=np.full(3, t, np.float32),
                  terminated=np.zeros(3, bool), truncated=np.zeros(3, bool))
    s.refresh()
    r, snap = s.reader, s.reader.snapshot
    assert len(snap.segment_ids) == 9 and set(snap.lanes.tolist()) == {1}
    for k in range(len(snap.segment_ids)):
        px = r.columns["obs"][int(snap.windows[k]), : int(snap.committed[k]), 0, 0].astype(int)
        lane, t = px // 70, px % 70
        assert (lane == lane[0]).all() and (np.diff(t) == 1).all()
    b = UniformSampler(s, frame_stack=4, seed=0).sample(64)
    px = b.obs[:, :, 0, 0].astype(int)
    assert ((px // 70) == (px[:, -1:] // 70)).all()  # one lane per stack
    assert ((np.diff(px % 70, axis=1) == 1) | ((px[:, :-1] % 70) == 0)).all()  # consecutive steps (clamped at 0)
    s.close()
    small = mmreplay.create_store(tmp_path / "s", mmreplay.Schema.transition((3,)), capacity=10_000, segment_records=32)
    narrow = mmreplay.create_store(tmp_path / "n", frames, capacity=4 * 3 * 32 - 1, segment_records=32)
    strict = mmreplay.create_store(tmp_path / "e", frames, capacity=10_000, segment_records=32, on_full="error")
    for store, lanes in ((small, 3), (narrow, 3), (strict, 3), (s, 1)):
        if store is s:
            store = mmreplay.open_store(s.path, mode="a")
        with store.writer(lanes=lanes) as w:
            assert not w.lane_segments
        store.close()
    # eviction keeps `capacity` published rows: a lane's new segment does not count the other lanes' empty ones
    full = mmreplay.create_store(tmp_path / "c", frames, capacity=4 * 3 * 32, segment_records=32)
    with full.writer(lanes=3) as w:
        for t in range(140):
            w.add(obs=lane_t(t % 70), action=np.zeros(3, np.int64), reward=np.zeros(3, np.float32),
                  terminated=np.zeros(3, bool), truncated=np.zeros(3, bool))
    full.refresh()
    assert full.num_rows == 420  # 384 rows of capacity reached, nothing evicted yet
    full.close()


def test_store_used_after_close(store):
    store.close()
    with pytest.raises(mmreplay.StoreClosedError):
        store.refresh()


def test_reader_grows_its_address_range_past_the_initial_windows(tmp_path, schema):
    s = mmreplay.create_store(tmp_path / "s", schema, capacity=32, segment_records=16)
    start = s.reader.region.slots
    writers = [s.writer(lanes=1) for _ in range(start + 4)]  # each holds an open segment
    for i, w in enumerate(writers):
        for t in range(3):
            w.add(**{**step(1, t), "action": np.array([i], np.int64)})
    s.refresh()
    assert s.reader.region.slots > start  # remapped into a larger range
    b = UniformSampler(s, seed=0).sample(4000)
    assert set(b.action.tolist()) == set(range(len(writers)))
    assert (b.next_obs[:, 0] == b.obs[:, 0] + 1).all()
    for w in writers:
        w.close()
    s.close()


def test_next_segment_is_ordered_at_half_of_the_first_then_at_each_roll(tmp_path, schema):
    """A short session makes no spare; after its first segment a writer orders the next one as
    soon as it takes a segment (a whole segment's time to make it, not half)."""
    s = mmreplay.create_store(tmp_path / "s", schema, segment_records=64)
    w = s.writer(lanes=1)
    for t in range(31):
        w.add(**step(1, t))
    assert not w.stats()["next_segment_ordered"]  # 31 of 64 rows: nothing ordered yet
    w.add(**step(1, 31))
    assert w.stats()["next_segment_ordered"]  # half of the first segment: the second is being made
    for t in range(32, 65):
        w.add(**step(1, t))  # row 64 is the first of the second segment
    st = w.stats()
    assert st["segment_chain_index"] == 1 and st["segment_rows"] == 1 and st["next_segment_ordered"]  # the third
    w.close()
    assert s.num_rows == 65 and len(list((tmp_path / "s" / "segments").iterdir())) == 2  # the spare is gone
    s.close()


def test_segments_are_made_on_the_writers_thread_and_catalogued_by_it(tmp_path, schema, monkeypatch):
    """A writer makes its next segment file where it takes the previous one (only the pre-faulting
    of its pages runs in a background thread: a thread's every system call takes the GIL back from
    the appending thread), and a segment closed durably in the background is catalogued by the
    writer's next take, or by its flush or close."""
    import threading

    from mmreplay.storage.segment import Segment

    makers = []
    real = Segment.create.__func__
    monkeypatch.setattr(Segment, "create", classmethod(
        lambda cls, *a, **k: makers.append(threading.current_thread()) or real(cls, *a, **k)))
    s = mmreplay.create_store(tmp_path / "s", schema, segment_records=64)
    w = s.writer(lanes=1)
    for t in range(64 * 3 + 1):  # three full segments; the fourth is taken, the fifth made
        w.add(**step(1, t))
    assert len(makers) == 5 and set(makers) == {threading.current_thread()}
    w.flush()  # waits for the background syncs: what they closed is catalogued, as checked
    names = {f"{i:013d}-w{w.writer_id:03d}.seg" for i in range(3)}
    state = s.files.catalog.read()
    assert set(state.live) == names and set(state.checks) == names
    for t in range(64 * 3 + 1, 64 * 4 + 10):
        w.add(**step(1, t))
    w.close()
    assert len(s.files.catalog.read().live) == 5  # the last, partial segment is sealed and catalogued by close
    s.close()


def test_eviction_reads_each_sealed_control_page_once_and_forgets_evicted_ones(tmp_path, schema, monkeypatch):
    """Sealed segments never change, so eviction remembers their row counts; segments another
    handle evicted drop out of that memory, and the capacity bound holds throughout."""
    mmreplay.create_store(tmp_path / "s", schema, capacity=256, segment_records=64).close()
    a, b = mmreplay.open_store(tmp_path / "s", mode="a"), mmreplay.open_store(tmp_path / "s", mode="a")
    from mmreplay.storage.format import STATE_SEALED

    reads = []  # (handle's files, segment, read as sealed)
    real = mmreplay.storage.files.StoreFiles.segment_state

    def spy(self, path):
        out = real(self, path)
        reads.append((id(self), path.name, out[0] == STATE_SEALED))
        return out

    monkeypatch.setattr(mmreplay.storage.files.StoreFiles, "segment_state", spy)
    wa, wb = a.writer(lanes=1), b.writer(lanes=1)
    for t in range(1000):
        (wa if t % 200 < 100 else wb).add(**step(1, t))  # the handles take turns, 100 rows each
    wa.close()
    wb.close()
    on_disk = {p.name for p in (tmp_path / "s" / "segments").iterdir()}
    for h in (a, b):
        h.files.evict_for_new_segment()
        assert set(h.files.sealed_rows) <= on_disk  # evicted segments were forgotten
    seen_sealed, again = set(), []
    for handle, name, sealed in reads:
        if (handle, name) in seen_sealed:
            again.append(name)  # read again by a handle that already knew it sealed
        if sealed:
            seen_sealed.add((handle, name))
    assert not again and len(seen_sealed) > 4 and a.info()["evicted_segments"] > 0
    assert 256 <= b.num_rows <= 256 + 64 + 2 * 64
    a.close()
    b.close()


def test_open_store_on_a_file_or_a_plain_directory_is_store_not_found(tmp_path):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-dir").mkdir()
    for path, says in ((tmp_path / "a-file", "is a file"), (tmp_path / "a-dir", "no STORE.json"),
                       (tmp_path / "missing", "no store at")):
        for mode in ("r", "a"):
            with pytest.raises(mmreplay.StoreNotFoundError, match=says) as e:
                mmreplay.open_store(path, mode=mode)
            assert str(path) in str(e.value)


def test_the_draw_index_points_each_bucket_at_the_segment_holding_its_first_row():
    """``index_draws``: the smallest shift that fits the rows in ``SEG_NBUCKETS`` buckets per segment,
    and each bucket's first row found in the first segment whose cumulative end exceeds it (empty
    segments included, a bucket past the last row pointing at the last segment)."""
    rng = np.random.default_rng(7)
    for trial in range(3000):
        n = int(rng.integers(1, 40))
        counts = rng.integers(0, [2, 50, 1 << 22][trial % 3], n)
        t = np.zeros((n, SEG_COLS), np.int64)
        t[:, SEG_CUM_END] = cum = np.cumsum(counts)
        index_draws(t)
        shift, buckets = int(t[0, SEG_SHIFT]), t[:, SEG_BUCKET:].reshape(-1)
        assert (t[:, SEG_SHIFT] == shift).all()
        last, nb = max(int(cum[-1]) - 1, 0), n * SEG_NBUCKETS
        assert last >> shift < nb and (shift == 0 or last >> (shift - 1) >= nb)
        for b, k in enumerate(buckets):
            u = b << shift
            want = min(int(np.argmax(cum > u)) if u < cum[-1] else n - 1, n - 1)
            assert k == want, (trial, b, u, cum, k, want)


def test_a_refresh_that_sees_only_appended_rows_matches_a_full_snapshot(tmp_path, schema):
    """A refresh that finds only rows appended to open segments updates the counts in place of a
    rebuild (same segment arrays); its snapshot, draw index and transitions equal a fresh handle's."""
    path = tmp_path / "s"
    s = mmreplay.create_store(path, schema, capacity=10_000, segment_records=64)
    w = s.writer(lanes=2)
    incremental = 0
    for t in range(100):
        w.add(step(2, t))
        before = s.reader.snapshot
        s.refresh(scan=False)
        snap = s.reader.snapshot
        incremental += snap.segment_ids is before.segment_ids and snap.committed is not before.committed
        if t % 9 == 4:
            with mmreplay.open_store(path) as fresh:  # (it also lists the writer's spare segment, still empty)
                f = fresh.reader.snapshot
                common = np.isin(f.segment_ids, snap.segment_ids)
                assert (f.committed[~common] == 0).all()
                np.testing.assert_array_equal(snap.segment_ids, f.segment_ids[common])
                np.testing.assert_array_equal(snap.committed, f.committed[common])
                np.testing.assert_array_equal(snap.cum_end, f.cum_end[common])
                ours = s.reader.segment_table()
                np.testing.assert_array_equal(ours[:, SEG_CUM_END], snap.cum_end)
                np.testing.assert_array_equal(ours[:, SEG_COMMITTED], snap.committed)
                np.testing.assert_array_equal(ours, index_draws(ours.copy()))  # the draw index follows the counts
                ids = s.transition_ids()
                np.testing.assert_array_equal(ids, fresh.transition_ids())
                np.testing.assert_array_equal(s.transitions(ids).next_obs, fresh.transitions(ids).next_obs)
    assert incremental > 50  # most refreshes took the count-only path (the others found a new segment)
    w.close()
    s.close()
