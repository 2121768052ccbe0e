"""TorchRL: MMReplayStorage round trips, TorchRL's samplers, a DQN loss on sampled batches.

``torchrl.data`` imports Ray, and a process that imported Ray before ``mmreplay.cluster`` starts a
local instance refuses to (tests/cluster): TorchRL is imported inside the tests, not at collection.
"""

from __future__ import annotations

import importlib.util
import math
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tensordict")

from tensordict import TensorDict  # noqa: E402

import mmreplay  # noqa: E402

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchrl") is None, reason="needs the torchrl extra")


@pytest.fixture
def trl() -> SimpleNamespace:
    from torchrl.data import RandomSampler, SamplerWithoutReplacement, TensorDictReplayBuffer

    from mmreplay.integrations.torchrl import MMReplaySampler, MMReplayStorage, collate

    return SimpleNamespace(RandomSampler=RandomSampler, SamplerWithoutReplacement=SamplerWithoutReplacement,
                           TensorDictReplayBuffer=TensorDictReplayBuffer, MMReplaySampler=MMReplaySampler,
                           MMReplayStorage=MMReplayStorage, collate=collate)

KEYS = ["observation", "action", "done", "terminated", "truncated", ("next", "observation"), ("next", "reward"),
        ("next", "done"), ("next", "terminated"), ("next", "truncated")]


def rollout(envs: int, T: int, seed: int = 0, gap_at: int | None = None) -> TensorDict:
    """What a collector gives: [envs, T] steps, resets after done (a new obs), truncations, one-hot
    actions; ``gap_at``: env 0's obs jumps there without a done (a gap in the data)."""
    rng = np.random.default_rng(seed)
    obs = np.zeros((envs, T, 3), np.float32)
    nxt = rng.standard_normal((envs, T, 3)).astype(np.float32)
    term = rng.random((envs, T)) < 0.15
    trunc = ~term & (rng.random((envs, T)) < 0.1)
    obs[:, 0] = rng.standard_normal((envs, 3))
    for t in range(1, T):
        ended = term[:, t - 1] | trunc[:, t - 1]
        obs[:, t] = np.where(ended[:, None], rng.standard_normal((envs, 3)), nxt[:, t - 1])
    if gap_at is not None:
        obs[0, gap_at] = rng.standard_normal(3)
        term[0, gap_at - 1] = trunc[0, gap_at - 1] = False
    action = np.eye(2, dtype=np.int64)[rng.integers(0, 2, (envs, T))]
    f = torch.zeros(envs, T, 1, dtype=torch.bool)
    t_, tr = torch.from_numpy(term)[..., None], torch.from_numpy(trunc)[..., None]
    return TensorDict({
        "observation": torch.from_numpy(obs), "action": torch.from_numpy(action), "done": f, "terminated": f,
        "truncated": f, "collector": {"traj_ids": torch.zeros(envs, T, dtype=torch.int64)},
        "next": {"observation": torch.from_numpy(nxt), "reward": torch.randn(envs, T, 1), "done": t_ | tr,
                 "terminated": t_, "truncated": tr}}, [envs, T])


def test_tensordicts_round_trip_exactly(tmp_path, trl):
    data = rollout(2, 40, gap_at=20)
    storage = trl.MMReplayStorage(tmp_path / "s", 10_000)
    rb = trl.TensorDictReplayBuffer(storage=storage, sampler=trl.MMReplaySampler(), collate_fn=trl.collate,
                                    batch_size=16)
    rb.extend(data[:, :25].clone())
    rb.extend(data[:, 25:].clone())  # the second block continues each env's episode
    pending = int((~data["next", "done"][:, -1, 0]).sum())
    assert pending and len(rb) == 80 - pending  # each env's newest step waits for its next one
    storage.close()  # ... or for close()
    storage = trl.MMReplayStorage(tmp_path / "s", 10_000)
    assert len(storage) == 80
    got = storage.get(torch.arange(80))  # positions: env 0's steps in order, then env 1's
    want = data.reshape(-1)
    for key in KEYS:
        assert torch.equal(got[key], want[key]), key
    assert "collector" not in got.keys()
    with mmreplay.open_store(tmp_path / "s") as store:
        assert store.verify() == []
        assert store.info()["transitions"] == 80
    storage.close()


@pytest.mark.parametrize("name", ["MMReplaySampler", "RandomSampler", "SamplerWithoutReplacement"])
def test_torchrl_samplers_draw_stored_transitions(tmp_path, trl, name):
    data = rollout(1, 60, seed=1)[0]  # one env: dims [T]
    storage = trl.MMReplayStorage(tmp_path / "s", 10_000, seed=0)
    rb = trl.TensorDictReplayBuffer(storage=storage, sampler=getattr(trl, name)(), collate_fn=trl.collate,
                                    batch_size=32)
    rb.extend(data)
    where = {data["observation"][t].numpy().tobytes(): t for t in range(60)}
    drawn = []
    for _ in range(2):
        batch = rb.sample()
        for k in range(len(batch)):
            t = where[batch["observation"][k].numpy().tobytes()]
            drawn.append(t)
            for key in KEYS:
                assert torch.equal(batch[key][k], data[key][t]), key
    if name == "SamplerWithoutReplacement":  # one pass: every stored transition once
        assert sorted(drawn) == list(range(len(storage)))
    else:
        assert len(drawn) == 64
    storage.close()


def test_dqn_loss_runs_on_sampled_batches(tmp_path, trl):
    from torchrl.modules import MLP, QValueActor
    from torchrl.objectives import DQNLoss

    storage = trl.MMReplayStorage(tmp_path / "s", 10_000, seed=0)
    rb = trl.TensorDictReplayBuffer(storage=storage, sampler=trl.MMReplaySampler(), collate_fn=trl.collate,
                                    batch_size=64)
    rb.extend(rollout(4, 50))
    actor = QValueActor(MLP(in_features=3, out_features=2, num_cells=[16]), in_keys=["observation"],
                        action_space="one-hot")
    loss_fn = DQNLoss(actor, action_space="one-hot", delay_value=True)
    opt = torch.optim.Adam(loss_fn.parameters(), 1e-3)
    for _ in range(5):
        loss = loss_fn(rb.sample())["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert math.isfinite(loss.item())
    storage.close()


def test_wrong_keys_shapes_and_dtypes_name_the_field(tmp_path, trl):
    data = rollout(1, 10)[0]
    storage = trl.MMReplayStorage(tmp_path / "s", 10_000)
    storage.set(0, data)
    with pytest.raises(mmreplay.SchemaError, match="'observation'"):
        storage.set(0, data.exclude("observation"))
    bad = data.clone()
    bad["observation"] = torch.zeros(10, 4)
    with pytest.raises(mmreplay.SchemaError, match="field 'obs'.*expected shape \\[10, 3\\]"):
        storage.set(0, bad)
    bad = data.clone()
    bad["next", "reward"] = torch.zeros(10, 1, dtype=torch.complex64)
    with pytest.raises(mmreplay.SchemaError, match="field 'reward'.*dtype"):
        storage.set(0, bad)
    with pytest.raises(mmreplay.SchemaError, match="env"):
        storage.set(0, rollout(2, 10))
    with pytest.raises(NotImplementedError, match="append-only"):
        storage[0] = data[:1]
    storage.close()
    with pytest.raises(mmreplay.SchemaError, match="obs_keys"):
        trl.MMReplayStorage(tmp_path / "s", obs_keys=("pixels", "state"))
