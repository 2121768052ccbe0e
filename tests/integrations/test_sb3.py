"""Stable-Baselines3: MMReplayBuffer against SB3's own ReplayBuffer, inside SB3's algorithms,
across processes and restarts."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

sb3 = pytest.importorskip("stable_baselines3")
gym = pytest.importorskip("gymnasium")

from gymnasium import spaces  # noqa: E402
from gymnasium.wrappers import TimeLimit  # noqa: E402
from stable_baselines3.common.buffers import ReplayBuffer  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv  # noqa: E402

import mmreplay  # noqa: E402
from mmreplay.integrations.sb3 import MMReplayBuffer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


class RandomEnv(gym.Env):
    """Random observations and rewards, terminates with probability 0.15 (TimeLimit adds truncations)."""

    def __init__(self, box_actions: bool, seed: int) -> None:
        self.observation_space = spaces.Box(-10, 10, (3,), np.float32)
        self.action_space = spaces.Box(-1, 1, (2,), np.float32) if box_actions else spaces.Discrete(3)
        self.rng = np.random.default_rng(seed)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.rng.standard_normal(3).astype(np.float32), {}

    def step(self, action):
        obs = self.rng.standard_normal(3).astype(np.float32)
        return obs, float(self.rng.standard_normal()), bool(self.rng.random() < 0.15), False, {}


def _venv(box: bool, n: int) -> DummyVecEnv:
    venv = DummyVecEnv([lambda i=i: TimeLimit(RandomEnv(box, 10 + i), max_episode_steps=6) for i in range(n)])
    venv.action_space.seed(0)
    return venv


def _fill(buffers, venv, steps: int, reset_at: int | None = None, each=None) -> None:
    """What SB3's OffPolicyAlgorithm._store_transition hands to a buffer, step by step (then ``each(t)``)."""
    n = venv.num_envs
    obs = venv.reset()
    for t in range(steps):
        if t == reset_at:  # a reset outside a done (a new learn() resets the envs)
            obs = venv.reset()
        action = np.array([venv.action_space.sample() for _ in range(n)])
        new_obs, reward, dones, infos = venv.step(action)
        next_obs = new_obs.copy()
        for i, done in enumerate(dones):
            if done:
                next_obs[i] = infos[i]["terminal_observation"]
        for b in buffers:
            b.add(obs, next_obs, action, reward, dones, infos)
        obs = new_obs
        if each is not None:
            each(t)


@pytest.mark.parametrize(("box", "handle_timeouts"), [(False, True), (True, False)])
def test_transitions_equal_sb3s_own_buffer(tmp_path, box, handle_timeouts):
    n, steps = 2, 120
    venv = _venv(box, n)
    theirs = ReplayBuffer(1000, venv.observation_space, venv.action_space, "cpu", n_envs=n,
                          handle_timeout_termination=True)  # keeps the timeouts to compare with
    ours = MMReplayBuffer(1000, venv.observation_space, venv.action_space, "cpu", n_envs=n,
                          handle_timeout_termination=handle_timeouts, path=tmp_path / "s", seed=0)
    _fill([theirs, ours], venv, steps, reset_at=50)
    ours.close()  # writes each env's pending step
    ours = MMReplayBuffer(1000, venv.observation_space, venv.action_space, "cpu", n_envs=n,
                          handle_timeout_termination=handle_timeouts, path=tmp_path / "s", seed=0)
    store = ours.store
    ids = store.transition_ids()
    assert len(ids) == steps * n  # every step, episode ends, truncations and the cut at the reset included
    got = ours.samples_of(store.transitions(ids))
    flags = store.transitions(ids)
    where = {got.observations[k].numpy().tobytes(): k for k in range(len(ids))}
    assert len(where) == len(ids)
    pos, env = np.divmod(np.arange(steps * n), n)
    truncs = ends = 0
    for p, e in zip(pos, env):  # SB3's own rows by index, ours by the row holding that obs
        k = where[theirs.observations[p, e].tobytes()]
        np.testing.assert_array_equal(got.next_observations[k].numpy(), theirs.next_observations[p, e])
        np.testing.assert_array_equal(got.actions[k].numpy(), theirs.actions[p, e])
        assert got.rewards[k, 0].item() == theirs.rewards[p, e]
        timeout, done = theirs.timeouts[p, e], theirs.dones[p, e]
        assert got.dones[k, 0].item() == (done * (1 - timeout) if handle_timeouts else done)
        assert flags.truncated[k] == timeout and flags.terminated[k] == (done and not timeout)
        truncs += int(timeout)
        ends += int(done)
    assert truncs > 5 and ends > truncs  # both kinds of episode end were compared
    # sampled batches (SB3's shapes and dtypes) hold exactly SB3's transitions
    batch = ours.sample(64)
    assert batch.actions.shape == (64, theirs.action_dim) and batch.actions.dtype == (
        __import__("torch").float32 if box else __import__("torch").int64)
    assert batch.rewards.shape == batch.dones.shape == (64, 1)
    for k in range(64):
        q = where[batch.observations[k].numpy().tobytes()]
        np.testing.assert_array_equal(batch.next_observations[k].numpy(), got.next_observations[q].numpy())
        assert batch.dones[k, 0].item() == got.dones[q, 0].item()
    ours.close()


@pytest.mark.parametrize(("box", "handle_timeouts", "optimize"), [(False, True, False), (True, False, True)])
def test_sb3_sampling_draws_what_sb3s_own_buffer_draws(tmp_path, box, handle_timeouts, optimize):
    """``sampling="sb3"``: with numpy's global generator seeded alike, every batch equals SB3's own,
    the newest steps (next_obs still pending) and a wrapped slot table included, and the global
    stream is left where SB3's buffer leaves it (so exploration goes on the same)."""
    n, steps, size = 2, 150, 2 * 40  # the 40-step slot table wraps
    venv = _venv(box, n)
    theirs = ReplayBuffer(size, venv.observation_space, venv.action_space, "cpu", n_envs=n,
                          optimize_memory_usage=optimize, handle_timeout_termination=handle_timeouts)
    ours = MMReplayBuffer(size, venv.observation_space, venv.action_space, "cpu", n_envs=n,
                          optimize_memory_usage=optimize, handle_timeout_termination=handle_timeouts,
                          path=tmp_path / "s")
    compared = []

    def compare(t: int) -> None:
        if t % 7 != 3:
            return
        np.random.seed(t)
        a = theirs.sample(64)
        after = np.random.get_state()[1].copy()
        np.random.seed(t)
        b = ours.sample(64)
        np.testing.assert_array_equal(np.random.get_state()[1], after)  # the same draws
        for f in ("observations", "actions", "rewards", "dones"):
            np.testing.assert_array_equal(getattr(b, f).numpy(), getattr(a, f).numpy(), err_msg=f)
            assert getattr(b, f).dtype == getattr(a, f).dtype
        # SB3's memory-saving layout holds the next episode's first obs at a done (masked by it)
        keep = ~a.dones.numpy()[:, 0].astype(bool) if optimize else slice(None)
        np.testing.assert_array_equal(b.next_observations.numpy()[keep], a.next_observations.numpy()[keep])
        compared.append(ours.full)

    # (SB3's memory-saving layout also loses the next_obs of a step followed by a reset outside a done)
    _fill([theirs, ours], venv, steps, reset_at=None if optimize else 90, each=compare)
    assert ours.full and theirs.full and ours.pos == theirs.pos and ours.size() == theirs.size()
    assert len(compared) > 15 and not all(compared) and any(compared)  # before and after the wrap
    ours.close()


def test_sb3_sampling_replaces_slots_whose_rows_were_evicted(tmp_path):
    venv = _venv(False, 1)
    small = MMReplayBuffer(1024, venv.observation_space, venv.action_space, "cpu", path=tmp_path / "s",
                           segment_records=1024, sampling="store")  # a store of 1,024 rows
    small.close()
    theirs = ReplayBuffer(4096, venv.observation_space, venv.action_space, "cpu")
    ours = MMReplayBuffer(4096, venv.observation_space, venv.action_space, "cpu", path=tmp_path / "s")
    _fill([theirs, ours], venv, 4000)
    assert ours.store.num_rows < 3000  # the store evicted rows the slot table still names
    where = {theirs.observations[p, 0].tobytes(): p for p in range(4000)}
    with pytest.warns(UserWarning, match="no longer stored"):
        batch = ours.sample(256)
    for k in range(256):  # every transition is still one SB3's buffer holds, whole
        p = where[batch.observations[k].numpy().tobytes()]
        np.testing.assert_array_equal(batch.next_observations[k].numpy(), theirs.next_observations[p, 0])
    ours.close()


def test_sb3_sampling_trains_the_same_dqn_as_sb3s_own_buffer(tmp_path):
    th = pytest.importorskip("torch")

    def train(**kw):
        model = sb3.DQN("MlpPolicy", "CartPole-v1", learning_starts=100, train_freq=4, batch_size=32,
                        target_update_interval=50, policy_kwargs=dict(net_arch=[32]), seed=3, **kw)
        model.learn(600)
        return model

    theirs = train()
    ours = train(replay_buffer_class=MMReplayBuffer, replay_buffer_kwargs=dict(path=tmp_path / "s"))
    ours.replay_buffer.close()
    assert ours._n_updates == theirs._n_updates > 100
    for (name, p), q in zip(theirs.policy.state_dict().items(), ours.policy.state_dict().values()):
        assert th.equal(p, q), name


def _losses(model) -> dict[str, float]:
    return {k: v for k, v in model.logger.name_to_value.items() if k.endswith("loss")}


@pytest.mark.parametrize("algo", ["DQN", "SAC", "TD3"])
def test_algorithms_learn_on_it_with_finite_losses(tmp_path, algo):
    cls = getattr(sb3, algo)
    env = "CartPole-v1" if algo == "DQN" else "Pendulum-v1"
    kwargs = dict(train_freq=4, gradient_steps=2, target_update_interval=50) if algo == "DQN" else dict(train_freq=4)
    model = cls("MlpPolicy", env, learning_starts=64, batch_size=32, seed=0, replay_buffer_class=MMReplayBuffer,
                replay_buffer_kwargs=dict(path=tmp_path / "s"), policy_kwargs=dict(net_arch=[32, 32]), **kwargs)
    model.learn(300, log_interval=None)
    losses = _losses(model)
    assert model._n_updates > 0 and losses, losses
    assert all(math.isfinite(v) for v in losses.values()), losses
    assert isinstance(model.replay_buffer, ReplayBuffer)
    model.replay_buffer.close()
    with mmreplay.open_store(tmp_path / "s") as store:
        assert len(store.transition_ids()) == 300


def test_restart_continues_on_every_row(tmp_path):
    path = tmp_path / "s"
    code = textwrap.dedent(f"""
        from stable_baselines3 import DQN
        from mmreplay.integrations.sb3 import MMReplayBuffer
        model = DQN("MlpPolicy", "CartPole-v1", learning_starts=50, seed=1, replay_buffer_class=MMReplayBuffer,
                    replay_buffer_kwargs=dict(path={str(path)!r}))
        model.learn(200)   # the process ends without closing anything
    """)
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)
    with mmreplay.open_store(path) as store:
        first = store.transition_ids()
        before = store.transitions(first)
    assert len(first) == 200  # the last step too (written at exit)
    model = sb3.DQN("MlpPolicy", "CartPole-v1", learning_starts=0, seed=2, replay_buffer_class=MMReplayBuffer,
                    replay_buffer_kwargs=dict(path=path))
    assert model.replay_buffer.sample(32).observations.shape == (32, 4)  # the old rows, before any step
    model.learn(100)
    model.replay_buffer.close()
    with mmreplay.open_store(path) as store:
        assert len(store.transition_ids()) == 300
        again = store.transitions(first)
        np.testing.assert_array_equal(again.obs, before.obs)
        np.testing.assert_array_equal(again.next_obs, before.next_obs)
        assert store.verify() == []


def test_another_process_writes_while_the_learner_samples(tmp_path):
    path = tmp_path / "s"
    venv = _venv(False, 1)
    learner = MMReplayBuffer(10_000, venv.observation_space, venv.action_space, "cpu", path=path,
                             refresh_interval_s=0.05, seed=0, sampling="store")  # every process's rows
    _fill([learner], venv, 50)
    code = textwrap.dedent(f"""
        import numpy as np
        from gymnasium import spaces
        from mmreplay.integrations.sb3 import MMReplayBuffer
        b = MMReplayBuffer(10_000, spaces.Box(-10, 10, (3,), np.float32), spaces.Discrete(3), "cpu",
                           path={str(path)!r})
        for t in range(200):   # an actor's steps, marked by obs >= 100
            obs = np.full((1, 3), 100 + t, np.float32)
            b.add(obs, obs + 1, np.array([1]), np.array([1.0], np.float32), np.array([False]), [{{}}])
        b.close()
    """)
    actor = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    try:
        seen, deadline = False, time.monotonic() + 60
        while not seen and time.monotonic() < deadline:
            batch = learner.sample(64)
            obs, nxt = batch.observations.numpy(), batch.next_observations.numpy()
            theirs = obs[:, 0] >= 100
            seen = bool(theirs.any())
            np.testing.assert_array_equal(nxt[theirs], obs[theirs] + 1)  # never a torn row
            time.sleep(0.02)
        assert seen, "the learner never sampled the other process's rows"
        assert actor.wait(60) == 0
    finally:
        actor.kill()
    learner.close()


def test_collect_actors_info_verify_and_export_work_on_its_store(tmp_path):
    from click.testing import CliRunner

    from mmreplay.archive import export_archive
    from mmreplay.cli.main import main

    path = tmp_path / "s"
    model = sb3.DQN("MlpPolicy", "CartPole-v1", learning_starts=1000, seed=0, replay_buffer_class=MMReplayBuffer,
                    replay_buffer_kwargs=dict(path=path))
    model.learn(150)
    model.replay_buffer.close()
    mmreplay.collect("CartPole-v1", path, 100, workers=0, progress=False)  # the same schema: it appends
    for args in (["info", str(path)], ["verify", str(path)]):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0, r.output
    report = export_archive(path, tmp_path / "a.zarr")
    assert report.rows >= 250
    with mmreplay.open_store(path) as store:
        info = store.info()
        assert info["transitions"] > 200  # 150 SB3 steps and the collected ones (less autoreset rows)


def test_pickled_buffer_reopens_its_store(tmp_path):
    model = sb3.DQN("MlpPolicy", "CartPole-v1", learning_starts=1000, seed=0, replay_buffer_class=MMReplayBuffer,
                    replay_buffer_kwargs=dict(path=tmp_path / "s"))
    model.learn(100)
    model.save_replay_buffer(tmp_path / "rb.pkl")
    assert (tmp_path / "rb.pkl").stat().st_size < 100_000  # the path and settings, not the rows
    model.load_replay_buffer(tmp_path / "rb.pkl")
    assert model.replay_buffer.sample(16).observations.shape == (16, 4)
    model.replay_buffer.close()


def test_wrong_shapes_and_spaces_name_the_field(tmp_path):
    obs_space, act_space = spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(3)
    b = MMReplayBuffer(1000, obs_space, act_space, "cpu", n_envs=2, path=tmp_path / "s")
    ok = np.zeros((2, 3), np.float32)
    good = dict(obs=ok, next_obs=ok, action=np.array([0, 1]), reward=np.zeros(2, np.float32),
                done=np.zeros(2, bool), infos=[{}, {}])
    for field, bad, words in [("obs", np.zeros((2, 4), np.float32), "'obs'"),
                              ("action", np.array([0, 1, 2]), "'action'"),
                              ("reward", np.zeros(3, np.float32), "'reward'"),
                              ("infos", [{}], "`infos`")]:
        with pytest.raises(mmreplay.SchemaError, match=words):
            b.add(**{**good, field: bad})
    b.add(**good)
    b.close()
    with pytest.raises(mmreplay.SchemaError, match="field 'obs'"):
        MMReplayBuffer(1000, spaces.Box(-1, 1, (5,), np.float32), act_space, "cpu", path=tmp_path / "s")


def test_sb3_sampling_of_dict_observations_equals_sb3s_dict_buffer(tmp_path):
    """Dict observations, the newest steps' pending next_obs included: every batch equals SB3's own,
    as SB3's ``DictReplayBufferSamples`` with its shapes."""
    from stable_baselines3.common.buffers import DictReplayBuffer
    from stable_baselines3.common.type_aliases import DictReplayBufferSamples

    obs_space = spaces.Dict({"pos": spaces.Box(-1, 1, (2,), np.float32), "cell": spaces.Discrete(5)})
    theirs = DictReplayBuffer(100, obs_space, spaces.Discrete(3), "cpu", n_envs=2)
    ours = MMReplayBuffer(100, obs_space, spaces.Discrete(3), "cpu", n_envs=2, path=tmp_path / "s")
    rng = np.random.default_rng(0)

    def obs(t):
        return {"pos": rng.standard_normal((2, 2)).astype(np.float32), "cell": np.array([t % 5, (t + 1) % 5])}

    o = obs(0)
    for t in range(30):
        nxt = obs(t + 1)
        done = np.array([t % 7 == 6, False])
        for b in (theirs, ours):
            b.add(o, nxt, np.array([t % 3, 1]), np.ones(2, np.float32), done, [{}, {}])
        o = nxt
        np.random.seed(t)
        a = theirs.sample(16)
        np.random.seed(t)
        b = ours.sample(16)
        for k in ("pos", "cell"):
            np.testing.assert_array_equal(b.observations[k].numpy(), a.observations[k].numpy())
            np.testing.assert_array_equal(b.next_observations[k].numpy(), a.next_observations[k].numpy())
        np.testing.assert_array_equal(b.actions.numpy(), a.actions.numpy())
        np.testing.assert_array_equal(b.dones.numpy(), a.dones.numpy())
    assert isinstance(b, DictReplayBufferSamples)
    assert b.observations["pos"].shape == (16, 2) and b.observations["cell"].shape == (16, 1)
    assert b.next_observations["cell"].shape == (16, 1)
    ours.close()


def test_windowed_sampling_for_a_store_larger_than_ram(tmp_path):
    """``sampler_kwargs`` reach mmreplay's sampler: a resident set of 2 segments out of 6 (the
    "larger than RAM" mode), and every sampled transition is one SB3's own buffer holds."""
    venv = _venv(False, 1)
    theirs = ReplayBuffer(10_000, venv.observation_space, venv.action_space, "cpu")
    probe = MMReplayBuffer(10_000, venv.observation_space, venv.action_space, "cpu", path=tmp_path / "s",
                           segment_records=1024)
    segment_bytes = probe.store.layout.file_size
    probe.close()
    ours = MMReplayBuffer(10_000, venv.observation_space, venv.action_space, "cpu", path=tmp_path / "s", seed=0,
                          sampling="store", sampler_kwargs=dict(mode="windowed", cache_bytes=3 * segment_bytes))
    _fill([theirs, ours], venv, 6000)
    where = {theirs.observations[p, 0].tobytes(): p for p in range(6000)}
    for _ in range(5):
        batch = ours.sample(64)
        for k in range(64):
            p = where[batch.observations[k].numpy().tobytes()]
            np.testing.assert_array_equal(batch.next_observations[k].numpy(), theirs.next_observations[p, 0])
    stats = ours.sampler.tier_stats()
    assert stats["mode"] == "windowed" and 0 < stats["resident_segments"] < 6
    ours.close()
