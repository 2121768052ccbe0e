"""Compiled I/O kernels for the tiers (``tiers.py``): page prefetch hints for the rows a batch
will read, and a loop of ``pread`` calls (the disk's random-read limit in the benchmark).

``madvise`` and ``pread`` are called straight from compiled code (declared as external C
symbols, resolved in the process's libc), so a whole batch of hints is one call that releases
the GIL, and the kernels stay cacheable (a ctypes function pointer would make numba refuse to
cache them). Imported lazily, like every numba module.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from .transition_kernels import SEG_BASE
from .window_kernels import _pred, _succ

PAGE = 4096
_MERGE_GAP = 4 * PAGE  # read up to this many bytes between two rows rather than make another call


@intrinsic
def _madvise(typingctx, addr, length, advice):  # pragma: no cover - compiled
    sig = types.int32(types.int64, types.int64, types.int32)

    def codegen(context, builder, signature, args):
        a, n, adv = args
        i8p = ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.IntType(32), [i8p, ir.IntType(64), ir.IntType(32)])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "madvise")
        return builder.call(fn, [builder.inttoptr(a, i8p), n, adv])

    return sig, codegen


@intrinsic
def _pread(typingctx, fd, buf, count, offset):  # pragma: no cover - compiled
    sig = types.int64(types.int32, types.int64, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        f, b, c, o = args
        i8p = ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.IntType(64), [ir.IntType(32), i8p, ir.IntType(64), ir.IntType(64)])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "pread")
        return builder.call(fn, [f, builder.inttoptr(b, i8p), c, o])

    return sig, codegen


@numba.njit(nogil=True, cache=True, boundscheck=False)
def advise_windows(seg, base, rec_bytes, back, fwd, ks, slots, advice):  # pragma: no cover - compiled
    """``madvise(advice)`` the records a view of each start ``(ks[j], slots[j])`` reads: ``back``
    rows before it (frame stacks) and ``fwd`` rows after it (next observation, n-step
    lookahead) along its lane, across the session's segment boundaries. Rows closer than
    ``_MERGE_GAP`` share one call. ``base`` is the address of the region. Returns the number
    of calls made. Only advises: never reads the rows (no page fault here)."""
    calls = 0
    for j in range(ks.shape[0]):
        k = ks[j]
        s = slots[j]
        for _ in range(back):
            pk, ps = _pred(seg, k, s)
            if pk < 0:
                break
            k, s = pk, ps
        lo = -1
        hi = -1
        for _ in range(back + fwd + 1):
            a = base + seg[k, SEG_BASE] + s * rec_bytes
            plo = a - (a % PAGE)
            if lo >= 0 and plo >= lo and plo <= hi + _MERGE_GAP:
                hi = max(hi, a + rec_bytes)
            else:
                if lo >= 0:
                    _madvise(lo, hi - lo, np.int32(advice))
                    calls += 1
                lo = plo
                hi = a + rec_bytes
            nk, ns = _succ(seg, k, s)
            if nk < 0:
                break
            k, s = nk, ns
        if lo >= 0:
            _madvise(lo, hi - lo, np.int32(advice))
            calls += 1
    return calls


@numba.njit(nogil=True, cache=True, boundscheck=False)
def pread_at(fds, offsets, length, buf_addr):  # pragma: no cover - compiled
    """``pread(fds[j], buf, length, offsets[j])`` for every ``j`` into one scratch buffer;
    returns the bytes read (the benchmark's random-read limit: one thread per queue slot)."""
    total = 0
    for j in range(fds.shape[0]):
        n = _pread(np.int32(fds[j]), buf_addr, length, offsets[j])
        if n > 0:
            total += n
    return total
