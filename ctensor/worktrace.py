"""What a run computes and moves, summed per placement: the input of a plan (``ct.plan``).

While a :class:`Trace` is open (``with ct.plan.record() as trace:``), the shape-only
executor reports every op it runs (:func:`op` from ``shapeonly.run``: the op, its placement,
the FLOPs and bytes of its largest shard; views counted without work) and boxing every step
it takes (:func:`comm`, in every mode: the collective, the placement and mesh axes of its
groups, the bytes per rank). Identical events are counted, not stored one by one, so a
trace of thousands of ranks and layers stays small; nothing here loops over ranks. It
changes no choice dispatch makes; :mod:`ctensor.plan` prices it with :mod:`ctensor.cost`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from . import cost
from .layout import Layout
from .placement import Placement
from .sbp import Partial

__all__ = ["Trace", "OpWork", "CommWork", "op", "comm", "active"]

#: the traces open now (innermost last); dispatch and boxing test it before reporting
active: list = []


@dataclass
class OpWork:
    """Kernels of one op on one placement: how many ran, and the FLOPs and bytes (inputs
    read plus outputs written) of the largest shard, summed over those runs. A view op
    (``view``) runs no kernel: it is counted for its dispatch only (no FLOPs, no bytes)."""

    op: str
    placement: Placement
    dtype: np.dtype
    count: int = 0
    flops: float = 0.0
    nbytes: float = 0.0
    view: bool = False
    #: ``{(flops, bytes): runs}`` of one run each: a kernel's speed depends on its size
    #: (:func:`ctensor.cost.compute` prices each size on its own)
    sizes: dict = None


@dataclass
class CommWork:
    """Runs of one communication step: ``collective`` over the groups of ``placement``
    along ``axes`` (``send_recv``: from ``placement`` to ``target``), moving ``nbytes`` per
    rank each time (the largest rank's buffer: an all-gather's output, the input of the
    others; a transfer's busiest rank, sent plus received), ``total_bytes`` over all ranks
    and runs (what :func:`ct.debug.comm_log` counts)."""

    op: str
    collective: str
    placement: Placement
    axes: tuple
    nbytes: int
    dtype: str
    target: Optional[Placement] = None
    messages: tuple = ()  # send_recv: ((src, dst, nbytes), ...) between different ranks
    count: int = 0
    total_bytes: int = 0

    @property
    def group_size(self) -> int:
        """Ranks per group (a transfer: its two ends)."""
        if self.collective == "send_recv":
            return 2
        return int(np.prod([self.placement.shape[a] for a in self.axes], dtype=np.int64))

    def groups(self) -> np.ndarray:
        """The groups as rows of ranks (``groups x group_size``); a transfer: its
        ``(src, dst)`` pairs."""
        if self.collective == "send_recv":
            return np.array([(s, d) for s, d, _ in self.messages],
                            dtype=np.int64).reshape(-1, 2)
        ranks = self.placement.ranks
        rest = [a for a in range(ranks.ndim) if a not in self.axes]
        return np.transpose(ranks, rest + list(self.axes)).reshape(-1, self.group_size)


class Trace:
    """The work recorded while it is open: ``ops`` (:class:`OpWork`) and ``comms``
    (:class:`CommWork`), each keyed by what makes events identical.

    >>> with ct.plan.record() as trace:
    ...     y = x @ w
    >>> trace.total_flops(), len(trace.comms)
    """

    def __init__(self) -> None:
        self.ops: dict = {}
        self.comms: dict = {}

    def __enter__(self) -> "Trace":
        active.append(self)
        return self

    def __exit__(self, *exc) -> None:
        if self in active:
            active.remove(self)

    def total_flops(self) -> float:
        """FLOPs of the largest shards, summed over ops and placements."""
        return sum(w.flops for w in self.ops.values())

    def collectives(self) -> list:
        """``(op, collective, placement, axes, nbytes per rank, count)`` of every distinct
        communication step (a transfer names its target placement as its axes)."""
        return [(c.op, c.collective, c.placement, c.target if c.target is not None else c.axes,
                 c.nbytes, c.count) for c in self.comms.values()]


# ----------------------------------------------------------------------------- reporting
_work_cache: dict = {}


def _work(opdef, targets: tuple, outs: tuple, attrs: dict, key) -> tuple:
    """``(flops, bytes)`` of one kernel on the largest shard
    (:func:`ctensor.cost.kernel_work`), cached per ``key``; a view's: none."""
    hit = _work_cache.get(key)
    if hit is not None:
        return hit
    hit = (0.0, 0.0) if opdef.view else cost.kernel_work(opdef, targets, outs, attrs)
    if len(_work_cache) > 65536:
        _work_cache.clear()
    _work_cache[key] = hit
    return hit


def op(opdef, targets: tuple, outs: tuple, attrs: dict, key) -> None:
    """Called by dispatch for every op it runs while a trace is open (a view op, which only
    re-views its input, is counted without work: a plan charges its dispatch). ``key``
    identifies the (op, layouts, attributes) so the work is computed once."""
    if not outs:
        return
    flops, nbytes = _work(opdef, targets, outs, attrs, key)
    placement, dtype = outs[0].placement, outs[0].dtype
    for trace in active:
        k = (opdef.name, placement, dtype)
        w = trace.ops.get(k)
        if w is None:
            w = trace.ops[k] = OpWork(opdef.name, placement, dtype, view=bool(opdef.view))
        w.count += 1
        w.flops += flops
        w.nbytes += nbytes
        if w.sizes is None:
            w.sizes = {}
        w.sizes[(flops, nbytes)] = w.sizes.get((flops, nbytes), 0) + 1


def _axes(step) -> tuple:
    if step.mesh_axis is not None:
        return (step.mesh_axis,)
    # a flat-buffer reduction over several axes: the partial ones
    return tuple(a for a, e in enumerate(step.before.sbp) if isinstance(e, Partial))


def _buffer_bytes(step) -> int:
    """Bytes of the largest rank's buffer (cost-model convention)."""
    layout: Layout = step.after if step.collective == "all_gather" else step.before
    return layout.local_nbytes(layout.placement.rank_list[0])


def _messages(step) -> tuple:
    itemsize = step.before.dtype.itemsize
    cached = getattr(step, "_trace_messages", None)
    if cached is None:
        cached = tuple((m.src, m.dst, int(np.prod(m.shape, dtype=np.int64)) * itemsize)
                       for m, _ in step.messages if m.src != m.dst)
        step._trace_messages = cached
    return cached


def comm(step, op_name: str, total: int) -> None:
    """Called for every boxing step run while a trace is open (local steps move nothing
    and are not reported); ``total``: the bytes of all ranks' inputs."""
    if step.collective in ("slice", "pad_partial", "local", "relabel"):
        return
    if step.collective == "send_recv":
        messages = _messages(step)
        load: dict = {}
        for s, d, n in messages:
            load[s] = load.get(s, 0) + n
            load[d] = load.get(d, 0) + n
        key = ("send_recv", op_name, step.before, step.after)
        make = lambda: CommWork(op_name, "send_recv", step.before.placement, (),  # noqa: E731
                                max(load.values(), default=0), str(step.before.dtype),
                                step.after.placement, messages)
    else:
        axes = _axes(step)
        nbytes = _buffer_bytes(step)
        key = (step.collective, op_name, step.before.placement, axes, nbytes,
               str(step.before.dtype))
        make = lambda: CommWork(op_name, step.collective, step.before.placement,  # noqa: E731
                                axes, nbytes, str(step.before.dtype))
    for trace in active:
        c = trace.comms.get(key)
        if c is None:
            c = trace.comms[key] = make()
        c.count += 1
        c.total_bytes += int(total)
