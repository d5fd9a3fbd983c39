"""What a backward context holds: the saved inputs and outputs of one op.

The tape (:func:`ctensor.tape.record`) keeps for an op's backward only what the op's
``saves`` names: the other inputs as a :class:`LayoutOnly`. Inside
:func:`ctensor.graph.regather_saved` a gathered input is packed as a :class:`Regather` (its
source and target layout, boxed again when the backward unpacks it). The backward receives
a :class:`BackwardContext`.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional

from . import executor
from .graph import SelfUnpacking
from .layout import Layout
from .tensor import Tensor

__all__ = ["LayoutOnly", "Regather", "BackwardContext", "layout_of"]


class LayoutOnly:
    """What a backward context keeps of a tensor whose values its backward never reads
    (the op's ``saves`` leaves it out): the layout, so ``shape``, ``dtype``, ``sbp`` and
    ``placement`` still answer. Using it as an operand is an error of the op's
    declaration (its ``saves`` is wrong)."""

    __slots__ = ("_layout", "requires_grad")

    def __init__(self, layout: Layout, requires_grad: bool):
        self._layout, self.requires_grad = layout, requires_grad

    shape = property(lambda self: self._layout.shape)
    dtype = property(lambda self: self._layout.dtype)
    sbp = property(lambda self: self._layout.sbp)
    placement = property(lambda self: self._layout.placement)
    ndim = property(lambda self: len(self._layout.shape))

    def __repr__(self) -> str:
        return f"LayoutOnly({self._layout!r})"


_layouts_only: dict = {}  # (layout, requires_grad) -> its LayoutOnly (they are immutable)


def layout_of(layout: Layout, requires_grad: bool) -> LayoutOnly:
    """The (shared) :class:`LayoutOnly` of a tensor of ``layout`` and ``requires_grad``."""
    key = (layout, requires_grad)
    kept = _layouts_only.get(key)
    if kept is None:
        if len(_layouts_only) > 65536:
            _layouts_only.clear()
        kept = _layouts_only[key] = LayoutOnly(layout, requires_grad)
    return kept


class Regather(SelfUnpacking):
    """What :func:`ctensor.graph.regather_saved` keeps of an input the op had to gather:
    the input as it came (``source``, itself packed by the innermost saved-tensor hooks), the
    layout it was boxed to, and the source's count of in-place writes then; unpacking boxes
    it again. The block holds one per gathered copy (with a weak reference to the source:
    calling it with the innermost ``(pack, unpack)`` gives the packed value; :meth:`release`
    drops the shared copy when the block ends)."""

    __slots__ = ("opdef", "source", "target", "version", "value", "unpack_source")

    def __init__(self, opdef: Any, source, target: Layout):
        self.opdef, self.target = opdef, target
        self.source = weakref.ref(source)  # (the block's prototype; packed ones hold it)
        self.version, self.value = source._version, source._version.value
        self.unpack_source = None

    def __call__(self, hooks: tuple) -> Optional["Regather"]:
        source = self.source()
        if source is None:  # (gone: the copy is kept as it is)
            return None
        packed = Regather.__new__(Regather)
        packed.opdef, packed.target = self.opdef, self.target
        packed.version, packed.value = self.version, self.value
        packed.source, packed.unpack_source = hooks[0](source), hooks[1]
        return packed

    def unpack(self, outer_unpack: Optional[Callable]) -> Tensor:
        """The input again, boxed (its source first unpacked by the hooks that packed it,
        which saw the source, not the copy)."""
        if self.version.value != self.value:
            raise RuntimeError(f"backward: a tensor needed for the gradient of "
                               f"{self.opdef.name} was modified by an in-place operation "
                               f"after it was used; compute on a copy (x.clone()) or do the "
                               f"in-place update after backward()")
        return executor.boxed(self.opdef, self.unpack_source(self.source), self.target, False)

    def release(self) -> None:
        """Drop the gathered copy the ops inside the block shared (kept on the source)."""
        source = self.source() if type(self.source) is weakref.ref else self.source
        if source is not None and source._boxed:
            source._boxed.pop(self.target, None)

    def __repr__(self) -> str:
        return f"Regather(-> {self.target!r})"


@dataclass(slots=True)
class BackwardContext:
    """Handed to an op's backward: the inputs as the kernel saw them (boxed), the
    (detached) outputs, the attributes, the OpDef (whose gradient kernels the backward may
    call) and the layouts the inputs had before boxing."""

    inputs: tuple
    outputs: tuple
    attrs: dict
    op: Any
    in_layouts: tuple
    #: per input, whether it needs a gradient (a backward may skip the others: return None)
    needs_input_grad: tuple = ()

    def needs_grad(self, i: int) -> bool:
        """Whether input ``i`` needs a gradient (True when unknown)."""
        return self.needs_input_grad[i] if i < len(self.needs_input_grad) else True
