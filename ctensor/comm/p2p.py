"""The nonblocking point-to-point exchange of the MPI backend (``exchange_start``).

A pipeline stage hands its output over and goes on: the sender posts its sends and never
waits for the receiver; the receiver waits only when it asks for the data. What keeps this
as safe as a collective is a header per transfer (below); what keeps it from hanging is the
watchdog, which bounds every wait, notices ranks that left, and at exit completes the sends
still in flight. :class:`NonblockingExchange` is mixed into
:class:`~ctensor.comm.mpi.MPICommunicator`, whose ``world``, ``rank``, ``watchdog`` and
buffer pool it uses.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from . import context
from ..errors import DivergenceError
from .base import Message, Pending, contiguous
from .watchdog import Call

__all__ = ["NonblockingExchange", "TRANSFER_HEADER_TAG", "TRANSFER_DATA_TAG", "HEADER_BYTES",
           "dtype_text"]

#: reserved point-to-point tags of the nonblocking exchange on ``COMM_WORLD``: each transfer
#: between a pair is one header (the guard) then its data messages, matched in posting order
#: (MPI never reorders messages of one sender, tag and communicator)
TRANSFER_HEADER_TAG = 32751
TRANSFER_DATA_TAG = 32752
#: fixed size of a transfer header: digest and complement (2 x int64), then the sender's
#: description of the transfer (for the error message when the two sides disagree)
HEADER_BYTES = 512
#: the collective code the guard digests a transfer under (``mpi._KIND["send_recv"]``)
_SEND_RECV = 5
_dtype_names: dict = {}  # str(dtype) takes microseconds; every collective names its dtype


def dtype_text(dtype) -> str:
    """``str(dtype)``, cached."""
    name = _dtype_names.get(dtype)
    if name is None:
        name = _dtype_names[dtype] = str(dtype)
    return name


def _bytes(arr: np.ndarray) -> np.ndarray:
    return contiguous(arr).reshape(-1).view(np.uint8)


class _Outgoing:
    """The sends of one transfer of :meth:`MPICommunicator.exchange_start` still in flight,
    with the buffers they read."""

    __slots__ = ("dst", "call", "keep", "requests")

    def __init__(self, dst: int, call: Call, keep: list):
        self.dst, self.call, self.keep, self.requests = dst, call, keep, []


class _Incoming:
    """One transfer this rank receives from ``src``: its header (checked before any of its
    data is handed out) and its data receives."""

    __slots__ = ("src", "call", "header", "header_request", "data", "checked")

    def __init__(self, src: int, call: Call, header: np.ndarray, header_request):
        self.src, self.call, self.header = src, call, header
        self.header_request, self.data, self.checked = header_request, [], False



def _by_peer(messages: Sequence[Message], rank: int) -> tuple:
    """``(outgoing, incoming)``: ``rank``'s messages to each other rank and from each, in
    order (its messages to itself are neither)."""
    outgoing: dict[int, list] = {}
    incoming: dict[int, list] = {}
    for m in messages:
        if m.src == m.dst:
            continue
        if m.src == rank:
            outgoing.setdefault(m.dst, []).append(m)
        elif m.dst == rank:
            incoming.setdefault(m.src, []).append(m)
    return outgoing, incoming

class NonblockingExchange:
    """``exchange_start``, ``flush`` and their bookkeeping, for the MPI communicator."""

    def _init_transfers(self) -> None:
        # transfers counted per (src, dst) pair, the sends still in flight, and per sender
        # the received transfers whose header (the guard) has not been checked yet, oldest
        # first
        self._transfers: dict[tuple, int] = {}
        self._outbox: list[_Outgoing] = []
        self._unchecked: dict[int, list] = {}

    def exchange_start(self, messages: Sequence[Message], sends: Mapping[Message, Any]) -> Pending:
        """:meth:`exchange` without waiting for anybody: this rank posts its receives and
        sends at once and returns; ``wait()`` waits for its receives only, and its sends
        complete in the background (tested at every later communication, waited for at
        exit), so a producer hands its output over and goes on.

        **The guard, point to point.** A collective's guard all-reduces a digest among its
        members, which would make the sender wait for the receiver. Here every transfer
        between a pair (the messages of one exchange from ``src`` to ``dst``) is preceded by
        a header from the sender: the digest of the transfer's number on that pair, its
        messages' tags, shapes and dtypes (in debug mode: of its full fingerprint), and the
        sender's description of it. The receiver checks the header before it hands out any
        data — and every earlier header from the same sender first, so a transfer a rank
        skipped cannot slip through — and raises :class:`~ctensor.errors.DivergenceError`
        saying what both sides were doing; the receive buffers of a transfer that
        disagrees are never returned. A sender that left or a receive that never comes is
        a :class:`~ctensor.errors.RankExitedError` / :class:`~ctensor.errors.CommTimeoutError`
        of the watchdog, as for collectives."""
        MPI = self._MPI
        if self._outbox:
            self._reap()
        received = {m: sends[m] for m in messages if m.src == m.dst == self.rank}
        outgoing, incoming = _by_peer(messages, self.rank)
        if not outgoing and not incoming:
            return Pending(received)
        op, step = context.current()
        world = self.world
        mine = []
        for src, msgs in incoming.items():  # receives first: a sender's data finds them
            call = self._transfer_call(src, self.rank, msgs, op, step)
            header = np.zeros(HEADER_BYTES, dtype=np.uint8)
            arrival = _Incoming(src, call, header,
                                world.Irecv([header, MPI.BYTE], source=src,
                                            tag=TRANSFER_HEADER_TAG))
            for m in msgs:
                buf = self._pool.empty(m.shape, m.dtype)
                received[m] = buf
                if buf.nbytes:
                    arrival.data.append(world.Irecv([buf.reshape(-1).view(np.uint8), MPI.BYTE],
                                                    source=src, tag=TRANSFER_DATA_TAG))
            self._unchecked.setdefault(src, []).append(arrival)
            mine.append(arrival)
        for dst, msgs in outgoing.items():
            call = self._transfer_call(self.rank, dst, msgs, op, step)
            header = self._header(call)
            sent = _Outgoing(dst, call, [header])
            sent.requests.append(world.Isend([header, MPI.BYTE], dest=dst,
                                             tag=TRANSFER_HEADER_TAG))
            for m in msgs:
                data = _bytes(sends[m])
                sent.keep.append(data)  # alive until the send completes
                if data.nbytes:
                    sent.requests.append(world.Isend([data, MPI.BYTE], dest=dst,
                                                     tag=TRANSFER_DATA_TAG))
            self._outbox.append(sent)

        def wait() -> dict:
            for arrival in mine:
                self._check_headers(arrival)
            for arrival in mine:
                if arrival.data:
                    self.watchdog.doing = arrival.call
                    self.watchdog.wait(arrival.data, arrival.call, [arrival.src])
                    self.watchdog.doing = None
                    self.watchdog.last = arrival.call
            return received

        def test() -> bool:
            if self._outbox:
                self._reap()
            return all(a.header_request.Test() and MPI.Request.Testall(a.data) for a in mine)

        return Pending(wait=wait, test=test)

    def _transfer_call(self, src: int, dst: int, msgs: list, op, step) -> Call:
        """The fingerprint of one transfer from ``src`` to ``dst`` (its number on the pair
        counts up alike on both sides)."""
        seq = self._transfers.get((src, dst), 0) + 1
        self._transfers[(src, dst)] = seq
        first = msgs[0]
        return Call(seq, "send_recv", (src, dst), op, step, tuple(first.shape),
                    dtype_text(np.dtype(first.dtype)), (f"{len(msgs)} messages",),
                    guard=tuple((m.tag, tuple(m.shape), np.dtype(m.dtype).num) for m in msgs))

    def _digest(self, call: Call) -> int:
        """64-bit digest of what both sides of a transfer must agree on; in debug mode of
        its whole fingerprint (op, boxing step, SBPs, placements)."""
        if self.watchdog.check:
            return int.from_bytes(call.record()[:8].tobytes(), "little", signed=True)
        return hash((call.seq, _SEND_RECV, call.group, call.guard))

    def _header(self, call: Call) -> np.ndarray:
        header = np.zeros(HEADER_BYTES, dtype=np.uint8)
        digest = self._digest(call)
        header[:16].view(np.int64)[:] = (digest, ~digest)
        text = f"rank {self.rank} sent {call.describe()}".encode("utf-8", "replace")
        text = text[:HEADER_BYTES - 16]
        header[16:16 + len(text)] = np.frombuffer(text, dtype=np.uint8)
        return header

    def _check_headers(self, arrival: "_Incoming") -> None:
        """Wait for the headers from ``arrival.src`` up to ``arrival``'s (oldest first) and
        compare each with what this rank expects; raise if one disagrees."""
        queue = self._unchecked.get(arrival.src, [])
        if arrival.checked:
            return
        while queue:
            first = queue[0]
            self.watchdog.doing = first.call
            self.watchdog.wait([first.header_request], first.call, [first.src])
            self.watchdog.doing = None
            queue.pop(0)
            first.checked = True
            digest = self._digest(first.call)
            got = first.header[:16].view(np.int64)
            if not (got[0] == digest and got[1] == ~digest):
                sent = first.header[16:].tobytes().rstrip(b"\0").decode("utf-8", "replace")
                raise DivergenceError(
                    f"rank {self.rank} expected {first.call.describe()} from rank "
                    f"{first.src}, but the transfer that arrived differs:\n"
                    f"  rank {self.rank}: expected {first.call.describe()}\n"
                    f"  rank {first.src}: {sent or 'a transfer without a description'}\n"
                    f"Every rank must run the same ctensor ops on the same global tensors "
                    f"(same shapes, dtypes and SBPs) in the same order: look for "
                    f"rank-dependent branches or data before this op. The job cannot "
                    f"continue and will be aborted.")
            if first is arrival:
                return

    def _reap(self) -> None:
        """Drop the sends that have completed from the outbox."""
        testall = self._MPI.Request.Testall
        self._outbox = [s for s in self._outbox if not testall(s.requests)]

    def flush(self) -> None:
        """Wait (under the watchdog) until every send of :meth:`exchange_start` has been
        received."""
        while self._outbox:
            sent = self._outbox[0]
            self.watchdog.doing = sent.call
            self.watchdog.wait(sent.requests, sent.call, [sent.dst])
            self.watchdog.doing = None
            self._outbox.pop(0)

