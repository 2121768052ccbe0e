"""The writer's fast paths store exactly what its general path stores.

A single-lane step as it usually comes is checked by a check generated for the schema and written
as its record's bytes (``_steps.row_bytes``); a vector step is copied field by field and its
floats checked in place; commit groups are stamped by a compiled kernel once numba is loaded,
else by numpy (``Segment.stamp``). Each is compared here with the general path or the other.
"""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

import mmreplay
from mmreplay.storage import segment as segment_module
from mmreplay.storage.step_spec import StepSpec
from mmreplay.storage.segment import Segment, parse_segment_name

ODD = mmreplay.Schema(
    [
        mmreplay.Field("obs", np.dtype(np.uint8), (3,)),  # odd sizes: padding inside the record
        mmreplay.Field("action", np.dtype(np.int16), (2,)),
        mmreplay.Field("reward", np.dtype(np.float32)),
        mmreplay.Field("cost", np.dtype(np.float16)),
        mmreplay.Field("terminated", np.dtype(np.bool_)),
        mmreplay.Field("truncated", np.dtype(np.bool_)),
    ]
)
VECTOR = mmreplay.Schema.transition(obs_shape=(8,), obs_dtype=np.float32)
DICT = mmreplay.Schema.from_spaces(
    spaces.Dict({"a": spaces.Box(-1, 1, (2, 3), np.float64), "b": spaces.Discrete(5)}), spaces.Discrete(3))


def _steps(schema: mmreplay.Schema, T: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``T`` single-lane steps with every field's exact dtype and shape (episodes end now and then)."""
    rng = np.random.default_rng(seed)
    out = []
    for t in range(T):
        s = {}
        for f in schema.fields:
            if f.name == "terminated":
                s[f.name] = np.array([t % 11 == 10])
            elif f.name == "truncated":
                s[f.name] = np.array([t % 17 == 16])
            elif f.dtype.kind == "f":
                s[f.name] = rng.standard_normal((1, *f.shape)).astype(f.dtype)
            else:
                s[f.name] = rng.integers(0, 5, (1, *f.shape)).astype(f.dtype)
        out.append(s)
    return out


@pytest.mark.parametrize("schema", [VECTOR, ODD, DICT], ids=["vector", "odd-sizes", "dict"])
def test_single_row_adds_store_what_the_general_path_stores(tmp_path, schema):
    steps = _steps(schema, 300)
    spec = StepSpec(schema, mmreplay.create_store(tmp_path / "x", schema, segment_records=64).layout, 1, "error")
    layout = mmreplay.open_store(tmp_path / "x").layout
    for s in steps[:20]:  # the generated check writes the record numpy's structured encoding writes
        got = spec.row_bytes(s, b"\x01")
        rec = np.zeros((), layout.record_dtype)
        for name in schema.names:
            rec[name] = s[name][0]
        rec["is_last"] = True
        assert got == rec.tobytes()
    a = mmreplay.create_store(tmp_path / "a", schema, segment_records=64)
    b = mmreplay.create_store(tmp_path / "b", schema, segment_records=64)
    with a.writer(lanes=1) as w:
        for s in steps:
            w.add(s)  # exact: the single-row path (a roll every 64 rows: the general path)
    with b.writer(lanes=1) as w:
        w.add_batch({k: np.stack([s[k] for s in steps]) for k in schema.names})
    for st in (a, b):
        st.refresh()
    ia, ib = a.transition_ids(), b.transition_ids()
    assert len(ia) == len(ib) == 300 - 1 - sum(bool(s["terminated"][0] or s["truncated"][0]) for s in steps[:-1])
    ta, tb = a.transitions(ia), b.transitions(ib)
    for name in ("obs", "next_obs", "action", "reward", "terminated", "truncated", "extra"):
        x, y = getattr(ta, name), getattr(tb, name)
        for key in x if isinstance(x, dict) else [None]:
            np.testing.assert_array_equal(x if key is None else x[key], y if key is None else y[key], err_msg=name)
    assert len(ta.extra) == (schema is ODD)
    assert a.verify() == [] and b.verify() == []
    a.close()
    b.close()


def test_a_single_lane_step_that_is_not_exact_goes_through_the_general_path(tmp_path):
    s = mmreplay.create_store(tmp_path / "s", VECTOR, segment_records=64)
    with s.writer(lanes=1, cast="safe") as w:
        w.add(obs=np.ones((1, 8), np.float16), action=np.array([2], np.int32), reward=np.array([0.5], np.float16),
              terminated=np.array([False]), truncated=np.array([False]))  # cast, then stored
        w.add(obs=np.full((1, 8), 2, np.float32), action=np.array([3]), reward=np.array([1], np.float32),
              terminated=np.array([True]), truncated=np.array([False]))
        w.add(obs=np.full((1, 8), 3, np.float32), action=np.array([4]), reward=np.array([1], np.float32),
              terminated=np.array([False]), truncated=np.array([False]))  # a new episode's first row
    s.refresh()
    t = s.transitions(s.transition_ids())
    np.testing.assert_array_equal(t.obs[:, 0], [1, 2])
    np.testing.assert_array_equal(t.next_obs[:, 0], [2, 3])
    np.testing.assert_array_equal(t.action, [2, 3])
    np.testing.assert_array_equal(t.terminated, [False, True])
    s.close()


@pytest.mark.parametrize("schema", [VECTOR, ODD, mmreplay.Schema.transition(obs_shape=(10,), obs_dtype=np.float32)],
                         ids=["whole-words", "padded-words", "odd-word-count"])
def test_compiled_and_numpy_stamping_write_the_same_stamps(tmp_path, schema, monkeypatch):
    """The row numbers and digests are the same either way (the crc is seeded with the session,
    so it is compared through ``verify``, which checks every group's crc and every digest)."""
    steps = _steps(schema, 200, seed=1)
    batch = {k: np.stack([s[k] for s in steps]).reshape(50, 4, *np.shape(steps[0][k])[1:]) for k in schema.names}
    seqs = []
    for name, numpy_only in (("compiled", False), ("numpy", True)):
        if numpy_only:
            monkeypatch.setattr(segment_module, "kernel", lambda load=True: None)
        st = mmreplay.create_store(tmp_path / name, schema, segment_records=96)
        with st.writer(lanes=4, publish_rows=7) as w:  # groups of 4 to 96 rows
            w.add_batch({k: v[:10] for k, v in batch.items()})
            for t in range(10, 50):
                w.add({k: v[t] for k, v in batch.items()})
        assert st.verify() == []
        got = []
        for p in sorted(p for p in st.segments_dir.iterdir() if parse_segment_name(p.name)):
            seg = Segment.open_rw(p, st.layout, st.store_uuid, st.schema.hash, writable=False)
            got.append(seg.stamps["seq"][: seg.control.committed].copy())
            seg.close()
        seqs.append(np.concatenate(got))
        st.close()
    np.testing.assert_array_equal(seqs[0], seqs[1])


def test_a_writer_loads_the_compiled_kernels_when_it_opens_not_in_its_first_add(tmp_path):
    import subprocess
    import sys

    code = """
import sys
import numpy as np
import mmreplay
s = mmreplay.create_store(sys.argv[1], mmreplay.Schema.transition(obs_shape=(4,)), capacity=1000)
w = s.writer(lanes=1)
w.add(obs=np.zeros((1, 4), np.float32), action=np.zeros(1, np.int64), reward=np.zeros(1, np.float32),
      terminated=np.zeros(1, bool), truncated=np.zeros(1, bool))
w.close()
assert "numba" not in sys.modules, "a single-lane writer loads numba"
from mmreplay.storage import check_kernel  # numba is loaded now (a sampler loads it too)
assert not check_kernel.stamp_rows.signatures
w = s.writer(lanes=1)
assert check_kernel.stamp_rows.signatures and check_kernel.rows_finite.signatures, "kernels left to the first add"
w.close()
s.close()
"""
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


def test_a_single_lane_writer_checks_at_close_what_it_sealed_unchecked(tmp_path):
    """Without numba loaded a single-lane writer seals unchecked; at close it checks them (when they hold
    more than the at-open check reads: 0 bytes here) so that read-only opens need not check them each time."""
    import subprocess
    import sys

    code = """
import sys
import numpy as np
import mmreplay
from mmreplay.storage import checks
checks.SYNC_CHECK_BYTES = 0
s = mmreplay.create_store(sys.argv[1], mmreplay.Schema.transition(obs_shape=(4,)), capacity=1000, segment_records=64)
with s.writer(lanes=1) as w:
    for t in range(200):
        w.add(obs=np.full((1, 4), t, np.float32), action=np.zeros(1, np.int64), reward=np.zeros(1, np.float32),
              terminated=np.zeros(1, bool), truncated=np.zeros(1, bool))
        if t == 150:
            assert "numba" not in sys.modules, "a single-lane writer loads numba before its close"
s.close()
with mmreplay.open_store(sys.argv[1], mode="r", check_at_open=False) as r:
    r.refresh()
    c = r.check_counts()
    assert c["unchecked_segments"] == 0 and c["checked_segments"] == 0 and r.num_rows == 200, c
"""
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
