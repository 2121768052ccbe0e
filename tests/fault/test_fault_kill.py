"""kill -9 and named failpoints: what survives a writer killed at any moment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _children import SCHEMA, check_rows
from click.testing import CliRunner

import mmreplay
from mmreplay.cli.main import main as cli
from mmreplay.storage.format import MASKED

CHILD = str(Path(__file__).resolve().parents[1] / "_children.py")


def visible_rows(path) -> dict[int, np.ndarray]:
    """Every visible row, checked for content, as sorted sequence numbers per writer key."""
    s = mmreplay.open_store(path, mode="r")
    r = s.reader
    snap = r.snapshot
    per: dict[int, list] = {}
    for k in range(len(snap.segment_ids)):
        w, n = int(snap.windows[k]), int(snap.committed[k])
        served = r.is_last[w, :n] != MASKED  # masked rows (damaged, or torn by a power loss) are never served
        obs = r.columns["obs"][w, :n][served]
        why = check_rows(obs, r.columns["action"][w, :n][served], r.columns["reward"][w, :n][served],
                         r.columns["terminated"][w, :n][served])
        assert why is None, why
        for key in np.unique(obs[:, 0]).astype(int):
            per.setdefault(int(key), []).append(obs[obs[:, 0] == key, 1].astype(np.int64))
    s.close()
    return {k: np.sort(np.concatenate(v)) for k, v in per.items()}


def assert_prefix(seqs: np.ndarray, at_least: int, evicted_ok: bool = False) -> None:
    """The visible rows of one writer are an exact run of sequence numbers (a prefix unless the
    oldest were evicted), with no duplicate and no hole, ending at or after ``at_least``."""
    assert len(np.unique(seqs)) == len(seqs), "duplicate rows"
    if len(seqs):
        assert (np.diff(seqs) == 1).all(), "hole in a writer's rows"
        assert evicted_ok or seqs[0] == 0
    assert (seqs[-1] + 1 if len(seqs) else 0) >= at_least, f"acknowledged rows lost: {len(seqs)} < {at_least}"


def run_writer(path, key, rows, failpoint=None, durability="segment", timeout=60, lanes=1):
    env = {**os.environ, "MMREPLAY_FAILPOINT": failpoint or ""}
    out = subprocess.run([sys.executable, CHILD, "writer", str(path), str(key), str(rows), durability, "1", str(lanes)],
                         env=env, capture_output=True, text=True, timeout=timeout)
    acked = len(out.stdout.split())
    return out.returncode, acked, out.stderr


@pytest.fixture
def small_store(tmp_path):
    s = mmreplay.create_store(tmp_path / "s", SCHEMA, capacity=10_000, segment_records=16)
    s.close()
    return tmp_path / "s"


@pytest.mark.parametrize(
    ("point", "expect", "acks"),
    [
        ("after_payload:5", 4, 4),  # row 4 copied, not stamped: absent
        ("after_stamps:5", 4, 4),  # row 4 stamped, never published: absent
        ("after_publish:5", 5, 4),  # row 4 published, killed before its ack: present
        ("mid_seal:1", 16, 15),  # the full segment was published, sealing interrupted
        ("mid_seal:2", 32, 31),
    ],
)
def test_failpoints_on_the_append_path(small_store, point, expect, acks):
    rc, acked, err = run_writer(small_store, 1, 100, point)
    assert rc == -signal.SIGKILL, err
    assert acked == acks
    s = mmreplay.open_store(small_store, mode="a")  # recovery runs here
    assert s.verify() == []
    s.close()
    rows = visible_rows(small_store)
    assert len(rows[1]) == expect
    assert_prefix(rows[1], expect)
    # the writer id is free again at once, and a new session appends after the recovered rows
    rc, acked2, err = run_writer(small_store, 2, 10)
    assert rc == 0, err
    assert len(visible_rows(small_store)[2]) == 10


@pytest.mark.parametrize(
    ("point", "expect"),
    [
        ("after_payload:5", (4, 4, 4)),  # step 4 copied into every lane's segment, not stamped: absent
        ("after_stamps:14", (5, 4, 4)),  # step 4: lane 0's group stamped and published, lane 1's stamped only
        ("after_publish:14", (5, 5, 4)),  # lanes 0 and 1 published, lane 2 not yet
        ("mid_seal:2", (16, 16, 16)),  # every lane's full segment published, the second seal interrupted
    ],
)
def test_failpoints_with_lane_segments(small_store, point, expect):
    """A writer of 3 lanes with lane segments (a chain per lane), killed mid-append: every lane
    keeps an exact prefix of its rows, each lane at least every acknowledged step; lanes may end
    one commit group apart (each lane's chain is published on its own), never more."""
    rc, acked, err = run_writer(small_store, 1, 100, point, lanes=3)
    assert rc == -signal.SIGKILL, err
    s = mmreplay.open_store(small_store, mode="a")  # recovery runs here
    assert s.verify() == []
    assert {s.reader.segments[k].header.lanes for k in s.reader.segments} == {1}
    s.close()
    rows = visible_rows(small_store)
    assert tuple(len(rows.get(100 + j, ())) for j in range(3)) == expect
    for j in range(3):
        assert_prefix(rows[100 + j], acked)
    rc, acked2, err = run_writer(small_store, 2, 10, lanes=3)  # a new session appends after the recovered rows
    assert rc == 0, err
    assert [len(visible_rows(small_store)[200 + j]) for j in range(3)] == [10, 10, 10]


@pytest.mark.parametrize("point", ["after_fallocate:2", "before_rename:2", "after_fallocate:3", "before_rename:4"])
def test_failpoints_while_allocating_segments(small_store, point):
    rc, acked, err = run_writer(small_store, 1, 200, point)
    assert rc == -signal.SIGKILL, err
    s = mmreplay.open_store(small_store, mode="a")
    assert s.verify() == []
    assert not [n for n in os.listdir(small_store / "segments") if n.endswith(".tmp")]
    s.close()
    assert_prefix(visible_rows(small_store).get(1, np.zeros(0, np.int64)), acked)


def test_failpoint_mid_evict_is_finished_on_open(tmp_path):
    s = mmreplay.create_store(tmp_path / "s", SCHEMA, capacity=32, segment_records=16)
    s.close()
    rc, acked, err = run_writer(tmp_path / "s", 1, 200, "mid_evict:1")
    assert rc == -signal.SIGKILL, err
    assert [n for n in os.listdir(tmp_path / "s" / "segments") if n.endswith(".deleted")]
    # read-only verify: the leftover is a note (the next writable open finishes it), not a problem
    r = CliRunner().invoke(cli, ["verify", str(tmp_path / "s")])
    assert r.exit_code == 0 and "note:" in r.output and "interrupted eviction" in r.output, r.output
    s = mmreplay.open_store(tmp_path / "s", mode="a")
    assert s.verify() == []
    assert not [n for n in os.listdir(tmp_path / "s" / "segments") if n.endswith(".deleted")]
    s.close()
    assert_prefix(visible_rows(tmp_path / "s")[1], acked, evicted_ok=True)


def test_kill9_at_random_moments(small_store):
    """A killed writer, in miniature (the torture test below runs the full version)."""
    rng = np.random.default_rng(7)
    for key in range(1, 11):
        p = subprocess.Popen([sys.executable, CHILD, "writer", str(small_store), str(key), "100000"],
                             stdout=subprocess.PIPE, text=True)
        acked = 0
        target = int(rng.integers(1, 400))
        while acked < target:
            line = p.stdout.readline()
            if not line:
                break
            acked += 1
        time.sleep(float(rng.uniform(0, 0.01)))
        p.kill()
        acked += len(p.stdout.read().split())
        p.wait()
        with mmreplay.open_store(small_store) as s:  # read-only, before any recovery: nothing is wrong
            assert s.verify() == []
        s = mmreplay.open_store(small_store, mode="a")
        assert s.verify() == []
        s.close()
        assert_prefix(visible_rows(small_store)[key], acked)
