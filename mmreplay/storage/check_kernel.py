"""Compiled commit-group check (numba): the one place the rule for a valid group is written.

A commit group starting at slot ``i`` is valid iff its stamps agree (every row ``j`` of it has
``seq == first_seq + j + 1``, and the group's crc and length ``k``; ``k >= 1``; the group ends
inside the segment's usable rows and at or before ``stop``), the crc32c of its records, seeded
with (store uuid, segment id, ``i``, first seq, session epoch, ``k``) as in
``format.group_seed``, equals the stamped crc, and (format 2) every row's digest matches.

``scan_groups`` walks every group up to ``stop`` and locates damage to the row: a group whose
crc confirms its records keeps all its rows (a damaged stamp of one of them is reported, and
costs nothing); in a group whose crc fails, each row is judged by its own stamp (its row number
and, in format 2, the digest of its record in the high half of the stamp's ``seq`` field,
``format.row_digests``), so a damaged record or stamp costs that row alone and never the rows
after it. Format 1 rows carry no digest: there, damage is located per commit group. With
``first_only`` the walk stops at the first group not confirmed (recovery's longest valid prefix
of whole groups, for the tail a dead writer left open). One Python-level crc32c call per group
cost ~3 us, i.e. ~25 MB/s for single-row groups of CartPole-sized rows; this kernel's
crc32c checks any group size at disk speed: the CPU's own crc32c instruction where numba can emit
it (x86-64 with SSE4.2: ~11 GB/s a core on this machine kind, digests included), else a
table-driven slice-by-8 (~2.3 GB/s). Both compute the same crc (``HARDWARE_CRC`` says which runs;
the choice follows the compile target, so a cached kernel never holds the other one).

``locate_ids`` is the reader's lookup of row ids, compiled here beside the storage room's other
kernels.

Imported lazily (``import mmreplay`` does not load numba).
"""

from __future__ import annotations

import os
import platform

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_POLY = 0x82F63B78  # crc32c (Castagnoli), reflected


def _hardware_crc() -> bool:
    """Whether numba compiles for a CPU with the crc32c instruction: x86-64 with SSE4.2, compiled
    for the host (``NUMBA_CPU_NAME`` unset or ``host``: a portable target such as ``generic`` may
    lack it), and numba compiling at all (``NUMBA_DISABLE_JIT`` runs the kernels as Python)."""
    if numba.config.DISABLE_JIT or platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    if os.environ.get("NUMBA_CPU_NAME", "host") != "host":
        return False
    try:
        import llvmlite.binding as llvm

        return bool(llvm.get_host_cpu_features().get("sse4.2"))
    except Exception:  # pragma: no cover - an llvmlite without the query: the table is always right
        return False


HARDWARE_CRC = _hardware_crc()
"""The kernels' crc32c runs on the CPU's crc32c instruction (else on the slice-by-8 table)."""


def _table() -> np.ndarray:
    t = np.zeros((8, 256), np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        t[0, i] = c
    for k in range(1, 8):
        t[k] = (t[k - 1] >> 8) ^ t[0, t[k - 1] & 0xFF]
    return t


TABLE = _table()


@numba.njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _step8(c, lo, hi, t):  # pragma: no cover - compiled
    """One slice-by-8 step: the crc state ``c`` (inverted) after 8 bytes, given as two
    little-endian 32-bit halves ``lo`` and ``hi`` (the one place the table step is written)."""
    w = c ^ lo
    return (t[7, w & 0xFF] ^ t[6, (w >> np.uint32(8)) & 0xFF] ^ t[5, (w >> np.uint32(16)) & 0xFF]
            ^ t[4, w >> np.uint32(24)] ^ t[3, hi & 0xFF] ^ t[2, (hi >> np.uint32(8)) & 0xFF]
            ^ t[1, (hi >> np.uint32(16)) & 0xFF] ^ t[0, hi >> np.uint32(24)])


@intrinsic
def _crc32c_u64(typingctx, c, x):  # pragma: no cover - compiled
    """The x86-64 ``crc32`` instruction (SSE4.2) on the 64-bit word ``x``: the crc state ``c``
    (inverted, as ``_step8`` takes it) after those 8 bytes, little-endian."""
    sig = types.uint32(types.uint32, types.uint64)

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, [i64, i64]),
                                            "llvm.x86.sse42.crc32.64.64")
        return builder.trunc(builder.call(fn, [builder.zext(args[0], i64), args[1]]), ir.IntType(32))

    return sig, codegen


if HARDWARE_CRC:
    @numba.njit(nogil=True, cache=True, boundscheck=False, inline="always")
    def _crc8(c, x, t):  # pragma: no cover - compiled
        """The crc state ``c`` (inverted) after the 8 bytes of the little-endian word ``x``."""
        return _crc32c_u64(c, x)
else:
    @numba.njit(nogil=True, cache=True, boundscheck=False, inline="always")
    def _crc8(c, x, t):  # pragma: no cover - compiled
        """The crc state ``c`` (inverted) after the 8 bytes of the little-endian word ``x``."""
        return _step8(c, np.uint32(x & np.uint64(0xFFFFFFFF)), np.uint32(x >> np.uint64(32)), t)


@numba.njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _u32(buf, i):  # pragma: no cover - compiled
    return (np.uint32(buf[i]) | (np.uint32(buf[i + 1]) << np.uint32(8)) | (np.uint32(buf[i + 2]) << np.uint32(16))
            | (np.uint32(buf[i + 3]) << np.uint32(24)))


@numba.njit(nogil=True, cache=True, boundscheck=False)
def crc_update(crc, buf, lo, hi, t):  # pragma: no cover - compiled
    """crc32c of ``buf[lo:hi]`` continuing from ``crc`` (the ``crc32c`` package's convention)."""
    c = np.uint32(crc) ^ np.uint32(0xFFFFFFFF)
    i = lo
    while i + 8 <= hi:
        c = _crc8(c, np.uint64(_u32(buf, i)) | (np.uint64(_u32(buf, i + 4)) << np.uint64(32)), t)
        i += 8
    while i < hi:
        c = t[0, (c ^ buf[i]) & 0xFF] ^ (c >> np.uint32(8))
        i += 1
    return c ^ np.uint32(0xFFFFFFFF)


@numba.njit(nogil=True, cache=True, boundscheck=False)
def crc_and_digests(crc, words, base, nrows, row_words, mults, t, out):  # pragma: no cover - compiled
    """``crc_update`` over ``nrows`` whole-word records starting at word ``base`` of ``words``
    (uint64), and each record's ``row_digest`` into ``out``, in one pass: the digest's multiplies
    overlap the crc steps, so the digests cost the check almost nothing."""
    c = np.uint32(crc) ^ np.uint32(0xFFFFFFFF)
    idx = base
    for r in range(nrows):
        h = np.uint64(0)
        for w in range(row_words):
            x = words[idx]
            idx += 1
            h += x * mults[w]
            c = _crc8(c, x, t)
        out[r] = h >> np.uint64(32)
    return c ^ np.uint32(0xFFFFFFFF)


@numba.njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _put_u64(buf, off, v):  # pragma: no cover - compiled
    for b in range(8):
        buf[off + b] = np.uint8((np.uint64(v) >> np.uint64(8 * b)) & np.uint64(0xFF))


@numba.njit(nogil=True, cache=True, boundscheck=False, inline="always")
def row_digest(data, words, lo, rec_bytes, mults):  # pragma: no cover - compiled
    """``format.row_digests`` of the one record at ``data[lo:lo + rec_bytes]`` (``words``: the
    same bytes as little-endian uint64, read directly when the record is whole words)."""
    h = np.uint64(0)
    if (lo | rec_bytes) & 7 == 0:
        base = lo >> 3
        for w in range(mults.shape[0]):
            h += words[base + w] * mults[w]
    else:
        for w in range(mults.shape[0]):
            word = np.uint64(0)
            for b in range(8):
                if 8 * w + b < rec_bytes:
                    word |= np.uint64(data[lo + 8 * w + b]) << np.uint64(8 * b)
            h += word * mults[w]
    return h >> np.uint64(32)


@numba.njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _seq_ok(q, want, v2):  # pragma: no cover - compiled
    if v2:
        return (q & np.uint64(0xFFFFFFFF)) == (np.uint64(want) & np.uint64(0xFFFFFFFF))
    return q == np.uint64(want)


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _group_crc(s, i, first_seq, k, data, words, records_offset, rec_bytes, t, v2, mults, dig):  # pragma: no cover
    """crc32c of the ``k`` records from slot ``i``, seeded as ``format.group_seed`` seeds a group
    starting there (``s``: the seed bytes, slot / seq / length written here); with ``v2`` each
    record's ``row_digest`` goes into ``dig[:k]`` in the same pass."""
    _put_u64(s, 24, i)
    _put_u64(s, 32, first_seq + i + 1)  # the full row number (format 2 keeps only 32 bits of it)
    _put_u64(s, 48, k)
    c = crc_update(0, s, 0, 56, t)
    lo = records_offset + i * rec_bytes
    if v2 and (lo | rec_bytes) & 7 == 0:  # whole words: crc and digests in one pass
        return crc_and_digests(c, words, lo >> 3, k, rec_bytes >> 3, mults, t, dig)
    c = crc_update(c, data, lo, lo + k * rec_bytes, t)
    if v2:
        for j in range(k):
            dig[j] = row_digest(data, words, lo + j * rec_bytes, rec_bytes, mults)
    return c


@numba.njit(nogil=True, cache=True, boundscheck=False)
def scan_groups(seq, crcs, glens, data, words, records_offset, rec_bytes, first_seq, usable, start, stop, seed, t,
                bad, first_only, v2, mults, fix):  # pragma: no cover - compiled
    """Flag in ``bad`` (uint8, one per slot) every damaged row of ``[start, stop)``: 1 for a row
    whose record cannot be trusted (left out), 2 for a row whose record is proven intact by its
    group's crc although its own stamp is damaged (kept; ``verify`` reports the stamp).

    ``seq``/``crcs``/``glens``: the stamp column's fields; ``data``: the whole segment file as
    bytes (``words``: as uint64); ``seed``: 56 bytes packed as ``format.group_seed`` packs them
    (only the store uuid, segment id and epoch need be filled); ``v2``: the segment is format 2
    (``mults``: ``format.digest_multipliers`` for its records); ``fix``: uint64 (slots, 2), or
    (0, 2) when not wanted, receives the stamp each row flagged 2 should hold (its two words, as
    the writer stamped them). Returns the number of rows flagged 1, or with ``first_only`` the first slot of the first group not proven intact
    (``stop`` if none): recovery's longest valid prefix of whole groups.

    At slot ``i`` a group is **confirmed** when the crc of the records from ``i`` matches the
    crc and length stamped on row ``i`` or, if row ``i``'s own stamp is damaged, on row
    ``i + 1`` (the crc is seeded with the slot and row number computed here, never read from a
    stamp, so a confirmed group is in its right place). A confirmed group's rows are all kept.
    Otherwise the rows from ``i`` (the stamped length when it fits, else one row) are judged
    one by one by their own stamp: row number and (format 2) digest; a row that fails is
    flagged alone, and the walk goes on after them, so damage to a stamp or a record never costs
    another row. Format 1 rows carry no digest: an unconfirmed group is flagged whole. A group
    whose crc fails while every row's digest and stamp agree (a ~2**-32 digest collision) is
    flagged whole too.
    """
    s = seed.copy()
    dig = np.empty(64, np.uint64)
    nbad = 0
    aligned = True  # the walk is at a group boundary (not after an extent it could not confirm)
    i = start
    while i < stop:
        k = np.int64(glens[i])
        c = crcs[i]
        confirmed = False
        if k >= 1 and i + k <= usable and i + k <= stop:
            if dig.shape[0] < k:
                dig = np.empty(2 * k, np.uint64)
            confirmed = _group_crc(s, i, first_seq, k, data, words, records_offset, rec_bytes, t, v2, mults,
                                   dig) == c
        if not confirmed and i + 1 < stop:  # row i's own stamp may be the damaged one
            k2 = np.int64(glens[i + 1])
            c2 = crcs[i + 1]
            if (k2 != k or c2 != c) and k2 >= 2 and i + k2 <= usable and i + k2 <= stop:
                if dig.shape[0] < k2:
                    dig = np.empty(2 * k2, np.uint64)
                if _group_crc(s, i, first_seq, k2, data, words, records_offset, rec_bytes, t, v2, mults, dig) == c2:
                    confirmed = True
                    k = k2
                    c = c2
        if confirmed:
            aligned = True
            if not first_only:  # the records are intact: a row's damaged stamp costs nothing
                for j in range(i, i + k):
                    if (not _seq_ok(seq[j], first_seq + j + 1, v2) or crcs[j] != c or np.int64(glens[j]) != k
                            or (v2 and dig[j - i] != seq[j] >> np.uint64(32))):
                        bad[j] = 2
                        if fix.shape[0] > j:
                            row = np.uint64(first_seq + j + 1)
                            if v2:
                                row = (row & np.uint64(0xFFFFFFFF)) | (dig[j - i] << np.uint64(32))
                            fix[j, 0] = row
                            fix[j, 1] = np.uint64(c) | (np.uint64(k) << np.uint64(32))
            i += k
            continue
        if first_only:
            return i
        # the extent judged: the group row i's stamp describes when another row shares that stamp
        # (damaged records in a real group), else row i alone (its own stamp is damaged)
        plausible = k >= 1 and i + k <= usable and i + k <= stop
        if plausible and k > 1:
            plausible = False
            for j in range(i + 1, i + k):
                if crcs[j] == c and np.int64(glens[j]) == k:
                    plausible = True
                    break
        if not plausible:
            k = 1
        if not v2:  # no row digests (format 1): the group is the finest unit
            for j in range(i, i + k):
                bad[j] = 1
            nbad += k
            i += k
            continue
        if dig.shape[0] < k:
            dig = np.empty(2 * k, np.uint64)
        c1 = _group_crc(s, i, first_seq, k, data, words, records_offset, rec_bytes, t, v2, mults, dig)
        if k == 1 and (crcs[i] != c1 or glens[i] != 1):
            # row i alone, its stamp's crc or length wrong: if its own row number and digest hold,
            # the record is intact and only the stamp is damaged (at a group boundary: kept, and
            # the stamp to write back makes it a group of one)
            if _seq_ok(seq[i], first_seq + i + 1, v2) and dig[0] == seq[i] >> np.uint64(32):
                if aligned:
                    bad[i] = 2
                    if fix.shape[0] > i:
                        fix[i, 0] = seq[i]
                        fix[i, 1] = np.uint64(c1) | (np.uint64(1) << np.uint64(32))
                i += 1
                continue
        aligned = aligned and plausible  # a plausible extent from a boundary is a group; else unknown
        located = 0
        consistent = True
        for j in range(i, i + k):
            if not _seq_ok(seq[j], first_seq + j + 1, v2) or dig[j - i] != seq[j] >> np.uint64(32):
                bad[j] = 1
                located += 1
            if crcs[j] != c or np.int64(glens[j]) != k:
                consistent = False
        if located == 0 and consistent:  # every digest matches a group whose crc does not
            for j in range(i, i + k):
                bad[j] = 1
            located = k
        nbad += located
        i += k
    return stop if first_only else nbad



# -- the writer's side: stamping a commit group and checking copied floats ---------------------
@numba.njit(nogil=True, cache=True, boundscheck=False)
def stamp_rows(stamps, data, words, records_offset, rec_bytes, mults, first_seq, start, stop,
               tail):  # pragma: no cover - compiled
    """Write the stamps of rows ``[start, stop)`` (their records written first), as format 2 has
    them: word 0 is row number ``first_seq + j + 1``'s low 32 bits and above them the row's
    ``row_digest``, word 1 the group's crc and length (``tail``). ``stamps``: the stamp column as
    (rows, 2) uint64; ``data``/``words``: the whole segment file as bytes and as uint64."""
    nw = mults.shape[0]
    seq = np.uint64(first_seq + start + 1)
    # whole words: row_digest's sum written out here, in two chains (the sum is mod 2**64, so its order
    # is free) and walking the rows by increment: 1,024 rows in ~6.6 us, against 11-15 us through
    # row_digest or an inlined helper, and ~9.6 us in one chain
    if (records_offset | rec_bytes) & 7 == 0:
        base = (records_offset + start * rec_bytes) >> 3
        for j in range(start, stop):
            h0 = np.uint64(0)
            h1 = np.uint64(0)
            w = 0
            while w + 1 < nw:
                h0 += words[base + w] * mults[w]
                h1 += words[base + w + 1] * mults[w + 1]
                w += 2
            if w < nw:
                h0 += words[base + w] * mults[w]
            stamps[j, 0] = (seq & np.uint64(0xFFFFFFFF)) | (((h0 + h1) >> np.uint64(32)) << np.uint64(32))
            stamps[j, 1] = tail
            base += rec_bytes >> 3
            seq += np.uint64(1)
        return
    for j in range(start, stop):
        h = row_digest(data, words, records_offset + j * rec_bytes, rec_bytes, mults)
        stamps[j, 0] = (seq & np.uint64(0xFFFFFFFF)) | (h << np.uint64(32))
        stamps[j, 1] = tail
        seq += np.uint64(1)


@numba.njit(nogil=True, cache=True, boundscheck=False)
def rows_finite(run, start, stop):  # pragma: no cover - compiled
    """Whether rows ``[start, stop)`` of a float run (rows × floats, any strides) hold only
    finite values: ``x - x`` is 0 for a finite ``x``, NaN for an infinity or a NaN."""
    for i in range(start, stop):
        z = run[i, 0] - run[i, 0]
        for j in range(1, run.shape[1]):
            z += run[i, j] - run[i, j]
        if z != 0:
            return False
    return True


@numba.njit(nogil=True, cache=True, boundscheck=False)
def locate_ids(segment_ids, committed, seg_records, ids, ks, slots):  # pragma: no cover - compiled
    """``StoreReader.locate`` in one call: fill ``ks``/``slots`` (snapshot segment index, slot) of
    global row ids ``ids``; False at the first id not visible in the snapshot (its segment is not
    in ``segment_ids``, sorted, or its slot is not below the segment's ``committed`` count)."""
    n = segment_ids.shape[0]
    for i in range(ids.shape[0]):
        g = ids[i]
        if g < 0:
            return False
        sid = g // seg_records
        lo, hi = 0, n
        while lo < hi:  # the first segment id >= sid
            mid = (lo + hi) >> 1
            if segment_ids[mid] < sid:
                lo = mid + 1
            else:
                hi = mid
        slot = g - sid * seg_records
        if lo == n or segment_ids[lo] != sid or slot >= committed[lo]:
            return False
        ks[i] = lo
        slots[i] = slot
    return True
