"""The signature choice: per mesh axis, the declared signature whose estimated time is least.

:func:`choose` prices each candidate signature of an op (:class:`ctensor.dispatch.Signature`)
with the cost model (:mod:`ctensor.cost`): boxing the inputs to it (each distinct input
once) and, for inputs that need a gradient, boxing that gradient back in the backward; the
composite's own reductions; the kernel's compute on the largest shard; the later reduction
of a new partial output; and boxing each output to where it is expected next (a gradient's
destination, or the layout of the inputs shaped like it). A parameter is pinned: moving it
costs :data:`_PINNED`. Pure: layouts in, layouts out; :mod:`ctensor.planner` caches the result
per :class:`~ctensor.planner.OpCall` (op, attributes, input layouts, destinations, grads,
pinned, same).
"""
from __future__ import annotations

import numpy as np

from . import boxing
from . import cost as cost_model
from .layout import Layout
from .sbp import Broadcast, Partial, Split, dual, format_sbp

__all__ = ["choose"]

B_ = Broadcast()
P_ = Partial()
_EPSILON = 1e-12  # seconds: what touching a layout costs at the least
#: an output left to be moved later may be moved once per consumer; moving it now once is
#: preferred when the two otherwise tie
_LATER = 1.01
#: seconds charged for moving a parameter (a leaf that requires grad) between ranks to run
#: an op: so much that a signature keeping every parameter in the layout the user gave it
#: always wins when one exists (local slices and pads do not count). Tensor parallelism is
#: a choice of parameter layouts; activations move.
_PINNED = 1e6



def _hints(layouts: tuple, out_meta, placement, dests) -> list:
    """Per output, where it is expected next: the SBP wanted per mesh axis (None: no
    preference), or None. A gradient's destination (``dests``, from the autograd engine)
    when exactly one has the output's shape; else the layout of the inputs shaped like the
    output, when those agree — or the non-partial ones do (the tensors it meets next are
    laid out alike)."""
    hints = []
    for shape, _ in out_meta:
        shape = tuple(shape)
        if dests:
            alike = {want for d_shape, d_placement, want in dests
                     if d_shape == shape and d_placement == placement}
            if len(alike) == 1:
                hints.append(alike.pop())
                continue
        # (a partial input is transient — it must be reduced somewhere — so where the
        # others agree, their layout is where the value lives)
        alike = {l.sbp for l in layouts if l.shape == shape}
        if len(alike) > 1:
            alike = {sbp for sbp in alike if not any(isinstance(e, Partial) for e in sbp)}
        hints.append(alike.pop() if len(alike) == 1 else None)
    return hints


def _gradient_layout(target: Layout, axis: int, replicated: bool) -> Layout:
    """The layout the gradient of an input boxed to ``target`` comes back in along ``axis``:
    a split input's gradient is split alike, a partial one's is replicated (dual), a
    replicated one's is partial where the signature computes with split or partial
    operands (each rank contributes its part) and replicated where every operand is."""
    entry = target.sbp[axis]
    if isinstance(entry, Partial):
        entry = B_
    elif isinstance(entry, Broadcast) and not replicated:
        entry = P_
    sbp = list(target.sbp)
    sbp[axis] = entry
    return target.with_sbp(sbp)


def _candidate_cost(opdef, cand, axis, layouts, attrs, out_meta, out_sbp, hints, device,
                    grads, pinned, same) -> float:
    """Estimated seconds of taking signature ``cand`` on mesh ``axis`` (see
    :mod:`ctensor.cost`): boxing the inputs (each distinct input once) and, for inputs that
    need a gradient, the boxing of that gradient back (the dual move) in the backward; the
    composite's own reductions; the kernel's compute on the largest shard; the later
    reduction of partial outputs; and boxing each output to where it is expected next."""
    placement = layouts[0].placement
    replicated = all(isinstance(e, Broadcast) for e in cand.inputs + cand.outputs)
    total, boxed, seen = 0.0, [], {}
    for i, l in enumerate(layouts):
        if l.sbp[axis] == cand.inputs[i]:
            boxed.append(l)
            continue
        sbp = list(l.sbp)
        sbp[axis] = cand.inputs[i]
        target = l.with_sbp(sbp)
        boxed.append(target)
        if seen.get(same[i]) is target:
            continue  # the same tensor boxed the same way: once
        seen[same[i]] = target
        # (a relabel on a size-1 axis is free: the epsilon keeps a layout that is already
        # right when everything else ties)
        total += boxing.cost(l, target) + _EPSILON
        if pinned >> i & 1 and boxing.communicates(l, target):
            total += _PINNED  # parameters stay where they were laid out
        if grads >> i & 1:
            back = _gradient_layout(target, axis, replicated)
            # a partial input's gradient is replicated on every other axis too (its dual):
            # charging an all-reduce there would price another axis's choice into this one
            back = back.with_sbp(tuple(B_ if b != axis and isinstance(l.sbp[b], Partial)
                                       else e for b, e in enumerate(back.sbp)))
            total += boxing.cost(back, l.with_sbp(dual(l.sbp)))
    if cand.composite and cand.comm is not None:
        total += cand.comm(layouts, axis, **attrs)
    first = placement.rank_list[0]  # holds the largest part under the uneven rule
    outs = []
    for j, (shape, dtype) in enumerate(out_meta):
        sbp = list(out_sbp[j])
        sbp[axis] = cand.outputs[j]
        outs.append(Layout(tuple(shape), np.dtype(dtype), placement,
                           tuple(B_ if s is None else s for s in sbp)))
    if not opdef.view:
        flops, nbytes = cost_model.kernel_work(opdef, boxed, outs, attrs)
        total += cost_model.compute(device, nbytes, flops)
    # an output is charged the move to where it is expected next (its hint); without one, a
    # layout this op creates is charged the move it will most likely need: a partial output
    # owes a reduction (none is charged when a partial input only passes through), and a
    # split made from unsplit inputs (to save compute) will likely be gathered again
    k = placement.shape[axis]
    kept = [l.sbp[axis] for l, c in zip(layouts, cand.inputs) if l.sbp[axis] == c]
    partial_in = any(isinstance(e, Partial) for e in kept)  # inherited, not boxed into
    split_in = any(isinstance(e, Split) for e in kept)
    for j, out in enumerate(outs):
        entry = cand.outputs[j]
        want = hints[j][axis] if hints[j] is not None else None
        if want is not None:
            if entry != want:  # the move along this axis alone
                sbp = [B_] * placement.ndim
                sbp[axis] = entry
                here = Layout(out.shape, out.dtype, placement, tuple(sbp))
                sbp[axis] = want
                total += _LATER * boxing.cost(here, here.with_sbp(sbp))
        elif isinstance(entry, Partial) and not partial_in:
            total += cost_model.collective("reduce_scatter", k, out.local_nbytes(first), device)
        elif isinstance(entry, Split) and not split_in:
            total += cost_model.collective("all_gather", k, out.local_nbytes(first) * k,
                                           device)
    return total


def choose(opdef, layouts: tuple, attrs: dict, out_meta, dests, grads: int,
           pinned: int, same: tuple, advise=None) -> tuple:
    """Per mesh axis, the declared signature whose estimated time is least (ties: the
    earlier declared). Returns ``(input layouts after boxing, output layouts, composite)``.
    ``grads`` has bit ``i`` set when input ``i`` needs a gradient, ``pinned`` when it is a
    parameter (a leaf that requires grad: kept where it is whenever a signature allows);
    ``same[i]`` is the index of the first input that is the same tensor as input ``i``.
    ``advise(axis, candidates, costs, picked)``, when given, may return another of the
    axis's candidates to take instead of ``picked`` (None keeps it): the planner's advisor
    seam (:func:`ctensor.planner.set_advisor`). Called once per
    :class:`~ctensor.planner.OpCall`: :func:`ctensor.planner.plan_for` caches it."""
    placement = layouts[0].placement
    if not opdef.per_axis:
        candidates = opdef.signatures(layouts, **attrs)
    in_sbp = [list(l.sbp) for l in layouts]
    out_sbp = [[None] * placement.ndim for _ in out_meta]
    # (a view's output follows its input: gradient destinations are for the ops that
    # compute; a reshaped intermediate may happen to have a gradient's shape)
    hints = _hints(layouts, out_meta, placement, None if opdef.view else dests)
    composite = False
    for axis in range(placement.ndim):
        if opdef.per_axis:
            candidates = opdef.signatures(layouts, mesh_axis=axis, **attrs)
        if not candidates:
            raise ValueError(f"{opdef.name}: no SBP signature for inputs "
                             f"{[format_sbp(l.sbp) for l in layouts]}")
        cands = candidates
        if placement.shape[axis] == 1:
            # an axis of one rank: every SBP there holds the whole data, so a composite
            # (written not to move it) only adds its own ops, and a relabel is free: never
            # the composite when the kernel is offered (a vocabulary-parallel head on a
            # tensor-parallel axis of one rank: one fused loss, not its ~20 ops)
            plain = [c for c in candidates if not c.composite]
            cands = plain or candidates
        best, best_cost, costs = None, None, []
        for cand in cands:
            total = _candidate_cost(opdef, cand, axis, layouts, attrs, out_meta, out_sbp,
                                    hints, placement.device, grads, pinned, same)
            costs.append(total)
            if best is None or total < best_cost:
                best, best_cost = cand, total
        if advise is not None:
            best = advise(axis, cands, costs, best) or best
        composite = composite or best.composite
        for i in range(len(layouts)):
            in_sbp[i][axis] = best.inputs[i]
        for j in range(len(out_meta)):
            out_sbp[j][axis] = best.outputs[j]
    if composite:  # the composite (ordinary ops) takes every input as it is
        return layouts, (), True
    targets = tuple(l.with_sbp(s) for l, s in zip(layouts, in_sbp))
    outs = tuple(Layout(tuple(shape), np.dtype(dtype), placement, tuple(s))
                 for (shape, dtype), s in zip(out_meta, out_sbp))
    return targets, outs, False
