"""Many writer processes and a sampling reader at once."""

from __future__ import annotations

import multiprocessing as mp
import subprocess
import sys
import time

from pathlib import Path

import numpy as np
import pytest
from _children import SCHEMA, writer

import mmreplay

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fault"))  # shared with the kill -9 tests
from test_fault_kill import CHILD, assert_prefix, visible_rows  # noqa: E402


@pytest.mark.slow
def test_four_writers_and_a_sampler_as_separate_invocations(tmp_path):
    path = tmp_path / "s"
    mmreplay.create_store(path, SCHEMA, capacity=1_000_000, segment_records=1024).close()
    sampler = subprocess.Popen([sys.executable, CHILD, "sampler", str(path), "6"], stdout=subprocess.PIPE, text=True)
    procs = [subprocess.Popen([sys.executable, CHILD, "writer", str(path), str(k), "20000", "segment", "64"],
                              stdout=subprocess.DEVNULL) for k in range(1, 5)]
    for p in procs:
        assert p.wait(timeout=300) == 0
    out = sampler.communicate(timeout=60)[0]
    assert sampler.returncode == 0, out  # never a torn row, never a wrong next_obs
    rows = visible_rows(path)
    assert sorted(rows) == [1, 2, 3, 4]
    for k in range(1, 5):
        assert_prefix(rows[k], 20000)
        assert len(rows[k]) == 20000  # no duplicates, no holes, nothing lost
    s = mmreplay.open_store(path)
    info = s.info()  # a writer that finished before another opened frees its writer id for reuse
    assert s.num_rows == 80000 and 1 <= len(info["writers"]) <= 4 and sum(info["rows_per_writer"].values()) == 80000
    s.close()


def test_spawned_writers_share_one_store(tmp_path):
    path = tmp_path / "s"
    mmreplay.create_store(path, SCHEMA, capacity=100_000, segment_records=256).close()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=writer, args=(str(path), k, 3000, "segment", 64)) for k in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    rows = visible_rows(path)
    assert {k: len(v) for k, v in rows.items()} == {1: 3000, 2: 3000}


def test_eviction_under_concurrent_writers_keeps_capacity(tmp_path):
    path = tmp_path / "s"
    mmreplay.create_store(path, SCHEMA, capacity=2000, segment_records=128).close()
    procs = [subprocess.Popen([sys.executable, CHILD, "writer", str(path), str(k), "3000", "segment", "64"],
                              stdout=subprocess.DEVNULL) for k in (1, 2)]
    for p in procs:
        assert p.wait(timeout=120) == 0
    s = mmreplay.open_store(path)
    info = s.info()
    # sealed rows stay within one segment above capacity, plus each writer's last segment
    assert 2000 <= info["rows"] <= 2000 + (1 + 2) * 128 and info["evicted_segments"] > 0
    s.close()
    for seqs in visible_rows(path).values():
        assert_prefix(seqs, 3000, evicted_ok=True)  # the newest rows of each writer survive
    ids = np.unique(np.array([int(p.name[:13]) for p in (path / "segments").iterdir()]))
    assert len(ids) == len(list((path / "segments").iterdir()))


def _close_all(writers, reader, worst: int) -> int:
    """Close the writers; the most rows the reader has seen, their last rows included."""
    for w in writers:
        w.close()
    reader.refresh()
    return max(worst, reader.num_rows)


@pytest.mark.parametrize("lag", [0, 96])
def test_interleaved_writers_stay_within_the_documented_capacity_bound(tmp_path, lag):
    """capacity + one segment + one segment per writer, at every moment (README, Guarantees).

    Eviction counts the published rows of open segments too, and a writer publishes before it
    orders its next segment: counting sealed segments only let two writers in step overshoot
    (2,416-2,434 rows here, bound 2,384)."""
    path = tmp_path / "s"
    mmreplay.create_store(path, SCHEMA, capacity=2000, segment_records=128).close()
    store = mmreplay.open_store(path, mode="a")
    reader = mmreplay.open_store(path)
    writers = [store.writer(lanes=1, publish_rows=64) for _ in range(2)]
    bound, worst = 2000 + (1 + 2) * 128, 0
    for i in range(3000 + lag):
        for k, w in enumerate(writers, 1):
            seq = i - lag * (k - 1)
            if seq >= 0:
                w.add(obs=np.array([[k, seq, 0]], np.float32), action=np.array([seq], np.int64),
                      reward=np.array([k], np.float32), terminated=np.array([False]), truncated=np.array([False]))
        time.sleep(5e-5)  # lets the background segment maker run between rows, as in real actors
        if i % 16 == 0:
            reader.refresh()
            worst = max(worst, reader.num_rows)
    worst = _close_all(writers, reader, worst)
    assert 2000 <= reader.num_rows and worst <= bound and store.info()["evicted_segments"] > 0
    reader.close()
    store.close()


@pytest.mark.parametrize("n_writers", [1, 2])
def test_default_segments_keep_a_full_store_near_its_capacity(tmp_path, n_writers):
    """With default segment sizes, a full store holds between capacity and 1.25 x capacity +
    (writers + 1) x 1,024 rows at every moment: segments follow the capacity (not ~32 MiB each,
    which kept 5x the rows asked for a small capacity)."""
    cap, lanes = 16_000, 8
    path = tmp_path / "s"
    mmreplay.create_store(path, SCHEMA, capacity=cap, writers=n_writers).close()
    store = mmreplay.open_store(path, mode="a")
    reader = mmreplay.open_store(path)
    assert store.segment_records == cap // (4 * (n_writers + 1)) + 1024  # as large as the bound allows
    writers = [store.writer(lanes=lanes) for _ in range(n_writers)]
    bound, worst = 1.25 * cap + (n_writers + 1) * 1024, 0
    zeros = np.zeros(lanes, bool)
    for i in range(3 * cap // lanes // n_writers):
        for k, w in enumerate(writers):
            w.add(obs=np.full((lanes, 3), i, np.float32), action=np.full(lanes, k, np.int64),
                  reward=np.ones(lanes, np.float32), terminated=zeros, truncated=zeros)
        if i % 64 == 0:
            time.sleep(1e-3)  # lets the background segment makers run, as between real env steps
            reader.refresh()
            worst = max(worst, reader.num_rows)
    worst = _close_all(writers, reader, worst)
    assert cap <= reader.num_rows and worst <= bound, (reader.num_rows, worst, bound)
    assert store.info()["evicted_segments"] > 0
    reader.close()
    store.close()
