"""Compiled hot loops (numba): uniform transition sampling with the gather in the same pass.

numpy needs some thirty calls to draw, locate, validate and gather a batch of transitions, and
their fixed cost dominates a batch of 256 small rows; this kernel does it in one call. It works on
raw bytes: the reader's whole address region as one ``uint8`` array, and per field its byte
offset in the record and its length, so one compiled function serves every schema. Each row's
fields are copied straight into one output buffer laid out field by field, which the caller views
as contiguous arrays.

Imported lazily (``import mmreplay`` does not load numba).
"""

from __future__ import annotations

import numba
import numpy as np
from numba.core import cgutils, types
from numba.extending import intrinsic

from ..storage import MASKED


@intrinsic
def _memcpy(typingctx, dst, dst_off, src, src_off, n):  # pragma: no cover - compiled
    """LLVM's memcpy between two byte arrays (about 3x faster than a word loop for frame-sized
    fields in ``python benchmarks/atari.py`` when it was written; an intrinsic rather than a
    ctypes call, so the kernels stay cacheable)."""
    sig = types.void(dst, types.intp, src, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        d, doff, s, soff, count = args
        da = context.make_array(signature.args[0])(context, builder, d)
        sa = context.make_array(signature.args[2])(context, builder, s)
        cgutils.raw_memcpy(builder, builder.gep(da.data, [doff]), builder.gep(sa.data, [soff]), count, 1)

    return sig, codegen

# columns of the segment table (one row per snapshot segment; built by StoreReader.segment_table)
from ..storage import (  # noqa: E402, F401  (re-exported for the other kernels)
    SEG_BASE,
    SEG_COLS,
    SEG_COMMITTED,
    SEG_CUM_END,
    SEG_FIRST,
    SEG_ID,
    SEG_LANES,
    SEG_BUCKET,
    SEG_NBUCKETS,
    SEG_PRED,
    SEG_SHIFT,
    SEG_SUCC,
    SEG_USABLE,
)

# columns of the field table: offset in record, length, offset in the output buffer, is "next" copy
F_REC_OFF, F_LEN, F_OUT_OFF, F_NEXT = range(4)


@numba.njit(nogil=True, cache=True, inline="always")
def _next_u64(state):  # pragma: no cover - compiled
    """xoshiro256** step on a 4-word state (Blackman & Vigna)."""
    s0, s1, s2, s3 = state[0], state[1], state[2], state[3]
    x = s1 * np.uint64(5)
    result = ((x << np.uint64(7)) | (x >> np.uint64(57))) * np.uint64(9)
    t = s1 << np.uint64(17)
    s2 ^= s0
    s3 ^= s1
    s1 ^= s2
    s0 ^= s3
    s2 ^= t
    s3 = (s3 << np.uint64(45)) | (s3 >> np.uint64(19))
    state[0], state[1], state[2], state[3] = s0, s1, s2, s3
    return result


@numba.njit(nogil=True, cache=True)
def draw(state, n, total, out):  # pragma: no cover - compiled
    """``n`` uniform integers in ``[0, total)`` into ``out`` (unbiased: rejects the short tail)."""
    t = np.uint64(total)
    limit = np.uint64(0xFFFFFFFFFFFFFFFF) - (np.uint64(0xFFFFFFFFFFFFFFFF) % t)
    i = 0
    while i < n:
        x = _next_u64(state)
        if x < limit:
            out[i] = np.int64(x % t)
            i += 1
    return out


@numba.njit(nogil=True, cache=True, boundscheck=False)
def sample_transitions(state, nrand, start, seg, region, rec_bytes, is_last_off, seg_records, fields, out, ids,
                       big):  # pragma: no cover - compiled
    """Fill rows ``start..len(ids)`` with uniform transitions from ``nrand`` draws.

    Draws come from the xoshiro256** ``state`` (4 uint64 words, advanced in place), seeded by
    the sampler from its numpy generator: same seed, same batches.

    Returns ``(filled, used, touched)``: rows filled so far, draws consumed, and a checksum of
    the prefetch pass (returned so the compiler keeps its loads). ``filled < len(ids)``
    means the draws ran out (call again).

    Three passes, so that the cache misses of different draws overlap (memory-level
    parallelism) instead of queueing behind each other: locate every draw using only the
    small segment table; read every candidate's ``is_last`` flag and touch its next record;
    then copy the fields of the valid ones.
    """
    r4 = region.view(np.uint32)
    r8 = region.view(np.uint64)
    o4 = out.view(np.uint32)
    o8 = out.view(np.uint64)
    batch = ids.shape[0]
    ks, slots = draw_rows(state, nrand, seg)
    roffs = np.empty(nrand, np.int64)
    noffs = np.empty(nrand, np.int64)
    rid = np.empty(nrand, np.int64)
    for j in range(nrand):
        k = ks[j]
        slot = slots[j]
        roffs[j] = seg[k, SEG_BASE] + slot * rec_bytes
        rid[j] = seg[k, SEG_ID] * seg_records + slot
        nxt = slot + seg[k, SEG_LANES]
        noffs[j] = -1
        if nxt < seg[k, SEG_COMMITTED]:
            noffs[j] = seg[k, SEG_BASE] + nxt * rec_bytes
        else:
            s = seg[k, SEG_SUCC]
            ns = nxt - seg[k, SEG_USABLE]
            if ns >= 0 and s >= 0 and ns < seg[s, SEG_COMMITTED]:
                noffs[j] = seg[s, SEG_BASE] + ns * rec_bytes
    ok = np.empty(nrand, np.uint8)
    touched = 0
    for j in range(nrand):
        # a short loop of independent loads: the misses overlap. It also brings both ends of
        # both records into the cache for the copy pass below.
        r = roffs[j]
        n_ = noffs[j] if noffs[j] >= 0 else r
        touched += region[r] + region[r + rec_bytes - 1] + region[n_] + region[n_ + rec_bytes - 1]
        # not a final observation (nor masked) itself, and its next row written and not masked
        ok[j] = (region[r + is_last_off] == 0) & (noffs[j] >= 0) & (region[n_ + is_last_off] != MASKED)
    i = start
    j = 0
    while i < batch and j < nrand:
        if ok[j]:
            ids[i] = rid[j]
            if big:
                _copy_row_big(region, r4, r8, out, o4, o8, fields, i, roffs[j], noffs[j])
            else:
                _copy_row(region, r4, r8, out, o4, o8, fields, i, roffs[j], noffs[j])
            i += 1
        j += 1
    return i, j, touched


@numba.njit(nogil=True, cache=True, boundscheck=False, inline="always")
def copy_small(region, r4, r8, out, o4, o8, src, dst, n):  # pragma: no cover - compiled
    """Copy ``n`` bytes in the widest words both ends are aligned to (two to six times faster
    than slice or byte copies for small fields); ``r4``/``r8``, ``o4``/``o8`` are word views."""
    if ((src | dst | n) & 7) == 0:
        for w in range(n >> 3):
            o8[(dst >> 3) + w] = r8[(src >> 3) + w]
    elif ((src | dst | n) & 3) == 0:
        for w in range(n >> 2):
            o4[(dst >> 2) + w] = r4[(src >> 2) + w]
    else:
        for b in range(n):
            out[dst + b] = region[src + b]


@numba.njit(nogil=True, cache=True, boundscheck=False, inline="always")
def copy_bytes(region, r4, r8, out, o4, o8, src, dst, n):  # pragma: no cover - compiled
    """Copy ``n`` bytes: LLVM memcpy for large fields (frames), word copies for small ones."""
    if n >= 128:
        _memcpy(out, dst, region, src, n)
    else:
        copy_small(region, r4, r8, out, o4, o8, src, dst, n)


@numba.njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _copy_row(region, r4, r8, out, o4, o8, fields, i, roff, noff):  # pragma: no cover - compiled
    """Copy every planned field of one transition into row ``i`` of the output blocks, in the
    widest words both ends are aligned to. Written out (not calling ``copy_small``) and free of
    memcpy: either made LLVM optimise this loop far worse (33 -> 83 us per batch of 256 vector
    rows in ``python benchmarks/run.py``'s sampling phase, timed when it was written); plans with frame-sized fields use ``_copy_row_big``."""
    for f in range(fields.shape[0]):
        n = fields[f, F_LEN]
        src = (noff if fields[f, F_NEXT] else roff) + fields[f, F_REC_OFF]
        dst = fields[f, F_OUT_OFF] + i * n
        if ((src | dst | n) & 7) == 0:
            for w in range(n >> 3):
                o8[(dst >> 3) + w] = r8[(src >> 3) + w]
        elif ((src | dst | n) & 3) == 0:
            for w in range(n >> 2):
                o4[(dst >> 2) + w] = r4[(src >> 2) + w]
        else:
            for b in range(n):
                out[dst + b] = region[src + b]


@numba.njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _copy_row_big(region, r4, r8, out, o4, o8, fields, i, roff, noff):  # pragma: no cover - compiled
    """``_copy_row`` for plans with frame-sized fields: those go through memcpy."""
    for f in range(fields.shape[0]):
        n = fields[f, F_LEN]
        src = (noff if fields[f, F_NEXT] else roff) + fields[f, F_REC_OFF]
        copy_bytes(region, r4, r8, out, o4, o8, src, fields[f, F_OUT_OFF] + i * n, n)


@numba.njit(nogil=True, cache=True, boundscheck=False)
def gather_at(seg, region, rec_bytes, ks, slots, fields, out, big):  # pragma: no cover - compiled
    """Copy the transitions starting at snapshot segment ``ks[i]``, row ``slots[i]`` (each known
    to be a valid transition start) into the output blocks; prefetch pass first, as above."""
    r4 = region.view(np.uint32)
    r8 = region.view(np.uint64)
    o4 = out.view(np.uint32)
    o8 = out.view(np.uint64)
    b = ks.shape[0]
    roffs = np.empty(b, np.int64)
    noffs = np.empty(b, np.int64)
    touched = 0
    for i in range(b):
        k = ks[i]
        slot = slots[i]
        roffs[i] = seg[k, SEG_BASE] + slot * rec_bytes
        nxt = slot + seg[k, SEG_LANES]
        if nxt < seg[k, SEG_COMMITTED]:
            noffs[i] = seg[k, SEG_BASE] + nxt * rec_bytes
        else:
            noffs[i] = seg[seg[k, SEG_SUCC], SEG_BASE] + (nxt - seg[k, SEG_USABLE]) * rec_bytes
        touched += region[roffs[i]] + region[roffs[i] + rec_bytes - 1] + region[noffs[i]] + region[noffs[i] + rec_bytes - 1]
    if big:
        for i in range(b):
            _copy_row_big(region, r4, r8, out, o4, o8, fields, i, roffs[i], noffs[i])
    else:
        for i in range(b):
            _copy_row(region, r4, r8, out, o4, o8, fields, i, roffs[i], noffs[i])
    return touched


@numba.njit(nogil=True, cache=True, boundscheck=False)
def draw_rows(state, n, seg):  # pragma: no cover - compiled
    """``n`` committed rows drawn uniformly, as (snapshot segment index, slot), located through
    the table's draw index (``storage.snapshot.index_draws``)."""
    nseg = seg.shape[0]
    rand = draw(state, n, seg[nseg - 1, SEG_CUM_END], np.empty(n, np.int64))
    ks = np.empty(n, np.int64)
    slots = np.empty(n, np.int64)
    shift = seg[0, SEG_SHIFT]
    for j in range(n):
        u = rand[j]
        b = u >> shift
        lo = seg[b // SEG_NBUCKETS, SEG_BUCKET + b % SEG_NBUCKETS]
        while seg[lo, SEG_CUM_END] <= u:
            lo += 1
        ks[j] = lo
        slots[j] = u - (seg[lo, SEG_CUM_END] - seg[lo, SEG_COMMITTED])
    return ks, slots
