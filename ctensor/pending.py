"""Started ops: the asynchronous side of dispatch.

``x.to_global(placement, sbp, async_op=True)`` runs through :func:`ctensor.dispatch.apply`
with the started executor (:func:`ctensor.executor.start`): the move starts now and its
result, a tensor recorded for autograd like ``to_global``'s, is made when it is waited
for.
"""
from __future__ import annotations

from typing import Callable, Optional

from .dispatch import OpDef, apply
from .layout import Layout
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
    identity): :func:`ctensor.dispatch.apply` with the started executor
    (:func:`ctensor.executor.start`, :func:`boxing.box_start`); the tensor made at
    ``wait()`` is recorded on the tape like ``to_global``'s when ``x`` needs a gradient
    now."""
    if x._layout is target or x._layout == target:
        return PendingTensor(None, tensor=x)
    pending, finish = apply(opdef, (x,), {"placement": target.placement, "sbp": target.sbp},
                            started=True)
    if pending is None:  # nothing moves (a shape-only run): the tensor is made already
        return PendingTensor(None, tensor=finish)
    return PendingTensor(pending, finish)
