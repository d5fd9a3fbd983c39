"""The tape's record of one op: what its backward reads, and the backward itself.

:func:`record` is what :func:`ctensor.dispatch.apply` calls after an op ran with an input
that needs a gradient. It keeps only what the op's ``saves`` names (the other inputs as a
:class:`~ctensor.saved.LayoutOnly`, so an add keeps neither operand alive), the outputs
detached (or output -> node -> record -> output would be a cycle), the in-place write
counts of what it keeps, and the saved tensors the way the open
:func:`~ctensor.graph.saved_tensors_hooks` decide (``pack`` now, ``unpack`` when the
backward runs; inside :func:`~ctensor.graph.regather_saved` an input the op had to gather
is offered to that block's hooks, which keep its source instead). The record is an
:class:`~ctensor.autograd.Node` (made here and linked to the floating outputs) whose
backward function is a :class:`Tape`: calling it checks the write counts, unpacks and runs
the op's backward.
"""
from __future__ import annotations

import weakref
from typing import Sequence

from . import graph
from .autograd import Edge, Node
from .meta import max_bytes, rank_bytes
from .saved import BackwardContext, LayoutOnly, Regather, layout_of

__all__ = ["Tape", "record", "what_to_keep"]


class Tape(BackwardContext):
    """One recorded op: its :class:`~ctensor.saved.BackwardContext` (the saved tensors
    packed by the hooks that were open, if any) together with the in-place write counts to
    check and the hooks' ``unpack`` — one object per op, the node's backward function:
    ``tape(grads)`` checks the counts, unpacks, and returns the op's backward of ``grads``
    (one gradient per input)."""

    __slots__ = ("watched", "unpack")

    def __init__(self, inputs: tuple, outputs: tuple, attrs: dict, op, in_layouts: tuple,
                 needs: tuple, watched, unpack):
        self.inputs, self.outputs, self.attrs, self.op = inputs, outputs, attrs, op
        self.in_layouts, self.needs_input_grad = in_layouts, needs
        self.watched, self.unpack = watched, unpack

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
        return self.op.backward(ctx, *grads)  # (one gradient per output)


def what_to_keep(plan, opdef, grads: int) -> tuple:
    """What the tape keeps for a plan's backward (the plan's call holds which inputs need a
    gradient): per input whether its values are kept (``None``: all are), whether the
    outputs are, ``needs_input_grad``, and the inputs whose in-place write counts are
    watched."""
    kept, _, keep_out, needs, watch, _ = plan.keeps or _keeps(plan, opdef, grads)
    return (None if kept is None else tuple(k is None for k in kept)), keep_out, needs, watch


def _keeps(plan, opdef, grads: int) -> tuple:
    """:func:`what_to_keep` in the form :func:`record` reads, worked out once per plan
    (``plan.keeps``): ``(kept, mixed, keep_out, needs, watch, linked)``.
    ``kept``: None when every input's values are kept, else per input None (its values are
    kept) or the :class:`~ctensor.saved.LayoutOnly` that stands for it (the layout of the
    input as boxed: a moved input's copy requires no gradient, an unmoved one as the call
    says); ``mixed``: some values are kept and some not; ``keep_out``: the outputs' values
    are kept; ``needs``: ``needs_input_grad``; ``watch``: the inputs whose in-place write
    counts are checked; ``linked``: the outputs the node produces (the floating ones)."""
    layouts = plan.call.layouts
    n = len(layouts)
    saves = opdef.saves
    if callable(saves):  # what is read depends on which inputs need a gradient
        saves = saves(grads, layouts)
    needs = tuple(bool(grads >> i & 1) for i in range(n))
    kept = None if saves is None else tuple(
        None if i in saves else
        layout_of(plan.targets[i], needs[i] and i not in plan.moved) for i in range(n))
    if kept is not None and all(k is None for k in kept):
        kept = None
    mixed = kept is not None and any(k is None for k in kept)
    keep_out = saves is None or "outputs" in saves
    watch = tuple(range(n)) if saves is None else \
        tuple(i for i in saves if type(i) is int and i < n)
    linked = tuple(i for i, l in enumerate(plan.out_layouts) if l.dtype.kind in "fc")
    if linked == _FIRST:
        linked = _FIRST
    plan.keeps = (kept, mixed, keep_out, needs, watch, linked)
    return plan.keeps


_FIRST = (0,)


def record(opdef, plan, tensors: Sequence, boxed: Sequence, outputs: list, attrs: dict,
           grads: int) -> None:
    """Record ``opdef``'s run on the tape: a :class:`Tape` as the backward of ``outputs``'
    node (see the module docstring). (Every recorded op's hot path: what depends only on
    the plan is worked out once, by :func:`_keeps`.)"""
    kept_in, mixed, keep_out, needs, watch, linked = \
        plan.keeps or _keeps(plan, opdef, grads)
    if kept_in is None:
        kept_in = tuple(boxed)
    elif mixed:
        kept_in = tuple([t if k is None else k for t, k in zip(boxed, kept_in)])
    # the in-place write counts of what the backward reads (boxed copies are private)
    if not watch:
        watched = ()
    elif len(watch) == 1:
        version = boxed[watch[0]]._version
        watched = ((version, version.value),)
    elif len(watch) == 2:
        version, other = boxed[watch[0]]._version, boxed[watch[1]]._version
        watched = ((version, version.value), (other, other.value))
    else:
        watched = tuple([(boxed[i]._version, boxed[i]._version.value) for i in watch])
    if keep_out and len(outputs) == 1:
        o = outputs[0].detach()
        saved_out, watched = (o,), (*watched, (o._version, o._version.value))
    elif keep_out:
        saved_out = tuple([o.detach() for o in outputs])
        watched = (*watched, *[(o._version, o._version.value) for o in saved_out])
    else:
        saved_out = ()
    unpack = None
    if graph.stack:
        table = graph.regathering() if plan.moved else None
        if table is not None:  # inside regather_saved: offer it the gathered copies
            _offer_gathers(opdef, plan, tensors, kept_in, table)
        pack, unpack = graph.stack[-1]
        kept_in = tuple([t if type(t) is LayoutOnly else pack(t) for t in kept_in])
        saved_out = tuple([t if type(t) is LayoutOnly else pack(t) for t in saved_out])
    # the node: a leaf input as it is, a non-leaf one as its Edge (autograd.Edge)
    n = len(tensors)
    if n == 1:
        t = tensors[0]
        edges = (t if t._node is None else Edge(t),)  # (it needs a gradient: grads == 1)
    elif n == 2:
        t, u = tensors
        edges = (None if not grads & 1 else t if t._node is None else Edge(t),
                 None if not grads & 2 else u if u._node is None else Edge(u))
    else:
        edges = tuple([None if not grads >> i & 1 else t if t._node is None else Edge(t)
                       for i, t in enumerate(tensors)])
    node = Node(opdef.name, edges, Tape(kept_in, saved_out, attrs, opdef, plan.call.layouts,
                                        needs, watched, unpack), len(outputs))
    if linked is _FIRST:
        o = outputs[0]
        o.requires_grad, o._node = True, node  # (o._out_index is 0)
    else:
        for i in linked:
            o = outputs[i]
            o.requires_grad, o._node, o._out_index = True, node, i


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
