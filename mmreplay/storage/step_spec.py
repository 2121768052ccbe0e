"""Recognising a step as it usually comes: the writer's validation without copies.

A step handed to ``Writer.add`` is usually every field of the schema with its exact dtype and
shape, and finite floats. :class:`StepSpec` recognises such a step in a few attribute checks per
field (``exact``), or returns a single-lane step's values in record order, ready for one
structured record assignment (``row_values``). Anything else returns ``None`` and goes through
the schema's full validation (``Schema.validate_batch``), which casts it or explains the error:
these checks only ever send a step to the slow path, never let a wrong one through.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from ..core.schema import Schema
    from .format import Layout


class StepSpec:
    """The exact form of one step of ``lanes`` lanes of ``schema`` (``nonfinite="allow"``: floats
    are not checked)."""

    def __init__(self, schema: Schema, layout: Layout, lanes: int, nonfinite: str) -> None:
        self.nfields = len(schema.names)
        self.specs = [(n, schema[n].dtype, (lanes, *schema[n].shape)) for n in layout.record_dtype.names
                      if n != "is_last"]
        check = nonfinite != "allow"
        # float fields checked on the way in: a few floats sum faster as Python floats
        self.float_checks = [] if not check else [
            (f.name, f.dtype.itemsize < 8, (1 if not f.shape else 2) if f.dtype.kind == "f"
             and lanes * int(np.prod(f.shape)) <= 64 else 0)
            for f in schema.fields if f.dtype.kind in "fc"]
        self.row_bytes: Callable[[Mapping[str, Any], bytes], bytes | None] | None = None
        """A single-lane step as its record's bytes (see ``_row_bytes``); ``None``: not available."""
        if lanes == 1 and not any(f.dtype.kind == "c" for f in schema.fields) and all(
                schema[n].dtype == np.bool_ for n in ("terminated", "truncated") if n in schema):
            self.row_bytes = _row_bytes(schema, layout, check)
            rec = layout.record_dtype
            self.row_done = (rec.fields["terminated"][1], rec.fields["truncated"][1])
            """Where ``terminated`` and ``truncated`` sit in the record (one byte each)."""

    def exact(self, data: Mapping[str, Any], floats: bool) -> Mapping[str, Any] | None:
        """``data`` if it is one step exactly as stored (every field, exact dtypes and shapes, and
        with ``floats`` finite floats), else ``None``. Without ``floats`` the caller checks the
        copied rows' float runs."""
        if len(data) != self.nfields:
            return None
        for name, dtype, shape in self.specs:
            x = data.get(name)
            if type(x) is not np.ndarray or x.dtype is not dtype or x.shape != shape:
                return None
        for name, single, small in self.float_checks if floats else ():
            # a non-finite value makes the sum non-finite; a finite sum that overflowed only
            # sends the step to the exact check of the full validation
            x = data[name]
            if not math.isfinite(sum(x.tolist() if small == 1 else x.ravel().tolist()) if small else
                                 float(np.add.reduce(x, axis=None, dtype=np.float64 if single else None).real)):
                return None
        return data


def _row_bytes(schema: Schema, layout: Layout, check: bool) -> Callable[..., Any]:
    """Compile, for this schema, the check of a single-lane step that returns its record as bytes.

    The returned function takes the step's mapping and the ``is_last`` byte, and returns the
    record: per record field in offset order the padding before it and the field's bytes, then the
    record's tail padding, in one ``b"".join``. It returns ``None`` unless every field is there
    with its exact dtype and shape (lanes = 1) and every float is finite, so the general path
    casts or explains. Written out per schema, one check per field and no loop (a loop over a
    field table cost twice as much per ``add``), like ``dataclasses`` writes ``__init__``; only
    constants bound by name enter the code."""
    rec = layout.record_dtype
    env: dict[str, Any] = {"_nd": np.ndarray, "_isf": math.isfinite, "_reduce": np.add.reduce, "_f64": np.float64}
    checks, floats, parts = [], [], []
    end = 0
    for name in sorted(rec.names, key=lambda n: rec.fields[n][1]):
        off = rec.fields[name][1]
        if off > end:
            env[f"_g{len(parts)}"] = bytes(off - end)
            parts.append(f"_g{len(parts)}")
        end = off + rec.fields[name][0].itemsize
        if name not in schema:  # is_last
            parts.append("is_last")
            continue
        f, k = schema[name], len(checks)
        env[f"_d{k}"], env[f"_s{k}"] = f.dtype, (1, *f.shape)
        checks.append(f"    x{k} = data.get({name!r})\n"
                      f"    if type(x{k}) is not _nd or x{k}.dtype is not _d{k} or x{k}.shape != _s{k}:\n"
                      f"        return None\n")
        if check and f.dtype.kind == "f":
            size = int(np.prod(f.shape, dtype=np.int64))
            floats.append(f"x{k}[0]" if not f.shape else f"sum(x{k}[0].tolist())" if len(f.shape) == 1 and size <= 64
                          else f"float(_reduce(x{k}, axis=None, dtype=_f64))")
        parts.append(f"x{k}.tobytes()")
    if end < rec.itemsize:
        env["_tail"] = bytes(rec.itemsize - end)
        parts.append("_tail")
    src = (f"def row_bytes(data, is_last):\n    if len(data) != {len(checks)}:\n        return None\n" + "".join(checks)
           + "".join(f"    if not _isf({e}):\n        return None\n" for e in floats)
           + f"    return b''.join(({', '.join(parts)},))\n")
    exec(compile(src, f"<mmreplay row_bytes of schema {schema.hash:x}>", "exec"), env)  # noqa: S102 - code from constants
    return env["row_bytes"]

