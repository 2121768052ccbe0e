"""Damage at the file system's own units: zeroed pages, whole files missing or misnamed, a lost
catalog, and a dead writer's open segment. What the store kept, it keeps: no file that may hold
rows is removed, no row that verifies is lost, every row not served is reported."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import mmreplay
from mmreplay.cli.main import main as cli
from mmreplay.storage.format import CONTROL_OFFSET, CONTROL_SLOT_SIZE, PAGE_SIZE, read_control
from mmreplay.testing.damage import served_ids

SCHEMA = mmreplay.Schema.transition(obs_shape=(4,), obs_dtype=np.float32)
R = 64


def _rows(t: np.ndarray) -> dict[str, np.ndarray]:
    t = np.asarray(t, np.float32)
    return {"obs": np.stack([t, 0 * t, 8 * t + 1, 0 * t], 1)[:, None], "action": t.astype(np.int64)[:, None],
            "reward": t[:, None], "terminated": (t % 13 == 12)[:, None], "truncated": np.zeros((len(t), 1), bool)}


def _sealed(path: Path, segments: int = 4) -> None:
    s = mmreplay.create_store(path, SCHEMA, capacity=100_000, segment_records=R)
    with s.writer(lanes=1) as w:
        w.add_batch(_rows(np.arange(segments * R)))
    s.close()


def _segs(path: Path) -> list[Path]:
    return sorted((path / "segments").glob("*.seg"))


def _values(path: Path) -> dict[int, float]:
    """Served row id -> its obs[0] (the step number it was written with)."""
    with mmreplay.open_store(path) as s:
        ids = served_ids(s)
        return dict(zip(ids.tolist(), s.rows("obs", ids)[:, 0].tolist())) if len(ids) else {}


def _dead_writer_copy(tmp_path: Path, *, synced: int, published: int) -> tuple[Path, mmreplay.ReplayStore]:
    """A store whose writer wrote ``published`` rows into its open segment (the first ``synced`` made
    durable by ``flush``) and is still open; returns a copy of its files (what a ``kill -9`` leaves:
    the page cache) and the live store, to close."""
    live = tmp_path / "live"
    s = mmreplay.create_store(live, SCHEMA, capacity=100_000, segment_records=R)
    w = s.writer(lanes=1, publish_rows=1)
    for t in range(published):
        w.add(**{k: v[0] for k, v in _rows(np.array([t])).items()})
        if t + 1 == synced:
            w.flush()
    w.publish()
    copy = tmp_path / "dead"
    shutil.copytree(live, copy, ignore=shutil.ignore_patterns("*.lock"))
    return copy, s


def _flip(path: Path, off: int, mask: int = 0x40) -> None:
    with open(path, "r+b") as fh:
        fh.seek(off)
        b = fh.read(1)[0]
        fh.seek(off)
        fh.write(bytes([b ^ mask]))


def test_a_zeroed_header_and_control_page_never_delete_a_sealed_segment(tmp_path):
    """(issue 53 item 1) The first two pages of a sealed segment zeroed: its rows are kept (its header
    rebuilt from its session), never removed as "made ahead of need"; without a session to rebuild
    from, the file is quarantined and its rows counted lost, never deleted."""
    path = tmp_path / "s"
    _sealed(path)
    want = _values(path)
    victim = _segs(path)[2]
    with open(victim, "r+b") as fh:
        fh.write(bytes(2 * PAGE_SIZE))
    r = CliRunner().invoke(cli, ["verify", str(path)])
    assert r.exit_code == 1 and victim.name in r.output and "64 rows are not served" in r.output
    r = CliRunner().invoke(cli, ["verify", str(path), "--repair"])
    assert r.exit_code == 0 and "rebuilt the header" in r.output and "removed" not in r.output, r.output
    assert victim.exists() and _values(path) == want
    assert CliRunner().invoke(cli, ["verify", str(path)]).exit_code == 0
    # one segment of its own session: nothing to rebuild from; kept as .corrupt and reported
    one = tmp_path / "one"
    _sealed(one, segments=1)
    with open(_segs(one)[0], "r+b") as fh:
        fh.write(bytes(2 * PAGE_SIZE))
    with mmreplay.open_store(one, mode="a") as s:  # a writable open removes nothing
        assert _segs(one) and len(s) == 0
    r = CliRunner().invoke(cli, ["verify", str(one), "--repair"])
    assert r.exit_code == 1 and "quarantined" in r.output and "64 rows no longer served" in r.output
    assert [p.name for p in (one / "segments").iterdir()] == ["0000000000000-w000.seg.corrupt"]


def test_a_segment_file_that_never_held_a_row_is_removed(tmp_path):
    """A file whose creation never reached the disk (all zeros, or empty) that no sealed line names
    and whose stamps show no row: an unfinished creation, removed with a record of why."""
    path = tmp_path / "s"
    _sealed(path, segments=2)
    lay = mmreplay.open_store(path).layout
    (path / "segments" / "0000000000009-w000.seg").write_bytes(bytes(lay.file_size))
    (path / "segments" / "0000000000010-w001.seg").write_bytes(b"")
    with mmreplay.open_store(path, mode="a") as s:
        report = s.recovery_report
        assert sorted(report.cleaned) == ["0000000000009-w000.seg", "0000000000010-w001.seg"]
        assert len(s) == 2 * R and s.verify() == []


def test_two_swapped_segment_files_are_renamed_and_cost_nothing(tmp_path):
    """(item 6) Two sealed files swapped by name: served by their headers' ids, renamed back by the
    repair (through temporary names), no row lost."""
    path = tmp_path / "s"
    _sealed(path)
    want = _values(path)
    a, b = _segs(path)[1], _segs(path)[2]
    a.rename(a.with_name("x"))
    b.rename(a)
    a.with_name("x").rename(b)
    assert _values(path) == want  # read-only: rows by the ids their headers give
    assert {p.fix for p in mmreplay.open_store(path).verify()} == {"rename"}
    r = CliRunner().invoke(cli, ["verify", str(path), "--repair"])
    assert r.exit_code == 0 and "renamed" in r.output and "0 lost" in r.output and "quarantined " not in r.output
    assert _values(path) == want and CliRunner().invoke(cli, ["verify", str(path)]).exit_code == 0
    # a copy under another segment's name: set aside, the rows are served from the original
    shutil.copy(_segs(path)[1], path / "segments" / "0000000000077-w000.seg")
    r = CliRunner().invoke(cli, ["verify", str(path), "--repair"])
    assert r.exit_code == 0 and _values(path) == want and list((path / "segments").glob("*.dup.corrupt"))


def test_a_lost_catalog_and_a_lost_segment_are_named(tmp_path):
    """(item 7) CATALOG.log deleted and a sealed segment deleted: verify names both (the chain of the
    writer's session has a hole), the repair rebuilds the catalog and counts the rows lost."""
    path = tmp_path / "s"
    _sealed(path, segments=5)
    (path / "CATALOG.log").unlink()
    _segs(path)[2].unlink()
    r = CliRunner().invoke(cli, ["verify", str(path)])
    assert r.exit_code == 1 and "CATALOG.log: missing" in r.output and "chain position 2 (64 rows" in r.output
    r = CliRunner().invoke(cli, ["verify", str(path), "--repair"])
    assert r.exit_code == 1 and "64 lost" in r.output, r.output
    r = CliRunner().invoke(cli, ["verify", str(path)])
    assert r.exit_code == 0, r.output
    assert (path / "CATALOG.log").exists()


def test_a_cut_catalog_is_rewritten_and_a_hole_it_hid_is_named(tmp_path):
    """The catalog cut mid-line (a power loss during an append) is a problem; a segment gone with the
    lines that named it is found by its session's chain."""
    path = tmp_path / "s"
    _sealed(path, segments=4)
    log = path / "CATALOG.log"
    data = log.read_bytes()
    keep = data.index(b"\n") + 10
    log.write_bytes(data[:keep])  # cut mid-line: the lines of segments 1 to 3 are gone
    _segs(path)[2].unlink()
    problems = {p.fix for p in mmreplay.open_store(path).verify()}
    assert problems == {"catalog", "gap"}
    r = CliRunner().invoke(cli, ["verify", str(path), "--repair"])
    assert "64 lost" in r.output and "rewrote CATALOG.log" in r.output
    assert CliRunner().invoke(cli, ["verify", str(path)]).exit_code == 0


def test_a_damaged_durable_row_in_a_dead_writers_open_segment_is_masked(tmp_path):
    """(item 2) Recovery checks a dead writer's open segment from row 0: a durable row damaged since
    is masked and reported, never served changed."""
    dead, live = _dead_writer_copy(tmp_path, synced=20, published=40)
    try:
        lay = live.layout
        seg = _segs(dead)[0]
        _flip(seg, lay.column("obs").offset + 5 * lay.record_bytes)  # row 5 < synced
        with mmreplay.open_store(dead, mode="a") as s:
            rep = s.recovery_report
            assert rep.masked == {seg.name: 1} and rep.rows_lost == 0
            vals = _values(dead)
            assert 5 not in vals and len(vals) == 39 and all(vals[i] == i for i in vals)
            assert [p.fix for p in s.verify()] == ["mask"]  # reported until a repair acknowledges it
    finally:
        live.close()


def test_a_damaged_control_slot_of_a_dead_writers_segment_costs_no_published_row(tmp_path):
    """(item 3) One control slot of a dead writer's open segment damaged: the other (older) one
    holds fewer rows; the count comes from the stamps and every published row is kept."""
    dead, live = _dead_writer_copy(tmp_path, synced=0, published=50)
    try:
        seg = _segs(dead)[0]
        page = seg.read_bytes()[CONTROL_OFFSET : CONTROL_OFFSET + 2 * CONTROL_SLOT_SIZE]
        _, current = read_control(page)
        _flip(seg, CONTROL_OFFSET + current * CONTROL_SLOT_SIZE + 9)  # the newer slot's committed count
        with mmreplay.open_store(dead, mode="a") as s:
            assert s.recovery_report.rows_lost == 0
            assert sorted(_values(dead)) == list(range(50))
    finally:
        live.close()


@pytest.mark.parametrize("row", [3, 25])
def test_one_torn_row_of_a_dead_writers_segment_costs_that_row_alone(tmp_path, row):
    """(item 4) A flipped byte in a published, not yet synced row: that row is lost (torn, counted),
    every row after it whose stamp verifies is kept."""
    dead, live = _dead_writer_copy(tmp_path, synced=2, published=40)
    try:
        lay = live.layout
        seg = _segs(dead)[0]
        _flip(seg, lay.column("obs").offset + row * lay.record_bytes + 1)
        with mmreplay.open_store(dead, mode="a") as s:
            rep = s.recovery_report
            assert rep.rows_lost == 1 and rep.masked == {}
            vals = _values(dead)
            assert sorted(vals) == [i for i in range(40) if i != row] and all(vals[i] == i for i in vals)
            assert s.verify() == []  # the torn row is acknowledged (recovery reported it lost)
    finally:
        live.close()


def test_read_only_opens_never_serve_a_torn_row_of_a_dead_writer(tmp_path):
    """A dead writer's open segment is checked before a reader serves it (a power loss may have torn
    rows it published): damaged rows are left out, the rest served."""
    dead, live = _dead_writer_copy(tmp_path, synced=0, published=40)
    try:
        lay = live.layout
        seg = _segs(dead)[0]
        _flip(seg, lay.column("obs").offset + 7 * lay.record_bytes + 2)
        vals = _values(dead)
        assert 7 not in vals and sorted(vals) == [i for i in range(40) if i != 7] and all(vals[i] == i for i in vals)
    finally:
        live.close()


def test_a_row_changed_while_its_segment_is_open_is_found_at_seal(tmp_path, caplog):
    """(item 8) A row changed in the file while its writer still writes the segment: the writer's
    check at seal finds it, so no reader trusts the seal for it (masked everywhere, listed by verify)."""
    from mmreplay.storage import check_kernel  # noqa: F401 - the compiled check loaded: the writer checks at seal

    path = tmp_path / "s"
    s = mmreplay.create_store(path, SCHEMA, capacity=100_000, segment_records=R)
    w = s.writer(lanes=1, publish_rows=1)
    for t in range(30):
        w.add(**{k: v[0] for k, v in _rows(np.array([t])).items()})
    lay = s.layout
    _flip(_segs(path)[0], lay.column("obs").offset + 11 * lay.record_bytes + 1)  # not through the writer
    for t in range(30, R + 5):  # the segment fills and is sealed
        w.add(**{k: v[0] for k, v in _rows(np.array([t])).items()})
    w.close()
    assert "changed in the file after this writer wrote them" in caplog.text
    s.refresh()
    with pytest.raises(KeyError, match="masked"):
        s.rows("obs", np.array([11]))  # this handle's own reader masks it too
    s.close()
    vals = _values(path)
    assert 11 not in vals and len(vals) == R + 4 and all(vals[i] == i for i in vals)
    with mmreplay.open_store(path) as r:
        assert [(p.file, p.rows) for p in r.verify()] == [(_segs(path)[0].name, ((11, 12),))]


def test_a_writable_open_beside_a_live_writer_finds_nothing_odd(tmp_path, caplog):
    """Before its first segment is sealed a store has no catalog: a second writable open (another
    collect worker) must not call that missing, nor touch the live writer's segments."""
    s = mmreplay.create_store(tmp_path / "s", SCHEMA, capacity=100_000, segment_records=R)
    w = s.writer(lanes=1)
    w.add(**{k: v[0] for k, v in _rows(np.array([0])).items()})
    w.publish()
    with mmreplay.open_store(tmp_path / "s", mode="a") as other:
        assert not other.recovery_report and other.recovery_report.lines() == []
    assert "recovery" not in caplog.text
    w.close()
    s.close()
    assert _values(tmp_path / "s") == {0: 0.0}
