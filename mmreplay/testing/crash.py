"""The crash-state explorer: every state a crash may leave a store in, built from a recording of the
store's own persisting calls, and the invariants each state must keep (ALICE's approach: Pillai
et al., "All File Systems Are Not Created Equal", OSDI 2014).

**Recording.** Every call that changes a store's files goes through ``mmreplay.core.fs``, which
tells ``fs.RECORDER`` (``Recorder``). At each call the recorder reads the store's directory tree
(small stores: a few dozen KiB), finds what changed since the last call (pages of a file, its
size, directory entries; writes through mappings included) and keeps a model of the file system:
for each file its durable pages and size and the versions of each page written since, for each
directory its durable entries and the changes since (a rename or replace is one atomic change);
``fsync``/``fdatasync`` make a file's pages and size durable, ``msync`` a range of pages,
``fsync_dir`` a directory's entries. Background file work runs inline while recording
(``fs.recording()``), so the order is the protocol's, not a thread schedule's. A snapshot of
the model is kept after every call (an **operation**), with what the session's caller had been
promised by then (``mark``: the rows published, the rows made durable).

**States.** After each operation, what a crash may leave (the model's rules, section 4 of the
project's crash model in ``docs/guarantees.md``):

* ``kill-9``: everything applied (the page cache survives the process);
* ``power-loss``: everything back to what was synced (pages never synced read as zeros, sizes and
  directory entries as last synced);
* one pending item lost (``page-lost``: the page as last synced, zeros if it never was;
  ``page-stale``: an older version written since; ``size-lost`` / ``size-cut``: an append or an
  allocation not synced, absent or cut; ``dir-lost``: a create, rename, replace or unlink not
  applied), everything else applied.

States are deduplicated by content. **Checks** (``check_state``), in process: a read-only open and
every sampler and view (``damage.check_views`` against a reference store that holds every row the
session wrote, never evicted), a writable open (recovery), ``verify``, ``verify --repair`` twice,
``info --json`` (click's runner). Invariants: every command exits cleanly; no value is served that
the session did not write for that id; every row promised durable (and not evicted) is served
after recovery, and in the ``kill-9`` state every row published; every row the state's files show
(a control page's or the catalog's count, a stamp holding its own row number) that is not served is
reported (masked, quarantined or lost, by count; or recorded gone in the state's catalog by a run
the crash interrupted); a second repair does nothing and ``verify`` is clean after the first.

``tests/fault/test_crash_states_*.py`` check a seeded sample of states of a few recorded sessions;
``python benchmarks/crash_states.py`` checks all of them and prints the figures.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable

import numpy as np

from ..core import fs
from ..core.schema import Schema

PAGE = 4096
ZERO = bytes(PAGE)
SCHEMA = Schema.transition(obs_shape=(4,), obs_dtype=np.float32)
"""The sessions' rows: ``obs = (t, lane, 8 t + lane + 1, 0)``, so a value names its step."""


# -- the model --------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class FileSnap:
    """One file (inode) at one operation: page ids (``Recorder.pages``) and sizes."""

    cur: tuple[int, ...]
    cur_size: int
    dur: tuple[int, ...]
    dur_size: int
    pend: tuple[tuple[int, tuple[int, ...]], ...]
    """Page index -> the versions written since it was last durable (the last one is current)."""


@dataclass(frozen=True, slots=True)
class Snap:
    """The model after one operation."""

    kind: str
    files: dict[int, FileSnap]
    dirs: dict[str, tuple[dict[str, int], dict[str, int]]]
    """Directory (relative path) -> (current entries, durable entries): name -> inode."""
    dir_pend: tuple[tuple[int, str, str, int | None, int | None], ...]
    """Directory changes not synced: (change id, directory, name, before, after); one change id per
    atomic operation (a rename touches two entries)."""
    dir_inodes: frozenset[int]
    expect: Expect


@dataclass(frozen=True, slots=True)
class Expect:
    """What the session's caller had been promised when an operation ran: global row ids."""

    published: frozenset[int] = frozenset()
    durable: frozenset[int] = frozenset()


class _File:
    __slots__ = ("cur", "cur_size", "dur", "dur_size", "pend")

    def __init__(self, pages: list[int], size: int, durable: bool) -> None:
        self.cur, self.cur_size = pages, size
        self.dur, self.dur_size = (list(pages), size) if durable else ([], 0)
        self.pend: dict[int, list[int]] = {} if durable else {i: [p] for i, p in enumerate(pages) if p}

    def snap(self) -> FileSnap:
        return FileSnap(tuple(self.cur), self.cur_size, tuple(self.dur), self.dur_size,
                        tuple((i, tuple(v)) for i, v in sorted(self.pend.items())))


class Recorder:
    """Records the persisting calls made under ``root`` (see the module docstring). Use as a
    context manager: it sets ``fs.RECORDER`` for the block. ``locks/`` is not part of the model
    (lock files hold no data)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.pages: list[bytes] = [ZERO]
        self._page_id: dict[bytes, int] = {ZERO: 0}
        self.files: dict[int, _File] = {}
        self.dirs: dict[str, tuple[dict[str, int], dict[str, int]]] = {}
        self.dir_pend: list[tuple[int, str, str, int | None, int | None]] = []
        self.dir_inodes: set[int] = set()
        self.snaps: list[Snap] = []
        self.expect = Expect()
        self._changes = 0
        self._lock = threading.RLock()
        dirs, contents = self._read_tree()
        for ino, (pages, size) in contents.items():
            self.files[ino] = _File(pages, size, durable=True)
        self.dirs = {d: (dict(e), dict(e)) for d, e in dirs.items()}

    def __enter__(self) -> Recorder:
        fs.RECORDER = self
        return self

    def __exit__(self, *exc: object) -> None:
        fs.RECORDER = None

    def mark(self, published: set[int] | frozenset[int], durable: set[int] | frozenset[int]) -> None:
        """What the caller has been promised from now on (rows published, rows durable)."""
        with self._lock:
            self.expect = Expect(frozenset(published), frozenset(durable))

    # -- reading the tree ---------------------------------------------------------------------
    def _page(self, b: bytes) -> int:
        pid = self._page_id.get(b)
        if pid is None:
            pid = self._page_id[b] = len(self.pages)
            self.pages.append(b)
        return pid

    def _read_tree(self) -> tuple[dict[str, dict[str, int]], dict[int, tuple[list[int], int]]]:
        dirs: dict[str, dict[str, int]] = {}
        contents: dict[int, tuple[list[int], int]] = {}
        for path, sub, names in os.walk(self.root):
            rel = os.path.relpath(path, self.root)
            if rel == "locks" or rel.startswith("locks" + os.sep):
                sub[:] = []
                continue
            entries = {}
            for d in sub:
                if rel == "." and d == "locks":
                    continue
                st = os.lstat(os.path.join(path, d))
                entries[d] = st.st_ino
                self.dir_inodes.add(st.st_ino)
            for n in names:
                p = os.path.join(path, n)
                try:
                    st = os.lstat(p)
                    with open(p, "rb") as fh:
                        data = fh.read()
                except FileNotFoundError:
                    continue
                entries[n] = st.st_ino
                pages = [self._page(data[i : i + PAGE].ljust(PAGE, b"\0")) for i in range(0, len(data), PAGE)]
                contents[st.st_ino] = (pages, len(data))
            dirs[rel] = entries
        return dirs, contents

    def _diff(self) -> bool:
        """Fold what changed since the last call into the model; True if anything did."""
        dirs, contents = self._read_tree()
        changed = False
        for ino, (pages, size) in contents.items():
            f = self.files.get(ino)
            if f is None:
                self.files[ino] = _File(pages, size, durable=False)
                changed = True
                continue
            if size != f.cur_size:
                f.cur_size = size
                changed = True
            for i, p in enumerate(pages):
                old = f.cur[i] if i < len(f.cur) else 0
                if p != old:
                    durable = f.dur[i] if i < len(f.dur) else 0
                    versions = f.pend.setdefault(i, [])
                    versions.append(p)
                    if p == durable:
                        f.pend.pop(i)
                    changed = True
            f.cur = pages + [0] * max(0, len(f.cur) - len(pages)) if len(pages) < len(f.cur) else list(pages)
        # directory changes, grouped into atomic operations by the inodes they share
        changes = []
        for d in set(dirs) | set(self.dirs):
            new = dirs.get(d, {})
            cur, dur = self.dirs.get(d, ({}, {}))
            for name in set(new) | set(cur):
                if new.get(name) != cur.get(name):
                    changes.append((d, name, cur.get(name), new.get(name)))
            self.dirs[d] = (dict(new), dur)
        if changes:
            changed = True
            groups: list[list[tuple[str, str, int | None, int | None]]] = []
            for c in changes:
                inos = {c[2], c[3]} - {None}
                hit = [g for g in groups if any({x[2], x[3]} & inos for x in g)]
                merged = [c, *(x for g in hit for x in g)]
                groups = [g for g in groups if g not in hit] + [merged]
            for g in groups:
                self._changes += 1
                self.dir_pend += [(self._changes, *c) for c in g]
        return changed

    # -- the recorder's entry point (``fs._tell``) -----------------------------------------------
    def point(self, kind: str, target: object = None, offset: int = 0, length: int | None = None) -> None:
        with self._lock:
            changed = self._diff()
            if kind == "sync":
                if changed:
                    self._snap("write")
                self._sync(target, offset, length)
                self._snap("sync")
            elif kind == "dirsync":
                if changed:
                    self._snap("write")
                rel = os.path.relpath(os.fspath(target), self.root)  # type: ignore[arg-type]
                cur, _ = self.dirs.get(rel, ({}, {}))
                self.dirs[rel] = (cur, dict(cur))
                self.dir_pend = [c for c in self.dir_pend if c[1] != rel]
                self._snap("dirsync")
            elif changed:
                self._snap(kind)

    def _sync(self, fd: object, offset: int, length: int | None) -> None:
        if not isinstance(fd, int):
            return
        try:
            ino = os.fstat(fd).st_ino
        except OSError:
            return
        f = self.files.get(ino)
        if f is None:
            return
        if length is None:
            f.dur, f.dur_size, f.pend = list(f.cur), f.cur_size, {}
            return
        lo, hi = offset // PAGE, -(-(offset + length) // PAGE)
        if len(f.dur) < hi:
            f.dur += [0] * (hi - len(f.dur))
        for i in range(lo, min(hi, len(f.cur))):
            f.dur[i] = f.cur[i]
            f.pend.pop(i, None)

    def _snap(self, kind: str) -> None:
        live = {ino for _, (cur, _) in self.dirs.items() for ino in cur.values()}
        self.snaps.append(Snap(kind, {ino: f.snap() for ino, f in self.files.items() if ino in live},
                               {d: (dict(c), dict(u)) for d, (c, u) in self.dirs.items()}, tuple(self.dir_pend),
                               frozenset(self.dir_inodes), self.expect))

    # -- states -----------------------------------------------------------------------------------
    def states(self, k: int) -> list[tuple[str, tuple]]:
        """The states a crash right after operation ``k`` may leave: ``(label, tree)``; a tree is
        a sorted tuple of ``(relative path, None)`` for a directory or ``(relative path, (size,
        page ids))`` for a file."""
        s = self.snaps[k]
        out = [("kill-9", self._tree(s)), ("power-loss", self._tree(s, durable=True))]
        for ino, f in s.files.items():
            for i, versions in f.pend:
                was = f.dur[i] if i < len(f.dur) else 0
                for label, pid in [("page-lost", was), *(("page-stale", v) for v in versions[:-1])]:
                    if pid != versions[-1]:
                        out.append((label, self._tree(s, page=(ino, i, pid))))
            if f.cur_size > f.dur_size:
                out.append(("size-lost", self._tree(s, size=(ino, f.dur_size))))
                out.append(("size-cut", self._tree(s, size=(ino, (f.dur_size + f.cur_size) // 2))))
        for cid in sorted({c[0] for c in s.dir_pend}):
            out.append(("dir-lost", self._tree(s, revert=cid)))
        return out

    def _tree(self, s: Snap, *, durable: bool = False, page: tuple[int, int, int] | None = None,
              size: tuple[int, int] | None = None, revert: int | None = None) -> tuple:
        entries = {d: dict(u if durable else c) for d, (c, u) in s.dirs.items()}
        if revert is not None:
            for cid, d, name, before, _ in s.dir_pend:
                if cid == revert:
                    if before is None:
                        entries.get(d, {}).pop(name, None)
                    else:
                        entries.setdefault(d, {})[name] = before
        out = []

        def walk(rel: str) -> None:
            for name, ino in sorted(entries.get(rel, {}).items()):
                path = name if rel == "." else f"{rel}/{name}"
                if ino in s.dir_inodes:
                    out.append((path, None))
                    walk(path)
                    continue
                f = s.files.get(ino)
                if f is None:
                    continue
                if durable:
                    pages, n = f.dur, f.dur_size
                else:
                    pages, n = f.cur, f.cur_size
                    if page is not None and page[0] == ino:
                        pages = pages[: page[1]] + (page[2],) + pages[page[1] + 1 :]
                    if size is not None and size[0] == ino:
                        n = size[1]
                need = -(-n // PAGE)
                pages = tuple(pages[:need]) + (0,) * max(0, need - len(pages))
                out.append((path, (n, pages)))

        walk(".")
        return tuple(out)

    def materialize(self, tree: tuple, dest: Path) -> None:
        """Write a state's files under ``dest`` (which must not exist), with an empty ``locks/``."""
        dest.mkdir(parents=True)
        (dest / "locks").mkdir()
        for path, val in tree:
            p = dest / path
            if val is None:
                p.mkdir(exist_ok=True)
                continue
            n, pages = val
            p.write_bytes(b"".join(self.pages[i] for i in pages)[:n])

    def unique_states(self) -> list[tuple[int, str, tuple]]:
        """Every distinct state after every operation: ``(operation, label, tree)``, first seen first."""
        seen: set[tuple] = set()
        out = []
        for k in range(len(self.snaps)):
            for label, tree in self.states(k):
                if tree not in seen:
                    seen.add(tree)
                    out.append((k, label, tree))
        return out

    def session_states(self) -> list[State]:
        """``unique_states`` as ``State`` objects of this (session) recorder."""
        return [State(k, label, tree) for k, label, tree in self.unique_states()]


# -- sessions ----------------------------------------------------------------------------------------
def rows(t: np.ndarray, lanes: int = 1) -> dict[str, np.ndarray]:
    """Step rows ``t`` of a session (``obs = (t, lane, 8 t + lane + 1, 0)``), leading shape ``(T, lanes)``."""
    t = np.asarray(t, np.int64)[:, None] + np.zeros(lanes, np.int64)
    lane = np.arange(lanes) + np.zeros_like(t)
    obs = np.stack([t, lane, 8 * t + lane + 1, 0 * t], -1).astype(np.float32)
    return {"obs": obs, "action": (t % 5).astype(np.int64), "reward": ((t * 7 + lane) % 11 - 5).astype(np.float32),
            "terminated": (t + 3 * lane) % 13 == 12, "truncated": (t + 5 * lane) % 17 == 16}


@dataclass
class Recording:
    """A recorded writer session: its recorder, the reference store (every row it wrote, never
    evicted), and each written row id's step."""

    recorder: Recorder
    reference: Path
    steps: dict[int, int] = field(default_factory=dict)
    """Global row id -> the step ``t`` written there (lane 0)."""
    lanes: int = 1
    segment_records: int = 16


def record_session(root: Path, *, durability: str = "segment", steps: int = 70, lanes: int = 1,
                   publish_rows: int = 1, segment_records: int = 16, capacity: int = 48, flush_at: int = 23) -> Recording:
    """Record one writer session into a new store at ``root``: ``steps`` vector steps of ``lanes``
    lanes, published in commit groups of ``publish_rows`` rows (more at a segment's end or a
    flush), in segments of ``segment_records`` (several sealed, the oldest evicted for
    ``capacity``), a ``flush()`` after step ``flush_at``, then ``close(last_obs=...)``. The same
    rows go to a reference store (``root`` + ``-ref``) that never evicts, so every row id is the
    same in both."""
    from ..storage import create_store

    ref_path = root.with_name(root.name + "-ref")
    ref = create_store(ref_path, SCHEMA, capacity=10**6, segment_records=segment_records)
    store = create_store(root, SCHEMA, capacity=capacity, segment_records=segment_records)
    rec = Recorder(root)
    out = Recording(rec, ref_path, lanes=lanes, segment_records=segment_records)
    written: list[int] = []  # row ids in the order they were written
    durable: set[int] = set()
    rw = ref.writer(lanes=lanes, publish_rows=1, lane_segments=False)
    with rec:
        w = store.writer(lanes=lanes, durability=durability, publish_rows=publish_rows, publish_interval_s=1e9,
                         lane_segments=False)
        for t in range(steps):
            row = {k: v[0] for k, v in rows(np.array([t]), lanes).items()}
            w.add(**row)
            rw.add(**row)
            ids = w.last_step_ids.tolist()
            out.steps.update((int(i), t) for i in ids)
            written += ids
            unpublished = w.stats()["unpublished_rows"]
            published = set(written[: len(written) - unpublished])
            if durability == "batch":
                durable.update(published)
            elif durability == "segment":  # the segments before the open one were sealed and synced at the roll
                first = ids[0] - ids[0] % segment_records
                durable.update(i for i in published if i < first)
            if t == flush_at:
                w.flush()
                published = set(written)
                durable.update(published)
            rec.mark(published, durable)
        last = rows(np.array([steps]), lanes)["obs"][0]
        w.close(last_obs=last)
        rw.close(last_obs=last)
        if durability != "process":
            durable.update(written)
        rec.mark(set(written), durable)
        store.close()
    ref.close()
    return out


# -- checking a state --------------------------------------------------------------------------------
@dataclass
class StateResult:
    """What one state's check found (the figures the benchmark sums)."""

    label: str
    op: int
    durable: int = 0
    """Rows promised durable (and not evicted) at the crash."""
    served: int = 0
    """Rows served after recovery and repair."""
    shown_not_served: int = 0
    """Rows the state's files show (a control page's or the catalog's count) that are not served,
    and that its catalog does not already record as gone (by a run the crash interrupted)."""
    reported: int = 0
    """Rows the store reported no longer served (masked, quarantined, lost)."""


class Checker:
    """Checks states of one recording (``check``). Keep one per recording: it holds the reference
    store's views open."""

    def __init__(self, recording: Recording) -> None:
        from .damage import Base, Oracle

        self.rec = recording
        self.oracle = Oracle(Base(recording.reference, 1, 0))
        self.stamps_offset = self.oracle.store.layout.stamps_offset

    def close(self) -> None:
        self.oracle.close()

    def __enter__(self) -> Checker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check(self, state: State, work: Path, *, seed: int = 0,
              cli: Callable[[list[str]], tuple[int, str, BaseException | None]] | None = None) -> StateResult:
        """Materialize one state at ``work`` and check it (see the module docstring); raises
        ``AssertionError`` naming the state when an invariant fails. ``cli``: runs an ``mmreplay``
        command in process and returns ``(exit code, output, exception)`` (the tests pass click's
        runner; this room does not import the CLI)."""
        from ..storage import open_store
        from .damage import check_views, repair_twice, served_ids

        session = self.rec.recorder
        rec = state.recorder or session
        shutil.rmtree(work, ignore_errors=True)
        rec.materialize(state.tree, work)
        base_op = state.op if state.base_op is None else state.base_op
        snap = session.snaps[base_op]
        what = (f"state op {state.op} ({rec.snaps[state.op].kind}) {state.label}"
                + (f" of recovering from op {base_op} {state.base_label}" if state.base_op is not None else ""))
        evicted = _evicted_rows(dict(session.states(base_op))["kill-9"], session, self.rec.segment_records)
        durable = set(snap.expect.durable) - evicted
        out = StateResult(state.label, state.op, durable=len(durable))
        shown = _shown_rows(state.tree, rec, self.rec.segment_records, self.stamps_offset) & set(self.rec.steps)
        logging.disable(logging.WARNING)  # the store's warnings about what the crash left: expected
        try:
            with open_store(work, mode="r") as store:
                check_views(store, self.oracle, seed, f"{what} [read-only]")
            with open_store(work, mode="a") as store:
                check_views(store, self.oracle, seed, f"{what} [writable]")
                rep1 = repair_twice(store, what)
                check_views(store, self.oracle, seed, f"{what} [repaired]")
                served = set(served_ids(store).tolist())
                missing = durable - served
                assert not missing, f"{what}: {len(missing)} durable rows not served: {sorted(missing)[:8]}"
                if state.label == "kill-9" and state.base_label in (None, "kill-9"):
                    gone = set(snap.expect.published) - evicted - served
                    assert not gone, f"{what}: {len(gone)} published rows not served after a kill -9: {sorted(gone)[:8]}"
                out.served = len(served)
                # (rows the state's catalog already records as gone: a run the crash interrupted reported them)
                out.shown_not_served = len(shown - served - evicted - _recorded_rows(state.tree, rec,
                                                                                   self.rec.segment_records))
                out.reported = store.check_counts()["damaged_rows"] + rep1.rows_quarantined + rep1.rows_lost
                assert out.shown_not_served <= out.reported, \
                    f"{what}: {out.shown_not_served} rows the files show are not served, {out.reported} reported"
            for args in (["info", str(work), "--json"], ["verify", str(work)]) if cli is not None else ():
                code, output, exc = cli(args)
                assert code == 0 and exc is None, f"{what}: mmreplay {args[0]}: {output}"
                if args[0] == "info":
                    json.loads(output)
        finally:
            logging.disable(logging.NOTSET)
        return out

    def recovery_states(self, base: State, root: Path) -> list[State]:
        """Record recovery and repair of state ``base`` (a writable open, ``repair()``, a close) and
        return every distinct state a crash in the middle of them may leave, each checked against
        what ``base``'s crash had been promised."""
        from ..storage import open_store

        rec = self.rec.recorder
        shutil.rmtree(root, ignore_errors=True)
        rec.materialize(base.tree, root)
        again = Recorder(root)
        logging.disable(logging.WARNING)
        try:
            with again:
                with open_store(root, mode="a") as store:
                    store.repair()
        finally:
            logging.disable(logging.NOTSET)
        return [State(op, label, tree, again, base.op, base.label) for op, label, tree in again.unique_states()]


@dataclass(frozen=True, slots=True)
class State:
    """One crash state: after operation ``op`` of ``recorder`` (the session's when None). A crash
    during the recovery of another state names that one (``base_op``, ``base_label``): its
    promises are the ones checked."""

    op: int
    label: str
    tree: tuple
    recorder: Recorder | None = None
    base_op: int | None = None
    base_label: str | None = None


def _segment_files(tree: tuple) -> dict[str, tuple[int, tuple[int, ...]]]:
    return {p.split("/", 1)[1]: v for p, v in tree if p.startswith("segments/") and v is not None}


def _bytes(rec: Recorder, val: tuple[int, tuple[int, ...]]) -> bytes:
    n, pages = val
    return b"".join(rec.pages[i] for i in pages)[:n]


def _shown_rows(tree: tuple, rec: Recorder, R: int, stamps_offset: int) -> set[int]:
    """Row ids the state's files say exist: a segment file's valid control count, the count the
    state's catalog records for it, and every row whose stamp holds its own row number (the file's
    header read, its stamp column at ``stamps_offset``)."""
    from ..storage import CONTROL_OFFSET, CONTROL_SLOT_SIZE, HEADER_SIZE, Header, parse_segment_name, read_control

    from .damage import catalog_events

    counts: dict[str, int] = {}
    out: set[int] = set()
    for name, val in _segment_files(tree).items():
        data = _bytes(rec, val)
        page = data[CONTROL_OFFSET : CONTROL_OFFSET + 2 * CONTROL_SLOT_SIZE]
        if len(page) == 2 * CONTROL_SLOT_SIZE:
            c, _ = read_control(page)
            if c is not None:
                counts[name] = c.committed
        try:
            h = Header.unpack(data[:HEADER_SIZE], name)
        except Exception:  # noqa: BLE001 - no header: no row number to match
            continue
        seq = np.frombuffer(data[stamps_offset : stamps_offset + 16 * R].ljust(16 * R, b"\0"), "<u8")[::2]
        want = (np.arange(h.first_seq + 1, h.first_seq + R + 1, dtype=np.uint64) & np.uint64(0xFFFFFFFF))
        hit = np.flatnonzero((seq & np.uint64(0xFFFFFFFF)) == want)
        out.update((h.segment_id * R + hit).tolist())
    log = dict(tree).get("CATALOG.log")
    present = set(_segment_files(tree))
    if log is not None:
        for ev in catalog_events(_bytes(rec, log)):
            if ev.get("e") == "sealed" and ev.get("seg") in present:
                counts[ev["seg"]] = max(counts.get(ev["seg"], 0), int(ev.get("rows", 0)))
    for name, n in counts.items():
        parsed = parse_segment_name(name)
        if parsed is not None:
            out.update(range(parsed[0] * R, parsed[0] * R + min(n, R)))
    return out


def _recorded_rows(tree: tuple, rec: Recorder, R: int) -> set[int]:
    """Rows the state's catalog records as no longer served: segments quarantined or acknowledged
    lost, and the damaged (masked) and torn rows of checks."""
    from .damage import catalog_events

    log = dict(tree).get("CATALOG.log")
    out: set[int] = set()
    for ev in catalog_events(_bytes(rec, log)) if log is not None else ():
        seg = str(ev.get("seg", ""))
        if not seg[:13].isdigit():
            continue
        base = int(seg[:13]) * R
        if ev.get("e") == "quarantined" or (ev.get("e") == "removed" and ev.get("why") == "lost"):
            out.update(range(base, base + R))
        elif ev.get("e") in ("checked", "masked"):
            for a, b in [*ev.get("bad", ()), *ev.get("torn", ())]:
                out.update(range(base + int(a), base + int(b)))
    return out


def _evicted_rows(kill9: tuple, rec: Recorder, R: int) -> set[int]:
    """Rows of segments an eviction had decided on by then: named by a departure line of the
    catalog as everything applied has it, or renamed ``.deleted``."""
    from .damage import catalog_events

    names = {n.removesuffix(".deleted") for n in _segment_files(kill9) if n.endswith(".deleted")}
    log = dict(kill9).get("CATALOG.log")
    if log is not None:
        names.update(str(ev.get("seg")) for ev in catalog_events(_bytes(rec, log)) if ev.get("e") == "evicted")
    out: set[int] = set()
    for n in names:
        if n[:13].isdigit():
            sid = int(n[:13])
            out.update(range(sid * R, sid * R + R))
    return out


def stratified(states: list[State], count: int, seed: int) -> list[State]:
    """``count`` states drawn evenly over labels and over the session's operations (seeded)."""
    rng = np.random.default_rng(seed)
    by_label: dict[str, list[State]] = {}
    for s in states:
        by_label.setdefault(s.label, []).append(s)
    out: list[State] = []
    labels = sorted(by_label)
    per = max(1, count // len(labels))
    for lab in labels:
        group = by_label[lab]
        if len(group) <= per:
            out += group
            continue
        # evenly over the operations, a seeded offset in each stretch
        edges = np.linspace(0, len(group), per + 1).astype(int)
        out += [group[int(rng.integers(a, max(a + 1, b)))] for a, b in zip(edges[:-1], edges[1:])]
    chosen = {id(s) for s in out}
    rest = [s for s in states if id(s) not in chosen]
    if len(out) < count and rest:
        pick = rng.choice(len(rest), size=min(count - len(out), len(rest)), replace=False)
        out += [rest[int(i)] for i in sorted(pick)]
    return out


@contextlib.contextmanager
def no_recorder() -> Any:
    """Make sure no recorder is set (a failed recording must not leak into later tests)."""
    try:
        yield
    finally:
        fs.RECORDER = None
