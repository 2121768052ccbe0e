"""Beyond RAM: sampling Atari frame stacks from a store larger than RAM, in one run.

    .venv/bin/python benchmarks/beyond_ram.py                       # 40 GB + 8 GB stores; ~10 min
    .venv/bin/python benchmarks/beyond_ram.py --size-gb 2 --cache-gb 0.25 --seconds 1 --bias-seconds 3  # smoke

What it measures (every sampling figure in a fresh subprocess, so its peak RSS is its own):

* **store** ``--size-gb`` (default 40, ~1.6x this machine's 25 GB of RAM) of Atari rows (84x84
  uint8 frames, one lane, episodes of 50-500 steps), built with ``add_batch`` calls of 8,192 rows
  under ``--dir`` (a ``beyondram-*`` directory, deleted at the end; free disk is checked first),
  and a **small store** (``--small-gb``, default ``--cache-gb``: fits in RAM) built the same way;
* **disk limit**: random reads of one transition's footprint (the ``frame_stack + 1`` records a
  one-step view of stacks of 4 reads, ~35 KB) at record-aligned offsets of the big store's
  segment files, by a pool of compiled, GIL-free ``pread`` threads at queue depth 1, 32 and 64,
  this store's pages dropped from the page cache first;
* **in RAM**: ``UniformSampler(frame_stack=4)`` on the small store with its pages cached;
* **exact** on the big store: ``UniformSampler(frame_stack=4, prefetch_batches=P,
  cache_bytes=1 GiB)``, and the same without prefetch, each loop starting from a cold page
  cache. Pages are dropped per file (``posix_fadvise(DONTNEED)`` after unmapping them), not with
  ``/proc/sys/vm/drop_caches``: that is writable here (root) but would empty the page cache of
  everything else running on the machine;
* **windowed** on the big store: ``mode="windowed", cache_bytes=--cache-gb,
  swap_segments_per_s=--swap`` (the resident set is filled first, from a cold page cache, and
  that time is reported), with swaps running during the timed loops; and in-RAM against
  windowed in **alternating 1 s loops in one process**, so both see the same load from other
  work on the machine;
* **bias** of windowed mode on small vector stores: per-row sampling frequency over a long run
  against uniform (static store), and the age of sampled rows while a writer appends into a full
  (FIFO) store, windowed against exact on the same store.

Batches/s are for B=32 and B=256, numpy arrays out, one sampling thread (plus the tiers'
background threads): medians of ``--repeats`` loops, with the median batch time and the batches
per CPU-second of the whole process (every thread), which other work on a shared machine
disturbs less. Targets: windowed within 1.5x of the in-RAM rate; exact >= 0.8x the disk's
random-read limit (transitions/s against reads/s, best of depth 32 and 64).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kit  # noqa: E402

import mmreplay  # noqa: E402
from mmreplay.storage.info import tier_summary  # noqa: E402

H = W = 84
STACK = 4
POOL = 1000
BATCHES = (32, 256)
GB = 1e9
RAM, EXACT, WINDOWED = "in RAM (small store, cached)", "exact + prefetch (big, cold)", "windowed (big)"


# -- data ----------------------------------------------------------------------------------------
def make_pool() -> np.ndarray:
    return kit.make_pool(np.random.default_rng(0))


def build(path: Path, size_bytes: float, chunk: int = 8192) -> dict:
    """An Atari store of about ``size_bytes`` on disk, written with ``add_batch`` of ``chunk`` rows.
    Row ``r`` holds pool frame ``r % POOL``; an episode of T steps is T+1 rows."""
    schema = mmreplay.Schema.transition(obs_shape=(H, W), obs_dtype=np.uint8)
    probe = mmreplay.create_store(path, schema, capacity=10**9)
    rows = int(size_bytes // (probe.layout.file_size / probe.segment_records))
    seg_rows = probe.segment_records
    probe.close()
    shutil.rmtree(path)
    store = mmreplay.create_store(path, schema, capacity=rows + 4 * seg_rows)
    rng = np.random.default_rng(1)
    lengths = rng.integers(50, 501, rows // 50 + 2)
    ends = np.cumsum(lengths + 1)  # exclusive end row of each episode (T actions + final obs)
    ends = ends[: np.searchsorted(ends, rows) + 1]
    term = np.zeros(rows, np.bool_)
    last = ends - 1  # final observation rows
    term[last[last - 1 < rows] - 1] = True
    final = np.zeros(rows, np.bool_)
    final[last[last < rows]] = True
    pool = make_pool()
    buf = np.empty((chunk, H, W), np.uint8)
    t0 = time.perf_counter()
    with store.writer(lanes=1) as w:
        for r0 in range(0, rows, chunk):
            n = min(chunk, rows - r0)
            np.take(pool, np.arange(r0, r0 + n) % POOL, axis=0, out=buf[:n])
            action = rng.integers(0, 18, (n, 1)).astype(np.int64)
            reward = rng.choice(np.array([-1.0, 0.0, 0.0, 1.0], np.float32), (n, 1))
            action[final[r0 : r0 + n]] = 0
            reward[final[r0 : r0 + n]] = 0
            w.add_batch(obs=buf[:n, None], action=action, reward=reward, terminated=term[r0 : r0 + n, None],
                        truncated=np.zeros((n, 1), np.bool_))
    secs = time.perf_counter() - t0
    on_disk = sum(f.stat().st_size for f in (path / "segments").iterdir())
    store.close()
    return {"rows": rows, "bytes": on_disk, "seconds": secs, "segment_bytes": store.layout.file_size}


def drop_cache(store: mmreplay.ReplayStore) -> None:
    """Evict the store's pages from the page cache without root: unmap them from this process,
    then ``POSIX_FADV_DONTNEED`` every segment file."""
    store.reader.unmap_pages()
    kit.drop_pages(store.path)


def warm_cache(store: mmreplay.ReplayStore) -> None:
    kit.warm_pages(store.path)


def sanity(b: mmreplay.TransitionBatch, pool: np.ndarray) -> int:
    """Wrong stacks in a batch: frames must be intact pool frames, consecutive (repeats only at an
    episode start), and next_obs the stack shifted by one frame."""
    def ids(s: np.ndarray) -> np.ndarray:
        return s[:, :, 0, 0].astype(np.int64) + 256 * s[:, :, 0, 1].astype(np.int64)

    o, n = ids(b.obs), ids(b.next_obs)
    ok = (o < POOL).all(1) & (n < POOL).all(1)
    ok &= (b.obs == pool[np.minimum(o, POOL - 1)]).all(axis=(1, 2, 3))
    d = (o[:, 1:] - o[:, :-1]) % POOL
    ok &= ((d == 0) | (d == 1)).all(1) & (np.diff(d, axis=1) >= 0).all(1)
    ok &= (n[:, :-1] == o[:, 1:]).all(1) & ((n[:, -1] - o[:, -1]) % POOL == 1)
    return int((~ok).sum())


mem_status, meminfo = kit.mem_status, kit.meminfo


# -- workers (each in its own process) -----------------------------------------------------------
def work_sample(cfg: dict) -> dict:
    """Timed loops of one sampler configuration: ``repeats`` x (B=32, B=256), medians reported."""
    store = mmreplay.open_store(cfg["store"])
    pool = make_pool()
    res: dict = {"rates": {}, "p50_ms": {}, "all_rates": {}}
    if cfg.get("warm"):
        warm_cache(store)
    if cfg.get("cold"):
        drop_cache(store)
    samplers: dict[int, mmreplay.UniformSampler] = {}
    for b in BATCHES:  # one sampler for both sizes unless a setting differs by batch size
        kw = {**cfg["sampler"], **cfg.get("by_batch", {}).get(str(b), {})}
        same = next((s for bb, s in samplers.items() if {**cfg["sampler"], **cfg.get("by_batch", {})
                                                             .get(str(bb), {})} == kw), None)
        if same is not None:
            samplers[b] = same
            continue
        t0 = time.perf_counter()
        samplers[b] = s = mmreplay.UniformSampler(store, frame_stack=STACK, seed=b, **kw)
        if kw.get("mode") == "windowed":
            s.load_resident()
            res["fill_s"] = time.perf_counter() - t0
            res["fill_gb_per_s"] = s.tier_stats()["resident_bytes"] / res["fill_s"] / GB
    bad = 0
    lat: dict[int, list[float]] = {b: [] for b in BATCHES}
    swaps0 = {b: samplers[b].tier_stats().get("swaps", 0) for b in BATCHES}
    for _ in range(cfg["repeats"]):
        for b in BATCHES:
            s = samplers[b]
            if cfg.get("cold"):
                drop_cache(store)
            bad += sanity(s.sample(b), pool)  # warm-up (the first batch from a cold cache)
            n = 0
            c0 = time.process_time()  # every thread of this process (background loads included)
            t0 = time.perf_counter()
            while True:
                a = time.perf_counter()
                s.sample(b)
                lat[b].append(time.perf_counter() - a)
                n += 1
                dt = time.perf_counter() - t0
                if dt >= cfg["seconds"]:
                    break
            res["all_rates"].setdefault(b, []).append(n / dt)
            res.setdefault("cpu_rates", {}).setdefault(b, []).append(n / max(time.process_time() - c0, 1e-9))
    for b in BATCHES:
        res["rates"][b] = float(np.median(res["all_rates"][b]))
        res["cpu_rate"] = {bb: float(np.median(v)) for bb, v in res["cpu_rates"].items()}
        res["p50_ms"][b] = float(np.median(lat[b]) * 1e3)
    if "swaps" in samplers[BATCHES[0]].tier_stats():
        res["swaps"] = samplers[BATCHES[0]].tier_stats()["swaps"] - swaps0[BATCHES[0]]
    for b in BATCHES:
        bad += sanity(samplers[b].sample(256), pool)
    res["bad_stacks"] = bad
    res["tier_stats"] = samplers[BATCHES[-1]].tier_stats()
    for s in set(samplers.values()):
        s.close()
    res["mem"] = mem_status()
    res["store_cached_gb"] = tier_summary(store.reader, store.layout)["warm"]["page_cache_bytes"] / GB  # (info() reads every row)
    store.close()
    return res


def work_pair(cfg: dict) -> dict:
    """In-RAM and windowed sampling timed in alternation in one process (1 s loops), so both see
    the same load from other processes on the machine: per-pair rate ratios, median reported."""
    small = mmreplay.open_store(cfg["small"])
    big = mmreplay.open_store(cfg["big"])
    warm_cache(small)
    drop_cache(big)
    ram = mmreplay.UniformSampler(small, frame_stack=STACK, seed=1)
    win = mmreplay.UniformSampler(big, frame_stack=STACK, seed=2, mode="windowed", cache_bytes=cfg["cache_bytes"],
                                  swap_segments_per_s=cfg["swap"])
    win.load_resident()
    for m in small.reader.segments.values():  # map every page of the small store before timing
        small.reader.region.advise(m.window, small.layout.file_size, 22)  # MADV_POPULATE_READ

    def rate(s: mmreplay.UniformSampler, b: int) -> float:
        s.sample(b)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < cfg["seconds"]:
            s.sample(b)
            n += 1
        return n / (time.perf_counter() - t0)

    out: dict = {}
    for b in BATCHES:
        pairs = [(rate(ram, b), rate(win, b)) for _ in range(cfg["pairs"])]
        out[b] = {"ram": [p[0] for p in pairs], "windowed": [p[1] for p in pairs],
                  "ratio_median": float(np.median([r / w for r, w in pairs]))}
    out["swaps"] = win.tier_stats()["swaps"]
    win.close()
    small.close()
    big.close()
    return out


def work_disk(cfg: dict) -> dict:
    """Random reads of one transition's footprint at depth 1 and 32 (compiled preads, no GIL)."""
    from mmreplay.sampling.uniform import _kernels

    pread_at = _kernels().pread_at

    store = mmreplay.open_store(cfg["store"])
    lay = store.layout
    span = (STACK + 1) * lay.record_bytes
    files = sorted((store.path / "segments").iterdir())
    fds = np.array([os.open(f, os.O_RDONLY) for f in files], np.int64)
    rows = store.reader.snapshot.committed.min()
    store.close()
    rng = np.random.default_rng(2)
    out = {"span_bytes": span}
    for depth, n in ((1, cfg["reads1"]), (32, cfg["reads32"]), (64, cfg["reads32"])):
        for fd in fds.tolist():
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        which = rng.integers(0, len(fds), n)
        offs = (lay.records_offset + rng.integers(0, rows - STACK - 1, n) * lay.record_bytes).astype(np.int64)
        bufs = [np.empty(span, np.uint8) for _ in range(depth)]
        pread_at(fds[:1], offs[:1], span, bufs[0].ctypes.data)  # compile outside the timing
        parts = np.array_split(np.arange(n), depth)
        ts = [threading.Thread(target=pread_at, args=(fds[which[p]], offs[p], span, bufs[i].ctypes.data))
              for i, p in enumerate(parts)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        dt = time.perf_counter() - t0
        out[depth] = {"reads_per_s": n / dt, "gb_per_s": n * span / dt / GB}
    for fd in fds.tolist():
        os.close(fd)
    return out


def work_bias(cfg: dict) -> dict:
    """Windowed mode's bias on small vector stores (see the module docstring)."""
    base = Path(cfg["dir"])
    schema = mmreplay.Schema.transition(obs_shape=(4,), obs_dtype=np.float32)
    R = 1024

    def rows(w, t0: int, n: int) -> None:
        t = np.arange(t0, t0 + n)
        obs = np.zeros((n, 1, 4), np.float32)
        obs[:, 0, 0] = t
        w.add_batch(obs=obs, action=np.zeros((n, 1), np.int64), reward=np.zeros((n, 1), np.float32),
                    terminated=(t % 200 == 199)[:, None], truncated=np.zeros((n, 1), bool))

    out: dict = {}
    # (a) static store: per-row frequency over a long run
    nseg, cache_seg, secs = cfg["static_segments"], cfg["static_cache_segments"], cfg["static_seconds"]
    st = mmreplay.create_store(base / "static", schema, segment_records=R)
    with st.writer(lanes=1) as w:
        rows(w, 0, nseg * R)
    st.refresh()
    valid = st.transition_ids()
    win = mmreplay.UniformSampler(st, seed=1, mode="windowed", cache_bytes=cache_seg * st.layout.file_size,
                                  swap_segments_per_s=cfg["static_swap"])
    exact = mmreplay.UniformSampler(st, seed=2)
    drawn: list[np.ndarray] = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < secs:
        drawn.append(win.sample(256).ids)
    wids = np.concatenate(drawn)
    eids = np.concatenate([exact.sample(256).ids for _ in range(len(drawn))])
    swaps = win.tier_stats()["swaps"]
    win.close()
    exp = len(wids) / len(valid)

    def ratios(ids: np.ndarray) -> dict:
        c = np.bincount(np.searchsorted(valid, ids), minlength=len(valid)) / exp
        seg = np.bincount(valid // R - valid[0] // R, weights=c)
        seg /= np.bincount(valid // R - valid[0] // R)
        q = np.percentile(c, [1, 50, 99])
        return {"row_std": float(c.std()), "row_p1": float(q[0]), "row_p50": float(q[1]), "row_p99": float(q[2]),
                "row_min": float(c.min()), "row_max": float(c.max()), "never": int((c == 0).sum()),
                "seg_std": float(seg.std()), "seg_min": float(seg.min()), "seg_max": float(seg.max())}

    out["static"] = {"segments": nseg, "cache_segments": cache_seg, "rows": len(valid), "draws": len(wids),
                     "draws_per_row": exp, "swaps": swaps, "seconds": secs, "windowed": ratios(wids),
                     "exact": ratios(eids)}
    st.close()
    # (b) online: a writer appends into a full FIFO store while both samplers draw
    cap_seg, cache_seg = cfg["online_segments"], cfg["online_cache_segments"]
    on = mmreplay.create_store(base / "online", schema, segment_records=R, capacity=cap_seg * R)
    w = on.writer(lanes=1)
    rows(w, 0, (cap_seg + 2) * R)
    t = (cap_seg + 2) * R
    win = mmreplay.UniformSampler(on, seed=3, mode="windowed", cache_bytes=cache_seg * on.layout.file_size,
                                  swap_segments_per_s=cfg["online_swap"])
    exact = mmreplay.UniformSampler(on, seed=4)
    ages = {"windowed": [], "exact": []}
    per_step = cfg["online_rows_per_batch"]
    steps = cfg["online_steps"]
    t0 = time.perf_counter()
    for _ in range(steps):
        rows(w, t, per_step)
        t += per_step
        for name, s in (("windowed", win), ("exact", exact)):
            b = s.sample(256)
            ages[name].append(t - 1 - b.obs[:, 0].astype(np.int64))
    wall = time.perf_counter() - t0
    held = on.num_rows
    res = {"capacity_rows": cap_seg * R, "rows_held": held, "cache_segments": cache_seg, "steps": steps,
           "rows_per_batch": per_step, "seconds": wall, "swaps": win.tier_stats()["swaps"]}
    for name, a in ages.items():
        a = np.concatenate(a) / held
        res[name] = {"deciles": [float(x) for x in np.percentile(a, np.arange(10, 100, 10))],
                     "mean": float(a.mean()), "newest_segment": float((a * held < R).mean()),
                     "newest_10pct": float((a < 0.1).mean()), "oldest_10pct": float((a > 0.9).mean())}
    out["online"] = res
    win.close()
    w.close()
    on.close()
    return out


WORKERS = {"sample": work_sample, "disk": work_disk, "bias": work_bias, "pair": work_pair}


def run_worker(kind: str, cfg: dict) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--worker", kind, json.dumps(cfg)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} worker failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- main ----------------------------------------------------------------------------------------
def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gb", type=float, default=40.0, help="big store (larger than RAM)")
    ap.add_argument("--small-gb", type=float, default=None,
                    help="small store (fits in RAM); default --cache-gb: the in-RAM baseline samples from as much "
                         "RAM as windowed mode")
    ap.add_argument("--cache-gb", type=float, default=8.0, help="windowed mode's cache_bytes")
    ap.add_argument("--swap", type=float, default=4.0, help="windowed mode's swap_segments_per_s")
    ap.add_argument("--prefetch", default="4,2", help="exact mode's prefetch_batches for B=32,256")
    ap.add_argument("--seconds", type=float, default=5.0, help="length of each timed loop")
    ap.add_argument("--repeats", type=int, default=3, help="timed loops per batch size (median reported)")
    ap.add_argument("--pairs", type=int, default=8, help="alternating in-RAM / windowed 1 s loop pairs")
    ap.add_argument("--bias-seconds", type=float, default=20.0, help="length of the static bias run")
    ap.add_argument("--bias-steps", type=int, default=20000, help="batches of the online bias run")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--keep", action="store_true", help="keep the stores (for reruns: --reuse DIR)")
    ap.add_argument("--reuse", default=None, help="a beyondram-* directory kept by --keep")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.small_gb is None:
        args.small_gb = args.cache_gb
    return args


def build_stores(args: argparse.Namespace, base: Path, mem: dict) -> dict:
    """The big and the small store under ``base`` (reused when ``--reuse`` holds them)."""
    info: dict = {}
    for name, gb in (("big", args.size_gb), ("small", args.small_gb)):
        if args.reuse and (base / name).exists():
            st = mmreplay.open_store(base / name)
            info[name] = {"rows": st.num_rows, "bytes": kit.dir_bytes(st.path / "segments"), "seconds": 0.0}
            st.close()
            continue
        info[name] = build(base / name, gb * GB)
        i = info[name]
        print(f"built {name}: {i['rows']:,} rows, {i['bytes'] / GB:.1f} GB in {i['seconds']:.0f} s "
              f"({i['bytes'] / GB / i['seconds']:.2f} GB/s)", flush=True)
    print(f"big store {info['big']['bytes'] / GB:.1f} GB = {info['big']['bytes'] / mem['MemTotal']:.2f}x RAM; "
          f"small {info['small']['bytes'] / GB:.1f} GB", flush=True)
    return info


def main() -> None:
    args = parse_args()
    if args.worker:
        print(json.dumps(WORKERS[args.worker[0]](json.loads(args.worker[1]))))
        return
    mem = meminfo()
    base = Path(args.reuse) if args.reuse else Path(tempfile.mkdtemp(prefix="beyondram-", dir=args.dir))
    need = (args.size_gb + args.small_gb + 2) * GB
    free = shutil.disk_usage(base).free
    print(f"RAM {mem['MemTotal'] / GB:.1f} GB ({mem['MemAvailable'] / GB:.1f} GB available); free disk "
          f"{free / GB:.1f} GB under {base}; kernel {os.uname().release}", flush=True)
    if not args.reuse and free < need:
        shutil.rmtree(base)
        sys.exit(f"not enough free disk: {free / GB:.1f} GB, need {need / GB:.1f} GB (use --size-gb)")
    try:
        # never written: it would empty every process's page cache (others benchmark on this machine)
        drop_ok = os.access("/proc/sys/vm/drop_caches", os.W_OK)
        print(f"/proc/sys/vm/drop_caches writable: {drop_ok} (not used); cold runs drop only this store's pages "
              "(posix_fadvise DONTNEED per segment file)", flush=True)
        t_all = time.perf_counter()
        info = build_stores(args, base, mem)
        big, small = str(base / "big"), str(base / "small")
        pf = [int(x) for x in args.prefetch.split(",")]
        results: dict = {}

        def sample(label: str, store: str, sampler: dict, **kw: object) -> None:
            t0 = time.perf_counter()
            results[label] = r = run_worker("sample", {"store": store, "sampler": sampler, "seconds": args.seconds,
                                                       "repeats": args.repeats, **kw})
            r["loadavg"] = os.getloadavg()[0]  # other work on the machine over the last minute
            extra = f", filled {r['fill_s']:.1f} s ({r['fill_gb_per_s']:.2f} GB/s)" if "fill_s" in r else ""
            print(f"{label}: " + ", ".join(f"B={b} {v:,.0f}/s (p50 {r['p50_ms'][b]:.2f} ms)"
                                           for b, v in r["rates"].items())
                  + f"; peak RSS {r['mem']['VmHWM'] / GB:.2f} GB; wrong stacks {r['bad_stacks']}{extra} "
                  f"[{time.perf_counter() - t0:.0f} s, load average {r['loadavg']:.1f}]", flush=True)

        disk = run_worker("disk", {"store": big, "reads1": 3000, "reads32": 60000})
        print(f"disk random reads of {disk['span_bytes']:,} B: depth 1 {disk['1']['reads_per_s']:,.0f}/s, "
              f"depth 32 {disk['32']['reads_per_s']:,.0f}/s ({disk['32']['gb_per_s']:.2f} GB/s), "
              f"depth 64 {disk['64']['reads_per_s']:,.0f}/s", flush=True)
        sample(RAM, small, {}, warm=True)
        sample(EXACT, big, {"cache_bytes": 1 << 30},
               by_batch={"32": {"prefetch_batches": pf[0]}, "256": {"prefetch_batches": pf[1]}}, cold=True)
        sample("exact, no prefetch (big, cold)", big, {"cache_bytes": 1 << 30}, cold=True)
        sample(WINDOWED, big, {"mode": "windowed", "cache_bytes": int(args.cache_gb * GB),
                               "swap_segments_per_s": args.swap}, cold=True)
        pair = run_worker("pair", {"small": small, "big": big, "cache_bytes": int(args.cache_gb * GB),
                                   "swap": args.swap, "seconds": 1.0, "pairs": args.pairs})
        print("in RAM vs windowed, alternating 1 s loops: " + ", ".join(
            f"B={b} median ratio {pair[b]['ratio_median']:.2f}x" for b in ("32", "256")), flush=True)
        sim = base / "sim"
        sim.mkdir(exist_ok=True)
        bias = run_worker("bias", {"dir": str(sim), "static_segments": 200, "static_cache_segments": 20,
                                   "static_seconds": args.bias_seconds, "static_swap": 500.0, "online_segments": 100,
                                   "online_cache_segments": 10, "online_swap": 100.0, "online_rows_per_batch": 16,
                                   "online_steps": args.bias_steps})
        report(args, info, mem, disk, results, bias, pair, pf, time.perf_counter() - t_all)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


def report(args, info, mem, disk, results, bias, pair, pf, wall) -> None:  # noqa: ANN001
    print()
    print(f"Beyond RAM: Atari rows (84x84 uint8), frame stacks of {STACK}, numpy batches; big store "
          f"{info['big']['bytes'] / GB:.1f} GB ({info['big']['rows']:,} rows, {info['big']['bytes'] / mem['MemTotal']:.2f}x "
          f"RAM of {mem['MemTotal'] / GB:.1f} GB), small store {info['small']['bytes'] / GB:.1f} GB; "
          f"medians of {args.repeats} x {args.seconds:g} s loops; total wall time {wall / 60:.1f} min")
    print()
    print("| run | batches/s B=32 | transitions/s B=32 | batches/s B=256 | transitions/s B=256 | learner peak RSS |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, r in results.items():
        a, b = r["rates"]["32"], r["rates"]["256"]
        print(f"| {label} | {a:,.0f} | {32 * a:,.0f} | {b:,.0f} | {256 * b:,.0f} | {r['mem']['VmHWM'] / GB:.2f} GB |")
    limit = max(disk["32"]["reads_per_s"], disk["64"]["reads_per_s"])
    print(f"| disk limit: pread pool, {disk['span_bytes'] / 1024:.1f} KB random reads | depth 1: "
          f"{disk['1']['reads_per_s']:,.0f}/s | depth 32: {disk['32']['reads_per_s']:,.0f}/s "
          f"({disk['32']['gb_per_s']:.2f} GB/s) | | depth 64: {disk['64']['reads_per_s']:,.0f}/s | |")
    ram, win, ex = results[RAM]["rates"], results[WINDOWED]["rates"], results[EXACT]["rates"]
    print()
    print("| target | B=32 | B=256 | met |")
    print("|---|---:|---:|---|")
    r32, r256 = ram["32"] / win["32"], ram["256"] / win["256"]
    print(f"| in-RAM rate / windowed rate, separate runs above (<= 1.5x) | {r32:.2f}x | {r256:.2f}x | "
          f"{'yes' if max(r32, r256) <= 1.5 else 'NO'} |")
    p32, p256 = pair["32"]["ratio_median"], pair["256"]["ratio_median"]
    print(f"| in-RAM rate / windowed rate, alternating 1 s loops in one process, median of {args.pairs} (<= 1.5x) "
          f"| {p32:.2f}x | {p256:.2f}x | {'yes' if max(p32, p256) <= 1.5 else 'NO'} |")
    c_ram, c_win = results[RAM]["cpu_rate"], results[WINDOWED]["cpu_rate"]
    print(f"| in-RAM / windowed, batches per CPU-second of the process (all its threads) | "
          f"{c_ram['32'] / c_win['32']:.2f}x | {c_ram['256'] / c_win['256']:.2f}x | (reference) |")
    e32, e256 = 32 * ex["32"] / limit, 256 * ex["256"] / limit
    print(f"| exact transitions/s / disk random reads/s, best of depth 32 and 64 (>= 0.8x; prefetch_batches "
          f"{pf[0]} / {pf[1]}) | {e32:.2f}x | {e256:.2f}x | {'yes' if min(e32, e256) >= 0.8 else 'NO'} |")
    print()
    print("| run | median batch B=32 | median batch B=256 | batches per CPU-s B=32 | B=256 | load average (1 min) |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, r in results.items():
        c = r["cpu_rate"]
        print(f"| {label} | {r['p50_ms']['32']:.2f} ms | {r['p50_ms']['256']:.2f} ms | {c['32']:,.0f} | {c['256']:,.0f} "
              f"| {r['loadavg']:.1f} |")
    print("\nalternating pairs (batches/s, in RAM / windowed): " + "; ".join(
        f"B={b} " + " ".join(f"{x:,.0f}/{y:,.0f}" for x, y in zip(pair[b]["ram"], pair[b]["windowed"]))
        for b in ("32", "256")))
    print("\nrepeats (batches/s): " + "; ".join(f"{label}: " + ", ".join(
        f"B={b} " + "/".join(f"{x:,.0f}" for x in v) for b, v in r["all_rates"].items()) for label, r in results.items()))
    w = results[WINDOWED]
    print(f"\nwindowed: cache {args.cache_gb:g} GB, filled in {w['fill_s']:.1f} s ({w['fill_gb_per_s']:.2f} GB/s), "
          f"{w.get('swaps')} swaps during its timed loops; tier stats {json.dumps(w['tier_stats'])}")
    for label, r in results.items():
        m = r["mem"]
        print(f"memory {label}: VmHWM {m['VmHWM'] / GB:.2f} GB, at the end RssAnon {m['RssAnon'] / GB:.2f} GB, "
              f"RssFile {m['RssFile'] / GB:.2f} GB; store pages in the page cache at the end "
              f"{r['store_cached_gb']:.1f} GB")
    s, o = bias["static"], bias["online"]
    print(f"\nbias, static store ({s['rows']:,} rows in {s['segments']} segments, {s['cache_segments']} resident, "
          f"{s['swaps']:,} swaps, {s['draws']:,} draws = {s['draws_per_row']:.0f} per row over {s['seconds']:g} s): "
          "per-row draws / uniform expectation")
    print("| sampler | std | p1 | median | p99 | min | max | rows never drawn | per-segment std | segment min..max |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name in ("exact", "windowed"):
        x = s[name]
        print(f"| {name} | {x['row_std']:.3f} | {x['row_p1']:.2f} | {x['row_p50']:.2f} | {x['row_p99']:.2f} | "
              f"{x['row_min']:.2f} | {x['row_max']:.2f} | {x['never']} | {x['seg_std']:.3f} | "
              f"{x['seg_min']:.2f}..{x['seg_max']:.2f} |")
    print(f"\nbias, online (capacity {o['capacity_rows']:,} rows, FIFO full, {o['rows_per_batch']} rows written per "
          f"batch of 256, {o['steps']:,} batches, {o['cache_segments']} of ~{o['capacity_rows'] // 1024} segments "
          f"resident, {o['swaps']:,} swaps): age of sampled rows as a fraction of the rows held (0 newest, 1 oldest)")
    print("| sampler | mean | deciles 10..90% | from the newest segment | newest 10% | oldest 10% |")
    print("|---|---:|---|---:|---:|---:|")
    for name in ("exact", "windowed"):
        x = o[name]
        print(f"| {name} | {x['mean']:.3f} | {' '.join(f'{d:.2f}' for d in x['deciles'])} | "
              f"{x['newest_segment']:.3f} | {x['newest_10pct']:.3f} | {x['oldest_10pct']:.3f} |")
    print(f"\nraw: {json.dumps({'disk': disk, 'results': results, 'bias': bias, 'pair': pair})}")


if __name__ == "__main__":
    main()
