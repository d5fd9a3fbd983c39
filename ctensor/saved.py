"""What the tape keeps of an op for its backward, and the boxed copies of its inputs.

:func:`ctensor.dispatch.apply` boxes each input an op needs in another layout once
(:func:`boxed`: the copy is cached on the tensor while it lives) and keeps for the
backward only what the op's ``saves`` names (:func:`recording`, worked out once per plan):
the other inputs as a :class:`LayoutOnly`, and, inside
:func:`ctensor.autograd.regather_saved`, a gathered input as a :class:`Regather` (its
source and target layout, boxed again when the backward runs). The backward receives a
:class:`BackwardContext`.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np

from . import autograd, boxing, shapeonly
from .comm import context
from .layout import Layout
from .meta import MetaBuffer, max_bytes, rank_bytes
from .tensor import Tensor

if TYPE_CHECKING:
    from .dispatch import OpDef
    from .planner import OpPlan as _Plan

__all__ = ["LayoutOnly", "Regather", "BackwardContext", "boxed", "recording", "regathered",
           "layout_only"]


class LayoutOnly:
    """What a backward context keeps of a tensor whose values its backward never reads
    (the op's ``saves`` leaves it out): the layout, so ``shape``, ``dtype``, ``sbp`` and
    ``placement`` still answer. Using it as an operand is an error of the op's
    declaration (its ``saves`` is wrong)."""

    __slots__ = ("_layout", "requires_grad")

    def __init__(self, t: Tensor):
        self._layout, self.requires_grad = t._layout, t.requires_grad

    shape = property(lambda self: self._layout.shape)
    dtype = property(lambda self: self._layout.dtype)
    sbp = property(lambda self: self._layout.sbp)
    placement = property(lambda self: self._layout.placement)
    ndim = property(lambda self: len(self._layout.shape))

    def __repr__(self) -> str:
        return f"LayoutOnly({self._layout!r})"


_layouts_only: dict = {}  # (layout, requires_grad) -> its LayoutOnly (they are immutable)


def layout_only(t: Tensor) -> LayoutOnly:
    """The (shared) :class:`LayoutOnly` of ``t``'s layout."""
    key = (t._layout, t.requires_grad)
    kept = _layouts_only.get(key)
    if kept is None:
        if len(_layouts_only) > 65536:
            _layouts_only.clear()
        kept = _layouts_only[key] = LayoutOnly(t)
    return kept


class Regather:
    """What a backward context keeps, inside :func:`ctensor.autograd.regather_saved`, of
    an input the op had to gather: the input as it came and the layout it was boxed to;
    the backward boxes it again (see :func:`regathered`)."""

    __slots__ = ("source", "target")

    def __init__(self, source: Tensor, target: Layout):
        self.source, self.target = source, target

    def boxed(self, opdef: OpDef, unpack: Optional[Callable] = None) -> Tensor:
        """The input again, boxed (its source first unpacked by ``saved_tensors_hooks``,
        which saw the source, not the copy)."""
        source = self.source if unpack is None else unpack(self.source)
        return boxed(opdef, source, self.target, False)

    def __repr__(self) -> str:
        return f"Regather({self.source._layout!r} -> {self.target!r})"


def _grows(source: Layout, target: Layout) -> bool:
    """Whether boxing ``source`` to ``target`` (one placement) holds more bytes on some
    rank than ``source`` does: a gather, whose copy a backward need not keep."""
    return source.placement == target.placement and \
        max_bytes(rank_bytes(target)) > max_bytes(rank_bytes(source))


def regathered(plan: _Plan, tensors: Sequence, kept_in: tuple) -> tuple:
    """``kept_in`` with each gathered input whose values the backward reads replaced by
    its :class:`Regather` (inside ``regather_saved``), and which inputs those are."""
    grows = plan.grows
    if grows is None:
        grows = plan.grows = tuple(i for i in plan.moved if not plan.aliases[i] and
                                   _grows(tensors[i]._layout, plan.targets[i]))
    hit = tuple(i for i in grows if type(kept_in[i]) is Tensor)
    if not hit:
        return kept_in, hit
    kept, made = list(kept_in), autograd._regather[-1]
    for i in hit:
        kept[i] = Regather(tensors[i], plan.targets[i])
        made.append((weakref.ref(tensors[i]), plan.targets[i]))
    return tuple(kept), hit


@dataclass(slots=True)
class BackwardContext:
    """Handed to an op's backward: the inputs as the kernel saw them (boxed), the
    (detached) outputs, the attributes, the OpDef (whose gradient kernels the backward may
    call) and the layouts the inputs had before boxing."""

    inputs: tuple
    outputs: tuple
    attrs: dict
    op: OpDef
    in_layouts: tuple
    #: per input, whether it needs a gradient (a backward may skip the others: return None)
    needs_input_grad: tuple = ()

    def needs_grad(self, i: int) -> bool:
        """Whether input ``i`` needs a gradient (True when unknown)."""
        return self.needs_input_grad[i] if i < len(self.needs_input_grad) else True


def boxed(opdef: OpDef, t: Tensor, target: Layout, aliases: bool) -> Tensor:
    """``t`` boxed to ``target``, once: the copy is kept on ``t`` while ``t`` lives and is
    not written in place, so later ops (q, k and v of one ``x``; the two matmuls of a
    gradient) reuse it. Not kept for parameters (leaves that require grad: they live all
    run long, and sharded ones must not keep a gathered copy), nor by ``to_global`` (an
    explicit redistribution gives a tensor of its own); kept copies are read-only, so an
    in-place write to a view of one copies it first."""
    cache = t._boxed
    if cache is not None:
        hit = cache.get(target)
        if hit is not None:
            version, layout, copy = hit
            if version == t._version.value and layout is t._layout:
                return copy
            del cache[target]
    context.op_stack.append(opdef.name)  # names the op in the communication log
    try:
        if type(t._shards) is MetaBuffer:  # shape-only: the steps are recorded, not run
            copy = Tensor(target, shapeonly.box(t._shards, t._layout, target))
        else:
            copy = Tensor(target, boxing.box(t._shards, t._layout, target))
    finally:
        context.op_stack.pop()
    if aliases:  # views of t: they share t's count of in-place writes
        copy._version = t._version
    elif opdef.fixed_layout is None and not (t.requires_grad and t._node is None):
        if type(copy._shards) is not MetaBuffer:
            for arr in copy._shards.values():
                if type(arr) is np.ndarray:
                    arr.flags.writeable = False
        if cache is None:
            cache = t._boxed = {}
        cache[target] = (t._version.value, t._layout, copy)
    return copy


def recording(plan: _Plan, opdef: OpDef, grads: int, layouts: tuple) -> tuple:
    """What the tape keeps for a plan's backward, worked out once per plan (the plan's key
    holds which inputs need a gradient): per input whether its values are kept (``None``:
    all are), whether the outputs are, ``needs_input_grad``, and the inputs whose in-place
    write counts are watched."""
    n = len(layouts)
    saves = opdef.saves
    if callable(saves):  # what is read depends on which inputs need a gradient
        saves = saves(grads, layouts)
    keep = None if saves is None else tuple(i in saves for i in range(n))
    keep_out = saves is None or "outputs" in saves
    needs = tuple(bool(grads >> i & 1) for i in range(n))
    watch = tuple(range(n)) if saves is None else \
        tuple(i for i in saves if type(i) is int and i < n)
    plan.record = (keep, keep_out, needs, watch)
    return plan.record
