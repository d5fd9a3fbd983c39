"""Started ops: the asynchronous side of dispatch.

``x.to_global(placement, sbp, async_op=True)`` boxes with the asynchronous executor
(:func:`ctensor.boxing.box_start`) instead of :func:`ctensor.boxing.box`: the move starts
now and its result, a tensor recorded for autograd like ``to_global``'s, is made when it is
waited for. Like :mod:`ctensor.dispatch`, this module calls boxing; ops call it.
"""
from __future__ import annotations

from typing import Callable, Optional

from . import autograd, boxing
from .comm import context
from .dispatch import BackwardContext, OpDef
from .layout import Layout
from .meta import MetaBuffer
from .tensor import Tensor

__all__ = ["PendingTensor", "start"]


class PendingTensor:
    """A tensor on its way to another layout: what ``x.to_global(placement, sbp,
    async_op=True)`` returns. The data started moving when it was made (a sender never
    waits for its receiver); :meth:`wait` gives the moved tensor, waiting only for what
    this process receives. Like every ctensor op, every rank makes it and waits for it at
    the same points of the program.

    >>> moving = h.to_global(stage2, sbp=ct.sbp.split(0), async_op=True)
    >>> ...                                    # other work while it moves
    >>> h2 = moving.wait()                     # differentiable, like to_global
    """

    __slots__ = ("_pending", "_finish", "_tensor")

    def __init__(self, pending, finish: Optional[Callable] = None, tensor=None):
        self._pending, self._finish, self._tensor = pending, finish, tensor

    def wait(self) -> Tensor:
        """The moved tensor (the same object on every call)."""
        if self._tensor is None:
            self._tensor = self._finish(self._pending.wait())
            self._pending = self._finish = None
        return self._tensor

    def test(self) -> bool:
        """Whether :meth:`wait` would return without waiting (it lets the transfer
        advance)."""
        return self._tensor is not None or self._pending.test()

    def __repr__(self) -> str:
        return f"PendingTensor({'done' if self._tensor is not None else 'moving'})"


def start(opdef: OpDef, x: Tensor, target: Layout) -> PendingTensor:
    """Start boxing ``x`` into ``target`` for ``opdef`` (``to_global``, whose kernel is the
    identity) with :func:`boxing.box_start`; the tensor made at ``wait()`` is recorded for
    autograd with ``opdef``'s backward (the reverse move) when ``x`` needs a gradient now."""
    if x._layout is target or x._layout == target:
        return PendingTensor(None, tensor=x)
    if type(x._shards) is MetaBuffer:  # shape-only: nothing moves, so nothing is pending
        return PendingTensor(None, tensor=opdef(x, placement=target.placement, sbp=target.sbp))
    context.op_stack.append(opdef.name)
    try:
        pending = boxing.box_start(x._shards, x._layout, target)
    finally:
        context.op_stack.pop()
    needs_grad = bool(opdef.backward is not None and autograd.is_grad_enabled()
                      and x.requires_grad)
    views = boxing.aliases(x._layout, target)

    def finish(shards: dict) -> Tensor:
        out = Tensor(target, shards)
        if views:  # slices of x's shards: they share its count of in-place writes
            out._version = x._version
        if needs_grad:
            ctx = BackwardContext((x,), (), {}, opdef, (x._layout,), (True,))
            with autograd.enable_grad():
                autograd.record(opdef.name, [x], [out],
                                lambda grads: opdef.backward(ctx, grads[0]))
        return out

    return PendingTensor(pending, finish)
