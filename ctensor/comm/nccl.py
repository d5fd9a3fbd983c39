"""NCCL backend: one process per rank, CuPy buffers, ``cupy.cuda.nccl`` collectives.

* One ``NcclCommunicator`` per group of ranks (a mesh-axis group, or the ranks of a
  cross-placement exchange), created lazily and cached: the members first agree (timed)
  that they all create this communicator, its ranks in order, then the group's first rank
  makes the unique id and sends it to the other members point-to-point over MPI (no MPI
  sub-communicator needed; a member that never comes gives a timeout, one that creates
  another communicator a ``DivergenceError``, never a hang); destroyed at interpreter exit.
* **One ordering discipline for every NCCL call of a rank**: collectives and transfers, of
  every communicator, are enqueued on the rank's one *communication stream*, in program
  order. Every rank runs the same program, so operations on different communicators are
  ordered identically on every rank, as NCCL requires (two communicators in flight on two
  streams could deadlock). Each call first makes the communication stream wait for the
  work already on the current (compute) stream (an event), and an event recorded after it
  orders the result: a blocking call makes the compute stream wait for it at once, a
  started one (``all_reduce_start``, ``reduce_scatter_start``, ``all_gather_start``,
  ``exchange_start``) at ``wait()``, so backward compute overlaps gradient reduction. The
  host never synchronises; buffers stay referenced until their event has passed.
* NCCL has no ``v`` collectives: uneven all-gather and all-to-all use grouped send/recv
  (``groupStart``/``groupEnd``, exact bytes), uneven reduce-scatter pads every part to the
  largest one. Results equal the MPI backend's. Non-reducing collectives move bytes, so
  every dtype works; reductions map dtypes NCCL lacks (:func:`reduction_plan`).
* Small metadata (``all_gather_object``) and barriers go through the host MPI communicator.

The pure planning lives in :mod:`ctensor.comm.nccl_plan` (tested on CPU); this module holds
the unique-id exchange, the communicator and the backend choice. The communicator takes its
``nccl`` and array modules as arguments so its algorithms can be run on CPU with a fake
NCCL (``tests/test_gpu.py``). The real CuPy/NCCL path runs only where a GPU is available
(``benchmarks/gpu_check.py``).
"""
from __future__ import annotations

import atexit
import pickle
import warnings
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from .. import _device
from ..errors import DivergenceError
from ..sbp import ReduceOp
from . import context
from .base import Communicator, Group, HostWrapper, Message, Pending, Shards, contiguous
from .nccl_plan import (NCCL_DTYPES, NCCL_OPS, ReducePlan, Staging, all_to_all_plan,
                        exchange_plan, gather_plan, nccl_refusal, pad_plan, reduction_plan)
from .watchdog import Call

__all__ = ["NCCLCommunicator", "cuda_communicator", "loadable", "gather_plan", "pad_plan",
           "all_to_all_plan", "exchange_plan", "reduction_plan", "nccl_refusal", "ReducePlan",
           "Staging", "ID_TAG"]

#: reserved MPI tag of the unique-id messages on the world communicator (boxing's exchanges
#: use small tags; the watchdog reserves 32760..32764)
ID_TAG = 32750
#: fixed size of a unique-id message: 8-byte length, then the pickled (group, id)
_ID_BYTES = 2048

# ----------------------------------------------------------------------------- MPI side
def loadable() -> bool:
    """Whether CuPy's NCCL binding finds a loadable NCCL library."""
    if _device.import_cupy() is None:
        return False
    try:
        from cupy.cuda import nccl
    except Exception:
        return False
    return bool(getattr(nccl, "available", False))


def _share_unique_id(host, group: Group, make: Callable, purpose: str = "collectives") -> Any:
    """The unique id of the NCCL communicator of ``group`` (ranks in this order) for
    ``purpose`` (``"collectives"`` or ``"transfers"``: one group has one of each).

    The members first agree, timed, that they all create this very communicator
    (:meth:`~ctensor.comm.watchdog.Watchdog.agree`: its purpose and its ranks in order), so
    a rank that sets up another group, the same ranks in another order or the other
    communicator of the same group raises instead of pairing up with the wrong id and
    hanging in ``ncclCommInitRank``. Then the group's first rank makes the id and sends it,
    with the communicator's name, to the other members (waited on by the host's watchdog,
    like every MPI call: a member that never comes is a timeout or a left-rank error)."""
    from mpi4py import MPI
    world, rank = host.world, host.held_ranks[0]
    what = f"the NCCL communicator of ranks {list(group)} for {purpose}"
    buf = np.zeros(_ID_BYTES, dtype=np.uint8)
    op, step = context.current()
    call = Call(0, "nccl_unique_id", tuple(group), op, step, (), "")
    host.watchdog.agree(group, what, call)
    if rank == group[0]:
        uid = make()
        data = np.frombuffer(pickle.dumps((what, uid)), dtype=np.uint8)
        buf[:8] = np.frombuffer(np.int64(data.size).tobytes(), dtype=np.uint8)
        buf[8:8 + data.size] = data
        requests = [world.Isend([buf, MPI.BYTE], dest=r, tag=ID_TAG) for r in group[1:]]
        host.watchdog.wait(requests, call, group[1:])
        return uid
    host.watchdog.wait([world.Irecv([buf, MPI.BYTE], source=group[0], tag=ID_TAG)], call,
                       group[:1])
    n = int(buf[:8].view(np.int64)[0])
    sent_what, uid = pickle.loads(buf[8:8 + n].tobytes())
    if sent_what != what:  # cannot happen after the agreement; never pair up the wrong ids
        raise DivergenceError(f"NCCLCommunicator: rank {rank} set up {what} while rank "
                              f"{group[0]} sent the id of {sent_what}; the ranks run "
                              f"different collectives")
    return uid


# ----------------------------------------------------------------------------- helpers
def _ptr(arr) -> int:
    """Device (CuPy) or host (NumPy, for the CPU fake) address of an array's first byte."""
    data = arr.data
    return data.ptr if hasattr(data, "ptr") else arr.ctypes.data


def _bytes(arr):
    """Flat contiguous uint8 view of an array (a copy only if it is not C-contiguous)."""
    return contiguous(arr).reshape(-1).view(np.uint8)


def _to_work(arr, plan: ReducePlan):
    flat = contiguous(arr).reshape(-1)
    if plan.staging is Staging.VIEW:
        return flat.view(plan.work)
    if plan.staging is Staging.CAST:
        return flat.astype(plan.work)
    return flat


def _from_work(flat, plan: ReducePlan, dtype):
    if plan.staging is Staging.VIEW:
        return flat.view(dtype)
    if plan.staging is Staging.CAST:
        return flat.astype(dtype)
    return flat


@contextmanager
def _grouped(lib):
    """NCCL group: the transfers posted inside start together at the end (no deadlock
    between a rank's sends and receives)."""
    lib.groupStart()
    try:
        yield
    finally:
        lib.groupEnd()


_live: "weakref.WeakSet" = weakref.WeakSet()
_atexit_registered = False


def _destroy_all() -> None:
    """atexit: destroy every NCCL communicator (before mpi4py finalises MPI)."""
    for comm in list(_live):
        comm.close()


# ----------------------------------------------------------------------------- backend
class NCCLCommunicator(HostWrapper):
    """Collectives on CuPy arrays through NCCL, one process per rank.

    ``host`` is the process's MPI communicator (:class:`~ctensor.comm.mpi.MPICommunicator`):
    it gives the world, sends the unique ids and carries metadata. ``nccl``, ``xp`` and
    ``stream`` default to ``cupy.cuda.nccl``, CuPy and the current CuPy stream; ``share_id``
    defaults to the MPI point-to-point id exchange. Groups of one member are plain device
    copies unless ``single_rank_copies=False`` (then they go through NCCL too, which is how
    ``benchmarks/gpu_check.py`` exercises NCCL on one GPU).
    """

    backend_name = "nccl"
    #: exchange() takes device arrays as they are (boxing need not stage them on the host)
    device_arrays = True

    def __init__(self, host, *, nccl=None, xp=None, stream: Optional[Callable] = None,
                 share_id: Optional[Callable] = None, single_rank_copies: bool = True):
        global _atexit_registered
        super().__init__(host)
        self.rank = self.held_ranks[0]
        self._nccl, self._xp, self._stream = nccl, xp, stream
        # share_id(group, make, purpose) -> id: a test's own exchange; None: the MPI one,
        # which also checks which communicator of the group is made (_share_unique_id)
        self._share_id = share_id
        self._single = single_rank_copies
        self._comms: dict = {}
        self._side_stream = None  # the communication stream, made on first use
        # (event, buffers) of calls on the communication stream: the buffers stay referenced
        # until the event has passed, whether or not anybody waits (CuPy's pool reuses them)
        self._in_flight: list = []
        _live.add(self)
        if not _atexit_registered:
            atexit.register(_destroy_all)
            _atexit_registered = True

    # ------------------------------------------------------------------ plumbing
    def _lib(self):
        if self._nccl is None:
            from cupy.cuda import nccl
            if not getattr(nccl, "available", False):
                raise RuntimeError("NCCLCommunicator: cupy.cuda.nccl finds no NCCL library; "
                                   "pip install nvidia-nccl-cu13 or -cu12 (or pip install -e "
                                   "'.[gpu-cu13]' / '.[gpu-cu12]')")
            self._nccl = nccl
        return self._nccl

    def _array_module(self):
        if self._xp is None:
            self._xp = _device.module()
        return self._xp

    def _stream_ptr(self) -> int:
        if self._stream is not None:
            return self._stream()
        return self._array_module().cuda.get_current_stream().ptr

    def _comm(self, group: Group, purpose: str = "collectives"):
        """The NCCL communicator of ``group`` (its rank i is ``group[i]``) for ``purpose``;
        cached. Started exchanges (pipeline transfers) get communicators of their own
        (``"transfers"``), so a pending exchange and a collective of one group are separate
        NCCL operations; both go on the one communication stream (module docstring), which
        orders them the same way on every rank."""
        key = group if purpose == "collectives" else (purpose, group)
        comm = self._comms.get(key)
        if comm is None:
            lib = self._lib()
            if self._share_id is None:
                uid = _share_unique_id(self._host, group, lib.get_unique_id, purpose)
            else:
                uid = self._share_id(group, lib.get_unique_id, purpose)
            comm = lib.NcclCommunicator(len(group), uid, group.index(self.rank))
            self._comms[key] = comm
        return comm

    def _side(self):
        """``(communication stream, event type)`` of CuPy, or None (NumPy arrays for the CPU
        fake: one stream)."""
        xp = self._array_module()
        cuda = getattr(xp, "cuda", None)
        if cuda is None or not hasattr(cuda, "Event"):
            return None
        if self._side_stream is None:
            self._side_stream = cuda.Stream(non_blocking=True)
        return self._side_stream, cuda.Event

    @contextmanager
    def _ordered(self, keep: list, started: list):
        """Post NCCL calls on the communication stream (yields its pointer), after the work
        on the current stream; ``started`` gets a ``wait()`` that orders the current
        stream after them (an event; ``None`` where there are no streams)."""
        side = self._side()
        if side is None:
            yield self._stream_ptr()
            started.append(None)
            return
        stream, event = side
        current = self._array_module().cuda.get_current_stream()
        ready = event(disable_timing=True)
        ready.record(current)
        stream.wait_event(ready)
        yield stream.ptr
        done = event(disable_timing=True)
        done.record(stream)
        self._in_flight = [(e, b) for e, b in self._in_flight if not e.done]
        self._in_flight.append((done, keep))
        started.append(done)

    def _after(self, done, finish: Callable) -> Pending:
        """A :class:`Pending` whose ``wait()`` orders the current stream after ``done`` and
        returns ``finish()`` (the post-processing, run on the current stream)."""
        if done is None:
            return Pending(finish())
        xp = self._array_module()

        def wait() -> dict:
            xp.cuda.get_current_stream().wait_event(done)
            return finish()

        return Pending(wait=wait, test=lambda: bool(done.done))

    def _dtype(self, dtype) -> int:
        return getattr(self._lib(), NCCL_DTYPES[np.dtype(dtype).name])

    def _op(self, op: ReduceOp) -> int:
        return getattr(self._lib(), NCCL_OPS[op])

    def _mine(self, group: Group, bufs: Shards):
        if self.rank not in group:
            raise RuntimeError(f"NCCL collective over group {group} called on rank "
                               f"{self.rank}, which is not a member")
        return self._array_module().asarray(bufs[self.rank])

    def _local(self, group: Group) -> bool:
        return len(group) == 1 and self._single

    def _check(self, collective: str, group: Group, buf, args: tuple = (),
               same_shape: bool = False) -> None:
        """Debug mode: every member compares what it is about to run (through MPI)."""
        if not self.check_consistency or len(group) == 1:
            return
        key = (collective, str(buf.dtype), args, tuple(buf.shape) if same_shape else ())
        keys = self._host.all_gather_object(group, {self.rank: key})[self.rank]
        if any(k != keys[0] for k in keys):
            listing = "; ".join(f"rank {r}: {k}" for r, k in zip(group, keys))
            raise DivergenceError(f"NCCL {collective} on ranks {list(group)}: the ranks "
                                  f"disagree ({listing})")

    # ------------------------------------------------------------------ collectives
    def all_reduce(self, group, bufs, op):
        return self.all_reduce_start(group, bufs, op).wait()

    def all_reduce_start(self, group, bufs, op) -> Pending:
        """:meth:`all_reduce` on the communication stream: returns at once; ``wait()``
        orders the current stream after it (no host synchronisation)."""
        xp = self._array_module()
        buf = contiguous(self._mine(group, bufs))
        if self._local(group) or buf.size == 0:
            return Pending({self.rank: buf.copy()})
        self._check("all_reduce", group, buf, (op.value,), same_shape=True)
        plan = reduction_plan(buf.dtype, op)
        send = _to_work(buf, plan)
        out = xp.empty_like(send)
        started: list = []
        with self._ordered([send, out], started) as stream:
            self._comm(group).allReduce(_ptr(send), _ptr(out), send.size,
                                        self._dtype(plan.work), self._op(plan.op), stream)
        return self._after(started[0], lambda: {
            self.rank: _from_work(out, plan, buf.dtype).reshape(buf.shape)})

    def all_gather(self, group, bufs, dim, sizes):
        return self.all_gather_start(group, bufs, dim, sizes).wait()

    def all_gather_start(self, group, bufs, dim, sizes) -> Pending:
        """:meth:`all_gather` on the communication stream (see :meth:`all_reduce_start`)."""
        xp = self._array_module()
        buf = self._mine(group, bufs)
        moved = xp.moveaxis(buf, dim, 0) if dim else buf
        out = xp.empty((sum(sizes),) + tuple(moved.shape[1:]), dtype=buf.dtype)

        def finish() -> dict:
            return {self.rank: contiguous(xp.moveaxis(out, 0, dim)) if dim else out}

        if self._local(group):
            out[...] = moved
            return Pending(finish())
        self._check("all_gather", group, buf, (dim, tuple(sizes)))
        row = int(np.prod(moved.shape[1:], dtype=np.int64)) * buf.dtype.itemsize
        send, recv = _bytes(moved), out.reshape(-1).view(np.uint8)
        comm, lib, me = self._comm(group), self._lib(), group.index(self.rank)
        parts = gather_plan(sizes, row)
        even = len(set(sizes)) == 1
        if not even:  # uneven: every member's exact part, point to point; mine copied here
            offset, nbytes = parts[me]
            recv[offset:offset + nbytes] = send
        started: list = []
        with self._ordered([send, out], started) as stream:
            if even:
                if recv.size:
                    comm.allGather(_ptr(send), _ptr(recv), send.size, lib.NCCL_UINT8, stream)
            else:
                with _grouped(lib):
                    for j, (offset, n) in enumerate(parts):
                        if j == me:
                            continue
                        if parts[me][1]:
                            comm.send(_ptr(send), parts[me][1], lib.NCCL_UINT8, j, stream)
                        if n:
                            comm.recv(_ptr(recv) + offset, n, lib.NCCL_UINT8, j, stream)
        return self._after(started[0], finish)

    def reduce_scatter(self, group, bufs, op, dim, sizes):
        return self.reduce_scatter_start(group, bufs, op, dim, sizes).wait()

    def reduce_scatter_start(self, group, bufs, op, dim, sizes) -> Pending:
        """:meth:`reduce_scatter` on the communication stream (see
        :meth:`all_reduce_start`)."""
        xp = self._array_module()
        buf = self._mine(group, bufs)
        moved = contiguous(xp.moveaxis(buf, dim, 0) if dim else buf)
        rest = tuple(moved.shape[1:])
        me = group.index(self.rank)

        def placed(out) -> dict:
            return {self.rank: contiguous(xp.moveaxis(out, 0, dim)) if dim
                    else contiguous(out)}

        if self._local(group):
            return Pending(placed(moved.copy()))
        self._check("reduce_scatter", group, buf, (op.value, dim, tuple(sizes)),
                    same_shape=True)
        width, starts = pad_plan(sizes)
        if len(set(sizes)) == 1:
            padded = moved
        else:  # pad every part to the largest; the padding rows are dropped after
            padded = xp.zeros((len(sizes) * width,) + rest, dtype=buf.dtype)
            for i, (start, n) in enumerate(zip(starts, sizes)):
                padded[i * width:i * width + n] = moved[start:start + n]
        plan = reduction_plan(buf.dtype, op)
        send = _to_work(padded, plan)
        recv = xp.empty(send.size // len(sizes), dtype=plan.work)
        comm, started = self._comm(group), []
        with self._ordered([send, recv], started) as stream:
            if recv.size:
                comm.reduceScatter(_ptr(send), _ptr(recv), recv.size, self._dtype(plan.work),
                                   self._op(plan.op), stream)
        return self._after(started[0], lambda: placed(
            _from_work(recv, plan, buf.dtype).reshape((width,) + rest)[:sizes[me]]))

    def all_to_all(self, group, bufs, split_dim, split_sizes, concat_dim, concat_sizes):
        xp = self._array_module()
        buf = self._mine(group, bufs)
        if self._local(group):
            return {self.rank: buf.copy()}
        self._check("all_to_all", group, buf, (split_dim, tuple(split_sizes), concat_dim,
                                               tuple(concat_sizes)))
        me = group.index(self.rank)
        send_shapes, recv_shapes = all_to_all_plan(buf.shape, split_dim, split_sizes,
                                                   concat_dim, concat_sizes, me)
        sends, start = [], 0
        for n in split_sizes:  # part j, packed contiguously (free along dim 0)
            idx = [slice(None)] * buf.ndim
            idx[split_dim] = slice(start, start + n)
            sends.append(_bytes(buf[tuple(idx)]))
            start += n
        itemsize = buf.dtype.itemsize
        counts = [int(np.prod(s, dtype=np.int64)) * itemsize for s in recv_shapes]
        parts = gather_plan(counts, 1)
        recv = xp.empty(sum(counts), dtype=np.uint8)
        offset, n = parts[me]
        recv[offset:offset + n] = sends[me]
        comm, lib, started = self._comm(group), self._lib(), []
        with self._ordered(sends + [recv], started) as stream, _grouped(lib):
            for j, (offset, n) in enumerate(parts):
                if j == me:
                    continue
                if sends[j].size:
                    comm.send(_ptr(sends[j]), sends[j].size, lib.NCCL_UINT8, j, stream)
                if n:
                    comm.recv(_ptr(recv) + offset, n, lib.NCCL_UINT8, j, stream)
        if started[0] is not None:  # the current stream after the transfers
            xp.cuda.get_current_stream().wait_event(started[0])
        if concat_dim == 0:  # received blocks already lie in final order
            shape = list(recv_shapes[0])
            shape[0] = sum(concat_sizes)
            return {self.rank: recv.view(buf.dtype).reshape(shape)}
        pieces = [recv[o:o + n].view(buf.dtype).reshape(s)
                  for (o, n), s in zip(parts, recv_shapes)]
        return {self.rank: xp.concatenate(pieces, axis=concat_dim)}

    def exchange(self, messages: Sequence[Message], sends: Mapping[Message, Any]) -> dict:
        return self._exchange(messages, sends, "collectives").wait()

    def _post(self, comm, xp, members, transfers, sends, received: dict, stream) -> list:
        """Enqueue ``transfers`` (``exchange_plan``'s) as one NCCL group on ``stream``:
        receive buffers go into ``received``; returns the send buffers, which must stay
        alive until the transfers ran."""
        lib, keep = self._lib(), []
        with _grouped(lib):
            for kind, m in transfers:
                peer = members.index(m.dst if kind == "send" else m.src)
                if kind == "send":
                    data = _bytes(xp.asarray(sends[m]))
                    keep.append(data)
                    if data.size:
                        comm.send(_ptr(data), data.size, lib.NCCL_UINT8, peer, stream)
                else:
                    buf = xp.empty(m.shape, dtype=m.dtype)
                    received[m] = buf
                    if buf.nbytes:
                        comm.recv(_ptr(buf), buf.nbytes, lib.NCCL_UINT8, peer, stream)
        return keep

    def exchange_start(self, messages: Sequence[Message], sends: Mapping[Message, Any]) -> Pending:
        """:meth:`exchange` on the communication stream, on the group's communicator for
        transfers: returns at once, ``wait()`` makes the current stream wait for the
        transfers (an event: the host never synchronises). Send buffers stay referenced
        until they ran; the caller gives snapshots it does not write to."""
        return self._exchange(messages, sends, "transfers")

    def _exchange(self, messages, sends, purpose: str) -> Pending:
        xp = self._array_module()
        received = {m: sends[m] for m in messages if m.src == m.dst == self.rank}
        members, transfers = exchange_plan(messages, self.rank)
        if self.rank not in members:
            return Pending(received)
        comm, keep, started = self._comm(members, purpose), [], []
        with self._ordered(keep, started) as stream:
            keep += self._post(comm, xp, members, transfers, sends, received, stream)
            keep += list(received.values())
        return self._after(started[0], lambda: received)

    def all_gather_object(self, group, objs):
        return self._host.all_gather_object(group, objs)

    def barrier(self) -> None:
        self._host.barrier()

    def close(self) -> None:
        """Destroy this communicator's NCCL communicators (also done at exit)."""
        comms, self._comms = list(self._comms.values()), {}
        if comms and self._xp is not None and hasattr(self._xp, "cuda"):
            try:  # let enqueued collectives finish before their communicator goes
                self._xp.cuda.runtime.deviceSynchronize()
            except Exception:
                pass
        for comm in comms:
            try:
                comm.destroy()
            except Exception:
                pass


# ----------------------------------------------------------------------------- choice
def _gpu_identity(cupy) -> tuple:
    """``(node name, PCI bus id of the current GPU)``: where this rank's arrays live."""
    from mpi4py import MPI
    device = cupy.cuda.Device()
    try:
        bus = device.pci_bus_id
    except Exception:
        bus = f"device {device.id}"
    return MPI.Get_processor_name(), bus


def cuda_communicator(host) -> Communicator:
    """The communicator for ``cuda`` placements in MPI mode (collective over the world).

    NCCL when every rank can load it and has a GPU of its own; otherwise the host-staged
    MPI path, reported once (on rank 0) with a ``RuntimeWarning`` giving the reason. Every
    rank takes the same choice.
    """
    from .staged import StagedCommunicator
    if host.size == 1:  # no NCCL communicator is ever needed
        return NCCLCommunicator(host)
    cupy = _device.module()  # this rank's GPU is chosen before its identity is taken
    me = _gpu_identity(cupy) + (loadable(),)
    everyone = host.all_gather_object(tuple(range(host.size)), {host.rank: me})[host.rank]
    reason = nccl_refusal(everyone)
    if reason is None:
        return NCCLCommunicator(host)
    if host.rank == 0:
        warnings.warn(f"ctensor: cuda placements communicate through the host-staged MPI "
                      f"path (device -> host copy, MPI, host -> device copy) because "
                      f"{reason}", RuntimeWarning, stacklevel=3)
    return StagedCommunicator(host)
