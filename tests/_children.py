"""Child processes for the fault tests: a deterministic writer and a checking sampler.

    python tests/_children.py writer STORE KEY ROWS [durability] [publish_rows] [lanes]
    python tests/_children.py sampler STORE SECONDS

A row's content is a pure function of (writer key, sequence number), so any row read back can
be checked exactly. The writer prints each sequence number after ``add`` returned (with
``publish_rows=1`` every ``add`` is published before it returns: an acknowledgement means
"published"). With ``lanes`` > 1 the writer has lane segments (a chain of segments per lane)
and lane ``j`` writes key ``100 * KEY + j``: each lane is checked as a writer of its own.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

import numpy as np

import mmreplay

SCHEMA = mmreplay.Schema.transition(obs_shape=(3,), obs_dtype=np.float32)


def content(key: np.ndarray, seq: np.ndarray) -> np.ndarray:
    return ((np.asarray(key, np.int64) * 7919 + np.asarray(seq, np.int64) * 104729) % 65521).astype(np.float32)


def check_rows(obs: np.ndarray, action: np.ndarray, reward: np.ndarray, terminated: np.ndarray) -> str | None:
    """None if every row is one the deterministic writer could have written, else why not."""
    key, seq = obs[:, 0].astype(np.int64), obs[:, 1].astype(np.int64)
    bad = (obs[:, 2] != content(key, seq)) | (action != seq) | (reward != key) | (terminated != (seq % 37 == 36))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        return f"torn or foreign row: obs={obs[i].tolist()} action={int(action[i])} reward={float(reward[i])}"
    return None


def writer(path: str, key: int, rows: int, durability: str = "segment", publish_rows: int = 1, lanes: int = 1,
           ack: Callable[[int], None] | None = None) -> None:
    """Append ``rows`` steps as writer ``key`` (``lanes`` rows each); after each ``add`` returned,
    ``ack(seq)`` (default: the step's sequence number as a line on stdout)."""
    store = mmreplay.open_store(path, mode="a")
    w = store.writer(lanes=lanes, durability=durability, publish_rows=publish_rows, lane_segments=lanes > 1)
    keys = np.arange(lanes) + 100 * key if lanes > 1 else np.array([key])
    if ack is None:
        def ack(seq: int) -> None:
            sys.stdout.write(f"{seq}\n")
            sys.stdout.flush()
    for seq in range(rows):
        w.add(obs=np.stack([keys, np.full(lanes, seq), content(keys, seq)], axis=1).astype(np.float32),
              action=np.full(lanes, seq, np.int64), reward=keys.astype(np.float32),
              terminated=np.full(lanes, seq % 37 == 36), truncated=np.zeros(lanes, bool))
        ack(seq)
    w.close()
    store.close()


def piped_writer(path: str, key: int, rows: int, conn: Connection) -> None:
    """``writer`` in a process started by multiprocessing (the torture test's fork server, which
    has mmreplay imported already): each acknowledgement is sent on ``conn``."""
    writer(path, key, rows, ack=conn.send)
    conn.close()


def sampler(path: str, seconds: float) -> None:
    store = mmreplay.open_store(path, mode="r")
    s = mmreplay.UniformSampler(store, seed=0, refresh_interval_s=0.0)
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        try:
            b = s.sample(64)
        except mmreplay.EmptyStoreError:
            time.sleep(0.01)
            continue
        why = check_rows(b.obs, b.action, b.reward, b.terminated)
        nk, ns = b.next_obs[:, 0], b.next_obs[:, 1]
        if why is None and not ((nk == b.obs[:, 0]).all() and (ns == b.obs[:, 1] + 1).all()):
            why = "next_obs is not the next row of the same writer"
        if why is not None:
            print(why, flush=True)
            sys.exit(1)
        n += 1
        if n % 200 == 0:
            print(f"ok {n}", flush=True)
    print(f"ok {n}", flush=True)


if __name__ == "__main__":
    kind, *args = sys.argv[1:]
    if kind == "writer":
        writer(args[0], int(args[1]), int(args[2]), *(args[3:4]), *(int(a) for a in args[4:6]))
    else:
        sampler(args[0], float(args[1]))
