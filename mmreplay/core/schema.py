"""Schema: the named, typed fields of a step row, and validation of batches against them.

Invariants kept here:

* a schema is immutable and has a stable canonical form (``to_json``) and hash, written into the
  store manifest and every segment header, so data of another schema is refused;
* ``validate_batch`` checks every field of a batch (names, dtype, trailing shape, equal leading
  length, finiteness) **before** anything is written, and raises ``SchemaError`` /
  ``InvalidValueError`` naming the field, what was expected and what came.

Field names are the user's. The transition samplers need ``action``, ``reward``,
``terminated``, ``truncated`` and one or more observation fields (``obs`` or ``obs/<key>``
for a flattened Dict space). ``is_last`` is reserved: the writer derives it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .errors import InvalidValueError, SchemaError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = ["Field", "Schema"]

RESERVED = frozenset({"is_last"})
NonFinite = Literal["error", "warn", "allow"]
Cast = Literal["no", "safe", "same_kind"]


@dataclass(frozen=True, slots=True)
class Field:
    """One named column of a step row."""

    name: str
    """Field name; ``/`` separates the keys of a flattened Dict observation (``obs/pos``)."""
    dtype: np.dtype[Any]
    """Numpy dtype of one element, little-endian (or byte-order free)."""
    shape: tuple[int, ...] = ()
    """Shape of one row's value; ``()`` for scalars."""

    def __post_init__(self) -> None:
        dt = np.dtype(self.dtype)
        if dt.hasobject or dt.kind in "OUSVMm" or dt.fields is not None:
            raise SchemaError(f"field {self.name!r}: dtype {dt} is not a fixed-size numeric type")
        if dt.byteorder == ">":
            raise SchemaError(f"field {self.name!r}: dtype {dt} is big-endian; use {dt.newbyteorder('<')}")
        object.__setattr__(self, "dtype", dt)
        shape = tuple(int(s) for s in self.shape)
        if any(s < 0 for s in shape):
            raise SchemaError(f"field {self.name!r}: shape {shape} has a negative dimension")
        object.__setattr__(self, "shape", shape)
        if not self.name or self.name.startswith("/") or self.name.endswith("/"):
            raise SchemaError(f"field name {self.name!r} is not valid")

    @property
    def row_bytes(self) -> int:
        """Bytes of one row of this field."""
        return int(self.dtype.itemsize * math.prod(self.shape))

    def to_json(self) -> dict[str, Any]:
        """The field as JSON: ``{"name", "dtype"`` (numpy's ``dtype.str``, byte order included), ``"shape"}``."""
        return {"name": self.name, "dtype": self.dtype.str, "shape": list(self.shape)}


@dataclass(frozen=True, slots=True)
class Schema:
    """The ordered fields of a step row.

    Build it explicitly, ``Schema([Field("obs", np.float32, (8,)), ...])`` or
    ``Schema.transition(obs_shape=(8,), obs_dtype=np.float32)``, or from gymnasium spaces with
    ``Schema.from_spaces(env.observation_space, env.action_space)``.
    """

    fields: tuple[Field, ...]
    """The fields, in storage order."""
    _specs: tuple[tuple[str, np.dtype[Any], tuple[int, ...], int, bool], ...] = dataclasses.field(
        init=False, repr=False, compare=False
    )
    _names: frozenset[str] = dataclasses.field(init=False, repr=False, compare=False)
    _order: tuple[tuple[str, ...], tuple[str, ...]] = dataclasses.field(init=False, repr=False, compare=False)

    def __init__(self, fields: Iterable[Field]) -> None:
        fs = tuple(fields)
        names = [f.name for f in fs]
        if len(set(names)) != len(names):
            raise SchemaError(f"duplicate field names in {names}")
        bad = RESERVED.intersection(names)
        if bad:
            raise SchemaError(f"field names {sorted(bad)} are reserved")
        if not fs:
            raise SchemaError("a schema needs at least one field")
        object.__setattr__(self, "fields", fs)
        specs = tuple((f.name, f.dtype, f.shape, len(f.shape), f.dtype.kind in "fc") for f in fs)
        object.__setattr__(self, "_specs", specs)
        object.__setattr__(self, "_names", frozenset(names))
        # the names and observation names, asked on every batch: computed once (a schema is frozen)
        object.__setattr__(self, "_order", (tuple(names), tuple(n for n in names if n == "obs" or n.startswith("obs/"))))

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def transition(
        cls,
        obs_shape: tuple[int, ...],
        obs_dtype: Any = np.float32,
        action_shape: tuple[int, ...] = (),
        action_dtype: Any = np.int64,
        extra: Iterable[Field] = (),
    ) -> Schema:
        """The usual RL row: obs, action, reward (float32), terminated and truncated (bool)."""
        return cls(
            [
                Field("obs", np.dtype(obs_dtype), tuple(obs_shape)),
                Field("action", np.dtype(action_dtype), tuple(action_shape)),
                Field("reward", np.dtype(np.float32)),
                Field("terminated", np.dtype(np.bool_)),
                Field("truncated", np.dtype(np.bool_)),
                *extra,
            ]
        )

    @classmethod
    def from_spaces(
        cls,
        observation_space: Any,
        action_space: Any,
        extra: Iterable[Field] = (),
        reward_dtype: Any = np.float64,
    ) -> Schema:
        """A transition schema from gymnasium spaces (single-env spaces, not batched ones).

        The reward is float64 by default, the dtype gymnasium's vector envs return, so a
        plain ``env.step`` result is written without casts.

        Box, Discrete, MultiDiscrete and MultiBinary map to one field each; a Dict observation
        space is flattened to ``obs/<key>`` fields (nested keys joined by ``/``).
        """
        obs_fields = _space_fields("obs", observation_space)
        (act,) = _space_fields("action", action_space)
        return cls(
            [
                *obs_fields,
                act,
                Field("reward", np.dtype(reward_dtype)),
                Field("terminated", np.dtype(np.bool_)),
                Field("truncated", np.dtype(np.bool_)),
                *extra,
            ]
        )

    # -- views -----------------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        """Every field's name, in the schema's order (the order of a row's record)."""
        return self._order[0]

    @property
    def box_actions(self) -> bool:
        """Whether the ``action`` field holds continuous (Box) actions: a float dtype."""
        return "action" in self and self["action"].dtype.kind == "f"

    @property
    def obs_names(self) -> tuple[str, ...]:
        """Observation fields: ``obs`` and ``obs/...``."""
        return self._order[1]

    def __getitem__(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    @property
    def row_bytes(self) -> int:
        """Bytes of one row's payload: the sum of the fields' ``row_bytes`` (no padding, no stamp)."""
        return sum(f.row_bytes for f in self.fields)

    def to_json(self) -> list[dict[str, Any]]:
        """The schema as JSON (one ``Field.to_json`` per field, in order), as STORE.json records it."""
        return [f.to_json() for f in self.fields]

    @classmethod
    def from_json(cls, data: list[dict[str, Any]]) -> Schema:
        """The schema ``to_json`` wrote; a malformed description is a ``SchemaError``."""
        try:
            return cls(Field(d["name"], np.dtype(d["dtype"]), tuple(d["shape"])) for d in data)
        except (KeyError, TypeError) as exc:
            raise SchemaError(f"malformed schema description: {exc}") from exc

    @property
    def hash(self) -> int:
        """A stable 64-bit hash of the canonical schema."""
        blob = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()
        return int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "little")

    def require_transition_fields(self) -> None:
        """Raise ``SchemaError`` unless the fields transition sampling needs are present."""
        missing = [n for n in ("action", "reward", "terminated", "truncated") if n not in self]
        if not self.obs_names:
            missing.insert(0, "obs")
        if missing:
            raise SchemaError(f"transition sampling needs fields {missing}; the schema has {list(self.names)}")

    # -- validation ------------------------------------------------------------------------
    def validate_batch(
        self,
        batch: Mapping[str, Any],
        lead: tuple[int, ...] | None = None,
        *,
        cast: Cast = "no",
        nonfinite: NonFinite = "error",
    ) -> tuple[dict[str, np.ndarray], tuple[int, ...]]:
        """Check a batch and return its arrays, in schema order, plus the leading shape.

        ``lead`` is the expected leading shape (e.g. ``(lanes,)`` or ``(T, lanes)``); when
        ``None`` it is taken from the first field and must be the same for every field. Nothing
        is modified; raises ``SchemaError`` or ``InvalidValueError`` naming the field.
        """
        if len(batch) != len(self._specs) or not self._names.issuperset(batch):
            missing = [n for n in self.names if n not in batch]
            extra = [k for k in batch if k not in self._names]
            raise SchemaError(f"batch fields do not match the schema: missing {missing}, unexpected {extra}")
        out: dict[str, np.ndarray] = {}
        for name, dtype, shape, nshape, floating in self._specs:
            x = batch[name]
            if type(x) is not np.ndarray:
                weak = _weak(x)
                x = np.asarray(x)
                if weak and x.dtype != dtype and dtype.kind in "fc" and x.dtype.kind in "biuf":
                    # a plain Python number (what a gymnasium env returns as a reward) takes the field's
                    # float dtype, as NumPy's weak scalars do (NEP 50); numpy values keep the strict rule
                    x = x.astype(dtype)
            if x.dtype is not dtype and x.dtype != dtype:
                x = _cast(self[name], x, cast)
            nd = x.ndim - nshape
            if nd < 0 or (nshape and x.shape[nd:] != shape):
                raise SchemaError(
                    f"field {name!r}: expected shape (*batch, {', '.join(map(str, shape))}) "
                    f"with trailing {shape}, got {x.shape}"
                )
            got_lead = x.shape[:nd] if nshape else x.shape
            if lead is None:
                lead = got_lead
            elif got_lead != lead:
                raise SchemaError(f"field {name!r}: expected leading shape {lead}, got {got_lead} (shape {x.shape})")
            if floating and nonfinite != "allow" and not _all_finite(x):
                bad = np.argwhere(~np.isfinite(x))[0]
                msg = f"field {name!r} has a non-finite value {x[tuple(bad)]!r} at index {tuple(int(i) for i in bad)}"
                if nonfinite == "error":
                    raise InvalidValueError(msg + "; nothing was written")
                import logging

                logging.getLogger(__name__).warning("%s (written, nonfinite='warn')", msg)
            out[name] = x
        assert lead is not None
        return out, lead


def _weak(x: Any) -> bool:
    """A plain Python number, or a flat list or tuple of them (no numpy value among them)."""
    if isinstance(x, (list, tuple)):
        return bool(x) and all(type(v) in (bool, int, float) for v in x)
    return type(x) in (bool, int, float)


def _all_finite(x: np.ndarray) -> bool:
    # A sum is non-finite whenever an element is; the sum in float64 cannot overflow for float32
    # data, so a finite sum proves every element finite. A non-finite sum is rechecked exactly.
    s = float(np.add.reduce(x, axis=None, dtype=np.float64 if x.dtype.itemsize < 8 else None).real)
    return math.isfinite(s) or bool(np.isfinite(x).all())


def _cast(f: Field, x: np.ndarray, cast: Cast) -> np.ndarray:
    if x.dtype.hasobject:
        raise SchemaError(f"field {f.name!r}: expected dtype {f.dtype}, got object array")
    if cast != "no" and np.can_cast(x.dtype, f.dtype, cast):
        return x.astype(f.dtype)
    allowed = [c for c in ("safe", "same_kind") if np.can_cast(x.dtype, f.dtype, c)]
    hint = f" (cast={allowed[0]!r} would accept it)" if allowed and cast == "no" else ""
    raise SchemaError(f"field {f.name!r}: expected dtype {f.dtype}, got {x.dtype}{hint}")


def _space_fields(name: str, space: Any) -> list[Field]:
    from gymnasium import spaces  # lazy: gymnasium is only needed for from_spaces

    if isinstance(space, spaces.Dict):
        out: list[Field] = []
        for key, sub in space.spaces.items():
            out.extend(_space_fields(f"{name}/{key}", sub))
        return out
    if isinstance(space, spaces.Box):
        return [Field(name, np.dtype(space.dtype), tuple(space.shape))]
    if isinstance(space, spaces.Discrete):
        return [Field(name, np.dtype(np.int64), ())]
    if isinstance(space, (spaces.MultiDiscrete, spaces.MultiBinary)):
        return [Field(name, np.dtype(space.dtype), tuple(space.shape))]
    raise SchemaError(f"field {name!r}: gymnasium space {space!r} is not supported (Box, Discrete, MultiDiscrete, MultiBinary, Dict)")
