"""Gradient hooks on tensors (PyTorch's ``Tensor.register_hook``).

A hook ``fn(grad)`` registered on a tensor runs once per backward pass, with the tensor's
whole gradient of that pass, before the gradient goes anywhere:

* on a non-leaf (the output of a recorded op) the hook lives on the op's autograd node,
  keyed by which output the tensor is, so it runs even when the tensor itself is gone by
  the time the backward reaches it; it runs when the node's output gradient is complete,
  before ``retain_grad`` stores it and before the node's backward reads it;
* on a leaf (a parameter) it runs when the leaf's gradient is final in that pass (every op
  that used the leaf has run its backward), before the gradient is reduced to the leaf's
  layout and added to ``.grad``; the gradient it sees is a global tensor in whatever
  layout the graph gave it (a data-parallel parameter's is still partial), whose logical
  value is the whole gradient: ops in the hook box it as any op does, so every hook, linear
  or not, sees and returns PyTorch's values (a hook is called on every rank, alike).

A hook returning ``None`` keeps the gradient; returning a tensor of the same shape replaces
it. Hooks run in the order they were registered; ``handle.remove()`` takes one off.

:mod:`ctensor.autograd` calls :func:`apply` at those two places; this module holds the rest
(it imports no other ctensor module).
"""
from __future__ import annotations

import itertools
from typing import Callable, Optional

__all__ = ["RemovableHandle", "register", "apply", "leaf_hooks"]

_ids = itertools.count()


class RemovableHandle:
    """What :meth:`Tensor.register_hook` (and ``nn.Module``'s hook registrations, as
    ``ct.autograd.RemovableHandle``) return: ``remove()`` takes the hook off (PyTorch's
    ``torch.utils.hooks.RemovableHandle``)."""

    __slots__ = ("_hooks", "_key")

    def __init__(self, hooks: dict, key: int):
        self._hooks, self._key = hooks, key

    @classmethod
    def add(cls, hooks: dict, hook: Callable) -> "RemovableHandle":
        """Put ``hook`` into ``hooks`` (``{key: fn}``, run in registration order) under a
        new key; the handle that takes it off again."""
        key = next(_ids)
        hooks[key] = hook
        return cls(hooks, key)

    def remove(self) -> None:
        self._hooks.pop(self._key, None)

    def __enter__(self) -> "RemovableHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def register(tensor, hook: Callable) -> RemovableHandle:
    """Register ``hook`` on ``tensor`` (see the module docstring)."""
    if not callable(hook):
        raise TypeError(f"register_hook: argument 'hook' must be callable (grad -> None or a "
                        f"tensor), got {type(hook).__name__}")
    if not tensor.requires_grad:
        raise ValueError("register_hook: cannot register a hook on a tensor that does not "
                         "require grad; create it with requires_grad=True (or call "
                         "requires_grad_()) first")
    node = tensor._node
    if node is None:
        hooks = getattr(tensor, "_hooks", None)
        if hooks is None:
            hooks = tensor._hooks = {}
    else:
        if node.hooks is None:
            node.hooks = {}
        hooks = node.hooks.setdefault(tensor._out_index, {})
    return RemovableHandle.add(hooks, hook)


def apply(hooks: Optional[dict], grad):
    """``grad`` passed through ``hooks`` (``{key: fn}`` in registration order)."""
    if not hooks:
        return grad
    for fn in list(hooks.values()):
        out = fn(grad)
        if out is None:
            continue
        if getattr(out, "_layout", None) is None:
            raise TypeError(f"register_hook: a hook must return None or a ct.Tensor, got "
                            f"{type(out).__name__} from {getattr(fn, '__name__', fn)!r}")
        if tuple(out.shape) != tuple(grad.shape):
            raise ValueError(f"register_hook: a hook returned a gradient of shape "
                             f"{tuple(out.shape)} for a gradient of shape "
                             f"{tuple(grad.shape)}; return one of the same shape (or None)")
        grad = out
    return grad


def leaf_hooks(tensor) -> Optional[dict]:
    """The hooks registered on the leaf ``tensor`` (None when there are none)."""
    return getattr(tensor, "_hooks", None)
