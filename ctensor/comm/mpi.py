"""MPI backend: one process per rank, NumPy buffers, mpi4py *buffer* collectives.

Tensor data always goes through the uppercase (zero-pickle) calls, with the ``v``
variants where parts are uneven. Non-reducing collectives move raw bytes so every
dtype (bool, float16, complex) works; reductions use the MPI datatype of the array.
Sub-communicators are made once per group with ``Create_group`` (collective over the
group only) and cached.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ..sbp import ReduceOp
from .base import Communicator, Group, Message, Shards, contiguous

_REDUCE_TAG = 0


def _mpi():
    from mpi4py import MPI
    return MPI


def _bytes(arr: np.ndarray) -> np.ndarray:
    """Contiguous uint8 view of an array (copies only if it is not C-contiguous)."""
    return contiguous(arr).reshape(-1).view(np.uint8)


def _prefix(counts):
    displs, total = [], 0
    for c in counts:
        displs.append(total)
        total += c
    return displs, total


class MPICommunicator(Communicator):
    """Wraps ``MPI.COMM_WORLD``; this process holds exactly its own rank."""

    def __init__(self, comm=None):
        MPI = _mpi()
        self._MPI = MPI
        self.world = comm if comm is not None else MPI.COMM_WORLD
        self.size = self.world.Get_size()
        self.rank = self.world.Get_rank()
        self.held_ranks = (self.rank,)
        self._groups: dict[Group, Any] = {}
        self._ops = {ReduceOp.SUM: MPI.SUM, ReduceOp.MAX: MPI.MAX, ReduceOp.MIN: MPI.MIN}

    # ------------------------------------------------------------------ groups
    def _comm(self, group: Group):
        """The sub-communicator of ``group`` (its rank i is ``group[i]``); cached."""
        comm = self._groups.get(group)
        if comm is None:
            if group == tuple(range(self.size)):
                comm = self.world
            else:
                world_group = self.world.Get_group()
                sub = world_group.Incl(list(group))
                comm = self.world.Create_group(sub, tag=7)
                sub.Free()
                world_group.Free()
            self._groups[group] = comm
        return comm

    def _op(self, op: ReduceOp, dtype: np.dtype):
        """The MPI reduction; bools reduce logically (sum and max are 'or', min is 'and')."""
        if dtype == np.bool_:
            return self._MPI.LAND if op is ReduceOp.MIN else self._MPI.LOR
        return self._ops[op]

    def _mine(self, group: Group, bufs: Shards):
        if self.rank not in group:
            raise RuntimeError(f"MPI collective over group {group} called on rank {self.rank}, "
                               f"which is not a member")
        return bufs[self.rank]

    # ------------------------------------------------------------------ collectives
    def all_reduce(self, group, bufs, op):
        buf = contiguous(self._mine(group, bufs))
        if len(group) == 1:
            return {self.rank: buf.copy()}
        out = np.empty_like(buf)
        self._comm(group).Allreduce(buf, out, op=self._op(op, buf.dtype))
        return {self.rank: out}

    def all_gather(self, group, bufs, dim, sizes):
        buf = self._mine(group, bufs)
        # gather along dim 0 of the moved array: parts are then contiguous byte ranges
        moved = np.moveaxis(buf, dim, 0) if dim else buf
        out = np.empty((sum(sizes),) + moved.shape[1:], dtype=buf.dtype)
        if len(group) == 1:
            out[...] = moved
        else:
            row = int(np.prod(moved.shape[1:], dtype=np.int64)) * buf.dtype.itemsize
            displs, _ = _prefix(sizes)
            self._comm(group).Allgatherv(
                [_bytes(moved), self._MPI.BYTE],
                [out.reshape(-1).view(np.uint8), [n * row for n in sizes],
                 [d * row for d in displs], self._MPI.BYTE])
        return {self.rank: contiguous(np.moveaxis(out, 0, dim)) if dim else out}

    def reduce_scatter(self, group, bufs, op, dim, sizes):
        buf = self._mine(group, bufs)
        moved = contiguous(np.moveaxis(buf, dim, 0) if dim else buf)
        row = int(np.prod(moved.shape[1:], dtype=np.int64))
        me = group.index(self.rank)
        out = np.empty((sizes[me],) + moved.shape[1:], dtype=buf.dtype)
        if len(group) == 1:
            out[...] = moved
        else:
            self._comm(group).Reduce_scatter(moved, out, [n * row for n in sizes],
                                             op=self._op(op, buf.dtype))
        return {self.rank: contiguous(np.moveaxis(out, 0, dim)) if dim else out}

    def all_to_all(self, group, bufs, split_dim, split_sizes, concat_dim, concat_sizes):
        buf = self._mine(group, bufs)
        me = group.index(self.rank)
        itemsize = buf.dtype.itemsize
        # pack: part j (cut along split_dim) as one contiguous block in its natural layout;
        # along dim 0 the parts already are contiguous blocks, elsewhere one copy packs them
        if split_dim == 0:
            send = _bytes(buf)
        else:
            send = np.empty(buf.nbytes, dtype=np.uint8)
            start = pos = 0
            for n in split_sizes:
                idx = [slice(None)] * buf.ndim
                idx[split_dim] = slice(start, start + n)
                piece = buf[tuple(idx)]
                send[pos:pos + piece.nbytes].view(buf.dtype).reshape(piece.shape)[...] = piece
                start += n
                pos += piece.nbytes
        other = int(np.prod([n for i, n in enumerate(buf.shape) if i != split_dim],
                            dtype=np.int64))
        send_counts = [n * other * itemsize for n in split_sizes]
        # what member i sends me: buf's shape with split_dim = my part, concat_dim = its length
        recv_shapes = []
        for n in concat_sizes:
            shape = list(buf.shape)
            shape[split_dim] = split_sizes[me]
            shape[concat_dim] = n
            recv_shapes.append(tuple(shape))
        recv_counts = [int(np.prod(s, dtype=np.int64)) * itemsize for s in recv_shapes]
        sdispls, _ = _prefix(send_counts)
        rdispls, rtotal = _prefix(recv_counts)
        recv = np.empty(rtotal, dtype=np.uint8)
        self._comm(group).Alltoallv([send, send_counts, sdispls, self._MPI.BYTE],
                                    [recv, recv_counts, rdispls, self._MPI.BYTE])
        if concat_dim == 0:  # received blocks already lie in final order
            shape = list(recv_shapes[0])
            shape[0] = sum(concat_sizes)
            return {self.rank: recv.view(buf.dtype).reshape(shape)}
        parts = [recv[d:d + c].view(buf.dtype).reshape(s)
                 for d, c, s in zip(rdispls, recv_counts, recv_shapes)]
        return {self.rank: np.concatenate(parts, axis=concat_dim)}

    def exchange(self, messages: Sequence[Message], sends: Mapping[Message, Any]) -> dict:
        MPI = self._MPI
        requests, received = [], {}
        for m in messages:
            if m.src == self.rank and m.dst == self.rank:
                received[m] = sends[m]
            elif m.dst == self.rank:
                buf = np.empty(m.shape, dtype=m.dtype)
                received[m] = buf
                if buf.nbytes:
                    requests.append(self.world.Irecv([buf.reshape(-1).view(np.uint8), MPI.BYTE],
                                                     source=m.src, tag=m.tag))
        keep = []
        for m in messages:
            if m.src == self.rank and m.dst != self.rank:
                data = _bytes(sends[m])
                keep.append(data)
                if data.nbytes:
                    requests.append(self.world.Isend([data, MPI.BYTE], dest=m.dst, tag=m.tag))
        MPI.Request.Waitall(requests)
        return received

    def all_gather_object(self, group, objs):
        obj = objs[self.rank]
        if len(group) == 1:
            return {self.rank: [obj]}
        return {self.rank: self._comm(group).allgather(obj)}

    def barrier(self) -> None:
        self.world.Barrier()

    def abort(self, code: int = 1) -> None:
        self.world.Abort(code)
