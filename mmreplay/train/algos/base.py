"""What every algorithm is made of: its config (:class:`AlgoConfig`, whose per-family defaults are
its presets; :class:`BoxConfig` for the Box-action ones) and its entry in the registry
(:class:`Algorithm`, whose learner factories take a ``mmreplay.train.settings.LearnerSetup``).

Invariants: no torch here (the CLI builds and checks a config before torch loads); a config's
field names are unique across :class:`mmreplay.train.TrainConfig` and every registered config
(``mmreplay train``'s options and the flat ``config.json`` of older runs map onto them by name).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar


FAMILIES = ("classic", "offline", "box", "atari", "minatar")
"""Env families a preset can name: ``classic`` (vector observations, online), ``offline`` (discrete
actions from a store), ``box`` (Box actions from a store: CORL's settings), ``atari`` (Nature DQN),
``minatar`` (the MinAtar paper's DQN). :func:`mmreplay.train.config.family_of` picks one per run."""


@dataclass(frozen=True, slots=True)
class AlgoConfig:
    """The settings every algorithm has; an algorithm's config subclasses it and adds its own.

    ``PRESETS`` maps a family (:data:`FAMILIES`) to the defaults that family changes: a value, or a
    function of the run's settings so far (a dict of the run's fields, e.g. ``steps``). A subclass's
    ``PRESETS`` add to its bases' (its own values win)."""

    name: ClassVar[str] = ""
    PRESETS: ClassVar[Mapping[str, Mapping[str, Any]]] = {}

    learning_rate: float = 2.3e-3
    """The optimizers' learning rate."""
    batch_size: int = 64
    """Transitions per update."""
    gamma: float = 0.99
    """Discount factor (also the sampler's, for n-step returns)."""
    hidden: tuple[int, ...] = (256, 256)
    """Hidden layer widths of the MLPs (vector observations)."""
    max_grad_norm: float = 10.0
    """Gradient clipping by global norm (0 disables)."""

    @classmethod
    def preset(cls, family: str, run: Mapping[str, Any]) -> dict[str, Any]:
        """The defaults ``family`` gives this config's fields (functions evaluated on ``run``): the
        ``PRESETS`` of its bases, then its own."""
        merged: dict[str, Any] = {}
        for klass in reversed(cls.__mro__):
            merged.update(vars(klass).get("PRESETS", {}).get(family, {}))
        return {key: value(run) if callable(value) else value for key, value in merged.items()}

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The config's fields, in declaration order."""
        return tuple(f.name for f in fields(cls))

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field (``\\`name\\` must ...``)."""
        if self.batch_size < 1:
            raise ValueError(f"`batch_size` must be >= 1, got {self.batch_size}")
        if self.learning_rate <= 0:
            raise ValueError(f"`learning_rate` must be > 0, got {self.learning_rate}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"`gamma` must lie in [0, 1], got {self.gamma}")
        if not self.hidden or any(int(h) < 1 for h in self.hidden):
            raise ValueError(f"`hidden` must be positive layer widths, got {self.hidden}")
        if self.max_grad_norm < 0:
            raise ValueError(f"`max_grad_norm` must be >= 0, got {self.max_grad_norm}")


@dataclass(frozen=True, slots=True)
class BoxConfig(AlgoConfig):
    """The settings the Box-action algorithms share, with the defaults of CORL's single-file
    implementations (``td3_bc.py``, ``iql.py``, ``any_percent_bc.py``): batch 256, Adam lr 3e-4 for
    every network, (256, 256) ReLU layers, gamma 0.99, Polyak tau 0.005, no gradient clipping,
    observations normalized."""

    learning_rate: float = 3e-4
    """The optimizers' learning rate."""
    batch_size: int = 256
    """Transitions per update."""
    max_grad_norm: float = 0.0
    """Gradient clipping by global norm (0 disables)."""
    tau: float = 0.005
    """Target networks += tau (online - target) after each update that moves them (Polyak averaging)."""
    normalize_obs: bool = True
    """Normalize observations with the dataset's mean and std (``mmreplay.field_stats``, over the
    transitions' observations, plus 1e-3)."""

    def validate(self) -> None:
        AlgoConfig.validate(self)
        if not 0.0 < self.tau < 1.0:
            raise ValueError(f"`tau` must lie in (0, 1) for {self.name}, which Polyak-averages its target networks "
                             f"(CORL: 0.005), got {self.tau}")


LearnerFactory = Callable[..., Any]
"""A function of a ``mmreplay.train.settings.LearnerSetup`` that returns a learner."""


@dataclass(frozen=True)
class Algorithm:
    """A registry entry: the algorithm's name, config class, learner factory per action kind
    (``"discrete"``, ``"box"``), whether it can learn online (acting in an env: the online loops'
    exploration and training-round fields must be in its config) and one line of help."""

    name: str
    config: type[AlgoConfig]
    learners: Mapping[str, LearnerFactory]
    online: bool = False
    summary: str = ""

    @property
    def kinds(self) -> tuple[str, ...]:
        """The action kinds it learns: ``"discrete"``, ``"box"`` or both."""
        return tuple(self.learners)

    def learner(self, setup: Any, kind: str) -> Any:
        """A learner for ``kind`` actions (``ValueError`` naming what fits when it takes none)."""
        factory = self.learners.get(kind)
        if factory is None:
            raise ValueError(f"--algo {self.name} needs {' or '.join(self.kinds)} actions, not {kind}")
        return factory(setup)
