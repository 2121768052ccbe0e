"""Adapters for the peer replay buffers timed beside mmreplay by the benchmark harness.

Each peer (Stable-Baselines3, cpprb, TorchRL with memmap storage) is wrapped in a class
with one shared interface (:class:`Peer`) so that a single harness can drive all of them
with the same "vector" workload in one process:

* a transition is ``obs`` (8,) float32, ``next_obs`` (8,) float32, ``action`` int64 scalar,
  ``reward`` float32 scalar, ``terminated`` bool and ``truncated`` bool;
* ``add`` takes arrays with a leading ``n_envs`` dimension (1 for single adds, e.g. 256
  for batched adds);
* ``sample(batch_size)`` returns NumPy arrays under the keys ``obs``, ``next_obs``,
  ``action``, ``reward`` and ``terminated``, flattened to shape ``(batch_size,)`` for the
  scalar fields but otherwise in each library's own dtype (SB3 gives ``terminated`` as
  float32 0/1 and ``action`` as int64; the others keep bool/int64).

Every adapter uses its library's fastest documented path and does as little conversion
as possible, so that the timings measure the peer rather than this glue. The peers store
``next_obs`` explicitly because, unlike mmreplay, they cannot derive it.

None of the peers is a dependency of ``mmreplay``: this module imports with none of them
installed, each adapter imports its library when it is constructed, and :func:`available`
tells which peers can be used in the current environment (``pip install .[bench]``).

Run it directly for a quick self-check that prints rough rates for each available peer::

    python benchmarks/peers.py
"""

from __future__ import annotations

import importlib
import tempfile
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from cpprb import ReplayBuffer as CpprbReplayBuffer
    from stable_baselines3.common.buffers import ReplayBuffer as Sb3ReplayBuffer
    from torchrl.data import ReplayBuffer as TorchRLReplayBuffer

__all__ = [
    "OBS_SHAPE",
    "N_ACTIONS",
    "PEERS",
    "CpprbPeer",
    "Peer",
    "Sb3Peer",
    "TorchRLPeer",
    "available",
]

#: Observation shape of the "vector" workload.
OBS_SHAPE: tuple[int, ...] = (8,)
#: Size of the discrete action space used where a peer needs one (SB3's Discrete space).
N_ACTIONS: int = 4

Batch = dict[str, np.ndarray]


class Peer(Protocol):
    """What the harness needs from a replay buffer under test."""

    name: str

    def __init__(self, capacity: int, n_envs: int, tmpdir: str) -> None: ...

    def add(
        self,
        obs: np.ndarray,
        next_obs: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
    ) -> None:
        """Store ``n_envs`` transitions (every array has leading dimension ``n_envs``)."""
        ...

    def sample(self, batch_size: int) -> Batch:
        """Draw ``batch_size`` transitions uniformly, as NumPy arrays."""
        ...

    def native(self, obs: np.ndarray, next_obs: np.ndarray, action: np.ndarray, reward: np.ndarray,
               terminated: np.ndarray, truncated: np.ndarray) -> Callable[[], None]:
        """The library's own add call on these transitions, its inputs prebuilt in the library's
        native form (as a user of it already has them): calling it runs nothing but that call."""
        ...


class Sb3Peer:
    """Stable-Baselines3 ``ReplayBuffer`` (in-RAM NumPy arrays, samples as torch tensors).

    Configured as SB3's off-policy algorithms use it: ``optimize_memory_usage=False``
    (``next_obs`` stored), ``handle_timeout_termination=True`` (truncations are kept apart
    from terminations through the ``TimeLimit.truncated`` info key, as SB3's VecEnv
    reports them), one buffer column per env, CPU device. SB3 splits ``capacity`` into
    ``capacity // n_envs`` rows of ``n_envs`` transitions.
    """

    name = "sb3"

    # Shared, never-mutated info dicts: SB3 only reads ``info.get("TimeLimit.truncated")``.
    _TIMEOUT_INFO: dict[str, Any] = {"TimeLimit.truncated": True}
    _NO_TIMEOUT_INFO: dict[str, Any] = {}

    def __init__(self, capacity: int, n_envs: int, tmpdir: str) -> None:
        from gymnasium import spaces
        from stable_baselines3.common.buffers import ReplayBuffer

        del tmpdir  # SB3 keeps everything in RAM
        self.n_envs = n_envs
        self._rb: Sb3ReplayBuffer = ReplayBuffer(
            capacity,
            spaces.Box(low=-np.inf, high=np.inf, shape=OBS_SHAPE, dtype=np.float32),
            spaces.Discrete(N_ACTIONS),
            device="cpu",
            n_envs=n_envs,
            optimize_memory_usage=False,
            handle_timeout_termination=True,
        )

    def add(
        self,
        obs: np.ndarray,
        next_obs: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
    ) -> None:
        # SB3 takes done = terminated | truncated plus per-env infos; like its VecEnv, a
        # step that is both terminated and truncated counts as a termination.
        timeouts = (truncated & ~terminated).tolist()
        infos = [self._TIMEOUT_INFO if t else self._NO_TIMEOUT_INFO for t in timeouts]
        self._rb.add(obs, next_obs, action, reward, terminated | truncated, infos)

    def native(self, obs: np.ndarray, next_obs: np.ndarray, action: np.ndarray, reward: np.ndarray,
               terminated: np.ndarray, truncated: np.ndarray) -> Callable[[], None]:
        # a VecEnv user has ``dones`` and ``infos`` from ``step``: they are built here, untimed
        infos = [self._TIMEOUT_INFO if t else self._NO_TIMEOUT_INFO for t in (truncated & ~terminated).tolist()]
        return partial(self._rb.add, obs, next_obs, action, reward, terminated | truncated, infos)

    def sample(self, batch_size: int) -> Batch:
        s = self._rb.sample(batch_size)
        return {
            "obs": s.observations.numpy(),
            "next_obs": s.next_observations.numpy(),
            "action": s.actions.numpy().reshape(-1),
            "reward": s.rewards.numpy().reshape(-1),
            # dones * (1 - timeouts): SB3's "done" with truncations masked out, i.e.
            # ``terminated``, as float32 0/1.
            "terminated": s.dones.numpy().reshape(-1),
        }


class CpprbPeer:
    """cpprb ``ReplayBuffer`` (C++ ring buffer in RAM, samples as NumPy arrays).

    Declared with an ``env_dict`` of exact dtypes; ``add`` takes the batch as keyword
    arrays in one call whatever ``n_envs`` is. ``next_obs`` is stored as its own field
    (not compressed with ``next_of``), as for the other peers.
    """

    name = "cpprb"

    def __init__(self, capacity: int, n_envs: int, tmpdir: str) -> None:
        from cpprb import ReplayBuffer

        del tmpdir  # cpprb keeps everything in RAM
        self.n_envs = n_envs
        self._rb: CpprbReplayBuffer = ReplayBuffer(
            capacity,
            env_dict={
                "obs": {"shape": OBS_SHAPE, "dtype": np.float32},
                "next_obs": {"shape": OBS_SHAPE, "dtype": np.float32},
                "action": {"dtype": np.int64},
                "reward": {"dtype": np.float32},
                "terminated": {"dtype": np.bool_},
                "truncated": {"dtype": np.bool_},
            },
        )

    def add(
        self,
        obs: np.ndarray,
        next_obs: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
    ) -> None:
        self._rb.add(
            obs=obs,
            next_obs=next_obs,
            action=action,
            reward=reward,
            terminated=terminated,
            truncated=truncated,
        )

    def native(self, obs: np.ndarray, next_obs: np.ndarray, action: np.ndarray, reward: np.ndarray,
               terminated: np.ndarray, truncated: np.ndarray) -> Callable[[], None]:
        return partial(self._rb.add, obs=obs, next_obs=next_obs, action=action, reward=reward,
                       terminated=terminated, truncated=truncated)

    def sample(self, batch_size: int) -> Batch:
        s = self._rb.sample(batch_size)
        return {
            "obs": s["obs"],
            "next_obs": s["next_obs"],
            "action": s["action"].reshape(-1),
            "reward": s["reward"].reshape(-1),
            "terminated": s["terminated"].reshape(-1),
        }


class TorchRLPeer:
    """TorchRL ``ReplayBuffer`` over ``LazyMemmapStorage`` (memory-mapped files on disk).

    The storage lives in a fresh subdirectory of ``tmpdir`` and is laid out lazily on the
    first write. Batched adds use the documented fast path ``rb.extend(TensorDict(...,
    batch_size=[n]))``. Single adds (``n_envs == 1``) use ``rb.add`` with an unbatched
    TensorDict: measured here (torchrl 0.14.1, tensordict 0.14.3, torch 2.13 CPU) it is
    about twice as fast as ``extend`` with a batch of one. The arrays are wrapped with
    ``torch.from_numpy`` (no copy); the storage copies them in.
    """

    name = "torchrl"

    def __init__(
        self, capacity: int, n_envs: int, tmpdir: str, *, batch_size: int | None = 256
    ) -> None:
        import torch
        from tensordict import TensorDict
        from torchrl.data import LazyMemmapStorage, RandomSampler, ReplayBuffer

        self.n_envs = n_envs
        self._torch = torch
        self._td_cls = TensorDict
        self.scratch_dir = tempfile.mkdtemp(prefix="torchrl-", dir=tmpdir)
        # ``batch_size`` is the constructor default for ``rb.sample()``; ``sample`` passes
        # its own size, which TorchRL accepts silently when the two agree (and with a
        # one-time warning when they do not).
        self._rb: TorchRLReplayBuffer = ReplayBuffer(
            storage=LazyMemmapStorage(capacity, scratch_dir=self.scratch_dir),
            batch_size=batch_size,
            sampler=RandomSampler(),
        )

    def add(
        self,
        obs: np.ndarray,
        next_obs: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
    ) -> None:
        self.native(obs, next_obs, action, reward, terminated, truncated)()

    def native(self, obs: np.ndarray, next_obs: np.ndarray, action: np.ndarray, reward: np.ndarray,
               terminated: np.ndarray, truncated: np.ndarray) -> Callable[[], None]:
        # a TorchRL user's env already returns TensorDicts: built here, untimed
        from_numpy = self._torch.from_numpy
        if self.n_envs == 1:
            # Single transition: drop the leading dim (0-d arrays for the scalars).
            return partial(
                self._rb.add,
                self._td_cls(
                    {
                        "obs": from_numpy(obs[0]),
                        "next_obs": from_numpy(next_obs[0]),
                        "action": from_numpy(action.reshape(())),
                        "reward": from_numpy(reward.reshape(())),
                        "terminated": from_numpy(terminated.reshape(())),
                        "truncated": from_numpy(truncated.reshape(())),
                    },
                    batch_size=[],
                ),
            )
        return partial(
            self._rb.extend,
            self._td_cls(
                {
                    "obs": from_numpy(obs),
                    "next_obs": from_numpy(next_obs),
                    "action": from_numpy(action),
                    "reward": from_numpy(reward),
                    "terminated": from_numpy(terminated),
                    "truncated": from_numpy(truncated),
                },
                batch_size=[obs.shape[0]],
            ),
        )

    def sample(self, batch_size: int) -> Batch:
        td = self._rb.sample(batch_size)
        return {
            "obs": td.get("obs").numpy(),
            "next_obs": td.get("next_obs").numpy(),
            "action": td.get("action").numpy().reshape(-1),
            "reward": td.get("reward").numpy().reshape(-1),
            "terminated": td.get("terminated").numpy().reshape(-1),
        }


#: The peers by short name, in the order the harness reports them.
PEERS: dict[str, type[Peer]] = {
    "sb3": Sb3Peer,
    "cpprb": CpprbPeer,
    "torchrl": TorchRLPeer,
}

# What each peer's adapter imports when it is constructed.
_REQUIRES: dict[str, tuple[str, ...]] = {
    "sb3": ("gymnasium", "stable_baselines3.common.buffers"),
    "cpprb": ("cpprb",),
    "torchrl": ("torch", "tensordict", "torchrl.data"),
}


def available() -> dict[str, str | None]:
    """Map each peer name to ``None`` when it can be imported, else the import error."""
    result: dict[str, str | None] = {}
    for name, modules in _REQUIRES.items():
        error: str | None = None
        for module in modules:
            try:
                importlib.import_module(module)
            except Exception as exc:  # noqa: BLE001 - a broken install (ABI, missing lib) counts too
                error = f"{type(exc).__name__}: {exc}"
                break
        result[name] = error
    return result


def _transitions(n: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """``n`` random transitions of the vector workload, as (obs, next_obs, ...) arrays."""
    return (
        rng.standard_normal((n, *OBS_SHAPE), dtype=np.float32),
        rng.standard_normal((n, *OBS_SHAPE), dtype=np.float32),
        rng.integers(0, N_ACTIONS, size=n, dtype=np.int64),
        rng.standard_normal(n, dtype=np.float32),
        rng.random(n) < 0.01,
        rng.random(n) < 0.001,
    )


def _self_check(
    capacity: int = 1_000_000,
    n_single: int = 10_000,
    n_batches: int = 100,
    n_envs: int = 256,
    n_samples: int = 10,
    batch_size: int = 256,
) -> None:
    """Drive every available peer through a small workload and print rough rates."""
    rng = np.random.default_rng(0)
    single = _transitions(n_single, rng)
    single_rows = [tuple(a[i : i + 1] for a in single) for i in range(n_single)]
    batched = _transitions(n_batches * n_envs, rng)
    batch_rows = [
        tuple(a[i * n_envs : (i + 1) * n_envs] for a in batched) for i in range(n_batches)
    ]
    keys = ("obs", "next_obs", "action", "reward", "terminated")

    for name, error in available().items():
        if error is not None:
            print(f"{name:8s} unavailable: {error}")
            continue
        cls = PEERS[name]
        with tempfile.TemporaryDirectory(prefix=f"peers-{name}-") as tmpdir:
            # Single adds; construction and the first add (which lays out lazy storage)
            # are reported apart from the steady-state rate.
            t0 = time.perf_counter()
            peer = cls(capacity, 1, tmpdir)
            peer.add(*single_rows[0])
            init_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            for row in single_rows[1:]:
                peer.add(*row)
            single_rate = (n_single - 1) / (time.perf_counter() - t0)

            bpeer = cls(capacity, n_envs, tmpdir)
            bpeer.add(*batch_rows[0])
            t0 = time.perf_counter()
            for rows in batch_rows[1:]:
                bpeer.add(*rows)
            batched_rate = (n_batches - 1) * n_envs / (time.perf_counter() - t0)

            out = bpeer.sample(batch_size)  # warm-up, and a shape check
            assert set(keys) <= out.keys(), out.keys()
            assert all(isinstance(out[k], np.ndarray) for k in keys)
            assert out["obs"].shape == (batch_size, *OBS_SHAPE), out["obs"].shape
            assert all(out[k].shape == (batch_size,) for k in keys[2:])
            t0 = time.perf_counter()
            for _ in range(n_samples):
                bpeer.sample(batch_size)
            sample_rate = n_samples / (time.perf_counter() - t0)

            print(
                f"{name:8s} init {init_s * 1e3:7.1f} ms | single adds {single_rate:11,.0f}/s"
                f" | batched ({n_envs}) rows {batched_rate:13,.0f}/s"
                f" | sample ({batch_size}) {sample_rate:9,.0f} batches/s"
            )
            del peer, bpeer


if __name__ == "__main__":
    _self_check()
