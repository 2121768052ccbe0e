"""The learners' running statistics: the mean loss and mean Q(s, a) of the updates since the last
read, kept on the device (:class:`UpdateStats`, which :class:`mmreplay.train.QLearner` and
:class:`mmreplay.train.BoxLearner` share).

Invariants: recording an update costs no host-device sync (the detached tensors are kept, then
summed 1,024 updates at a time into ``_sums`` = (loss, Q) over ``_counts`` = (updates, Q values), so
memory stays bounded however rarely the statistics are read); ``read_stats`` is the only sync.
The names ``_losses``, ``_qs``, ``_sums`` and ``_counts`` are what ``graphs.GraphedUpdate``
accumulates into when it replays a captured update.
"""

from __future__ import annotations

from typing import Any

import torch

FOLD_EVERY = 1024


class UpdateStats:
    """Mixin of the learners: the loss and Q(s, a) accumulators, and the ``--cuda-graphs`` switch."""

    device: torch.device

    def _init_stats(self, cfg: Any, device: torch.device) -> None:
        """Empty accumulators on ``device``; with ``cfg.cuda_graphs`` (``cfg``: the run's hardware
        settings) the update is captured and replayed (``graphs.GraphedUpdate``), or runs eagerly
        after one warning saying why."""
        self._losses: list[torch.Tensor] = []
        self._qs: list[torch.Tensor] = []
        self._sums = torch.zeros(2, device=device)
        self._counts = [0, 0]
        if cfg.cuda_graphs:
            from .graphs import GraphedUpdate

            self.update = GraphedUpdate(self)  # type: ignore[method-assign]

    def _record(self, loss: torch.Tensor, q: torch.Tensor | None) -> None:
        """Keep one update's loss and (when the algorithm has one) its Q(s, a) values."""
        self._losses.append(loss.detach())
        if q is not None:
            self._qs.append(q.detach())
        if len(self._losses) == FOLD_EVERY:
            self._fold()

    def _fold(self) -> None:
        """Add the kept losses and Q values to the sums."""
        if self._losses:
            q = torch.cat(self._qs).sum() if self._qs else torch.zeros((), device=self._sums.device)
            self._sums += torch.stack([torch.stack(self._losses).sum(), q])
            self._counts[0] += len(self._losses)
            self._counts[1] += sum(len(v) for v in self._qs)
            self._losses, self._qs = [], []

    def read_stats(self) -> tuple[float | None, float | None]:
        """Mean loss and mean Q(s, a) since the last call: ``(None, None)`` without an update, Q
        ``None`` when the updates recorded none. Which loss and Q: the learner's class docstring."""
        self._fold()
        n, m = self._counts
        if not n:
            return None, None
        loss, q = self._sums.tolist()
        self._sums.zero_()
        self._counts = [0, 0]
        return loss / n, (q / m if m else None)
