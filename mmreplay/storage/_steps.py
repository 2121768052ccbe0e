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
    from collections.abc import Mapping

    from ..core.schema import Schema
    from .format import Layout


class StepSpec:
    """The exact form of one step of ``lanes`` lanes of ``schema`` (``nonfinite="allow"``: floats
    are not checked)."""

    def __init__(self, schema: Schema, layout: Layout, lanes: int, nonfinite: str) -> None:
        rec_names = list(layout.record_dtype.names)
        self.is_last_pos = rec_names.index("is_last")
        """Where ``is_last`` sits among the record's fields (a single row is one structured record)."""
        self.rec_names = [n for n in rec_names if n != "is_last"]
        self.nfields = len(schema.names)
        self.specs = [(n, schema[n].dtype, (lanes, *schema[n].shape)) for n in self.rec_names]
        check = nonfinite != "allow"
        # float fields checked on the way in: a few floats sum faster as Python floats
        self.float_checks = [] if not check else [
            (f.name, f.dtype.itemsize < 8, (1 if not f.shape else 2) if f.dtype.kind == "f"
             and lanes * int(np.prod(f.shape)) <= 64 else 0)
            for f in schema.fields if f.dtype.kind in "fc"]
        # per field of a single-lane row, how its value's floats are checked: 0 not at all, 1 a
        # scalar, 2 a few values summed as Python floats, 3 a reduction
        self.row_specs = None if lanes != 1 or any(f.dtype.kind == "c" for f in schema.fields) else [
            (n, dtype, shape, 0 if dtype.kind != "f" or not check else 1 if len(shape) == 1 else
             2 if len(shape) == 2 and shape[1] <= 64 else 3)
            for n, dtype, shape in self.specs]

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

    def row_values(self, data: Mapping[str, Any]) -> list[Any] | None:
        """A single-lane step's values in record order (``is_last`` not among them), if the step
        is exact with finite floats; else ``None``. Needs ``row_specs`` (one lane, no complex field)."""
        if len(data) != self.nfields:
            return None
        vals = []
        for name, dtype, shape, floats in self.row_specs:  # type: ignore[union-attr]
            x = data.get(name)
            if type(x) is not np.ndarray or x.dtype is not dtype or x.shape != shape:
                return None
            v = x[0]
            if floats and not math.isfinite(v if floats == 1 else sum(v.tolist()) if floats == 2 else
                                            float(np.add.reduce(v, axis=None, dtype=np.float64))):
                return None
            vals.append(v)
        return vals
