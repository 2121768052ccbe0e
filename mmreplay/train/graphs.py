"""Graph-captured updates: a learner's whole gradient step captured once as a CUDA graph per
batch shape and replayed for every batch (``TrainConfig.cuda_graphs``, ``--cuda-graphs``).

An eager update of a small network is launch-bound on a GPU (hundreds of kernels, each a few
microseconds to launch); a replayed graph launches them all at once. :class:`GraphedUpdate`
wraps a learner (:class:`mmreplay.train.QLearner` or :class:`mmreplay.train.BoxLearner`) and
keeps these invariants:

* **What is captured**: the learner's own ``update`` (so the algorithm is written once): the
  forwards, the loss, the backward pass, gradient clipping, the optimizer step (its optimizers
  are made ``capturable``, their learning rates device tensors), the target update when the
  update does one, and the sum of the loss and of Q(s, a) into the learner's device
  accumulators (no sync per update; ``read_stats`` is unchanged).
* **Keys**: one graph per (field shapes and dtypes, phase, input block). The *phase* is the
  branch the update takes on the host, as the learner's ``phase()`` says: the target copy every
  ``target_update_interval`` updates (Q learners), an algorithm's delayed step (TD3+BC's actor);
  each phase is captured on first use, so the target cadence needs no recapture. Inputs that are views of a
  ``BatchLoader`` block (``TensorBatch.buffer``, reused by the loader) are read in place: one
  graph per block (up to ``MAX_BLOCKS``), no copy on the device. Other inputs are copied into
  the graph's static tensors.
* **Host state**: the update counter advances once per replay; a learning rate written into a
  param group as a float (a schedule, IQL's cosine curve) is copied into the group's tensor
  before the next replay: no recapture.
* **TD errors** (prioritized replay) come back as the graph's static tensor (valid until the
  next update; ``BatchLoader.update_priorities`` copies it to the host without blocking the
  learner).
* **Warm-up and fallback**: the first ``WARMUP`` updates run eagerly on a side stream (real
  updates: they initialise the optimizer state and the libraries' workspaces). On a CPU, with
  ``--amp`` or ``--compile``, or when a capture fails, one warning says why and every update
  runs eagerly, unchanged.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger(__name__)

WARMUP = 3
"""Eager updates (on a side stream) before the first capture."""
MAX_GRAPHS = 48
"""Graphs kept at most; beyond it the update runs eagerly (one warning)."""
MAX_BLOCKS = 16
"""Loader blocks read in place at most; batches from further blocks are copied into one graph's inputs."""

_FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated", "weights", "discount")


class GraphedUpdate:
    """``learner.update`` captured and replayed (see the module docstring). Call it like the
    learner's ``update``; ``enabled`` says whether graphs are used."""

    def __init__(self, learner: Any) -> None:
        self.learner = learner
        self.eager = learner.update  # the learner's own step: what is captured
        self.device = torch.device(learner.device)
        self.enabled = False
        self.graphs: dict[Any, _Graph | None] = {}
        self.warm = 0
        self._blocks: set[int] = set()
        self.why: str | None = _why_not(learner, self.device)
        if self.why is not None:
            log.warning("--cuda-graphs: %s; training eagerly", self.why)
            return
        try:
            self._optimizers = [v for v in vars(learner).values() if isinstance(v, torch.optim.Optimizer)]
            self._lrs = [[torch.tensor(float(g["lr"]), dtype=torch.float32, device=self.device)
                          for g in opt.param_groups] for opt in self._optimizers]
            self._prepare_optimizers()
        except Exception as exc:  # an optimizer without a capturable form
            self._fail(f"the optimizer cannot be captured ({type(exc).__name__}: {exc})")
            return
        self.pool = torch.cuda.graph_pool_handle()
        self.side = torch.cuda.Stream(self.device)
        self.enabled = True

    def _fail(self, why: str) -> None:
        self.why, self.enabled = why, False
        log.warning("--cuda-graphs: %s; training eagerly", why)

    # -- the update -------------------------------------------------------------------------------
    def __call__(self, b: Any) -> Any:
        if not self.enabled:
            return self.eager(b)
        if self.warm < WARMUP:  # real updates on a side stream, as capture needs
            self.warm += 1
            self.side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.side):
                out = self.eager(b)
            torch.cuda.current_stream(self.device).wait_stream(self.side)
            return out
        key = self._key(b)
        in_place = key[2] is not None
        if key not in self.graphs:
            if len(self.graphs) >= MAX_GRAPHS:
                self._fail(f"more than {MAX_GRAPHS} batch shapes, phases and input blocks")
                return self.eager(b)
            captured = self.graphs[key] = self._capture(b, in_place)  # and replayed for ``b``
            return self.eager(b) if captured is None else captured.td
        g = self.graphs[key]
        assert g is not None
        self._sync_lrs()
        g.feed(b)
        g.graph.replay()
        self._after_replay(g)
        return g.td

    # -- helpers ----------------------------------------------------------------------------------
    def _phase(self) -> Any:
        """The host-side branch the next update takes (see the module docstring)."""
        phase = getattr(self.learner, "phase", None)
        return None if phase is None else phase()  # the learner's, as its algorithm says

    def _key(self, b: Any) -> Any:
        buf = getattr(b, "buffer", None)
        block = buf.data_ptr() if isinstance(buf, torch.Tensor) and buf.device == self.device else None
        if block is not None and block not in self._blocks:
            if len(self._blocks) >= MAX_BLOCKS:
                block = None  # copied, like batches from anywhere else
            else:
                self._blocks.add(block)
        return (_signature(b), self._phase(), block)

    def _prepare_optimizers(self) -> None:
        """Before the first update and each capture (a checkpoint may have been loaded since):
        capturable groups, step counters on the device, learning rates as device tensors."""
        for opt in self._optimizers:
            for group in opt.param_groups:
                if "capturable" not in group:
                    raise TypeError(f"{type(opt).__name__} has no capturable mode")
                group["capturable"] = True
            for state in opt.state.values():
                step = state.get("step")
                if isinstance(step, torch.Tensor) and step.device != self.device:
                    state["step"] = step.to(device=self.device, dtype=torch.float32)
        self._sync_lrs()

    def _sync_lrs(self) -> None:
        """A float a schedule wrote into a param group goes into the group's lr tensor."""
        for opt, lrs in zip(self._optimizers, self._lrs):
            for group, t in zip(opt.param_groups, lrs):
                cur = group["lr"]
                if cur is not t:
                    if isinstance(cur, torch.Tensor):
                        t.copy_(cur)
                    else:
                        t.fill_(float(cur))
                    group["lr"] = t

    def _after_replay(self, g: _Graph) -> None:
        ln = self.learner
        ln.updates += 1
        ln._counts[0] += 1
        ln._counts[1] += g.q_count
        after = getattr(ln, "after_graphed_update", None)  # host-side work of the eager step (lr schedules)
        if after is not None:
            after()

    def _capture(self, b: Any, in_place: bool) -> _Graph | None:
        """Capture the update for ``b``'s key, then replay it for ``b``; ``None`` and eager
        updates from now on if the capture fails."""
        ln = self.learner
        ln._fold()  # the accumulators hold every eager update so far
        saved = ln.updates
        static = _Static(b, in_place)
        graph = torch.cuda.CUDAGraph()
        n_losses, n_qs = len(ln._losses), len(ln._qs)
        try:
            self._prepare_optimizers()
            torch.cuda.current_stream(self.device).synchronize()
            with torch.cuda.graph(graph, pool=self.pool, stream=self.side):
                td = self.eager(static.batch)
                loss = ln._losses[n_losses] if len(ln._losses) > n_losses else None
                q = ln._qs[n_qs] if len(ln._qs) > n_qs else None
                parts = [loss.float() if loss is not None else torch.zeros((), device=self.device),
                         q.float().sum() if q is not None else torch.zeros((), device=self.device)]
                ln._sums.add_(torch.stack(parts))  # statistics stay on the device
        except Exception as exc:
            self._fail(f"capturing the update failed ({type(exc).__name__}: {str(exc).splitlines()[0]})")
            return None
        finally:
            del ln._losses[n_losses:], ln._qs[n_qs:]
            ln.updates = saved
        g = _Graph(graph, static, td, 0 if q is None else q.numel())
        self._sync_lrs()  # the capture ran the step's Python once: a float it wrote is the next lr
        g.feed(b)
        graph.replay()
        self._after_replay(g)
        return g


class _Graph:
    """A captured update: the graph, its static inputs and outputs."""

    def __init__(self, graph: Any, static: _Static, td: Any, q_count: int) -> None:
        self.graph, self.static, self.td, self.q_count = graph, static, td, q_count

    def feed(self, b: Any) -> None:
        self.static.feed(b)


class _Static:
    """The graph's inputs: views of the loader's block where ``b``'s tensors are, else copies
    (made at capture, refilled per batch)."""

    def __init__(self, b: Any, in_place: bool) -> None:
        buf = getattr(b, "buffer", None)
        base = buf.untyped_storage().data_ptr() if in_place and isinstance(buf, torch.Tensor) else None
        self.copied: list[tuple[str, str | None]] = []  # (field, dict key) refilled per batch
        fields: dict[str, Any] = {}
        for name in _FIELDS:
            v = getattr(b, name, None)
            if isinstance(v, dict):
                fields[name] = {}
                for k, t in v.items():
                    fields[name][k] = self._take(name, k, t, base)
            else:
                fields[name] = None if v is None else self._take(name, None, v, base)
        # no ``extra`` fields: the learners read none (one that did would fail its capture: eager)
        self.batch = type(b)(**fields, ids=b.ids) if _is_tensor_batch(b) else _Batch(**fields)

    def _take(self, name: str, key: str | None, t: Any, base: int | None) -> Any:
        if base is not None and t.untyped_storage().data_ptr() == base:
            return t  # read in place: the loader rewrites this block, the graph reads it
        self.copied.append((name, key))
        return t.clone()

    def feed(self, b: Any) -> None:
        for name, key in self.copied:
            src, dst = getattr(b, name), getattr(self.batch, name)
            if key is not None:
                src, dst = src[key], dst[key]
            dst.copy_(src, non_blocking=True)


class _Batch:
    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)
        self.extra: dict[str, Any] = {}


def _is_tensor_batch(b: Any) -> bool:
    from ..loader import TensorBatch

    return isinstance(b, TensorBatch)


def _signature(b: Any) -> tuple[Any, ...]:
    out: list[Any] = []
    for name in _FIELDS:
        v = getattr(b, name, None)
        items = sorted(v.items()) if isinstance(v, dict) else [(None, v)]
        for k, t in items:
            out.append((name, k, None if t is None else (tuple(t.shape), t.dtype, t.device)))
    return tuple(out)


def _why_not(learner: Any, device: torch.device) -> str | None:
    """Why the update cannot be captured here, or ``None``."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return f"CUDA graphs need a CUDA device, this run trains on {device.type}"
    hw = getattr(learner.cfg, "hardware", None)
    if getattr(hw, "compile", False):
        return "--compile is not captured (torch.compile's mode='reduce-overhead' captures graphs itself)"
    if getattr(learner, "amp", False):
        return "bf16 autocast (--amp) is not captured"
    for name in ("_losses", "_qs", "_sums", "_counts", "updates"):
        if not hasattr(learner, name):
            return f"{type(learner).__name__} has no `{name}` (not a learner this module captures)"
    return None
