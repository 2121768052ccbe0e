"""Offline training for Box actions (TD3+BC, IQL, BC) on a small Pendulum-v1 store: finite losses,
actions inside the env's bounds, a resumed run making the same updates as an uninterrupted one, the
action scale read from the store, `collect --policy gaussian:...` with the saved actor, and the one-line
errors for an algorithm that does not fit the store's actions."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gymnasium")

from click.testing import CliRunner  # noqa: E402

import mmreplay  # noqa: E402
from mmreplay.agent import load_policy  # noqa: E402
from mmreplay.cli.main import main  # noqa: E402
from mmreplay.train import continuous_config, read_metrics, resume_config, train  # noqa: E402
from mmreplay.train.run import Run  # noqa: E402

SMALL = dict(hidden=(32, 32), batch_size=32, eval_every=0, eval_episodes=1, log_every=50, tensorboard=False,
             checkpoint_every=100)


@pytest.fixture(scope="module")
def pendulum(tmp_path_factory) -> Path:
    """1,200 env steps of a random policy (actions at the env's scale, [-2, 2])."""
    path = tmp_path_factory.mktemp("pend") / "store"
    mmreplay.collect("Pendulum-v1", path, 1200, workers=0, envs_per_worker=4, seed=0, progress=False,
                     segment_records=512)
    return path


def _cfg(store: Path, run: Path, algo: str, **kw: object) -> object:
    return continuous_config(algo=algo, store=str(store), eval_env="Pendulum-v1", run_dir=str(run),
                             **{"steps": 200, "seed": 3, **SMALL, **kw})  # type: ignore[arg-type]


def test_collect_records_the_action_scale(pendulum):
    with mmreplay.open_store(pendulum) as s:
        assert s.metadata["action_scale"] == "env"
        assert s.metadata["action_space"] == {"low": [-2.0], "high": [2.0]}
        assert s.rows("action", s.transition_ids()).min() < -1.0  # really at the env's scale


@pytest.mark.parametrize("algo", ["td3bc", "iql"])
def test_resume_makes_the_same_updates(pendulum, tmp_path, monkeypatch, algo):
    full = train(_cfg(pendulum, tmp_path / "full", algo))
    m = read_metrics(full.run_dir)
    loss = m["loss"][~np.isnan(m["loss"])]
    assert full.updates == 200 and len(loss) >= 4 and np.all(np.isfinite(loss))
    assert np.all(np.isfinite(m["q_mean"][~np.isnan(m["q_mean"])]))
    pol = load_policy(tmp_path / "full" / "policy.pt")
    obs = np.random.default_rng(0).normal(0, 50, (256, 3)).astype(np.float32)  # far outside the data too
    a = pol.act(obs, noise_std=0.5, rng=np.random.default_rng(1))
    assert a.shape == (256, 1) and a.dtype == np.float32 and a.min() >= -2.0 and a.max() <= 2.0
    assert pol.meta["algo"] == algo and full.final_return is not None

    # the same run killed right after its checkpoint at update 100, then resumed
    real = Run.maybe_checkpoint

    def crash(self, *args, **kw):
        real(self, *args, **kw)
        if self.step == 100:
            raise KeyboardInterrupt

    monkeypatch.setattr(Run, "maybe_checkpoint", crash)
    with pytest.raises(KeyboardInterrupt):
        train(_cfg(pendulum, tmp_path / "cut", algo))
    monkeypatch.setattr(Run, "maybe_checkpoint", real)
    resumed = train(resume_config(tmp_path / "cut"))
    assert resumed.updates == 200
    want = torch.load(tmp_path / "full" / "policy.pt", weights_only=True)["state_dict"]
    got = torch.load(tmp_path / "cut" / "policy.pt", weights_only=True)["state_dict"]
    for k in want:
        assert torch.equal(want[k], got[k]), k
    ck_full = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=True)["learner"]
    ck_cut = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)["learner"]
    for k, v in ck_full["critic"].items():  # the critics too, not only the actor
        assert torch.equal(v, ck_cut["critic"][k]), k


def test_bc_unit_scale_store_maps_to_env_bounds(tmp_path, caplog):
    """A store of unit-scale actions (as SB3's SAC writes them) trains an actor whose actions come out
    at the eval env's scale; an unknown scale is said in one line."""
    schema = mmreplay.Schema.transition(obs_shape=(3,), obs_dtype=np.float32, action_shape=(1,),
                                        action_dtype=np.float32)
    rng = np.random.default_rng(0)
    for name, meta in (("unit", {"action_scale": "unit"}), ("old", {})):
        with mmreplay.create_store(tmp_path / name, schema, capacity=10_000, metadata=meta) as s:
            with s.writer(lanes=1) as w:
                for t in range(300):
                    o = rng.normal(size=(1, 3)).astype(np.float32)
                    w.add(obs=o, action=np.clip(o[:, :1], -1, 1), reward=np.zeros(1, np.float32),
                          terminated=np.zeros(1, bool), truncated=np.array([t % 100 == 99]))
                w.close(last_obs=np.zeros((1, 3), np.float32))
    with caplog.at_level(logging.INFO, logger="mmreplay"):
        res = train(_cfg(tmp_path / "unit", tmp_path / "run-unit", "bc", steps=300, learning_rate=3e-3))
    assert not any("action scale" in r.getMessage() for r in caplog.records)
    pol = load_policy(res.policy_path)
    x = np.array([[0.5, 0, 0], [-3, 0, 0]], np.float32)  # unit actions ~0.5 and -1: env actions ~1.0 and -2.0
    a = pol.act(x)[:, 0]
    assert abs(a[0] - 1.0) < 0.4 and a[1] < -1.5
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="mmreplay"):
        train(_cfg(tmp_path / "old", tmp_path / "run-old", "bc", steps=20))
    lines = [r.getMessage() for r in caplog.records if "action scale" in r.getMessage()]
    assert len(lines) == 1 and "unknown" in lines[0] and "Pendulum-v1" in lines[0]


def test_collect_with_the_saved_actor(pendulum, tmp_path):
    res = train(_cfg(pendulum, tmp_path / "run", "bc", steps=50))
    r = CliRunner().invoke(main, ["collect", "Pendulum-v1", "--store", str(tmp_path / "more"), "--steps", "400",
                                  "--workers", "0", "--envs-per-worker", "2", "--seed", "1",
                                  "--policy", f"gaussian:{res.policy_path}:0.3"])
    assert r.exit_code == 0, r.output
    with mmreplay.open_store(tmp_path / "more") as s:
        a = s.rows("action", s.transition_ids())
        assert len(a) >= 390 and a.min() >= -2.0 and a.max() <= 2.0 and a.std() > 0
        assert s.metadata["action_scale"] == "env"
    r = CliRunner().invoke(main, ["collect", "Pendulum-v1", "--store", str(tmp_path / "x"), "--steps", "10",
                                  "--policy", f"eps-greedy:{res.policy_path}"])
    assert r.exit_code == 1 and "continuous actor: use gaussian:" in r.output
    assert not (tmp_path / "x").exists()


def test_algorithm_that_does_not_fit_the_actions_is_one_line(pendulum, tmp_path):
    cart = tmp_path / "cart"
    mmreplay.collect("CartPole-v1", cart, 300, workers=0, seed=0, progress=False)
    for store, algo, says in ((cart, "td3bc", "needs continuous (Box) actions"), (cart, "iql", "needs continuous"),
                              (pendulum, "dqn", "needs discrete actions"), (pendulum, "cql", "needs discrete")):
        r = CliRunner().invoke(main, ["train", "--offline", "--store", str(store), "--algo", algo, "--steps", "10",
                                      "--run-dir", str(tmp_path / f"run-{algo}"), "-q"])
        assert r.exit_code == 1, r.output
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and says in lines[0] and "`action` field" in lines[0], r.output
        assert not (tmp_path / f"run-{algo}").exists()
