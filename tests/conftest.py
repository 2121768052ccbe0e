from __future__ import annotations

import os

import numpy as np
import pytest

import mmreplay
from mmreplay.cluster.local_ray import LOOPBACK_ENV

# Tests talk only to loopback. mmreplay's local Ray start sets this before it imports Ray; a test that
# imports a library which imports Ray itself (torchrl does) would otherwise leave a later local Ray
# refusing to start (RayNotLoopbackError) in the same worker process.
os.environ.setdefault(*LOOPBACK_ENV)


@pytest.fixture(autouse=True, scope="session")
def _sb3_log_dir(tmp_path_factory):
    """stable-baselines3's ``learn`` makes a log folder in the system temp dir (``SB3-<time>``) unless
    ``SB3_LOGDIR`` names one: keep those in pytest's temp dir (child processes inherit it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SB3_LOGDIR", str(tmp_path_factory.mktemp("sb3-logs")))
        yield


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
