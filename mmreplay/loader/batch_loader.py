"""BatchLoader: batches gathered by background threads into reused host buffers and copied to
the device ahead of need, so the learner does not wait for data.

* A worker thread draws batches from a transition sampler and gathers every field **straight
  into one of a few preallocated host buffers** (``sampler.fill(out=...)``: one copy from the
  store, no intermediate arrays, no allocation per batch). On the CPU the tensors handed out are
  views of that buffer. With CUDA the host buffers are page-locked (pinned) and each has a
  device buffer of the same size: the worker copies the **whole block in one**
  ``non_blocking`` copy on its own CUDA stream and the tensors are views of the device buffer
  (a batch crosses PCIe once, in one transfer; ``TensorBatch.buffer`` names the block). The
  consumer's stream waits on the copy's event; the worker never waits for its own copies.
* A slot (host and device buffer) is refilled only after the consumer moved on (its next
  ``next()``): with CUDA the refill's copy waits on an event recorded on the consumer's stream
  then, and the host buffer is rewritten only after its last copy finished. The tensors of a
  batch stay valid until the next ``next()`` call.
* ``workers=N``: N gather threads, each with its own slots and sampler (see ``BatchLoader``);
  batches are handed out round robin, so a seed fixes the sequence. The compiled gathers run
  without the GIL, so the threads gather in parallel.
* uint8 fields (frames) travel as uint8 and are converted on the device if ``float_dtype`` is
  set; float fields may be cast to ``float_dtype`` (e.g. ``torch.bfloat16``) on the device.
* Prioritized replay: ``update_priorities(ids, td)`` queues the update; the worker applies
  queued updates before drawing its next batch, so updates never race with a draw (batches
  already in flight were drawn with the older priorities, as with any asynchronous loader).
* An exception in a worker is raised in the consumer (with the worker's traceback chained);
  ``close()`` stops the workers promptly and frees the buffers; ``profile=True`` records, per
  batch, the time the consumer waited for data (``stats()``).

The batches are built by ``tensors.tensor_batch``. torch is imported when a loader is made.
"""

from __future__ import annotations

import queue
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .tensors import TensorBatch, tensor_batch

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ..sampling.uniform import TransitionSampler
    from ..storage import TransitionBatch


class BatchLoader:
    """Iterate over batches prepared in the background. Use as a context manager or call
    ``close()``.

    Parameters
    ----------
    sampler
        A ``UniformSampler`` or ``PrioritizedSampler`` (any view: n-step, frame stacks).
    batch_size
        Transitions per batch.
    device
        ``"auto"`` (CUDA if available, else CPU), ``"cpu"``, ``"cuda"`` or a ``torch.device``.
    prefetch
        Batches prepared ahead, all workers together (buffers: ``ceil(prefetch / workers) + 2``
        per worker).
    float_dtype
        Cast float and uint8 fields (frames, and any other uint8 field) to this torch dtype on the device; ``None``
        keeps the stored dtypes (uint8 frames stay uint8).
    profile
        Record the consumer's wait for each batch (see ``stats``).
    workers
        Gather threads. 1 (default): the batches are ``sampler``'s own, in order. ``N > 1``:
        worker 0 draws from ``sampler`` and worker ``k`` from a ``UniformSampler`` of the same
        store and view seeded from ``sampler``'s generator; the batches are handed out round
        robin (worker 0, 1, ..., N-1, 0, ...), so a seed still fixes the sequence. Needs a
        ``UniformSampler`` in ``mode="exact"`` without ``prefetch_batches`` or ``cache_bytes``
        (prioritized, windowed and prefetching samplers hold state that one thread owns). The
        loader then refreshes the store itself, every ``REFRESH_S`` seconds at most, while no
        gather runs (a gather never reads a segment a refresh may drop).

    Example
    -------
    >>> import tempfile
    >>> import numpy as np
    >>> import torch
    >>> import mmreplay
    >>> store = mmreplay.create_store(tempfile.mkdtemp() + "/replay", mmreplay.Schema.transition(obs_shape=(4,)),
    ...                               capacity=10_000)
    >>> with store.writer(lanes=1) as w:
    ...     w.add_batch(obs=np.zeros((100, 1, 4), np.float32), action=np.zeros((100, 1), np.int64),
    ...                 reward=np.ones((100, 1), np.float32), terminated=np.zeros((100, 1), bool),
    ...                 truncated=np.zeros((100, 1), bool))
    >>> sampler = mmreplay.PrioritizedSampler(store, seed=0)
    >>> loader = mmreplay.BatchLoader(sampler, batch_size=32, device="cpu", float_dtype=torch.float32)
    >>> batch = next(loader)  # torch tensors, gathered in the background; valid until the next next()
    >>> batch.obs.shape, batch.obs.dtype, batch.weights.shape
    (torch.Size([32, 4]), torch.float32, torch.Size([32]))
    >>> loader.update_priorities(batch.ids, torch.rand(32))  # the TD errors; applied before the next draw
    >>> loader.close()
    >>> store.close()
    """

    REFRESH_S = 0.05
    """With ``workers > 1``: the longest time between two checks for new rows."""

    def __init__(self, sampler: TransitionSampler, batch_size: int, *, device: Any = "auto", prefetch: int = 2,
                 float_dtype: Any = None, profile: bool = False, workers: int = 1) -> None:
        import torch

        if batch_size < 1 or prefetch < 1:
            raise ValueError("`batch_size` and `prefetch` must be >= 1")
        if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
            raise ValueError(f"`workers` must be an int >= 1, got {workers!r}")
        self._torch = torch
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        """The ``torch.device`` the batches are on (``"auto"`` resolved)."""
        self._cuda = self.device.type == "cuda"
        self.sampler = sampler
        """The sampler given (worker 0's); send priorities through the loader's ``update_priorities``."""
        self.batch_size = batch_size
        """Transitions per batch."""
        self.float_dtype = float_dtype
        """The torch dtype float fields (and uint8 observations) are cast to, or ``None``."""
        self.profile = profile
        """Whether the consumer's waits are recorded (``stats()``)."""
        self.workers = int(workers)
        """Gather threads (see the class docstring)."""
        self._samplers = [sampler] + _forks(sampler, self.workers - 1)
        self._refresh_s: float | None = None
        if self.workers > 1:  # the loader refreshes the store, between gathers (see _gathering)
            self._refresh_s = sampler.refresh_interval_s
            sampler.refresh_interval_s = None
        self._rw = threading.Condition()
        self._active = 0  # gathers in flight
        self._refreshing = False
        self._last_refresh = -float("inf")  # the first gather refreshes
        nbytes = sampler.batch_nbytes(batch_size)
        ahead = -(-prefetch // self.workers)
        # per worker: its slots (host buffer + device buffer), free slots, ready batches
        self._slots: list[list[_Slot]] = [[_Slot.make(torch, nbytes, self.device) for _ in range(ahead + 2)]
                                          for _ in range(self.workers)]
        self._free: list[queue.Queue[int]] = [queue.Queue() for _ in range(self.workers)]
        for w, slots in enumerate(self._slots):
            for i in range(len(slots)):
                self._free[w].put(i)
        self._ready: list[queue.Queue[Any]] = [queue.Queue(maxsize=ahead) for _ in range(self.workers)]
        self._updates: queue.Queue[tuple[np.ndarray, Any, Any]] = queue.Queue()  # (ids, td, copy event)
        self._stop = threading.Event()
        self._held: tuple[int, int] | None = None  # (worker, slot) behind the batch the consumer holds
        self._turn = 0  # the worker whose batch is handed out next
        self._streams = [torch.cuda.Stream(device=self.device) if self._cuda else None for _ in range(self.workers)]
        self._waits: list[float] = []
        self._updates_s: list[float] = []
        self._handed_at: float | None = None
        self._batches = 0
        self._threads = [threading.Thread(target=self._work, args=(w,), name="mmreplay-loader", daemon=True)
                         for w in range(self.workers)]
        for t in self._threads:
            t.start()

    # -- worker ------------------------------------------------------------------------------
    def _work(self, w: int) -> None:
        try:
            sampler, slots = self._samplers[w], self._slots[w]
            while not self._stop.is_set():
                if w == 0:
                    self._apply_updates()
                i = self._take_free(w)
                if i is None:
                    return
                slot = slots[i]
                if slot.copied is not None:
                    slot.copied.synchronize()  # its last copy to the device is done (long since)
                host = slot.host.numpy()
                if self.workers == 1:
                    b = sampler.fill(host, self.batch_size)
                else:
                    self._maybe_refresh()
                    with self._gathering():
                        b = sampler.fill(host, self.batch_size)
                item = (self._to_device(b, slot, self._streams[w]), i)
                while not self._stop.is_set():
                    try:
                        self._ready[w].put(item, timeout=0.05)
                        break
                    except queue.Full:
                        continue
        except BaseException as exc:  # surfaces in the consumer
            self._ready[w].put(exc)

    def _maybe_refresh(self) -> None:
        """``workers > 1``: refresh the store once no gather is in flight (new gathers wait)."""
        interval = self._refresh_s
        if interval is None or time.monotonic() - self._last_refresh < min(interval, self.REFRESH_S):
            return
        with self._rw:
            if time.monotonic() - self._last_refresh < min(interval, self.REFRESH_S) or self._refreshing:
                return
            self._refreshing = True
            while self._active:
                self._rw.wait()
        try:
            self.sampler.store.refresh_if_stale(interval)
        finally:
            with self._rw:
                self._last_refresh = time.monotonic()
                self._refreshing = False
                self._rw.notify_all()

    @contextmanager
    def _gathering(self) -> Iterator[None]:
        with self._rw:
            while self._refreshing:
                self._rw.wait()
            self._active += 1
        try:
            yield
        finally:
            with self._rw:
                self._active -= 1
                self._rw.notify_all()

    def _take_free(self, w: int) -> int | None:
        while not self._stop.is_set():
            try:
                return self._free[w].get(timeout=0.05)
            except queue.Empty:
                continue
        return None

    def _apply_updates(self) -> None:
        update = getattr(self.sampler, "update_priorities", None)
        while True:
            try:
                ids, td, copied = self._updates.get_nowait()
            except queue.Empty:
                return
            if copied is not None:  # a device tensor's copy to the host: done before it is read
                copied.synchronize()
                td = td.numpy().astype(np.float64)
            if update is not None:
                update(ids, td)

    def _to_device(self, b: TransitionBatch, slot: _Slot, stream: Any) -> TensorBatch:
        """The batch gathered into ``slot.host`` as tensors: views of the host buffer on the CPU;
        with CUDA, one copy of the whole buffer into ``slot.device`` on the worker's stream (after
        the consumer's last use of it) and views of that."""
        torch = self._torch
        if not self._cuda:
            tb = tensor_batch(b, self.device, self.float_dtype)  # views of slot.host already
            tb.buffer = slot.host
            return tb
        with torch.cuda.stream(stream):
            if slot.released is not None:
                stream.wait_event(slot.released)  # the consumer's kernels reading it were queued before
            slot.device.copy_(slot.host, non_blocking=True)
            tb = tensor_batch(b, self.device, self.float_dtype, base=slot.host, device_base=slot.device,
                              cache=slot.views)
            slot.copied = torch.cuda.Event()
            slot.copied.record(stream)
        tb.buffer = slot.device
        return tb

    # -- consumer ----------------------------------------------------------------------------
    def __iter__(self) -> BatchLoader:
        return self

    def __next__(self) -> TensorBatch:
        if self._stop.is_set():
            raise StopIteration
        self._release_held()
        t0 = time.perf_counter() if self.profile else 0.0
        if self.profile and self._handed_at is not None:
            self._updates_s.append(t0 - self._handed_at)  # the learner's time with the last batch
        w = self._turn
        item = self._ready[w].get()
        if self.profile:
            self._handed_at = time.perf_counter()
            self._waits.append(self._handed_at - t0)
        if isinstance(item, BaseException):
            self.close()
            raise RuntimeError("the loader's worker thread failed") from item
        tb, i = item
        if self._cuda:
            slot = self._slots[w][i]
            stream = self._torch.cuda.current_stream(self.device)
            stream.wait_event(slot.copied)
            base = slot.device.untyped_storage().data_ptr()
            for t in _tensors(tb):  # casts and small arrays were allocated on the loader's stream
                if t.untyped_storage().data_ptr() != base:
                    t.record_stream(stream)
        self._held = (w, i)
        self._turn = (w + 1) % self.workers
        self._batches += 1
        return tb

    def _release_held(self) -> None:
        """The consumer moved on: its slot may be refilled once the work queued on it is done."""
        if self._held is None:
            return
        w, i = self._held
        self._held = None
        if self._cuda:
            slot = self._slots[w][i]
            slot.released = self._torch.cuda.Event()
            slot.released.record(self._torch.cuda.current_stream(self.device))
        self._free[w].put(i)

    def update_priorities(self, ids: np.ndarray, td_errors: Any) -> None:
        """Queue a priority update; applied by the worker before its next draw. A CUDA tensor is
        copied to pinned host memory without blocking the caller (the worker waits for the copy)."""
        ids = np.asarray(ids, np.int64).copy()
        if hasattr(td_errors, "detach"):
            t = td_errors.detach()
            if t.device.type == "cuda":
                torch = self._torch
                host = torch.empty(t.shape, dtype=torch.float32, pin_memory=True)
                host.copy_(t.float(), non_blocking=True)
                copied = torch.cuda.Event()
                copied.record(torch.cuda.current_stream(t.device))
                self._updates.put((ids, host, copied))
                return
            td = t.float().cpu().numpy()
        else:
            td = np.asarray(td_errors)
        self._updates.put((ids, np.asarray(td, np.float64).copy(), None))

    def stats(self) -> dict[str, float | bool]:
        """Batches handed out and, with ``profile=True``, per step: the consumer's wait for data
        and its time in the update (between taking a batch and asking for the next), in total
        and as the fraction of the wall time spent waiting."""
        w, u = self._waits, self._updates_s
        total = float(sum(w) + sum(u))
        return {
            "batches": self._batches,
            "workers": self.workers,
            "worker_alive": any(t.is_alive() for t in self._threads),
            "wait_s": float(sum(w)),
            "update_s": float(sum(u)),
            "mean_wait_ms": 1e3 * float(np.mean(w)) if w else 0.0,
            "mean_update_ms": 1e3 * float(np.mean(u)) if u else 0.0,
            "wait_fraction": float(sum(w)) / total if total > 0 else 0.0,
        }

    @property
    def pinned(self) -> bool:
        """Whether the host buffers are page-locked (with CUDA)."""
        return bool(self._slots and self._slots[0][0].host.is_pinned())

    def close(self) -> None:
        """Stop the workers (promptly), drop the buffers and close the samplers the loader made."""
        if self._stop.is_set() and not any(t.is_alive() for t in self._threads):
            return
        self._stop.set()
        for q in self._ready:
            try:
                while True:
                    q.get_nowait()
            except queue.Empty:
                pass
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=10)
        for s in self._samplers[1:]:
            s.close()
        if self.workers > 1:
            self.sampler.refresh_interval_s = self._refresh_s
        if self._cuda:
            self._torch.cuda.current_stream(self.device).synchronize()
        self._slots = []

    def __enter__(self) -> BatchLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class _Slot:
    """A batch's buffers: the host block it is gathered into (pinned with CUDA) and, with CUDA,
    the device block it is copied to in one piece, with the copy's event and the event after
    which the consumer no longer reads it."""

    host: Any
    device: Any
    copied: Any = None
    released: Any = None
    views: dict[Any, Any] = field(default_factory=dict)  # tensor_batch's views of ``device``

    @staticmethod
    def make(torch: Any, nbytes: int, device: Any) -> _Slot:
        cuda = device.type == "cuda"
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
        return _Slot(host, torch.empty(nbytes, dtype=torch.uint8, device=device) if cuda else host)


def _forks(sampler: TransitionSampler, n: int) -> list[Any]:
    """``n`` samplers like ``sampler`` (same store and view), seeded from its generator, that
    never refresh the store themselves."""
    if n == 0:
        return []
    from ..sampling.uniform import UniformSampler

    if type(sampler) is not UniformSampler:
        raise ValueError(f"`workers` > 1 needs a UniformSampler, got {type(sampler).__name__} "
                         "(its draws hold state one thread owns): use workers=1")
    if sampler.mode != "exact" or sampler.prefetch_batches or sampler.cache_bytes is not None:
        raise ValueError("`workers` > 1 needs a sampler with mode='exact', no prefetch_batches and no cache_bytes, "
                         f"got mode={sampler.mode!r}, prefetch_batches={sampler.prefetch_batches}, "
                         f"cache_bytes={sampler.cache_bytes}: use workers=1")
    seeds = sampler.rng.integers(2**63, size=n)
    return [UniformSampler(sampler.store, seed=int(s), refresh_interval_s=None, n_step=sampler.n_step,
                           gamma=sampler.gamma, frame_stack=sampler.frame_stack) for s in seeds]


def _tensors(tb: TensorBatch) -> list[Any]:
    out = []
    for v in (tb.obs, tb.action, tb.reward, tb.next_obs, tb.terminated, tb.truncated, tb.weights, tb.discount,
              *tb.extra.values()):
        if isinstance(v, dict):
            out.extend(v.values())
        elif v is not None:
            out.append(v)
    return out
