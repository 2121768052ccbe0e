"""Import the DQN Replay Dataset (Dopamine replay-buffer checkpoints) into a store.

A Dopamine checkpoint ``N`` of a replay buffer is a set of gzipped ``.npy`` files in one
directory: ``$store$_observation_ckpt.N.gz`` (``(C, 84, 84) uint8`` single frames),
``$store$_action_ckpt.N.gz``, ``$store$_reward_ckpt.N.gz``, ``$store$_terminal_ckpt.N.gz`` and
``add_count_ckpt.N.gz`` (how many transitions the circular buffer of capacity ``C`` had received;
the oldest one sits at ``add_count % C`` once it wrapped). Row ``i`` holds ``(o_i, a_i, r_i,
terminal_i)``: the action taken in ``o_i``, its reward, and whether the episode ended with it;
the next observation is ``o_{i+1}``. Dopamine writes ``stack_size - 1`` all-zero transitions before
each episode (frame-stack padding) and never stores an episode's final observation.

How they become step rows (T+1 rows per episode, ``is_last`` on the final one):

* the padding transitions are dropped (a transition within ``stack_size - 1`` rows after a
  terminal, or at the start of a stretch, whose frame, action, reward and terminal are all zero);
* after each terminal transition a final-observation row is added, holding a **zero frame**
  (Dopamine did not record it; with ``terminated=True`` it is never bootstrapped from);
* ``terminal`` becomes ``terminated`` (Dopamine also ends time-limit episodes with a terminal,
  and trained on them that way); ``truncated`` is always False;
* frames stay single frames (84×84, 7 KB a step); ``frame_stack=4`` in the samplers rebuilds the
  stacks, repeating an episode's first frame where Dopamine had zero padding.

Checkpoints are read in order as one stream; rows a later checkpoint shares with an earlier one
(by ``add_count``) are skipped, and a gap between two checkpoints starts a new writer session, so
no episode is stitched across missing data. Files are streamed: each is decompressed once,
``chunk_rows`` rows at a time, and never held whole in memory (a wrapped buffer is read in two
passes, the first skipping to the oldest row).
"""

from __future__ import annotations

import gzip
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..archive.zarr_io import ArchiveError
from ..core.schema import Field, Schema

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

__all__ = ["DopamineReport", "import_dopamine"]

KINDS = ("observation", "action", "reward", "terminal")
_NAME = re.compile(r"^\$store\$_observation_ckpt\.(\d+)\.gz$")


@dataclass(frozen=True, slots=True)
class DopamineReport:
    """What an import did."""

    path: str
    """The store created."""
    checkpoints: tuple[int, ...]
    """The checkpoint numbers imported, ascending."""
    transitions: int
    """Transitions read from the files (padding included)."""
    padding: int
    """Zero padding transitions dropped."""
    episodes: int
    """Terminal transitions (each followed by a final-observation row)."""
    rows: int
    """Rows written to the store."""


def _file(directory: Path, kind: str, n: int) -> Path:
    return directory / f"$store$_{kind}_ckpt.{n}.gz"


class _NpyStream:
    """Rows of a gzipped ``.npy`` file, read ``chunk`` rows at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fh = gzip.open(path, "rb")
        try:
            version = np.lib.format.read_magic(self.fh)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(self.fh)
        except (ValueError, OSError, EOFError) as exc:
            self.fh.close()
            raise ArchiveError(f"{path}: not a gzipped .npy file ({exc})") from None
        if fortran and len(shape) > 1:
            self.fh.close()
            raise ArchiveError(f"{path}: Fortran-ordered arrays are not supported")
        self.shape: tuple[int, ...] = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.row_shape = self.shape[1:]

    def read(self, k: int) -> np.ndarray:
        """The next ``k`` rows (a new array, filled straight from the decompressor)."""
        out = np.empty((k, *self.row_shape), self.dtype)
        view = memoryview(out).cast("B")
        got = 0
        while got < len(view):
            m = self.fh.readinto(view[got:])
            if not m:
                raise ArchiveError(f"{self.path}: file ends early (truncated download?)")
            got += m
        return out

    def skip(self, k: int, chunk: int) -> None:
        while k > 0:
            step = min(k, chunk)
            self.read(step)
            k -= step

    def close(self) -> None:
        self.fh.close()


def _load_scalar(path: Path) -> int | None:
    if not path.exists():
        return None
    with gzip.open(path, "rb") as fh:
        return int(np.load(fh, allow_pickle=False))


def checkpoints_in(directory: str | os.PathLike[str]) -> list[int]:
    """Checkpoint numbers with an observation file in ``directory``, ascending."""
    d = Path(directory)
    if not d.is_dir():
        raise ArchiveError(f"{d} is not a directory", hint="pass the directory holding $store$_*_ckpt.N.gz files")
    return sorted(int(m.group(1)) for e in os.listdir(d) if (m := _NAME.match(e)))


def _chunks(directory: Path, n: int, start: int, count: int, capacity: int, chunk: int) -> Iterator[list[np.ndarray]]:
    """Rows ``[start, start + count)`` of the circular buffer (positions mod ``capacity``), in chunks."""
    pos = start % capacity
    passes = [(pos, min(count, capacity - pos)), (0, count - min(count, capacity - pos))]
    for first, k in passes:
        if k <= 0:
            continue
        streams = [_NpyStream(_file(directory, kind, n)) for kind in KINDS]
        try:
            for s in streams:
                s.skip(first, chunk)
            left = k
            while left:
                step = min(left, chunk)
                yield [s.read(step) for s in streams]
                left -= step
        finally:
            for s in streams:
                s.close()


class _Rows:
    """Turns Dopamine transitions into step rows, chunk by chunk (state carried across chunks)."""

    def __init__(self, stack_size: int) -> None:
        self.pad = max(stack_size - 1, 0)
        self.since = 0  # rows since the last terminal (a fresh stretch counts as just after one)
        self.padding = self.episodes = 0

    def fresh(self) -> None:
        self.since = 0

    def convert(self, obs: np.ndarray, act: np.ndarray, rew: np.ndarray, term: np.ndarray) -> dict[str, np.ndarray]:
        n = len(term)
        term = term.astype(np.bool_)
        idx = np.arange(n)
        # distance (1-based) to the latest terminal before each row, the carry counting from -since
        prev = np.maximum.accumulate(np.where(np.r_[False, term[:-1]], idx - 1, -1 - self.since))
        dist = idx - prev
        cand = dist <= self.pad if self.pad else np.zeros(n, np.bool_)
        if cand.any():
            c = np.flatnonzero(cand)
            zero = (act[c] == 0) & (rew[c] == 0) & ~term[c] & ~obs[c].reshape(len(c), -1).any(axis=1)
            keep = np.ones(n, np.bool_)
            keep[c[zero]] = False
            self.padding += int(zero.sum())
        else:
            keep = None
        last_t = np.flatnonzero(term)
        self.since = n - 1 - int(last_t[-1]) if len(last_t) else self.since + n
        if keep is not None:
            obs, act, rew, term = obs[keep], act[keep], rew[keep], term[keep]
        m = len(term)
        t = int(term.sum())
        self.episodes += t
        at = np.arange(m) + np.cumsum(term) - term  # where each transition lands among the rows
        out = {"obs": np.zeros((m + t, *obs.shape[1:]), obs.dtype), "action": np.zeros(m + t, act.dtype),
               "reward": np.zeros(m + t, rew.dtype), "terminated": np.zeros(m + t, np.bool_)}
        out["obs"][at] = obs
        out["action"][at] = act
        out["reward"][at] = rew
        out["terminated"][at] = term  # the row after each terminal one is its final observation
        out["truncated"] = np.zeros(m + t, np.bool_)
        return out


def import_dopamine(
    directory: str | os.PathLike[str],
    path: str | os.PathLike[str],
    *,
    checkpoints: list[int] | None = None,
    stack_size: int = 4,
    chunk_rows: int = 8192,
    capacity: int | None = None,
    segment_records: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> DopamineReport:
    """Create a store at ``path`` from Dopamine replay checkpoints in ``directory`` (see the module doc).

    ``checkpoints`` selects checkpoint numbers (default: all, ascending); ``stack_size`` is the
    frame-stack size the buffer was written with (its padding length + 1). ``capacity`` defaults
    to every row imported (no eviction). ``progress(transitions_done, transitions_total)``.
    """
    from ..storage import create_store

    d = Path(directory)
    found = checkpoints_in(d)
    ns = found if checkpoints is None else sorted(checkpoints)
    if not ns:
        raise ArchiveError(f"{d} holds no $store$_observation_ckpt.N.gz file",
                           hint="pass a DQN Replay Dataset run's replay_logs directory (e.g. Pong/1/replay_logs)")
    if chunk_rows < 1:
        raise ValueError(f"`chunk_rows` must be >= 1, got {chunk_rows}")
    plan = _plan(d, ns)
    heads = [_NpyStream(_file(d, kind, ns[0])) for kind in KINDS]
    for h in heads:
        h.close()
    obs_h, act_h, rew_h, _ = heads
    schema = Schema([Field("obs", obs_h.dtype, obs_h.row_shape), Field("action", act_h.dtype, act_h.row_shape),
                     Field("reward", rew_h.dtype, rew_h.row_shape), Field("terminated", np.dtype(np.bool_)),
                     Field("truncated", np.dtype(np.bool_))])
    total = sum(count for _, _, count, _, _ in plan)
    metadata = {"source": "dopamine", "dopamine_dir": str(d.resolve()), "checkpoints": ns, "stack_size": stack_size,
                "note": "rows after terminal steps hold zero frames: Dopamine does not record final observations"}
    store = create_store(path, schema, capacity or max(2 * total, 1), segment_records=segment_records,
                         metadata=metadata)
    conv = _Rows(stack_size)
    done = rows = 0
    try:
        w = None
        for n, start, count, cap, contiguous in plan:
            if w is None or not contiguous:
                if w is not None:
                    w.close()
                w = store.writer(lanes=1)
                conv.fresh()
            for obs, act, rew, term in _chunks(d, n, start, count, cap, chunk_rows):
                _check(schema, n, obs, act, rew)
                out = conv.convert(obs, act, rew, term)
                del obs
                w.add_batch({k: v[:, None] for k, v in out.items()})
                rows += len(out["terminated"])
                done += len(term)
                if progress is not None:
                    progress(done, total)
        if w is not None:
            w.close()
    finally:
        store.close()
    return DopamineReport(str(path), tuple(ns), done, conv.padding, conv.episodes, rows)


def _plan(d: Path, ns: list[int]) -> list[tuple[int, int, int, int, bool]]:
    """Per checkpoint: ``(n, first logical row, rows, capacity, continues the previous one)``."""
    plan = []
    prev_end: int | None = None
    for n in ns:
        for kind in KINDS:
            if not _file(d, kind, n).exists():
                raise ArchiveError(f"checkpoint {n}: {_file(d, kind, n)} is missing")
        s = _NpyStream(_file(d, "observation", n))
        cap = s.shape[0]
        s.close()
        added = _load_scalar(d / f"add_count_ckpt.{n}.gz")
        if added is None:  # no counter: a full, unwrapped buffer following the previous one
            added = (prev_end or 0) + cap
        lo = max(added - cap, 0)
        contiguous = prev_end is not None and lo <= prev_end
        start = max(lo, prev_end) if contiguous and prev_end is not None else lo
        if added > start:
            plan.append((n, start, added - start, cap, contiguous))
        prev_end = added
    return plan


def _check(schema: Schema, n: int, obs: np.ndarray, act: np.ndarray, rew: np.ndarray) -> None:
    for name, a in (("obs", obs), ("action", act), ("reward", rew)):
        f = schema[name]
        if a.dtype != f.dtype or a.shape[1:] != f.shape:
            raise ArchiveError(f"checkpoint {n}: {name} is {a.dtype}{list(a.shape[1:])}, "
                               f"checkpoint files before it had {f.dtype}{list(f.shape)}")

