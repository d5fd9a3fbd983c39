"""Layout: the metadata of a global tensor (shape, dtype, placement, SBP) and its shard maths.

Pure, immutable and interned: equal layouts are one object, so a layout compares and hashes by
identity (Python's own, at C speed: dispatch hashes layouts on every op) and the caches of
boxing plans and dispatch signatures keyed by layouts hit by identity.
"""
from __future__ import annotations

import math
import weakref

import numpy as np

from .placement import Placement
from .sbp import Partial, local_region


def intersect(a: tuple, b: tuple):
    """The common part of two regions (``(start, stop)`` per dim), or None when empty."""
    out = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b))
    return out if all(lo < hi for lo, hi in out) else None


def slices(region: tuple, within: tuple) -> tuple:
    """The index of ``region`` inside an array that holds the region ``within`` (the
    trailing Ellipsis keeps 0-d results arrays rather than scalars)."""
    return tuple(slice(a - w0, b - w0) for (a, b), (w0, _) in zip(region, within)) + (Ellipsis,)


class Layout:
    """Interned: equal layouts are the same object (made only through ``Layout(...)``, which
    pickling and copying go through as well), so equality and hashing are identity's."""

    __slots__ = ("shape", "dtype", "placement", "sbp", "numel", "_regions", "_shapes",
                 "__weakref__")
    _interned: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()

    def __new__(cls, shape: tuple, dtype, placement: Placement, sbp: tuple):
        key = (tuple(shape), np.dtype(dtype), placement, tuple(sbp))
        self = cls._interned.get(key)
        if self is None:
            self = object.__new__(cls)
            self.shape, self.dtype, self.placement, self.sbp = key
            self.numel = math.prod(self.shape)
            self._regions = None
            self._shapes = None
            cls._interned[key] = self
        return self

    def __reduce__(self):
        return (Layout, (self.shape, self.dtype, self.placement, self.sbp))

    def __repr__(self) -> str:
        return f"Layout({self.shape}, {self.dtype}, {self.placement!r}, {self.sbp})"

    def region(self, rank: int) -> tuple:
        """``(start, stop)`` per dim of the logical region held by ``rank`` (computed for a
        rank when first asked: a layout over thousands of ranks never fills them all)."""
        regions = self._regions
        if regions is None:
            regions = self._regions = {}
        hit = regions.get(rank)
        if hit is None:
            p = self.placement
            hit = regions[rank] = local_region(self.shape, self.sbp, p.shape, p.coord(rank))
        return hit

    def local_shape(self, rank: int) -> tuple:
        shapes = self._shapes
        if shapes is None:
            shapes = self._shapes = {}
        hit = shapes.get(rank)
        if hit is None:
            hit = shapes[rank] = tuple(b - a for a, b in self.region(rank))
        return hit

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def local_nbytes(self, rank: int) -> int:
        return math.prod(map(int, self.local_shape(rank))) * self.dtype.itemsize

    @property
    def has_partial(self) -> bool:
        return any(isinstance(s, Partial) for s in self.sbp)

    def with_sbp(self, sbp) -> "Layout":
        return Layout(self.shape, self.dtype, self.placement, tuple(sbp))


def same_shards(a: Layout, b: Layout) -> bool:
    """Whether layouts ``a`` and ``b`` hold the same shards: they differ at most on mesh axes
    of one rank, where split, broadcast and partial are one (the per-op choice may label
    such an axis otherwise than a plan; a replicated leaf's gradient comes out partial
    there)."""
    return a is b or (a.shape == b.shape and a.dtype == b.dtype and a.placement == b.placement
                      and all(x == y or n == 1
                              for x, y, n in zip(a.sbp, b.sbp, a.placement.shape)))
