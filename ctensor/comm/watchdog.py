"""No hangs: timed waits, collective fingerprints and "what are you doing?" queries (MPI).

Every MPI collective of :class:`~ctensor.comm.mpi.MPICommunicator` is started as a
nonblocking call and completed by :meth:`Watchdog.wait`, which

* spins on ``Test`` for :data:`SPIN_SECONDS` (a small collective never pays a syscall),
  then keeps testing while yielding the core until :data:`YIELD_SECONDS` (MPI progresses
  only inside MPI calls, so large transfers must be tested continuously), then sleeps
  with a doubling delay up to :data:`MAX_SLEEP_SECONDS` between tests;
* while sleeping, answers other ranks' queries about what this rank is doing, and takes
  the notices of ranks that left (below): if it waits for one of them it raises
  :class:`~ctensor.errors.RankExitedError`;
* after ``CTENSOR_TIMEOUT`` seconds (default 60) asks the ranks it waits for what they are
  doing and raises :class:`~ctensor.errors.CommTimeoutError` naming the op, the ranks and
  their answers, instead of waiting forever.

**Leaving.** At the end of the script (an ``atexit`` handler, which runs before mpi4py
finalizes MPI) :meth:`Watchdog.leave` sends every other rank a notice saying this rank
leaves and after which collective, then waits (answering queries) for the same notice from
every other rank. Ranks that all reach the end thus leave together, as ``MPI_Finalize``
would make them anyway, while a rank that leaves early (``sys.exit``, a ``return`` from
``main``, the end of the script) makes the ranks waiting for it fail within about a second
instead of at their timeout. Ranks that merely finish early (not in a placement that is
still busy) keep waiting without an error (for ``CTENSOR_TIMEOUT`` at most; then
``MPI_Finalize`` waits for the others, as it always did).

In debug mode (``CTENSOR_DEBUG=1`` or :func:`ct.debug.check_consistency`) a collective first
exchanges a fixed-size fingerprint (:class:`Call`: per-group sequence number, collective,
group, op, boxing step with shape, dtype, SBP and placement) with the other members,
point-to-point on the world communicator with a reserved tag. Point-to-point needs no
communicator creation and never matches a collective, so a rank that went elsewhere
cannot make the exchange hang: its record simply does not arrive before the deadline.
Members whose records differ raise :class:`~ctensor.errors.DivergenceError` on every
member, listing what each was doing.

After either error the ranks no longer agree on their collectives; the job cannot go on
communicating. The error is raised on the ranks that detect it; let it reach the
excepthook (installed under mpiexec), which aborts the job.
"""
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from . import context
from ..errors import CommTimeoutError, DivergenceError, RankExitedError

__all__ = ["Call", "Watchdog", "env_timeout", "env_debug", "SPIN_SECONDS",
           "MAX_SLEEP_SECONDS", "RECORD_BYTES", "DEFAULT_TIMEOUT", "DEBUG_TIMEOUT",
           "timeout_advice"]

#: seconds a wait spins on ``Test`` alone (a small collective never pays a syscall)
SPIN_SECONDS = 2e-4
#: until this many seconds it keeps testing, yielding the core between tests: MPI makes
#: progress only inside MPI calls, so a large transfer must be tested continuously, while a
#: peer that shares the core (more ranks than cores) still gets to run
YIELD_SECONDS = 1.0
#: after that it sleeps between tests (a peer is late), doubling up to this many seconds
MAX_SLEEP_SECONDS = 1e-3
#: the same at exit, waiting for ranks that are still busy (no hurry; leave the cores free)
EXIT_SLEEP_SECONDS = 2e-2
#: how long a wait still tests its requests after it learnt that a rank it waits for left
#: (that rank may have finished its part of this very collective just before it left)
LEFT_GRACE_SECONDS = 0.5
#: default of ``CTENSOR_TIMEOUT``. One wait covers one collective from the moment this rank
#: enters it: the transfer itself (a 1 GiB all-reduce takes ~20 s over 1 Gbit/s Ethernet,
#: well under a second in shared memory) plus the other ranks' lateness (their first-time
#: communicator creation, imports or compilation, a rank-0-only print or plot). Ranks that
#: left or run different collectives on the same group no longer depend on it (they fail
#: within about a second), so it only has to catch real hangs: a minute is a wait a user at
#: a workstation can live with, and CTENSOR_TIMEOUT raises it for longer one-rank work.
DEFAULT_TIMEOUT = 60.0
#: default deadline of the fingerprint exchange in debug mode (capped by ``CTENSOR_TIMEOUT``)
DEBUG_TIMEOUT = 20.0
#: how long a rank that timed out waits for answers to its queries
ANSWER_SECONDS = 2.0
#: fixed size of a fingerprint record / an answer: digest + text
RECORD_BYTES = 512
_DIGEST_BYTES = 16
# reserved point-to-point tags on the world communicator (boxing's exchanges use small tags)
FINGERPRINT_TAG = 32760
QUERY_TAG = 32761
ANSWER_TAG = 32762
HANDSHAKE_TAG = 32763
LEAVE_TAG = 32764


_yield = getattr(os, "sched_yield", lambda: time.sleep(0))


def env_timeout() -> float:
    """``CTENSOR_TIMEOUT`` in seconds (default 60); a bad value is a ``ValueError``."""
    text = os.environ.get("CTENSOR_TIMEOUT", "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"CTENSOR_TIMEOUT must be a positive number of seconds, got {text!r}; "
                         f"unset it for the default of {DEFAULT_TIMEOUT:g} s")
    return value


def env_debug() -> bool:
    """Whether ``CTENSOR_DEBUG`` asks for consistency checks (any value but ``""``/``0``)."""
    return os.environ.get("CTENSOR_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


@dataclass
class Call:
    """What one rank is doing in one collective: its fingerprint.

    ``args`` are the arguments every member passes alike (dims, part sizes, reduction);
    ``shape`` is this rank's buffer shape, compared across members only where the
    collective needs equal shapes (``same_shape``). ``step`` is the boxing step being run
    (described only when a message or a fingerprint needs it). ``guard`` holds, as plain
    ints, what the members must agree on for the data to fit (dtype, part sizes, the
    shape outside the gathered dim): the always-on check all-reduces a digest of it.
    """

    seq: int
    collective: str
    group: tuple
    op: str
    step: Any
    shape: tuple
    dtype: str
    args: tuple = ()
    same_shape: bool = False
    guard: tuple = ()

    def key(self) -> str:
        """The rank-independent part: equal on every member of a consistent call."""
        shape = self.shape if self.same_shape else ()
        return (f"{self.seq}|{self.collective}|{self.group}|{self.op}|{self.step_text()}|"
                f"{self.dtype}|{self.args}|{shape}|{self.guard}")

    def describe(self) -> str:
        """One line for error messages."""
        where = f" [{self.step_text()}]" if self.step is not None else ""
        args = f" {', '.join(map(str, self.args))}" if self.args else ""
        local = f", local buffer {self.shape} {self.dtype}" if self.dtype else ""
        return (f"collective #{self.seq} on ranks {list(self.group)}: {self.collective}"
                f"{args} for op {self.op!r}{where}{local}")

    def step_text(self) -> str:
        """The boxing step in words (layouts, SBPs, placement), or ``""`` outside boxing."""
        return context.describe_step(self.step) if self.step is not None else ""

    def record(self) -> np.ndarray:
        """Fixed-size bytes: digest of :meth:`key`, then the (truncated) description."""
        digest = hashlib.blake2b(self.key().encode(), digest_size=_DIGEST_BYTES).digest()
        return _pack(digest, self.describe())


def _pack(digest: bytes, text: str) -> np.ndarray:
    out = np.zeros(RECORD_BYTES, dtype=np.uint8)
    body = text.encode("utf-8", "replace")[:RECORD_BYTES - _DIGEST_BYTES]
    out[:_DIGEST_BYTES] = np.frombuffer(digest.ljust(_DIGEST_BYTES, b"\0"), dtype=np.uint8)
    out[_DIGEST_BYTES:_DIGEST_BYTES + len(body)] = np.frombuffer(body, dtype=np.uint8)
    return out


def _unpack(buf: np.ndarray) -> tuple[bytes, str]:
    raw = buf.tobytes()
    return raw[:_DIGEST_BYTES], raw[_DIGEST_BYTES:].rstrip(b"\0").decode("utf-8", "replace")


def _answer_lines(answers: dict) -> list:
    """One line per asked rank: what it said it was doing, or that it did not answer."""
    return [f"  rank {r}: " + (text if text is not None else
                               "no answer (finished, failed, or busy outside ctensor "
                               "collectives)") for r, text in answers.items()]


def timeout_advice(size: int = 2) -> str:
    """What to do after a timeout: see what each rank runs, or allow slow ranks more time."""
    return ("To see which op each rank is at, rerun with CTENSOR_DEBUG=1 (for example "
            f"CTENSOR_DEBUG=1 mpiexec -n {size} python script.py): every collective then first "
            "compares what the ranks are about to run. If the ranks are only slow (work that "
            "some ranks do alone, such as evaluating or saving on rank 0, or a first-time "
            "compilation), raise the limit: CTENSOR_TIMEOUT=600 (seconds; default "
            f"{DEFAULT_TIMEOUT:g}).")


class Watchdog:
    """Timed waits and fingerprint checks of one MPI process (see the module docstring).

    ``world`` is ``MPI.COMM_WORLD`` (or a duplicate); ``timeout`` bounds every wait.
    """

    def __init__(self, MPI, world, timeout: float, check: bool = False,
                 check_timeout: float = DEBUG_TIMEOUT):
        self.MPI = MPI
        self.world = world
        self.rank = world.Get_rank()
        self.timeout = float(timeout)
        self.check = bool(check)
        self.check_timeout = float(check_timeout)
        self.doing: Optional[Call] = None
        #: the last collective this rank completed (named when it leaves)
        self.last: Optional[Call] = None
        #: what this rank answers when it is not inside a collective
        self.idle = "not inside a ctensor collective"
        #: ranks that left: {rank: their notice}
        self.left: dict = {}
        #: the communicator this rank is agreeing to create (:meth:`agree`), or None
        self.creating: Optional[str] = None
        self._inflight: list = []  # (buffer, request) of queries and answers being sent
        self._query_buf = np.zeros(1, dtype=np.int64)

    # ------------------------------------------------------------------ waiting
    def wait(self, requests: Sequence, call: Call, waiting_for: Sequence[int],
             timeout: Optional[float] = None) -> None:
        """Complete ``requests`` or raise :class:`CommTimeoutError` after ``timeout`` s
        (default ``CTENSOR_TIMEOUT``), or :class:`RankExitedError` as soon as one of the
        ``waiting_for`` ranks is known to have left."""
        limit = self.timeout if timeout is None else timeout
        if self._poll(requests, limit, call, waiting_for):
            return
        raise self._timeout_error(call, waiting_for, limit)

    def _poll(self, requests: Sequence, timeout: float, call: Optional[Call] = None,
              waiting_for: Sequence[int] = (), max_sleep: float = MAX_SLEEP_SECONDS) -> bool:
        """Test until every request completed (True) or ``timeout`` passed (False); raise
        :class:`RankExitedError` if one of the ``waiting_for`` ranks left meanwhile."""
        if len(requests) == 1:
            # one request: its own Test (MPICH's Testall misreports persistent collectives)
            test = requests[0].Test
        else:
            testall = self.MPI.Request.Testall

            def test() -> bool:
                return testall(requests)
        if test():
            return True
        now = time.perf_counter
        start = now()
        while now() - start < SPIN_SECONDS:
            if test():
                return True
        if waiting_for and self._check_left(call, waiting_for, test):
            return True  # a wait longer than the spin: had a rank it needs already left?
        yield_until = start + min(YIELD_SECONDS, timeout)
        while now() < yield_until:
            if test():
                return True
            _yield()
        deadline = start + timeout
        delay = MAX_SLEEP_SECONDS / 64
        while True:
            time.sleep(delay)
            delay = min(2 * delay, max_sleep)
            if test():
                return True
            self.serve_queries()
            if waiting_for and self._check_left(call, waiting_for, test):
                return True
            if now() > deadline:
                return test()

    # ------------------------------------------------------------------ leaving
    def _take_notices(self) -> None:
        """Receive every notice of a rank that left into :attr:`left`."""
        MPI = self.MPI
        status = MPI.Status()
        while self.world.Iprobe(source=MPI.ANY_SOURCE, tag=LEAVE_TAG, status=status):
            source = status.Get_source()
            buf = np.empty(RECORD_BYTES, dtype=np.uint8)
            self.world.Recv([buf, MPI.BYTE], source=source, tag=LEAVE_TAG)
            self.left[source] = _unpack(buf)[1]

    def _check_left(self, call: Optional[Call], waiting_for: Sequence[int],
                    test=lambda: False) -> bool:
        """Raise :class:`RankExitedError` if one of ``waiting_for`` left, unless the wait
        completes within :data:`LEFT_GRACE_SECONDS` (True then): a rank that finished this
        very collective (or sent its part of a transfer) and left at once may have done so
        before this rank's request completed."""
        self._take_notices()
        gone = [r for r in waiting_for if r in self.left]
        if not gone:
            return False
        end = time.perf_counter() + LEFT_GRACE_SECONDS
        while time.perf_counter() < end:
            if test():
                return True
            time.sleep(1e-4)
        where = call.describe() if call is not None else "a collective"
        lines = [f"rank {self.rank} waits in {where}, but rank{'s' if len(gone) > 1 else ''} "
                 f"{', '.join(map(str, gone))} left and will never join it:"]
        lines += [f"  {self.left[r]}" for r in gone]
        lines.append("Every rank must run the same ctensor ops on the same global tensors: "
                     "look for a sys.exit, return or break that only some ranks take before "
                     "this op. The job cannot continue and will be aborted.")
        raise RankExitedError("\n".join(lines))

    def leave(self, size: int, timeout: Optional[float] = None) -> bool:
        """The end of this rank's script: tell every other rank that it leaves (and after
        which collective), then wait, answering queries, until each has said the same — at
        most ``timeout`` s (default ``CTENSOR_TIMEOUT``; after that ``MPI_Finalize`` waits
        as it always does). Returns whether every other rank said so in time."""
        MPI = self.MPI
        others = [r for r in range(size) if r != self.rank]
        if not others:
            return True
        after = (f"after {self.last.describe()}" if self.last is not None else
                 "before its first collective")
        note = _pack(b"", f"rank {self.rank} finished its script (reached its end, returned "
                          f"or called sys.exit) {after}")
        self.doing = None
        self.idle = "finished its script; waiting at exit for the other ranks to finish"
        sends = [self.world.Isend([note, MPI.BYTE], dest=r, tag=LEAVE_TAG) for r in others]
        self._take_notices()
        bufs = {r: np.empty(RECORD_BYTES, dtype=np.uint8) for r in others if r not in self.left}
        recvs = [self.world.Irecv([buf, MPI.BYTE], source=r, tag=LEAVE_TAG)
                 for r, buf in bufs.items()]
        if self._poll(recvs + sends, self.timeout if timeout is None else timeout,
                      max_sleep=EXIT_SLEEP_SECONDS):
            return True
        for req in recvs:  # some rank is still busy (or finalized MPI itself): stop waiting
            try:
                req.Cancel()
                req.Wait()  # a cancelled receive completes at once
            except MPI.Exception:
                pass
        return False

    # ------------------------------------------------------------------ queries
    def serve_queries(self) -> None:
        """Answer every pending "what are you doing?" query with this rank's current call."""
        MPI = self.MPI
        status = MPI.Status()
        while self.world.Iprobe(source=MPI.ANY_SOURCE, tag=QUERY_TAG, status=status):
            source = status.Get_source()
            self.world.Recv([self._query_buf, MPI.INT64_T], source=source, tag=QUERY_TAG)
            text = self.doing.describe() if self.doing is not None else self.idle
            if self.creating is not None:
                text += f"; waiting for its members to create {self.creating} first"
            answer = _pack(b"", text)
            self._inflight.append((answer, self.world.Isend([answer, MPI.BYTE], dest=source,
                                                            tag=ANSWER_TAG)))
        if self._inflight:
            self._inflight = [(buf, req) for buf, req in self._inflight if not req.Test()]

    def ask(self, ranks: Sequence[int]) -> dict:
        """``{rank: what it says it is doing, or None if it did not answer}``, waiting at
        most :data:`ANSWER_SECONDS` (a rank answers while it waits inside a collective)."""
        MPI = self.MPI
        token = np.array([self.rank], dtype=np.int64)
        pending, bufs = {}, {}
        for r in ranks:
            try:
                self._inflight.append(
                    (token, self.world.Isend([token, MPI.INT64_T], dest=r, tag=QUERY_TAG)))
                bufs[r] = np.zeros(RECORD_BYTES, dtype=np.uint8)
                pending[r] = self.world.Irecv([bufs[r], MPI.BYTE], source=r, tag=ANSWER_TAG)
            except MPI.Exception:  # the rank is gone (finished or failed)
                continue
        deadline = time.perf_counter() + ANSWER_SECONDS
        answers = {r: None for r in ranks}
        while pending and time.perf_counter() < deadline:
            self.serve_queries()
            for r, req in list(pending.items()):
                try:
                    done = req.Test()
                except MPI.Exception:
                    done, bufs[r] = True, None
                if done:
                    del pending[r]
                    answers[r] = None if bufs[r] is None else _unpack(bufs[r])[1]
            time.sleep(1e-3)
        for req in pending.values():
            try:
                req.Cancel()
            except MPI.Exception:
                pass
        return answers

    def _timeout_error(self, call: Call, waiting_for: Sequence[int],
                       timeout: float) -> CommTimeoutError:
        answers = self.ask(list(waiting_for))
        creating = (f" (creating {self.creating} first)" if self.creating is not None
                    else "")
        lines = [f"rank {self.rank} waited {timeout:g} s (CTENSOR_TIMEOUT) in "
                 f"{call.describe()}{creating}; the ranks {list(waiting_for)} did not "
                 f"complete it:"]
        lines += _answer_lines(answers)
        lines.append("The ranks ran different collectives, one of them is stuck, or they are "
                     "only slow; the job cannot continue safely and will be aborted.")
        lines.append(timeout_advice(self.world.Get_size()))
        return CommTimeoutError("\n".join(lines))

    # ------------------------------------------------------------------ fingerprints
    def verify(self, call: Call, members: Sequence[int]) -> None:
        """Debug mode: exchange ``call``'s fingerprint with the other ``members`` and raise
        :class:`DivergenceError` (on every member) if any differs."""
        MPI = self.MPI
        peers = [m for m in members if m != self.rank]
        if not peers:
            return
        mine = call.record()
        bufs = {p: np.empty(RECORD_BYTES, dtype=np.uint8) for p in peers}
        recvs = {p: self.world.Irecv([bufs[p], MPI.BYTE], source=p, tag=FINGERPRINT_TAG)
                 for p in peers}
        sends = [self.world.Isend([mine, MPI.BYTE], dest=p, tag=FINGERPRINT_TAG) for p in peers]
        limit = min(self.check_timeout, self.timeout)
        if not self._poll(list(recvs.values()) + sends, limit, call, peers):
            missing = [p for p, req in recvs.items() if not req.Test()]
            answers = self.ask(missing)
            if not all(req.Test() for req in recvs.values()):  # not merely late
                raise self._missing_error(call, answers, limit)
            self.wait(sends, call, peers)
        self._compare(mine, call.describe(), bufs, ": ",
                      f"ranks {list(members)} reached different collectives (seen from rank "
                      f"{self.rank}):",
                      "Every rank of a placement must run the same ops on the same global "
                      "tensors (same shapes, dtypes and SBPs) in the same order: look for "
                      "rank-dependent branches or data before this op. The job cannot "
                      "continue and will be aborted.")

    def _compare(self, mine: np.ndarray, my_text: str, bufs: dict, sep: str, header: str,
                 advice: str) -> None:
        """The peers' records in ``bufs`` against ``mine``: nothing when every digest
        matches, else a :class:`DivergenceError` listing each rank's text (``rank r`` +
        ``sep`` + text) between ``header`` and ``advice``."""
        records = {p: _unpack(buf) for p, buf in bufs.items()}
        digest, _ = _unpack(mine)
        if all(d == digest for d, _ in records.values()):
            return
        texts = {self.rank: my_text, **{p: t for p, (_, t) in records.items()}}
        lines = [header] + [f"  rank {r}{sep}{texts[r]}" for r in sorted(texts)]
        raise DivergenceError("\n".join(lines + [advice]))

    def disagree(self, call: Call, members: Sequence[int]) -> None:
        """The always-on digest check of ``call`` differed between ``members``. Every member
        found it at this same point, so all of them exchange their fingerprints and raise the
        :class:`DivergenceError` of :meth:`verify`, which says what each rank runs."""
        self.verify(call, members)
        raise DivergenceError(f"ranks {list(members)} disagree on {call.describe()} (their "
                              f"digests differ); rerun with CTENSOR_DEBUG=1 for details")

    def _missing_error(self, call: Call, answers: dict, limit: float) -> Exception:
        missing = list(answers)
        elsewhere = {r: t for r, t in answers.items() if t is not None}
        lines = [f"rank {self.rank} is at {call.describe()}; within {limit:g} s the ranks "
                 f"{missing} did not reach it:"]
        lines += _answer_lines(answers)
        lines.append("Every rank of a placement must run the same ops in the same order; the "
                     "job cannot continue and will be aborted.")
        error = DivergenceError if elsewhere else CommTimeoutError
        return error("\n".join(lines))

    def agree(self, members: Sequence[int], what: str, call: Call) -> None:
        """Before a blocking communicator creation: the ``members`` agree that they all
        create ``what`` (its kind and its group's ranks *in order*, such as ``"the MPI
        communicator of ranks [1, 0]"``) now.

        Each member sends every other one a fixed-size record (digest of ``what``, then the
        text) point-to-point on the world communicator and receives theirs, under the
        watchdog: a member that never comes (it waits in a collective of another group, or
        is stuck) is a :class:`CommTimeoutError` after ``CTENSOR_TIMEOUT`` naming what it
        answered, one that left a :class:`RankExitedError`. A member about to create
        something else (a group listed in another order, another communicator of the same
        group) sent its own record instead: since each rank creates its communicators one
        at a time and the records of a pair of ranks arrive in the order they were sent,
        the two can never both get past their creations, so every member that sees a
        differing record raises :class:`DivergenceError` at once, naming both sides. Only
        after every record matched does a member enter the creation, which then completes.
        """
        MPI = self.MPI
        peers = [m for m in members if m != self.rank]
        if not peers:
            return
        digest = hashlib.blake2b(what.encode(), digest_size=_DIGEST_BYTES).digest()
        mine = _pack(digest, f"{what}, before {call.describe()}")
        bufs = {p: np.zeros(RECORD_BYTES, dtype=np.uint8) for p in peers}
        reqs: list[Any] = [self.world.Irecv([bufs[p], MPI.BYTE], source=p, tag=HANDSHAKE_TAG)
                           for p in peers]
        reqs += [self.world.Isend([mine, MPI.BYTE], dest=p, tag=HANDSHAKE_TAG) for p in peers]
        self.creating = what  # kept after an error: the answer while the job aborts
        self.wait(reqs, call, peers)
        self.creating = None
        self._compare(mine, _unpack(mine)[1], bufs, " creates ",
                      f"ranks {list(members)} are about to create different communicators "
                      f"(seen from rank {self.rank}), so neither creation could ever complete:",
                      "A placement's rank list is ordered (ct.placement(\"cpu\", [0, 1]) and "
                      "ct.placement(\"cpu\", [1, 0]) are different groups): every rank must "
                      "build the same placements and run the same ops on them in the same "
                      "order; look for a rank-dependent placement or branch before this op. "
                      "The job cannot continue and will be aborted.")
