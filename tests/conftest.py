from __future__ import annotations

import numpy as np
import pytest

import mmreplay


@pytest.fixture
def schema() -> mmreplay.Schema:
    return mmreplay.Schema.transition(obs_shape=(3,), obs_dtype=np.float32)


@pytest.fixture
def store(tmp_path, schema):
    s = mmreplay.create_store(tmp_path / "store", schema, capacity=10_000, segment_records=32)
    yield s
    s.close()


def step(lanes: int, t: int, *, term=None, trunc=None) -> dict[str, np.ndarray]:
    """A deterministic vector step: obs encodes (t, lane)."""
    lane = np.arange(lanes)
    return {
        "obs": np.stack([np.full(lanes, t, np.float32), lane.astype(np.float32), np.zeros(lanes, np.float32)], 1),
        "action": (t * 100 + lane).astype(np.int64),
        "reward": np.full(lanes, t, np.float32),
        "terminated": np.zeros(lanes, bool) if term is None else np.asarray(term, bool),
        "truncated": np.zeros(lanes, bool) if trunc is None else np.asarray(trunc, bool),
    }
