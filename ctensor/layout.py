"""Layout: the metadata of a global tensor (shape, dtype, placement, SBP) and its shard maths.

Pure and immutable; boxing plans and dispatch signatures are cached by layouts.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .placement import Placement
from .sbp import SBP, Partial, Split, local_box


@dataclass(frozen=True)
class Layout:
    shape: tuple
    dtype: np.dtype
    placement: Placement
    sbp: tuple

    def box(self, rank: int) -> tuple:
        """``(start, stop)`` per dim of the logical region held by ``rank``."""
        return self._boxes[rank]

    @cached_property
    def _boxes(self) -> dict:
        p = self.placement
        return {r: local_box(self.shape, self.sbp, p.shape, p.coord(r)) for r in p.rank_list}

    def local_shape(self, rank: int) -> tuple:
        return tuple(b - a for a, b in self.box(rank))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def local_nbytes(self, rank: int) -> int:
        return int(np.prod(self.local_shape(rank), dtype=np.int64)) * self.dtype.itemsize

    @property
    def has_partial(self) -> bool:
        return any(isinstance(s, Partial) for s in self.sbp)

    def with_sbp(self, sbp) -> "Layout":
        return Layout(self.shape, self.dtype, self.placement, tuple(sbp))

    def split_dims(self) -> set:
        return {s.dim for s in self.sbp if isinstance(s, Split)}
