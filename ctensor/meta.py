"""Shape-only tensors: what a tensor is in ``ct.simulate(n, meta=True)``.

In a shape-only ("meta") world a tensor is its :class:`~ctensor.layout.Layout` and nothing
else: its ``_shards`` is one :class:`MetaBuffer` standing for the memory behind the shards
of *every* rank (never one object per rank), kernels are skipped, and boxing records its
steps without moving bytes. Everything else runs as in a real simulation — signature
choice, boxing plans, autograd, gradient buckets, recompute, optimizers — so a meta run
makes exactly the layout choices and the communication of a real one, at any world size.

Per-rank figures come from the layout on demand, vectorised over the mesh (no Python loop
over ranks): :func:`rank_bytes` (bytes of each rank's shard, as one array over the mesh)
and :func:`shape_classes` (each distinct local shape with how many ranks hold it: one
class for an even layout, a handful for an uneven one).

Values are unavailable: ``numpy()``, ``item()``, ``to_local()``, ``local_shards()``,
``bool()`` raise :class:`~ctensor.errors.MetaModeError` (see :func:`no_values`).

This module is pure: layouts in, arrays and classes out.
"""
from __future__ import annotations

import weakref
from typing import Union

import numpy as np

from .errors import MetaModeError
from .layout import Layout
from .placement import Placement
from .sbp import Split

__all__ = ["MetaBuffer", "rank_bytes", "total_bytes", "max_bytes", "shape_classes",
           "no_values"]


class MetaBuffer:
    """The memory behind a shape-only tensor's shards, for all ranks at once.

    ``placement``: the ranks that hold it; ``nbytes``: the bytes each holds — an int when
    every rank holds the same, else an int64 array shaped like ``placement.ranks``.
    Tensors that are views of one another (``detach()``, reshape, a slice made by boxing)
    share one buffer, so memory accounting counts it once, as it counts a NumPy array and
    its views once.
    """

    __slots__ = ("placement", "nbytes", "boxing", "__weakref__")

    def __init__(self, placement: Placement, nbytes: Union[int, np.ndarray],
                 boxing: bool = False):
        self.placement = placement
        self.nbytes = nbytes
        #: made by a boxing step (a gathered or reduced copy): reported apart from the
        #: activations it is counted with
        self.boxing = boxing

    @classmethod
    def of(cls, layout: Layout) -> "MetaBuffer":
        """A new buffer holding ``layout``'s shards."""
        return cls(layout.placement, rank_bytes(layout))

    def copy(self) -> "MetaBuffer":
        """A buffer of the same size (a copy of the shards)."""
        return MetaBuffer(self.placement, self.nbytes)

    def __iter__(self):
        # code written for {rank: array} that reaches a meta tensor is a bug of ctensor:
        # say so instead of silently iterating over nothing
        raise TypeError("internal error: the shards of a shape-only tensor were iterated as "
                        "{rank: array}; this code path lacks a meta-mode branch")

    def __repr__(self) -> str:
        n = self.nbytes if isinstance(self.nbytes, int) else f"{int(self.nbytes.max())} max"
        return f"MetaBuffer({n} B per rank on {self.placement.size} ranks)"


# ----------------------------------------------------------------------------- per-rank sizes
_sizes: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _dim_sizes(layout: Layout) -> list:
    """Per tensor dim, the local length at every mesh coordinate, as an int64 array that
    broadcasts against the mesh (splits nest in mesh-axis order; the uneven rule gives the
    first ``n % k`` parts one more element)."""
    p = layout.placement
    mesh = p.shape
    sizes = [np.array(n, dtype=np.int64) for n in layout.shape]
    for axis, entry in enumerate(layout.sbp):
        if not isinstance(entry, Split):
            continue
        k = mesh[axis]
        coord = np.arange(k, dtype=np.int64).reshape([k if a == axis else 1
                                                      for a in range(len(mesh))])
        q, r = np.divmod(sizes[entry.dim], k)
        sizes[entry.dim] = q + (coord < r)
    return [np.broadcast_to(s, mesh) if s.ndim else s for s in sizes]


def rank_bytes(layout: Layout) -> Union[int, np.ndarray]:
    """Bytes of the shard each rank of ``layout.placement`` holds: an int when all hold the
    same, else an int64 array shaped like ``placement.ranks`` (cached per layout)."""
    hit = _sizes.get(layout)
    if hit is not None:
        return hit
    numel = np.ones(layout.placement.shape, dtype=np.int64)
    for s in _dim_sizes(layout):
        numel = numel * s
    nbytes = numel * layout.dtype.itemsize
    flat = nbytes.reshape(-1)
    out: Union[int, np.ndarray] = int(flat[0]) if (flat == flat[0]).all() else nbytes
    _sizes[layout] = out
    return out


def total_bytes(layout: Layout) -> int:
    """Bytes of all ranks' shards together (what a simulation's communication log counts
    for a step fed by every rank)."""
    n = rank_bytes(layout)
    return n * layout.placement.size if isinstance(n, int) else int(n.sum())


def max_bytes(nbytes: Union[int, np.ndarray]) -> int:
    """The largest per-rank figure of a :class:`MetaBuffer` or :func:`rank_bytes` value."""
    return nbytes if isinstance(nbytes, int) else int(nbytes.max())


def shape_classes(layout: Layout) -> list:
    """``[(local shape, number of ranks, first rank), ...]``: the classes of ranks holding
    shards of one shape, in mesh order of their first rank.

    >>> shape_classes(Layout((10,), np.float32, ct.placement("cpu", [0, 1, 2]), (S(0),)))
    [((4,), 1, 0), ((3,), 2, 1)]
    """
    p = layout.placement
    dims = _dim_sizes(layout)
    if not dims:
        return [((), p.size, p.rank_list[0])]
    table = np.stack([np.broadcast_to(d, p.shape).reshape(-1) for d in dims], axis=1)
    shapes, first, counts = np.unique(table, axis=0, return_index=True, return_counts=True)
    ranks = p.ranks.reshape(-1)
    out = [(tuple(int(v) for v in s), int(c), int(ranks[i]))
           for s, i, c in zip(shapes, first, counts)]
    return sorted(out, key=lambda item: int(np.flatnonzero(ranks == item[2])[0]))


def no_values(fn: str):
    """The error for asking a shape-only tensor for values (raised by the accessors)."""
    return MetaModeError(f"{fn}: this tensor is shape-only (ct.simulate(n, meta=True)): it "
                         f"is its layout and holds no values, so {fn} cannot answer; take "
                         f"values in a real run (ct.simulate(n) or mpiexec), or keep "
                         f"value-dependent code out of the planned script (branch on "
                         f"ct.runtime.is_meta())")
