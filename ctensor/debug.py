"""Seeing where data lives and where it moves, and catching ranks that disagree.

* :func:`visualize` draws how a tensor is laid out over its mesh (pure metadata);
* :func:`comm_log` records every boxing step (op, from SBP, to SBP, collective, bytes)
  and prints a per-op summary table;
* :func:`check_consistency` (or ``CTENSOR_DEBUG=1``) turns on the fingerprint exchange
  before every MPI collective, so ranks that run different collectives (on different
  groups too) get a :class:`~ctensor.errors.DivergenceError` instead of a hang;
* :func:`check_tensor_data` switches off (or on again) the checks, on by default, that
  every rank passed ``ct.tensor`` the same data and that shards along broadcast mesh axes
  are equal (``ct.from_local``, ``Module.to_global``, :func:`check_broadcast_data`; in
  :mod:`ctensor.datacheck`);
* :func:`track_memory` and :func:`memory` count the bytes of shards each rank holds, now
  and at peak, by kind (parameters, gradients, optimizer states, activations).

Under mpiexec, whether or not debug mode is on, a collective whose members disagree on
what they run raises :class:`~ctensor.errors.DivergenceError` before its data moves, one
that waits longer than ``CTENSOR_TIMEOUT`` seconds (default 60) raises
:class:`~ctensor.errors.CommTimeoutError`, and one that waits for a rank that has left
raises :class:`~ctensor.errors.RankExitedError`. After any of them the job cannot safely
run more collectives: let it propagate and the excepthook aborts the job. In a simulation
one process holds every rank, so the checks are no-ops there.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np

from . import memory as _memory
from . import profile as _profile_module
from . import timing as _profile
from . import worktrace as _trace
from .comm import context
from .datacheck import check_broadcast_data, check_same_data, check_tensor_data
from .meta import for_world

__all__ = ["comm_log", "CommEvent", "CommLog", "visualize", "Picture", "per_rank", "peak_rss",
           "check_consistency", "consistency_checks_enabled", "check_tensor_data",
           "check_same_data", "check_broadcast_data",
           "boxing_step",
           "track_memory", "memory", "reset_peak_memory", "tag_memory", "MemoryStats",
           "profile", "set_sync_debug_mode", "get_sync_debug_mode"]

#: ``ct.debug.set_sync_debug_mode("warn" | "error" | "default")``: implicit device->host copies
#: (host synchronisations) warn or raise, like ``torch.cuda.set_sync_debug_mode``
from ._device import get_sync_debug_mode, set_sync_debug_mode  # noqa: E402

#: ``with ct.debug.profile() as prof:``: where each step's time goes (ctensor/profile.py)
profile = _profile_module.profile


# ----------------------------------------------------------------------------- comm log
@dataclass(frozen=True)
class CommEvent:
    """One boxing step: which op caused it, the SBPs, the collective, the bytes moved, the
    logical shape and dtype of the tensor it moved, and its placements before and after.

    ``nbytes`` is a per-rank figure, the same under mpiexec and in a simulation: the bytes
    of the shard a rank feeds into the collective (its part of an all-gather, its whole
    buffer of an all-reduce, the messages it sends plus those it receives in a
    ``send_recv``). Under mpiexec it is this process's rank's; a simulation, which feeds
    every rank's shards at once, logs their mean per rank (each rank's own for an even
    layout). Multiply by the ranks of the placement for the job's total."""

    op: str
    src: tuple
    dst: tuple
    collective: str
    nbytes: int
    mesh_axis: Optional[int] = None
    shape: tuple = ()
    dtype: str = ""
    #: where the moved tensor lives before and after the step (the groups are its mesh's
    #: rows along ``mesh_axis``; a ``send_recv`` moves between the two placements)
    placement: Optional[object] = None
    target: Optional[object] = None

    def __repr__(self) -> str:
        from .sbp import format_sbp
        axis = "" if self.mesh_axis is None else f" axis {self.mesh_axis}"
        return (f"{self.op}: {format_sbp(self.src)} -> {format_sbp(self.dst)} via "
                f"{self.collective}{axis} of {self.shape} {self.dtype} ({self.nbytes} B)")


def _human(nbytes: int) -> str:
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{nbytes} B"


class CommLog(list):
    """The events recorded inside a :func:`comm_log` block (a list of :class:`CommEvent`)."""

    def collectives(self) -> list:
        """Names of the communicating steps (local slices and pads left out)."""
        return [e.collective for e in self if e.collective not in _LOCAL]

    @property
    def total_bytes(self) -> int:
        """Bytes one rank fed into the communicating steps (the sum of their per-rank
        :attr:`CommEvent.nbytes`)."""
        return sum(e.nbytes for e in self if e.collective not in _LOCAL)

    def summary(self) -> str:
        """A table: per op and collective, count and bytes per rank (:class:`CommEvent`),
        then the total.

        >>> print(log.summary())
        op                      collective          count    bytes/rank
        to_global               all_gather              1       1.0 KiB
        total                                           1       1.0 KiB
        """
        rows: dict = {}
        for e in self:
            if e.collective in _LOCAL:
                continue
            key = (e.op, e.collective)
            count, nbytes = rows.get(key, (0, 0))
            rows[key] = (count + 1, nbytes + e.nbytes)
        head = f"{'op':<24}{'collective':<16}{'count':>9}{'bytes/rank':>14}"
        if not rows:
            return head + "\n(no communication)"
        lines = [head]
        for (op, coll), (count, nbytes) in sorted(rows.items()):
            lines.append(f"{op:<24}{coll:<16}{count:>9}{_human(nbytes):>14}")
        total_count = sum(c for c, _ in rows.values())
        lines.append(f"{'total':<40}{total_count:>9}{_human(self.total_bytes):>14}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


_LOCAL = ("slice", "pad_partial", "local", "relabel")
_logs: list = []


@contextlib.contextmanager
def comm_log() -> Iterator[CommLog]:
    """Record every boxing step run inside the block.

    >>> with ct.debug.comm_log() as log:
    ...     y = x.to_global(sbp=ct.sbp.broadcast)
    >>> log.collectives()
    ['all_gather']
    >>> print(log.summary())        # per op and collective: count and bytes per rank
    """
    log = CommLog()
    _logs.append(log)
    try:
        yield log
    finally:
        _logs.remove(log)


class boxing_step:
    """``with debug.boxing_step(step):`` around one boxing step, so that collective
    fingerprints and timeout messages can say which layouts it converts (used by boxing)."""

    __slots__ = ("step",)

    def __init__(self, step):
        self.step = step

    def __enter__(self):
        context.step_stack.append(self.step)
        if _profile.on:  # ct.debug.profile(): the step's copies around its collective
            _profile.enter(_profile.BOXING, getattr(self.step, "collective", "boxing"))

    def __exit__(self, *exc) -> None:
        context.step_stack.pop()
        if _profile.on:
            _profile.leave()


def _per_rank(step, nbytes: int) -> int:
    """:attr:`CommEvent.nbytes` from ``nbytes``, the bytes this process fed into ``step``.

    Under mpiexec a process holds one rank, so they are already that rank's. A simulation
    (or a shape-only world) feeds every rank's shards at once: the figure is their mean
    per rank taking part (rounded; each rank's own for an even layout), so one script logs
    the same figure both ways. A collective's ranks are its placement's; a ``send_recv``
    counts each message at its sender and at its receiver, as each of those processes
    logs it under mpiexec."""
    from . import runtime
    if len(runtime.world().held_ranks) <= 1:
        return nbytes
    messages = getattr(step, "messages", None)
    if messages is not None:
        ranks = {r for m, _ in messages if m.src != m.dst for r in (m.src, m.dst)}
        return round(2 * nbytes / len(ranks)) if ranks else 0
    return round(nbytes / step.before.placement.size)


def record(step, nbytes: int) -> None:
    """Called by boxing for every step it runs (and by the shape-only executor for every
    step it would run) with the bytes of the shards this process fed into it (a trace,
    :mod:`ctensor.worktrace`, gets them as they are; the communication log per rank)."""
    if _trace.active:  # (a gradient's reduction is named so, whatever op boxes it)
        stack = context.op_stack
        _trace.comm(step, "grad_sync" if "grad_sync" in stack else stack[-1], nbytes)
    if not _logs:
        return
    event = CommEvent(context.op_stack[-1], step.before.sbp, step.after.sbp, step.collective,
                      _per_rank(step, int(nbytes)), step.mesh_axis, tuple(step.before.shape),
                      str(step.before.dtype), step.before.placement, step.after.placement)
    for log in _logs:
        log.append(event)


# ----------------------------------------------------------------------------- consistency
def _process_comm():
    from . import runtime
    return runtime._base_world().comm


class check_consistency:
    """Turn on (or off) the fingerprint exchange before every MPI collective.

    Each collective first exchanges a fixed-size record (per-group sequence number,
    collective, op, boxing step with shape, dtype, SBP and placement) with the other
    members; ranks that disagree raise :class:`~ctensor.errors.DivergenceError` on every
    member, and a member that does not arrive within ``timeout`` seconds (default 20, at
    most ``CTENSOR_TIMEOUT``) turns into an error naming it. Same as ``CTENSOR_DEBUG=1``;
    call it on every rank at the same point. A no-op in a simulation (one process holds
    every rank).

    >>> ct.debug.check_consistency()            # from here on
    >>> with ct.debug.check_consistency():      # or only inside the block
    ...     y = x.to_global(sbp=ct.sbp.broadcast)
    """

    def __init__(self, enabled: bool = True, timeout: Optional[float] = None):
        if not isinstance(enabled, bool):
            raise TypeError(f"check_consistency: argument 'enabled' must be True or False, "
                            f"got {enabled!r}")
        if timeout is not None and (isinstance(timeout, bool) or
                                    not isinstance(timeout, (int, float)) or not timeout > 0):
            raise ValueError(f"check_consistency: argument 'timeout' must be a positive number "
                             f"of seconds or None, got {timeout!r}")
        comm = _process_comm()
        self._comm = comm
        self._previous = bool(comm.check_consistency)
        watchdog = getattr(comm, "watchdog", None)
        self._previous_timeout = watchdog.check_timeout if watchdog is not None else None
        comm.check_consistency = enabled
        if watchdog is not None and timeout is not None:
            watchdog.check_timeout = float(timeout)

    def __enter__(self) -> "check_consistency":
        return self

    def __exit__(self, *exc) -> None:
        self._comm.check_consistency = self._previous
        watchdog = getattr(self._comm, "watchdog", None)
        if watchdog is not None:
            watchdog.check_timeout = self._previous_timeout

    def __repr__(self) -> str:
        return f"check_consistency(enabled={bool(self._comm.check_consistency)})"


def consistency_checks_enabled() -> bool:
    """Whether debug mode (fingerprints before every collective) is on in this process."""
    return bool(_process_comm().check_consistency)


def per_rank(value) -> list:
    """Every rank's ``value`` (small Python objects: numbers, strings, tuples), as a list in
    rank order, on every rank (collective). In a simulation pass ``{rank: value}`` for the
    ranks it holds, or one value that stands for all of them.

    >>> ct.debug.per_rank(ct.debug.peak_rss())
    [185778176, 185335808]
    """
    from . import runtime
    w = runtime.world()
    objs = value if isinstance(value, dict) and set(value) == set(w.held_ranks) else \
        {r: value for r in w.held_ranks}
    return w.exchange(objs)


def peak_rss() -> int:
    """This process's peak resident memory in bytes: Linux's ``VmHWM`` (the high-water mark
    of its own address space), elsewhere ``getrusage``'s ``ru_maxrss``. Not ``ru_maxrss``
    on Linux: a process started by fork and exec keeps its parent's maximum in it (a
    training script run from a benchmark that holds 300 MiB reported 326 MiB for itself).

    >>> ct.debug.per_rank(ct.debug.peak_rss() / 2**20)    # MiB per rank
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # (kB)
    except OSError:
        pass
    import resource
    import sys
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # (bytes / KiB)


# ----------------------------------------------------------------------------- picture
class Picture(str):
    """A multi-line text that shows as itself at a REPL (no quotes, real newlines)."""

    def __repr__(self) -> str:
        return str(self)


def _axis_note(axis: int, size: int, entry, names: tuple) -> str:
    from .sbp import Broadcast, Split
    label = f"mesh axis {axis} ({names[axis]}size {size}): {entry!r} - "
    if isinstance(entry, Split):
        return label + f"dim {entry.dim} is split into {size} consecutive parts"
    if isinstance(entry, Broadcast):
        return label + "replicated: these ranks hold the same values"
    return label + (f"partial {entry.op.value}: the value is the {entry.op.value} of these "
                    f"ranks' arrays")


def _cell(layout, rank: int, marks: str, me: Optional[int]) -> list:
    region = layout.region(rank)
    head = f"rank {rank}" + (" *" if rank == me else "")
    if not region:
        text = "scalar"
    else:
        text = "[" + ", ".join(f"{a}:{b}" for a, b in region) + "]"
        if any(a == b for a, b in region):
            text += " empty"
    return [head, text] + ([marks] if marks else [])


def _grid(cells: list) -> list:
    """Rows of multi-line cells drawn with ``+-|``; ``cells`` is a list of rows."""
    width = max(len(line) for row in cells for cell in row for line in cell) + 2
    height = max(len(cell) for row in cells for cell in row)
    rule = "+" + "+".join("-" * width for _ in cells[0]) + "+"
    out = [rule]
    for row in cells:
        for i in range(height):
            out.append("|" + "|".join(f" {cell[i] if i < len(cell) else '':<{width - 1}}"
                                      for cell in row) + "|")
        out.append(rule)
    return out


def visualize(x) -> Picture:
    """A text picture of how ``x`` is laid out over its mesh: a header (shape, dtype,
    placement, SBP and what each mesh axis does), then the mesh as a grid (a row for a 1-D
    mesh, rows x cols for 2-D, one grid per leading index beyond that) whose cells give each
    rank's index range per dim and its marks: ``B`` replicated, ``P(sum|max|min)`` partial.

    Pure metadata: no communication, so it works at a REPL in a simulation and on every
    rank under mpiexec (where ``*`` marks this process's rank).

    >>> with ct.simulate(4):
    ...     x = ct.zeros(8, 17, placement=ct.placement("cpu", [[0, 1], [2, 3]]),
    ...                  sbp=(ct.sbp.split(0), ct.sbp.broadcast))
    ...     print(ct.debug.visualize(x))     # or x.visualize()
    """
    from .runtime import world
    from .sbp import Broadcast, Partial, format_sbp
    layout = getattr(x, "_layout", None)
    if layout is None:
        raise TypeError(f"visualize: argument 'x' must be a ct.Tensor, got "
                        f"{type(x).__name__}")
    p = layout.placement
    names = ("rows, ", "cols, ") if p.ndim == 2 else ("",) * p.ndim
    w = world()
    me = w.held_ranks[0] if len(w.held_ranks) == 1 and w.size > 1 else None
    lines = [f"Tensor shape {tuple(layout.shape)} {layout.dtype}, sbp {format_sbp(layout.sbp)}",
             f"{p!r}: mesh {' x '.join(map(str, p.shape))}"]
    lines += ["  " + _axis_note(a, n, s, names) for a, (n, s) in enumerate(zip(p.shape,
                                                                               layout.sbp))]
    marks = " ".join("B" if isinstance(s, Broadcast) else f"P({s.op.value})"
                     for s in layout.sbp if isinstance(s, (Broadcast, Partial)))
    if me is not None:
        lines.append(f"  * = this process (rank {me})")
    ranks = p.ranks
    if p.ndim == 1:
        ranks = ranks.reshape(1, -1)
    lead = ranks.shape[:-2]
    for index in np.ndindex(*lead):
        if lead:
            lines.append("mesh[" + ", ".join(map(str, index)) + ", :, :]")
        sub = ranks[index]
        cells = [[_cell(layout, int(r), marks, me) for r in row] for row in sub]
        lines += _grid(cells)
    return Picture("\n".join(lines))


# ----------------------------------------------------------------------------- memory
class track_memory:
    """Turn on (or off) counting the bytes of shards held, for :func:`memory`.

    From the call on (or inside a ``with`` block), every tensor's shards are counted per
    rank and kind until they are freed; tensors alive when it starts are counted too.
    Off (the default), nothing is counted and nothing costs. Turning it off forgets
    every figure. Per process: call it on every rank that should count.

    >>> with ct.debug.track_memory():
    ...     loss = model(x, y)[1]; loss.backward(); opt.step()
    ...     print(ct.debug.memory())
    """

    def __init__(self, enabled: bool = True):
        if not isinstance(enabled, bool):
            raise TypeError(f"track_memory: argument 'enabled' must be True or False, got "
                            f"{enabled!r}")
        self._previous = _memory.tracking
        (_memory.enable if enabled else _memory.disable)()

    def __enter__(self) -> "track_memory":
        return self

    def __exit__(self, *exc) -> None:
        if not self._previous:
            _memory.disable()

    def __repr__(self) -> str:
        return f"track_memory(enabled={_memory.tracking})"


@dataclass(frozen=True)
class MemoryStats:
    """Bytes of shards one rank holds: ``current`` and ``peak`` per kind (``parameters``,
    ``gradients``, ``optimizer``, ``activations``; each kind's own peak) and
    ``peak_total`` (the peak of the sum, which can be less than the sum of the peaks).
    ``rank`` is the rank, or ``"max"`` for the per-field maximum over the ranks a
    simulation holds."""

    rank: object
    current: dict
    peak: dict
    peak_total: int

    @property
    def current_total(self) -> int:
        return sum(self.current.values())

    def summary(self) -> str:
        """A table: per kind, bytes now and at peak.

        >>> print(ct.debug.memory().summary())
        """
        lines = [f"memory of rank {self.rank}: bytes of shards held",
                 f"{'kind':<14}{'now':>14}{'peak':>14}"]
        for kind in _memory.KINDS:
            lines.append(f"{kind:<14}{_human(self.current[kind]):>14}"
                         f"{_human(self.peak[kind]):>14}")
        lines.append(f"{'total':<14}{_human(self.current_total):>14}"
                     f"{_human(self.peak_total):>14}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def memory(rank: Optional[int] = None) -> MemoryStats:
    """The bytes of shards ``rank`` holds now and at peak since tracking started or
    :func:`reset_peak_memory`, by kind: parameters, gradients (``.grad`` of leaves),
    optimizer states, activations (everything else a tensor holds: saved activations,
    temporaries, gathered parameters, boxed copies). Views and shared shards count once.

    ``rank`` defaults to this process's rank under mpiexec; in a simulation it defaults to
    the maximum over the ranks held, field by field (the figure "per rank" that matters).
    Needs :func:`track_memory` on (``RuntimeError`` otherwise). No communication.

    >>> with ct.debug.track_memory():
    ...     loss.backward()
    ...     ct.debug.memory().peak["gradients"]
    """
    from .runtime import world
    if not _memory.tracking:
        raise RuntimeError("memory: memory tracking is off; turn it on first with "
                           "ct.debug.track_memory() (a call, or a with block around the "
                           "code to measure)")
    held = world().held_ranks
    snapshot = for_world(_memory.snapshot, _meta_snapshot)
    if rank is not None:
        if rank not in held:
            raise ValueError(f"memory: argument 'rank' is {rank!r}, but this process holds "
                             f"ranks {list(held)}")
        return MemoryStats(rank, *snapshot(rank))
    if len(held) == 1:
        return MemoryStats(held[0], *snapshot(held[0]))
    return for_world(_most_held, _most_held_meta)(held)


def _meta_snapshot(rank: int) -> tuple:
    return _memory.snapshot(rank, True)


def _most_held(held) -> MemoryStats:
    """The maximum over the ranks ``held``, field by field."""
    snaps = [_memory.snapshot(r) for r in held]
    current = {k: max(s[0][k] for s in snaps) for k in _memory.KINDS}
    peak = {k: max(s[1][k] for s in snaps) for k in _memory.KINDS}
    return MemoryStats("max", current, peak, max(s[2] for s in snaps))


def _most_held_meta(held) -> MemoryStats:
    """:func:`_most_held` of a shape-only run, whose figures are vectors over ranks."""
    f = _memory.meta_peaks()
    top = lambda a: int(a.max()) if a.size else 0  # noqa: E731
    return MemoryStats("max", {k: top(f["current_" + k]) for k in _memory.KINDS},
                       {k: top(f[k]) for k in _memory.KINDS}, top(f["total"]))


def reset_peak_memory() -> None:
    """Start the peaks of :func:`memory` again from what is held now.

    >>> ct.debug.reset_peak_memory()
    """
    _memory.reset_peak()


def tag_memory(tensor, kind: str) -> None:
    """Count ``tensor``'s shards under ``kind`` (one of ``parameters``, ``gradients``,
    ``optimizer``, ``activations``) in :func:`memory`; a no-op while tracking is off.
    ``ctensor.optim`` tags its states this way.

    >>> ct.debug.tag_memory(ema_weights, "optimizer")
    """
    if getattr(tensor, "_shards", None) is None:
        raise TypeError(f"tag_memory: argument 'tensor' must be a ct.Tensor, got "
                        f"{type(tensor).__name__}")
    _memory.tag(tensor, kind)
