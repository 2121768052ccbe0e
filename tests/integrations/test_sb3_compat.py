"""MMReplayBuffer as SB3 code sees it: what ``add`` accepts, SB3's arrays (``observations``, ...,
``pos``, ``full``, ``size()``, ``reset()``) against SB3's own ReplayBuffer fed the same calls, and the
action scale recorded in a store it creates."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

sb3 = pytest.importorskip("stable_baselines3")

from gymnasium import spaces  # noqa: E402
from stable_baselines3.common.buffers import DictReplayBuffer, ReplayBuffer  # noqa: E402

import mmreplay  # noqa: E402
from mmreplay.integrations.sb3 import MMReplayBuffer  # noqa: E402

ARRAYS = ("observations", "next_observations", "actions", "rewards", "dones", "timeouts")


def _steps(rng: np.random.Generator, obs_space: spaces.Space, n: int, steps: int):
    """SB3-like ``add`` arguments: episodes that end by termination or by a time limit (an info's
    ``TimeLimit.truncated``), ``next_obs`` continuing into the next step's ``obs`` otherwise."""

    def obs() -> np.ndarray:
        return np.stack([obs_space.sample() for _ in range(n)])

    o = obs()
    for t in range(steps):
        nxt = obs()
        done = rng.random(n) < 0.2
        trunc = done & (rng.random(n) < 0.5)
        infos = [{"TimeLimit.truncated": True} if trunc[i] else {} for i in range(n)]
        reward = rng.standard_normal(n).astype(np.float32)
        yield t, o, nxt, done, reward, infos
        o = np.where(done.reshape(n, *[1] * (nxt.ndim - 1)), obs(), nxt)


def _both(tmp_path, obs_space, act_space, size, n, **kw):
    theirs = ReplayBuffer(size, obs_space, act_space, "cpu", n_envs=n, **kw)
    ours = MMReplayBuffer(size, obs_space, act_space, "cpu", n_envs=n, path=tmp_path / "s", **kw)
    return theirs, ours


def _assert_arrays_equal(theirs, ours, names=ARRAYS) -> None:
    for name in names:
        a, b = getattr(theirs, name), getattr(ours, name)
        if isinstance(a, dict):
            assert set(a) == set(b), name
            for k in a:
                assert b[k].dtype == a[k].dtype and b[k].shape == a[k].shape, (name, k)
                np.testing.assert_array_equal(b[k], a[k], err_msg=f"{name}[{k!r}]")
        else:
            assert b.dtype == a.dtype and b.shape == a.shape, (name, b.dtype, a.dtype, b.shape, a.shape)
            np.testing.assert_array_equal(b, a, err_msg=name)
    assert (ours.pos, ours.full, ours.size()) == (theirs.pos, theirs.full, theirs.size())


@pytest.mark.parametrize(("box", "handle_timeouts"), [(False, True), (True, False)])
def test_arrays_equal_sb3s_own_buffer_step_by_step(tmp_path, box, handle_timeouts):
    """Every array, ``pos``, ``full`` and ``size()`` equal SB3's after each step, before and after the
    slot table wraps, the newest steps' pending ``next_obs`` included."""
    n, size = 2, 2 * 9
    obs_space = spaces.Box(-5, 5, (3,), np.float32, seed=1)
    act_space = spaces.Box(-1, 1, (2,), np.float64, seed=2) if box else spaces.Discrete(4, seed=2)
    theirs, ours = _both(tmp_path, obs_space, act_space, size, n, handle_timeout_termination=handle_timeouts)
    rng = np.random.default_rng(0)
    ends = truncs = 0
    for t, o, nxt, done, reward, infos in _steps(rng, obs_space, n, 25):
        action = np.stack([act_space.sample() for _ in range(n)])
        for b in (theirs, ours):
            b.add(o, nxt, action, reward, done, infos)
        ends, truncs = ends + int(done.sum()), truncs + sum("TimeLimit.truncated" in i for i in infos)
        if t % 3 == 0 or t > 15:
            _assert_arrays_equal(theirs, ours)
    assert ours.full and ends > truncs > 0
    if box:
        assert ours.actions.dtype == np.float32  # float64 Box actions as SB3 keeps them
    ours.close()


def test_dict_and_discrete_observations_equal_sb3s_dict_buffer(tmp_path):
    """Dict spaces with a Discrete key (SB3's obs_shape (1,), the store's field ())."""
    n, size = 2, 2 * 6
    obs_space = spaces.Dict({"pos": spaces.Box(-1, 1, (2,), np.float32), "cell": spaces.Discrete(5)}, seed=3)
    theirs = DictReplayBuffer(size, obs_space, spaces.Discrete(3), "cpu", n_envs=n)
    ours = MMReplayBuffer(size, obs_space, spaces.Discrete(3), "cpu", n_envs=n, path=tmp_path / "s")
    rng = np.random.default_rng(1)

    def obs():
        return {"pos": rng.standard_normal((n, 2)).astype(np.float32), "cell": rng.integers(0, 5, n)}

    o = obs()
    for t in range(10):
        nxt = obs()
        done = np.array([t % 4 == 3, False])
        for b in (theirs, ours):
            b.add({k: v.copy() for k, v in o.items()}, {k: v.copy() for k, v in nxt.items()}, np.array([t % 3, 1]),
                  np.ones(n, np.float32), done, [{}, {}])
        o = obs() if done.any() else nxt
    _assert_arrays_equal(theirs, ours)
    assert ours.observations["cell"].shape == (6, n, 1)
    ours.close()


def test_arrays_are_read_only_copies_and_dones_writes_change_nothing(tmp_path):
    theirs, ours = _both(tmp_path, spaces.Box(-1, 1, (3,), np.float32, seed=0), spaces.Discrete(2), 10, 1)
    for _, o, nxt, done, reward, infos in _steps(np.random.default_rng(2), theirs.observation_space, 1, 4):
        ours.add(o, nxt, np.array([1]), reward, done, infos)
    obs = ours.observations
    with pytest.raises(ValueError, match="read-only"):
        obs[0, 0, 0] = 7.0
    with pytest.raises(ValueError, match="read-only"):
        ours.rewards[0] = 1.0
    dones = ours.dones
    before = dones.copy()
    dones[:] = 1.0  # what SB3's learn() does with optimize_memory_usage (at the last step only)
    np.testing.assert_array_equal(ours.dones, before)
    assert ours.observations is not obs  # each access assembles a new array
    ours.close()


def test_add_takes_what_sb3s_add_takes(tmp_path):
    """Inputs SB3's ReplayBuffer.add accepts and reshapes, broadcasts or casts: the same calls leave
    both buffers with equal arrays and equal samples."""
    # one env: an unbatched multi-dimensional action, an unbatched observation, a scalar reward,
    # float64 observations for a float32 space, int done flags
    obs_space, act_space = spaces.Box(-1, 1, (3,), np.float32), spaces.Box(-1, 1, (4, 2), np.float32, seed=4)
    theirs, ours = _both(tmp_path, obs_space, act_space, 20, 1)
    rng = np.random.default_rng(3)
    for t in range(12):
        o, nxt = rng.uniform(-1, 1, 3), rng.uniform(-1, 1, 3)  # float64, shape (3,)
        args = (o, nxt, act_space.sample(), float(t), np.array([int(t == 5)]), [{}])
        for b in (theirs, ours):
            b.add(*args)
    _assert_arrays_equal(theirs, ours)
    np.random.seed(0)
    a = theirs.sample(16)
    np.random.seed(0)
    b = ours.sample(16)
    for f in ("observations", "actions", "next_observations", "dones", "rewards"):
        np.testing.assert_array_equal(getattr(b, f).numpy(), getattr(a, f).numpy(), err_msg=f)
    ours.close()

    # Discrete observations of 2 envs as (n_envs,) and as (n_envs, 1)
    theirs, ours = _both(tmp_path / "d", spaces.Discrete(7), spaces.Discrete(2), 10, 2)
    for t in range(4):
        o = np.array([t, t + 1]) if t % 2 else np.array([[t], [t + 1]])
        for b in (theirs, ours):
            b.add(o, o + 1, np.array([0, 1]), np.zeros(2, np.float32), np.zeros(2, bool), [{}, {}])
    _assert_arrays_equal(theirs, ours)
    ours.close()


def test_add_refuses_what_sb3_cannot_store_naming_the_field(tmp_path):
    b = MMReplayBuffer(10, spaces.Box(-1, 1, (3,), np.float32), spaces.Box(-1, 1, (2,), np.float32), "cpu",
                       n_envs=2, path=tmp_path / "s")
    ok = np.zeros((2, 3), np.float32)
    good = dict(obs=ok, next_obs=ok, action=np.zeros((2, 2), np.float32), reward=np.zeros(2, np.float32),
                done=np.zeros(2, bool), infos=[{}, {}])
    with pytest.raises(mmreplay.SchemaError, match=r"field 'action': expected shape \(2, 2\) .*any shape of that size"):
        b.add(**{**good, "action": np.zeros(3, np.float32)})  # SB3's reshape fails too
    with pytest.raises(mmreplay.SchemaError, match="field 'obs'"):
        b.add(**{**good, "obs": np.zeros((2, 2), np.float32)})
    with pytest.raises(mmreplay.SchemaError, match="field 'obs'.*dtype"):
        b.add(**{**good, "obs": np.array([["a"] * 3] * 2)})
    b.add(**good)
    b.close()


def test_infos_are_read_only_when_sb3_reads_them(tmp_path):
    """With ``handle_timeout_termination=False`` SB3 reads no ``infos``: anything goes, and a done is a
    termination. With True one dict per env is required, and TimeLimit.truncated makes it a truncation."""
    space = spaces.Box(-1, 1, (1,), np.float32)
    lax = MMReplayBuffer(10, space, spaces.Discrete(2), "cpu", n_envs=2, handle_timeout_termination=False,
                         path=tmp_path / "lax")
    o = np.zeros((2, 1), np.float32)
    lax.add(o, o + 1, np.array([0, 1]), np.ones(2), np.array([True, False]), None)
    lax.add(o + 1, o + 2, np.array([0, 1]), np.ones(2), np.array([False, True]), [])
    lax.close()
    strict = MMReplayBuffer(10, space, spaces.Discrete(2), "cpu", n_envs=2, path=tmp_path / "strict")
    with pytest.raises(mmreplay.SchemaError, match="`infos`"):
        strict.add(o, o + 1, np.array([0, 1]), np.ones(2), np.array([True, False]), None)
    strict.add(o, o + 1, np.array([0, 1]), np.ones(2), np.array([True, True]), [{"TimeLimit.truncated": True}, {}])
    np.testing.assert_array_equal(strict.timeouts[0], [1.0, 0.0])
    np.testing.assert_array_equal(strict.dones[0], [1.0, 1.0])
    strict.close()
    with mmreplay.open_store(tmp_path / "lax") as store:
        b = store.transitions(store.transition_ids())
        assert b.terminated.sum() == 2 and not b.truncated.any()
    with mmreplay.open_store(tmp_path / "strict") as store:
        b = store.transitions(store.transition_ids())
        assert b.terminated.tolist() == [False, True] and b.truncated.tolist() == [True, False]


def test_full_set_by_hand_on_an_empty_buffer_samples_zeros_as_sb3(tmp_path):
    """SB3's own test sets ``full = True`` on an empty buffer and samples: SB3's zero-filled arrays
    give zeros of the right dtypes, and so does this buffer (no store row is read)."""
    obs_space = spaces.Dict({"a": spaces.Box(0, 100, (2,), np.uint16), "b": spaces.Box(0, 1, (1,), np.float16)})
    theirs = DictReplayBuffer(4, obs_space, spaces.Box(-1, 1, (3,), np.float64), "cpu")
    ours = MMReplayBuffer(4, obs_space, spaces.Box(-1, 1, (3,), np.float64), "cpu", path=tmp_path / "s")
    theirs.full = ours.full = True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.random.seed(1)
        a = theirs.sample(8)
        np.random.seed(1)
        b = ours.sample(8)
    for k in ("a", "b"):
        assert b.observations[k].dtype == a.observations[k].dtype and b.observations[k].shape == a.observations[k].shape
        assert not b.observations[k].any() and not b.next_observations[k].any()
    assert b.actions.dtype == a.actions.dtype and b.actions.shape == (8, 3) and not b.actions.any()
    assert not b.rewards.any() and not b.dones.any()
    # half filled, then full by hand: the filled slots are the stored transitions, the rest zeros
    ours.full = False
    obs = {"a": np.array([[7, 8]], np.uint16), "b": np.array([[0.5]], np.float16)}
    ours.add(obs, obs, np.ones((1, 3)), np.array([2.0]), np.array([False]), [{}])
    ours.full = True
    got = ours.sample(64)
    rewards = got.rewards.numpy()[:, 0]
    assert set(rewards.tolist()) == {0.0, 2.0}
    np.testing.assert_array_equal(got.observations["a"].numpy()[rewards == 2.0], [[7, 8]] * int((rewards == 2.0).sum()))
    ours.close()


def test_reset_forgets_the_slots_as_sb3s_and_the_store_keeps_its_rows(tmp_path):
    space = spaces.Box(-10, 10, (1,), np.float32)
    theirs, ours = _both(tmp_path, space, spaces.Discrete(2), 8, 1)

    def add(b, t):
        o = np.array([[t]], np.float32)
        b.add(o, o + 1, np.array([0]), np.array([float(t)]), np.array([False]), [{}])

    for t in range(5):
        add(theirs, t), add(ours, t)
    theirs.reset(), ours.reset()
    assert (ours.pos, ours.full, ours.size()) == (0, False, 0)
    with pytest.raises(ValueError):  # SB3 draws from an empty range too
        theirs.sample(4)
    with pytest.raises(ValueError):
        ours.sample(4)
    for t in range(100, 103):
        add(theirs, t), add(ours, t)
    _assert_arrays_equal(theirs, ours)  # the slots past pos still hold the old steps, as in SB3's arrays
    assert set(ours.sample(64).rewards.numpy()[:, 0].tolist()) == {100.0, 101.0, 102.0}
    assert ours.rewards[:5, 0].tolist() == [100.0, 101.0, 102.0, 3.0, 4.0]
    ours.close()
    with mmreplay.open_store(tmp_path / "s") as store:
        assert len(store.transition_ids()) == 8  # every step still stored
    store_mode = MMReplayBuffer(8, space, spaces.Discrete(2), "cpu", path=tmp_path / "t", sampling="store")
    with pytest.raises(NotImplementedError, match="new `path`"):
        store_mode.reset()
    with pytest.raises(AttributeError, match="sampling='sb3'"):
        store_mode.observations  # noqa: B018
    store_mode.close()


def test_arrays_too_large_to_assemble_are_refused_in_one_line(tmp_path):
    b = MMReplayBuffer(1000, spaces.Box(0, 255, (16, 16), np.uint8), spaces.Discrete(2), "cpu", n_envs=2,
                       path=tmp_path / "s", max_assemble_bytes=100_000)
    assert b.rewards.shape == (500, 2)  # 4,000 bytes
    with pytest.raises(MemoryError) as err:
        b.observations  # noqa: B018  (500 x 2 x 256 bytes)
    msg = str(err.value)
    assert "\n" not in msg and "observations" in msg and "256,000 bytes" in msg and "max_assemble_bytes=100,000" in msg
    b.max_assemble_bytes = 1 << 20
    assert b.observations.shape == (500, 2, 16, 16)
    b.close()


def test_learn_twice_with_optimize_memory_usage(tmp_path):
    """SB3's learn() with optimize_memory_usage writes ``replay_buffer.dones`` at the last step (to cut
    the episode in its own layout): a second learn() runs on, and every step is stored."""
    model = sb3.DQN("MlpPolicy", "CartPole-v1", learning_starts=50, seed=0, optimize_memory_usage=True,
                    replay_buffer_class=MMReplayBuffer, replay_buffer_kwargs=dict(path=tmp_path / "s"),
                    policy_kwargs=dict(net_arch=[16]))
    model.learn(120)
    with pytest.warns(UserWarning, match="truncated"):  # SB3's own warning, then its write into dones
        model.learn(80)
    model.replay_buffer.close()
    with mmreplay.open_store(tmp_path / "s") as store:
        assert len(store.transition_ids()) == 200


def _metadata(path) -> dict:
    with mmreplay.open_store(path) as store:
        return json.loads(json.dumps(store.metadata))


def test_a_created_store_records_the_action_scale(tmp_path):
    obs = spaces.Box(-1, 1, (3,), np.float32)
    box = spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 5.0], np.float32))
    MMReplayBuffer(10, obs, box, "cpu", path=tmp_path / "box").close()
    md = _metadata(tmp_path / "box")
    assert md["writer"] == "stable-baselines3" and md["action_scale"] == "unit"
    assert md["action_space"] == {"low": [-2.0, 0.0], "high": [2.0, 5.0]}
    grid = spaces.Box(-3, 3, (2, 2), np.float64)
    MMReplayBuffer(10, obs, grid, "cpu", path=tmp_path / "grid").close()
    assert _metadata(tmp_path / "grid")["action_space"] == {"low": [-3.0] * 4, "high": [3.0] * 4}  # flat, C order
    for name, space in [("discrete", spaces.Discrete(3)), ("multi", spaces.MultiDiscrete([2, 3]))]:
        MMReplayBuffer(10, obs, space, "cpu", path=tmp_path / name).close()
        md = _metadata(tmp_path / name)
        assert md["writer"] == "stable-baselines3" and "action_scale" not in md and "action_space" not in md


def test_sac_stores_unit_actions_that_the_recorded_bounds_map_back(tmp_path):
    """Pendulum's torque is in [-2, 2]; SAC hands the buffer actions in [-1, 1] (its random warm-up
    ones included), and the bounds in the metadata map them back onto the env's range."""
    model = sb3.SAC("MlpPolicy", "Pendulum-v1", learning_starts=200, seed=0, replay_buffer_class=MMReplayBuffer,
                    replay_buffer_kwargs=dict(path=tmp_path / "s"), policy_kwargs=dict(net_arch=[16]))
    model.learn(150)
    model.replay_buffer.close()
    md = _metadata(tmp_path / "s")
    assert md["action_scale"] == "unit" and md["action_space"] == {"low": [-2.0], "high": [2.0]}
    with mmreplay.open_store(tmp_path / "s") as store:
        a = store.transitions(store.transition_ids()).action[:, 0]
    assert len(a) == 150 and np.abs(a).max() <= 1.0 and np.abs(a).max() > 0.9
    low, high = np.array(md["action_space"]["low"]), np.array(md["action_space"]["high"])
    env_actions = low + (a + 1.0) * 0.5 * (high - low)  # SB3's unscale_action
    assert env_actions.min() >= -2.0 and env_actions.max() <= 2.0 and np.abs(env_actions).max() > 1.8


def test_appending_unit_actions_to_an_env_scale_store_warns(tmp_path):
    obs, box = spaces.Box(-1, 1, (3,), np.float32), spaces.Box(-2, 2, (1,), np.float32)
    schema = mmreplay.Schema.from_spaces(obs, box)
    mmreplay.create_store(tmp_path / "s", schema, capacity=100, metadata={"action_scale": "env"}).close()
    with pytest.warns(UserWarning, match="action_scale='env'"):
        MMReplayBuffer(10, obs, box, "cpu", path=tmp_path / "s").close()
