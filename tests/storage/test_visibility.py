"""Group commit and visibility: who sees a row, and when; disk full at allocation."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import step

import mmreplay
from mmreplay import DiskFullError


def test_same_handle_sees_every_added_row(store):
    w = store.writer(lanes=1, publish_interval_s=60)
    for t in range(3):
        w.add(**step(1, t))
    assert store.num_rows == 3
    b = mmreplay.UniformSampler(store, seed=0).sample(8)
    assert set(b.obs[:, 0].astype(int)) == {0, 1}
    w.close()


def test_other_handles_see_rows_only_once_published(store):
    w = store.writer(lanes=1, publish_rows=64, publish_interval_s=60)
    for t in range(5):
        w.add(**step(1, t))
    other = mmreplay.open_store(store.path, mode="r")
    assert other.num_rows == 0  # staged, not yet published
    w.publish()
    other.refresh()
    assert other.num_rows == 5
    for t in range(5, 69):  # 64 more: a full group publishes by itself
        w.add(**step(1, t))
    other.refresh()
    assert other.num_rows >= 64
    w.close()
    other.refresh()
    assert other.num_rows == 69
    other.close()


def test_idle_writer_rows_reach_another_process(store):
    w = store.writer(lanes=1, publish_rows=1000, publish_interval_s=0.01)
    for t in range(10):
        w.add(**step(1, t))
    # no flush, no close: the publisher thread must make them visible on its own
    code = (
        "import sys, time, mmreplay\n"
        "s = mmreplay.open_store(sys.argv[1])\n"
        "deadline = time.monotonic() + 30\n"
        "while s.num_rows < 10 and time.monotonic() < deadline:\n"
        "    time.sleep(0.01); s.refresh()\n"
        "print(s.num_rows)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(store.path)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "10"
    w.close()


def test_publisher_sleeps_until_rows_wait_and_close_never_hangs(tmp_path, schema):
    """The publisher thread wakes only while rows wait unpublished (a timer would slow the actor
    loop), publishes them within the interval, and a close() racing its wake-up never hangs."""
    import time

    # segments large enough that no add below orders a next segment (which publishes at once)
    store = mmreplay.create_store(tmp_path / "big", schema, segment_records=1024)
    w = store.writer(lanes=4, publish_rows=64, publish_interval_s=0.3)  # long: the flag is checked before it
    other = mmreplay.open_store(store.path, mode="r")
    w.add_batch({k: np.stack([step(4, t)[k] for t in range(16)]) for k in step(4, 0)})  # 64 rows
    assert not w.stats()["publisher_waiting"]  # a full group published itself: nothing for the thread to do
    other.refresh()
    assert other.num_rows == 64
    w.add(**step(4, 16))  # 4 rows wait
    assert w.stats()["publisher_waiting"]
    deadline = time.monotonic() + 10
    while other.num_rows < 68 and time.monotonic() < deadline:
        time.sleep(0.005)
        other.refresh()
    assert other.num_rows == 68
    while w.stats()["publisher_waiting"] and time.monotonic() < deadline:  # back to sleep once nothing waits
        time.sleep(0.005)
    assert not w.stats()["publisher_waiting"]
    w.close()
    other.close()

    # close() signals the thread (stop, then wake) just before the thread clears its wake-up. The one
    # white-box step of the suite: that interleaving can only be forced from inside the writer.
    w = store.writer(lanes=1, publish_interval_s=0.001)
    clear = w._wake.clear

    def close_signals_then_clear() -> None:
        w._stop.set()
        w._wake.set()
        clear()

    w._wake.clear = close_signals_then_clear
    w.add(**step(1, 99))  # the thread publishes the row, then clears: it must see the stop and end
    deadline = time.monotonic() + 30
    while w.stats()["publisher_alive"] and time.monotonic() < deadline:
        time.sleep(0.005)
    assert not w.stats()["publisher_alive"], "the publisher missed close()'s signal (close() would hang)"
    w.close()
    assert store.num_rows == 69
    store.close()


def test_batch_durability_publishes_every_add(store):
    w = store.writer(lanes=1, durability="batch")
    other = mmreplay.open_store(store.path, mode="r")
    for t in range(3):
        w.add(**step(1, t))
        other.refresh()
        assert other.num_rows == t + 1
    w.close()
    other.close()


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_disk_full_at_writer_open(store, monkeypatch):
    monkeypatch.setattr(os, "posix_fallocate", _enospc)
    with pytest.raises(DiskFullError, match="cannot allocate") as info:
        store.writer()
    assert info.value.errno == errno.ENOSPC and "hint" in str(info.value)
    assert not [p for p in os.listdir(store.segments_dir) if p.endswith(".tmp")]
    monkeypatch.undo()
    store.writer(writer_id=0).close()  # the id was released


def test_disk_full_at_segment_roll_keeps_committed_rows(tmp_path, schema, monkeypatch):
    s = mmreplay.create_store(tmp_path / "s", schema, segment_records=16, on_full="error")
    w = s.writer(lanes=2, publish_rows=1)
    for t in range(8):
        w.add(**step(2, t))
    w.release_spares()  # so the next roll must allocate, and hit the full disk
    monkeypatch.setattr(os, "posix_fallocate", _enospc)
    with pytest.raises(DiskFullError):
        w.add_batch({k: np.stack([v] * 20) for k, v in step(2, 8).items()})
    monkeypatch.undo()
    assert not [p for p in os.listdir(s.segments_dir) if p.endswith(".tmp")]
    s.close()
    r = mmreplay.open_store(tmp_path / "s", mode="a")
    assert r.num_rows == 16  # every committed row, none of the refused batch
    r.close()


def test_segment_whose_header_never_reached_disk_is_removed(store):
    with store.writer(lanes=1) as w:
        w.add(**step(1, 0))
    ghost = store.segments_dir / "0000000000099-w007.seg"
    with open(ghost, "wb") as fh:
        fh.truncate(store.layout.file_size)  # all zeros: created, header lost by a power cut
    r = mmreplay.open_store(store.path, mode="a")
    assert not ghost.exists() and ghost.name in r.recovery_report.cleaned
    assert r.num_rows == 1
    r.close()


def test_writer_refuses_use_after_fork(store):
    w = store.writer(lanes=1)
    w.add(**step(1, 0))
    pid = os.fork()
    if pid == 0:  # child
        try:
            w.add(**step(1, 1))
        except mmreplay.StoreClosedError:
            os._exit(0)
        os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    w.close()


def test_close_tolerates_another_process_finishing_a_spare_deletion(store, monkeypatch):
    """A writer deletes its unused spare segment by renaming it ``.deleted`` and unlinking it; a
    store opened in another process meanwhile may finish that deletion first (found by the torture
    test): close() must not fail for it."""
    w = store.writer(lanes=1)
    for t in range(store.segment_records // 2):  # half of the first segment: a spare is ordered
        w.add(**step(1, t))
    assert w.stats()["next_segment_ordered"]
    real = os.rename

    def rename_then_finished_elsewhere(src, dst):
        real(src, dst)
        if str(dst).endswith(".deleted"):
            os.unlink(dst)  # the other process's recovery removed it

    monkeypatch.setattr(os, "rename", rename_then_finished_elsewhere)
    w.close()
    monkeypatch.undo()
    assert store.num_rows == store.segment_records // 2 and not list((store.path / "segments").glob("*.deleted"))


def test_a_spare_that_cannot_be_made_is_retried_when_it_is_needed(tmp_path, schema, monkeypatch):
    """A full disk when the next segment is made ahead of need is not the writer's error: it keeps
    filling the segment it has, and the segment is made again when it is actually needed."""
    s = mmreplay.create_store(tmp_path / "s", schema, segment_records=32)
    w = s.writer(lanes=1)
    real = os.posix_fallocate
    monkeypatch.setattr(os, "posix_fallocate", _enospc)
    for t in range(20):  # past half: the spare is ordered, and fails in the background
        w.add(**step(1, t))
    assert w.stats()["next_segment_ordered"]
    w.flush()  # the failed spare is looked at only when a segment is needed
    monkeypatch.setattr(os, "posix_fallocate", real)  # space is back before the segment is full
    for t in range(20, 70):
        w.add(**step(1, t))
    w.close()
    assert s.num_rows == 70 and s.verify() == []
    chains = sorted(mmreplay.open_store(s.path).info()["rows_per_writer"].items())
    assert chains == [("0", 70)]
    s.close()
