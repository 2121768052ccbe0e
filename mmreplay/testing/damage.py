"""The damage suite: random damage to a store's files, and what the store must keep.

One **case** copies a small store (``build_base``: closed, or as a killed writer leaves it with
its last segment open), damages 1-3 regions of it (a segment's header, control slots, any byte
of a row's record or stamp; the file system's units: a zeroed or garbage page anywhere in a
segment, truncation anywhere or mid-row, a missing segment file, two files swapped, a segment of
another store copied in, ``CATALOG.log`` missing or cut; and the store's own ``CATALOG.log``,
``counters.bin`` and either copy of its manifest) in 1-3 segments, then opens it read-only, samples it with every kind of sampler and
view, opens it for writing (recovery), verifies, repairs twice, in one case of five exports it to
a zarr archive and imports that back, and last appends a few rows in a new segment. Which rows are damaged is worked out from the bytes the case
changed (a row whose record or stamp bytes changed; every row of a segment whose header
changed or whose file was cut short), never from what the store reports. The invariants,
checked row id by row id against the undamaged store:

* no served value differs from the undamaged store's for the same id, and no id is served that
  the undamaged store would not serve (no value that was never written): every transition,
  n-step window, frame stack and sequence, sampled or asked for;
* after recovery and repair every undamaged row is still there, with its bytes (``beyond``:
  undamaged rows not served, the target is 0);
* every row no longer served is reported: masked rows by ``check_counts()``, quarantined and
  lost rows by the repair's report, with the files they were in (but a segment file gone with
  every record of it: no catalog line, no later segment of its session; ``_untraceable``);
* every damaged segment is named by ``verify``; ``verify`` is clean after a repair, and a second
  repair does nothing;
* an export carries the masked rows as masked, and its import serves what the store serves.

``run_case(base, work, seed)`` raises ``AssertionError`` naming the case's damage when an
invariant fails, and returns a :class:`CaseResult`. ``tests/fault/test_damage.py`` runs a few
hundred seeded cases; ``python benchmarks/damage.py --cases 5000`` runs more and prints the figures.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import CorruptStoreError, EmptyStoreError
from ..core.schema import Schema
from ..sampling.prioritized import PrioritizedSampler
from ..sampling.sequence import SequenceSampler
from ..sampling.uniform import UniformSampler
from ..storage import CONTROL_OFFSET, CONTROL_SLOT_SIZE, HEADER_SIZE, MASKED, PAGE_SIZE, Header
from ..storage import ReplayStore, create_store, open_store

SCHEMA = Schema.transition(obs_shape=(4,), obs_dtype=np.float32)
VIEWS = ((1, 1), (3, 1), (1, 3), (2, 2))
"""``(n_step, frame_stack)`` of every view checked."""
KINDS = ("header", "control", "controls", "record", "record", "record", "stamp", "stamp", "page", "page", "truncate",
         "truncate-row", "missing", "swap", "foreign", "catalog", "catalog-missing", "catalog-cut", "counters",
         "manifest")
"""Kinds of damage a region gets, drawn uniformly (rows' records and stamps most often): bit flips in
every region; the file system's own units: a zeroed or garbage 4 KiB page anywhere in a segment
(header and control pages included), a file cut short (anywhere, or in the middle of a row), a
segment file missing, two segment files swapped by name, a segment of another store copied in,
``CATALOG.log`` missing or cut; the store's own files."""


@dataclass(frozen=True, slots=True)
class Base:
    """An undamaged store and its facts."""

    path: Path
    lanes: int
    rows: int


@dataclass
class CaseResult:
    """What one case found."""

    damage: list[str] = field(default_factory=list)
    """The regions damaged, as ``kind file@offset``."""
    damaged_rows: int = 0
    """Rows whose bytes the case changed (every row of a segment with a damaged header or size)."""
    not_served: int = 0
    """Rows of the undamaged store no longer served after the repair (masked, quarantined or lost)."""
    beyond: int = 0
    """Of those, rows whose bytes the case did not change (the target is 0)."""
    reported: int = 0
    """Rows the store reported as no longer served (masked + quarantined + lost)."""
    exported: bool = False
    store_unopenable: bool = False
    """Both copies of the manifest were damaged: the store refuses to open (CorruptStoreError),
    nothing changed."""


def build_base(path: Path, lanes: int, steps: int = 130, segment_records: int = 60, *,
               open_tail: bool = False) -> Base:
    """A closed store of ``steps`` vector steps of ``lanes`` lanes: episodes end terminated or
    truncated at staggered steps; the first half is written one step per commit group, the rest
    in ``add_batch`` calls of 20 steps (large groups). ``obs = (t, lane, 8 t + lane + 1, 0)``.
    ``open_tail``: the store as a killed writer leaves it instead: its last segment open, the
    rows before the last ``flush()`` durable, the later ones published (a copy of the files taken
    while the writer was still open, lock files aside)."""
    live = path.with_name(path.name + "-live") if open_tail else path
    store = create_store(live, SCHEMA, capacity=1_000_000, segment_records=segment_records)
    w = store.writer(lanes=lanes, publish_rows=1)
    lane = np.arange(lanes)

    def step(t: np.ndarray) -> dict[str, np.ndarray]:
        tt = t[:, None] + np.zeros(lanes, np.int64)
        obs = np.stack([tt, np.broadcast_to(lane, tt.shape), 8 * tt + lane + 1, np.zeros(tt.shape)], -1)
        return {"obs": obs.astype(np.float32), "action": (tt % 5).astype(np.int64),
                "reward": ((tt * 7 + lane) % 11 - 5).astype(np.float32),
                "terminated": (tt + 3 * lane) % 13 == 12, "truncated": (tt + 5 * lane) % 17 == 16}

    half = steps // 2
    for t in range(half):
        w.add(**{k: v[0] for k, v in step(np.array([t])).items()})
    for t0 in range(half, steps, 20):
        w.add_batch(step(np.arange(t0, min(t0 + 20, steps))))
    if not open_tail:
        w.close()
        rows = len(store)
        store.close()
        return Base(path, lanes, rows)
    w.flush()  # durable up to here; the steps below are published only
    for t in range(steps, steps + 9):
        w.add(**{k: v[0] for k, v in step(np.array([t])).items()})
    w.publish()
    shutil.copytree(live, path, ignore=shutil.ignore_patterns("*.lock"))
    w.close()
    store.close()
    shutil.rmtree(live, ignore_errors=True)
    with open_store(path, mode="r") as dead:  # (a dead writer's open segment: checked, then served)
        dead.wait_checked()
        rows = len(dead)
    return Base(path, lanes, rows)


# -- damage ------------------------------------------------------------------------------------
def _flip(path: Path, off: int, rng: np.random.Generator) -> None:
    with open(path, "r+b") as fh:
        fh.seek(off)
        b = fh.read(1)
        if not b:
            return
        fh.seek(off)
        fh.write(bytes([b[0] ^ (1 << int(rng.integers(0, 8)))]))


def _damage(work: Path, store: ReplayStore, rng: np.random.Generator, out: CaseResult,
            foreign: Path | None = None) -> None:
    """Damage 1-3 regions in 1-3 segments (or the store's own files); ``foreign``: a segment file of
    another store, for the ``foreign`` kind."""
    lay = store.layout
    segs = sorted(p for p in (work / "segments").iterdir() if p.name.endswith(".seg"))
    committed = {m.name: m.committed for m in store.reader.segments.values()}
    victims = [segs[int(i)] for i in rng.choice(len(segs), size=min(len(segs), int(rng.integers(1, 4))), replace=False)]
    for _ in range(int(rng.integers(1, 4))):
        kind = str(rng.choice(KINDS))
        seg = victims[int(rng.integers(0, len(victims)))]
        n = max(committed.get(seg.name, 1), 1)
        if kind in ("header", "control", "controls", "record", "stamp") and not seg.exists():
            continue  # (removed by an earlier region of this case)
        if kind == "header":
            off = int(rng.integers(0, HEADER_SIZE))
            _flip(seg, off, rng)
        elif kind in ("control", "controls"):
            slots = [int(rng.integers(0, 2))] if kind == "control" else [0, 1]
            for s in slots:
                off = CONTROL_OFFSET + s * CONTROL_SLOT_SIZE + int(rng.integers(0, CONTROL_SLOT_SIZE))
                _flip(seg, off, rng)
        elif kind == "record":
            off = lay.records_offset + int(rng.integers(0, n)) * lay.record_bytes + int(rng.integers(0, lay.record_bytes))
            _flip(seg, off, rng)
        elif kind == "stamp":
            off = lay.stamps_offset + int(rng.integers(0, n)) * 16 + int(rng.integers(0, 16))
            _flip(seg, off, rng)
        elif kind == "page":  # a whole page anywhere (header, control, records, stamps), zeroed or garbage
            if not seg.exists():
                continue
            r = rng.random()
            if r < 0.15:
                off = 0 if r < 0.07 else CONTROL_OFFSET
            else:
                lo = lay.records_offset if rng.random() < 0.6 else lay.stamps_offset
                hi = lo + (n * lay.record_bytes if lo == lay.records_offset else 16 * n)
                off = int(rng.integers(lo, max(hi, lo + 1))) // PAGE_SIZE * PAGE_SIZE
            data = bytes(PAGE_SIZE) if rng.random() < 0.5 else rng.integers(0, 256, PAGE_SIZE, dtype=np.uint8).tobytes()
            with open(seg, "r+b") as fh:
                fh.seek(off)
                fh.write(data)
        elif kind in ("truncate", "truncate-row"):
            if not seg.exists():
                continue
            off = (int(rng.integers(0, lay.file_size)) if kind == "truncate" else
                   lay.records_offset + int(rng.integers(0, n)) * lay.record_bytes + int(rng.integers(1, lay.record_bytes)))
            with open(seg, "r+b") as fh:
                fh.truncate(off)
        elif kind == "missing":
            seg.unlink(missing_ok=True)
            off = 0
        elif kind == "swap":  # with another segment file of the store, by name
            other = segs[int(rng.integers(0, len(segs)))]
            if other == seg or not seg.exists() or not other.exists():
                continue
            tmp = seg.with_name(seg.name + ".swap")
            seg.rename(tmp)
            other.rename(seg)
            tmp.rename(other)
            out.damage.append(f"swap {seg.name}<->{other.name}")
            continue
        elif kind == "foreign":  # a segment of another store copied in, under a name of its own
            if foreign is None:
                continue
            name = f"{int(rng.integers(500, 900)):013d}-w{int(rng.integers(0, 3)):03d}.seg"
            shutil.copy(foreign, work / "segments" / name)
            out.damage.append(f"foreign {name}")
            continue
        elif kind in ("catalog-missing", "catalog-cut"):
            log = work / "CATALOG.log"
            if not log.exists():
                continue
            if kind == "catalog-missing":
                log.unlink()
            else:
                data = log.read_bytes()
                log.write_bytes(data[: int(rng.integers(0, len(data)))])
            out.damage.append(kind)
            continue
        else:
            name = {"catalog": "CATALOG.log", "counters": "counters.bin",
                    "manifest": "STORE.json" if rng.random() < 0.5 else "STORE.copy.json"}[kind]
            target = work / name
            size = target.stat().st_size if target.exists() else 0
            if not size:
                continue
            off = int(rng.integers(0, size))
            _flip(target, off, rng)
            out.damage.append(f"{kind} {name}@{off}")
            continue
        out.damage.append(f"{kind} {seg.name}@{off if kind not in ('truncate', 'controls', 'missing') else '-'}")


def _damaged_rows(base: Path, work: Path, store: ReplayStore) -> tuple[dict[str, np.ndarray], set[str]]:
    """From the bytes that changed: damaged slots per segment file, and the files whose header or
    size changed (every row of them damaged)."""
    lay = store.layout
    committed = {m.name: m.committed for m in store.reader.segments.values()}
    rows: dict[str, np.ndarray] = {}
    whole: set[str] = set()
    # a file is found by its header's bytes (two files swapped by name keep their rows)
    by_header = {}
    for q in (work / "segments").iterdir():
        with open(q, "rb") as fh:
            by_header.setdefault(fh.read(HEADER_SIZE), q)
    for p in sorted((base / "segments").iterdir()):
        a = np.frombuffer(p.read_bytes(), np.uint8)
        q = work / "segments" / p.name
        head = a[:HEADER_SIZE].tobytes()
        if (not q.exists() or q.read_bytes()[:HEADER_SIZE] != head) and head in by_header:
            q = by_header[head]
        b = np.frombuffer(q.read_bytes(), np.uint8) if q.exists() else np.zeros(0, np.uint8)
        if len(b) != len(a) or (a[:HEADER_SIZE] != b[:HEADER_SIZE]).any():
            whole.add(p.name)
            continue
        diff = np.flatnonzero(a != b)
        n = committed[p.name]
        rec = diff[(diff >= lay.records_offset) & (diff < lay.records_offset + n * lay.record_bytes)]
        st = diff[(diff >= lay.stamps_offset) & (diff < lay.stamps_offset + 16 * n)]
        slots = np.union1d((rec - lay.records_offset) // lay.record_bytes, (st - lay.stamps_offset) // 16)
        if len(slots):
            rows[p.name] = slots.astype(np.int64)
    return rows, whole


# -- what a store serves -----------------------------------------------------------------------
def served_ids(store: ReplayStore) -> np.ndarray:
    """Global ids of every row the store serves: visible and not masked."""
    r = store.reader
    s = r.snapshot
    out = []
    for k in range(len(s.segment_ids)):
        n = int(s.committed[k])
        flags = r.is_last[int(s.windows[k]), :n]
        out.append(int(s.segment_ids[k]) * store.segment_records + np.flatnonzero(flags != MASKED))
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def _same(a: object, b: object, what: str) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), what
        for key in a:
            _same(a[key], b[key], f"{what}[{key}]")  # type: ignore[index]
        return
    if a is None or b is None:
        assert a is None and b is None, what
        return
    assert np.array_equal(np.asarray(a), np.asarray(b)), what


def _same_batch(got: object, want: object, what: str) -> None:
    for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated", "ids", "extra", "discount"):
        _same(getattr(got, name), getattr(want, name), f"{what}: {name}")


class Oracle:
    """The undamaged store's views, by id."""

    def __init__(self, base: Base) -> None:
        self.store = open_store(base.path, mode="r")
        self.views = {v: UniformSampler(self.store, seed=0, n_step=v[0], frame_stack=v[1], gamma=0.9) for v in VIEWS}
        self.valid = {v: set(s.valid_ids().tolist()) for v, s in self.views.items()}
        self.seq = SequenceSampler(self.store, 4, seed=0)
        self.ids = served_ids(self.store)

    def close(self) -> None:
        for s in self.views.values():
            s.close()
        self.store.close()


def check_views(store: ReplayStore, oracle: Oracle, seed: int, what: str) -> None:
    """Every view of ``store`` against the undamaged store's, exhaustively and by sampling: no start
    the undamaged store does not offer, no value that differs from its for the same id (transitions,
    n-step windows, frame stacks, prioritized batches, sequences, rows)."""
    for v, clean in oracle.views.items():
        with UniformSampler(store, seed=seed, n_step=v[0], frame_stack=v[1], gamma=0.9) as s:
            ids = s.valid_ids()
            bad = set(ids.tolist()) - oracle.valid[v]
            assert not bad, f"{what}: view {v} offers starts the undamaged store does not: {sorted(bad)[:5]}"
            if len(ids):
                _same_batch(s.view(ids), clean.view(ids), f"{what}: view {v}")
                try:
                    b = s.sample(48)  # (one-step batches carry the rows' own flags: transitions() is their view)
                except EmptyStoreError:  # too few windows to draw from (a store a crash cut short): all were viewed
                    continue
                want = clean.view(b.ids) if v != (1, 1) else oracle.store.transitions(b.ids)
                _same_batch(b, want, f"{what}: sampled view {v}")
                s.windows_left_out()
    if len(store.transition_ids()):
        ids = store.transition_ids()
        assert set(ids.tolist()) <= oracle.valid[(1, 1)], f"{what}: transition_ids"
        _same_batch(store.transitions(ids), oracle.store.transitions(ids), f"{what}: transitions()")
        with PrioritizedSampler(store, seed=seed, n_step=2, frame_stack=2, gamma=0.9) as p:
            try:
                b = p.sample(48)
            except EmptyStoreError:  # no 2-step window at all (a store cut short by a crash): nothing served
                assert not len(p.valid_ids()), f"{what}: prioritized: empty, yet it offers starts"
            else:
                _same_batch(b, oracle.views[(2, 2)].view(b.ids), f"{what}: prioritized")
        seq = SequenceSampler(store, 4, seed=seed)
        try:
            b = seq.sample(32)
        except Exception as exc:  # too few windows left: nothing served, nothing to compare
            assert type(exc).__name__ == "EmptyStoreError", f"{what}: sequences: {exc!r}"
        else:
            want = oracle.seq.windows(b.ids)
            assert want is not None, f"{what}: sequences start where the undamaged store has no window"
            _same(b.mask, want.mask, f"{what}: sequence mask")
            # a window's rows: its episode's steps and final observation (the rows after it belong to
            # whatever the lane holds next, or are padding where nothing follows: not compared)
            upto = np.cumsum(np.cumsum(want.is_last, axis=1), axis=1) <= 1
            _same(np.where(upto, b.is_last, False), np.where(upto, want.is_last, False), f"{what}: sequence is_last")
            for name, x in want.fields.items():
                keep = upto.reshape(upto.shape + (1,) * (x.ndim - 2))
                _same(np.where(keep, b.fields[name], 0), np.where(keep, x, 0), f"{what}: sequence {name}")
    served = served_ids(store)
    assert set(served.tolist()) <= set(oracle.ids.tolist()), f"{what}: rows served that were never written"
    if len(served):
        for name in store.schema.names:
            _same(store.rows(name, served), oracle.store.rows(name, served), f"{what}: rows({name!r})")


# -- a case ------------------------------------------------------------------------------------
def catalog_events(data: bytes, bad: list[bytes] | None = None) -> list[dict]:
    """A catalog's events as its lines hold them (``crc32c json``: a line whose crc32c fails or that
    does not parse is skipped, and appended to ``bad`` when given): the test's own reading."""
    from crc32c import crc32c

    out = []
    for line in data.splitlines():
        if not line.strip():
            continue
        try:
            ok = len(line) > 9 and int(line[:8], 16) == crc32c(line[9:])
            ev = json.loads(line[9:]) if ok else None
        except ValueError:
            ev = None
        if isinstance(ev, dict):
            out.append(ev)
        elif bad is not None:
            bad.append(line)
    return out


def _untraceable(base: Path, work: Path, whole: set[str], seg_rows: dict[str, int], *,
                 rebuilt: bool = False) -> set[str]:
    """Base segments whose files the damage removed and nothing left in the damaged store records:
    no catalog line lists them, and no later segment of their writer session is present (an
    interior position of a session's chain is found by its neighbours; one before the first
    present is, when the catalog is missing). Their loss cannot be named or counted. ``rebuilt``:
    count a present file whose header is damaged at its base header's position too (recovery
    rebuilds such a header when its rows verify under the session)."""
    def header(p: Path) -> Header | None:
        try:
            return Header.unpack(p.read_bytes()[:HEADER_SIZE], p)
        except Exception:  # noqa: BLE001 - a damaged header: its file is there, it is not "gone"
            return None

    present = [h for q in (work / "segments").iterdir()
               if (h := header(q) or (header(base / "segments" / q.name) if rebuilt and (base / "segments" / q.name)
                                      .exists() else None)) is not None and seg_rows.get(q.name, 1)]
    log = work / "CATALOG.log"
    torn: list[bytes] = []
    events = catalog_events(log.read_bytes(), torn) if log.exists() else []
    departed = {e.get("seg") for e in events if e.get("e") in ("evicted", "quarantined", "removed")}
    live = {e.get("seg") for e in events if e.get("e") == "sealed"} - departed
    missing_log = not log.exists() or bool(torn)  # (a catalog missing or cut: chain positions are checked)
    out = set()
    for name in whole:
        h = header(base / "segments" / name)
        if h is None or any((x.segment_id, x.writer_id) == (h.segment_id, h.writer_id) for x in present) \
                or any(q.name.startswith(name) for q in (work / "segments").iterdir()):
            continue  # still there (damaged, swapped, renamed or quarantined): counted when repaired
        chain = [x.chain_index for x in present if (x.writer_id, x.session_epoch) == (h.writer_id, h.session_epoch)]
        later = any(c > h.chain_index for c in chain)
        earlier = any(c < h.chain_index for c in chain)
        if name not in live and not (later and (earlier or missing_log)):
            out.add(name)
    return out


def run_case(base: Base, oracle: Oracle, work: Path, seed: int, *, export: bool | None = None,
             foreign: Path | None = None) -> CaseResult:
    """One seeded case on a copy of ``base`` at ``work`` (see the module docstring); ``foreign``: a
    segment file of another store (the ``foreign`` kind)."""
    rng = np.random.default_rng(seed)
    out = CaseResult()
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(base.path, work)
    with open_store(work, mode="r") as clean_copy:
        clean_copy.wait_checked()
        _damage(work, clean_copy, rng, out, foreign)
        damaged, whole = _damaged_rows(base.path, work, clean_copy)
        seg_rows = {m.name: m.committed for m in clean_copy.reader.segments.values()}
    untraceable = _untraceable(base.path, work, whole, seg_rows)
    maybe = untraceable - _untraceable(base.path, work, whole, seg_rows, rebuilt=True)  # if a header is rebuilt
    what = f"case {seed} ({'; '.join(out.damage)})"
    out.damaged_rows = sum(len(v) for v in damaged.values()) + sum(seg_rows[n] for n in whole)
    R = oracle.store.segment_records
    damaged_ids = set()
    for name, slots in damaged.items():
        damaged_ids.update((int(name[:13]) * R + slots).tolist())
    for name in whole:
        damaged_ids.update(range(int(name[:13]) * R, int(name[:13]) * R + seg_rows[name]))
    before = {p.name: p.stat().st_size for p in (work / "segments").iterdir()}
    logging.disable(logging.WARNING)  # the store's warnings about the damage: expected
    try:
        try:
            store = open_store(work, mode="r")
        except CorruptStoreError:  # both copies of the manifest: the store's identity; it refuses to open, changes nothing
            assert {d.split("@")[0] for d in out.damage} >= {"manifest STORE.json", "manifest STORE.copy.json"}, \
                f"{what}: CorruptStoreError"
            assert {p.name: p.stat().st_size for p in (work / "segments").iterdir()} == before, what
            out.store_unopenable = True
            return out
        with store:
            check_views(store, oracle, seed, f"{what} [read-only]")
            notes: list = []
            found = store.verify(notes=notes)
            named = {p.file for p in found}
            if any(p.fix == "gap" for p in found):  # segments gone with the catalog: named by their chain positions
                named |= {n for n in whole if not (work / "segments" / n).exists()}
            missing = {n for n in (set(damaged) | whole) - named - untraceable if seg_rows.get(n, 1)}  # (a spare: no row)
            assert not missing, f"{what}: verify does not name {sorted(missing)}"
        reported = 0
        with open_store(work, mode="a") as store:  # recovery
            check_views(store, oracle, seed, f"{what} [writable]")
            rep1 = repair_twice(store, what)
            # (torn rows left in place are both lost and masked: counted once)
            reported = store.check_counts()["damaged_rows"] + rep1.rows_quarantined + rep1.rows_lost - rep1.rows_torn
            check_views(store, oracle, seed, f"{what} [repaired]")
            served = set(served_ids(store).tolist())
            undamaged = set(oracle.ids.tolist()) - damaged_ids
            lost = undamaged - served
            out.not_served = len(oracle.ids) - len(served)
            out.beyond = len(lost)
            out.reported = reported
            assert not lost, f"{what}: {len(lost)} undamaged rows no longer served: {sorted(lost)[:8]}"
            hidden = sum(seg_rows[n] for n in untraceable)  # gone with every record of them: not countable
            hidden_min = hidden - sum(seg_rows[n] for n in maybe)
            # a damaged spare (made ahead of need, no row) may show rows it never held (a damaged control slot, a
            # changed byte): reported as lost, at most its usable rows
            slack = sum(R for n, r in seg_rows.items() if not r and any(n in d for d in out.damage))
            # a quarantined file (nothing of it served) whose count the case damaged too: the count its files
            # still hold (an older control slot's) is what can be reported
            quarantined = {a.split()[1] for a in rep1.actions if a.startswith("quarantined ")}
            counts_hit = {d.split()[1].split("@")[0] for d in out.damage if d.split()[0] in ("control", "controls")
                          or (d.startswith("page ") and d.endswith(f"@{CONTROL_OFFSET}"))}
            if quarantined & counts_hit and not rep1.unknown:
                assert reported <= out.not_served - hidden_min + slack, \
                    f"{what}: {out.not_served} not served, {reported} reported"
            elif not rep1.unknown:  # (a file quarantined whose count nothing records: it is named, not counted)
                assert out.not_served - hidden <= reported <= out.not_served - hidden_min + slack, \
                    f"{what}: {out.not_served} rows not served ({hidden} untraceable), {reported} reported"
            else:
                assert reported <= out.not_served and set(rep1.unknown) <= whole, f"{what}: {rep1.unknown}"
            if export if export is not None else seed % 5 == 0:
                _export_round_trip(store, work, what)
                out.exported = True
            _append(store)  # last: a new segment, its id allocated past every id the store has known
        now = {p.name.removesuffix(".corrupt") for p in (work / "segments").iterdir()}
        spares = {n for n, r in seg_rows.items() if r == 0}  # made ahead of need, never written: removable
        moved = {a.split()[1] for a in rep1.actions if a.startswith("renamed ")}  # to their headers' names
        gone = set(before) - spares - moved - now
        assert not gone, f"{what}: files removed {sorted(gone)}"
    finally:
        logging.disable(logging.NOTSET)
    return out


def repair_twice(store: ReplayStore, what: str) -> Any:
    """``store.repair()`` twice: the first leaves no problem (``verify`` is clean after it), the
    second finds nothing to do. Returns the first's report."""
    rep1 = store.repair()
    rep2 = store.repair()
    assert rep2.actions == [] and rep2.problems == [] and rep2.rows_cost == 0, \
        f"{what}: a second repair did {rep2.actions} {rep2.problems}"
    assert rep1.problems == [], f"{what}: problems left after a repair: {rep1.problems}"
    assert store.verify() == [], f"{what}: verify after repair: {store.verify()}"
    return rep1


def _append(store: ReplayStore) -> None:
    """Three rows of a new writer session (a segment of its own, served with the rest)."""
    def ids() -> set[int]:  # every segment file's id (quarantined ones included): NNNNNNNNNNNNN-wWWW.seg...
        return {int(p.name[:13]) for p in store.segments_dir.iterdir() if p.name[:13].isdigit()}

    before = ids()
    w = store.writer(lanes=1)
    for t in range(3):
        w.add(obs=np.array([[1e6 + t, 9, 0, 0]], np.float32), action=np.zeros(1, np.int64),
              reward=np.zeros(1, np.float32), terminated=np.zeros(1, bool), truncated=np.zeros(1, bool))
    w.close()
    new = ids() - before
    assert new and min(new) > max(before, default=-1), f"segment ids reused: {sorted(new)}"
    store.refresh()


def _export_round_trip(store: ReplayStore, work: Path, what: str) -> None:
    from ..archive.zarr_io import export_archive, import_archive

    url = work.with_name(work.name + ".zarr")
    back = work.with_name(work.name + "-back")
    for p in (url, back):
        shutil.rmtree(p, ignore_errors=True)
    rep = export_archive(store, url)
    assert rep.damaged_rows == store.check_counts()["damaged_rows"], f"{what}: export counts {rep.damaged_rows}"
    import_archive(url, back)
    with open_store(back, mode="r") as b:
        want, got = served_ids(store), served_ids(b)
        assert np.array_equal(np.sort(want), np.sort(got)), f"{what}: the import serves other rows"
        ids = store.transition_ids()
        assert np.array_equal(np.sort(ids), np.sort(b.transition_ids())), f"{what}: the import's transitions"
        if len(ids):
            _same_batch(b.transitions(ids), store.transitions(ids), f"{what}: imported transitions")
    for p in (url, back):
        shutil.rmtree(p, ignore_errors=True)


def run(cases: int, root: Path, *, first_seed: int = 0, progress: bool = False) -> dict[str, object]:
    """``cases`` seeded cases over four base stores (1 and 3 lanes; closed, and as a killed writer
    leaves it: its last segment open); returns the figures."""
    root.mkdir(parents=True, exist_ok=True)
    bases = [build_base(root / f"base{lanes}{'-open' if o else ''}", lanes, open_tail=o)
             for o in (False, True) for lanes in (1, 3)]
    other = build_base(root / "other", 1, steps=20)  # a store of its own: the foreign segment's
    foreign = sorted((other.path / "segments").glob("*.seg"))[0]
    oracles = [Oracle(b) for b in bases]
    totals = {"cases": 0, "damaged_rows": 0, "rows_not_served": 0, "rows_beyond_damaged": 0, "exported": 0,
              "manifest_refused": 0}
    try:
        for i in range(cases):
            seed = first_seed + i
            res = run_case(bases[seed % 4], oracles[seed % 4], root / "case", seed, foreign=foreign)
            totals["cases"] += 1
            totals["damaged_rows"] += res.damaged_rows
            totals["rows_not_served"] += res.not_served
            totals["rows_beyond_damaged"] += res.beyond
            totals["exported"] += int(res.exported)
            totals["manifest_refused"] += int(res.store_unopenable)
            if progress and (i + 1) % 100 == 0:
                print(json.dumps({"done": i + 1, **totals}), flush=True)
    finally:
        for o in oracles:
            o.close()
        with contextlib.suppress(OSError):
            shutil.rmtree(root / "case")
    return totals
