"""Seeing where data lives and where it moves.

* :func:`comm_log` records every boxing step (op, from SBP, to SBP, collective, bytes);
* :func:`visualize` draws how a tensor is laid out over its mesh.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Optional

__all__ = ["comm_log", "CommEvent", "CommLog", "current_op", "visualize"]


@dataclass(frozen=True)
class CommEvent:
    """One boxing step: which op caused it, the SBPs, the collective and the bytes moved
    (bytes of the shards this process fed into it)."""

    op: str
    src: tuple
    dst: tuple
    collective: str
    nbytes: int
    mesh_axis: Optional[int] = None

    def __repr__(self) -> str:
        from .sbp import format_sbp
        axis = "" if self.mesh_axis is None else f" axis {self.mesh_axis}"
        return (f"{self.op}: {format_sbp(self.src)} -> {format_sbp(self.dst)} via "
                f"{self.collective}{axis} ({self.nbytes} B)")


class CommLog(list):
    """The events recorded inside a :func:`comm_log` block (a list of :class:`CommEvent`)."""

    def collectives(self) -> list:
        """Names of the communicating steps (local slices and pads left out)."""
        return [e.collective for e in self if e.collective not in _LOCAL]

    def summary(self) -> str:
        """A table: per op and collective, count and bytes."""
        rows: dict = {}
        for e in self:
            key = (e.op, e.collective)
            count, nbytes = rows.get(key, (0, 0))
            rows[key] = (count + 1, nbytes + e.nbytes)
        lines = [f"{'op':<24}{'collective':<16}{'count':>7}{'bytes':>14}"]
        for (op, coll), (count, nbytes) in sorted(rows.items()):
            lines.append(f"{op:<24}{coll:<16}{count:>7}{nbytes:>14}")
        return "\n".join(lines)


_LOCAL = ("slice", "pad_partial", "local", "relabel")
_logs: list = []
_op_stack: list = ["to_global"]


@contextlib.contextmanager
def comm_log() -> Iterator[CommLog]:
    """Record every boxing step run inside the block.

    >>> with ct.debug.comm_log() as log:
    ...     y = x.to_global(sbp=ct.sbp.broadcast)
    >>> log.collectives()
    ['all_gather']
    """
    log = CommLog()
    _logs.append(log)
    try:
        yield log
    finally:
        _logs.remove(log)


@contextlib.contextmanager
def current_op(name: str) -> Iterator[None]:
    """Name the op whose boxing is recorded (used by dispatch)."""
    _op_stack.append(name)
    try:
        yield
    finally:
        _op_stack.pop()


def record(step, nbytes: int) -> None:
    """Called by boxing for every step it runs."""
    if not _logs:
        return
    event = CommEvent(_op_stack[-1], step.before.sbp, step.after.sbp, step.collective,
                      int(nbytes), step.mesh_axis)
    for log in _logs:
        log.append(event)


def visualize(x) -> str:
    """A text picture of how ``x`` is laid out: per rank, its index range per dim."""
    layout = x._layout
    p = layout.placement
    from .sbp import format_sbp
    lines = [f"{tuple(layout.shape)} {layout.dtype} on {p!r} sbp {format_sbp(layout.sbp)}"]
    for r in p.rank_list:
        box = layout.box(r)
        rng = ", ".join(f"{a}:{b}" for a, b in box) or "scalar"
        marks = [f"{s!r}" for s in layout.sbp if not hasattr(s, "dim")]
        lines.append(f"  rank {r} {p.coord(r)}: [{rng}]" + (f"  {' '.join(marks)}" if marks else ""))
    return "\n".join(lines)
