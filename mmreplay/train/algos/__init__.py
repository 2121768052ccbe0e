"""The algorithms ``mmreplay train`` runs, one module each, and the registry that names them.

Modules: ``base`` (:class:`AlgoConfig`, :class:`BoxConfig`, :class:`Algorithm`, the env
:data:`FAMILIES` a preset names), ``dqn`` (DQN and the Q-learning config CQL shares),
``cql`` (discrete CQL), ``bc`` (behaviour cloning, discrete and Box), ``td3bc`` (TD3+BC), ``iql``
(implicit Q-learning). An algorithm's module holds its config dataclass (whose ``PRESETS`` are its
defaults per env family), its loss or step (``# ALGO LOGIC``), the networks it adds, the action
kinds it learns and its ``ALGORITHM`` entry; no module imports torch until a learner is built.

Adding an algorithm is one new module and one :func:`register` line (below, or in your own code
before ``mmreplay.train.train`` runs)::

    from mmreplay.train.algos import register
    register(my_module.ALGORITHM)

Invariant: outside these modules, nothing in ``mmreplay.train`` or the CLI compares an algorithm's
name or spells one; they ask the registry (:func:`get`) and the algorithm's entry.
"""

from __future__ import annotations

from typing import Any

from . import bc, cql, dqn, iql, td3bc
from .base import FAMILIES, AlgoConfig, Algorithm, BoxConfig

__all__ = ["FAMILIES", "AlgoConfig", "Algorithm", "BoxConfig", "action_kind", "check_fits", "get",
           "names", "register"]

_REGISTRY: dict[str, Algorithm] = {}


def register(algorithm: Algorithm) -> Algorithm:
    """Add ``algorithm`` under its name (replacing one of the same name, so a module reloaded in a
    notebook registers again); its config's name must be its name. Returns it."""
    if algorithm.config.name != algorithm.name:
        raise ValueError(f"{algorithm.config.__name__}.name is {algorithm.config.name!r}, the algorithm's "
                         f"name {algorithm.name!r}")
    if not set(algorithm.learners) <= {"discrete", "box"} or not algorithm.learners:
        raise ValueError(f"{algorithm.name}: learners are keyed 'discrete' and/or 'box', got {sorted(algorithm.learners)}")
    from ..settings import setting_groups  # (settings imports only .base of this package)

    taken = sorted(set(algorithm.config.field_names()) & set(setting_groups()))
    if taken:  # options and flat configs name every setting once: a clash would hide the run's setting
        raise ValueError(f"{algorithm.config.__name__} has fields named as run settings: {', '.join(taken)}")
    _REGISTRY[algorithm.name] = algorithm
    return algorithm


def names() -> tuple[str, ...]:
    """The registered algorithms' names, in registration order."""
    return tuple(_REGISTRY)


def get(name: str) -> Algorithm:
    """The algorithm registered as ``name`` (``ValueError`` naming the registered ones otherwise)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"`algo` must be one of {', '.join(map(repr, names()))}, got {name!r}") from None


def action_kind(schema: Any) -> str:
    """``"box"`` when ``schema``'s action field is a float Box (``Schema.box_actions``), else ``"discrete"``."""
    return "box" if schema.box_actions else "discrete"


def check_fits(name: str, schema: Any, where: str) -> str:
    """The action kind of ``schema`` (:func:`action_kind`), or one clear ``ValueError`` when algorithm
    ``name`` cannot learn it, naming the algorithms that can."""
    kind = action_kind(schema)
    algorithm = get(name)
    if kind not in algorithm.kinds:
        f = schema["action"] if "action" in schema else None
        have = "none" if f is None else f"{f.dtype} {tuple(f.shape)}"
        words = {"box": "continuous (Box)", "discrete": "discrete"}
        fit = [n for n in names() if kind in _REGISTRY[n].kinds]
        raise ValueError(f"--algo {name} needs {' or '.join(words[k] for k in algorithm.kinds)} actions, but the "
                         f"`action` field of {where} is {have} ({words[kind]}): use --algo "
                         f"{', '.join(fit) or '(none registered)'}")
    return kind


# the built-in algorithms: one line each
register(dqn.ALGORITHM)
register(bc.ALGORITHM)
register(cql.ALGORITHM)
register(td3bc.ALGORITHM)
register(iql.ALGORITHM)
