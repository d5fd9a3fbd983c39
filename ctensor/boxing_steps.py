"""The steps of a boxing plan (:mod:`ctensor.boxing`): one class per kind of move — the
collectives on a mesh axis's sub-groups (all-gather, all-to-all, all-reduce,
reduce-scatter), the local ones (slice, to-partial, relabel, rehome) and the exchange
across placements. Each step runs on every rank's shards (``run``), and those with a
nonblocking form also start (``start``) for :func:`ctensor.boxing.box_start`. With
:mod:`ctensor.boxing` and ``comm/``, the only code that moves tensor data.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from . import cost as cost_model
from . import debug
from .comm.base import Message, Pending
from .layout import Layout, intersect, slices
from .arrays import array_module, to_device, to_host
from .sbp import ReduceOp, Split, SBP


__all__ = []  # (private to ctensor.boxing)


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
