"""Boxing: turn a tensor's shards from one (placement, SBP) into another.

A plan is a short list of steps computed once per (source layout, target layout) and
cached; one executor loop runs it. Rules per mesh axis (1-D):

======== =========== ================= ==================
 from     to B        to S(j)           to P
======== =========== ================= ==================
 S(i)     all-gather  all-to-all (i!=j) local: pad with the identity
 B        --          local slice       local: index 0 keeps, others identity
 P        all-reduce  reduce-scatter    P(op)->P(op'): all-reduce then local
======== =========== ================= ==================

N-D meshes: one step per changed mesh axis on that axis's sub-groups. When the changed
axes touch disjoint tensor dims the steps are independent (scatters run first so later
steps move less). When splits of one dim nest over several axes, the changed axes (and any
later axis nested inside them) are first unwound to B from the innermost axis outwards,
then rebuilt from the outermost inwards, which keeps the nesting order of the uneven rule.

Across placements (other ranks, other mesh shape, cpu<->cuda) each target rank receives the
intersections of its region with the source regions by point-to-point transfers, after the
source's partial axes are reduce-scattered; a partial target is rebuilt locally.

Two executors run the same plans. :func:`box` runs every step to its end. :func:`box_start`
is the asynchronous one (start -> handle -> wait): it runs the steps in order until one that
has a nonblocking form — an exchange (``comm.exchange_start``: a sender never waits for its
receiver), an all-reduce, reduce-scatter or all-gather (``comm.*_start``) — starts that one
and returns a :class:`~ctensor.comm.base.Pending`; ``wait()`` completes it and runs the rest
of the plan. Pipeline stages hand their outputs over with it; gradient buckets
(:func:`reduce_flat`) and parameter prefetching use the same started collectives.

This module (its steps in :mod:`ctensor.boxing_steps`) and ``comm/`` are the only places that
move tensor data (gradient buckets go
through :func:`reduce_flat` here); besides them only the runtime's ``World.exchange`` /
``World.agree`` talk to a communicator, for small Python objects (checks of metadata).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable

import numpy as np

from . import debug
from .comm import context
from .comm.base import Pending
from .layout import Layout
from .runtime import world
from .sbp import Broadcast, Partial, ReduceOp, Split, SBP
from .boxing_steps import (_AllGather, _AllReduce, _AllToAll, _Exchange, _Rehome,
                           _ReduceScatter, _Relabel, _Slice, _ToPartial, _dims)

__all__ = ["box", "box_start", "plan", "cost", "reduce_flat"]


# ----------------------------------------------------------------------------- planning
def _axis_steps(layout: Layout, axis: int, target: SBP) -> list:
    """1-D conversion of one mesh axis; valid when no later axis splits the same dims."""
    src = layout.sbp[axis]
    steps = []

    def then(entry: SBP, make: Callable):
        nonlocal layout
        sbp = list(layout.sbp)
        sbp[axis] = entry
        after = layout.with_sbp(sbp)
        steps.append(make(layout, after))
        layout = after

    if src == target:
        return steps
    if layout.placement.shape[axis] == 1:
        then(target, lambda b, a: _Relabel(b, a, axis))
        return steps
    if isinstance(src, Partial) and isinstance(target, Partial):  # P(op) -> P(op')
        then(Broadcast(), lambda b, a: _AllReduce(b, a, axis, src.op))
        src = Broadcast()
    if isinstance(src, Split):
        if isinstance(target, Split):
            then(target, lambda b, a: _AllToAll(b, a, axis, target.dim, src.dim))
        elif isinstance(target, Broadcast):
            then(target, lambda b, a: _AllGather(b, a, axis, src.dim))
        else:
            then(target, lambda b, a: _ToPartial(b, a, axis, target.op, from_split=True))
    elif isinstance(src, Broadcast):
        if isinstance(target, Split):
            then(target, lambda b, a: _Slice(b, a, axis))
        else:
            then(target, lambda b, a: _ToPartial(b, a, axis, target.op, from_split=False))
    else:  # Partial -> B / S
        if isinstance(target, Split):
            then(target, lambda b, a: _ReduceScatter(b, a, axis, src.op, target.dim))
        else:
            then(target, lambda b, a: _AllReduce(b, a, axis, src.op))
    return steps


def _same_placement_steps(src: Layout, dst_sbp: tuple) -> list:
    n = len(dst_sbp)
    steps, layout = [], src
    # a mesh axis of size 1 holds the whole tensor whatever its entry: changing it is a
    # relabel, and its split nests nothing (else S(0) -> B there, under a split of dim 0 on
    # a later axis, would unwind that split: an all-gather for nothing)
    for a in range(n):
        if src.placement.shape[a] == 1 and src.sbp[a] != dst_sbp[a]:
            steps += _axis_steps(layout, a, dst_sbp[a])
            layout = steps[-1].after
    src = layout
    changed = [a for a in range(n) if src.sbp[a] != dst_sbp[a]]
    touched = {a: _dims(src.sbp[a]) | _dims(dst_sbp[a]) if src.placement.shape[a] > 1
               else set() for a in range(n)}
    # a later axis whose split nests inside a changed axis's dims must be rebuilt too
    for b in range(n):
        if b not in changed and any(a < b and touched[a] & touched[b] for a in changed):
            changed.append(b)
    changed.sort()
    independent = all(not (touched[a] & touched[b]) for a in changed for b in changed if a < b)
    if independent:
        # scatters first (later steps then move less), gathers and reductions last
        def order(a):
            t = dst_sbp[a]
            return 0 if isinstance(t, Split) else 1 if isinstance(t, Partial) else 2
        for a in sorted(changed, key=order):
            new = _axis_steps(layout, a, dst_sbp[a])
            steps += new
            layout = new[-1].after if new else layout
        return steps
    for a in reversed(changed):  # unwind, innermost split first
        new = _axis_steps(layout, a, Broadcast())
        steps += new
        layout = new[-1].after if new else layout
    for a in changed:  # rebuild, outermost first
        new = _axis_steps(layout, a, dst_sbp[a])
        steps += new
        layout = new[-1].after if new else layout
    return steps


def _without_partial(layout: Layout, scatter: bool) -> tuple:
    """``layout``'s SBP with partial axes replaced by a split of the largest dim (``scatter``)
    or by broadcast."""
    dims = [d for d in np.argsort(layout.shape, kind="stable")[::-1]] if layout.ndim else []
    repl = Split(int(dims[0])) if scatter and dims else Broadcast()
    return tuple(repl if isinstance(s, Partial) else s for s in layout.sbp)


@lru_cache(maxsize=4096)
def plan(src: Layout, dst: Layout) -> tuple:
    """The cached list of steps that turns ``src`` shards into ``dst`` shards."""
    if src.placement == dst.placement:
        return tuple(_same_placement_steps(src, dst.sbp))
    steps = []
    mid_sbp = _without_partial(src, scatter=True)
    steps += _same_placement_steps(src, mid_sbp)
    mid = src.with_sbp(mid_sbp)
    landed = Layout(dst.shape, dst.dtype, dst.placement, _without_partial(dst, scatter=False))
    steps.append(_Rehome(mid, landed) if _Rehome.applies(mid, landed) else
                 _Exchange(mid, landed))
    steps += _same_placement_steps(landed, dst.sbp)
    return tuple(steps)


def aliases(src: Layout, dst: Layout) -> bool:
    """Whether boxing ``src`` into ``dst`` gives views of the source shards (slices and
    relabels only), so that writes to the source show in the result."""
    return all(step.aliases for step in plan(src, dst))


def communicates(src: Layout, dst: Layout) -> bool:
    """Whether boxing ``src`` into ``dst`` moves data between ranks."""
    return any(not step.local for step in plan(src, dst))


def cost(src: Layout, dst: Layout) -> float:
    """Estimated seconds of boxing ``src`` into ``dst`` (see :mod:`ctensor.cost`)."""
    return sum(step.cost() for step in plan(src, dst))


def box_start(shards: dict, src: Layout, dst: Layout) -> Pending:
    """Start the plan from ``src`` to ``dst`` (the asynchronous executor, see the module
    docstring): returns a :class:`~ctensor.comm.base.Pending` whose ``wait()`` gives the
    ``{rank: array}`` shards of ``dst``. Every rank of the world calls it and its ``wait``
    at the same points of the program, as with :func:`box`; a rank that only sends has
    nothing to wait for.

    >>> pending = box_start(x._shards, x._layout, target)    # the data starts moving
    >>> shards = pending.wait()                               # ... and is here
    """
    if src is dst:
        return Pending(shards)
    return _resume(plan(src, dst), 0, shards, src, dst, context.op_stack[-1])


def _resume(steps: tuple, i: int, shards: dict, src: Layout, dst: Layout, op: str) -> Pending:
    """Run ``steps[i:]`` until one starts communicating in the background; the returned
    handle's ``wait()`` finishes that one and resumes after it (under the op name ``op``
    the plan was started for, so logs and fingerprints name it)."""
    comm = None
    while i < len(steps):
        step = steps[i]
        i += 1
        if step.local:
            shards = step.run(None, shards)
            continue
        if comm is None:
            comm = world().comm_for(src.placement.device, dst.placement.device)
        with debug.boxing_step(step):
            if not step.starts:
                shards = step.run(comm, shards)
                continue
            pending = step.start(comm, shards)
        if i == len(steps):
            return pending
        rest = i

        def wait(pending=pending, rest=rest) -> dict:
            context.op_stack.append(op)
            try:
                return _resume(steps, rest, pending.wait(), src, dst, op).wait()
            finally:
                context.op_stack.pop()

        return Pending(wait=wait, test=pending.test)
    return Pending(shards)


def box(shards: dict, src: Layout, dst: Layout) -> dict:
    """Run the plan from ``src`` to ``dst`` on this process's ``{rank: array}`` shards."""
    if src is dst:
        return shards
    comm = None
    for step in plan(src, dst):
        if step.local:  # the hot path of B -> S slices: no communicator needed
            shards = step.run(None, shards)
            continue
        if comm is None:
            comm = world().comm_for(src.placement.device, dst.placement.device)
        with debug.boxing_step(step):  # names the step in collective fingerprints
            shards = step.run(comm, shards)
    return shards


# ----------------------------------------------------------------------------- flat buffers
def _group(placement, rank: int, axes: tuple) -> tuple:
    """The ranks sharing ``rank``'s mesh coordinates on every axis but ``axes``, in mesh
    order (one axis: :meth:`Placement.axis_group`)."""
    if len(axes) == 1:
        return placement.axis_group(rank, axes[0])
    coord = placement.coord(rank)
    return tuple(r for r in placement.rank_list
                 if all(c == coord[a] for a, c in enumerate(placement.coord(r))
                        if a not in axes))


class _Flat:
    """The communication-log view of one flat-buffer reduction (what ``debug.record``
    reads of a step)."""

    def __init__(self, placement, axes, scatter, dtype, numel):
        self.collective = "reduce_scatter" if scatter else "all_reduce"
        self.mesh_axis = axes[0] if len(axes) == 1 else None
        sbp = tuple(Partial() if a in axes else Broadcast() for a in range(placement.ndim))
        after = tuple((Split(0) if scatter else Broadcast()) if a in axes else Broadcast()
                      for a in range(placement.ndim))
        self.before = Layout((numel,), dtype, placement, sbp)
        self.after = Layout((numel,), dtype, placement, after)


def reduce_flat(flats: dict, placement, axes: tuple, scatter_sizes, dtype, count: int):
    """Start the sum of the 1-D ``{rank: buffer}`` over the groups of mesh ``axes``: an
    all-reduce, or (``scatter_sizes``: ``{rank: the segment size of each member of its
    group}``) a reduce-scatter.
    Returns a :class:`~ctensor.comm.base.Pending` of the ``{rank: result}``. Used for
    gradient buckets (``count`` gradients in each buffer)."""
    comm = world().comm_for(placement.device)
    record = _Flat(placement, axes, scatter_sizes is not None, dtype,
                   int(next(iter(flats.values())).size) if flats else 0)
    pending, done = [], set()
    with debug.boxing_step(record):
        for r in flats:
            if r in done:
                continue
            group = _group(placement, r, axes)
            held = {g: flats[g] for g in group if g in flats}
            done.update(held)
            if len(group) == 1:
                continue
            if scatter_sizes is None:
                pending.append(comm.all_reduce_start(group, held, ReduceOp.SUM))
            else:
                pending.append(comm.reduce_scatter_start(group, held, ReduceOp.SUM, 0,
                                                         scatter_sizes[next(iter(held))]))
    if any(placement.shape[a] > 1 for a in axes):  # on every rank, as boxing steps are
        debug.record(record, sum(int(a.nbytes) for a in flats.values()))

    def wait() -> dict:
        out = dict(flats)
        for p in pending:
            out.update(p.wait())
        return out

    def test() -> bool:
        return all(p.test() for p in pending)

    return Pending(wait=wait, test=test)
