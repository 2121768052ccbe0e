"""An archive knows what it holds: each segment's chunks are recorded at export (the chunk
manifest), so a missing chunk (which zarr reads as its fill value) or a damaged one costs that
segment's rows, masked and reported, never zeros served and never the rest of the archive."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

import mmreplay
from mmreplay.cli.main import main as cli

R = 64
SCHEMA = mmreplay.Schema.transition(obs_shape=(4,), obs_dtype=np.float32)


@pytest.fixture
def archived(tmp_path) -> tuple[Path, Path]:
    """A store of 5 sealed segments of one writer (obs[0] = the step, never 0 but in the first row), one row of
    segment 2 damaged (archived masked), and its archive."""
    path = tmp_path / "s"
    s = mmreplay.create_store(path, SCHEMA, capacity=100_000, segment_records=R)
    with s.writer(lanes=1) as w:
        t = np.arange(5 * R, dtype=np.float32)
        w.add_batch(obs=np.stack([t, t + 1, 2 * t, 0 * t + 7], 1)[:, None], action=t.astype(np.int64)[:, None],
                    reward=t[:, None], terminated=(t % 13 == 12)[:, None], truncated=np.zeros((len(t), 1), bool))
    lay = s.layout
    s.close()
    seg2 = sorted((path / "segments").glob("*.seg"))[2]  # a damaged row there: segment 2's `masked` chunk is not all False
    with open(seg2, "r+b") as fh:
        fh.seek(lay.column("obs").offset + 5 * lay.record_bytes)
        fh.write(b"\xff\xff")
    url = tmp_path / "a.zarr"
    assert mmreplay.export_archive(path, url).damaged_rows == 1
    return path, url


def _chunk(url: Path, array: str, o: int) -> Path:
    two_d = array.startswith("fields/") or array == "segment_table"  # (its chunk keys have a second index)
    return url.joinpath(*array.split("/"), "c", str(o), *(["0"] if two_d else []))


def _served(path: Path) -> dict[int, np.ndarray]:
    from mmreplay.testing.damage import served_ids

    with mmreplay.open_store(path) as s:
        ids = served_ids(s)
        return dict(zip(ids.tolist(), s.rows("obs", ids))) if len(ids) else {}


@pytest.mark.parametrize("array", ["fields/obs", "is_last", "episode", "masked"])
def test_a_missing_chunk_costs_its_segment_never_zeros_served(archived, tmp_path, array, caplog):
    """(issue 54 item 1) A chunk deleted from the archive: the import goes on, the segment's rows
    are masked and reported by segment and count; every other row is served as archived."""
    src, url = archived
    _chunk(url, array, 2).unlink()
    want = _served(src)
    rep = mmreplay.import_archive(url, tmp_path / "back")
    assert list(rep.masked) == [2] and rep.rows_masked == R and "missing or damaged" in rep.masked[2][1]
    assert any(f"segment 2: {R} rows masked" in r.message for r in caplog.records)
    got = _served(tmp_path / "back")
    assert set(got) == set(want) - set(range(2 * R, 3 * R))
    assert all(np.array_equal(got[i], want[i]) for i in got)  # no zeros served: only rows as archived
    with mmreplay.open_store(tmp_path / "back") as back:
        assert back.check_counts()["damaged_rows"] == R  # (the segment's damaged row among them)
    # open_archive samples only rows as archived
    with mmreplay.open_archive(url) as arc:
        b = mmreplay.UniformSampler(arc, seed=3).sample(256)
        assert not np.isin(b.ids, np.arange(2 * R, 3 * R)).any()
        np.testing.assert_array_equal(b.obs, np.stack([want[i] for i in b.ids]))
    r = CliRunner().invoke(cli, ["verify", str(url)])
    assert r.exit_code == 1 and "segment 2" in r.output and array in r.output


def test_a_damaged_chunk_stops_nothing_and_a_rerun_completes_what_it_can(archived, tmp_path):
    """(item 2) One flipped byte in one chunk: the import goes past it (that segment masked), and a
    rerun has nothing left to do; a damaged segment table row costs that segment, skipped and tried again."""
    src, url = archived
    p = _chunk(url, "fields/obs", 1)
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    p.write_bytes(bytes(raw))
    rep = mmreplay.import_archive(url, tmp_path / "back")
    assert list(rep.masked) == [1] and "crc32c" in rep.masked[1][1] and rep.segments == 5
    assert mmreplay.import_archive(url, tmp_path / "back").segments_written == 0  # nothing left to do
    # the segment table's chunk (all 5 rows) missing: every segment skipped and reported, none imported
    _chunk(url, "segment_table", 0).unlink()
    rep = mmreplay.import_archive(url, tmp_path / "back2")
    assert rep.segments_written == 0 and sorted(rep.skipped) == [0, 1, 2, 3, 4]
    assert "segment table row" in rep.skipped[0]


def test_field_stats_and_shipping_leave_out_a_segment_with_a_missing_chunk(archived, tmp_path):
    src, url = archived
    full = mmreplay.field_stats(url, cache=False)
    _chunk(url, "fields/obs", 3).unlink()
    part = mmreplay.field_stats(url, cache=False)
    assert part.count < full.count and part.min[3] == 7  # no zero row counted (every row holds 7 there)
    # shipping: the segment is ingested once, its rows masked (counted), the others as archived
    learner = mmreplay.create_store(tmp_path / "learner", SCHEMA, capacity=100_000, segment_records=R)
    learner.close()
    rep = mmreplay.ingest_archives(tmp_path / "learner", url)
    assert rep.segments == 5 and rep.masked == 1
    assert mmreplay.ingest_archives(tmp_path / "learner", url).segments == 0  # exactly once
    with mmreplay.open_store(tmp_path / "learner") as s:
        assert s.check_counts()["damaged_rows"] == R + 1  # segment 3's rows and segment 2's damaged row


def test_an_archive_written_before_chunk_checksums_is_read_and_said_once(archived, tmp_path, caplog):
    """An older archive (no chunk manifest) keeps its shape and stays readable; one line says a missing
    chunk cannot be told from zeros there; an export into it records what it adds from then on."""
    src, url = archived
    g = zarr.open_group(str(url), mode="a")
    del g["chunk_crc32c"]
    caplog.set_level(logging.WARNING)
    rep = mmreplay.import_archive(url, tmp_path / "back")
    assert rep.segments == 5 and not rep.masked
    said = [r.message for r in caplog.records if "before chunk checksums" in r.message]
    assert len(said) == 1
    r = CliRunner().invoke(cli, ["verify", str(url)])
    assert r.exit_code == 0 and "note:" in r.output and "before chunk checksums" in r.output
    shutil.rmtree(tmp_path / "back")
    # more rows, exported into it: recorded from the first new segment on
    s = mmreplay.open_store(src, mode="a")
    with s.writer(lanes=1) as w:
        t = np.arange(5 * R, 6 * R, dtype=np.float32)
        w.add_batch(obs=np.stack([t, t + 1, 2 * t, 0 * t + 7], 1)[:, None], action=t.astype(np.int64)[:, None],
                    reward=t[:, None], terminated=(t % 13 == 12)[:, None], truncated=np.zeros((len(t), 1), bool))
    s.close()
    mmreplay.export_archive(src, url)
    assert zarr.open_group(str(url), mode="r")["chunk_crc32c"].attrs["first"] == 5
    _chunk(url, "fields/obs", 5).unlink()
    assert list(mmreplay.import_archive(url, tmp_path / "back").masked) == [6]  # (segment id 6: its chunk is #5)


def test_verify_an_archive(archived):
    src, url = archived
    r = CliRunner().invoke(cli, ["verify", str(url)])
    assert r.exit_code == 0 and "ok:" in r.output and "5 segment(s)" in r.output
    r = CliRunner().invoke(cli, ["verify", str(url), "--repair"])
    assert r.exit_code == 2 and "exporting the store again" in r.output
