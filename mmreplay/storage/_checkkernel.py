"""Compiled commit-group check (numba): the one place the rule for a valid group is written.

A commit group starting at slot ``i`` is valid iff its stamps agree (every row ``j`` of it has
``seq == first_seq + j + 1``, and the group's crc and length ``k``; ``k >= 1``; the group ends
inside the segment's usable rows and at or before ``stop``) and the crc32c of its records,
seeded with (store uuid, segment id, ``i``, first seq, session epoch, ``k``) as in
``format.group_seed``, equals the stamped crc.

``scan_groups`` walks every group up to ``stop``. A group whose stamps agree but whose crc does
not match is damaged as a whole (its ``k`` rows are flagged); a row whose stamp disagrees is
flagged alone and the walk resumes at the next row, so one damaged stamp never hides the groups
after it. With ``first_only`` the walk stops at the first damaged row (recovery's longest valid
prefix). One Python-level crc32c call per group cost ~3 us, i.e. ~25 MB/s for single-row groups
of CartPole-sized rows; this kernel's table-driven crc32c (slice-by-8, ~1.5 GB/s on this
machine kind) checks any group size at disk speed.

Imported lazily (``import mmreplay`` does not load numba).
"""

from __future__ import annotations

import numba
import numpy as np

_POLY = 0x82F63B78  # crc32c (Castagnoli), reflected


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


@numba.njit(nogil=True, cache=True, boundscheck=False)
def crc_update(crc, buf, lo, hi, t):  # pragma: no cover - compiled
    """crc32c of ``buf[lo:hi]`` continuing from ``crc`` (the ``crc32c`` package's convention)."""
    c = np.uint32(crc) ^ np.uint32(0xFFFFFFFF)
    i = lo
    while i + 8 <= hi:
        w = c ^ (np.uint32(buf[i]) | (np.uint32(buf[i + 1]) << np.uint32(8)) | (np.uint32(buf[i + 2]) << np.uint32(16))
                 | (np.uint32(buf[i + 3]) << np.uint32(24)))
        c = (t[7, w & 0xFF] ^ t[6, (w >> np.uint32(8)) & 0xFF] ^ t[5, (w >> np.uint32(16)) & 0xFF]
             ^ t[4, w >> np.uint32(24)] ^ t[3, buf[i + 4]] ^ t[2, buf[i + 5]] ^ t[1, buf[i + 6]] ^ t[0, buf[i + 7]])
        i += 8
    while i < hi:
        c = t[0, (c ^ buf[i]) & 0xFF] ^ (c >> np.uint32(8))
        i += 1
    return c ^ np.uint32(0xFFFFFFFF)


@numba.njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _put_u64(buf, off, v):  # pragma: no cover - compiled
    for b in range(8):
        buf[off + b] = np.uint8((np.uint64(v) >> np.uint64(8 * b)) & np.uint64(0xFF))


@numba.njit(nogil=True, cache=True, boundscheck=False)
def scan_groups(seq, crcs, glens, data, records_offset, rec_bytes, first_seq, usable, start, stop, seed, t,
                bad, first_only):  # pragma: no cover - compiled
    """Flag in ``bad`` (uint8, one per slot) every row of ``[start, stop)`` in a damaged group.

    ``seq``/``crcs``/``glens``: the stamp column's fields; ``data``: the whole segment file as
    bytes; ``seed``: 56 bytes packed as ``format.group_seed`` packs them (only the store uuid,
    segment id and epoch need be filled: slot, first seq and length are written here). Returns
    the number of rows flagged, or with ``first_only`` the first damaged slot (``stop`` if none).
    """
    s = seed.copy()
    nbad = 0
    i = start
    while i < stop:
        q = seq[i]
        k = np.int64(glens[i])
        ok = q == np.uint64(first_seq + i + 1) and k >= 1 and i + k <= usable and i + k <= stop
        if ok:
            c0 = crcs[i]
            for j in range(i + 1, i + k):
                if seq[j] != np.uint64(first_seq + j + 1) or crcs[j] != c0 or np.int64(glens[j]) != k:
                    ok = False
                    break
        if not ok:  # this row's stamp disagrees: flag it alone and look for a group at the next row
            if first_only:
                return i
            bad[i] = 1
            nbad += 1
            i += 1
            continue
        _put_u64(s, 24, i)
        _put_u64(s, 32, q)
        _put_u64(s, 48, k)
        c = crc_update(0, s, 0, 56, t)
        lo = records_offset + i * rec_bytes
        c = crc_update(c, data, lo, lo + k * rec_bytes, t)
        if c != crcs[i]:
            if first_only:
                return i
            for j in range(i, i + k):
                bad[j] = 1
            nbad += k
        i += k
    return stop if first_only else nbad
