"""How cost grows with store size: 1M, 10M and 100M rows (300M with ``--big``), mmreplay against TorchRL and cpprb.

    .venv/bin/python benchmarks/scale.py --quick                 # 1e5 and 1e6 rows, 20k Atari rows: ~40 s
    .venv/bin/python benchmarks/scale.py --plot scale.png        # 1e6, 1e7, 1e8 + 1M Atari rows: ~30 min (est.),
                                                                  # ~30 GB of free disk under --dir at the peak
    .venv/bin/python benchmarks/scale.py --big --plot scale.png  # also 3e8 rows (~50 GB, 2x RAM): ~1 h 30 min (est.)
    .venv/bin/python benchmarks/scale.py --from full.log mm.log --plot scale.png  # report of saved runs' output
    PYTHONPATH=../old .venv/bin/python benchmarks/scale.py --systems mmreplay --sizes 1e7 --atari-rows 0 \
        --passes-only                                             # an older checkout's passes, to compare

(Durations on the 2-core, 25 GB development VM. On disk: mmreplay ~165 B a vector row, 16.5 GB
at 1e8; TorchRL ~227 B a transition, 22.7 GB at 1e8; the Atari store ~7 GB; a zarr archive of
up to the store's size while the export pass runs.)

Stores of low-dimensional rows (obs 24 float32, action 6 float32, reward float64: the schema
``Schema.from_spaces`` makes for two Box spaces), episodes of 500 steps (501 rows: the final
observation is a row), written as one lane with ``add_batch`` calls of 1M rows; and one Atari
store (84x84 uint8 frames, ``beyond_ram.build``: episodes of 50-500 steps) of ``--atari-rows``.
Every row is a pure function of its index (pools of random values indexed by it), so each
peer's copy is built from the same rows without keeping them: TorchRL's layout (``observation``,
``action``, ``("next", ...)``: one transition per step, the next observation stored) and cpprb's
(``obs``, ``next_obs``, ``act``, ``rew``, ``done``). Each system at each size runs in a fresh
subprocess under ``--dir`` that builds, measures and deletes its copy before the next one starts
(free disk is checked first: a size that does not fit is skipped with a line saying so).

Per size and system:

* **build** time and bytes (mmreplay: the writer's check at close included; ``unchecked_after_build``
  says what a read-only open would still have to check: 0); **open**
  time from a cold page cache (``os.sync`` + ``kit.drop_pages``: ``posix_fadvise(DONTNEED)``
  per file, never ``/proc/sys/vm/drop_caches``): mmreplay ``open_store(mode="r")``; TorchRL
  ``ReplayBuffer.loads`` of a buffer dumped in place (its ``LazyMemmapStorage`` maps its files
  again, no copy); cpprb lives in RAM (nothing to open);
* per sampler, B=256: **setup** (making the sampler; for TorchRL the reopen, as each sampler
  starts from a cold cache), the **first batch** from a cold page cache, and the **per-batch
  cost warm** (files read in first; median and p90 of ``--batches`` batches, each timed alone,
  after untimed ones for at least 1 s and at least 10 + ``--batches`` of them: ``SETTLE_S``;
  ``just_warm_us``: the median of the first ``--batches`` after 10, what runs before the settle
  reported). Samplers: ``uniform`` (mmreplay ``UniformSampler``; TorchRL ``RandomSampler``;
  cpprb ``ReplayBuffer``), ``sequence`` (256 windows of 4 rows: mmreplay
  ``SequenceSampler(length=4)``; TorchRL ``SliceSampler(slice_len=4, end_key=("next", "done"),
  cache_values=True)``, batch 1,024: its documented fast path for a static buffer; cpprb has
  none), ``prioritized`` (one op = sample 256 + update their 256 priorities, as
  benchmarks/prioritized.py: mmreplay ``PrioritizedSampler``; TorchRL ``PrioritizedSampler``,
  skipped where its C++ sum tree does not load, as with the CPU wheel of torchrl 0.14.1;
  cpprb ``PrioritizedReplayBuffer``) and, Atari only, ``frame stack`` (``UniformSampler(frame_stack=4)``).
  Only each library's own calls are timed, in one thread (``--torch-threads``, default 1); each
  sampler gets its own seed. At the largest size mmreplay also runs ``uniform`` and
  ``prioritized`` with ``mode="windowed"`` (``--cache-gb``, ``--swap``; setup includes filling
  the resident set from a cold cache);
* cpprb only where it fits in RAM (70% of ``MemAvailable``): with ``next_obs`` stored apart
  (adds of 65,536 transitions with their ``done`` flags; its fastest sampling) or, where only
  that fits, with ``next_of="obs"`` (one ``add`` per episode, then ``on_episode_end()``);
* mmreplay's **whole-store passes**, each from a cold page cache, each just after the
  sequential read rate of the same segment files measured the same way (cold, ``readinto`` of
  8 MiB blocks: ``kit.warm_pages``): ``field_stats(path, "obs", cache=False)``, ``store.verify()``,
  ``export_archive(store, dir)`` (deleted afterwards; skipped when the disk has no room for it)
  and the first check of a copied store (``os.utime`` of every segment file, as
  benchmarks/checks.py does, then ``open_store(mode="r")`` + ``wait_checked()``): seconds, MB/s
  of segment-file bytes and the fraction of the sequential rate.

Output: one JSON line per measurement as it goes (``--worker`` subprocesses print them, this
process echoes them), then tables (``kit.table``) and the targets' verdicts; ``--plot FILE`` draws
per-batch cost against rows, log-log, one line per system and sampler. Targets: per-batch cost
at the largest size within 2x of the cost at 1M rows for every mmreplay sampler (warm; windowed
where the store is larger than 80% of RAM); mmreplay ahead of every peer at every size;
``field_stats`` and ``verify`` >= 50% of the sequential read rate; export >= 300 MB/s.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kit  # noqa: E402

import mmreplay  # noqa: E402

OBS, ACT = 24, 6
EP = 500  # steps per episode: EP + 1 rows, the last one the final observation
B = 256  # batch size (windows for sequences)
SEQ = 4  # rows per window
STACK = 4  # Atari frame stack
POOL = 1 << 18  # distinct random rows a row's fields are taken from
WARMUP = 10  # untimed batches before the timed ones (at least; see SETTLE_S)
SETTLE_S = 1.0  # and untimed batches for at least this long after the warm-up, before the timed ones
CHUNK = 1 << 20  # rows per add_batch / extend
PASS_TARGET_BYTES = 100_000_000  # the passes' targets apply to stores at least this large
MB = 1e6
Record = dict[str, Any]


def emit(rec: Record) -> None:
    print(json.dumps(rec), flush=True)


# -- the rows -------------------------------------------------------------------------------------
class Rows:
    """The rows of a vector store of ``total`` rows: row ``r`` is at step ``r % (EP + 1)`` of its
    episode; its fields are taken from random pools by ``r`` (pools of coprime sizes), so any
    row can be made again from its index. Written: rows ``0 .. total - 2`` with ``add_batch``,
    the last one as ``close(last_obs=...)`` (an episode cut there: the peers get it as truncated)."""

    def __init__(self, nominal: int, seed: int = 0) -> None:
        n = nominal - 1  # rows written by add_batch
        if (n - 1) % (EP + 1) == EP:  # the last written row would be a final observation: end one earlier
            n -= 1
        self.total = n + 1
        rng = np.random.default_rng(seed)
        self.obs_pool = rng.standard_normal((POOL, OBS), dtype=np.float32)
        self.act_pool = rng.uniform(-1, 1, (POOL - 1, ACT)).astype(np.float32)
        self.rew_pool = rng.standard_normal(POOL - 3)

    def obs(self, r: np.ndarray) -> np.ndarray:
        return np.take(self.obs_pool, r % POOL, axis=0)

    def steps(self, r: np.ndarray) -> dict[str, np.ndarray]:
        """The fields of rows ``r`` as written: a final-observation row has action 0 and reward 0."""
        pos = r % (EP + 1)
        final = pos == EP
        action = np.take(self.act_pool, r % (POOL - 1), axis=0)
        action[final] = 0
        reward = np.take(self.rew_pool, r % (POOL - 3))
        reward[final] = 0
        return {"obs": self.obs(r), "action": action, "reward": reward, "terminated": pos == EP - 1,
                "truncated": np.zeros(len(r), np.bool_)}

    def transitions(self, chunk: int = CHUNK) -> Iterator[dict[str, np.ndarray]]:
        """The peers' view of the same rows, in order: every row but final observations and the
        last row, with ``next_obs`` (the next row's obs) and ``done``; ``truncated`` marks the cut end."""
        last = self.total - 2
        for r0 in range(0, last + 1, chunk):
            r = np.arange(r0, min(r0 + chunk, last + 1))
            r = r[r % (EP + 1) != EP]
            s = self.steps(r)
            s["truncated"] = (r == last) & ~s["terminated"]
            s["done"] = s["terminated"] | s["truncated"]
            s["next_obs"] = self.obs(r + 1)
            yield s

    def num_transitions(self) -> int:
        return self.total - 1 - (self.total - 1) // (EP + 1)


def vector_schema() -> mmreplay.Schema:
    import gymnasium as gym

    return mmreplay.Schema.from_spaces(gym.spaces.Box(-np.inf, np.inf, (OBS,), np.float32),
                                       gym.spaces.Box(-1, 1, (ACT,), np.float32))


def atari_schema() -> mmreplay.Schema:
    return mmreplay.Schema.transition(obs_shape=(kit.H, kit.W), obs_dtype=np.uint8)


def build_vector(path: Path, rows: Rows) -> Record:
    """The mmreplay store of ``rows``: one lane, ``add_batch`` of ``CHUNK`` rows."""
    n = rows.total - 1
    store = mmreplay.create_store(path, vector_schema(), capacity=rows.total + rows.total // 64 + 65536,
                                  on_full="error")
    t0 = time.perf_counter()
    w = store.writer()
    for r0 in range(0, n, CHUNK):
        s = rows.steps(np.arange(r0, min(r0 + CHUNK, n)))
        w.add_batch({k: v[:, None] for k, v in s.items()})
    w.close(last_obs=rows.obs(np.array([n])))
    secs = time.perf_counter() - t0
    got = store.num_rows
    store.close()
    return {"rows": got, "bytes": kit.dir_bytes(path / "segments"), "build_s": secs}


def store_bytes_estimate(schema: mmreplay.Schema, rows: int, base: Path) -> int:
    """The segment-file bytes a one-lane store of ``rows`` takes (from a probe store's layout)."""
    probe = Path(tempfile.mkdtemp(prefix="probe-", dir=base)) / "s"
    st = mmreplay.create_store(probe, schema, capacity=rows + rows // 64 + 65536)
    n = -(-rows // st.segment_records) * st.layout.file_size
    st.close()
    shutil.rmtree(probe.parent)
    return n


# -- files and timing -----------------------------------------------------------------------------
def files_under(root: Path) -> list[Path]:
    return sorted(p for p in Path(root).rglob("*") if p.is_file())


def drop_files(files: list[Path]) -> None:
    """Evict these files' pages from the page cache (pages a process still maps stay)."""
    os.sync()
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_files(files: list[Path]) -> None:
    buf = bytearray(8 << 20)
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass


def measure(make: Callable[[], Any], op: Callable[[Any], object], *, cold: Callable[[], None],
            warm: Callable[[Any], None], batches: int, settle_s: float = SETTLE_S) -> Record:
    """Setup and first op from a cold page cache, then warm (``warm(obj)``: the files in the page
    cache and mapped by the system's own mapping, its steady state): median and p90 of ``batches`` ops."""
    cold()
    t0 = time.perf_counter()
    obj = make()
    setup = time.perf_counter() - t0
    t0 = time.perf_counter()
    op(obj)
    first = time.perf_counter() - t0
    warm(obj)
    # settle: untimed for the record (each timed alone all the same), at least WARMUP + batches ops and SETTLE_S
    # seconds. Just after a store's pages were read in (warm_pages, map_pages) or a buffer was filled, the
    # first batches on this VM run slower for a fraction of a second (a 15 GB store: the first 20 uniform
    # batches ~4 ms each, falling to the steady ~65 µs within ~300 batches; docs/results.md, "Big stores").
    # ``just_warm_us``: the median of the ``batches`` ops after the first WARMUP, what runs before this
    # settle reported as ``warm_us``.
    settle: list[float] = []
    t_end = time.perf_counter() + settle_s
    while len(settle) < WARMUP + batches or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        op(obj)
        settle.append(time.perf_counter() - t0)
    ts = np.empty(batches)
    for i in range(batches):
        t0 = time.perf_counter()
        op(obj)
        ts[i] = time.perf_counter() - t0
    close = getattr(obj, "close", None)
    if callable(close):
        close()
    return {"setup_ms": setup * 1e3, "first_ms": first * 1e3, "warm_us": float(np.median(ts) * 1e6),
            "p90_us": float(np.percentile(ts, 90) * 1e6),
            "just_warm_us": float(np.median(settle[WARMUP:WARMUP + batches]) * 1e6), "settle_ops": len(settle)}


# -- mmreplay -------------------------------------------------------------------------------------
def mm_samplers(store: mmreplay.ReplayStore, atari: bool, windowed: dict | None) -> dict[str, tuple]:
    """name -> (make, op) of every mmreplay sampler timed on ``store``."""
    prios = np.random.default_rng(5).exponential(1.0, B) + 1e-3

    def per_op(s: mmreplay.PrioritizedSampler) -> None:
        s.update_priorities(s.sample(B).ids, prios)

    def sample(s: Any) -> object:
        return s.sample(B)

    out = {"uniform": (lambda: mmreplay.UniformSampler(store, seed=1), sample),
           "sequence": (lambda: mmreplay.SequenceSampler(store, length=SEQ, seed=2), sample),
           "prioritized": (lambda: mmreplay.PrioritizedSampler(store, seed=3), per_op)}
    if atari:
        out["frame stack"] = (lambda: mmreplay.UniformSampler(store, frame_stack=STACK, seed=4), sample)
    if windowed is not None:
        def filled(cls: type, seed: int) -> Callable[[], Any]:
            def make() -> Any:
                s = cls(store, mode="windowed", seed=seed, **windowed)
                s.load_resident()
                return s
            return make

        out["uniform windowed"] = (filled(mmreplay.UniformSampler, 6), sample)
        out["prioritized windowed"] = (filled(mmreplay.PrioritizedSampler, 7), per_op)
    size = kit.dir_bytes(store.path / "segments")
    if not atari and size < 0.3 * kit.meminfo()["MemTotal"]:  # windowed over the whole store: every segment resident
        def whole() -> Any:
            s = mmreplay.UniformSampler(store, mode="windowed", cache_bytes=int(size * 1.2) + (64 << 20), seed=8)
            s.load_resident()
            return s

        out["uniform windowed, whole store"] = (whole, sample)
    return out


def seq_read(path: Path) -> tuple[float, int]:
    """Seconds and bytes of a cold sequential read of the store's segment files."""
    os.sync()
    kit.drop_pages(path)
    t0 = time.perf_counter()
    kit.warm_pages(path)
    return time.perf_counter() - t0, kit.dir_bytes(path / "segments")


def mm_passes(path: Path, base: Path, tags: Record) -> None:
    """The whole-store passes, each cold, each after a sequential read of the same files."""
    def stats() -> Record:
        mmreplay.field_stats(path, "obs", cache=False)
        return {}

    def verify() -> Record:
        with mmreplay.open_store(path, mode="r") as st:
            return {"problems": len(st.verify())}

    def export() -> Record:
        dest = base / "archive.zarr"
        try:
            rep = mmreplay.export_archive(path, dest)
            return {"archive_bytes": kit.dir_bytes(dest), "archived_rows": rep.rows}
        finally:
            shutil.rmtree(dest, ignore_errors=True)

    def check() -> Record:
        with mmreplay.open_store(path, mode="r") as st:
            st.wait_checked()
            return {"checked_rows": len(st)}

    for name, run in (("field_stats", stats), ("verify", verify), ("export", export), ("first check", check)):
        seq_s, nbytes = seq_read(path)
        if name == "export" and shutil.disk_usage(base).free < nbytes + (2 << 30):
            print(f"skipping export at {tags['rows']:,} rows: {shutil.disk_usage(base).free / 1e9:.1f} GB free, "
                  f"the archive needs ~{nbytes / 1e9:.1f} GB", flush=True)
            emit({**tags, "what": "skip", "pass": name, "reason": "disk"})
            continue
        if name == "first check":
            for f in (path / "segments").iterdir():
                os.utime(f)  # a new identity: as a copied store, every segment is unchecked
        os.sync()
        kit.drop_pages(path)
        t0 = time.perf_counter()
        extra = run()
        secs = time.perf_counter() - t0
        emit({**tags, "what": "pass", "pass": name, "seconds": secs, "bytes": nbytes, "mb_per_s": nbytes / secs / MB,
              "seq_mb_per_s": nbytes / seq_s / MB, "of_seq": seq_s / secs, **extra})


def work_mm(cfg: Record) -> None:
    """Build one mmreplay store (vector or Atari), time opening, sampling and the passes, delete it."""
    base = Path(cfg["dir"])
    path = base / "store"
    atari = cfg["store"] == "atari"
    tags = {"store": cfg["store"], "size": cfg["size"], "system": "mmreplay"}
    try:
        if atari:
            from beyond_ram import build

            info = build(path, cfg["size"] * cfg["row_bytes"])
            info = {"rows": info["rows"], "bytes": info["bytes"], "build_s": info["seconds"]}
        else:
            info = build_vector(path, Rows(cfg["size"]))
        tags["rows"] = info["rows"]
        # a single-lane writer checks at close what it sealed unchecked (mmreplay.storage.segment_supply): a
        # read-only open then has nothing left to check (recorded: 0 expected)
        with mmreplay.open_store(path, mode="r", check_at_open=False) as st:
            info["unchecked_after_build"] = st.check_counts()["unchecked_segments"]
        emit({**tags, "what": "build", **info})
        os.sync()
        kit.drop_pages(path)
        t0 = time.perf_counter()
        store = mmreplay.open_store(path, mode="r")
        emit({**tags, "what": "open", "open_ms": (time.perf_counter() - t0) * 1e3})
        if cfg.get("passes_only"):  # (runs on code without map_pages: the passes of an older commit too)
            store.close()
            mm_passes(path, base, tags)
            return
        windowed = ({"cache_bytes": int(cfg["cache_gb"] * 1e9), "swap_segments_per_s": cfg["swap"]}
                    if cfg.get("windowed") else None)
        samplers = mm_samplers(store, atari, windowed)
        kit.warm_pages(path)  # a prioritized sampler reads every row's flags when made: not from disk here
        for name, (make, op) in samplers.items():  # compile the kernels before any timing
            if "windowed" not in name:
                s = make()
                op(s)
                getattr(s, "close", lambda: None)()

        def cold() -> None:
            store.reader.unmap_pages()
            os.sync()
            kit.drop_pages(path)

        for name, (make, op) in samplers.items():
            # windowed: rows come from the resident set's RAM copies; the file pages do not matter
            # (store.map_pages: what an exact-mode sampler starts in the background for a store that fits in RAM,
            # done at once here, so that every batch timed is a steady-state one)
            warm = (lambda obj: None) if "windowed" in name else (lambda obj: (kit.warm_pages(path), store.map_pages()))
            rec = measure(make, op, cold=cold, warm=warm, batches=cfg["batches"], settle_s=cfg["settle_s"])
            emit({**tags, "what": "sample", "sampler": name, **rec})
        store.close()
        mm_passes(path, base, tags)
    finally:
        shutil.rmtree(path, ignore_errors=True)


# -- TorchRL --------------------------------------------------------------------------------------
def trl_open(root: Path, capacity: int, sampler: Any) -> Any:
    """A TorchRL buffer over the storage dumped in place at ``root``: the memmap files are mapped again."""
    from torchrl.data import LazyMemmapStorage, ReplayBuffer

    rb = ReplayBuffer(storage=LazyMemmapStorage(capacity, scratch_dir=root / "storage"), sampler=sampler)
    rb.loads(root)
    return rb


def trl_build(root: Path, rows: Rows, capacity: int, sampler: Any) -> Any:
    """Fill a ``LazyMemmapStorage`` by extending with TensorDicts of ``CHUNK`` transitions; dump it in place."""
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyMemmapStorage, ReplayBuffer

    rb = ReplayBuffer(storage=LazyMemmapStorage(capacity, scratch_dir=root / "storage"), sampler=sampler)
    for s in rows.transitions():
        n = len(s["obs"])
        t = {k: torch.from_numpy(v) for k, v in s.items()}
        rb.extend(TensorDict({"observation": t["obs"], "action": t["action"],
                              "next": {"observation": t["next_obs"], "reward": t["reward"][:, None],
                                       "done": t["done"][:, None], "terminated": t["terminated"][:, None],
                                       "truncated": t["truncated"][:, None]}}, batch_size=[n]))
    rb.dumps(root)
    return rb


def trl_map(rb: Any) -> None:
    """Every page of the buffer's memmap files mapped in this process (its steady state, as
    ``store.map_pages()`` gives mmreplay's): its storage read through its own mapping, in slices."""
    n = len(rb.storage)
    for i in range(0, n, CHUNK):
        rb.storage[i:min(n, i + CHUNK)]


def trl_per(capacity: int) -> tuple[Any, str | None]:
    """TorchRL's ``PrioritizedSampler``, or None and why it cannot be made here."""
    from torchrl.data import PrioritizedSampler

    try:
        return PrioritizedSampler(capacity, alpha=0.6, beta=0.4), None
    except (ImportError, RuntimeError) as exc:  # its C++ sum tree is missing from some wheels
        return None, f"{type(exc).__name__}: {exc}"


def work_torchrl(cfg: Record) -> None:
    import torch
    from torchrl.data import RandomSampler, SliceSampler

    logging.getLogger("torchrl").setLevel(logging.WARNING)
    torch.set_num_threads(cfg["torch_threads"])
    base = Path(cfg["dir"])
    root = base / "torchrl"
    rows = Rows(cfg["size"])
    cap = rows.num_transitions()
    tags = {"store": "vector", "size": cfg["size"], "rows": rows.total, "system": "torchrl"}
    try:
        per, why = trl_per(cap)
        t0 = time.perf_counter()
        rb = trl_build(root, rows, cap, per if per is not None else RandomSampler())  # priorities set as it fills
        emit({**tags, "what": "build", "transitions": len(rb), "bytes": kit.dir_bytes(root),
              "build_s": time.perf_counter() - t0})
        del rb, per
        gc.collect()
        files = files_under(root)
        drop_files(files)
        t0 = time.perf_counter()
        rb = trl_open(root, cap, RandomSampler())
        emit({**tags, "what": "open", "open_ms": (time.perf_counter() - t0) * 1e3})
        del rb
        prios = torch.from_numpy(np.random.default_rng(5).exponential(1.0, B) + 1e-3)

        def per_op(rb: Any) -> None:
            _, info = rb.sample(B, return_info=True)
            rb.update_priority(info["index"], prios)

        kinds: dict[str, tuple[Callable[[], Any], Callable[[Any], object]]] = {
            "uniform": (RandomSampler, lambda rb: rb.sample(B)),
            "sequence": (lambda: SliceSampler(slice_len=SEQ, end_key=("next", "done"), cache_values=True),
                         lambda rb: rb.sample(B * SEQ))}
        if why is None:
            kinds["prioritized"] = (lambda: trl_per(cap)[0], per_op)
        else:
            emit({**tags, "what": "skip", "sampler": "prioritized", "reason": why})
        for name, (sampler, op) in kinds.items():
            gc.collect()  # the previous buffer's maps are gone: its pages can be dropped
            rec = measure(lambda s=sampler: trl_open(root, cap, s()), op, cold=lambda: drop_files(files),
                          warm=lambda rb: (read_files(files), trl_map(rb)), batches=cfg["batches"], settle_s=cfg["settle_s"])
            emit({**tags, "what": "sample", "sampler": name, **rec})
    finally:
        shutil.rmtree(root, ignore_errors=True)


# -- cpprb ----------------------------------------------------------------------------------------
CPPRB_FIELDS = {"obs": {"shape": OBS, "dtype": np.float32}, "act": {"shape": ACT, "dtype": np.float32},
                "rew": {"dtype": np.float64}, "done": {"dtype": np.bool_}}


def cpprb_fill(rb: Any, rows: Rows, next_of: bool) -> None:
    """Same transitions, cpprb's documented ways: big adds with ``done`` flags, or with
    ``next_of`` one add per episode followed by ``on_episode_end()``."""
    for s in rows.transitions():
        kw = {"obs": s["obs"], "next_obs": s["next_obs"], "act": s["action"], "rew": s["reward"], "done": s["done"]}
        if not next_of:
            for i in range(0, len(s["obs"]), 1 << 16):
                rb.add(**{k: v[i:i + (1 << 16)] for k, v in kw.items()})
            continue
        ends = np.flatnonzero(s["done"]) + 1
        for a, b in zip(np.r_[0, ends], np.r_[ends, len(s["obs"])]):
            if b > a:
                rb.add(**{k: v[a:b] for k, v in kw.items()})
                if s["done"][b - 1]:
                    rb.on_episode_end()


def cpprb_variant(n: int, prioritized: bool) -> str | None:
    """``"plain"`` (next_obs stored apart) when it fits in 70% of available RAM, else ``"next_of"``, else None."""
    tree = 16 * (1 << max(n - 1, 1).bit_length()) if prioritized else 0  # sum and min trees
    room = 0.7 * kit.mem_available()
    for variant, per_row in (("plain", 4 * (2 * OBS + ACT) + 9), ("next_of", 4 * (OBS + ACT) + 9)):
        if n * per_row + tree < room:
            return variant
    return None


def work_cpprb(cfg: Record) -> None:
    from cpprb import PrioritizedReplayBuffer, ReplayBuffer

    rows = Rows(cfg["size"])
    n = rows.num_transitions()
    tags = {"store": "vector", "size": cfg["size"], "rows": rows.total, "system": "cpprb"}
    rng = np.random.default_rng(5)
    prios = rng.exponential(1.0, B) + 1e-3

    def per_op(rb: Any) -> None:
        rb.update_priorities(rb.sample(B, beta=0.4)["indexes"], prios)

    for name, cls, op in (("uniform", ReplayBuffer, lambda rb: rb.sample(B)),
                          ("prioritized", PrioritizedReplayBuffer, per_op)):
        variant = cpprb_variant(n, cls is PrioritizedReplayBuffer)
        if variant is None:
            emit({**tags, "what": "skip", "sampler": name, "reason": "does not fit in 70% of available RAM"})
            continue
        env = CPPRB_FIELDS if variant == "next_of" else {**CPPRB_FIELDS, "next_obs": CPPRB_FIELDS["obs"]}
        kw = {"alpha": 0.6} if cls is PrioritizedReplayBuffer else {}
        t0 = time.perf_counter()
        rb = cls(n, env, next_of="obs" if variant == "next_of" else None, **kw)
        cpprb_fill(rb, rows, variant == "next_of")
        emit({**tags, "what": "build", "sampler": name, "variant": variant, "transitions": rb.get_stored_size(),
              "build_s": time.perf_counter() - t0})
        rec = measure(lambda b=rb: b, op, cold=lambda: None, warm=lambda rb: None, batches=cfg["batches"], settle_s=cfg["settle_s"])
        emit({**tags, "what": "sample", "sampler": name, "variant": variant, **rec})
        del rb
        gc.collect()


WORKERS: dict[str, Callable[[Record], None]] = {"mmreplay": work_mm, "torchrl": work_torchrl, "cpprb": work_cpprb}


def run_worker(kind: str, cfg: Record) -> list[Record]:
    """Run a worker in a fresh process; echo and collect the JSON lines it prints."""
    proc = subprocess.Popen([sys.executable, __file__, "--worker", kind, json.dumps(cfg)], stdout=subprocess.PIPE,
                            text=True)
    out: list[Record] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line, end="", flush=True)
        if line.startswith("{"):
            out.append(json.loads(line))
    if proc.wait() != 0:
        print(f"{kind} worker at {cfg['size']:,} rows failed (exit {proc.returncode}); going on", flush=True)
        emit(rec := {"store": cfg.get("store", "vector"), "size": cfg["size"], "system": kind, "what": "error",
                     "exit": proc.returncode})
        out.append(rec)
    return out


# -- the run --------------------------------------------------------------------------------------
TRL_BYTES = 4 * (2 * OBS + ACT) + 8 + 3  # a TorchRL transition: obs, next obs, action, reward, 3 flags
RESERVE = 2 << 30  # free disk left untouched


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1e6,1e7,1e8", help="rows of the vector stores")
    ap.add_argument("--big", action="store_true", help="also 3e8 rows (~42 GB), where the disk has room")
    ap.add_argument("--atari-rows", type=float, default=1e6, help="rows of the Atari store (~7 KB each); 0: none")
    ap.add_argument("--systems", default="mmreplay,torchrl,cpprb")
    ap.add_argument("--batches", type=int, default=200, help="timed batches per sampler (median reported)")
    ap.add_argument("--settle-s", type=float, default=SETTLE_S,
                    help="untimed batches for at least this long before the timed ones (a smoke run: 0)")
    ap.add_argument("--cache-gb", type=float, default=2.0, help="windowed mode's cache_bytes, at the largest size")
    ap.add_argument("--swap", type=float, default=4.0, help="windowed mode's swap_segments_per_s")
    ap.add_argument("--torch-threads", type=int, default=1,
                    help="TorchRL's intra-op threads (one sampling thread, as the others; with 2 on a busy 2-core "
                         "machine, 5-30%% of its batches took ~20 ms)")
    ap.add_argument("--dir", default="/var/tmp", help="where the stores are built (one at a time)")
    ap.add_argument("--plot", default=None, help="log-log plot of per-batch cost against rows (PNG)")
    ap.add_argument("--quick", action="store_true",
                    help="sizes 1e5,1e6, 20,000 Atari rows, 50 batches, a 0.05 GB windowed cache (~1 min)")
    ap.add_argument("--passes-only", action="store_true",
                    help="mmreplay: build, open and the whole-store passes only (no sampler); with PYTHONPATH at an "
                         "older checkout, that code's passes")
    ap.add_argument("--from", dest="from_logs", nargs="+", default=None, metavar="LOG",
                    help="no run: the report (and --plot) of earlier runs' output, a later record of a measurement "
                         "replacing an earlier one (e.g. a full run, then --systems mmreplay after a change)")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.sizes, args.atari_rows, args.batches, args.cache_gb = "1e5,1e6", 2e4, 50, 0.05
    return args


def jobs(args: argparse.Namespace, base: Path) -> Iterator[tuple[str, Record, int]]:
    """(worker, config, disk bytes it needs) for every size and system, Atari last."""
    sizes = sorted({int(float(x)) for x in args.sizes.split(",")} | ({300_000_000} if args.big else set()))
    systems = [s for s in ("mmreplay", "torchrl", "cpprb") if s in args.systems.split(",")]
    mm_need = {n: store_bytes_estimate(vector_schema(), n, base) + RESERVE for n in sizes}
    free = shutil.disk_usage(base).free
    largest = max([n for n in sizes if mm_need[n] < free] or sizes[:1])
    common = {"batches": args.batches, "settle_s": args.settle_s, "cache_gb": args.cache_gb, "swap": args.swap,
              "torch_threads": args.torch_threads, "passes_only": args.passes_only}
    for n in sizes:
        for system in systems:
            need = {"mmreplay": mm_need[n], "torchrl": Rows(n).num_transitions() * TRL_BYTES + RESERVE}.get(system, 0)
            yield system, {**common, "store": "vector", "size": n, "windowed": n == largest}, need
    if args.atari_rows and "mmreplay" in systems:
        n = int(args.atari_rows)
        probe = Path(tempfile.mkdtemp(prefix="probe-", dir=base)) / "s"
        st = mmreplay.create_store(probe, atari_schema(), capacity=10**9)  # as beyond_ram.build sizes its store
        row_bytes = st.layout.file_size / st.segment_records
        st.close()
        shutil.rmtree(probe.parent)
        yield "mmreplay", {**common, "store": "atari", "size": n, "row_bytes": row_bytes}, \
            store_bytes_estimate(atari_schema(), n, base) + RESERVE


def main() -> None:
    args = parse_args()
    if args.worker:
        WORKERS[args.worker[0]](json.loads(args.worker[1]))
        return
    mem = kit.meminfo()
    if args.from_logs:  # the report and plot of earlier runs' JSON lines; a later run's record of the same
        report(merged(args.from_logs), mem, 0.0)  # measurement replaces an earlier one
        if args.plot:
            plot(merged(args.from_logs), args.plot)
        return
    base = Path(tempfile.mkdtemp(prefix="scale-", dir=args.dir))
    print(f"RAM {mem['MemTotal'] / 1e9:.1f} GB ({mem['MemAvailable'] / 1e9:.1f} GB available), free disk "
          f"{shutil.disk_usage(base).free / 1e9:.1f} GB under {base}, {os.cpu_count()} CPUs; load average "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    records: list[Record] = []
    t_all = time.perf_counter()
    missing = {m for m in ("torchrl", "cpprb") if importlib.util.find_spec(m) is None}
    for m in sorted(missing & set(args.systems.split(","))):
        print(f"skipping {m}: not installed here (.venv/bin/pip install -e '.[bench]')", flush=True)
    try:
        for kind, cfg, need in jobs(args, base):
            free = shutil.disk_usage(base).free
            if kind in missing:
                continue
            if need > free:
                print(f"skipping {kind} at {cfg['size']:,} rows ({cfg['store']}): needs {need / 1e9:.1f} GB of free "
                      f"disk under {base}, {free / 1e9:.1f} GB free", flush=True)
                emit(rec := {"store": cfg["store"], "size": cfg["size"], "system": kind, "what": "skip",
                             "reason": "disk", "need_bytes": need, "free_bytes": free})
                records.append(rec)
                continue
            cfg["dir"] = str(base / f"{kind}-{cfg['store']}-{cfg['size']}")
            Path(cfg["dir"]).mkdir()
            t0 = time.perf_counter()
            records += run_worker(kind, cfg)
            shutil.rmtree(cfg["dir"], ignore_errors=True)
            print(f"[{kind} {cfg['store']} {cfg['size']:,} rows: {time.perf_counter() - t0:.0f} s]", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    report(records, mem, time.perf_counter() - t_all)
    if args.plot:
        plot(records, args.plot)


# -- report ---------------------------------------------------------------------------------------
def merged(logs: list[str]) -> list[Record]:
    """The JSON records of ``logs`` (this script's output), in order; of two records of the same
    measurement (store, size, system, what, sampler, pass), the later one."""
    out: dict[tuple, Record] = {}
    for log in logs:
        for line in Path(log).read_text().splitlines():
            if line.startswith("{"):
                r = json.loads(line)
                out[tuple(r.get(k) for k in ("store", "size", "system", "what", "sampler", "pass"))] = r
    return list(out.values())



def num(x: Any) -> str:
    """Three significant digits (thousands separated above 1,000); n/a for a missing value."""
    if x is None or not np.isfinite(x):
        return "n/a"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def index(records: list[Record]) -> dict[str, dict[tuple, Record]]:
    by: dict[str, dict[tuple, Record]] = {"build": {}, "open": {}, "sample": {}, "pass": {}}
    for r in records:
        if r["what"] == "build":  # cpprb builds one buffer per sampler
            by["build"][(r["store"], r["size"], r["system"], r.get("sampler"))] = r
        elif r["what"] == "open":
            by["open"][(r["store"], r["size"], r["system"])] = r
        elif r["what"] == "sample":
            by["sample"][(r["store"], r["size"], r["system"], r["sampler"])] = r
        elif r["what"] == "pass":
            by["pass"][(r["store"], r["size"], r["pass"])] = r
    return by


def report(records: list[Record], mem: dict[str, int], wall: float) -> None:
    by = index(records)
    print(f"\nScale: per-batch cost against rows (B={B}; sequences {B} x {SEQ} rows; prioritized = sample + update); "
          f"RAM {mem['MemTotal'] / 1e9:.1f} GB; total wall time {wall / 60:.1f} min\n")
    rows = []
    for (store, size, system, sampler), r in by["sample"].items():
        b = by["build"].get((store, size, system, sampler)) or by["build"].get((store, size, system, None), {})
        o = by["open"].get((store, size, system), {})
        rows.append((store, f"{r['rows']:,}", system + (f" ({r['variant']})" if "variant" in r else ""), sampler,
                     num(b.get("build_s")), num(o.get("open_ms")), num(r["setup_ms"]), num(r["first_ms"]),
                     num(r["warm_us"]), num(r["p90_us"])))
    print(kit.table(("store", "rows", "system", "sampler", "build s", "open ms (cold)", "setup ms",
                     "first batch ms (cold)", "per batch µs (warm, median)", "p90 µs"), rows))
    passes = [(store, f"{r['rows']:,}", name, f"{r['bytes'] / 1e9:.2f}", num(r["seconds"]), num(r["mb_per_s"]),
               num(r["seq_mb_per_s"]), f"{r['of_seq']:.2f}") for (store, size, name), r in by["pass"].items()]
    print("\nWhole-store passes, each from a cold page cache, after a cold sequential read of the same files:\n")
    print(kit.table(("store", "rows", "pass", "segment GB", "seconds", "MB/s", "sequential read MB/s",
                     "fraction of sequential"), passes))
    skips = [r for r in records if r["what"] in ("skip", "error")]
    for r in skips:
        why = r.get("reason") or f"worker exit {r.get('exit')}"
        print(f"not measured: {r['system']} {r.get('sampler', r.get('pass', ''))} at {r['size']:,} rows "
              f"({r['store']}): {why}")
    growth(by)
    verdicts(by, mem)


def growth(by: dict[str, dict[tuple, Record]]) -> None:
    """Per-batch cost by size, one row per system and sampler (vector stores)."""
    sizes = sorted({k[1] for k in by["sample"] if k[0] == "vector"})
    series = sorted({(k[2], k[3]) for k in by["sample"] if k[0] == "vector"})
    if not sizes:
        return
    rows = []
    for system, sampler in series:
        cost = [by["sample"].get(("vector", n, system, sampler), {}).get("warm_us") for n in sizes]
        have = [c for c in cost if c is not None]
        rows.append((system, sampler, *(num(c) for c in cost),
                     kit.ratio(have[-1], have[0]) if len(have) > 1 else "n/a"))
    print("\nPer-batch cost (µs, warm median) by rows:\n")
    print(kit.table(("system", "sampler", *(f"{n:,}" for n in sizes), "largest / smallest"), rows))


def verdicts(by: dict[str, dict[tuple, Record]], mem: dict[str, int]) -> None:
    def met(ok: bool) -> str:
        return "yes" if ok else "NO"

    mm = {k: r for k, r in by["sample"].items() if k[0] == "vector" and k[2] == "mmreplay"}
    sizes = sorted({k[1] for k in mm})
    out = []
    if len(sizes) > 1:
        hi = sizes[-1]
        lo = 1_000_000 if 1_000_000 in sizes[:-1] else sizes[0]
        beyond = by["build"].get(("vector", hi, "mmreplay", None), {}).get("bytes", 0) > 0.8 * mem["MemTotal"]
        for sampler in ("uniform", "sequence", "prioritized"):
            win = f"{sampler} windowed"
            top = win if beyond and ("vector", hi, "mmreplay", win) in mm else sampler
            a, b = mm.get(("vector", lo, "mmreplay", sampler)), mm.get(("vector", hi, "mmreplay", top))
            if a and b:
                r = b["warm_us"] / a["warm_us"]
                out.append((f"mmreplay {sampler}: per batch at {hi:,} rows{' (windowed)' if top != sampler else ''} / "
                            f"at {lo:,} rows (<= 2x)", f"{r:.2f}x", met(r <= 2)))
    behind, ratios = [], []
    for (store, size, system, sampler), r in by["sample"].items():
        m = by["sample"].get((store, size, "mmreplay", sampler))
        if system != "mmreplay" and m is not None:
            ratios.append(q := m["warm_us"] / r["warm_us"])
            if q >= 1:
                behind.append(f"{sampler} vs {system} at {size:,} rows: {q:.2f}x")
    if ratios:
        out.append(("mmreplay per-batch cost / the peer's, same size and sampler (< 1x for every pair)",
                    f"worst {max(ratios):.2f}x of {len(ratios)} pairs", met(not behind)))
    # the passes' targets are for big stores: below ~100 MB a pass takes tens of milliseconds, fixed costs
    # (threads, the compiled kernels' load) weigh, and the rate says little
    big = {k: r for k, r in by["pass"].items() if r["bytes"] >= PASS_TARGET_BYTES}
    for name in ("field_stats", "verify"):
        fr = [r["of_seq"] for k, r in big.items() if k[2] == name]
        if fr:
            out.append((f"{name}: fraction of the sequential read rate, stores >= 100 MB (>= 0.50)",
                        f"min {min(fr):.2f}", met(min(fr) >= 0.5)))
    ex = [r["mb_per_s"] for k, r in big.items() if k[2] == "export"]
    if ex:
        out.append(("export: MB/s of segment-file bytes, stores >= 100 MB (>= 300)", f"min {min(ex):,.0f}",
                    met(min(ex) >= 300)))
    print("\nTargets:\n")
    print(kit.table(("target", "measured", "met"), out))
    for line in behind:
        print(f"mmreplay behind: {line}")


def plot(records: list[Record], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for (store, _, system, sampler), r in index(records)["sample"].items():
        if store == "vector":
            series.setdefault((system, sampler), []).append((r["rows"], r["warm_us"]))
    fig, ax = plt.subplots(figsize=(10, 5))
    colours = {name: f"C{i}" for i, name in enumerate(sorted({k[1] for k in series}))}
    styles = {"mmreplay": ("-", "o"), "torchrl": ("--", "s"), "cpprb": (":", "^")}
    for (system, sampler), pts in sorted(series.items()):
        x, y = zip(*sorted(pts))
        line, marker = styles.get(system, ("-.", "x"))
        ax.plot(x, y, color=colours[sampler], linestyle=line, marker=marker, label=f"{system} {sampler}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("rows in the store")
    ax.set_ylabel(f"per-batch cost, µs (warm median, B={B})")
    ax.set_title("Per-batch cost against store size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"\nplot: {path}")


if __name__ == "__main__":
    main()
