"""Damaged and foreign files, power loss, read-only and full filesystems."""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import crc32c
import numpy as np
import pytest
from _children import SCHEMA, check_rows
from click.testing import CliRunner
from test_fault_kill import CHILD, visible_rows

import mmreplay
from mmreplay import CorruptSegmentError, CorruptStoreError, FormatVersionError
from mmreplay.storage.format import CONTROL_OFFSET, CONTROL_SLOT_SIZE, HEADER_SIZE, PAGE_SIZE, STATE_OPEN, read_control
from mmreplay.cli.main import main as cli


def filled(tmp_path, rows=100, key=1, segment_records=32, **kw) -> Path:
    path = tmp_path / "s"
    mmreplay.create_store(path, SCHEMA, segment_records=segment_records, **kw).close()
    out = subprocess.run([sys.executable, CHILD, "writer", str(path), str(key), str(rows)], capture_output=True,
                         text=True, check=True)
    assert len(out.stdout.split()) == rows
    return path


def segs(path) -> list[Path]:
    return sorted(p for p in (path / "segments").iterdir() if p.name.endswith(".seg"))


def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0x5A]))


def test_flipped_payload_byte_is_found_and_located(tmp_path):
    path = filled(tmp_path)
    layout = mmreplay.open_store(path).layout
    victim = segs(path)[1]
    flip(victim, layout.records_offset + 7 * layout.record_bytes + 2)
    s = mmreplay.open_store(path)
    problems = s.verify()
    assert len(problems) == 1 and problems[0].file == victim.name and "crc32c" in problems[0].reason
    assert problems[0].slot is not None and problems[0].slot <= 7
    assert s.verify(fast=True) == []  # fast mode reads only the stamp column
    s.close()
    r = CliRunner().invoke(cli, ["verify", str(path)])
    assert r.exit_code == 1 and victim.name in r.output and "slot" in r.output
    rows = len(mmreplay.open_store(path, mode="r"))
    r = CliRunner().invoke(cli, ["verify", str(path), "--repair"])
    assert r.exit_code == 0 and "masked 1 damaged row(s)" in r.output and "quarantined " not in r.output
    assert "1 row(s) masked, 0 quarantined, 0 lost" in r.output
    assert victim.exists()  # row-level repair: the segment's good rows stay, with their ids
    with mmreplay.open_store(path, mode="r") as s:
        assert len(s) == rows and s.check_counts()["damaged_rows"] == 1 and s.masked_rows() == 1
    r = CliRunner().invoke(cli, ["verify", str(path)])
    assert r.exit_code == 0 and "1 damaged row(s) masked" in r.output


def test_a_damaged_header_is_rebuilt_from_its_session_else_quarantined(tmp_path):
    path = filled(tmp_path)
    victim = segs(path)[1]
    before = victim.read_bytes()
    flip(victim, 20)  # inside the header: its crc fails
    with mmreplay.open_store(path) as s:  # the store opens: the segment is left out and reported
        assert victim.name in s.info()["unreadable_segments"] and len(s) == 100 - 32
    r = CliRunner().invoke(cli, ["verify", str(path), "--repair"])
    # the writer session's other segments hold its epoch: the header is written back, every row kept
    assert r.exit_code == 0 and f"rebuilt the header of {victim.name}" in r.output and "32 rows verify" in r.output
    from dataclasses import replace

    from mmreplay.storage.format import Header
    was, now = Header.unpack(before, "before"), Header.unpack(victim.read_bytes(), "after")
    assert replace(now, created_ns=was.created_ns) == was  # (the creation time is its sibling's)
    assert CliRunner().invoke(cli, ["verify", str(path)]).exit_code == 0
    assert visible_rows(path)[1].tolist() == list(range(100))
    # a session of one segment: nothing holds its epoch, so the file is quarantined (kept, counted)
    alone = filled(tmp_path / "b", rows=20)
    victim = segs(alone)[0]
    flip(victim, 20)
    r = CliRunner().invoke(cli, ["verify", str(alone), "--repair"])
    assert r.exit_code == 1 and f"quarantined {victim.name}" in r.output and "20 rows no longer served" in r.output
    assert (victim.parent / (victim.name + ".corrupt")).exists()  # kept, never silently deleted
    assert CliRunner().invoke(cli, ["verify", str(alone), "--repair"]).exit_code == 0  # nothing left to do
    r = CliRunner().invoke(cli, ["verify", str(alone)])
    assert r.exit_code == 0 and "note:" in r.output and ".corrupt" in r.output


def test_flipped_stamp_is_found_by_fast_verify(tmp_path):
    path = filled(tmp_path)
    layout = mmreplay.open_store(path).layout
    flip(segs(path)[0], layout.stamps_offset + 3 * 16 + 1)
    s = mmreplay.open_store(path)
    assert [p.file for p in s.verify(fast=True)] == [segs(path)[0].name]
    assert len(s.verify()) == 1
    s.close()


def test_truncated_segment_is_refused_before_mapping(tmp_path):
    path = filled(tmp_path)
    victim = segs(path)[0]
    size = victim.stat().st_size
    with open(victim, "r+b") as fh:
        fh.truncate(size // 2)
    with pytest.raises(CorruptSegmentError, match=rf"{victim.name}.*{size // 2} bytes.*{size}.*truncated"):
        mmreplay.open_store(path, on_corrupt="raise")
    s = mmreplay.open_store(path)  # the default leaves it out; no SIGBUS: it is never mapped
    assert victim.name in s.info()["unreadable_segments"]
    assert len(mmreplay.UniformSampler(s, seed=0).sample(16)) == 16
    s.close()
    r = CliRunner().invoke(cli, ["verify", str(path), "--repair"])  # its rows are no longer served: exit 1
    assert r.exit_code == 1 and (victim.parent / (victim.name + ".corrupt")).exists() and "32 rows" in r.output


def test_damaged_header_and_control_slots(tmp_path):
    path = filled(tmp_path)
    first, second = segs(path)[:2]
    flip(first, 40)  # inside the header
    with pytest.raises(CorruptSegmentError, match="header checksum"):
        mmreplay.open_store(path, on_corrupt="raise")
    first.unlink()
    with mmreplay.open_store(path) as s:
        rows = s.num_rows
    # one control slot damaged: the other is used
    raw = second.read_bytes()[CONTROL_OFFSET : CONTROL_OFFSET + 2 * CONTROL_SLOT_SIZE]
    before, slot = read_control(raw)
    flip(second, CONTROL_OFFSET + slot * CONTROL_SLOT_SIZE + 9)
    after, _ = read_control(second.read_bytes()[CONTROL_OFFSET : CONTROL_OFFSET + 2 * CONTROL_SLOT_SIZE])
    assert after is not None and after.version == before.version - 1
    # both damaged: the segment is sealed in the catalog, whose count readers use (its rows checked)
    flip(second, CONTROL_OFFSET + (1 - slot) * CONTROL_SLOT_SIZE + 9)
    with mmreplay.open_store(path) as s:
        assert s.num_rows == rows
        assert {p.file: p.fix for p in s.verify()} == {first.name: "lost", second.name: "control"}
    with mmreplay.open_store(path, mode="a") as s:  # recovery writes the control page again, no row lost
        assert s.num_rows == rows and s.recovery_report.rows_lost == 0
        assert [(p.file, p.reason.split(":")[0]) for p in s.verify()] == [(first.name, "lost")]  # deleted above


def test_a_damaged_manifest_is_read_from_its_copy_and_both_damaged_is_an_error(tmp_path):
    path = filled(tmp_path)
    m = path / "STORE.json"
    good = m.read_bytes()
    data = json.loads(good)
    data["segment_records"] = 64
    m.write_text(json.dumps(data))
    with mmreplay.open_store(path) as s:  # read from STORE.copy.json, nothing lost
        assert len(s) == 100 and [p.file for p in s.verify()] == ["STORE.json"]
    assert m.read_bytes() != good  # a read-only open writes nothing
    r = CliRunner().invoke(cli, ["verify", str(path), "--repair"])
    assert r.exit_code == 0 and "wrote back STORE.json" in r.output and m.read_bytes() == good
    m.write_bytes(b"{not json")
    (path / "STORE.copy.json").write_bytes(b"{not json either")
    with pytest.raises(CorruptStoreError):  # both copies: an error, never an empty store
        mmreplay.open_store(path)
    (path / "STORE.copy.json").unlink()
    m.write_bytes(good)  # a store made before the copy existed: a writable open writes it
    with mmreplay.open_store(path, mode="a") as s:
        assert len(s) == 100
    assert (path / "STORE.copy.json").read_bytes() == good


def test_foreign_and_future_segments_are_refused(tmp_path):
    a = filled(tmp_path / "a")
    b = filled(tmp_path / "b", key=2)
    shutil.copy(segs(b)[0], a / "segments" / "0000000000777-w009.seg")
    with pytest.raises(CorruptSegmentError, match="store_uuid mismatch"):
        mmreplay.open_store(a, on_corrupt="raise")
    (a / "segments" / "0000000000777-w009.seg").unlink()
    victim = segs(a)[0]
    with open(victim, "r+b") as fh:  # a format version from the future
        fh.seek(8)
        fh.write(struct.pack("<I", 99))
    with pytest.raises(CorruptSegmentError, match="format version 99"):  # the header crc covers the version
        mmreplay.open_store(a, on_corrupt="raise")
    with open(victim, "r+b") as fh:  # a header written by a future mmreplay: crc right, version unknown
        raw = bytearray(fh.read(HEADER_SIZE))
        fh.seek(0)
        fh.write(raw[:HEADER_SIZE - 4] + struct.pack("<I", crc32c.crc32c(bytes(raw[:HEADER_SIZE - 4]))))
    with pytest.raises(FormatVersionError):
        mmreplay.open_store(a, on_corrupt="raise")


def test_misplaced_record_block_fails_the_seeded_crc(tmp_path):
    path = filled(tmp_path, rows=64, segment_records=32)
    s = mmreplay.open_store(path)
    lay = s.layout
    s.close()
    x, y = segs(path)[:2]
    block = x.read_bytes()[lay.records_offset : lay.records_offset + 32 * lay.record_bytes]
    stamps = x.read_bytes()[lay.stamps_offset : lay.stamps_offset + 32 * 16]
    with open(y, "r+b") as fh:  # same slots, same writer, but another segment: must not validate
        fh.seek(lay.records_offset)
        fh.write(block)
        fh.seek(lay.stamps_offset)
        fh.write(stamps)
    s = mmreplay.open_store(path)
    assert [p.file for p in s.verify()] == [y.name]
    s.close()


@pytest.mark.parametrize("durability", ["process", "segment", "batch"])
def test_power_loss_tail_fuzz(tmp_path, durability):
    """After the last synced point every page is kept, zeroed or garbled (SQLite test6's three
    outcomes): recovery keeps every synced row and never exposes a fuzzed one."""
    rng = np.random.default_rng(5)
    path = tmp_path / "s"
    mmreplay.create_store(path, SCHEMA, segment_records=128).close()  # several segments per session
    for rnd in range(12):
        key = rnd + 1
        p = subprocess.Popen([sys.executable, CHILD, "writer", str(path), str(key), "100000", durability],
                             stdout=subprocess.PIPE, text=True)
        target = int(rng.integers(50, 900))
        for _ in range(target):
            if not p.stdout.readline():
                break
        p.kill()
        p.wait()
        s = mmreplay.open_store(path)
        lay = s.layout
        s.close()
        synced_rows = 0
        for seg in segs(path):
            raw = seg.read_bytes()[CONTROL_OFFSET : CONTROL_OFFSET + 2 * CONTROL_SLOT_SIZE]
            c, _ = read_control(raw)
            if c is None or (c.state != STATE_OPEN and c.synced >= c.committed):
                continue  # sealed and synced: durable, a power loss cannot touch it
            synced_rows += c.synced
            # fuzz whole pages strictly after the synced point: records and stamps
            starts = [lay.records_offset + c.synced * lay.record_bytes, lay.stamps_offset + c.synced * 16]
            ends = [lay.stamps_offset, lay.file_size]
            with open(seg, "r+b") as fh:
                for lo, hi in zip(starts, ends):
                    for page in range(-(-lo // PAGE_SIZE) * PAGE_SIZE, hi, PAGE_SIZE):
                        fate = rng.integers(3)
                        if fate == 1:
                            fh.seek(page)
                            fh.write(bytes(PAGE_SIZE))
                        elif fate == 2:
                            fh.seek(page)
                            fh.write(rng.integers(0, 256, PAGE_SIZE, dtype=np.uint8).tobytes())
        s = mmreplay.open_store(path, mode="a")
        assert s.verify() == []
        s.close()
        rows = visible_rows(path)  # every visible row passes the content check
        seqs = rows.get(key, np.zeros(0, np.int64))
        assert len(np.unique(seqs)) == len(seqs)
        # rows a power loss tore are left out (recovery reports them lost); no good row is removed for them,
        # so a later segment's durable rows may follow a hole
        if durability == "batch":
            assert np.isin(np.arange(target), seqs).all()  # nothing acknowledged is lost


def test_zero_filled_tail_and_empty_store(tmp_path):
    path = tmp_path / "s"
    mmreplay.create_store(path, SCHEMA, segment_records=64).close()
    s = mmreplay.open_store(path)
    assert len(s) == 0 and s.verify() == []
    with pytest.raises(mmreplay.EmptyStoreError):
        mmreplay.UniformSampler(s).sample(1)
    s.close()
    path2 = filled(tmp_path / "t", rows=10, segment_records=64)  # 54 preallocated, zeroed rows
    s = mmreplay.open_store(path2)
    assert len(s) == 10 and s.verify() == []
    s.close()


def test_two_processes_cannot_share_a_writer_id(tmp_path):
    path = filled(tmp_path, rows=5)
    s = mmreplay.open_store(path, mode="a")
    w = s.writer(writer_id=3)
    code = ("import sys, mmreplay\ns = mmreplay.open_store(sys.argv[1], mode='a')\n"
            "try:\n    s.writer(writer_id=3)\nexcept mmreplay.WriterBusyError:\n    print('busy')\n")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "busy"
    with pytest.raises(mmreplay.StoreLockedError):
        s.repair()  # admin work needs every writer closed
    w.close()
    rep = s.repair()
    assert (rep.actions, rep.problems, rep.rows_cost) == ([], [], 0)
    s.close()


def _tmpfs(mnt: Path, size: str) -> bool:
    mnt.mkdir()
    return os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                                               capture_output=True).returncode == 0


def test_read_only_filesystem(tmp_path):
    mnt = tmp_path / "ro"
    if not _tmpfs(mnt, "16m"):
        pytest.skip("needs root and mount")
    try:
        path = filled(mnt, rows=50)
        before = sorted(str(p) for p in path.rglob("*"))
        assert subprocess.run(["mount", "-o", "remount,ro", str(mnt)]).returncode == 0
        s = mmreplay.open_store(path / "", mode="r")
        assert len(mmreplay.UniformSampler(s, seed=0).sample(8)) == 8
        s.close()
        with pytest.raises(mmreplay.ReadOnlyStoreError):
            mmreplay.open_store(path, mode="a")
        assert sorted(str(p) for p in path.rglob("*")) == before  # no lock file, nothing written
    finally:
        subprocess.run(["umount", str(mnt)])


def test_disk_full_on_a_small_tmpfs(tmp_path):
    mnt = tmp_path / "full"
    if not _tmpfs(mnt, "1m"):
        pytest.skip("needs root and mount")
    try:
        path = mnt / "s"
        s = mmreplay.create_store(path, SCHEMA, segment_records=4096, on_full="error")  # ~270 KiB segments
        w = s.writer(lanes=1, publish_rows=1)
        with pytest.raises(mmreplay.DiskFullError) as info:
            for seq in range(100_000):
                w.add(obs=np.array([[1, seq, 0]], np.float32), action=np.array([seq]), reward=np.array([1], np.float32),
                      terminated=np.array([False]), truncated=np.array([False]))
        assert info.value.errno == errno.ENOSPC and "free disk space" in str(info.value)
        committed = s.num_rows
        assert committed > 0 and not [n for n in os.listdir(path / "segments") if n.endswith(".tmp")]
        w.close()
        s.close()
        r = mmreplay.open_store(path)
        assert r.num_rows == committed
        r.close()
    finally:
        subprocess.run(["umount", str(mnt)])


def test_disk_full_by_file_size_limit(tmp_path):
    """Unprivileged disk full: RLIMIT_FSIZE makes posix_fallocate fail with EFBIG."""
    path = tmp_path / "s"
    mmreplay.create_store(path, SCHEMA, segment_records=1 << 16).close()
    code = (
        "import resource, sys, mmreplay\n"
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({1 << 20}, {resource.RLIM_INFINITY}))\n"
        "s = mmreplay.open_store(sys.argv[1], mode='a')\n"
        "try:\n    s.writer()\nexcept mmreplay.DiskFullError as e:\n    print('full', e.errno)\n"
    )
    import signal as _s

    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                         preexec_fn=lambda: _s.signal(_s.SIGXFSZ, _s.SIG_IGN))
    assert out.stdout.split() == ["full", str(errno.EFBIG)], out.stderr
    assert not [n for n in os.listdir(path / "segments") if n.endswith(".tmp")]


def test_disk_full_with_eviction_evicts_and_continues(tmp_path, monkeypatch):
    s = mmreplay.create_store(tmp_path / "s", SCHEMA, capacity=10_000, segment_records=16)
    w = s.writer(lanes=1, publish_rows=1)
    real = os.posix_fallocate
    state = {"fail": 0}

    def flaky(fd, off, size):
        if state["fail"]:
            state["fail"] -= 1
            raise OSError(errno.ENOSPC, "no space")
        return real(fd, off, size)

    def add(seq):
        w.add(obs=np.array([[1, seq, 0]], np.float32), action=np.array([seq]), reward=np.array([1], np.float32),
              terminated=np.array([False]), truncated=np.array([False]))

    for seq in range(64):
        add(seq)
    w.release_spares()
    monkeypatch.setattr(os, "posix_fallocate", flaky)
    state["fail"] = 1  # the next allocation fails once: one sealed segment is evicted, then it retries
    for seq in range(64, 100):
        add(seq)
    w.close()
    info = s.info()
    assert info["evicted_segments"] == 1 and info["rows"] == 100 - 16
    s.close()


@pytest.mark.parametrize("mode", ["strict", "salvage"])
def test_sampling_with_verification(tmp_path, mode):
    """Rows are checked before they become visible; a damaged one raises
    (strict) or is left out with the rest of its segment (salvage)."""
    path = filled(tmp_path, rows=96, segment_records=32)
    lay = mmreplay.open_store(path).layout
    victim = segs(path)[1]
    flip(victim, lay.records_offset + 10 * lay.record_bytes + 1)
    if mode == "strict":
        with pytest.raises(CorruptSegmentError, match=rf"{victim.name}: row \d+ fails"):
            mmreplay.open_store(path, verify="strict")
        return
    s = mmreplay.open_store(path, verify="salvage")
    assert victim.name in s.info()["unreadable_segments"]
    b = mmreplay.UniformSampler(s, seed=0).sample(2000)
    assert check_rows(b.obs, b.action, b.reward, b.terminated) is None  # never the damaged row
    seq = b.obs[:, 1].astype(int)
    # one row per commit group here: the damaged row 32+10 and the rest of its segment are out
    assert not ((seq >= 42) & (seq < 64)).any()
    assert (seq < 32).any() and ((seq >= 32) & (seq < 42)).any() and (seq >= 64).any()
    s.close()
    clean = mmreplay.open_store(filled(tmp_path / "clean", rows=96, segment_records=32), verify="strict")
    assert clean.num_rows == 96
    clean.close()
