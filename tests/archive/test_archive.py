"""zarr v3 archives: bit-exact round trip, incremental and resumable export, fsspec URLs, plain
zarr readers, crc32c per chunk, and training from an archive opened read-only."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import uuid

import numpy as np
import pytest

import mmreplay
from mmreplay.archive import (
    ArchiveError,
    export_archive,
    import_archive,
    open_archive,
)

zarr = pytest.importorskip("zarr")

R = 32  # segment_records: small, so every test spans many segments (3 lanes use 30 rows of each)


def _schema() -> mmreplay.Schema:
    return mmreplay.Schema.transition(obs_shape=(3,), obs_dtype=np.float32,
                                      extra=[mmreplay.Field("frame", np.uint8, (4, 4))])


def _step(wtag: int, lanes: int, t: int, done: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    lane = np.arange(lanes)
    return {
        "obs": np.stack([np.full(lanes, t, np.float32), lane.astype(np.float32), np.full(lanes, wtag, np.float32)], 1),
        "action": (t * 100 + lane).astype(np.int64),
        "reward": rng.standard_normal(lanes).astype(np.float32),
        "terminated": done & (rng.random(lanes) < 0.7),
        "truncated": done & ~(rng.random(lanes) < 0.7),
        "frame": rng.integers(0, 4, (lanes, 4, 4), dtype=np.uint8),
    }


def fill(store: mmreplay.ReplayStore, steps: int, *, seed: int = 0, lanes=(3, 2), t0: int = 0,
         close: bool = True) -> list[mmreplay.Writer]:
    """Two interleaved writers (3 and 2 lanes) with random episode ends; closed with last_obs."""
    rng = np.random.default_rng(seed)
    ws = [store.writer(lanes=n) for n in lanes]
    for t in range(t0, t0 + steps):
        for tag, (w, n) in enumerate(zip(ws, lanes)):
            w.add(**_step(tag, n, t, rng.random(n) < 0.15, rng))
    if close:
        for tag, (w, n) in enumerate(zip(ws, lanes)):
            w.close(last_obs=_last_obs(tag, n))
    return ws


def _last_obs(tag: int, lanes: int) -> np.ndarray:
    return np.stack([np.full(lanes, -1 - tag), np.arange(lanes), np.full(lanes, tag)], 1).astype(np.float32)


def all_ids(store: mmreplay.ReplayStore) -> np.ndarray:
    s = store.reader.snapshot
    return np.concatenate([sid * store.segment_records + np.arange(n) for sid, n in zip(s.segment_ids, s.committed)])


def assert_same_store(a: mmreplay.ReplayStore, b: mmreplay.ReplayStore) -> None:
    a.refresh()
    b.refresh()
    sa, sb = a.reader.snapshot, b.reader.snapshot
    held = [(sid, n) for sid, n in zip(sa.segment_ids.tolist(), sa.committed.tolist()) if n]  # not writers' spares
    assert held == list(zip(sb.segment_ids.tolist(), sb.committed.tolist()))
    for key in ("schema", "segment_records", "capacity", "on_full", "metadata"):
        assert a.manifest[key] == b.manifest[key], key
    lay = a.layout
    for sid, _ in held:
        ma, mb = a.reader.segments[sid], b.reader.segments[sid]
        assert dataclasses.replace(ma.header, store_uuid=b"") == dataclasses.replace(mb.header, store_uuid=b"")
        n = ma.committed
        blobs = []
        for store, m in ((a, ma), (b, mb)):
            with open(store.segments_dir / m.name, "rb") as fh:
                fh.seek(lay.records_offset)
                blobs.append(fh.read(n * lay.record_bytes))
        assert blobs[0] == blobs[1], f"segment {sid}: record bytes differ"
    ids = all_ids(a)
    for name in (*a.schema.names, "is_last"):
        np.testing.assert_array_equal(a.rows(name, ids), b.rows(name, ids))
    ta, tb = a.transition_ids(), b.transition_ids()
    np.testing.assert_array_equal(ta, tb)
    xa, xb = a.transitions(ta), b.transitions(tb)
    for f in ("obs", "action", "reward", "next_obs", "terminated", "truncated", "ids"):
        np.testing.assert_array_equal(getattr(xa, f), getattr(xb, f))
    np.testing.assert_array_equal(xa.extra["frame"], xb.extra["frame"])


@pytest.fixture
def src(tmp_path):
    s = mmreplay.create_store(tmp_path / "src", _schema(), capacity=100_000, segment_records=R,
                              metadata={"env_id": "Toy-v0", "env_spec": '{"id": "Toy-v0"}'})
    yield s
    s.close()


def test_round_trip_is_bit_exact_with_eviction(tmp_path):
    # capacity 150 rows: the oldest segments are evicted, so the archive starts mid-episode
    src = mmreplay.create_store(tmp_path / "src", _schema(), capacity=150, segment_records=R,
                                metadata={"env_id": "Toy-v0"})
    fill(src, 120)
    src.record_provenance({"kind": "test", "seed": 7}, "run-1")
    src.refresh()
    assert src.info()["evicted_segments"] > 0
    rep = export_archive(src, tmp_path / "a.zarr")
    assert rep.rows == src.num_rows and rep.segments == len(src.reader.snapshot.segment_ids)
    imp = import_archive(tmp_path / "a.zarr", tmp_path / "dst")
    assert (imp.rows, imp.segments_written) == (src.num_rows, rep.segments)
    with mmreplay.open_store(tmp_path / "dst") as dst:
        assert_same_store(src, dst)
        assert dst.verify() == []
        assert dst.info()["episodes"] == src.info()["episodes"]
        assert dst.provenance() == src.provenance() != []
    # the rebuilt store takes new writers: ids continue above the imported segments
    with mmreplay.open_store(tmp_path / "dst", mode="a") as dst:
        with dst.writer(lanes=1) as w:
            w.add(**_step(0, 1, 0, np.zeros(1, bool), np.random.default_rng(1)))
        assert dst.verify() == []
    src.close()


def test_incremental_export_writes_only_new_segments_and_matches_one_shot(tmp_path, src):
    url = str(tmp_path / "inc.zarr")
    fill(src, 40, seed=1)
    first = export_archive(src, url)
    again = export_archive(src, url)
    assert again.segments_written == 0 and again.rows == first.rows
    fill(src, 40, seed=2, t0=40)
    second = export_archive(src, url)
    src.refresh()
    assert second.segments_written == len(src.reader.snapshot.segment_ids) - first.segments
    assert second.rows == src.num_rows
    once = export_archive(src, tmp_path / "once.zarr")
    _assert_same_archive(url, once.url)
    import_archive(url, tmp_path / "dst")
    with mmreplay.open_store(tmp_path / "dst") as dst:
        assert_same_store(src, dst)


def test_open_segments_on_request_then_rewritten_when_grown(tmp_path, src):
    url = f"memory://{uuid.uuid4().hex}/open.zarr"
    ws = fill(src, 20, close=False)
    src.refresh()
    sealed = export_archive(src, url)
    with_open = export_archive(src, url, include_open=True)
    assert with_open.rows == src.num_rows > sealed.rows
    rng = np.random.default_rng(5)
    for t in range(20, 24):  # the open segments grow without filling up
        for tag, w in enumerate(ws):
            w.add(**_step(tag, w.lanes, t, np.zeros(w.lanes, bool), rng))
    src.refresh()
    grown = export_archive(src, url, include_open=True)
    assert grown.segments_written >= 1 and grown.rows == src.num_rows
    import_archive(url, tmp_path / "dst")  # open segments come back sealed, with their rows
    with mmreplay.open_store(tmp_path / "dst") as dst:
        assert_same_store(src, dst)
    for w in ws:
        w.close()


def test_interrupted_export_resumes_to_the_same_archive(tmp_path, src):
    fill(src, 60)
    url = str(tmp_path / "cut.zarr")
    code = "import sys, mmreplay.archive as a; a.export_archive(sys.argv[1], sys.argv[2])"
    env = {**os.environ, "MMREPLAY_FAILPOINT": "archive_before_commit:3"}
    p = subprocess.run([sys.executable, "-c", code, str(src.path), url], env=env, cwd=tmp_path, capture_output=True)
    assert p.returncode == -9, p.stderr.decode()
    g = zarr.open_group(url, mode="r")
    assert g.attrs["committed"]["segments"] == 2  # the third segment's chunks were written, not committed
    assert g["segment_table"].shape[0] > 2
    resumed = export_archive(src, url)
    assert resumed.segments_written == resumed.segments - 2
    once = export_archive(src, tmp_path / "once.zarr")
    _assert_same_archive(url, once.url)


def _assert_same_archive(a: str, b: str) -> None:
    ga, gb = zarr.open_group(a, mode="r"), zarr.open_group(b, mode="r")
    assert ga.attrs["committed"] == gb.attrs["committed"]
    names = ["is_last", "is_first", "episode", "segment_table", *(f"fields/{k}" for k in ga.attrs["fields"])]
    for name in names:
        assert ga[name].shape == gb[name].shape, name
        np.testing.assert_array_equal(ga[name][:], gb[name][:], err_msg=name)


def test_plain_zarr_reader_gets_fields_and_episodes(src):
    """What the README shows: numpy + zarr only, no mmreplay, reconstruct every episode."""
    rng = np.random.default_rng(3)
    ws = [src.writer(lanes=3), src.writer(lanes=2)]
    expected: dict[tuple[int, int], list[list[int]]] = {}  # (writer, lane) -> episodes as lists of t
    done_prev = [np.zeros(3, bool), np.zeros(2, bool)]
    for t in range(50):
        for tag, w in enumerate(ws):
            st = _step(tag, w.lanes, t, rng.random(w.lanes) < 0.2, rng)
            w.add(**st)
            for lane in range(w.lanes):
                eps = expected.setdefault((tag, lane), [[]])
                if done_prev[tag][lane]:  # this row is the final observation of the episode
                    eps[-1].append(t)
                    eps.append([])
                else:
                    eps[-1].append(t)
            done_prev[tag] = st["terminated"] | st["truncated"]
    for tag, w in enumerate(ws):
        for lane in range(w.lanes):
            expected[(tag, lane)][-1].append(-1 - tag)  # close(last_obs) rows: obs[0] == -1 - tag
        w.close(last_obs=_last_obs(tag, w.lanes))
    url = f"memory://{uuid.uuid4().hex}/plain.zarr"
    export_archive(src, url)

    g = zarr.open_group(url, mode="r")
    fields = g.attrs["fields"]
    assert fields["obs"]["shape"] == [3] and fields["frame"]["dtype"] == "|u1" and "meaning" in fields["reward"]
    assert g.attrs["env"]["env_id"] == "Toy-v0" and "episode" in g.attrs["description"]
    n = g.attrs["committed"]["segments"] * g.attrs["segment_records"]
    ep, first, last = g["episode"][:n], g["is_first"][:n], g["is_last"][:n]
    obs = g["fields/obs"][:n]
    got = set()
    for e in np.unique(ep[ep >= 0]):
        rows = np.flatnonzero(ep == e)
        assert first[rows[0]] and last[rows[-1]] and not last[rows[:-1]].any()
        w, lane = int(obs[rows[0], 2]), int(obs[rows[0], 1])
        got.add((w, lane, tuple(obs[rows, 0].astype(int).tolist())))
    want = {(w, lane, tuple(e)) for (w, lane), eps in expected.items() for e in eps if e}
    assert got == want
    assert g.attrs["committed"]["rows"] == int((ep >= 0).sum()) == src.num_rows


def test_codecs_are_blosc_zstd_with_crc32c_and_a_bad_chunk_is_refused(tmp_path, src):
    fill(src, 30)
    url = tmp_path / "crc.zarr"
    export_archive(src, url)
    g = zarr.open_group(str(url), mode="r")
    codecs = g["fields/frame"].metadata.codecs
    names = [type(c).__name__ for c in codecs]
    assert names[-2:] == ["BloscCodec", "Crc32cCodec"] and codecs[-2].cname.value == "zstd"
    assert g["fields/frame"].chunks == (R, 4, 4) and g["episode"].chunks == (R,)
    chunk = url / "fields" / "obs" / "c" / "1" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="checksum"):
        zarr.open_group(str(url), mode="r")["fields/obs"][R : 2 * R]  # zarr's own check (its codec's crc32c)
    # the import goes on past it: the damaged chunk's segment is written masked, the others intact
    rep = import_archive(url, tmp_path / "dst")
    (sid, (n, why)), = rep.masked.items()
    assert "fields/obs" in why and "crc32c" in why and rep.rows_masked == n > 0
    with mmreplay.open_store(tmp_path / "dst") as dst, mmreplay.open_store(src.path) as s:
        assert dst.check_counts()["damaged_rows"] == n and len(dst) == len(s)


def test_open_archive_trains_with_the_same_samplers(tmp_path, src):
    fill(src, 60)
    url = f"memory://{uuid.uuid4().hex}/train.zarr"
    export_archive(src, url)
    cache = tmp_path / "cache"
    with open_archive(url, cache) as arc:
        assert arc.mode == "r"
        for kw in ({}, {"n_step": 3, "gamma": 0.9}, {"frame_stack": 4}):
            a = mmreplay.UniformSampler(src, seed=7, **kw).sample(64)
            b = mmreplay.UniformSampler(arc, seed=7, **kw).sample(64)
            for f in ("obs", "action", "reward", "next_obs", "terminated", "ids"):
                np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
        with pytest.raises(mmreplay.ReadOnlyStoreError):
            arc.writer()
    # the cache is updated incrementally: only what the archive gained is fetched
    fill(src, 30, seed=9, t0=60)
    rep = export_archive(src, url)
    again = import_archive(url, cache)
    assert again.segments_written == rep.segments_written and again.rows == src.num_rows
    with mmreplay.open_store(cache) as c:
        assert_same_store(src, c)
    # a temporary cache disappears with its store
    arc = open_archive(url)
    where = arc.path.parent
    assert arc.num_rows == src.num_rows
    arc.close()
    del arc
    import gc

    gc.collect()
    assert not where.exists()


def test_window_of_newest_rows(tmp_path, src):
    fill(src, 80)
    url = tmp_path / "w.zarr"
    export_archive(src, url)
    rep = import_archive(url, tmp_path / "win", max_rows=100)
    src.refresh()
    assert 100 <= rep.rows < 100 + 2 * R
    with mmreplay.open_store(tmp_path / "win") as win:
        newest = sorted(src.reader.snapshot.segment_ids.tolist())[-rep.segments:]
        assert win.reader.snapshot.segment_ids.tolist() == newest
        ids = all_ids(win)
        np.testing.assert_array_equal(win.rows("obs", ids), src.rows("obs", ids))


def test_archive_refuses_another_store_and_foreign_paths(tmp_path, src):
    fill(src, 10)
    url = tmp_path / "one.zarr"
    export_archive(src, url)
    other = mmreplay.create_store(tmp_path / "other", _schema(), segment_records=R)
    with pytest.raises(ArchiveError, match="archives store"):
        export_archive(other, url)
    other.close()
    with pytest.raises(mmreplay.StoreExistsError):
        import_archive(url, src.path)
    with pytest.raises(ArchiveError, match="no archive"):
        import_archive(tmp_path / "missing.zarr", tmp_path / "x")
    plain = zarr.open_group(str(tmp_path / "plain.zarr"), mode="w")
    with pytest.raises(ArchiveError, match="not an mmreplay archive"):
        import_archive(tmp_path / "plain.zarr", tmp_path / "y")
    plain.create_array("theirs", shape=(3,), dtype="i4")
    with pytest.raises(ArchiveError, match="not an mmreplay archive"):
        export_archive(src, tmp_path / "plain.zarr")
    assert list(zarr.open_group(str(tmp_path / "plain.zarr"), mode="r").keys()) == ["theirs"]


def test_cli_export_and_import(tmp_path, src):
    from click.testing import CliRunner

    from mmreplay.cli.archive import export_cmd, import_cmd

    fill(src, 30)
    src.refresh()
    out = tmp_path / "cli.zarr"
    r = CliRunner().invoke(export_cmd, [str(src.path), "--to", "zarr", str(out), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert f"archive holds {len(src.reader.snapshot.segment_ids)} segments" in r.output
    r = CliRunner().invoke(import_cmd, [str(out), "--store", str(tmp_path / "dst"), "--no-progress"])
    assert r.exit_code == 0, r.output
    with mmreplay.open_store(tmp_path / "dst") as dst:
        assert_same_store(src, dst)
    r = CliRunner().invoke(import_cmd, [str(tmp_path / "nope.zarr"), "--store", str(tmp_path / "z")])
    assert r.exit_code == 1 and r.output.startswith("Error: ArchiveError") and "Traceback" not in r.output
    r = CliRunner().invoke(export_cmd, ["--help"])
    assert r.exit_code == 0 and "mmreplay export /data/pong --to zarr" in r.output
    from mmreplay.cli.main import main

    fill(src, 10, seed=4, t0=30)  # registered under `mmreplay`, with a progress bar
    r = CliRunner().invoke(main, ["export", str(src.path), str(out), "--progress"])
    assert r.exit_code == 0 and "exported 3 segments (55 rows)" in r.output, r.output
