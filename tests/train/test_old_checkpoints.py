"""Checkpoints written before the trainer's modules moved (commit b6c2d24, issue 44) still resume:
an online DQN run on CartPole-v1 and an offline TD3+BC run on Pendulum-v1, each stopped at its
checkpoint, continue to more steps from a copy of the committed fixture (see
``fixtures/make_fixtures.py``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gymnasium")

import mmreplay  # noqa: E402
from mmreplay.agent import load_policy  # noqa: E402
from mmreplay.train import load_checkpoint, read_metrics, resume_config, train  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _copy(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(FIXTURES / name, dst)
    return dst


def test_an_old_online_dqn_checkpoint_resumes(tmp_path):
    root = _copy("dqn_cartpole", tmp_path)
    old = load_checkpoint(root / "run" / "checkpoint.pt")
    assert old["counters"]["env_steps"] == 300
    with mmreplay.open_store(root / "store") as s:
        rows_before = len(s.transition_ids())
    cfg = resume_config(root / "run", steps=500, store=str(root / "store"))
    assert cfg.algo.name == "dqn" and cfg.env_id == "CartPole-v1" and cfg.algo.hidden == (32, 32)
    res = train(cfg)
    assert res.env_steps == 500 and res.updates > old["counters"]["updates"]
    new = load_checkpoint(root / "run" / "checkpoint.pt")
    assert new["counters"]["env_steps"] == 500
    changed = [k for k in old["state_dict"] if not torch.equal(old["state_dict"][k], new["state_dict"][k])]
    assert changed, "the resumed run made no update"
    pol = load_policy(root / "run" / "policy.pt")
    a = pol.act(np.zeros((3, 4), np.float32), epsilon=0.0)
    assert a.shape == (3,) and set(a.tolist()) <= {0, 1}
    assert read_metrics(root / "run")["step"].max() >= 400
    with mmreplay.open_store(root / "store") as s:  # the resumed run appended to the old replay memory
        assert len(s.transition_ids()) >= rows_before + 150


def test_an_old_offline_td3bc_checkpoint_resumes(tmp_path):
    root = _copy("td3bc_pendulum", tmp_path)
    old = load_checkpoint(root / "run" / "checkpoint.pt")
    assert old["counters"]["updates"] == 100 and old["learner"] is not None
    cfg = resume_config(root / "run", steps=160, store=str(root / "store"))
    assert cfg.algo.name == "td3bc" and cfg.offline
    res = train(cfg)
    assert res.updates == 160
    pol = load_policy(root / "run" / "policy.pt")
    a = pol.act(np.random.default_rng(0).normal(0, 5, (16, 3)).astype(np.float32))
    assert a.shape == (16, 1) and a.min() >= -2.0 and a.max() <= 2.0
    new = load_checkpoint(root / "run" / "checkpoint.pt")
    changed = [k for k in old["state_dict"] if not torch.equal(old["state_dict"][k], new["state_dict"][k])]
    assert changed, "the resumed run made no update"
