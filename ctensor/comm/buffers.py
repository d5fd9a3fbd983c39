"""A small caching pool for the host buffers that collectives receive into.

A training step runs the same collectives on the same sizes every iteration. A fresh
NumPy array of many MiB is a fresh ``mmap``, and the collective then pays a page fault per
4 KiB page while it writes — which doubles the time of a 16 MiB all-reduce on this kind of
machine. The pool keeps released buffers and hands them out again.

A buffer is reusable when nothing but the pool refers to it: every array made from it (the
tensor's shard, reshapes and slices of it) keeps a reference to the buffer, so CPython's
reference count says exactly when the last user is gone. Nothing is freed behind a user's
back, and the pool holds at most ``max_bytes`` of idle buffers.

Below it, the helpers the MPI collectives use to cut an array into its parts along one dim
and, where the parts are not consecutive byte ranges, to pack them into one pooled buffer
(and back) with a single copy, and which dtypes NumPy sums exactly as MPI does.
"""
from __future__ import annotations

import math
import sys

import numpy as np

#: buffers smaller than this are not worth pooling (malloc reuses them already)
MIN_BYTES = 1 << 18
#: the idle buffers kept, in bytes, at most
MAX_IDLE_BYTES = 1 << 30


class BufferPool:
    def __init__(self, max_bytes: int = MAX_IDLE_BYTES):
        self.max_bytes = max_bytes
        self._buffers: dict[int, list] = {}

    def empty(self, shape, dtype) -> np.ndarray:
        """An uninitialised C-contiguous array, backed by a pooled buffer when large."""
        dtype = np.dtype(dtype)
        count = math.prod(shape) if isinstance(shape, (tuple, list)) else int(shape)
        nbytes = count * dtype.itemsize
        if nbytes < MIN_BYTES:
            return np.empty(shape, dtype=dtype)
        raw = self._take(nbytes)
        return raw.view(dtype).reshape(shape)

    def _take(self, nbytes: int) -> np.ndarray:
        bucket = self._buffers.setdefault(nbytes, [])
        for raw in bucket:
            # references: the bucket list, the loop variable and getrefcount's argument
            if sys.getrefcount(raw) == 3:
                return raw
        idle = self.idle_bytes()
        if idle + nbytes > self.max_bytes:
            self._evict(idle + nbytes - self.max_bytes)
        raw = np.empty(nbytes, dtype=np.uint8)
        bucket.append(raw)
        return raw

    def idle_bytes(self) -> int:
        return sum(raw.nbytes for bucket in self._buffers.values() for raw in bucket
                   if sys.getrefcount(raw) == 3)

    def _evict(self, need: int) -> None:
        """Drop idle buffers (largest first) until ``need`` bytes are freed."""
        for nbytes in sorted(self._buffers, reverse=True):
            bucket = self._buffers[nbytes]
            keep = []
            for raw in bucket:
                if need > 0 and sys.getrefcount(raw) == 3:
                    need -= raw.nbytes
                else:
                    keep.append(raw)
            self._buffers[nbytes] = keep
            if need <= 0:
                return

    def clear(self) -> None:
        """Forget every pooled buffer (arrays still in use keep theirs alive)."""
        self._buffers.clear()


# ------------------------------------------------- parts of an array along one dim
def parts(arr: np.ndarray, dim: int, sizes) -> list:
    """The views of ``arr`` cut along ``dim`` into parts of ``sizes``."""
    views, start = [], 0
    for n in sizes:
        idx = [slice(None)] * arr.ndim
        idx[dim] = slice(start, start + n)
        views.append(arr[tuple(idx)])
        start += n
    return views


def flat_along(arr: np.ndarray, dim: int) -> bool:
    """Whether the parts of ``arr`` cut along ``dim`` are consecutive byte ranges of its
    memory (C order, and no longer dim before ``dim``): a collective then reads or writes
    them in place."""
    return arr.flags.c_contiguous and math.prod(arr.shape[:dim]) == 1


def pack(pool: BufferPool, pieces: list, skip: int | None = None,
         into: np.ndarray | None = None) -> np.ndarray:
    """One pooled byte buffer holding ``pieces`` one after the other, each in its own C
    layout (part ``skip`` left out): the single copy a strided collective needs. ``into``
    (a C-contiguous array at least that large) holds them instead of a pooled buffer."""
    nbytes = sum(p.nbytes for i, p in enumerate(pieces) if i != skip)
    send = pool.empty(nbytes, np.uint8) if into is None else \
        into.reshape(-1).view(np.uint8)[:nbytes]
    pos = 0
    for i, p in enumerate(pieces):
        if i != skip:
            send[pos:pos + p.nbytes].view(p.dtype).reshape(p.shape)[...] = p
            pos += p.nbytes
    return send


def unpack(recv: np.ndarray, pieces: list, skip: int | None = None) -> None:
    """The inverse of :func:`pack`: copy the consecutive blocks of ``recv`` into ``pieces``."""
    pos = 0
    for i, p in enumerate(pieces):
        if i != skip:
            p[...] = recv[pos:pos + p.nbytes].view(p.dtype).reshape(p.shape)
            pos += p.nbytes


def prefix(counts) -> tuple:
    """The displacements of consecutive blocks of ``counts``, and their total."""
    displs, total = [], 0
    for c in counts:
        displs.append(total)
        total += c
    return displs, total


def exact_pair_sum(dtype: np.dtype) -> bool:
    """Whether NumPy adds two values of ``dtype`` exactly as MPI's SUM does (integers wrap,
    IEEE single/double and their complex are correctly rounded; not bool, which MPI reduces
    logically, nor float16 or long double)."""
    return dtype.kind in "iu" or dtype in (np.float32, np.float64, np.complex64, np.complex128)
