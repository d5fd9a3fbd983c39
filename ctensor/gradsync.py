"""Bucketed gradient synchronisation: the end of ``backward()`` for leaf gradients.

A leaf's gradient is *final* once every op that used the leaf has run its backward. The
autograd engine hands each final gradient here, in the order they become final (the same
on every rank: it depends on the graph only). A gradient whose layout differs from its
destination (the leaf's layout, or the one set with :func:`ctensor.autograd.grad_layout`)
only by partial sums to reduce — ``P -> B`` (data parallelism: an all-reduce) or, on one
mesh axis, ``P -> S(d)`` (sharded states: a reduce-scatter) — joins a **bucket** of
gradients needing the same reduction over the same mesh axes. A bucket is flattened into
one buffer per rank and reduced by one collective, started (nonblocking where the backend
allows) as soon as it holds :func:`bucket_size` bytes, while the backward goes on; every
bucket is waited on before ``backward()`` returns (with :func:`set_bucket_overlap` ``(False)``
the same buckets start only once the backward is done: the reduction after backward, to
compare against). Gradients that need another move (a
gather, say) are boxed one by one. Every bucket appears in ``ct.debug.comm_log()`` as op
``grad_sync``.

For a reduce-scatter the buffer is packed by rank: segment ``r`` holds, for every gradient
of the bucket, its part ``r`` along its split dim (the uneven rule), so the one collective
leaves each rank exactly its shard of every gradient.
"""
from __future__ import annotations

from . import boxing, debug, memory
from . import timing as _profile
from .arrays import array_module
from .comm import context
from .layout import Layout, same_shards
from .meta import flat_views, local_arrays, share_arrays, start_reduction
from .registry import OPS
from .sbp import Broadcast, Partial, ReduceOp, Split, split_range

__all__ = ["bucket_size", "set_bucket_size", "bucket_overlap", "set_bucket_overlap",
           "Synchronizer", "DEFAULT_BUCKET_MB"]

#: the default bucket size in MiB (PyTorch DDP's default)
DEFAULT_BUCKET_MB = 25.0
_bucket_bytes = int(DEFAULT_BUCKET_MB * 2**20)
_overlap = True


def bucket_size() -> int:
    """The bucket size in bytes: a bucket's reduction starts once it holds this much."""
    return _bucket_bytes


def set_bucket_size(megabytes: float) -> None:
    """Set the gradient bucket size in MiB (default 25, like PyTorch DDP); ``0`` reduces
    every gradient on its own, as soon as it is final. Call it alike on every rank.

    >>> ct.autograd.set_bucket_size(50)
    """
    global _bucket_bytes
    if isinstance(megabytes, bool) or not isinstance(megabytes, (int, float)) or \
            not megabytes >= 0:
        raise ValueError(f"set_bucket_size: argument 'megabytes' must be a number >= 0, got "
                         f"{megabytes!r}")
    _bucket_bytes = int(megabytes * 2**20)


def bucket_overlap() -> bool:
    """Whether a full bucket's reduction starts during the backward (the default)."""
    return _overlap


def set_bucket_overlap(overlap: bool) -> None:
    """``True`` (the default): a bucket's reduction starts as soon as it is full, while the
    backward goes on, and the engine lets it progress between backward functions.
    ``False``: the same buckets, filled in the same order, start only once the backward is
    done (PyTorch DDP without overlap): the same collectives and the same bits, for
    measuring what the overlap gains (``benchmarks/overlap.py``). Call it alike on every
    rank.

    >>> ct.autograd.set_bucket_overlap(False)
    """
    global _overlap
    if not isinstance(overlap, bool):
        raise TypeError(f"set_bucket_overlap: argument 'overlap' must be a bool, got "
                        f"{overlap!r} ({type(overlap).__name__})")
    _overlap = overlap


def _reduction(src: Layout, dst: Layout):
    """``(axes, scatter)`` when ``src`` becomes ``dst`` by reducing partial sums only:
    ``axes`` the mesh axes reduced, ``scatter`` the one ``(axis, dim)`` reduce-scattered
    (or None). ``None`` when another move is needed."""
    if src.placement != dst.placement or src.shape != dst.shape or src.dtype != dst.dtype:
        return None
    axes, scatter = [], None
    for axis, (s, d) in enumerate(zip(src.sbp, dst.sbp)):
        if s == d or src.placement.shape[axis] == 1:  # (a size-1 axis: a relabel)
            continue
        if not (isinstance(s, Partial) and s.op is ReduceOp.SUM):
            return None
        if isinstance(d, Broadcast):
            axes.append(axis)
        elif isinstance(d, Split) and scatter is None and \
                not any(isinstance(e, Split) and e.dim == d.dim for e in src.sbp):
            scatter = (axis, d.dim)
        else:
            return None
    if scatter is not None:
        if axes:  # a reduce-scatter together with all-reduces: box it on its own
            return None
        return (scatter[0],), scatter
    return (tuple(axes), None) if axes else None


def _relabelled(g, target: Layout):
    """``g``'s own shards labelled ``target`` (:func:`.layout.same_shards`): no op, no copy.
    Going through ``to_global`` cost ~30 us a gradient inside a step (69 of them,
    2.2 ms, in train.py's one-process GPT step at h=128)."""
    out = type(g)(target, g._shards)
    out._version = g._version
    return out


class _Kind:
    """What a bucket keeps of a member's gradient once packed: the tensor type to rebuild."""

    __slots__ = ("cls",)

    def __init__(self, cls) -> None:
        self.cls = cls


class _Bucket:
    """Gradients needing one reduction; filled, then reduced by one collective."""

    def __init__(self, key, placement, dtype, axes, scatter):
        self.key, self.placement, self.dtype = key, placement, dtype
        self.axes, self.scatter = axes, scatter  # scatter: the reduce-scattered axis or None
        self.members: list = []  # (leaf, grad tensor, target layout)
        self.nbytes = 0
        self.pending = None
        self.reduced = None  # finish()'s result, once taken during the backward

    def add(self, leaf, grad, target: Layout, dim=None) -> None:
        """Add a gradient; ``dim``: the dim a reduce-scatter splits (members may differ)."""
        self.members.append((leaf, grad, target, dim))
        self.nbytes += grad._layout.local_nbytes(self.placement.rank_list[0])

    # --------------------------------------------------------------- packing
    def _parts(self, grad, dim, rank: int):
        """The pieces of ``grad``'s shard on ``rank`` in buffer order (for a scatter: one
        piece per rank of the group, along the split dim ``dim``)."""
        arr = grad._shards[rank]
        if self.scatter is None:
            return [arr.reshape(-1)]
        k = self.placement.shape[self.scatter]
        n = arr.shape[dim]
        parts = []
        for i in range(k):
            a, b = split_range(n, k, i)
            index = [slice(None)] * arr.ndim
            index[dim] = slice(a, b)
            parts.append(arr[tuple(index)].reshape(-1))
        return parts

    def start(self) -> None:
        """Start the reduction (:func:`ctensor.meta.start_reduction`: shape-only, recorded)
        and drop the members' unreduced gradients."""
        self.pending = start_reduction(self)
        self._release()

    def record(self, elements: int, nbytes: int) -> None:
        """Log the reduction as the real one logs itself (``elements`` per rank, ``nbytes``
        fed by all): what a shape-only run records (:class:`ctensor.meta.Reduction`)."""
        debug.record(boxing._Flat(self.placement, self.axes, self.scatter is not None,
                                  self.dtype, elements), nbytes)

    def reduce_arrays(self):
        """Pack every member's shards into one buffer per rank and start the reduction."""
        flats, sizes = {}, None if self.scatter is None else {}
        for rank in self.members[0][1]._shards:
            xp = array_module(self.members[0][1]._shards[rank])
            pieces = [self._parts(g, dim, rank) for _, g, _, dim in self.members]
            if self.scatter is None:
                flats[rank] = xp.concatenate([p[0] for p in pieces]) if len(pieces) > 1 \
                    else pieces[0][0].copy()
            else:  # segment i: every member's part i
                k = len(pieces[0])
                segments = [xp.concatenate([p[i] for p in pieces]) for i in range(k)]
                sizes[rank] = [int(s.size) for s in segments]  # alike across a group
                flats[rank] = xp.concatenate(segments)
        return boxing.reduce_flat(flats, self.placement, self.axes, sizes, self.dtype,
                                  len(self.members))

    def _release(self) -> None:
        """Drop the members' unreduced gradients once packed (the flat buffer holds their
        values): they would otherwise stay alive until the whole backward ends."""
        self.members = [(leaf, _Kind(type(g)), target, dim)
                        for leaf, g, target, dim in self.members]

    def finish(self) -> list:
        """Wait for the reduction and give each member its reduced shard:
        ``[(leaf, reduced grad tensor)]``."""
        views = flat_views(self.pending.wait(), [t for _, _, t, _ in self.members])
        return [(leaf, grad.cls(target, shards))
                for (leaf, grad, target, _), shards in zip(self.members, views)]


class Synchronizer:
    """One ``backward()``'s leaf-gradient deposits: accumulate into ``.grad``, bucket the
    reductions, finish them all at the end (see the module docstring)."""

    def __init__(self, sync: bool):
        self.sync = sync
        self.open: dict = {}      # key -> filling bucket
        self.started: list = []   # buckets whose reduction runs, in start order
        self.full: list = []      # full buckets held until finish() (no overlap)
        self.direct: list = []    # (leaf, final grad) boxed one by one
        self.accumulated: set = set()  # ids of leaves whose reduced grad adds to .grad

    def deposit(self, leaf, g) -> None:
        """``g`` is ``leaf``'s final gradient of this backward."""
        target = getattr(leaf, "_grad_layout", None) or leaf._layout
        previous = leaf.grad
        if previous is not None:
            cast = Layout(g.shape, target.dtype, g._layout.placement, g._layout.sbp)
            if self.sync and _bucket_bytes > 0 and previous._layout is target and \
                    _reduction(cast, target) is not None:
                # an earlier backward's reduced gradient: this one is bucketed alone and
                # added to it once reduced (as DDP does), not reduced on its own at an add
                self.accumulated.add(id(leaf))
            else:
                g = OPS.add(previous, g)
        if g.dtype != leaf.dtype:
            g = OPS.to(g, leaf.dtype)
        if not self.sync:  # no_sync: keep the layout the graph produced
            self.direct.append((leaf, g))
            return
        plan = _reduction(g._layout, target) if _bucket_bytes > 0 else None
        if plan is None:
            if g._layout is not target and same_shards(g._layout, target):
                g = _relabelled(g, target)
            if g._layout == target:  # nothing to move (one rank, or already in place)
                self.direct.append((leaf, _compact(g)))
                return
            context.op_stack.append("grad_sync")  # (a plan counts it once per step)
            try:
                self.direct.append((leaf, _compact(g.to_global(target.placement,
                                                                target.sbp))))
            finally:
                context.op_stack.pop()
            return
        axes, scatter = plan
        scatter_axis = scatter[0] if scatter else None
        key = (target.placement, target.dtype, axes, scatter_axis)
        bucket = self.open.get(key)
        if bucket is None:
            bucket = self.open[key] = _Bucket(key, target.placement, target.dtype, axes,
                                              scatter_axis)
        bucket.add(leaf, g, target, scatter[1] if scatter else None)
        if bucket.nbytes >= _bucket_bytes:
            if _overlap:
                self._start(bucket)
            else:
                del self.open[key]
                self.full.append(bucket)

    def _start(self, bucket: _Bucket) -> None:
        self.open.pop(bucket.key, None)
        context.op_stack.append("grad_sync")  # names the bucket in the communication log
        packs = _profile.on and _profile.enter(_profile.BOXING, "grad_sync pack")
        try:
            bucket.start()
        finally:
            context.op_stack.pop()
            if packs:
                _profile.leave()
        self.started.append(bucket)

    def progress(self) -> None:
        """Let started reductions advance (backends that progress only when called), and
        unpack each one that has completed at once: its sum (a two-member all-reduce adds
        the swapped inputs when waited on) and views then run while the buffers are warm,
        inside the backward, instead of all at its end."""
        for bucket in self.started:
            if bucket.reduced is None and bucket.pending.test():
                unpacks = _profile.on and _profile.enter(_profile.BOXING, "grad_sync wait")
                try:
                    bucket.reduced = bucket.finish()
                finally:
                    if unpacks:
                        _profile.leave()

    def finish(self) -> None:
        """Start the remaining buckets, wait for all, and set every ``leaf.grad``."""
        for bucket in self.full + list(self.open.values()):
            self._start(bucket)
        results = list(self.direct)
        unpacks = _profile.on and _profile.enter(_profile.BOXING, "grad_sync wait")
        try:
            for bucket in self.started:
                results += bucket.reduced if bucket.reduced is not None else bucket.finish()
        finally:
            if unpacks:
                _profile.leave()
        for leaf, g in results:
            if id(leaf) in self.accumulated:
                g = OPS.add(leaf.grad, g)  # (both in the destination layout: local)
            _set_grad(leaf, g)


def _compact(g):
    """``g``, copied if a shard is a view of a larger buffer (a replicated gradient sliced
    to a split parameter's layout): a gradient lives until the next step and must not keep
    the rest of the buffer alive with it."""
    arrays = local_arrays(g)  # (shape-only: no arrays, nothing to compact)
    if arrays is not None and any(memory._root(a).nbytes > a.nbytes for a in arrays.values()):
        return OPS.clone(g)
    return g


def _set_grad(leaf, g) -> None:
    if g is leaf.grad or share_arrays(g._shards, leaf._shards):
        g = OPS.clone(g)
    leaf.grad = g.detach()
    if memory.tracking:
        memory.tag(leaf.grad, "gradients")
