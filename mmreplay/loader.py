"""BatchLoader: batches gathered in a background thread into pinned host memory and copied to
the device ahead of need, so the learner does not wait for data.

* A worker thread draws batches from any transition sampler and gathers every field **straight
  into one of a few preallocated host buffers** (``sampler.fill(out=...)``: one copy from the
  store, no intermediate arrays). With CUDA the buffers are page-locked (pinned) and the worker
  copies each batch to the device with ``non_blocking=True`` on its own CUDA stream and records
  an event; the consumer's stream waits on that event before using the tensors.
* A host buffer is reused only after its device copy has finished (the worker synchronises on
  the batch's event first) and after the consumer moved on: on CPU the tensors handed out are
  views of the buffer, valid until the next ``next()`` call plus ``prefetch`` batches.
* uint8 fields (frames) travel as uint8 and are converted on the device if ``float_dtype`` is
  set; float fields may be cast to ``float_dtype`` (e.g. ``torch.bfloat16``) on the device.
* Prioritized replay: ``update_priorities(ids, td)`` queues the update; the worker applies
  queued updates before drawing its next batch, so updates never race with a draw (batches
  already in flight were drawn with the older priorities, as with any asynchronous loader).
* An exception in the worker is raised in the consumer (with the worker's traceback chained);
  ``close()`` stops the worker promptly and frees the buffers; ``profile=True`` records, per
  batch, the time the consumer waited for data (``stats()``).

torch is imported when a loader is made, not by ``import mmreplay``.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .sampling.uniform import TransitionSampler
    from .storage import TransitionBatch


@dataclass
class TensorBatch:
    """A batch as torch tensors on the loader's device."""

    obs: Any
    action: Any
    reward: Any
    next_obs: Any
    terminated: Any
    truncated: Any
    ids: np.ndarray
    """Global row ids (numpy, on the host): pass them back to ``update_priorities``."""
    weights: Any = None
    discount: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


_STOP = object()


def tensor_batch(b: TransitionBatch, device: Any, float_dtype: Any = None, base: Any = None) -> TensorBatch:
    """A numpy batch as a ``TensorBatch`` on ``device``: every field, ``extra`` fields included
    (dict observations stay dicts). On the CPU the tensors are views of the batch's arrays (no
    copy); elsewhere they are copied with ``non_blocking=True`` on the current stream. Float
    fields and uint8 ones (frames) are cast to ``float_dtype`` on the device if it is set. The
    one builder behind ``BatchLoader``, the synchronous training loop and the integrations.

    ``base``: a 1-D uint8 CPU tensor the batch was gathered into (``sampler.fill(base.numpy(), B)``);
    the tensors are then views of ``base`` itself, one storage, which a process hands to another
    (a DataLoader worker to the main process) as one shared-memory block instead of one per field."""
    import torch

    device = torch.device(device)
    move = device.type != "cpu"
    lo = 0 if base is None else base.numpy().__array_interface__["data"][0]

    def conv(a: Any) -> Any:
        if a is None:
            return None
        a = np.asarray(a)
        t = _view_of(base, lo, a, torch) if base is not None else None
        t = torch.from_numpy(a) if t is None else t
        if move:
            t = t.to(device, non_blocking=True)
        if float_dtype is not None and (t.is_floating_point() or t.dtype == torch.uint8):
            t = t.to(float_dtype)
        return t

    def obs(o: Any) -> Any:
        return {k: conv(v) for k, v in o.items()} if isinstance(o, dict) else conv(o)

    return TensorBatch(obs(b.obs), conv(b.action), conv(b.reward), obs(b.next_obs), conv(b.terminated),
                       conv(b.truncated), np.array(b.ids), conv(b.weights), conv(b.discount),
                       {k: conv(v) for k, v in b.extra.items()})


def _view_of(base: Any, lo: int, a: np.ndarray, torch: Any) -> Any:
    """``a`` as a view of the uint8 tensor ``base`` whose memory starts at address ``lo``, or ``None``
    when it lies elsewhere or is not aligned for its dtype."""
    off, size = a.__array_interface__["data"][0] - lo, a.itemsize
    if a.size == 0 or off < 0 or off % size or any(st % size for st in a.strides) or a.dtype.kind not in "biuf":
        return None
    span = off + sum((n - 1) * st for n, st in zip(a.shape, a.strides)) + size
    if span > base.numel() or min(a.strides, default=0) < 0:
        return None
    typed = base[: base.numel() // size * size].view(torch.from_numpy(a[:0].reshape(0)).dtype)
    return typed.as_strided(a.shape, [st // size for st in a.strides], off // size)


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
        Batches prepared ahead (host buffers: ``prefetch + 2``).
    float_dtype
        Cast float fields (and uint8 observations) to this torch dtype on the device; ``None``
        keeps the stored dtypes (uint8 frames stay uint8).
    profile
        Record the consumer's wait for each batch (see ``stats``).
    """

    def __init__(self, sampler: TransitionSampler, batch_size: int, *, device: Any = "auto", prefetch: int = 2,
                 float_dtype: Any = None, profile: bool = False) -> None:
        import torch

        if batch_size < 1 or prefetch < 1:
            raise ValueError("`batch_size` and `prefetch` must be >= 1")
        self.torch = torch
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.sampler = sampler
        self.batch_size = batch_size
        self.float_dtype = float_dtype
        self.profile = profile
        nbytes = sampler.batch_nbytes(batch_size)
        # host buffers: pinned with CUDA (page-locked, so the copy runs asynchronously)
        self._host = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.cuda) for _ in range(prefetch + 2)]
        self._free: queue.Queue[int] = queue.Queue()
        for i in range(len(self._host)):
            self._free.put(i)
        self._ready: queue.Queue[Any] = queue.Queue(maxsize=prefetch)
        self._updates: queue.Queue[tuple[np.ndarray, np.ndarray]] = queue.Queue()
        self._stop = threading.Event()
        self._held: int | None = None  # the buffer behind the batch the consumer holds
        self._stream = torch.cuda.Stream(device=self.device) if self.cuda else None
        self._waits: list[float] = []
        self._updates_s: list[float] = []
        self._handed_at: float | None = None
        self._batches = 0
        self._thread = threading.Thread(target=self._work, name="mmreplay-loader", daemon=True)
        self._thread.start()

    # -- worker ------------------------------------------------------------------------------
    def _work(self) -> None:
        try:
            while not self._stop.is_set():
                self._apply_updates()
                slot = self._take_free()
                if slot is None:
                    return
                host = self._host[slot]
                b = self.sampler.fill(host.numpy(), self.batch_size)
                item = self._to_device(b, slot)
                while not self._stop.is_set():
                    try:
                        self._ready.put(item, timeout=0.05)
                        break
                    except queue.Full:
                        continue
        except BaseException as exc:  # surfaces in the consumer
            self._ready.put(exc)

    def _take_free(self) -> int | None:
        while not self._stop.is_set():
            try:
                return self._free.get(timeout=0.05)
            except queue.Empty:
                continue
        return None

    def _apply_updates(self) -> None:
        update = getattr(self.sampler, "update_priorities", None)
        while True:
            try:
                ids, td = self._updates.get_nowait()
            except queue.Empty:
                return
            if update is not None:
                update(ids, td)

    def _to_device(self, b: TransitionBatch, slot: int) -> tuple[TensorBatch, int, Any]:
        torch = self.torch
        ctx = torch.cuda.stream(self._stream) if self.cuda else _null()
        with ctx:
            tb = tensor_batch(b, self.device, self.float_dtype)
            event = None
            if self.cuda:
                event = torch.cuda.Event()
                event.record(self._stream)
        if self.cuda:
            event.synchronize()  # the host buffer may be reused once its copy is done
            self._free.put(slot)
            slot = -1
        return tb, slot, event

    # -- consumer ----------------------------------------------------------------------------
    def __iter__(self) -> BatchLoader:
        return self

    def __next__(self) -> TensorBatch:
        if self._stop.is_set():
            raise StopIteration
        if self._held is not None and self._held >= 0:
            self._free.put(self._held)  # the consumer moved on: its buffer can be refilled
            self._held = None
        t0 = time.perf_counter() if self.profile else 0.0
        if self.profile and self._handed_at is not None:
            self._updates_s.append(t0 - self._handed_at)  # the learner's time with the last batch
        item = self._ready.get()
        if self.profile:
            self._handed_at = time.perf_counter()
            self._waits.append(self._handed_at - t0)
        if isinstance(item, BaseException):
            self.close()
            raise RuntimeError("the loader's worker thread failed") from item
        tb, slot, event = item
        if event is not None:
            stream = self.torch.cuda.current_stream(self.device)
            stream.wait_event(event)
            # the tensors were allocated on the loader's stream and are used on this one: tell
            # the caching allocator, or it could hand their memory out again too early
            for t in _tensors(tb):
                t.record_stream(stream)
        self._held = slot
        self._batches += 1
        return tb

    def update_priorities(self, ids: np.ndarray, td_errors: Any) -> None:
        """Queue a priority update; applied by the worker before its next draw."""
        td = td_errors.detach().float().cpu().numpy() if hasattr(td_errors, "detach") else np.asarray(td_errors)
        self._updates.put((np.asarray(ids, np.int64).copy(), np.asarray(td, np.float64).copy()))

    def stats(self) -> dict[str, float | bool]:
        """Batches handed out and, with ``profile=True``, per step: the consumer's wait for data
        and its time in the update (between taking a batch and asking for the next), in total
        and as the fraction of the wall time spent waiting."""
        w, u = self._waits, self._updates_s
        total = float(sum(w) + sum(u))
        return {
            "batches": self._batches,
            "worker_alive": self._thread.is_alive(),
            "wait_s": float(sum(w)),
            "update_s": float(sum(u)),
            "mean_wait_ms": 1e3 * float(np.mean(w)) if w else 0.0,
            "mean_update_ms": 1e3 * float(np.mean(u)) if u else 0.0,
            "wait_fraction": float(sum(w)) / total if total > 0 else 0.0,
        }

    def close(self) -> None:
        """Stop the worker (promptly) and drop the buffers."""
        if self._stop.is_set() and not self._thread.is_alive():
            return
        self._stop.set()
        try:
            while True:
                self._ready.get_nowait()
        except queue.Empty:
            pass
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self._host = []

    def __enter__(self) -> BatchLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _tensors(tb: TensorBatch) -> list[Any]:
    out = []
    for v in (tb.obs, tb.action, tb.reward, tb.next_obs, tb.terminated, tb.truncated, tb.weights, tb.discount,
              *tb.extra.values()):
        if isinstance(v, dict):
            out.extend(v.values())
        elif v is not None:
            out.append(v)
    return out


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
