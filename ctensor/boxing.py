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

This module and ``comm/`` are the only places that move tensor data (gradient buckets go
through :func:`reduce_flat` here); besides them only the runtime's ``World.exchange`` /
``World.agree`` talk to a communicator, for small Python objects (checks of metadata).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from functools import lru_cache
from typing import Callable

import numpy as np

from . import cost as cost_model
from . import debug
from .comm import context
from .comm.base import Message, Pending
from .layout import Layout, intersect, slices
from .arrays import array_module, to_device, to_host
from .runtime import world
from .sbp import Broadcast, Partial, ReduceOp, Split, SBP

__all__ = ["box", "box_start", "plan", "cost", "reduce_flat"]


# ----------------------------------------------------------------------------- helpers
def _dims(entry: SBP) -> set:
    return {entry.dim} if isinstance(entry, Split) else set()


# ----------------------------------------------------------------------------- steps
class _Step(ABC):
    """One stage of a plan: ``before`` layout -> ``after`` layout."""

    collective = "local"
    #: a step that moves nothing between ranks (it needs no communicator)
    local = False
    #: a local step whose result shares memory with its input (a view)
    aliases = False

    def __init__(self, before: Layout, after: Layout, mesh_axis: int | None = None):
        self.before, self.after, self.mesh_axis = before, after, mesh_axis

    def cost(self) -> float:
        """Estimated seconds of this step on the slowest rank (see :mod:`ctensor.cost`)."""
        return 0.0

    @abstractmethod
    def run(self, comm, shards: dict) -> dict:
        """Turn this process's ``{rank: array}`` from ``before`` into ``after``."""

    #: whether :meth:`start` can return before the step's communication is over
    starts = False

    def start(self, comm, shards: dict) -> Pending:
        """:meth:`run`, started (see :func:`box_start`); here it runs at once."""
        return Pending(self.run(comm, shards))

    def __repr__(self) -> str:
        axis = "" if self.mesh_axis is None else f" axis {self.mesh_axis}"
        return (f"{self.collective}{axis}: {self.before.sbp} -> {self.after.sbp}")


class _GroupStep(_Step):
    """A collective over the sub-groups of one mesh axis."""

    @abstractmethod
    def run_group(self, comm, group: tuple, held: dict) -> dict:
        """The collective over one sub-group; ``held`` are this process's members."""

    def _groups(self, shards):
        """Each sub-group of the mesh axis with this process's members in it, once."""
        done = set()
        for r in shards:
            if r in done:
                continue
            group = self.before.placement.axis_group(r, self.mesh_axis)
            held = {g: shards[g] for g in group if g in shards}
            done.update(held)
            yield group, held

    def run(self, comm, shards):
        out = {}
        for group, held in self._groups(shards):
            out.update(self.run_group(comm, group, held))
        debug.record(self, sum(int(a.nbytes) for a in shards.values()) if shards else 0)
        return out

    def start(self, comm, shards):
        if not self.starts:
            return Pending(self.run(comm, shards))
        pending = [self.start_group(comm, group, held)
                   for group, held in self._groups(shards)]
        debug.record(self, sum(int(a.nbytes) for a in shards.values()) if shards else 0)

        def wait() -> dict:
            out = {}
            for p in pending:
                out.update(p.wait())
            return out

        return Pending(wait=wait, test=lambda: all(p.test() for p in pending))

    def start_group(self, comm, group: tuple, held: dict) -> Pending:
        """:meth:`run_group`, started (the steps whose collective has a started form)."""
        return Pending(self.run_group(comm, group, held))

    def group_size(self) -> int:
        return self.before.placement.shape[self.mesh_axis]

    def _time(self, layout: Layout) -> float:
        """The collective's time for ``layout``'s largest shard (rank 0 of the mesh holds
        the largest part under the uneven rule)."""
        p = layout.placement
        return cost_model.collective(self.collective, self.group_size(),
                                     layout.local_nbytes(p.rank_list[0]), p.device)


class _AllGather(_GroupStep):
    collective = "all_gather"

    def __init__(self, before, after, mesh_axis, dim):
        super().__init__(before, after, mesh_axis)
        self.dim = dim

    def cost(self):
        return self._time(self.after)

    starts = True

    def run_group(self, comm, group, held):
        sizes = [self.before.local_shape(g)[self.dim] for g in group]
        return comm.all_gather(group, held, self.dim, sizes)

    def start_group(self, comm, group, held):
        sizes = [self.before.local_shape(g)[self.dim] for g in group]
        return comm.all_gather_start(group, held, self.dim, sizes)


class _AllToAll(_GroupStep):
    collective = "all_to_all"

    def __init__(self, before, after, mesh_axis, split_dim, concat_dim):
        super().__init__(before, after, mesh_axis)
        self.split_dim, self.concat_dim = split_dim, concat_dim

    def cost(self):
        return self._time(self.before)

    def run_group(self, comm, group, held):
        split_sizes = [self.after.local_shape(g)[self.split_dim] for g in group]
        concat_sizes = [self.before.local_shape(g)[self.concat_dim] for g in group]
        return comm.all_to_all(group, held, self.split_dim, split_sizes, self.concat_dim,
                               concat_sizes)


class _AllReduce(_GroupStep):
    collective = "all_reduce"

    def __init__(self, before, after, mesh_axis, op: ReduceOp):
        super().__init__(before, after, mesh_axis)
        self.op = op

    def cost(self):
        return self._time(self.before)

    starts = True

    def run_group(self, comm, group, held):
        return comm.all_reduce(group, held, self.op)

    def start_group(self, comm, group, held):
        return comm.all_reduce_start(group, held, self.op)


class _ReduceScatter(_GroupStep):
    collective = "reduce_scatter"

    def __init__(self, before, after, mesh_axis, op: ReduceOp, dim: int):
        super().__init__(before, after, mesh_axis)
        self.op, self.dim = op, dim

    def cost(self):
        return self._time(self.before)

    starts = True

    def run_group(self, comm, group, held):
        sizes = [self.after.local_shape(g)[self.dim] for g in group]
        return comm.reduce_scatter(group, held, self.op, self.dim, sizes)

    def start_group(self, comm, group, held):
        sizes = [self.after.local_shape(g)[self.dim] for g in group]
        return comm.reduce_scatter_start(group, held, self.op, self.dim, sizes)


class _Slice(_Step):
    """B -> S(d): keep this rank's part."""

    collective = "slice"
    local = True
    aliases = True
    _index = None  # rank -> index of its part, computed on first use

    def run(self, comm, shards):
        index = self._index
        if index is None:
            index = self._index = {r: slices(self.after.region(r), self.before.region(r))
                                   for r in self.before.placement.rank_list}
        return {r: a[index[r]] for r, a in shards.items()}


class _ToPartial(_Step):
    """B -> P or S -> P: the rank at index 0 of the axis (B) or each rank's own region (S)
    keeps its values inside an identity-filled array of the new local shape."""

    collective = "pad_partial"
    local = True

    def __init__(self, before, after, mesh_axis, op: ReduceOp, from_split: bool):
        super().__init__(before, after, mesh_axis)
        self.op, self.from_split = op, from_split

    def cost(self):
        # moves nothing, but ranks other than index 0 write an identity-filled array of the
        # new (full, for S -> P) shard size; the reduction the partial result needs later
        # is charged to whichever op makes it (cost.deferred)
        p = self.after.placement
        return cost_model.compute(p.device, self.after.local_nbytes(p.rank_list[0]))

    def run(self, comm, shards):
        out = {}
        p = self.before.placement
        for r, a in shards.items():
            if not self.from_split and p.coord(r)[self.mesh_axis] == 0:
                out[r] = a
                continue
            xp = array_module(a)
            full = xp.full(self.after.local_shape(r), self.op.identity(a.dtype), dtype=a.dtype)
            if self.from_split:
                full[slices(self.before.region(r), self.after.region(r))] = a
            out[r] = full
        return out


class _Relabel(_Step):
    """Any SBP change on a mesh axis of size 1: the single rank's array is already right."""

    collective = "relabel"
    local = True
    aliases = True

    def run(self, comm, shards):
        return shards


class _Rehome(_Step):
    """Onto another placement of the same device where every target rank already holds its
    region in the source (a broadcast tensor over all ranks taken on a 2-D mesh of them): a
    local slice of each rank's own shard, no message."""

    collective = "rehome"
    local = True
    aliases = True

    @staticmethod
    def applies(before: Layout, after: Layout) -> bool:
        if before.placement.device != after.placement.device:
            return False
        source = set(before.placement.rank_list)
        return all(d in source and intersect(after.region(d), before.region(d)) ==
                   after.region(d) for d in after.placement.rank_list)

    def run(self, comm, shards):
        before, after = self.before, self.after
        return {d: shards[d][slices(after.region(d), before.region(d))]
                for d in after.placement.rank_list if d in shards}


class _Exchange(_Step):
    """Point-to-point move of intersecting regions between two placements."""

    collective = "send_recv"

    def __init__(self, before: Layout, after: Layout):
        super().__init__(before, after)
        self.messages = self._route()

    def _route(self) -> list:
        src, dst = self.before, self.after
        # source regions, each with the ranks holding a replica of it
        holders: dict = {}
        for r in src.placement.rank_list:
            holders.setdefault(src.region(r), []).append(r)
        messages, tag = [], {}
        for i, d in enumerate(dst.placement.rank_list):
            want = dst.region(d)
            for region, ranks in holders.items():
                piece = intersect(want, region)
                if piece is None:
                    continue
                s = d if d in ranks else ranks[i % len(ranks)]
                t = tag.get((s, d), 0)
                tag[(s, d)] = t + 1
                messages.append((Message(s, d, t, tuple(b - a for a, b in piece), src.dtype),
                                 piece))
        return messages

    def cost(self):
        # the busiest rank: what it sends plus what it receives
        load: dict = {}
        for m, _ in self.messages:
            if m.src != m.dst:
                nbytes = int(np.prod(m.shape, dtype=np.int64)) * self.before.dtype.itemsize
                load[m.src] = load.get(m.src, 0) + nbytes
                load[m.dst] = load.get(m.dst, 0) + nbytes
        if not load:
            return 0.0
        return cost_model.collective("send_recv", 2, max(load.values()),
                                     self.after.placement.device)

    def _sends(self, comm, shards, snapshot: bool) -> dict:
        """The piece of every message this process sends (``snapshot``: copies, so that
        writes to the source after a started exchange do not change what arrives)."""
        sends = {m: shards[m.src][slices(piece, self.before.region(m.src))]
                 for m, piece in self.messages if m.src in shards}
        for m in list(sends):  # a host communicator needs host arrays across processes
            if m.dst not in comm.held_ranks and not getattr(comm, "device_arrays", False):
                sends[m] = to_host(sends[m])
            elif snapshot:
                sends[m] = sends[m].copy()
        return sends

    def run(self, comm, shards):
        sends = self._sends(comm, shards, snapshot=False)
        received = comm.exchange([m for m, _ in self.messages], sends)
        return self._assemble(comm, shards, received)

    starts = True

    def start(self, comm, shards):
        sends = self._sends(comm, shards, snapshot=True)
        pending = comm.exchange_start([m for m, _ in self.messages], sends)
        held = {r: None for r in shards}  # which sources this process holds, for the log
        return Pending(wait=lambda: self._assemble(comm, held, pending.wait(), private=True),
                       test=pending.test)

    def _assemble(self, comm, shards, received, private: bool = False) -> dict:
        """Each held target rank's shard, put together from the pieces it received
        (``private``: the received arrays belong to nobody else, so a single piece that is
        the whole shard is taken as it is)."""
        out = {}
        device, dtype = self.after.placement.device, self.after.dtype
        xp = array_module(device)
        for d in self.after.placement.rank_list:
            if d not in comm.held_ranks:
                continue
            want = self.after.region(d)
            shape = tuple(b - a for a, b in want)
            pieces = [m for m, _ in self.messages if m.dst == d]
            if private and len(pieces) == 1:
                arr = received[pieces[0]]
                if arr.shape == shape and arr.dtype == dtype and arr.flags.c_contiguous \
                        and array_module(arr) is xp:
                    out[d] = arr
                    continue
            buf = xp.empty(shape, dtype=dtype)
            for m, piece in self.messages:
                if m.dst == d:
                    buf[slices(piece, want)] = to_device(received[m], device)
            out[d] = buf
        debug.record(self, sum(int(np.prod(m.shape, dtype=np.int64)) * dtype.itemsize
                               for m, _ in self.messages
                               if m.src != m.dst and (m.src in shards or m.dst in out)))
        return out


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
    changed = [a for a in range(n) if src.sbp[a] != dst_sbp[a]]
    touched = {a: _dims(src.sbp[a]) | _dims(dst_sbp[a]) for a in range(n)}
    # a later axis whose split nests inside a changed axis's dims must be rebuilt too
    for b in range(n):
        if b not in changed and any(a < b and touched[a] & touched[b] for a in changed):
            changed.append(b)
    changed.sort()
    independent = all(not (touched[a] & touched[b]) for a in changed for b in changed if a < b)
    steps, layout = [], src
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
