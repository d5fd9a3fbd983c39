"""The one small interface every backend implements.

A process *holds* a set of ranks: one under MPI/NCCL, all of them in simulation. Every
collective therefore takes and returns ``{rank: array}`` dicts covering the ranks of the
group that this process holds, so the caller has a single code path for all backends.

Groups are tuples of global ranks in mesh order; a rank's position in the tuple is its
index in the collective (the order parts are concatenated and scattered in). Arrays are
NumPy or CuPy; a backend may run collectives on the current CuPy stream without a host
synchronisation (``nccl.py``), so callers must not read results on the host before the
array module is asked to.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from ..sbp import ReduceOp

Group = tuple  # tuple[int, ...] of global ranks, in collective order
Shards = Mapping[int, Any]


@dataclass(frozen=True)
class Message:
    """One point-to-point transfer: ``src`` sends an array of ``shape``/``dtype`` to ``dst``.

    ``tag`` tells apart several messages between the same pair inside one exchange.
    """

    src: int
    dst: int
    tag: int
    shape: tuple
    dtype: Any


class Pending:
    """A started collective: :meth:`test` lets it advance and says whether it is done,
    :meth:`wait` completes it and returns its ``{rank: array}`` result. Backends without
    nonblocking collectives return one that is already complete."""

    def __init__(self, result: Optional[dict] = None, wait=None, test=None):
        self._result, self._wait, self._test = result, wait, test

    def test(self) -> bool:
        if self._result is not None or self._test is None:
            return True
        return bool(self._test())

    def wait(self) -> dict:
        if self._result is None:
            self._result = self._wait()
            self._wait = self._test = None
        return self._result


class Communicator(ABC):
    """Collectives over groups of global ranks; see the module docstring for the contract."""

    #: number of ranks in the world
    size: int
    #: the ranks this process holds, ascending
    held_ranks: tuple
    #: debug mode: compare a fingerprint of every collective across its members first
    #: (meaningful where ranks live in different processes; see ``watchdog.py``)
    check_consistency: bool = False
    #: ``ct.tensor`` checks that every rank passed the same data (meaningful where ranks live
    #: in different processes; see :func:`ctensor.debug.check_tensor_data`)
    check_tensor_data: bool = True

    # --------------------------------------------------------------- collectives
    @abstractmethod
    def all_reduce(self, group: Group, bufs: Shards, op: ReduceOp) -> dict:
        """Every member gets the elementwise reduction of all members' arrays (same shape)."""

    @abstractmethod
    def all_gather(self, group: Group, bufs: Shards, dim: int, sizes: Sequence[int]) -> dict:
        """Every member gets the members' arrays concatenated along ``dim`` in group order.

        ``sizes[i]`` is member ``i``'s length along ``dim``; they may differ (uneven shards,
        empty parts).
        """

    @abstractmethod
    def reduce_scatter(self, group: Group, bufs: Shards, op: ReduceOp, dim: int,
                       sizes: Sequence[int]) -> dict:
        """Reduce the members' equal-shape arrays, then give member ``i`` the ``i``-th part
        along ``dim``, parts having ``sizes`` (uneven allowed)."""

    @abstractmethod
    def all_to_all(self, group: Group, bufs: Shards, split_dim: int, split_sizes: Sequence[int],
                   concat_dim: int, concat_sizes: Sequence[int]) -> dict:
        """Member ``i`` cuts its array along ``split_dim`` into parts of ``split_sizes`` and
        sends part ``j`` to member ``j``; each member concatenates what it receives along
        ``concat_dim`` in group order. ``concat_sizes[i]`` is member ``i``'s length along
        ``concat_dim``."""

    @abstractmethod
    def exchange(self, messages: Sequence[Message], sends: Mapping[Message, Any]) -> dict:
        """Point-to-point transfers. ``sends`` holds the array of every message whose ``src``
        this process holds; returns ``{message: array}`` for every message whose ``dst`` it
        holds. Messages with ``src == dst`` are handed over without communication."""

    @abstractmethod
    def all_gather_object(self, group: Group, objs: Shards) -> dict:
        """Small Python metadata (shapes, fingerprints): every member gets the list of all
        members' objects in group order. Never used for tensor data."""

    def all_reduce_start(self, group: Group, bufs: Shards, op: ReduceOp) -> Pending:
        """:meth:`all_reduce`, started: the result comes from the returned
        :class:`Pending` (nonblocking where the backend can; here it runs at once)."""
        return Pending(self.all_reduce(group, bufs, op))

    def reduce_scatter_start(self, group: Group, bufs: Shards, op: ReduceOp, dim: int,
                             sizes: Sequence[int]) -> Pending:
        """:meth:`reduce_scatter`, started (see :meth:`all_reduce_start`)."""
        return Pending(self.reduce_scatter(group, bufs, op, dim, sizes))

    def exchange_start(self, messages: Sequence[Message], sends: Mapping[Message, Any]) -> Pending:
        """:meth:`exchange`, started: returns at once, and the returned :class:`Pending`'s
        ``wait()`` gives ``{message: array}`` for the messages this process receives,
        waiting only for those. Sends complete in the background (the sender never waits
        for its receiver); ``sends`` are snapshots the caller no longer writes to. Ranks
        start the exchanges between one pair in the same order, as with every collective.
        Here it runs at once."""
        return Pending(self.exchange(messages, sends))

    def all_gather_start(self, group: Group, bufs: Shards, dim: int,
                         sizes: Sequence[int]) -> Pending:
        """:meth:`all_gather`, started (see :meth:`all_reduce_start`)."""
        return Pending(self.all_gather(group, bufs, dim, sizes))

    def barrier(self) -> None:
        """Wait for every rank of the world (no-op where the process holds all ranks)."""


class HostWrapper(Communicator):
    """Base of the device communicators that delegate metadata, barriers and the debug
    switch to a wrapped host (MPI) communicator."""

    def __init__(self, host: Communicator):
        self._host = host
        self.size = host.size
        self.held_ranks = tuple(host.held_ranks)

    @property
    def check_consistency(self) -> bool:
        """Debug mode of the wrapped MPI communicator (fingerprints before collectives)."""
        return bool(getattr(self._host, "check_consistency", False))

    @check_consistency.setter
    def check_consistency(self, enabled: bool) -> None:
        self._host.check_consistency = bool(enabled)


def contiguous(arr):
    """``arr`` in C order, copied only when needed; keeps 0-d shapes (unlike
    ``ascontiguousarray``)."""
    return arr if arr.flags.c_contiguous else arr.copy(order="C")
