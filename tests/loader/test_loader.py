"""BatchLoader on the CPU (the CUDA path runs on a GPU machine: benchmarks/loader_gpu.py)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from conftest import step

import mmreplay
from mmreplay.loader import BatchLoader


def filled(store, steps=60, lanes=2):
    with store.writer(lanes=lanes) as w:
        for t in range(steps):
            w.add(**step(lanes, t, term=[t % 9 == 8] + [False] * (lanes - 1)))
    return store


def test_batches_are_the_samplers_batches_as_tensors(store):
    filled(store)
    expect = mmreplay.UniformSampler(store, seed=5)
    with BatchLoader(mmreplay.UniformSampler(store, seed=5), 16, device="cpu") as loader:
        for _, b in zip(range(6), loader):
            e = expect.sample(16)
            assert isinstance(b.obs, torch.Tensor) and b.obs.device.type == "cpu"
            np.testing.assert_array_equal(b.obs.numpy(), e.obs)
            np.testing.assert_array_equal(b.next_obs.numpy(), e.next_obs)
            np.testing.assert_array_equal(b.action.numpy(), e.action)
            np.testing.assert_array_equal(b.ids, e.ids)


def test_views_and_dtypes_at_the_edge(tmp_path):
    schema = mmreplay.Schema.transition((6, 6), np.uint8)
    s = mmreplay.create_store(tmp_path / "s", schema)
    with s.writer(lanes=1) as w:
        for t in range(30):
            w.add(obs=np.full((1, 6, 6), t, np.uint8), action=np.zeros(1, np.int64), reward=np.ones(1, np.float32),
                  terminated=np.array([t % 10 == 9]), truncated=np.zeros(1, bool))
    u = mmreplay.UniformSampler(s, frame_stack=4, n_step=3, seed=0)
    with BatchLoader(u, 8, device="cpu") as loader:
        b = next(loader)
        assert b.obs.shape == (8, 4, 6, 6) and b.obs.dtype == torch.uint8  # frames stay uint8
        assert b.discount is not None and b.discount.shape == (8,)
    with BatchLoader(u, 8, device="cpu", float_dtype=torch.float16) as loader:
        b = next(loader)
        assert b.obs.dtype == torch.float16 and b.reward.dtype == torch.float16
    s.close()


def test_priority_updates_go_through_the_loader(store):
    filled(store)
    per = mmreplay.PrioritizedSampler(store, seed=0)
    with BatchLoader(per, 8, device="cpu") as loader:
        b = next(loader)
        loader.update_priorities(b.ids, torch.full((8,), 50.0))
        for _, _b in zip(range(3), loader):
            pass
    np.testing.assert_allclose(per.priorities(np.unique(b.ids)), (50.0 + per.eps) ** per.alpha)


def test_worker_errors_surface_in_the_consumer(store):
    loader = BatchLoader(mmreplay.UniformSampler(store, seed=0), 4, device="cpu")
    with pytest.raises(RuntimeError, match="worker thread failed") as info:
        next(loader)
    assert isinstance(info.value.__cause__, mmreplay.EmptyStoreError)
    assert not loader.stats()["worker_alive"]


def test_close_stops_the_worker_and_leaks_no_thread(store):
    filled(store)
    before = {t.ident for t in threading.enumerate()}
    loader = BatchLoader(mmreplay.UniformSampler(store, seed=0), 8, device="cpu", prefetch=3, profile=True)
    for _, _b in zip(range(5), loader):
        pass
    stats = loader.stats()
    assert stats["batches"] == 5 and stats["wait_s"] > 0 and stats["update_s"] > 0
    assert 0 < stats["wait_fraction"] < 1
    loader.close()
    assert not loader.stats()["worker_alive"]
    assert {t.ident for t in threading.enumerate() if t.name == "mmreplay-loader"} - before == set()
    with pytest.raises(StopIteration):
        next(loader)


def test_synchronous_training_batches_keep_extra_fields(tmp_path):
    """The batches of the synchronous training loop (``to_tensors`` of a sample, drawn in the
    learner's thread) and of a ``BatchLoader`` come from one builder and carry every ``extra`` field."""
    from mmreplay.core.schema import Field
    from mmreplay.train import to_tensors

    schema = mmreplay.Schema.transition((3,), np.float32, extra=[Field("logp", np.float32),
                                                                  Field("info/hidden", np.int16, (2,))])
    s = mmreplay.create_store(tmp_path / "s", schema)
    with s.writer(lanes=2) as w:
        for t in range(40):
            w.add(**step(2, t), logp=np.full(2, -t, np.float32), **{"info/hidden": np.full((2, 2), t, np.int16)})
    expect = mmreplay.UniformSampler(s, seed=7).sample(16)
    b = to_tensors(mmreplay.UniformSampler(s, seed=7).sample(16), torch.device("cpu"))
    assert set(b.extra) == {"logp", "info/hidden"}
    for name, arr in expect.extra.items():
        assert isinstance(b.extra[name], torch.Tensor)
        np.testing.assert_array_equal(b.extra[name].numpy(), arr)
    np.testing.assert_array_equal(b.extra["logp"].numpy(), -b.reward.numpy())  # the row's own values
    with BatchLoader(mmreplay.UniformSampler(s, seed=7), 16, device="cpu") as loader:
        lb = next(loader)
        assert set(lb.extra) == set(b.extra)
        for name in b.extra:
            np.testing.assert_array_equal(lb.extra[name].numpy(), b.extra[name].numpy())
    s.close()


@pytest.mark.parametrize("view", [dict(), dict(n_step=3, frame_stack=2)])
def test_tensor_batch_on_a_base_buffer_is_views_of_it(store, view):
    from mmreplay.loader import tensor_batch

    filled(store)
    a, b = (mmreplay.UniformSampler(store, seed=3, **view) for _ in range(2))
    base = torch.empty(a.batch_nbytes(16), dtype=torch.uint8)
    got = tensor_batch(a.fill(base.numpy(), 16), "cpu", base=base)
    want = tensor_batch(b.sample(16), "cpu")
    for name in ("obs", "next_obs", "action", "reward", "terminated", "truncated", "discount"):
        x, y = getattr(got, name), getattr(want, name)
        if y is None:
            continue
        assert torch.equal(x, y), name
        if not view or name in ("obs", "next_obs", "action"):  # n-step returns are computed apart
            assert x.untyped_storage().data_ptr() == base.untyped_storage().data_ptr(), name  # one storage
