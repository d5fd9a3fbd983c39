"""MPI backend: one process per rank, NumPy buffers, mpi4py *buffer* collectives.

Tensor data always goes through the uppercase (zero-pickle) calls, with the ``v``
variants where parts are uneven. Non-reducing collectives move raw bytes so every
dtype (bool, float16, complex) works; reductions use the MPI datatype of the array.
Sub-communicators are made once per group with ``Create_group`` (collective over the
group only) and cached; before any creation (``Create_group``, the guard's ``Dup``) the
members agree, timed, that they all create the same one (:meth:`Watchdog.agree`: its
group's ranks in order), so a creation never blocks forever.

Every collective is the *nonblocking* MPI call completed by a :class:`Watchdog` wait,
so no rank waits forever: after ``CTENSOR_TIMEOUT`` seconds it raises
:class:`~ctensor.errors.CommTimeoutError`, and in debug mode mismatched collectives raise
:class:`~ctensor.errors.DivergenceError` before any data moves (see ``watchdog.py``).

**The guard.** Before its data moves, every collective all-reduces (MAX) a 64-bit digest
of what this rank is about to run — per-group sequence number, collective, dtype, part
sizes and the shapes that must match — together with its complement, on a communicator
of its own (a persistent request where the MPI library has them: ~3 us per collective on
2 ranks, invisible next to a large transfer).
Every member gets the same maximum and minimum, so either all of them go on to the data
collective or all of them raise :class:`~ctensor.errors.DivergenceError` (after exchanging
their full fingerprints, so the message says what each rank runs). Ranks that disagree on
shapes, skip a collective or run another kind of collective on the same group thus never
exchange garbage, with or without debug mode; and since the data collective is posted
only after the digests agree, the world stays consistent.

:func:`install_excepthook` makes an uncaught exception on one rank abort the whole job;
:func:`install_exit_handler` makes a rank that leaves early fail the ranks waiting for it
(see :meth:`Watchdog.leave`).
"""
from __future__ import annotations

import atexit
import math
import pickle
import sys
import time
import traceback
from typing import Any, Mapping, Sequence

import numpy as np

from . import context, pairsum
from .. import timing as _profile
from ..errors import CollectiveError
from ..sbp import ReduceOp
from .base import Communicator, Group, Message, Pending, Shards, contiguous
from .buffers import (BufferPool, exact_pair_sum, flat_along, pack, parts, unpack,
                      prefix as _prefix)
from .p2p import NonblockingExchange, dtype_text as _dtype_text
from .watchdog import Call, Watchdog, env_debug, env_timeout

#: seconds the excepthook waits before aborting on a CollectiveError (answering queries
#: meanwhile), so that the other ranks, which detect the same disagreement, print their
#: own view of it first
ABORT_GRACE_SECONDS = 1.5


def _mpi():
    from mpi4py import MPI
    return MPI


def _bytes(arr: np.ndarray) -> np.ndarray:
    """Contiguous uint8 view of an array (copies only if it is not C-contiguous)."""
    return contiguous(arr).reshape(-1).view(np.uint8)


#: integer codes of what the guard digests: Python hashes ints and tuples of ints alike in
#: every process (of one Python version), while it salts the hashes of strings per process
_KIND = {name: i for i, name in enumerate(("all_reduce", "all_gather", "reduce_scatter",
                                           "all_to_all", "send_recv", "all_gather_object",
                                           "barrier"), 1)}
_REDUCTION = {ReduceOp.SUM: 1, ReduceOp.MAX: 2, ReduceOp.MIN: 3}


def _dtype_name(buf) -> str:
    dtype = getattr(buf, "dtype", None)
    if dtype is None:
        return ""
    return _dtype_text(dtype)


def _without(shape: tuple, *dims: int) -> tuple:
    """``shape`` with ``dims`` left out (the dims whose length may differ between members)."""
    return tuple(n for d, n in enumerate(shape) if d not in dims)


class _Channel:
    """The communicators of one group: ``data`` for its collectives, ``guard`` for the digest
    all-reduce before each of them (its own communicator, so the two never interleave)."""

    __slots__ = ("data", "guard", "peers", "mine", "seen", "_request", "_MPI")

    def __init__(self, MPI, data, peers: list):
        self._MPI = MPI
        self.data = data
        self.guard = data.Dup()
        self.peers = peers
        self.mine = np.zeros(2, dtype=np.int64)
        self.seen = np.zeros(2, dtype=np.int64)
        # an MPI-4 persistent collective, set up once and started per collective; an MPI
        # library older than MPI-4 (Open MPI 4, MPICH 3) lacks it: start_guard then posts
        # a plain Iallreduce each time
        try:
            self._request = self.guard.Allreduce_init(self.mine, self.seen, op=MPI.MAX)
        except (NotImplementedError, MPI.Exception):
            self._request = None

    def start_guard(self, digest: int):
        """Start the all-reduce of ``(digest, ~digest)``; agreed when :meth:`agreed`."""
        self.mine[0], self.mine[1] = digest, ~digest
        if self._request is None:
            return self.guard.Iallreduce(self.mine, self.seen, op=self._MPI.MAX)
        self._request.Start()
        return self._request

    def agreed(self) -> bool:
        """Every member's digest equals this one's: the maximum of ``digest`` and of
        ``~digest`` (``-min(digest) - 1``) are both this rank's own."""
        return bool(self.seen[0] == self.mine[0] and self.seen[1] == self.mine[1])

    def free(self) -> None:
        """Release the persistent request (MPICH reports unfreed ones at finalize)."""
        if self._request is not None and self._request.Test():
            self._request.Free()
            self._request = None


class MPICommunicator(NonblockingExchange, Communicator):
    """Wraps ``MPI.COMM_WORLD``; this process holds exactly its own rank.

    ``check_consistency`` (default: ``CTENSOR_DEBUG``) turns on the fingerprint exchange
    before every collective; ``timeout`` (default: ``CTENSOR_TIMEOUT``, 60 s) bounds every
    wait.
    """

    def __init__(self, comm=None, check_consistency: bool | None = None,
                 timeout: float | None = None):
        MPI = _mpi()
        self._MPI = MPI
        self.world = comm if comm is not None else MPI.COMM_WORLD
        self.size = self.world.Get_size()
        self.rank = self.world.Get_rank()
        self.held_ranks = (self.rank,)
        self._pool = BufferPool()  # receive buffers, reused across steps
        self._channels: dict[Group, _Channel] = {}
        self._seq: dict[Group, int] = {}
        self._ops = {ReduceOp.SUM: MPI.SUM, ReduceOp.MAX: MPI.MAX, ReduceOp.MIN: MPI.MIN}
        self._types: dict = {}  # (blocks, block bytes, stride bytes) -> committed datatype
        self._init_transfers()
        self.watchdog = Watchdog(MPI, self.world, env_timeout() if timeout is None else timeout,
                                 env_debug() if check_consistency is None else check_consistency)

    @property
    def check_consistency(self) -> bool:
        """Whether every collective first compares fingerprints across its members."""
        return self.watchdog.check

    @check_consistency.setter
    def check_consistency(self, enabled: bool) -> None:
        self.watchdog.check = bool(enabled)

    # ------------------------------------------------------------------ groups
    def _channel(self, group: Group, call: Call) -> _Channel:
        """The communicators of ``group`` (their rank i is ``group[i]``); made once."""
        channel = self._channels.get(group)
        if channel is None:
            # Create_group and Dup block with no timeout: the members first agree (timed)
            # that they all create this very communicator, its ranks in this order
            self.watchdog.agree(group, f"the MPI communicator of ranks {list(group)}", call)
            if group == tuple(range(self.size)):
                comm = self.world
            else:
                world_group = self.world.Get_group()
                sub = world_group.Incl(list(group))
                comm = self.world.Create_group(sub, tag=7)
                sub.Free()
                world_group.Free()
            channel = _Channel(self._MPI, comm, [g for g in group if g != self.rank])
            self._channels[group] = channel
        return channel

    def _op(self, op: ReduceOp, dtype: np.dtype):
        """The MPI reduction; bools reduce logically (sum and max are 'or', min is 'and')."""
        if dtype == np.bool_:
            return self._MPI.LAND if op is ReduceOp.MIN else self._MPI.LOR
        return self._ops[op]

    def _part_type(self, arr: np.ndarray, dim: int, size: int):
        """The MPI datatype of a part of ``size`` along ``dim`` of the C-contiguous ``arr``
        (in bytes), its extent that part's width: part ``i`` of equal parts is one of it at
        displacement ``i``. Made once per geometry."""
        trailing = math.prod(arr.shape[dim + 1:]) * arr.dtype.itemsize
        key = (math.prod(arr.shape[:dim]), size * trailing, arr.shape[dim] * trailing)
        kind = self._types.get(key)
        if kind is None:
            vector = self._MPI.BYTE.Create_vector(*key)
            kind = vector.Create_resized(0, key[1])
            vector.Free()
            kind.Commit()
            self._types[key] = kind
        return kind

    def _mine(self, group: Group, bufs: Shards):
        if self.rank not in group:
            raise RuntimeError(f"MPI collective over group {group} called on rank {self.rank}, "
                               f"which is not a member")
        return bufs[self.rank]

    def _begin(self, collective: str, group: Group, buf, args: tuple = (),
               same_shape: bool = False, guard: tuple = ()) -> tuple[Call, _Channel]:
        """Count the call on its group, say what this rank is doing, in debug mode compare
        fingerprints with the other members, and run the guard (module docstring): raises
        before any data moves if the members disagree on ``guard``."""
        if self._outbox:
            self._reap()
        seq = self._seq.get(group, 0) + 1
        self._seq[group] = seq
        op, step = context.current()
        call = Call(seq, collective, group, op, step, tuple(getattr(buf, "shape", ())),
                    _dtype_name(buf), args, same_shape, guard)
        watchdog = self.watchdog
        watchdog.doing = call
        if watchdog.check:
            watchdog.verify(call, group)
        channel = self._channel(group, call)
        request = channel.start_guard(hash((seq, _KIND[collective], guard)))
        waits = _profile.on and _profile.enter(_profile.WAIT, collective)  # for the others
        watchdog.wait([request], call, channel.peers)
        if waits:
            _profile.leave()
        if not channel.agreed():
            watchdog.disagree(call, group)
        return call, channel

    def _finish(self, requests: list, call: Call, channel: _Channel) -> None:
        watchdog = self.watchdog
        moves = _profile.on and _profile.enter(_profile.COLL, call.collective)  # data moving
        watchdog.wait(requests, call, channel.peers)
        if moves:
            _profile.leave()
        watchdog.doing = None
        watchdog.last = call

    # ------------------------------------------------------------------ collectives
    def _started(self, requests: list, call: Call, channel: _Channel, result) -> Pending:
        """A collective whose data move is posted (after the guard agreed): ``wait()``
        completes it under the watchdog and returns ``result()``."""
        def wait() -> dict:
            self.watchdog.doing = call
            self._finish(requests, call, channel)
            return result()

        def test() -> bool:
            return bool(self._MPI.Request.Testall(requests))

        self.watchdog.doing = None  # this rank goes on with other work meanwhile
        return Pending(wait=wait, test=test)

    def all_reduce(self, group, bufs, op):
        return self.all_reduce_start(group, bufs, op).wait()

    def all_reduce_start(self, group, bufs, op) -> Pending:
        """:meth:`all_reduce` as ``Iallreduce``: the guard runs now (it waits for the other
        members, as every collective's does), the data moves while the caller goes on. A
        sum over two members is exchanges and NumPy adds instead (:mod:`.pairsum`: by
        halves from 256 KiB, 0.6x-0.8x MPICH's ``Allreduce`` at 16-64 MiB on 2 ranks), the
        same bits on both."""
        buf = contiguous(self._mine(group, bufs))
        if len(group) == 1:
            return Pending({self.rank: buf.copy()})
        call, channel = self._begin("all_reduce", group, buf, (op.value,), same_shape=True,
                                    guard=(_REDUCTION[op], buf.dtype.num, buf.shape))
        out = self._pool.empty(buf.shape, buf.dtype)
        if len(group) == 2 and op is ReduceOp.SUM and exact_pair_sum(buf.dtype):
            return pairsum.all_reduce_start(self, call, channel, buf, group.index(self.rank),
                                            out)
        req = channel.data.Iallreduce(buf, out, op=self._op(op, buf.dtype))
        return self._started([req], call, channel, lambda: {self.rank: out})

    def all_gather(self, group, bufs, dim, sizes):
        return self.all_gather_start(group, bufs, dim, sizes).wait()

    def all_gather_start(self, group, bufs, dim, sizes) -> Pending:
        """:meth:`all_gather` as ``Iallgather(v)`` (see :meth:`all_reduce_start`). The
        shard is sent as it lies; the parts land in place in the result when they are
        consecutive byte ranges of it (a gather along dim 0). Otherwise the shard goes to
        each peer by ``Ialltoallv`` and equal parts are received strided in place through
        a derived datatype (uneven ones through one pooled buffer and one copy)."""
        buf = self._mine(group, bufs)
        shape = list(buf.shape)
        shape[dim] = sum(sizes)
        out = self._pool.empty(tuple(shape), buf.dtype)
        if len(group) == 1:
            out[...] = buf
            return Pending({self.rank: out})
        rest = _without(buf.shape, dim)
        call, channel = self._begin("all_gather", group, buf,
                                    (f"dim {dim}", f"sizes {list(sizes)}"),
                                    guard=(dim, tuple(sizes), buf.dtype.num, rest))
        row = math.prod(rest) * buf.dtype.itemsize
        counts = [n * row for n in sizes]
        send, comm, BYTE = _bytes(buf), channel.data, self._MPI.BYTE
        if flat_along(out, dim):  # the parts land in place, one after the other
            recv = out.reshape(-1).view(np.uint8)
            if len(set(sizes)) == 1:  # even parts: the plain collective is faster in MPICH
                req = comm.Iallgather([send, BYTE], [recv, BYTE])
            else:
                req = comm.Iallgatherv([send, BYTE], [recv, counts, _prefix(counts)[0], BYTE])
            return self._started([req], call, channel, lambda send=send: {self.rank: out})
        # strided parts: the same exchange as an all-to-all of the shard to every peer, so
        # that this rank's own part is one copy from the shard rather than two through MPI
        me, k = group.index(self.rank), len(group)
        pieces = parts(out, dim, sizes)
        sends = [0 if i == me else send.nbytes for i in range(k)]
        if len(set(sizes)) == 1 and out.size:  # equal parts: received in place
            recv = None
            spec = [out.reshape(-1).view(np.uint8), [int(i != me) for i in range(k)],
                    list(range(k)), self._part_type(out, dim, sizes[0])]
        else:
            recv_counts = [0 if i == me else c for i, c in enumerate(counts)]
            displs, total = _prefix(recv_counts)
            recv = self._pool.empty(total, np.uint8)
            spec = [recv, recv_counts, displs, BYTE]
        req = comm.Ialltoallv([send, sends, [0] * k, BYTE], spec)
        pieces[me][...] = buf

        def result(send=send) -> dict:  # (the send buffer alive until the data moved)
            if recv is not None:
                unpack(recv, pieces, skip=me)
            return {self.rank: out}

        return self._started([req], call, channel, result)

    def reduce_scatter(self, group, bufs, op, dim, sizes):
        return self.reduce_scatter_start(group, bufs, op, dim, sizes).wait()

    def reduce_scatter_start(self, group, bufs, op, dim, sizes) -> Pending:
        """:meth:`reduce_scatter` as ``Ireduce_scatter`` (see :meth:`all_reduce_start`).
        The input is reduced from where it lies when its segments are consecutive ranges of
        it (along dim 0), else from one pooled copy holding segment after segment; either
        way each segment, and so the result, is in its natural layout. A sum over two
        members is an exchange and one add instead (:func:`.pairsum.scatter_start`)."""
        buf = self._mine(group, bufs)
        me = group.index(self.rank)
        shape = list(buf.shape)
        shape[dim] = sizes[me]
        out = self._pool.empty(tuple(shape), buf.dtype)
        if len(group) == 1:
            out[...] = buf
            return Pending({self.rank: out})
        call, channel = self._begin("reduce_scatter", group, buf,
                                    (op.value, f"dim {dim}", f"sizes {list(sizes)}"),
                                    same_shape=True, guard=(_REDUCTION[op], dim, tuple(sizes),
                                                            buf.dtype.num, buf.shape))
        if len(group) == 2 and op is ReduceOp.SUM and exact_pair_sum(buf.dtype):
            return pairsum.scatter_start(self, call, channel, buf, dim, sizes, me, out)
        if flat_along(buf, dim):
            send = buf
        else:
            send = pack(self._pool, parts(buf, dim, sizes)).view(buf.dtype)
        row = math.prod(_without(buf.shape, dim))
        comm, mpi_op = channel.data, self._op(op, buf.dtype)
        # always the v variant: MPICH's Ireduce_scatter_block is ~8x slower at 1 MiB
        # (measured on 2 ranks), while Ireduce_scatter matches the blocking call
        req = comm.Ireduce_scatter(send, out, [n * row for n in sizes], op=mpi_op)
        return self._started([req], call, channel, lambda send=send: {self.rank: out})

    def all_to_all(self, group, bufs, split_dim, split_sizes, concat_dim, concat_sizes):
        """``Ialltoallv`` straight between the shard and the result where their parts are
        consecutive byte ranges (the split of dim 0 sends in place, the concatenation along
        dim 0 receives in place). Elsewhere the peers' parts are packed into one pooled
        buffer before the send, and received strided in place through a derived datatype
        (equal parts) or into one pooled buffer and one copy (uneven parts). This rank's own
        part never goes through MPI: one copy puts it in place while the others' move (on
        two members with a strided split, after them: its room held the peer's packed part)."""
        buf = self._mine(group, bufs)
        if len(group) == 1:
            return {self.rank: buf.copy()}
        call, channel = self._begin("all_to_all", group, buf,
                                    (f"split dim {split_dim} sizes {list(split_sizes)}",
                                     f"concat dim {concat_dim} sizes {list(concat_sizes)}"),
                                    guard=(split_dim, tuple(split_sizes), concat_dim,
                                           tuple(concat_sizes), buf.dtype.num,
                                           _without(buf.shape, concat_dim)))
        me = group.index(self.rank)
        shape = list(buf.shape)
        shape[split_dim] = split_sizes[me]
        shape[concat_dim] = sum(concat_sizes)
        out = self._pool.empty(tuple(shape), buf.dtype)
        sends = parts(buf, split_dim, split_sizes)  # part j goes to member j
        recvs = parts(out, concat_dim, concat_sizes)  # part i comes from member i
        send_counts = [0 if j == me else p.nbytes for j, p in enumerate(sends)]
        recv_counts = [0 if i == me else p.nbytes for i, p in enumerate(recvs)]
        BYTE = self._MPI.BYTE
        send_type = recv_type = BYTE
        room = None
        if flat_along(buf, split_dim):
            send = buf.reshape(-1).view(np.uint8)
            sdispls, _ = _prefix([p.nbytes for p in sends])
        else:  # (a derived datatype sending in place measured no faster than this copy)
            # two members: the peer's part packed into the own part's room of the result,
            # which is filled once it has gone (no pooled buffer crowds the cache)
            room = recvs[me] if len(group) == 2 and flat_along(out, concat_dim) and \
                sends[1 - me].nbytes <= recvs[me].nbytes else None
            send = pack(self._pool, sends, skip=me, into=room)
            sdispls, _ = _prefix(send_counts)
        flat, even = flat_along(out, concat_dim), len(set(concat_sizes)) == 1 and out.size
        if flat:
            recv = out.reshape(-1).view(np.uint8)
            rdispls, _ = _prefix([p.nbytes for p in recvs])
        elif even:  # equal strided parts: a derived datatype receives them in place
            recv, recv_type = out.reshape(-1).view(np.uint8), \
                self._part_type(out, concat_dim, concat_sizes[0])
            recv_counts = [int(i != me) for i in range(len(group))]
            rdispls = list(range(len(group)))
        else:
            rdispls, total = _prefix(recv_counts)
            recv = self._pool.empty(total, np.uint8)
        req = channel.data.Ialltoallv([send, send_counts, sdispls, send_type],
                                      [recv, recv_counts, rdispls, recv_type])
        if room is None:
            recvs[me][...] = sends[me]
        self._finish([req], call, channel)
        if room is not None:  # the room's send is over
            recvs[me][...] = sends[me]
        if not (flat or even):
            unpack(recv, recvs, skip=me)
        return {self.rank: out}

    def exchange(self, messages: Sequence[Message], sends: Mapping[Message, Any]) -> dict:
        MPI = self._MPI
        received = {}
        for m in messages:
            if m.src == self.rank and m.dst == self.rank:
                received[m] = sends[m]
        members = tuple(sorted({r for m in messages if m.src != m.dst for r in (m.src, m.dst)}))
        if self.rank not in members:
            return received
        mine = [m for m in messages if m.src != m.dst and self.rank in (m.src, m.dst)]
        call, channel = self._begin("send_recv", members, None, (f"{len(messages)} messages",),
                                    guard=tuple((m.src, m.dst, m.tag, m.shape,
                                                 np.dtype(m.dtype).num)
                                                for m in messages if m.src != m.dst))
        requests, keep, peers = [], [], set()
        for m in mine:
            if m.dst == self.rank:
                buf = self._pool.empty(m.shape, m.dtype)
                received[m] = buf
                if buf.nbytes:
                    peers.add(m.src)
                    requests.append(self.world.Irecv([buf.reshape(-1).view(np.uint8), MPI.BYTE],
                                                     source=m.src, tag=m.tag))
        for m in mine:
            if m.src == self.rank:
                data = _bytes(sends[m])
                keep.append(data)
                if data.nbytes:
                    peers.add(m.dst)
                    requests.append(self.world.Isend([data, MPI.BYTE], dest=m.dst, tag=m.tag))
        moves = _profile.on and _profile.enter(_profile.COLL, "send_recv")
        self.watchdog.wait(requests, call, sorted(peers))
        if moves:
            _profile.leave()
        self.watchdog.doing = None
        self.watchdog.last = call
        return received

    def all_gather_object(self, group, objs):
        obj = objs[self.rank]
        if len(group) == 1:
            return {self.rank: [obj]}
        MPI = self._MPI
        call, channel = self._begin("all_gather_object", group, None)
        comm = channel.data
        data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
        lengths = np.empty(len(group), dtype=np.int64)
        req = comm.Iallgather([np.array([data.size], dtype=np.int64), MPI.INT64_T],
                              [lengths, MPI.INT64_T])
        self.watchdog.wait([req], call, channel.peers)
        displs, total = _prefix(lengths.tolist())
        recv = np.empty(total, dtype=np.uint8)
        req = comm.Iallgatherv([data, MPI.BYTE], [recv, lengths.tolist(), displs, MPI.BYTE])
        self._finish([req], call, channel)
        return {self.rank: [pickle.loads(recv[d:d + n].tobytes())
                            for d, n in zip(displs, lengths.tolist())]}

    def barrier(self) -> None:
        group = tuple(range(self.size))
        if self.size == 1:
            return
        # the guard all-reduce is itself a barrier: it completes once every rank started it
        call, channel = self._begin("barrier", group, None)
        self._finish([], call, channel)

    def leave(self) -> None:
        """This rank's script is over: tell the other ranks and wait for them (see
        :meth:`Watchdog.leave`), then release the guards' persistent requests."""
        if self._MPI.Is_finalized() or self.size == 1:
            return
        try:  # sends still in flight reach their receivers before this rank leaves
            self.flush()
        except CollectiveError as exc:  # a receiver left or never came: say so, end the job
            sys.stderr.write("".join(f"[rank {self.rank}] {line}\n" for line in
                                     f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
                                     .splitlines()))
            sys.stderr.flush()
            self.world.Abort(1)
        self.watchdog.leave(self.size)
        for channel in self._channels.values():
            channel.free()
        for kind in self._types.values():
            kind.Free()
        self._types.clear()


def install_excepthook(comm=None, watchdog: Watchdog | None = None) -> None:
    """Make an uncaught exception on this rank abort the whole MPI job.

    The hook prints the traceback once, each line prefixed with ``[rank r]``, then calls
    ``MPI.COMM_WORLD.Abort(1)`` so no other rank is left waiting in a collective (mpiexec
    then exits non-zero). For a :class:`~ctensor.errors.CollectiveError`, which every rank
    involved detects, it first waits :data:`ABORT_GRACE_SECONDS`, answering ``watchdog``
    queries, so those ranks can print their own view. Installed by the runtime when an MPI
    world of more than one rank starts.
    """
    world = comm if comm is not None else _mpi().COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    if getattr(sys.excepthook, "_ctensor_abort", False):
        return

    def hook(exc_type, exc, tb):
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        lines = [f"[rank {rank}] uncaught exception on rank {rank} of {size}; aborting the "
                 f"MPI job"] + [f"[rank {rank}] {line}" for line in text.rstrip().splitlines()]
        try:
            sys.stdout.flush()
            sys.stderr.write("\n".join(lines) + "\n")
            sys.stderr.flush()
            # the launcher forwards output through pipes: give it a moment to drain them (and
            # the other ranks time to report a disagreement they detect too)
            grace = ABORT_GRACE_SECONDS if isinstance(exc, CollectiveError) else 0.2
            end = time.perf_counter() + grace
            while time.perf_counter() < end:
                if watchdog is not None:
                    watchdog.serve_queries()
                time.sleep(1e-3)
        finally:
            world.Abort(1)

    hook._ctensor_abort = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def install_exit_handler(comm: MPICommunicator) -> None:
    """Run :meth:`MPICommunicator.leave` when this rank's script ends (``sys.exit``, a return
    from ``main``, the end of the file): the ranks still waiting for it in a collective then
    raise :class:`~ctensor.errors.RankExitedError` within about a second, instead of at
    their timeout. Python runs ``atexit`` handlers before mpi4py finalizes MPI. Installed
    by the runtime with :func:`install_excepthook`; an abort skips it.
    """
    atexit.register(comm.leave)
