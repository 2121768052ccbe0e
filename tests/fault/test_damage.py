"""Damaged rows never reach a learner: sealed segments are checked once, damaged rows are left out
of every sampler, view and export, counted where users look, and masked (not thrown away) by a
repair. Random bit flips anywhere in a segment never crash a reader nor yield a damaged row."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import mmreplay
from mmreplay import PrioritizedSampler, SequenceSampler, UniformSampler
from mmreplay.cli.main import main as cli
from mmreplay.storage.catalog import Catalog
from mmreplay.storage.format import CONTROL_OFFSET, HEADER_SIZE, PAGE_SIZE

R = 64  # rows per segment
SCHEMA = mmreplay.Schema.transition(obs_shape=(4,), obs_dtype=np.float32)


def write(path: Path, lanes: int, steps: int = 300) -> None:
    """Episodes of 13 steps per lane (staggered); obs = (t, lane, code, 0) with code = 8t + lane + 1,
    so a zeroed or damaged row can never pass ``valid``."""
    s = mmreplay.create_store(path, SCHEMA, capacity=100_000, segment_records=R)
    w = s.writer(lanes=lanes, publish_rows=1)  # one commit group per vector step
    lane = np.arange(lanes)
    for t in range(steps):
        w.add(obs=np.stack([np.full(lanes, t), lane, 8 * t + lane + 1, np.zeros(lanes)], 1).astype(np.float32),
              action=np.full(lanes, t, np.int64), reward=np.full(lanes, t, np.float32),
              terminated=(t + lane) % 13 == 12, truncated=np.zeros(lanes, bool))
    w.close()
    s.close()


def valid(obs: np.ndarray) -> bool:
    o = np.asarray(obs, np.float64).reshape(-1, 4)
    return bool(np.isfinite(o).all() and (o[:, 2] == 8 * o[:, 0] + o[:, 1] + 1).all())


def segs(path: Path) -> list[Path]:
    return sorted((path / "segments").glob("*.seg"))


def damage(seg: Path, slot: int, field: str = "obs") -> None:
    layout = Layout_of(seg.parent.parent)
    with open(seg, "r+b") as fh:
        fh.seek(layout.column(field).offset + slot * layout.record_bytes)
        fh.write(b"\xff" * 4)


def Layout_of(path: Path):  # noqa: N802 - a tiny helper
    with mmreplay.open_store(path, mode="r") as s:
        return s.layout


@pytest.fixture(params=[1, 4], ids=["lanes1", "lanes4"])
def damaged(request, tmp_path) -> tuple[Path, int]:
    lanes = request.param
    path = tmp_path / "s"
    write(path, lanes)
    damage(segs(path)[2], 5 * lanes + 1)  # mid-segment: the row and its lane predecessor are cut
    damage(segs(path)[4], 0)  # the first row: the link to the previous segment is cut
    return path, lanes


def test_damaged_rows_are_never_sampled(damaged):
    path, lanes = damaged
    with mmreplay.open_store(path, mode="r") as s:
        assert s.check_counts()["damaged_rows"] == 2  # one row each: the row digests locate the damage
        samplers = [UniformSampler(s, seed=0), UniformSampler(s, seed=1, n_step=3),
                    UniformSampler(s, seed=2, frame_stack=4, n_step=3),
                    UniformSampler(s, seed=3, frame_stack=4, mode="windowed", cache_bytes=3 * s.reader.copy_bytes,
                                   swap_segments_per_s=1e6),
                    PrioritizedSampler(s, seed=4, n_step=2, frame_stack=2)]
        seen: set[int] = set()
        for sampler in samplers:
            for i in range(150):
                b = sampler.sample(32)
                assert valid(b.obs) and valid(b.next_obs), type(sampler).__name__
                seen.update((b.ids // R).tolist())
                if i % 10 == 0 and sampler.tier_stats()["mode"] == "windowed":
                    sampler.finish_swap()  # rotate RAM copies in: they are patched too
            assert sampler.tier_stats()["damaged_rows"] == 2
            sampler.close()
        assert {2, 4} <= seen  # the damaged segments' good rows are still served
        seq = SequenceSampler(s, 5, seed=5)
        for _ in range(100):
            b = seq.sample(16)
            assert valid(b.fields["obs"][b.mask])  # rows past the episode's end are masked out
        ids = s.transition_ids()
        assert valid(s.transitions(ids).obs)  # every start a view offers is clean


def test_a_check_is_remembered_until_the_file_changes(tmp_path):
    path = tmp_path / "s"
    write(path, 2)
    with mmreplay.open_store(path, mode="a") as s:  # the writer recorded its segments as checked
        assert s.check_counts()["checked_segments"] == 0 and s.check_counts()["damaged_rows"] == 0
    damage(segs(path)[1], 3)
    with mmreplay.open_store(path, mode="a") as s:  # changed since: read again, the result recorded
        assert s.check_counts()["unchecked_segments"] == 1  # a writable handle checks at its first refresh
        s.refresh()
        c = s.check_counts()
        assert c["checked_segments"] == 1 and c["damaged_rows"] == 1  # the damaged row only
    assert any(r.bad for r in Catalog(path).read().checks.values())
    with mmreplay.open_store(path, mode="r") as s:  # remembered: not read again
        assert s.check_counts() == {**s.check_counts(), "checked_segments": 0, "damaged_rows": 1}
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)  # new files: checked again, in memory only for a read-only handle
    for _ in range(2):
        with mmreplay.open_store(copy, mode="r") as s:
            assert s.check_counts()["checked_segments"] == len(segs(copy))


def test_large_backlogs_are_checked_in_the_background(tmp_path, monkeypatch):
    path = tmp_path / "s"
    write(path, 1, steps=600)
    damage(segs(path)[3], 7)
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    monkeypatch.setattr("mmreplay.storage.reader.SYNC_CHECK_BYTES", 0)
    with mmreplay.open_store(copy, mode="r") as s:
        c = s.check_counts()
        assert len(s) + c["unchecked_rows"] == 600  # rows not checked yet are not served
        assert s.wait_checked(timeout=60)
        assert len(s) == 600 and s.check_counts()["unchecked_segments"] == 0
        assert s.check_counts()["damaged_rows"] == 1
        u = UniformSampler(s, seed=0, frame_stack=3)
        for _ in range(100):
            b = u.sample(32)
            assert valid(b.obs) and valid(b.next_obs)


def _regions(layout, lanes_rows: int) -> dict[str, tuple[int, int]]:
    """Byte ranges of a segment's regions: header, control page, each column over the committed
    rows (a column's bytes in every record), stamps."""
    out = {"header": (0, HEADER_SIZE), "control": (CONTROL_OFFSET, CONTROL_OFFSET + 128)}
    for c in layout.columns:
        if c.name == "_stamps":
            out["stamps"] = (c.offset, c.offset + 16 * lanes_rows)
        else:
            out[c.name] = (c.offset, c.offset + c.dtype.itemsize * max(1, int(np.prod(c.shape))))
    return out


def test_random_bit_flips_never_crash_a_reader_nor_yield_a_damaged_row(tmp_path):
    base = tmp_path / "base"
    write(base, 2, steps=200)
    layout = Layout_of(base)
    regions = _regions(layout, R)
    rng = np.random.default_rng(7)
    for region, (lo, hi) in regions.items():
        for trial in range(4):
            path = tmp_path / f"{region}-{trial}"
            shutil.copytree(base, path)
            victim = segs(path)[int(rng.integers(0, len(segs(path)) - 1))]  # a sealed one
            off = int(rng.integers(lo, hi))
            if region not in ("header", "control", "stamps"):
                off += int(rng.integers(0, R)) * layout.record_bytes  # the column in a random row
            with open(victim, "r+b") as fh:
                fh.seek(off)
                b = fh.read(1)[0]
                fh.seek(off)
                fh.write(bytes([b ^ (1 << int(rng.integers(0, 8)))]))
            with mmreplay.open_store(path, mode="r", on_corrupt="skip") as s:
                u = UniformSampler(s, seed=trial, n_step=2, frame_stack=2)
                for _ in range(40):
                    b = u.sample(16)
                    assert valid(b.obs) and valid(b.next_obs), (region, off)
                assert valid(s.transitions(s.transition_ids()).obs), (region, off)
                problems = s.verify()
            assert problems or region == "control", (region, off)  # one damaged control slot: the other is used


def test_repair_masks_rows_and_keeps_ids_and_priorities(damaged, tmp_path):
    path, lanes = damaged
    with mmreplay.open_store(path, mode="a") as s:
        s.refresh()  # a writable handle checks what it has not seen written at its first refresh
        rows = len(s)
        p = PrioritizedSampler(s, seed=0)
        b = p.sample(64)
        p.update_priorities(b.ids, np.full(len(b), 5.0))
        p.save()
        p.close()
    r = CliRunner().invoke(cli, ["verify", str(path)])
    assert r.exit_code == 1 and r.output.count("fail their stamp or crc32c check") == 2
    r = CliRunner().invoke(cli, ["verify", str(path), "--repair"])
    assert r.exit_code == 0 and r.output.count("masked 1 damaged row(s)") == 2, r.output
    assert len(segs(path)) == len(list((path / "segments").iterdir()))  # nothing quarantined
    r = CliRunner().invoke(cli, ["verify", str(path)])
    assert r.exit_code == 0 and "2 damaged row(s) masked" in r.output
    with mmreplay.open_store(path, mode="r") as s:
        assert len(s) == rows and s.check_counts()["damaged_rows"] == 2
        p = PrioritizedSampler(s, seed=0)
        assert p.priorities(b.ids).max() == pytest.approx((5.0 + 1e-6) ** 0.6)  # saved priorities still point at their rows
        p.close()
    r = CliRunner().invoke(cli, ["info", str(path)])
    assert "damaged      2 row(s)" in r.output and "recorded by a repair" in r.output


def test_export_never_archives_a_damaged_row(damaged, tmp_path):
    path, lanes = damaged
    from mmreplay.archive import export_archive, import_archive

    report = export_archive(path, tmp_path / "a.zarr")
    assert report.damaged_rows == 2
    imported = tmp_path / "back"
    import_archive(tmp_path / "a.zarr", imported)
    with mmreplay.open_store(imported, mode="r") as s:
        u = UniformSampler(s, seed=0, n_step=3, frame_stack=2)
        for _ in range(100):
            b = u.sample(32)
            assert valid(b.obs) and valid(b.next_obs)


def test_the_loader_never_hands_over_a_damaged_row(damaged):
    pytest.importorskip("torch")
    from mmreplay.loader import BatchLoader

    path, lanes = damaged
    with mmreplay.open_store(path, mode="r") as s, \
            BatchLoader(UniformSampler(s, seed=0, frame_stack=2, n_step=2), 32, device="cpu") as loader:
        for _, b in zip(range(60), loader):
            assert valid(b.obs.numpy()) and valid(b.next_obs.numpy())


def test_minari_export_leaves_out_damaged_rows_and_the_pieces_they_cut(damaged, tmp_path, monkeypatch):
    minari = pytest.importorskip("minari")
    pytest.importorskip("h5py")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    from mmreplay.interop.minari import export_minari

    path, lanes = damaged
    with mmreplay.open_store(path, mode="r") as s:
        rep = export_minari(s, "mmreplay/damaged/cut-v0")
    ds = minari.load_dataset("mmreplay/damaged/cut-v0")
    assert ds.total_episodes == rep.episodes > 0
    for ep in ds.iterate_episodes():
        assert valid(ep.observations)
        assert ep.terminations[-1] or ep.truncations[-1]  # no episode ends at a damaged row


def test_train_and_info_report_damaged_rows(tmp_path):
    path = tmp_path / "cp"
    mmreplay.collect("CartPole-v1", path, 300, workers=0, seed=0, progress=False)
    seg = segs(path)[0]
    with mmreplay.open_store(path, mode="r") as s:
        off = s.layout.column("obs").offset + 100 * s.layout.record_bytes
    with open(seg, "r+b") as fh:
        fh.seek(off)
        fh.write(b"\xff" * 4)
    r = subprocess.run([sys.executable, "-m", "mmreplay", "train", "--offline", "--store", str(path), "--eval-env",
                        "CartPole-v1", "--eval-episodes", "1", "--steps", "20", "--run-dir", str(tmp_path / "run")],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "DAMAGED" in r.stderr and "left out of every batch" in r.stderr
    r = CliRunner().invoke(cli, ["info", str(path)])
    assert "damaged" in r.output and "run `mmreplay verify" in r.output


def test_the_check_kernel_agrees_with_the_crc32c_package():
    import crc32c

    from mmreplay.storage.check_kernel import TABLE, crc_update

    buf = np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8)
    for n in (0, 1, 7, 8, 9, 63, 4099):
        for seed in (0, 12345):
            assert crc_update(seed, buf, 3, 3 + n, TABLE) == crc32c.crc32c(buf[3 : 3 + n].tobytes(), seed)


_KERNEL_CRCS = """
import crc32c, numpy as np
from mmreplay.storage import check_kernel as k
from mmreplay.storage.format import digest_multipliers
words = np.random.default_rng(1).integers(0, 2**63, 4097, dtype=np.int64).view(np.uint64)
raw = words.view(np.uint8)
assert k.crc_update(5, raw, 3, 3 + 30001, k.TABLE) == crc32c.crc32c(raw[3 : 3 + 30001].tobytes(), 5)
mults, out = digest_multipliers(17), np.empty(241, np.uint64)  # 241 rows of 17 words: crc and digests in one pass
assert k.crc_and_digests(7, words, 0, 241, 17, mults, k.TABLE, out) == crc32c.crc32c(words[: 241 * 17].tobytes(), 7)
assert np.array_equal(out, (words[: 241 * 17].reshape(241, 17) @ mults) >> np.uint64(32))
print(k.HARDWARE_CRC)
"""


@pytest.mark.parametrize("cpu", ["host", "generic"])
def test_the_check_kernels_crc32c_agrees_with_the_crc32c_package_on_either_path(cpu):
    """The kernels' crc runs on the CPU's crc32c instruction where numba compiles for a CPU that has
    it, else on the slice-by-8 table (``generic``: a portable target): both give the package's crc,
    over bytes at any offset and in the fused crc-and-digests pass."""
    env = {**os.environ, "NUMBA_CPU_NAME": cpu}
    r = subprocess.run([sys.executable, "-c", _KERNEL_CRCS], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    if cpu == "generic":
        assert r.stdout.split() == ["False"]


def test_a_segment_written_after_a_reader_mapped_it_is_checked_as_it_is_now(tmp_path):
    """A reader checks a small backlog through its own mappings: a file written in place after it
    mapped it (same inode) is checked as it is at the check, and recorded under the identity it
    has then, so a later reader trusts the record (no re-check) and masks the same row."""
    path = tmp_path / "s"
    _sealed_store(tmp_path / "written", segments=3)
    shutil.copytree(tmp_path / "written", path)  # copies: no check of them recorded (their writer's may be)
    with mmreplay.open_store(path, mode="a") as s:  # maps now, checks at its first refresh
        assert s.check_counts()["checked_segments"] == 0
        damage(segs(path)[1], 7)
        s.refresh()
        assert s.check_counts()["damaged_rows"] == 1
        assert 64 + 7 not in set(s.transition_ids().tolist())
    with mmreplay.open_store(path, mode="r") as r:
        assert r.check_counts()["checked_segments"] == 0  # the record matches the file as it is
        assert r.check_counts()["damaged_rows"] == 1 and 64 + 7 not in set(r.transition_ids().tolist())


assert PAGE_SIZE == CONTROL_OFFSET  # the regions above assume the control page follows the header page


def _as_format_1(seg_path: Path, layout) -> None:
    """Rewrite a sealed segment as the format 1 writer left it: header version 1, full row numbers
    in the stamps' ``seq`` field (no row digests), and the seal over those stamps."""
    import crc32c

    from mmreplay.storage.format import Header, STATE_SEALED
    from mmreplay.storage.segment import Segment

    with open(seg_path, "r+b") as fh:
        h = Header.unpack(fh.read(HEADER_SIZE), seg_path)
        fh.seek(0)
        fh.write(Header(*[getattr(h, f) for f in Header.__dataclass_fields__ if f != "format_version"],
                        format_version=1).pack())
    with mmreplay.open_store(seg_path.parent.parent, mode="r") as s:
        uuid, shash = s.store_uuid, s.schema.hash
    seg = Segment.open_rw(seg_path, layout, uuid, shash)
    n = seg.control.committed
    seg.stamps["seq"][:n] = np.arange(h.first_seq + 1, h.first_seq + n + 1, dtype=np.uint64)
    seg.publish(n, state=STATE_SEALED, seal_crc=crc32c.crc32c(seg.view[layout.stamps_offset:][: 16 * n]))
    seg.close()


def test_one_damaged_row_of_a_large_commit_group_is_left_out_alone(tmp_path):
    """Format 2: a whole add_batch is one commit group, and its row digests locate the damage to
    the one row; format 1 segments (no digests) are still read, damage located per group."""
    path = tmp_path / "s"
    s = mmreplay.create_store(path, SCHEMA, capacity=100_000, segment_records=R)
    w = s.writer(lanes=1)
    t = np.arange(4 * R, dtype=np.float32)
    w.add_batch(obs=np.stack([t, 0 * t, 8 * t + 1, 0 * t], 1)[:, None], action=t.astype(np.int64)[:, None],
                reward=t[:, None], terminated=(t % 13 == 12)[:, None], truncated=np.zeros((4 * R, 1), bool))
    w.close()
    s.close()
    layout = Layout_of(path)
    old = tmp_path / "old"
    shutil.copytree(path, old)
    for p in (path, old):
        damage(segs(p)[1], 7)
    for seg in segs(old):
        _as_format_1(seg, layout)
    for p, expect in ((path, 1), (old, R)):  # one row, or the whole group (a segment's share of the batch)
        with mmreplay.open_store(p, mode="r") as s:
            assert len(s) == 4 * R and s.check_counts()["damaged_rows"] == expect
            u = UniformSampler(s, seed=0, n_step=2, frame_stack=2)
            for _ in range(50):
                b = u.sample(32)
                assert valid(b.obs) and valid(b.next_obs)
            assert [(pr.file, pr.rows) for pr in s.verify()] == [(segs(p)[1].name, ((7, 8),) if expect == 1 else ((0, R),))]


def test_rows_that_are_not_whole_words_are_located_too(tmp_path):
    """Records of odd sizes (byte fields only) take the zero-padded digest path, writer and check."""
    schema = mmreplay.Schema.transition(obs_shape=(9,), obs_dtype=np.uint8, action_dtype=np.uint8)
    path = tmp_path / "s"
    with mmreplay.create_store(path, schema, capacity=10_000, segment_records=R) as s:
        assert s.layout.record_bytes % 8
        w = s.writer(lanes=1)
        t = np.arange(2 * R)
        w.add_batch(obs=np.stack([t % 251] * 9, 1)[:, None].astype(np.uint8), action=(t % 7)[:, None].astype(np.uint8),
                    reward=t[:, None].astype(np.float32), terminated=np.zeros((2 * R, 1), bool),
                    truncated=np.zeros((2 * R, 1), bool))
        w.close()
    damage(segs(path)[0], 9)
    with mmreplay.open_store(path, mode="r") as s:
        assert s.check_counts()["damaged_rows"] == 1 and len(s) == 2 * R
        assert [pr.rows for pr in s.verify()] == [((9, 10),)]


# -- what the store keeps: recovery, repair, windows and exports around damage ---------------------
def test_the_damage_suite(tmp_path):
    """300 seeded cases of random damage to 1-3 regions in 1-3 segments or the store's own files
    (``mmreplay.testing.damage``): every served value equals the undamaged store's for the same
    id, every undamaged row survives recovery and two repairs, every row no longer served is
    reported, and one case in five round-trips through a zarr export."""
    from mmreplay.testing.damage import run

    totals = run(300, tmp_path)
    assert totals["cases"] == 300 and totals["rows_beyond_damaged"] == 0
    assert totals["damaged_rows"] > 0 and totals["exported"] == 60


def _sealed_store(path: Path, segments: int = 10, rows: int = 64) -> None:
    """``segments`` sealed segments of one writer (one lane), episodes of 13 steps."""
    s = mmreplay.create_store(path, SCHEMA, capacity=100_000, segment_records=rows)
    w = s.writer(lanes=1)
    t = np.arange(segments * rows, dtype=np.float32)
    w.add_batch(obs=np.stack([t, 0 * t, 8 * t + 1, 0 * t], 1)[:, None], action=t.astype(np.int64)[:, None],
                reward=t[:, None], terminated=(t % 13 == 12)[:, None], truncated=np.zeros((len(t), 1), bool))
    w.close()
    s.close()


def test_recovery_never_removes_a_good_segment_for_a_damaged_one(tmp_path):
    """The control page and the first row of a sealed segment zeroed: recovery and repair keep
    every other row of it and every later segment (they used to cut it and remove the rest)."""
    path = tmp_path / "s"
    _sealed_store(path)
    victim = segs(path)[3]
    with open(victim, "r+b") as fh:
        fh.seek(CONTROL_OFFSET)
        fh.write(bytes(PAGE_SIZE + Layout_of(path).record_bytes - 4))  # the control page and most of row 0
    r = CliRunner().invoke(cli, ["verify", str(path)])
    assert r.exit_code == 1 and "both control slots are damaged" in r.output and "rows 0-0" in r.output
    r = CliRunner().invoke(cli, ["verify", str(path), "--repair"])
    assert r.exit_code == 0 and "1 row(s) masked, 0 quarantined, 0 lost" in r.output, r.output
    assert len(segs(path)) == 10
    with mmreplay.open_store(path) as s:
        assert len(s) == 640 and s.check_counts()["damaged_rows"] == 1
    r = CliRunner().invoke(cli, ["info", str(path)])
    assert "masked" in r.output and "--repair" not in r.output  # acknowledged: no call to repair again
    assert CliRunner().invoke(cli, ["verify", str(path), "--repair"]).output.count("repaired:") == 0


def test_windows_that_need_a_masked_row_are_left_out_never_shortened(tmp_path):
    """Exactly the starts whose n-step window, frame stack or next stack needs the damaged row are
    left out (and counted); every other view is the undamaged store's."""
    path, clean = tmp_path / "s", tmp_path / "clean"
    _sealed_store(path, segments=3)
    shutil.copytree(path, clean)
    damage(segs(path)[1], 20)  # row 84
    with mmreplay.open_store(path) as s, mmreplay.open_store(clean) as c:
        for n, k in ((3, 1), (1, 4), (2, 3)):
            got, want = UniformSampler(s, n_step=n, frame_stack=k), UniformSampler(c, n_step=n, frame_stack=k)
            ids = want.valid_ids()
            b = want.view(ids)
            obs = b.obs if k > 1 else b.obs[:, None]
            nxt = b.next_obs if k > 1 else b.next_obs[:, None]
            needs = [set(range(int(obs[i, -1, 0]), int(nxt[i, -1, 0]) + 1)) | set(obs[i, :, 0].astype(int))
                     | set(nxt[i, :, 0].astype(int)) for i in range(len(ids))]
            out = {int(i) for i, rows in zip(ids, needs) if 84 in rows}
            assert set(ids.tolist()) - set(got.valid_ids().tolist()) == out, (n, k)
            assert got.tier_stats()["windows_left_out"] == len(out - {84}), (n, k)
            kept = got.valid_ids()
            g, w = got.view(kept), want.view(kept)
            assert np.array_equal(g.reward, w.reward) and np.array_equal(g.discount, w.discount)
            assert np.array_equal(g.obs, w.obs) and np.array_equal(g.next_obs, w.next_obs)
        with pytest.raises(KeyError, match="masked"):
            s.rows("obs", np.array([84]))
        assert s.info()["transitions_left_out"] == 1  # 83: its next row is masked


def test_a_flipped_bit_in_a_stamp_costs_nothing_and_repair_writes_it_back(tmp_path):
    path = tmp_path / "s"
    _sealed_store(path, segments=2)
    with mmreplay.open_store(path) as s:
        off = s.layout.stamps_offset + 16 * 9 + 9  # row 9's group crc (one add_batch: one group per segment)
    with open(segs(path)[0], "r+b") as fh:
        fh.seek(off)
        b = fh.read(1)[0]
        fh.seek(off)
        fh.write(bytes([b ^ 4]))
    with mmreplay.open_store(path) as s:
        assert len(s) == 128 and s.check_counts()["damaged_rows"] == 0  # the group's crc proves the records
        assert [p.fix for p in s.verify()] == ["stamps"] and [p.fix for p in s.verify(fast=True)] == ["stamps"]
    r = CliRunner().invoke(cli, ["verify", str(path), "--repair"])
    assert r.exit_code == 0 and "wrote back the damaged stamps of 1 row(s)" in r.output
    r = CliRunner().invoke(cli, ["verify", str(path), "--fast"])
    assert r.exit_code == 0 and "payloads not read" in r.output  # the seal matches again, and fast says what it skips


def test_a_damaged_header_costs_that_segment_never_the_store(tmp_path):
    path = tmp_path / "s"
    _sealed_store(path, segments=4)
    with open(segs(path)[1], "r+b") as fh:
        fh.seek(8)
        fh.write(b"\x02\x08")  # the format version: "format version 2050" until the header crc came first
    with mmreplay.open_store(path) as s:
        assert len(s) == 192 and segs(path)[1].name in s.info()["unreadable_segments"]
        u = UniformSampler(s, frame_stack=4, n_step=3)
        assert not np.isin(np.arange(64 * 2, 64 * 2 + 3), u.valid_ids()).any()  # stacks needing segment 1
    r = CliRunner().invoke(cli, ["verify", str(path), "--repair"])  # rebuilt from the session's other segments
    assert r.exit_code == 0 and "rebuilt the header" in r.output and "64 rows verify" in r.output
    with mmreplay.open_store(path) as s:
        assert len(s) == 256 and s.verify() == []


def test_exports_mark_masked_rows_and_never_invent_an_episode_boundary(tmp_path, monkeypatch):
    import zarr

    from mmreplay.archive import export_archive, import_archive

    path, clean = tmp_path / "s", tmp_path / "clean"
    _sealed_store(path, segments=2)
    shutil.copytree(path, clean)
    damage(segs(path)[0], 20)  # episode 13..25 holds row 20
    rep = export_archive(path, tmp_path / "a.zarr")
    export_archive(clean, tmp_path / "c.zarr")
    assert (rep.damaged_rows, rep.episodes_masked) == (1, 1)
    g, c = zarr.open_group(str(tmp_path / "a.zarr"), mode="r"), zarr.open_group(str(tmp_path / "c.zarr"), mode="r")
    assert np.flatnonzero(g["masked"][:]).tolist() == [20]
    for name in ("is_last", "is_first", "episode"):  # the same episodes as the undamaged store's
        assert np.array_equal(g[name][:], c[name][:]), name
    import_archive(tmp_path / "a.zarr", tmp_path / "back")
    with mmreplay.open_store(tmp_path / "back") as b, mmreplay.open_store(path) as s:
        assert b.check_counts()["damaged_rows"] == 1 and b.masked_rows() == 1  # masked again, acknowledged
        assert np.array_equal(b.transition_ids(), s.transition_ids())
    pytest.importorskip("minari")
    pytest.importorskip("h5py")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    from mmreplay.interop.minari import export_minari

    with mmreplay.open_store(path) as s, mmreplay.open_store(clean) as c:
        m = export_minari(s, "mmreplay/damaged/whole-v0")
        want = export_minari(c, "mmreplay/damaged/clean-v0")
    assert m.masked == 1 and m.episodes == want.episodes - 1  # the episode holding row 20, left out whole
    import minari

    kept = {tuple(ep.observations[:, 0]) for ep in minari.load_dataset("mmreplay/damaged/whole-v0").iterate_episodes()}
    every = {tuple(ep.observations[:, 0]) for ep in minari.load_dataset("mmreplay/damaged/clean-v0").iterate_episodes()}
    assert kept < every and all(20 in e for e in every - kept)  # the others exactly as the undamaged store's


def test_a_damaged_id_counter_is_rebuilt_above_every_id_the_store_has_known(tmp_path):
    path = tmp_path / "s"
    _sealed_store(path, segments=3)
    (path / "counters.bin").write_bytes(bytes(64))  # both slots
    with mmreplay.open_store(path, mode="a") as s:
        w = s.writer(lanes=1)
        w.add(obs=np.zeros((1, 4), np.float32), action=np.zeros(1, np.int64), reward=np.zeros(1, np.float32),
              terminated=np.zeros(1, bool), truncated=np.zeros(1, bool))
        w.close()
    assert [p.name[:13] for p in segs(path)][-1] == "0000000000003" and len(segs(path)) == 4


# -- a masked final observation: the next episode's stacks do not need it ------------------------------
def _ends_store(path: Path, lanes: int, lane_segments: bool, capacity: int = 100_000) -> dict[str, int]:
    """One session of ``lanes`` lanes, ``obs = (t, lane, 8t + lane + 1, 0)``, every lane ending its episodes at
    the same steps. Returns the step ``t`` of a row of each kind: the final observation after a terminated step
    (mid-segment), after a truncated step (the first row of a segment: its lane predecessor is in the previous
    segment), one written by ``end_episodes`` (the step before it is not flagged), and a mid-episode row."""
    edge = R if lane_segments or lanes == 1 else R // lanes  # a lane's first step in its second segment
    kinds = {"terminated": 11, "truncated": edge, "end_episodes": edge + 30, "mid_episode": edge + 50}
    s = mmreplay.create_store(path, SCHEMA, capacity=capacity, segment_records=R)
    w = s.writer(lanes=lanes, lane_segments=lane_segments, publish_rows=1)
    lane = np.arange(lanes)
    for t in range(edge + 80):
        obs = np.stack([np.full(lanes, t), lane, 8 * t + lane + 1, np.zeros(lanes)], 1).astype(np.float32)
        if t == kinds["end_episodes"]:
            w.end_episodes(obs)
            continue
        w.add(obs=obs, action=np.full(lanes, t, np.int64), reward=np.full(lanes, t % 7, np.float32),
              terminated=np.full(lanes, t == kinds["terminated"] - 1),
              truncated=np.full(lanes, t == kinds["truncated"] - 1))
    w.close()
    s.close()
    return kinds


def _rows_read(b, n_ids: int, frames: int) -> list[set[tuple[int, int]]]:
    """Per start of batch ``b``, the (t, lane) rows its view reads: both stacks and the n-step rows between."""
    obs = b.obs.reshape(n_ids, frames, 4).astype(int)
    nxt = b.next_obs.reshape(n_ids, frames, 4).astype(int)
    out = []
    for i in range(n_ids):
        lane = int(obs[i, -1, 1])
        rows = {(int(t), lane) for t in range(obs[i, -1, 0], nxt[i, -1, 0] + 1)}
        out.append(rows | {(int(r[0]), int(r[1])) for r in (*obs[i], *nxt[i])})
    return out


def _check_around(path: Path, clean: Path, lane: int, victims: list[int], known_final: bool) -> None:
    """Damage the rows of steps ``victims`` of ``lane`` in ``path`` (a copy of ``clean``) and check every view
    against the undamaged store's: left out are exactly the starts whose views read a damaged row and, unless the
    last victim is ``known_final``, the stacks that would step back over it from the row after it."""
    from mmreplay.testing.damage import served_ids

    with mmreplay.open_store(clean) as c:
        ids = served_ids(c)
        by_row = {(int(o[0]), int(o[1])): int(i) for i, o in zip(ids, c.rows("obs", ids))}
    vids = {by_row[(t, lane)] for t in victims}
    for vid in vids:
        damage(next(p for p in segs(path) if int(p.name[:13]) == vid // R), vid % R)
    t_masked = victims[-1]
    after = [by_row[(t_masked + d, lane)] for d in (1, 2, 3)]  # the next episode's (or the rest's) first rows
    with mmreplay.open_store(path) as s, mmreplay.open_store(clean) as c:
        assert s.check_counts()["damaged_rows"] == len(vids)
        for n, k in ((1, 4), (3, 4), (2, 2), (3, 1)):
            got = UniformSampler(s, n_step=n, frame_stack=k, seed=1)
            want = UniformSampler(c, n_step=n, frame_stack=k, seed=1)
            every = want.valid_ids()
            b = want.view(every)
            masked = {(t, lane) for t in victims}
            out = {int(i) for i, rows in zip(every, _rows_read(b, len(every), k)) if masked & rows}
            if not known_final and k > 1:  # stacks clamped at the row after it: did the episode go on? not known
                for x in (b.obs, b.next_obs):
                    first = (x[:, 0, 0] == t_masked + 1) & (x[:, 1, 0] == t_masked + 1) & (x[:, 0, 1] == lane)
                    out |= set(every[first].tolist())
            kept = got.valid_ids()
            assert set(kept.tolist()) <= set(every.tolist()), (n, k)
            assert set(every.tolist()) - set(kept.tolist()) == out, (n, k)
            assert got.tier_stats()["windows_left_out"] == len(out - vids), (n, k)
            if known_final:
                assert set(after) <= set(kept.tolist()), (n, k)  # served: they do not need the masked row
            else:  # the stacks of its first k - 1 rows would step back to it
                assert not set(after[: k - 1]) & set(kept.tolist()), (n, k)
            g, w = got.view(kept), want.view(kept)
            for field in ("obs", "next_obs", "reward", "discount", "terminated", "truncated", "action"):
                assert np.array_equal(getattr(g, field), getattr(w, field)), (n, k, field)
            for _ in range(20):
                b = got.sample(64)
                assert valid(b.obs) and valid(b.next_obs)
            got.close()
            want.close()
        with PrioritizedSampler(s, n_step=3, frame_stack=4, seed=2) as p:
            b = p.sample(256)
        assert valid(b.obs) and valid(b.next_obs)
        assert set(b.ids.tolist()) <= set(UniformSampler(s, n_step=3, frame_stack=4).valid_ids().tolist())


@pytest.mark.parametrize("lanes,lane_segments", [(1, False), (3, False), (2, True)],
                         ids=["lanes1", "lanes3", "lane_segments"])
@pytest.mark.parametrize("kind", ["terminated", "truncated", "end_episodes", "mid_episode"])
def test_a_masked_final_observation_leaves_the_next_episodes_stacks_served(tmp_path, lanes, lane_segments, kind):
    """A masked row whose lane predecessor is an ordinary step flagged terminated or truncated was that episode's
    final observation (the writer flags the row after such a step ``is_last``): the next episode's stacks, clamped
    at its first row, do not need it and are served, equal to the undamaged store's. Windows that read it (the
    steps before it: their next_obs) stay left out. Where that is not known (a final observation written by
    ``end_episodes``, a mid-episode row) every stack stepping back over it is left out too."""
    path, clean = tmp_path / "s", tmp_path / "clean"
    t_masked = _ends_store(clean, lanes, lane_segments)[kind]
    shutil.copytree(clean, path)
    # the last lane's row; the other lanes' rows at that step stay whole
    _check_around(path, clean, lanes - 1, [t_masked], kind in ("terminated", "truncated"))


def test_a_masked_final_observation_is_not_inferred_from_a_masked_or_evicted_step(tmp_path):
    """The inference needs the terminated or truncated step before it: masked too, or in a segment evicted since,
    it is not known, and the next episode's first stacks are left out."""
    clean = tmp_path / "clean"
    t = _ends_store(clean, 3, False)["terminated"]
    shutil.copytree(clean, tmp_path / "a")
    _check_around(tmp_path / "a", clean, 2, [t - 1, t], False)  # the terminated step masked too
    gone = tmp_path / "gone"
    t = _ends_store(gone, 1, False, capacity=64)["truncated"]  # the first segment, with the truncated step, evicted
    with mmreplay.open_store(gone) as s:
        assert s.reader.snapshot.segment_ids[0] == 1 and t == R
    shutil.copytree(gone, tmp_path / "b")
    _check_around(tmp_path / "b", gone, 0, [t], False)
