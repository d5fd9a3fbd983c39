"""The tape's record of one op: what its backward reads, and the backward itself.

:func:`record` is what :func:`ctensor.dispatch.apply` calls after an op ran with an input
that needs a gradient. It keeps only what the op's ``saves`` names (the other inputs as a
:class:`~ctensor.saved.LayoutOnly`, so an add keeps neither operand alive), the outputs
detached (or output -> node -> record -> output would be a cycle), the in-place write
counts of what it keeps, and the saved tensors the way the open
:func:`~ctensor.graph.saved_tensors_hooks` decide (``pack`` now, ``unpack`` when the
backward runs; inside :func:`~ctensor.graph.regather_saved` an input the op had to gather
is offered to that block's hooks, which keep its source instead). The record is a
:class:`Tape`, the node's backward function: calling it checks the write counts, unpacks
and runs the op's backward.
"""
from __future__ import annotations

import weakref
from typing import Sequence

from . import autograd, graph
from .meta import max_bytes, rank_bytes
from .saved import BackwardContext, LayoutOnly, Regather, layout_only

__all__ = ["Tape", "record", "what_to_keep"]


class Tape(BackwardContext):
    """One recorded op: its :class:`~ctensor.saved.BackwardContext` (the saved tensors
    packed by the hooks that were open, if any) together with the in-place write counts to
    check and the hooks' ``unpack`` — one object per op, the node's backward function:
    ``tape(grads)`` checks the counts, unpacks, and returns the op's backward of ``grads``
    (one gradient per input)."""

    __slots__ = ("watched", "unpack", "single")

    def __init__(self, inputs: tuple, outputs: tuple, attrs: dict, op, in_layouts: tuple,
                 needs: tuple, watched: list, unpack, single: bool):
        self.inputs, self.outputs, self.attrs, self.op = inputs, outputs, attrs, op
        self.in_layouts, self.needs_input_grad = in_layouts, needs
        self.watched, self.unpack, self.single = watched, unpack, single

    def __call__(self, grads: Sequence):
        for version, value in self.watched:
            if version.value != value:
                raise RuntimeError(f"backward: a tensor needed for the gradient of "
                                   f"{self.op.name} was modified by an in-place operation "
                                   f"after it was used; compute on a copy (x.clone()) or "
                                   f"do the in-place update after backward()")
        ctx, unpack = self, self.unpack
        if unpack is not None:
            ctx = BackwardContext(
                tuple([t if type(t) is LayoutOnly else unpack(t) for t in self.inputs]),
                tuple([t if type(t) is LayoutOnly else unpack(t) for t in self.outputs]),
                self.attrs, self.op, self.in_layouts, self.needs_input_grad)
        if self.single:
            return self.op.backward(ctx, grads[0])
        return self.op.backward(ctx, *grads)


def what_to_keep(plan, opdef, grads: int) -> tuple:
    """What the tape keeps for a plan's backward, worked out once per plan (the plan's call
    holds which inputs need a gradient): per input whether its values are kept (``None``:
    all are), whether the outputs are, ``needs_input_grad``, and the inputs whose in-place
    write counts are watched."""
    layouts = plan.call.layouts
    n = len(layouts)
    saves = opdef.saves
    if callable(saves):  # what is read depends on which inputs need a gradient
        saves = saves(grads, layouts)
    keep = None if saves is None else tuple(i in saves for i in range(n))
    keep_out = saves is None or "outputs" in saves
    needs = tuple(bool(grads >> i & 1) for i in range(n))
    watch = tuple(range(n)) if saves is None else \
        tuple(i for i in saves if type(i) is int and i < n)
    plan.keeps = (keep, keep_out, needs, watch)
    return plan.keeps


def record(opdef, plan, tensors: Sequence, boxed: Sequence, outputs: list, attrs: dict,
           grads: int) -> None:
    """Record ``opdef``'s run on the tape: a :class:`Tape` as the backward of ``outputs``'
    node (see the module docstring)."""
    keep, keep_out, needs, watch = plan.keeps or what_to_keep(plan, opdef, grads)
    saved_out = tuple([o.detach() for o in outputs]) if keep_out else ()
    if keep is None:
        kept_in = tuple(boxed)
    elif len(boxed) == 2:
        kept_in = (boxed[0] if keep[0] else layout_only(boxed[0]),
                   boxed[1] if keep[1] else layout_only(boxed[1]))
    else:
        kept_in = tuple([t if k else layout_only(t) for t, k in zip(boxed, keep)])
    # the in-place write counts of what the backward reads (boxed copies are private)
    watched = [(boxed[i]._version, boxed[i]._version.value) for i in watch] if watch else []
    if keep_out:
        watched += [(o._version, o._version.value) for o in saved_out]
    unpack = None
    hooks = graph.stack[-1] if graph.stack else None
    if hooks is not None:
        table = graph.regathering() if plan.moved else None
        if table is not None:  # inside regather_saved: offer it the gathered copies
            _offer_gathers(opdef, plan, tensors, kept_in, table)
        pack, unpack = hooks
        kept_in = tuple([t if type(t) is LayoutOnly else pack(t) for t in kept_in])
        saved_out = tuple([t if type(t) is LayoutOnly else pack(t) for t in saved_out])
    autograd.attach(opdef.name, tensors, outputs, Tape(kept_in, saved_out, attrs, opdef,
                                                       plan.call.layouts, needs, watched,
                                                       unpack, plan.single))


def _grows(source, target) -> bool:
    """Whether boxing ``source`` to ``target`` (one placement) holds more bytes on some
    rank than ``source`` does: a gather, whose copy a backward need not keep."""
    return source.placement == target.placement and \
        max_bytes(rank_bytes(target)) > max_bytes(rank_bytes(source))


def _offer_gathers(opdef, plan, tensors: Sequence, kept_in: tuple, table: dict) -> None:
    """Hand the innermost :func:`~ctensor.graph.regather_saved` block each gathered copy
    this op keeps (its pack then keeps the source instead)."""
    grows = plan.grows
    if grows is None:
        layouts = plan.call.layouts
        grows = plan.grows = tuple(i for i in plan.moved if not plan.aliases[i] and
                                   _grows(layouts[i], plan.targets[i]))
    for i in grows:
        copy = kept_in[i]
        if type(copy) is LayoutOnly:
            continue
        hit = table.get(id(copy))
        if hit is None or hit[0]() is not copy:
            table[id(copy)] = (weakref.ref(copy), Regather(opdef, tensors[i], plan.targets[i]))
