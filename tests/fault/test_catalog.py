"""The segment catalog: a lost segment is not an eviction, evictions say why, and the catalog
survives kill -9 at any point of its own updates."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _children import SCHEMA, content
from click.testing import CliRunner
from mmreplay.cli.main import main

import mmreplay
from mmreplay.storage.catalog import Catalog

CHILD = str(Path(__file__).resolve().parents[1] / "_children.py")


def _write(path: Path, key: int, rows: int, failpoint: str | None = None) -> int:
    env = {**os.environ, "MMREPLAY_FAILPOINT": failpoint or ""}
    out = subprocess.run([sys.executable, CHILD, "writer", str(path), str(key), str(rows)], env=env,
                         capture_output=True, text=True, timeout=60)
    return out.returncode


@pytest.fixture
def filled(tmp_path) -> Path:
    mmreplay.create_store(tmp_path / "s", SCHEMA, capacity=10_000, segment_records=16).close()
    assert _write(tmp_path / "s", 1, 80) == 0  # 5 sealed segments
    return tmp_path / "s"


def test_a_deleted_segment_is_lost_not_evicted(filled, caplog):
    victim = sorted((filled / "segments").iterdir())[1]
    victim.unlink()
    with caplog.at_level(logging.WARNING), mmreplay.open_store(filled) as st:  # open_store warns
        assert st.lost_segments() == {victim.name: 16}
        info = st.info()
    assert victim.name in caplog.text and "lost" in caplog.text
    assert info["lost_segments"] == {victim.name: 16} and info["evicted_segments"] == 0
    r = CliRunner().invoke(main, ["verify", str(filled)])
    assert r.exit_code == 1 and f"{victim.name}: lost" in r.output and "16 rows" in r.output
    r = CliRunner().invoke(main, ["verify", str(filled), "--repair"])
    # rows were lost: the repair says how many and exits 1; acknowledged, they are no longer a problem
    assert f"acknowledged the loss of {victim.name} (16 rows)" in r.output and "16 lost" in r.output
    assert r.exit_code == 1
    assert CliRunner().invoke(main, ["verify", str(filled), "--repair"]).exit_code == 0  # nothing left to do
    assert CliRunner().invoke(main, ["verify", str(filled)]).exit_code == 0


def test_truncated_and_empty_segment_files_are_reported_by_name(filled):
    a, b = sorted((filled / "segments").iterdir())[:2]
    with open(a, "r+b") as fh:
        fh.truncate(a.stat().st_size // 2)
    b.write_bytes(b"")
    r = CliRunner().invoke(main, ["verify", str(filled)])
    assert r.exit_code == 1 and a.name in r.output and b.name in r.output


def test_evictions_are_recorded_with_their_reason(tmp_path):
    mmreplay.create_store(tmp_path / "s", SCHEMA, capacity=32, segment_records=16).close()
    assert _write(tmp_path / "s", 1, 120) == 0
    with mmreplay.open_store(tmp_path / "s", mode="a") as st:
        assert st.info()["evictions"].get("capacity", 0) >= 3 and st.lost_segments() == {}
        st.files.evict_for_new_segment(force_one=True)  # what a full disk does with on_full="evict"
        assert st.info()["evictions"]["disk"] == 1 and st.lost_segments() == {}
    assert "for capacity" in CliRunner().invoke(main, ["info", str(tmp_path / "s")]).output


def test_an_eviction_whose_departure_a_power_loss_lost_is_recorded_by_recovery(filled):
    """An eviction renames a file ``.deleted`` after an unsynced departure line and unlinks it
    only once the catalog is fsynced. After a power loss that kept the rename but not the line,
    recovery records the departure before it removes the file: an eviction, not a loss."""
    victim = sorted((filled / "segments").iterdir())[1]
    victim.rename(victim.with_name(victim.name + ".deleted"))  # the rename survived, the line did not
    with mmreplay.open_store(filled, mode="a") as st:
        assert st.lost_segments() == {} and st.info()["evictions"].get("capacity") == 1
    assert not list((filled / "segments").glob("*.deleted"))
    assert CliRunner().invoke(main, ["verify", str(filled)]).exit_code == 0


def test_a_writers_evictions_leave_no_file_behind_and_every_departure_synced(tmp_path, monkeypatch):
    """A writer's evicted files are unlinked in the background, each only after a catalog fsync
    that follows its departure line; closing the writer leaves none behind."""
    mmreplay.create_store(tmp_path / "s", SCHEMA, capacity=32, segment_records=16).close()
    events = []
    from mmreplay.core import fs

    real_sync, real_unlink = Catalog.sync, fs.unlink
    monkeypatch.setattr(Catalog, "sync", lambda self: events.append("sync") or real_sync(self))
    monkeypatch.setattr(fs, "unlink", lambda path, **k: (events.append("unlink") if str(path).endswith(
        ".deleted") else None) or real_unlink(path, **k))
    st = mmreplay.open_store(tmp_path / "s", mode="a")
    w = st.writer(lanes=1)
    for _ in range(16 * 8):
        w.add(**{f.name: np.zeros((1, *f.shape), f.dtype) for f in SCHEMA.fields})
    w.close()
    assert events.count("unlink") >= 4 and events[0] == "sync"  # the first unlink follows a sync
    assert all("sync" in events[:i] for i, e in enumerate(events) if e == "unlink")
    assert not list((tmp_path / "s" / "segments").glob("*.deleted"))
    assert st.lost_segments() == {} and st.info()["evictions"]["capacity"] >= 4
    st.close()


@pytest.mark.parametrize("point", ["catalog_torn_line", "catalog_after_departure"])
def test_catalog_survives_kill_9_during_its_own_updates(tmp_path, point):
    """Killed with a half-written catalog line, or between an eviction's catalog line and its
    rename: no segment reads as lost, and the catalog stays readable and complete."""
    mmreplay.create_store(tmp_path / "s", SCHEMA, capacity=32, segment_records=16).close()
    assert _write(tmp_path / "s", 1, 200, failpoint=point) == -9
    assert _write(tmp_path / "s", 2, 40) == 0  # the next writer recovers, seals, catalogues, evicts
    with mmreplay.open_store(tmp_path / "s", mode="a") as st:
        problems = st.verify()
        state = Catalog(tmp_path / "s").read()
        sealed_files = {p.name for p in (tmp_path / "s" / "segments").iterdir()}
        assert sealed_files <= set(state.live)  # every present segment is catalogued
        assert st.lost_segments() == {}
        if point == "catalog_torn_line":
            assert state.torn_lines == 1
            lines = (tmp_path / "s" / "CATALOG.log").read_bytes().splitlines()
            assert all(json.loads(ln[9:]) for ln in lines[1:] if ln.strip())  # appends after the tear parse alone
            # a cut line is a problem verify names (nothing else is), and a repair rewrites the log without it
            assert [(p.file, p.fix) for p in problems] == [("CATALOG.log", "catalog")], problems
            rep = st.repair()
            assert rep.rows_cost == 0 and rep.problems == [] and st.verify() == []
            assert Catalog(tmp_path / "s").read().torn_lines == 0
        else:
            assert problems == []


def test_catalog_survives_kill_9_during_an_export(filled, tmp_path):
    """An export only reads the store: killed mid-way, the catalog is untouched and nothing is lost."""
    before = (filled / "CATALOG.log").read_bytes()
    code = "import sys, mmreplay.archive as a; a.export_archive(sys.argv[1], sys.argv[2])"
    env = {**os.environ, "MMREPLAY_FAILPOINT": "archive_before_commit:2"}
    p = subprocess.run([sys.executable, "-c", code, str(filled), str(tmp_path / "a.zarr")], env=env,
                       capture_output=True, timeout=120)
    assert p.returncode == -9, p.stderr.decode()
    assert (filled / "CATALOG.log").read_bytes() == before
    with mmreplay.open_store(filled, mode="a") as st:
        assert st.lost_segments() == {} and st.verify() == []


def test_a_full_disk_is_said_out_loud(tmp_path, caplog, monkeypatch):
    """Evicting for disk space warns once and is counted apart in info."""

    mmreplay.create_store(tmp_path / "s", SCHEMA, capacity=10_000, segment_records=16).close()
    assert _write(tmp_path / "s", 1, 80) == 0
    st = mmreplay.open_store(tmp_path / "s", mode="a")
    w = st.writer(lanes=1)
    w.release_spares()
    real, calls = os.posix_fallocate, [0]

    def full_once(*args):
        calls[0] += 1
        if calls[0] == 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*args)

    monkeypatch.setattr(os, "posix_fallocate", full_once)
    with caplog.at_level(logging.WARNING):
        for seq in range(40):  # a roll: the first allocation fails, the oldest segment goes, the retry works
            w.add(obs=np.array([[2, seq, content(2, seq)]], np.float32), action=np.array([seq]),
                  reward=np.array([2], np.float32), terminated=np.array([False]), truncated=np.array([False]))
    monkeypatch.undo()
    w.close()
    assert caplog.text.count("the disk is full") == 1
    assert st.info()["evictions"] == {"disk": 1} and st.lost_segments() == {}
    st.close()
    r = subprocess.run([sys.executable, "-m", "mmreplay", "info", str(tmp_path / "s")], capture_output=True, text=True)
    assert "1 for disk" in r.stdout


def test_a_large_catalog_is_compacted_and_keeps_what_it_says(tmp_path, monkeypatch):
    """Small segments come and go: past its size limit the log is rewritten with the live
    segments, their checks and one count of evictions per reason, and still tells a lost segment
    from an evicted one."""
    monkeypatch.setattr(Catalog.compact_if_large, "__defaults__", (2048,))  # bytes, for the test
    path = tmp_path / "s"
    with mmreplay.create_store(path, SCHEMA, capacity=64, segment_records=16) as s:
        w = s.writer(lanes=1)
        for seq in range(2000):
            w.add(obs=np.array([[1, seq, content(1, seq)]], np.float32), action=np.array([seq], np.int64),
                  reward=np.array([1], np.float32), terminated=np.array([False]), truncated=np.array([False]))
        w.close()
        state = Catalog(path).read()
        assert path.joinpath("CATALOG.log").stat().st_size < 2 * 2048 + 4096  # compacted, not ~1,000 lines
        assert state.evicted["capacity"] == s.info()["evicted_segments"] > 100
        live = set(state.live)
        assert live == {p.name for p in (path / "segments").glob("*.seg")} and s.lost_segments() == {}
        assert all(state.checks[n].identity for n in live)  # the writer's checks survive the rewrite
    victim = sorted((path / "segments").glob("*.seg"))[0]
    victim.unlink()
    with mmreplay.open_store(path, mode="r") as s:
        assert s.lost_segments() == {victim.name: 16}
