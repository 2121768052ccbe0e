"""Compiled views over a lane's consecutive rows: n-step returns and frame stacks.

A view of a transition starting at row ``t`` walks the lane forward for the n-step return and
backward for frame stacks, across segment boundaries of the same writer session:

* n-step: ``G = sum_{m<M} gamma^m r_{t+m}`` where ``M <= n`` stops at the first ``terminated``
  row (no bootstrap: discount 0) or where the next row is an episode's final observation
  (``is_last``: the episode was truncated or ended, bootstrap from it), else after ``n`` rows;
  ``next_obs`` is the observation of row ``t+M`` and ``discount = gamma^M`` (0 if terminated).
  A start whose lookahead is not written yet is not a valid transition (not sampled);
* frame stacks: the ``k`` observations ending at a row, oldest first, clamped at the episode's
  first row (repeated), which is the row after an ``is_last`` row or the first row of the lane's
  session;
* a window that needs a **masked** row (a damaged row, its ``is_last`` byte ``MASKED`` in the
  reader's view, ``storage.checks``), or a stack that would step back into a segment of the
  session no longer in the snapshot (evicted, quarantined: whether the episode went on there is
  unknown), is left out, never shortened or clamped: a view serves only what was written;
* but a masked row is known to be an episode's final observation (``stack_rows``) when the
  previous row of its lane is in the snapshot, neither masked nor final, and flagged
  ``terminated`` or ``truncated``: a writer flags the row after such a step ``is_last``
  (``storage.writer``; exports infer the same, ``core.episodes.masked_last``). A stack stepping
  back to it is clamped there, as at any final observation: the next episode's stacks do not
  need it and are served. The windows that read it (its predecessor's next_obs, n-step windows
  bootstrapping from it) stay left out. Where the previous row is masked, gone, the session's
  start or not flagged (a final observation written by ``Writer.end_episodes`` follows an
  unflagged step), it is not known, and a stack stepping back to it is left out. Transition
  sampling needs ``terminated`` and ``truncated`` (``Schema.require_transition_fields``), so
  every schema these kernels see has them.

Row addresses are ``(snapshot segment index, slot)``; the next row of a lane is ``lanes`` slots
on, in the session's next segment past the end (``SEG_SUCC``), the previous one ``lanes`` slots
back (``SEG_PRED``). Imported lazily.
"""

from __future__ import annotations

import numba
import numpy as np

from .transition_kernels import (
    F_LEN,
    F_NEXT,
    F_OUT_OFF,
    F_REC_OFF,
    SEG_BASE,
    SEG_COMMITTED,
    SEG_FIRST,
    SEG_ID,
    SEG_LANES,
    SEG_PRED,
    SEG_SUCC,
    SEG_USABLE,
    copy_bytes,
    draw_rows,
)
from ..storage import MASKED
from ..storage import storage_kernels as storage_kernel

# StoreReader.locate's compiled lookup (global row id -> snapshot segment, slot), storage's own, called
# here so that explicit starts are located and gathered in one call
_locate_ids = storage_kernel().locate_ids

# what a start's window is: complete, incomplete (not a start, lookahead not written), or blocked
# by damage (it needs a masked row, or a stack reaches a segment no longer there)
WINDOW_OK, WINDOW_NONE, WINDOW_BLOCKED = 1, 0, -1

# F_NEXT values in a windowed plan: which row a field is copied from; ROW_SHARED: the start's
# stack followed by the next row's frame (one-step views share frames between obs and next_obs)
ROW_START, ROW_NEXT, ROW_SHARED = 0, 1, 2


@numba.njit(nogil=True, cache=True, inline="always")
def _succ(seg, k, slot):  # pragma: no cover - compiled
    nxt = slot + seg[k, SEG_LANES]
    if nxt < seg[k, SEG_COMMITTED]:
        return k, nxt
    s = seg[k, SEG_SUCC]
    ns = nxt - seg[k, SEG_USABLE]
    if ns >= 0 and s >= 0 and ns < seg[s, SEG_COMMITTED]:
        return s, ns
    return -1, -1


@numba.njit(nogil=True, cache=True, inline="always")
def _pred(seg, k, slot):  # pragma: no cover - compiled
    """The previous row of the lane; ``(-1, -1)`` at the start of the session, ``(-2, -2)`` when
    it lies in a segment of the session no longer in the snapshot (``storage.snapshot.PRED_GONE``)."""
    prv = slot - seg[k, SEG_LANES]
    if prv >= 0:
        return k, prv
    p = seg[k, SEG_PRED]
    if p < 0:
        return p, p
    return p, seg[p, SEG_USABLE] + prv


@numba.njit(nogil=True, cache=True, boundscheck=False)
def walk(seg, region, f4, f8, rec_bytes, flags, rew, n_step, gamma, k, slot):  # pragma: no cover - compiled
    """The n-step window from row ``(k, slot)``.

    ``flags`` = byte offsets in a record of is_last, terminated, truncated; ``rew`` = (byte
    offset of the reward, 4 or 8 for float32/float64). Returns ``(code, next_k, next_slot,
    return, discount, terminated, truncated)``, ``code`` one of ``WINDOW_OK``, ``WINDOW_NONE``
    (not a start, or the lookahead is not written) and ``WINDOW_BLOCKED`` (a row it needs,
    the bootstrap row included, is masked).
    """
    rec = seg[k, SEG_BASE] + slot * rec_bytes
    if region[rec + flags[0]] != 0:  # an episode's final observation (or a masked row) starts nothing
        return WINDOW_NONE, -1, -1, 0.0, 0.0, False, False
    g = 0.0
    disc = 1.0
    m = 0
    while True:
        rec = seg[k, SEG_BASE] + slot * rec_bytes
        if rew[1] == 4:
            r = f4[(rec + rew[0]) >> 2]
        else:
            r = f8[(rec + rew[0]) >> 3]
        g += disc * r
        nk, ns = _succ(seg, k, slot)
        if nk < 0:
            return WINDOW_NONE, -1, -1, 0.0, 0.0, False, False
        nrec = seg[nk, SEG_BASE] + ns * rec_bytes
        nflag = region[nrec + flags[0]]
        if nflag == MASKED:
            return WINDOW_BLOCKED, -1, -1, 0.0, 0.0, False, False
        if region[rec + flags[1]] != 0:
            return WINDOW_OK, nk, ns, g, 0.0, True, False
        disc *= gamma
        m += 1
        if nflag != 0:
            return WINDOW_OK, nk, ns, g, disc, False, region[rec + flags[2]] != 0
        if m == n_step:
            return WINDOW_OK, nk, ns, g, disc, False, False
        k, slot = nk, ns


@numba.njit(nogil=True, cache=True, boundscheck=False)
def stack_rows(seg, region, rec_bytes, flags, frames, k, slot, ks, slots):  # pragma: no cover - compiled
    """Rows of the ``frames`` observations ending at ``(k, slot)``, oldest first, clamped at the
    episode start, into ``ks``/``slots``. ``flags``: record offsets of is_last, terminated,
    truncated. Returns False (the stack is not served) when a row it would step back to lies in a
    segment no longer in the snapshot, or is masked and not known to be a final observation. A
    masked row is known to be one when the previous row of its lane is in the snapshot, an
    ordinary step (``is_last`` byte 0: neither final nor masked) and flagged terminated or
    truncated (module docstring): the stack is clamped there, as at any final observation.

    The one place this rule is written (every kernel deciding whether a stack is served calls
    this), and written inline: with a call on this path, ``valid_starts`` over every row took
    twice the time."""
    is_last_off = flags[0]
    ks[frames - 1] = k
    slots[frames - 1] = slot
    for j in range(frames - 2, -1, -1):
        pk, ps = _pred(seg, k, slot)
        if pk >= 0:
            flag = region[seg[pk, SEG_BASE] + ps * rec_bytes + is_last_off]
            if flag == 0:
                k, slot = pk, ps
            elif flag == MASKED:  # a final observation only if the step before it ended the episode
                qk, qs = _pred(seg, pk, ps)
                if qk < 0:
                    return False
                q = seg[qk, SEG_BASE] + qs * rec_bytes
                if region[q + is_last_off] != 0 or (region[q + flags[1]] == 0 and region[q + flags[2]] == 0):
                    return False
        elif pk != -1:  # the session's earlier segment is gone: is this the episode's start?
            return False
        ks[j] = k
        slots[j] = slot
    return True


@numba.njit(nogil=True, cache=True, boundscheck=False)
def window_served(seg, region, f4, f8, rec_bytes, flags, rew, n_step, gamma, frames, k, slot, stack, stack_next,
                  fk, fs, gk, gs):  # pragma: no cover - compiled
    """Whether the window starting at (``k``, ``slot``) is served: its ``walk`` is complete and,
    with ``stack``, its start's stack (into ``fk``/``fs``) and, with ``stack_next``, its bootstrap
    row's stack (into ``gk``/``gs``) can be built. Returns ``(served, *walk's results but the first)``;
    the one rule of the gathering and the drawing kernels (a start either is served or is skipped)."""
    ok, nk, ns, g, disc, te, tr = walk(seg, region, f4, f8, rec_bytes, flags, rew, n_step, gamma, k, slot)
    served = ok == WINDOW_OK
    if served and stack:
        served = stack_rows(seg, region, rec_bytes, flags, frames, k, slot, fk, fs)
        if served and stack_next:
            served = stack_rows(seg, region, rec_bytes, flags, frames, nk, ns, gk, gs)
    return served, nk, ns, g, disc, te, tr


@numba.njit(nogil=True, cache=True, boundscheck=False)
def gather_windows(seg, region, rec_bytes, flags, rew, n_step, gamma, frames, cand_k, cand_slot, start,
                   fields, stacked, out, ids, seg_ids, seg_records, ret, discount, term, trunc):  # pragma: no cover
    """Fill batch rows ``start..`` from candidate starts, skipping invalid ones (for uniform
    sampling), returning ``(filled, used, touched)`` (``touched``: a checksum of the prefetch
    pass, returned so the compiler keeps its loads).

    ``fields`` rows: (offset in record, length, output offset, ROW_START/ROW_NEXT) for fields
    copied once; ``stacked`` rows: (offset in record, length, output offset, ROW_START/ROW_NEXT)
    for observation fields copied ``frames`` times (output row of ``frames * length`` bytes).
    """
    r4 = region.view(np.uint32)
    r8 = region.view(np.uint64)
    f4 = region.view(np.float32)
    f8 = region.view(np.float64)
    o4 = out.view(np.uint32)
    o8 = out.view(np.uint64)
    b = ids.shape[0]
    fk = np.empty(frames, np.int64)  # the start's stack
    fs = np.empty(frames, np.int64)
    gk = np.empty(frames, np.int64)  # the bootstrap row's stack
    gs = np.empty(frames, np.int64)
    has_next = False
    for f in range(stacked.shape[0]):
        has_next |= stacked[f, F_NEXT] == ROW_NEXT
    touched = 0
    for j in range(cand_k.shape[0]):
        # touch the heads of every record the window will read (the stack's rows back, the next
        # rows on) in one pass of independent loads: their cache misses overlap
        kk = cand_k[j]
        lanes = seg[kk, SEG_LANES]
        base = seg[kk, SEG_BASE] + cand_slot[j] * rec_bytes
        lo = max(cand_slot[j] - (frames - 1) * lanes, cand_slot[j] % lanes)
        hi = min(cand_slot[j] + n_step * lanes, seg[kk, SEG_COMMITTED] - 1)
        for q in range(lo, hi + 1, lanes):
            touched += region[seg[kk, SEG_BASE] + q * rec_bytes]
        touched += region[base]
    i = start
    j = 0
    while i < b and j < cand_k.shape[0]:
        k = cand_k[j]
        slot = cand_slot[j]
        j += 1
        served, nk, ns, g, disc, te, tr = window_served(seg, region, f4, f8, rec_bytes, flags, rew, n_step, gamma,
                                                        frames, k, slot, stacked.shape[0] > 0, has_next, fk, fs, gk, gs)
        if not served:  # an incomplete window, or a stack that cannot be served: skipped
            continue
        ids[i] = seg_ids[k] * seg_records + slot
        ret[i] = g
        discount[i] = disc
        term[i] = te
        trunc[i] = tr
        roff = seg[k, SEG_BASE] + slot * rec_bytes
        noff = seg[nk, SEG_BASE] + ns * rec_bytes
        for f in range(fields.shape[0]):
            n = fields[f, F_LEN]
            src = (noff if fields[f, F_NEXT] == ROW_NEXT else roff) + fields[f, F_REC_OFF]
            copy_bytes(region, r4, r8, out, o4, o8, src, fields[f, F_OUT_OFF] + i * n, n)
        for f in range(stacked.shape[0]):
            n = stacked[f, F_LEN]
            role = stacked[f, F_NEXT]
            width = frames + 1 if role == ROW_SHARED else frames
            for q in range(frames):
                if role == ROW_NEXT:
                    src = seg[gk[q], SEG_BASE] + gs[q] * rec_bytes + stacked[f, F_REC_OFF]
                else:
                    src = seg[fk[q], SEG_BASE] + fs[q] * rec_bytes + stacked[f, F_REC_OFF]
                copy_bytes(region, r4, r8, out, o4, o8, src, stacked[f, F_OUT_OFF] + (i * width + q) * n, n)
            if role == ROW_SHARED:
                src = noff + stacked[f, F_REC_OFF]
                copy_bytes(region, r4, r8, out, o4, o8, src, stacked[f, F_OUT_OFF] + (i * width + frames) * n, n)
        i += 1
    return i, j, touched


@numba.njit(nogil=True, cache=True, boundscheck=False)
def draw_and_gather(state, nrand, seg, region, rec_bytes, flags, rew, n_step, gamma, frames, start, fields, stacked,
                    out, ids, seg_ids, seg_records, ret, discount, term, trunc):  # pragma: no cover - compiled
    """Uniform candidates drawn from ``state`` and gathered, in one call (see ``gather_windows``)."""
    ks, slots = draw_rows(state, nrand, seg)
    return gather_windows(seg, region, rec_bytes, flags, rew, n_step, gamma, frames, ks, slots, start, fields,
                          stacked, out, ids, seg_ids, seg_records, ret, discount, term, trunc)


@numba.njit(nogil=True, cache=True, boundscheck=False)
def draw_starts(state, nrand, seg, region, rec_bytes, flags, rew, n_step, gamma, frames, start, ids, seg_ids,
                seg_records):  # pragma: no cover - compiled
    """``draw_and_gather``'s draw and checks without the copies: ``nrand`` uniform candidates from
    ``state``, kept (their global ids into ``ids[start..]``) when ``gather_windows`` would gather
    them. Returns the rows filled, as ``draw_and_gather`` does: same state, same starts."""
    ks, slots = draw_rows(state, nrand, seg)
    f4 = region.view(np.float32)
    f8 = region.view(np.float64)
    fk = np.empty(frames, np.int64)
    fs = np.empty(frames, np.int64)
    b = ids.shape[0]
    i = start
    j = 0
    while i < b and j < ks.shape[0]:
        k = ks[j]
        slot = slots[j]
        j += 1
        # the start's stack; the bootstrap row's too when it is gathered on its own (n_step > 1)
        if not window_served(seg, region, f4, f8, rec_bytes, flags, rew, n_step, gamma, frames, k, slot, frames > 1,
                             n_step > 1, fk, fs, fk, fs)[0]:
            continue
        ids[i] = seg_ids[k] * seg_records + slot
        i += 1
    return i


@numba.njit(nogil=True, cache=True, boundscheck=False)
def locate_and_gather(want, seg, region, rec_bytes, flags, rew, n_step, gamma, frames, fields, stacked, out, ids,
                      seg_ids, seg_records, ret, discount, term, trunc):  # pragma: no cover - compiled
    """The transitions starting at global row ids ``want``, located as ``StoreReader.locate`` does
    and gathered (``gather_windows``) in one call; ``(-1, 0, 0)`` when one is not visible."""
    ks = np.empty(want.shape[0], np.int64)
    slots = np.empty(want.shape[0], np.int64)
    if not _locate_ids(seg_ids, seg[:, SEG_COMMITTED], seg_records, want, ks, slots):
        return -1, 0, 0
    return gather_windows(seg, region, rec_bytes, flags, rew, n_step, gamma, frames, ks, slots, 0, fields, stacked,
                          out, ids, seg_ids, seg_records, ret, discount, term, trunc)


@numba.njit(nogil=True, cache=True, boundscheck=False)
def window_codes(seg, region, rec_bytes, flags, rew, n_step, gamma, frames, ks, slots):  # pragma: no cover - compiled
    """What each candidate row's window is (``WINDOW_OK`` / ``WINDOW_NONE`` / ``WINDOW_BLOCKED``,
    int8) under an n-step view with stacks of ``frames`` observations (1: none)."""
    out = np.zeros(ks.shape[0], np.int8)
    f4 = region.view(np.float32)
    f8 = region.view(np.float64)
    fk = np.empty(frames, np.int64)
    fs = np.empty(frames, np.int64)
    for j in range(ks.shape[0]):
        code, nk, ns, _, _, _, _ = walk(seg, region, f4, f8, rec_bytes, flags, rew, n_step, gamma, ks[j], slots[j])
        if code == WINDOW_OK and frames > 1:
            if not (stack_rows(seg, region, rec_bytes, flags, frames, ks[j], slots[j], fk, fs)
                    and stack_rows(seg, region, rec_bytes, flags, frames, nk, ns, fk, fs)):
                code = WINDOW_BLOCKED
        out[j] = code
    return out


@numba.njit(nogil=True, cache=True, boundscheck=False)
def valid_starts(seg, region, rec_bytes, flags, rew, n_step, gamma, frames, ks, slots):  # pragma: no cover - compiled
    """Which candidate rows start a complete window (for prioritized replay's tree)."""
    return window_codes(seg, region, rec_bytes, flags, rew, n_step, gamma, frames, ks, slots) == WINDOW_OK


@numba.njit(nogil=True, cache=True, boundscheck=False)
def gather_sequences(seg, region, rec_bytes, is_last_off, total, stride, cand_k, cand_slot, start, fields, out,
                     is_last, mask, ids, seg_records):  # pragma: no cover - compiled
    r4 = region.view(np.uint32)
    r8 = region.view(np.uint64)
    o4 = out.view(np.uint32)
    o8 = out.view(np.uint64)
    b = ids.shape[0]
    ks = np.empty(total, np.int64)
    ss = np.empty(total, np.int64)
    i = start
    j = 0
    while i < b and j < cand_k.shape[0]:
        k = cand_k[j]
        slot = cand_slot[j]
        j += 1
        if stride > 1 and ((seg[k, SEG_FIRST] + slot) // seg[k, SEG_LANES]) % stride != 0:
            continue
        base = seg[k, SEG_BASE] + slot * rec_bytes
        if region[base + is_last_off] != 0:
            continue
        # walk the window: rows until the starting episode's final row must exist, and none of
        # the rows it serves may be masked
        n = 0
        ended = False
        ok = True
        ck, cs = k, slot
        while n < total:
            ks[n] = ck
            ss[n] = cs
            flag = region[seg[ck, SEG_BASE] + cs * rec_bytes + is_last_off]
            if flag == MASKED:
                ok = False
                break
            if flag != 0 and n > 0:
                ended = True
            n += 1
            if n == total:
                break
            nk, ns = _succ(seg, ck, cs)
            if nk < 0:
                if not ended:
                    ok = False
                break
            ck, cs = nk, ns
        if not ok:
            continue
        ids[i] = seg[k, SEG_ID] * seg_records + slot
        in_ep = True
        for q in range(total):
            if q < n:
                r = seg[ks[q], SEG_BASE] + ss[q] * rec_bytes
                last = region[r + is_last_off] != 0
                is_last[i, q] = last
                if last:
                    in_ep = False
                mask[i, q] = in_ep
                for f in range(fields.shape[0]):
                    ln = fields[f, 1]
                    copy_bytes(region, r4, r8, out, o4, o8, r + fields[f, 0], fields[f, 2] + (i * total + q) * ln, ln)
            else:
                is_last[i, q] = False
                mask[i, q] = False
                for f in range(fields.shape[0]):
                    ln = fields[f, 1]
                    dst = fields[f, 2] + (i * total + q) * ln
                    out[dst : dst + ln] = 0
        i += 1
    return i, j
