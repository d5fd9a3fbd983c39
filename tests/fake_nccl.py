"""A fake ``cupy.cuda.nccl`` on host memory, to run :class:`NCCLCommunicator`'s algorithms on
CPU: threads play the ranks, device pointers are host addresses (``arr.ctypes.data``), a
transfer is a ``memmove``. Collectives meet at a barrier; grouped send/recv are posted and
then completed at ``groupEnd`` (sends first), matching each pair's transfers in order, as
NCCL does. Used by ``tests/test_gpu.py``.

``FakeNccl(asynchronous=True)`` with the strict device module (``tests/strict_device.py``)
as the communicator's arrays completes like NCCL on a GPU: every call on a stream is
enqueued there and runs when that stream is waited on (an event) or synchronised, so a
result read before its event holds stale data and is an ``OrderingError``; a send buffer not
ordered before the call on its stream is one too.
"""
from __future__ import annotations

import ctypes
import queue
import threading
import uuid

import numpy as np

from ctensor.comm.nccl import NCCLCommunicator

def _read(ptr: int, nbytes: int) -> np.ndarray:
    if nbytes == 0:
        return np.empty(0, np.uint8)
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr)).copy()


def _write(ptr: int, data: np.ndarray) -> None:
    data = np.ascontiguousarray(data)
    if data.nbytes:
        ctypes.memmove(ptr, data.ctypes.data, data.nbytes)


class _Clique:
    def __init__(self, n: int):
        self.n = n
        self.barrier = threading.Barrier(n, timeout=20)
        self.slots: list = [None] * n
        self.boxes: dict = {}
        self.lock = threading.Lock()

    def box(self, src: int, dst: int) -> queue.Queue:
        with self.lock:
            return self.boxes.setdefault((src, dst), queue.Queue())


class FakeNccl:
    """``cupy.cuda.nccl`` on host memory: threads are ranks, transfers are memmoves."""

    available = True
    _DTYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
               "float64"]

    def __init__(self, asynchronous: bool = False):
        self.asynchronous = asynchronous
        for i, name in enumerate(self._DTYPES):
            setattr(self, f"NCCL_{name.upper()}", i)
        self.NCCL_SUM, self.NCCL_MAX, self.NCCL_MIN = 100, 101, 102
        self._cliques: dict = {}
        self._lock = threading.Lock()
        self._local = threading.local()
        self.log: list = []
        lib = self

        class NcclCommunicator:
            def __init__(self, ndev, uid, rank):
                with lib._lock:
                    self.clique = lib._cliques.setdefault(uid, _Clique(ndev))
                self.rank = rank
                self.clique.barrier.wait()  # init is collective over the members

            def _gather(self, data):
                c = self.clique
                c.slots[self.rank] = data
                c.barrier.wait()
                parts = list(c.slots)
                c.barrier.wait()
                return parts

            def allReduce(self, send, recv, count, dtype, op, stream):
                dt = lib._dt(dtype)
                lib.log.append("allReduce")

                def run():
                    parts = self._gather(_read(send, count * dt.itemsize).view(dt))
                    _write(recv, lib._reduce(parts, op))
                lib._run(stream, run, reads=[send], writes=[recv])

            def allGather(self, send, recv, count, dtype, stream):
                dt = lib._dt(dtype)
                lib.log.append("allGather")
                lib._run(stream, lambda: _write(recv, np.concatenate(
                    self._gather(_read(send, count * dt.itemsize)))), reads=[send],
                         writes=[recv])

            def reduceScatter(self, send, recv, count, dtype, op, stream):
                dt = lib._dt(dtype)
                lib.log.append("reduceScatter")

                def run():
                    data = _read(send, count * self.clique.n * dt.itemsize).view(dt)
                    total = lib._reduce(self._gather(data), op)
                    _write(recv, total[self.rank * count:(self.rank + 1) * count])
                lib._run(stream, run, reads=[send], writes=[recv])

            def send(self, ptr, count, dtype, peer, stream):
                lib._post(("send", self, ptr, count * lib._dt(dtype).itemsize, peer, stream))

            def recv(self, ptr, count, dtype, peer, stream):
                lib._post(("recv", self, ptr, count * lib._dt(dtype).itemsize, peer, stream))

            def destroy(self):
                pass

        self.NcclCommunicator = NcclCommunicator

    def _dt(self, code: int) -> np.dtype:
        return np.dtype(self._DTYPES[code])

    def _reduce(self, parts, op):
        fn = {self.NCCL_SUM: np.add, self.NCCL_MAX: np.maximum, self.NCCL_MIN: np.minimum}[op]
        out = parts[0].copy()
        for p in parts[1:]:
            out = fn(out, p)
        return out.astype(parts[0].dtype)

    def get_unique_id(self):
        return uuid.uuid4().bytes

    def groupStart(self):
        self._local.depth = getattr(self._local, "depth", 0) + 1
        if self._local.depth == 1:
            self._local.pending = []

    def groupEnd(self):
        self._local.depth -= 1
        if self._local.depth == 0:
            ops, self._local.pending = self._local.pending, []
            self.log.append(f"group of {len(ops)}")
            if not ops:
                return

            def run():
                for kind, comm, ptr, n, peer, _ in ops:  # posts everything, then completes
                    if kind == "send":
                        comm.clique.box(comm.rank, peer).put(_read(ptr, n))
                for kind, comm, ptr, n, peer, _ in ops:
                    if kind == "recv":
                        data = comm.clique.box(peer, comm.rank).get(timeout=20)
                        assert data.nbytes == n, (data.nbytes, n)
                        _write(ptr, data)
            streams = {op[5] for op in ops}
            assert len(streams) == 1, "one NCCL group posted on several streams"
            self._run(streams.pop(), run, reads=[op[2] for op in ops if op[0] == "send"],
                      writes=[op[2] for op in ops if op[0] == "recv"])

    def _run(self, stream, fn, reads=(), writes=()):
        """``fn`` now, or (asynchronous, on a strict device stream) enqueued on ``stream``:
        its reads checked against the stream's order, its writes stamped on it."""
        if not (self.asynchronous and stream):
            fn()
            return
        import strict_device as sd
        for ptr in reads:
            sd.check_read_ptr(ptr, stream)
        for ptr in writes:
            sd.mark_written(ptr, stream)
        sd.enqueue(sd._STREAMS[stream], fn)

    def _post(self, op):
        assert getattr(self._local, "depth", 0) > 0, "send/recv outside a group"
        self._local.pending.append(op)


class Host:
    """The host-communicator surface NCCLCommunicator uses (size, held rank)."""

    def __init__(self, rank: int, size: int):
        self.size, self.held_ranks = size, (rank,)


def run_ranks(ranks, fn):
    """``fn(rank)`` on one thread per rank; returns ``{rank: result}``, re-raising errors."""
    results, errors = {}, {}

    def body(r):
        try:
            results[r] = fn(r)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors[r] = exc

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "fake NCCL ranks hung"
    if errors:
        raise next(iter(errors.values()))
    return results


def nccl_world(size: int, lib: FakeNccl, xp=None) -> dict:
    """One communicator per rank on the fake NCCL: NumPy arrays on one stream (``xp``
    None), or ``xp``'s arrays and streams (the strict device module)."""
    ids: dict = {}
    lock = threading.Lock()

    def share(group, make, purpose):  # one id per (group, purpose), as the MPI exchange
        with lock:
            return ids.setdefault((group, purpose), make())

    if xp is None:
        return {r: NCCLCommunicator(Host(r, size), nccl=lib, xp=np, stream=lambda: 0,
                                    share_id=share) for r in range(size)}
    return {r: NCCLCommunicator(Host(r, size), nccl=lib, xp=xp, share_id=share)
            for r in range(size)}
