"""The benchmark kit: what every script in ``benchmarks/`` shares, written once.

* **timing**: ``quiesce`` (finish earlier writeback before a timed phase), ``rate`` (calls per
  second of a time-bounded loop after a warm-up call), ``median``;
* **page cache**: ``drop_pages`` (evict a store's segment files from the page cache without root:
  ``posix_fadvise(DONTNEED)`` per file), ``warm_pages`` (read them all in);
* **memory**: ``rss``, ``mem_available``, ``mem_status`` (this process's peak and current RSS),
  ``meminfo``, ``dir_bytes``, ``gb``;
* **Atari frames**: ``make_pool`` (distinct random 84x84 frames, each carrying its id in its first
  two pixels, so a stack handed back can be checked frame by frame), ``frame_ids``;
* **tables**: ``table`` (a markdown table, as docs/results.md quotes them), ``ratio``;
* **peer adapters**: the replay buffers timed beside mmreplay (Stable-Baselines3, cpprb, TorchRL
  with memmap storage) behind one interface (``Peer``), with ``available`` telling which ones import
  here (``pip install -e .[bench]``). None is a dependency of mmreplay: each adapter imports its
  library when it is made.

The scripts import it as ``kit`` (they run as ``python benchmarks/NAME.py``, with this folder on
``sys.path``). ``python benchmarks/kit.py`` drives every available peer through a small workload
and prints rough rates: a self-check of the adapters.
"""

from __future__ import annotations

import gc
import importlib
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import numpy as np

GB = 1e9


# -- timing ---------------------------------------------------------------------------------------
def data_path_rates(store: Any, batch: int, *, rounds: int, workers: int, device: Any, timer: Callable[..., float],
                    prefetch: int = 3) -> dict[str, list[float]]:
    """Batches/s of the data path alone for one batch size (Atari stacks of 4, interleaved over
    ``rounds``, a sampler seeded by the round): synchronous (``sampler.sample`` + ``tensor_batch``)
    and ``BatchLoader`` with 1 and ``workers`` gather threads. ``timer(op)`` times one mode."""
    import mmreplay
    from mmreplay.loader import tensor_batch

    modes = {"synchronous": 0, "BatchLoader workers=1": 1, f"BatchLoader workers={workers}": workers}
    got: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(rounds):
        for mode, n in modes.items():
            sampler = mmreplay.UniformSampler(store, frame_stack=4, seed=r)
            if n == 0:
                got[mode].append(timer(lambda: tensor_batch(sampler.sample(batch), device)))
                continue
            with mmreplay.BatchLoader(sampler, batch, device=device, prefetch=prefetch, workers=n) as loader:
                got[mode].append(timer(lambda: next(loader)))
    return got


def quiesce() -> None:
    """Let the kernel finish writing back earlier phases' dirty pages, so no system is timed
    while another one's disk traffic is still in flight."""
    gc.collect()
    os.sync()
    time.sleep(0.5)


def rate(op: Callable[[], object], seconds: float, every: int = 1) -> float:
    """Calls of ``op`` per second: one warm-up call, then calls in groups of ``every`` until
    ``seconds`` have passed (the clock is read once per group)."""
    op()
    n = 0
    t0 = time.perf_counter()
    while True:
        for _ in range(every):
            op()
        n += every
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return n / dt


def median(xs: Iterable[float]) -> float:
    """The median (nan for no values)."""
    xs = list(xs)
    return float(np.median(xs)) if xs else float("nan")


# -- page cache -----------------------------------------------------------------------------------
def _segment_files(store_path: Path) -> list[Path]:
    return sorted((Path(store_path) / "segments").iterdir())


def drop_pages(store_path: Path) -> None:
    """Evict a store's segment files from the page cache, without root: ``POSIX_FADV_DONTNEED``
    per file. Pages a process still maps stay: unmap them first (``store.reader.unmap_pages()``)."""
    for f in _segment_files(store_path):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm_pages(store_path: Path) -> None:
    """Read every segment file of a store once, so its pages are in the page cache."""
    buf = bytearray(8 << 20)
    for f in _segment_files(store_path):
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass


# -- memory ---------------------------------------------------------------------------------------
def rss() -> int:
    """This process's resident set, in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def mem_available() -> int:
    """The kernel's ``MemAvailable``, in bytes (free pages where /proc/meminfo is missing)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def mem_status() -> dict[str, int]:
    """This process's ``VmHWM`` (peak RSS), ``VmRSS``, ``RssAnon`` and ``RssFile``, in bytes."""
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            k, _, v = line.partition(":")
            if k in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0]) * 1024
    return out


def meminfo() -> dict[str, int]:
    """/proc/meminfo, in bytes."""
    out = {}
    with open("/proc/meminfo") as fh:
        for line in fh:
            k, _, v = line.partition(":")
            out[k] = int(v.split()[0]) * 1024
    return out


def dir_bytes(path: Path) -> int:
    """The sizes of every file under ``path``."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def gb(n: float) -> str:
    """``n`` bytes in GB, two decimals."""
    return f"{n / GB:.2f} GB"


# -- Atari frames ---------------------------------------------------------------------------------
H = W = 84
POOL = 1000  # distinct random frames, cycled


def make_pool(rng: np.random.Generator) -> np.ndarray:
    """``POOL`` distinct random 84x84 uint8 frames; frame k carries k in its first two pixels."""
    pool = rng.integers(0, 256, size=(POOL, H, W), dtype=np.uint8)
    k = np.arange(POOL)
    pool[:, 0, 0] = k % 256
    pool[:, 0, 1] = k // 256
    return pool


def frame_ids(frames: np.ndarray) -> np.ndarray:
    """The pool id each frame of ``(..., H, W)`` carries (``make_pool``)."""
    return frames[..., 0, 0].astype(np.int64) + 256 * frames[..., 0, 1].astype(np.int64)


# -- tables ---------------------------------------------------------------------------------------
def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A markdown table: numbers with thousands separators (no decimals), everything else as is."""
    def cell(x: object) -> str:
        if isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool):
            return f"{x:,.0f}" if np.isfinite(x) else "n/a"
        return str(x)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def ratio(a: float, b: float) -> str:
    """``a / b`` as ``1.23x`` (``n/a`` when b is not a positive number)."""
    return f"{a / b:.2f}x" if b and np.isfinite(b) and b > 0 else "n/a"


# -- peer adapters --------------------------------------------------------------------------------
#: Observation shape of the "vector" workload.
OBS_SHAPE: tuple[int, ...] = (8,)
#: Size of the discrete action space used where a peer needs one (SB3's Discrete space).
N_ACTIONS: int = 4

Batch = dict[str, np.ndarray]


class Peer(Protocol):
    """What the harness needs from a replay buffer under test.

    A transition is ``obs`` (8,) float32, ``next_obs`` (8,) float32, ``action`` int64, ``reward``
    float32, ``terminated`` and ``truncated`` bool; every array given to ``add``/``native`` has a
    leading ``n_envs`` dimension. ``sample(batch_size)`` returns numpy arrays under ``obs``,
    ``next_obs``, ``action``, ``reward`` and ``terminated``, the scalar fields flattened to
    ``(batch_size,)``, each in its library's own dtype. The peers store ``next_obs`` explicitly
    because, unlike mmreplay, they cannot derive it.
    """

    name: str

    def __init__(self, capacity: int, n_envs: int, tmpdir: str) -> None: ...

    def native(self, obs: np.ndarray, next_obs: np.ndarray, action: np.ndarray, reward: np.ndarray,
               terminated: np.ndarray, truncated: np.ndarray) -> Callable[[], None]:
        """The library's own add call on these transitions, its inputs prebuilt in the library's
        native form (as a user of it already has them): calling it runs nothing but that call."""
        ...

    def add(self, *transitions: np.ndarray) -> None:
        """Store ``n_envs`` transitions."""
        ...

    def sample(self, batch_size: int) -> Batch:
        """Draw ``batch_size`` transitions uniformly, as numpy arrays."""
        ...


class _Adapter:
    """What every adapter shares: ``add`` is its native call, made and run; ``sample`` flattens
    the scalar fields of what ``_draw`` returns."""

    def add(self, *transitions: np.ndarray) -> None:
        self.native(*transitions)()  # type: ignore[attr-defined]

    def sample(self, batch_size: int) -> Batch:
        obs, next_obs, action, reward, terminated = self._draw(batch_size)  # type: ignore[attr-defined]
        return {"obs": obs, "next_obs": next_obs, "action": action.reshape(-1), "reward": reward.reshape(-1),
                "terminated": terminated.reshape(-1)}


class Sb3Peer(_Adapter):
    """Stable-Baselines3 ``ReplayBuffer`` (in-RAM numpy arrays, samples as torch tensors), as SB3's
    off-policy algorithms use it: ``next_obs`` stored, truncations kept apart through the
    ``TimeLimit.truncated`` info key (a step both terminated and truncated counts as a
    termination, as in SB3's VecEnv), one column per env, CPU; ``terminated`` comes back as
    float32 0/1."""

    name = "sb3"
    _TIMEOUT_INFO: dict[str, Any] = {"TimeLimit.truncated": True}  # shared, never mutated: SB3 only reads them
    _NO_TIMEOUT_INFO: dict[str, Any] = {}

    def __init__(self, capacity: int, n_envs: int, tmpdir: str) -> None:
        from gymnasium import spaces
        from stable_baselines3.common.buffers import ReplayBuffer

        del tmpdir  # SB3 keeps everything in RAM
        self.n_envs = n_envs
        self._rb = ReplayBuffer(capacity, spaces.Box(low=-np.inf, high=np.inf, shape=OBS_SHAPE, dtype=np.float32),
                                spaces.Discrete(N_ACTIONS), device="cpu", n_envs=n_envs,
                                optimize_memory_usage=False, handle_timeout_termination=True)

    def native(self, obs, next_obs, action, reward, terminated, truncated):  # noqa: ANN001, ANN201
        # a VecEnv user has ``dones`` and ``infos`` from ``step``: they are built here, untimed
        infos = [self._TIMEOUT_INFO if t else self._NO_TIMEOUT_INFO for t in (truncated & ~terminated).tolist()]
        return partial(self._rb.add, obs, next_obs, action, reward, terminated | truncated, infos)

    def _draw(self, batch_size: int) -> tuple[np.ndarray, ...]:
        s = self._rb.sample(batch_size)  # dones * (1 - timeouts): SB3's ``terminated``
        return (s.observations.numpy(), s.next_observations.numpy(), s.actions.numpy(), s.rewards.numpy(),
                s.dones.numpy())


class CpprbPeer(_Adapter):
    """cpprb ``ReplayBuffer`` (a C++ ring buffer in RAM, samples as numpy arrays), declared with
    exact dtypes; ``add`` takes the batch as keyword arrays in one call; ``next_obs`` is a field
    of its own (not compressed with ``next_of``), as for the other peers."""

    name = "cpprb"
    _FIELDS = ("obs", "next_obs", "action", "reward", "terminated", "truncated")

    def __init__(self, capacity: int, n_envs: int, tmpdir: str) -> None:
        from cpprb import ReplayBuffer

        del tmpdir  # cpprb keeps everything in RAM
        self.n_envs = n_envs
        obs = {"shape": OBS_SHAPE, "dtype": np.float32}
        self._rb = ReplayBuffer(capacity, env_dict={
            "obs": obs, "next_obs": obs, "action": {"dtype": np.int64}, "reward": {"dtype": np.float32},
            "terminated": {"dtype": np.bool_}, "truncated": {"dtype": np.bool_}})

    def native(self, *transitions: np.ndarray) -> Callable[[], None]:
        return partial(self._rb.add, **dict(zip(self._FIELDS, transitions)))

    def _draw(self, batch_size: int) -> tuple[np.ndarray, ...]:
        s = self._rb.sample(batch_size)
        return tuple(s[k] for k in self._FIELDS[:5])


class TorchRLPeer(_Adapter):
    """TorchRL ``ReplayBuffer`` over ``LazyMemmapStorage`` (memory-mapped files in a fresh folder
    of ``tmpdir``, laid out on the first write). Batched adds: ``rb.extend(TensorDict(...,
    batch_size=[n]))``; single adds: ``rb.add`` of an unbatched TensorDict (about twice as fast as
    ``extend`` with a batch of one, torchrl 0.14.1). Arrays are wrapped with ``torch.from_numpy``
    (no copy); the storage copies them in."""

    name = "torchrl"
    _FIELDS = ("obs", "next_obs", "action", "reward", "terminated", "truncated")

    def __init__(self, capacity: int, n_envs: int, tmpdir: str, *, batch_size: int | None = 256) -> None:
        import torch
        from tensordict import TensorDict
        from torchrl.data import LazyMemmapStorage, RandomSampler, ReplayBuffer

        self.n_envs = n_envs
        self._from_numpy = torch.from_numpy
        self._td_cls = TensorDict
        self.scratch_dir = tempfile.mkdtemp(prefix="torchrl-", dir=tmpdir)
        # ``batch_size`` is ``rb.sample()``'s default; ``sample`` passes its own (accepted silently when equal)
        self._rb = ReplayBuffer(storage=LazyMemmapStorage(capacity, scratch_dir=self.scratch_dir),
                                batch_size=batch_size, sampler=RandomSampler())

    def native(self, *transitions: np.ndarray) -> Callable[[], None]:
        # a TorchRL user's env already returns TensorDicts: built here, untimed
        if self.n_envs == 1:  # one transition: the leading dim dropped (0-d scalars)
            fields = {k: self._from_numpy(a[0] if a.ndim > 1 else a.reshape(())) for k, a in zip(self._FIELDS, transitions)}
            return partial(self._rb.add, self._td_cls(fields, batch_size=[]))
        fields = {k: self._from_numpy(a) for k, a in zip(self._FIELDS, transitions)}
        return partial(self._rb.extend, self._td_cls(fields, batch_size=[transitions[0].shape[0]]))

    def _draw(self, batch_size: int) -> tuple[np.ndarray, ...]:
        td = self._rb.sample(batch_size)
        return tuple(td.get(k).numpy() for k in self._FIELDS[:5])


#: The peers by short name, in the order the harness reports them.
PEERS: dict[str, type] = {"sb3": Sb3Peer, "cpprb": CpprbPeer, "torchrl": TorchRLPeer}
# What each adapter imports when it is made.
_REQUIRES: dict[str, tuple[str, ...]] = {
    "sb3": ("gymnasium", "stable_baselines3.common.buffers"),
    "cpprb": ("cpprb",),
    "torchrl": ("torch", "tensordict", "torchrl.data"),
}


def available() -> dict[str, str | None]:
    """Each peer's name, mapped to ``None`` when it imports here, else the import error."""
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


def transitions(n: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """``n`` random transitions of the vector workload, as (obs, next_obs, ...) arrays."""
    return (rng.standard_normal((n, *OBS_SHAPE), dtype=np.float32), rng.standard_normal((n, *OBS_SHAPE), dtype=np.float32),
            rng.integers(0, N_ACTIONS, size=n, dtype=np.int64), rng.standard_normal(n, dtype=np.float32),
            rng.random(n) < 0.01, rng.random(n) < 0.001)


def self_check(capacity: int = 1_000_000, n_single: int = 10_000, n_batches: int = 100, n_envs: int = 256,
               n_samples: int = 10, batch_size: int = 256) -> None:
    """Drive every available peer through a small workload, check the batches' shapes, print rough rates."""
    rng = np.random.default_rng(0)
    single = transitions(n_single, rng)
    single_rows = [tuple(a[i : i + 1] for a in single) for i in range(n_single)]
    batched = transitions(n_batches * n_envs, rng)
    batch_rows = [tuple(a[i * n_envs : (i + 1) * n_envs] for a in batched) for i in range(n_batches)]
    keys = ("obs", "next_obs", "action", "reward", "terminated")
    for name, error in available().items():
        if error is not None:
            print(f"{name:8s} unavailable: {error}")
            continue
        with tempfile.TemporaryDirectory(prefix=f"peers-{name}-") as tmpdir:
            t0 = time.perf_counter()
            peer = PEERS[name](capacity, 1, tmpdir)
            peer.add(*single_rows[0])  # construction and the first add (lazy layout) apart from the rate
            init_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            for row in single_rows[1:]:
                peer.add(*row)
            single_rate = (n_single - 1) / (time.perf_counter() - t0)
            bpeer = PEERS[name](capacity, n_envs, tmpdir)
            bpeer.add(*batch_rows[0])
            t0 = time.perf_counter()
            for rows in batch_rows[1:]:
                bpeer.add(*rows)
            batched_rate = (n_batches - 1) * n_envs / (time.perf_counter() - t0)
            out = bpeer.sample(batch_size)
            assert set(keys) <= out.keys() and all(isinstance(out[k], np.ndarray) for k in keys), out.keys()
            assert out["obs"].shape == (batch_size, *OBS_SHAPE) and all(out[k].shape == (batch_size,) for k in keys[2:])
            t0 = time.perf_counter()
            for _ in range(n_samples):
                bpeer.sample(batch_size)
            sample_rate = n_samples / (time.perf_counter() - t0)
            print(f"{name:8s} init {init_s * 1e3:7.1f} ms | single adds {single_rate:11,.0f}/s"
                  f" | batched ({n_envs}) rows {batched_rate:13,.0f}/s | sample ({batch_size}) {sample_rate:9,.0f} batches/s")
            del peer, bpeer


if __name__ == "__main__":
    self_check()
