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

This module is one of the three that know a shape-only world from a real one (with
:mod:`ctensor.executor` and :mod:`ctensor.shapeonly`; ``tests/test_layers.py`` counts them).
Everything else says what it does without values and lets these decide:

* the shards container's operations that differ for a :class:`MetaBuffer`
  (:func:`held_values`, :func:`local_arrays`, :func:`shared`, :func:`share_arrays`,
  :func:`describe`) and a gradient bucket's reduction (:func:`start_reduction`,
  :func:`flat_views`; :class:`Reduction` records it);
* code that reads values: :func:`reads_values` (skipped where there are none, giving a
  default), :func:`needs_values` (an argument that needs values: its error), and
  :func:`for_world` / :func:`for_shards` (two implementations: the world's one, or the
  shards container's one, runs). Public as ``ct.meta``:
  ``ctensor.nn`` and ``ctensor.optim`` use them, never the mode.
"""
from __future__ import annotations

import functools
import weakref
from typing import Callable, Union

import numpy as np

from .errors import MetaModeError
from .layout import Layout
from .placement import Placement
from .runtime import world
from .sbp import Split

__all__ = ["MetaBuffer", "rank_bytes", "total_bytes", "max_bytes", "shape_classes",
           "no_values", "held_values", "local_arrays", "shared", "share_arrays", "describe",
           "start_reduction", "flat_views", "Reduction", "reads_values", "needs_values",
           "for_world", "for_shards"]


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


# ------------------------------------------------------------- the shards container's operations
def held_values(shards, fn: str) -> dict:
    """``shards`` as ``{rank: array}``; for a :class:`MetaBuffer`, :func:`no_values`' error
    (what a tensor's value accessors call first)."""
    if type(shards) is MetaBuffer:
        raise no_values(fn)
    return shards


def local_arrays(t):
    """``t``'s shards as ``{rank: array}``, or None where they are no arrays (shape-only):
    what code working on the arrays directly (a multi-tensor optimizer kernel, a gradient's
    compaction) asks before it reads them, taking the ops' way otherwise."""
    shards = t._shards
    return None if type(shards) is MetaBuffer else shards


def shared(shards):
    """A container holding the same arrays (``dict(shards)``), or the same buffer: what
    ``set_`` gives the tensor it sets."""
    return shards if type(shards) is MetaBuffer else dict(shards)


def share_arrays(a, b, every: bool = False) -> bool:
    """Whether the containers ``a`` and ``b`` hold one array in common (``every``: the very
    same arrays, for the same ranks); two shape-only tensors share when their buffer is
    one."""
    if a is b:
        return True
    if type(a) is not dict or type(b) is not dict or not a:
        return False
    if every:
        return a.keys() == b.keys() and all(a[r] is b[r] for r in a)
    return any(x is y for x, y in zip(a.values(), b.values()))


def describe(shards) -> str:
    """What a tensor's ``repr`` adds for its shards: ``", meta"`` for a shape-only one."""
    return ", meta" if type(shards) is MetaBuffer else ""


# -------------------------------------------------------------------- gradient buckets
def start_reduction(bucket):
    """Start a gradient bucket's one reduction (:mod:`ctensor.gradsync`): its members'
    arrays packed and reduced (``bucket.reduce_arrays()``), or, shape-only, the reduction
    recorded (:class:`Reduction`). Either has ``test()`` and ``wait()``; :func:`flat_views`
    cuts what ``wait()`` gives."""
    if type(bucket.members[0][1]._shards) is MetaBuffer:
        return Reduction(bucket)
    return bucket.reduce_arrays()


def flat_views(reduced, targets: list) -> list:
    """Per layout of ``targets``, in order, its shards as consecutive views of the reduced
    flat buffers ``reduced`` (``{rank: 1-D array}``); shape-only: the one buffer, shared."""
    if type(reduced) is MetaBuffer:
        return [reduced] * len(targets)
    out, offset = [], dict.fromkeys(reduced, 0)
    for target in targets:
        shards = {}
        for rank, flat in reduced.items():
            shape = target.local_shape(rank)
            n = int(np.prod(shape, dtype=np.int64))
            shards[rank] = flat[offset[rank]:offset[rank] + n].reshape(shape)
            offset[rank] += n
        out.append(shards)
    return out


class Reduction:
    """A gradient bucket's reduction in a shape-only run: recorded when made, as the real
    reduction logs itself (``bucket.record(elements per rank, bytes fed)``); its members'
    reduced gradients are views of one flat buffer (``wait()``), as in a real run."""

    __slots__ = ("buffer",)

    def __init__(self, bucket) -> None:
        members, placement = bucket.members, bucket.placement
        fed = sum(rank_bytes(g._layout) for _, g, _, _ in members)
        result = sum(rank_bytes(t) for _, _, t, _ in members)
        if any(placement.shape[a] > 1 for a in bucket.axes):
            first = int(fed if isinstance(fed, int) else np.asarray(fed).reshape(-1)[0])
            total = fed * placement.size if isinstance(fed, int) else int(np.sum(fed))
            bucket.record(first // bucket.dtype.itemsize, total)
        self.buffer = MetaBuffer(placement, result)

    def test(self) -> bool:
        return True

    def wait(self) -> MetaBuffer:
        return self.buffer


# ---------------------------------------------------------------- code that reads values
def for_world(with_values: Callable, shape_only: Callable) -> Callable:
    """The one of two implementations of a thing that the world in force runs: ``with_values``
    in a real run or simulation, ``shape_only`` in ``ct.simulate(n, meta=True)``.

    >>> x = ct.meta.for_world(_from_arrays, _from_layout)(local, placement, sbp)
    """
    return shape_only if world().meta else with_values


def for_shards(shards, with_arrays: Callable, shape_only: Callable) -> Callable:
    """The one of two implementations that a shards container takes: ``with_arrays`` for
    ``{rank: array}``, ``shape_only`` for a :class:`MetaBuffer` (memory accounting)."""
    return shape_only if type(shards) is MetaBuffer else with_arrays


def reads_values(default=None) -> Callable:
    """Decorate a function that reads tensor values (a check of the data, a logged loss): in
    a shape-only world it is not called and gives ``default`` (nothing to read), so a plan
    records none of its ops.

    >>> @ct.meta.reads_values(default=float("nan"))
    ... def loss_value(total): return float(total.item())
    """
    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(*args, **kwargs):
            return default if world().meta else fn(*args, **kwargs)
        return run
    return decorate


def needs_values(error) -> None:
    """Raise ``error`` (an exception, or a function making one: made only when raised) in a
    shape-only world: the check of an argument that cannot work without values (a
    timeline of measured times, a data-dependent shape)."""
    if world().meta:
        raise error if isinstance(error, BaseException) else error()
