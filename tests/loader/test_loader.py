"""BatchLoader on the CPU (the CUDA path runs on a GPU machine: benchmarks/loader_gpu.py)."""

from __future__ import annotations

import threading
import time

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


@pytest.mark.parametrize("view", [dict(), dict(n_step=3, frame_stack=2)])
def test_workers_hand_out_a_seeded_sequence_of_true_batches(store, view):
    """workers=2: batches 0, 2, 4, ... are the sampler's own; the others come from a second
    sampler seeded from it, so the same seed gives the same sequence; every batch is the store's
    rows under the view."""
    filled(store)
    check = mmreplay.UniformSampler(store, **view)
    runs = []
    for _ in range(2):
        expect = mmreplay.UniformSampler(store, seed=11, **view)
        with BatchLoader(mmreplay.UniformSampler(store, seed=11, **view), 16, device="cpu", workers=2,
                         prefetch=3) as loader:
            got = [(b.ids.copy(), b.obs.clone(), b.next_obs.clone(), b.reward.clone()) for _, b in zip(range(8), loader)]
            assert loader.stats()["workers"] == 2
        for k, (ids, obs, next_obs, reward) in enumerate(got):
            want = check.view(ids)
            np.testing.assert_array_equal(obs.numpy(), want.obs)
            np.testing.assert_array_equal(next_obs.numpy(), want.next_obs)
            np.testing.assert_array_equal(reward.numpy(), want.reward)
            if k % 2 == 0:
                np.testing.assert_array_equal(ids, expect.sample(16).ids)
        runs.append([g[0] for g in got])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(runs[0][0], r) for r in runs[0][1:])


def test_workers_see_rows_written_while_they_run(store):
    filled(store, steps=20)
    sampler = mmreplay.UniformSampler(store, seed=0, refresh_interval_s=0.0)
    with store.writer(lanes=1) as w, BatchLoader(sampler, 32, device="cpu", workers=2) as loader:
        next(loader)
        assert sampler.refresh_interval_s is None  # the loader refreshes the store between gathers
        for t in range(20, 60):
            w.add(**step(1, t))
        w.flush()
        deadline, newest = time.monotonic() + 10, 0.0
        while newest < 50 and time.monotonic() < deadline:
            newest = max(newest, float(next(loader).obs[:, 0].max()))
        assert newest >= 50
    assert sampler.refresh_interval_s == 0.0  # given back on close


def test_workers_need_a_sampler_they_can_share(store):
    filled(store)
    with pytest.raises(ValueError, match="UniformSampler"):
        BatchLoader(mmreplay.PrioritizedSampler(store, seed=0), 8, device="cpu", workers=2)
    with pytest.raises(ValueError, match="mode='exact'"):
        BatchLoader(mmreplay.UniformSampler(store, seed=0, prefetch_batches=2), 8, device="cpu", workers=2)
    with pytest.raises(ValueError, match="`workers`"):
        BatchLoader(mmreplay.UniformSampler(store, seed=0), 8, device="cpu", workers=0)


def test_device_views_are_views_of_the_copied_block_at_the_same_offsets(store):
    """What the CUDA path hands out (one copy of the host block, views of it), checked with a
    second CPU tensor standing in for the device buffer."""
    from mmreplay.loader import tensor_batch

    filled(store)
    a, b = (mmreplay.UniformSampler(store, seed=3, n_step=3, frame_stack=2) for _ in range(2))
    host = torch.empty(a.batch_nbytes(16), dtype=torch.uint8)
    dev, cache = torch.empty_like(host), {}
    for _ in range(3):
        batch = a.fill(host.numpy(), 16)
        dev.copy_(host)
        host.zero_()  # the views must read the copy, not the host block
        got = tensor_batch(batch, "cpu", base=host, device_base=dev, cache=cache)
        want = b.sample(16)
        for name in ("obs", "next_obs", "action", "reward", "terminated", "discount"):
            np.testing.assert_array_equal(getattr(got, name).numpy(), getattr(want, name), err_msg=name)
        for name in ("obs", "next_obs", "action"):
            assert getattr(got, name).untyped_storage().data_ptr() == dev.untyped_storage().data_ptr(), name
    assert cache  # views kept per block: built once per plan
