"""The shape-only executor: kernels and boxing plans run on
:class:`~ctensor.meta.MetaBuffer` shards, recording every step and moving nothing.

Each step of a boxing plan is reported exactly as the real executor reports it (to
``ct.debug.comm_log()`` and to open ``ct.plan`` traces), with the bytes every rank would
feed in, computed from the layouts per class of ranks. The result's buffer mirrors the
memory a real run holds: a step that allocates (a collective, a partial pad) makes a new
buffer of its output layout; a step that only views its input (a slice, a relabel) keeps
the buffer it views, as a NumPy view keeps its base.
"""
from __future__ import annotations

import numpy as np

from . import boxing, debug
from . import worktrace as _trace
from .layout import Layout
from .meta import MetaBuffer, rank_bytes, total_bytes
from .tensor import Tensor

__all__ = ["box", "run"]


def _fed(step) -> int:
    """The bytes all ranks feed into ``step`` (what the real executor logs)."""
    cached = getattr(step, "_shape_only_fed", None)
    if cached is None:
        if step.collective == "send_recv":
            itemsize = step.before.dtype.itemsize
            cached = sum(int(np.prod(m.shape, dtype=np.int64)) * itemsize
                         for m, _ in step.messages if m.src != m.dst)
        else:
            cached = total_bytes(step.before)
        step._shape_only_fed = cached
    return cached


def box(buffer: MetaBuffer, src: Layout, dst: Layout) -> MetaBuffer:
    """The buffer of ``src`` boxed into ``dst``, recording the plan's steps."""
    if src is dst:
        return buffer
    for step in boxing.plan(src, dst):
        if step.local:
            if not step.aliases:  # a partial pad writes a new array
                buffer = MetaBuffer(step.after.placement, rank_bytes(step.after), True)
            elif step.after.placement != buffer.placement:  # views on another placement
                buffer = MetaBuffer(step.after.placement, rank_bytes(step.after))
            continue
        with debug.boxing_step(step):
            debug.record(step, _fed(step))
        buffer = MetaBuffer(step.after.placement, rank_bytes(step.after), True)
    return buffer


def run(opdef, boxed, targets: tuple, out_layouts: tuple, attrs: dict, key) -> list:
    """The outputs of one op on shape-only inputs (what dispatch calls instead of the
    kernel loop): a view op's outputs share its input's buffer (a view costs no memory),
    every other output gets a new buffer of its layout. Reports the kernel's work to open
    traces."""
    if _trace.active:
        _trace.op(opdef, targets, out_layouts, attrs, key)
    if opdef.view:
        buffer = boxed[0]._shards
        return [Tensor(l, buffer if l.placement is buffer.placement else MetaBuffer.of(l))
                for l in out_layouts]
    return [Tensor(l, MetaBuffer.of(l)) for l in out_layouts]

