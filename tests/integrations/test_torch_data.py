"""TransitionDataset with torch's DataLoader: worker processes, seeds, a store being filled, archives."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

import mmreplay  # noqa: E402
from mmreplay.integrations.torch_data import TransitionDataset  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LANES = 4

# a row's obs is (t, lane, 0), its reward t and its action 100 t + lane; every 7th step of a lane ends
WRITE = f"""
import sys, time
import numpy as np
import mmreplay
store = mmreplay.open_store(sys.argv[1], mode="a")
lane = np.arange({LANES})
with store.writer(lanes={LANES}) as w:
    for t in range(int(sys.argv[2]), int(sys.argv[3])):
        w.add(obs=np.stack([np.full({LANES}, t, np.float32), lane.astype(np.float32), np.zeros({LANES}, np.float32)], 1),
              action=(t * 100 + lane).astype(np.int64), reward=np.full({LANES}, t, np.float32),
              terminated=np.full({LANES}, t % 7 == 6), truncated=np.zeros({LANES}, bool))
        if t % 50 == 0:
            w.publish()
            time.sleep(float(sys.argv[4]))
"""


def _write(path: Path, start: int, stop: int, pause: float = 0.0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITE, str(path), str(start), str(stop), str(pause)], cwd=ROOT)


def _check(batch) -> np.ndarray:
    """Every transition is whole: next_obs is the lane's next step, or the final row of a done one."""
    t, lane = batch.obs[:, 0].numpy(), batch.obs[:, 1].numpy()
    np.testing.assert_array_equal(batch.reward.numpy(), t)
    np.testing.assert_array_equal(batch.action.numpy(), 100 * t + lane)
    np.testing.assert_array_equal(batch.next_obs[:, 0].numpy(), t + 1)
    np.testing.assert_array_equal(batch.next_obs[:, 1].numpy(), lane)
    np.testing.assert_array_equal(batch.terminated.numpy(), t % 7 == 6)
    return t


@pytest.fixture
def path(tmp_path):
    schema = mmreplay.Schema.transition(obs_shape=(3,), obs_dtype=np.float32)
    mmreplay.create_store(tmp_path / "s", schema, capacity=100_000, segment_records=1024).close()
    return tmp_path / "s"


def test_workers_read_a_store_a_writer_is_filling(path):
    assert _write(path, 0, 200).wait(60) == 0
    writer = _write(path, 200, 100_000, pause=0.02)  # keeps writing while the workers read
    try:
        data = TransitionDataset(path, 64, num_batches=60, seed=0, refresh_interval_s=0.05)
        first = last = None
        # spawn: each worker unpickles the dataset and opens the store in a fresh interpreter
        loader = DataLoader(data, batch_size=None, num_workers=2, multiprocessing_context="spawn")
        for k, batch in enumerate(loader):
            t = _check(batch)
            if k < 2:
                first = t.max() if first is None else max(first, t.max())
            last = t.max()
            time.sleep(0.05)
        assert k == 59
        assert last > first  # rows written after the workers started were sampled
        assert writer.poll() is None, "the writer stopped before the workers finished"
    finally:
        writer.kill()
        writer.wait()


def test_workers_draw_apart_and_repeat_with_the_seed(path):
    assert _write(path, 0, 300).wait(60) == 0

    def ids(seed, workers):
        data = TransitionDataset(path, 32, num_batches=6, seed=seed)
        # fork: each worker opens the store after the fork (the dataset's own handle is never used there)
        loader = DataLoader(data, batch_size=None, num_workers=workers, multiprocessing_context="fork")
        return [b.ids for b in loader]

    a = ids(0, 2)
    assert len(a) == 6
    assert not np.array_equal(a[0], a[1])  # worker 0's first batch, then worker 1's
    assert all(np.array_equal(x, y) for x, y in zip(a, ids(0, 2)))
    assert not np.array_equal(a[0], ids(1, 2)[0])
    torch.manual_seed(5)
    b = ids(None, 2)
    torch.manual_seed(5)
    assert all(np.array_equal(x, y) for x, y in zip(b, ids(None, 2)))


def test_archive_and_views(path, tmp_path):
    from mmreplay.archive import export_archive

    assert _write(path, 0, 300).wait(60) == 0
    export_archive(path, tmp_path / "a.zarr")
    data = TransitionDataset(archive=tmp_path / "a.zarr", batch_size=16, num_batches=2, n_step=3, gamma=0.5)
    batches = list(DataLoader(data, batch_size=None, num_workers=0))
    assert len(batches) == len(data) == 2
    b = batches[0]
    assert b.discount is not None and b.obs.shape == (16, 3)
    with pytest.raises(ValueError, match="either"):
        TransitionDataset()
    with pytest.raises(mmreplay.StoreNotFoundError):
        TransitionDataset(tmp_path / "nothing")
