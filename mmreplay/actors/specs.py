"""The typed description of a collect run: what the actors act with (:class:`PolicySpec`), where and
how they write (:class:`WriterSpec`) and the run's own settings (:class:`CollectSpec`); with
:class:`mmreplay.agent.envs.EnvSpec` (what env, how wrapped and reset) they are all a run needs.

Invariants: every spec is a frozen dataclass, picklable (it travels to spawned workers and Ray
actors), checked when it is made (a bad value raises ``ValueError`` naming the field), and built
once: the CLI builds them from its options in one place per command, the keyword conveniences
(:func:`mmreplay.collect`, :func:`mmreplay.cluster.ray_collect`) from their keywords, and every
floor below passes them on unchanged.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np

PolicyFn = Callable[[Any], Any]
"""A policy callable: a batch of observations as the vector env returns them -> a batch of actions."""

Durability = Literal["process", "segment", "batch"]


@dataclasses.dataclass(frozen=True)
class PolicySpec:
    """What the actors act with: ``random``, ε-greedy around a Q-network policy file from ``mmreplay
    train``, or (``gaussian``) the continuous actor a Box-action offline run saves, with Gaussian
    exploration noise.

    ``epsilon=None`` takes the ε recorded in the policy file (``meta["epsilon"]``; the online
    trainer's current ε), else 0.05. ``noise``: the standard deviation of the Gaussian noise added
    to the actor's unit actions (a fraction of each dimension's half-range, as TD3's
    ``expl_noise``; 0: deterministic). The file is re-read whenever it changes on disk
    (``reload_s`` is how often to look), so actors follow a learner that republishes its weights.
    """

    kind: Literal["random", "eps-greedy", "gaussian"] = "random"
    """``"random"`` (the action space's samples), ``"eps-greedy"`` or ``"gaussian"``."""
    path: str | None = None
    """The policy file (``None`` for ``random``)."""
    epsilon: float | None = None
    """``eps-greedy``: the chance of a random action (``None``: the file's, else 0.05)."""
    reload_s: float = 1.0
    """How often to look for a new version of the policy file, in seconds."""
    noise: float = 0.0
    """``gaussian``: the standard deviation of the exploration noise, a fraction of each half-range."""

    @classmethod
    def parse(cls, text: str) -> PolicySpec:
        """Parse ``random``, ``eps-greedy:CHECKPOINT[:EPS]``, ``greedy:CHECKPOINT`` or
        ``gaussian:CHECKPOINT[:STD]`` (a continuous actor, noise of standard deviation STD, default 0)."""
        if text == "random":
            return cls()
        kind, sep, rest = text.partition(":")
        if kind not in ("eps-greedy", "epsilon-greedy", "greedy", "gaussian") or not sep or not rest:
            raise ValueError(f"policy must be 'random', 'eps-greedy:CHECKPOINT[:EPS]' or 'gaussian:CHECKPOINT[:STD]' "
                             f"(a continuous actor), got {text!r}")
        value: float | None = 0.0 if kind in ("greedy", "gaussian") else None
        head, _, tail = rest.rpartition(":")
        if head:
            try:
                value = float(tail)
                rest = head
            except ValueError:
                pass  # a ':' inside the path
        if kind == "gaussian":
            if value is None or not value >= 0.0:
                raise ValueError(f"gaussian policy noise must be >= 0, got {value}")
            return cls("gaussian", rest, None, noise=float(value))
        if value is not None and not 0.0 <= value <= 1.0:
            raise ValueError(f"policy epsilon must be in [0, 1], got {value}")
        return cls("eps-greedy", rest, value)

    def __str__(self) -> str:
        if self.kind == "random":
            return "random"
        if self.kind == "gaussian":
            return f"gaussian:{self.path}:{self.noise:g}"
        return f"eps-greedy:{self.path}" + ("" if self.epsilon is None else f":{self.epsilon:g}")


@dataclasses.dataclass(frozen=True)
class WriterSpec:
    """Where the rows go and how they are kept: the store (``None``: none here, for
    :func:`mmreplay.cluster.ray_collect`, whose rows then stay in the archive), its sizing when a run
    creates it (``capacity`` rows kept, ``segment_records`` rows per segment file; ``None``: the
    store's default, ``create_store``'s), the writers' ``durability`` (what a crash can lose) and ``metadata`` recorded in a new
    store."""

    store: str | None
    """The store's path (``None``: no store here; the rows stay in the archive)."""
    capacity: int = 1_000_000
    """Rows kept once full, for a store the run creates (``create_store(capacity=)``)."""
    segment_records: int | None = None
    """Rows per segment file for a store the run creates (``None``: sized for about 32 MiB)."""
    durability: Durability = "segment"
    """The writers' durability level (``ReplayStore.writer(durability=)``)."""
    metadata: Mapping[str, Any] | None = None
    """Facts recorded in the manifest of a store the run creates."""

    def __post_init__(self) -> None:
        if self.store is not None and not isinstance(self.store, str):
            object.__setattr__(self, "store", os.fspath(self.store))
        if self.capacity < 1:
            raise ValueError(f"`capacity` must be >= 1, got {self.capacity}")
        if self.segment_records is not None and self.segment_records < 1:
            raise ValueError(f"`segment_records` must be >= 1 or None, got {self.segment_records}")
        if self.durability not in ("process", "segment", "batch"):
            raise ValueError(f"`durability` must be 'process', 'segment' or 'batch', got {self.durability!r}")


@dataclasses.dataclass(frozen=True)
class CollectSpec:
    """A collect run's own settings: ``steps`` env steps in all, split over ``workers`` (processes,
    or Ray actors; ``0``: one worker in the calling process) of ``envs_per_worker`` env copies each,
    acting with ``policy`` (a :class:`PolicySpec`, its text form, or a :data:`PolicyFn`), from base
    ``seed`` (``None``: a fresh one, see :meth:`seeded`), with a progress bar when ``progress``
    (``None``: when stderr is a terminal)."""

    steps: int
    """Env steps in all, over every worker and env copy."""
    workers: int = 1
    """Worker processes (or Ray actors); ``0``: one worker in the calling process."""
    envs_per_worker: int = 1
    """Env copies of each worker's vector env (its writer's lanes)."""
    policy: PolicySpec | PolicyFn = PolicySpec()
    """What the workers act with: a ``PolicySpec`` (its text form is parsed) or a ``PolicyFn``."""
    seed: int | None = None
    """Base seed of the envs and policies (``None``: a fresh one, see ``seeded``)."""
    progress: bool | None = None
    """Show a progress bar (``None``: when stderr is a terminal)."""

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"`steps` must be >= 1, got {self.steps}")
        if self.workers < 0 or self.envs_per_worker < 1:
            raise ValueError(f"need workers >= 0 and envs_per_worker >= 1, got {self.workers} and {self.envs_per_worker}")
        if isinstance(self.policy, str):
            object.__setattr__(self, "policy", PolicySpec.parse(self.policy))

    def seeded(self) -> CollectSpec:
        """This spec with a concrete seed (a fresh random one if ``seed`` is ``None``)."""
        if self.seed is not None:
            return self
        return dataclasses.replace(self, seed=int(np.random.SeedSequence().entropy % (2**31)))

    def shares(self) -> list[int]:
        """Each worker's share of ``steps`` (:func:`split_steps` over ``max(workers, 1)``)."""
        return split_steps(self.steps, max(self.workers, 1))

    def rounded(self, share: int) -> int:
        """A share rounded up to whole vector steps of ``envs_per_worker`` env steps."""
        return -(-share // self.envs_per_worker) * self.envs_per_worker


def split_steps(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` shares that differ by at most one, the larger first."""
    return [total // parts + (i < total % parts) for i in range(parts)]
