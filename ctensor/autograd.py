"""A tape-based reverse-mode autograd whose gradients are global tensors.

Each op's output records a :class:`Node` holding the op's backward, written in ctensor ops,
so gradients go through the same dispatch and boxing as the forward pass and get their
SBPs from the same signature table.

Grad-SBP rules: at the end of :func:`backward` each leaf's accumulated gradient is boxed
to the leaf's own placement and SBP, so a broadcast (data-parallel) parameter receives the
all-reduce with no user code. Inside :func:`no_sync` leaf gradients keep whatever SBP the
graph produced (typically partial) and accumulate without communication; the next
synchronised backward boxes the total once.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Optional, Sequence

from . import gradsync
from .registry import OPS
from .sbp import Broadcast, dual

__all__ = ["Node", "backward", "no_grad", "enable_grad", "is_grad_enabled", "no_sync",
           "grad_sync_enabled", "grad_layout", "bucket_size", "set_bucket_size"]

bucket_size, set_bucket_size = gradsync.bucket_size, gradsync.set_bucket_size

_grad_enabled = True
_sync_enabled = True
#: while a backward function runs: the layouts its gradients are headed for (the dual of
#: each input's layout), which dispatch weighs when it chooses the backward ops' signatures
destinations = None


class Node:
    """One recorded op: its inputs and how to map output grads to input grads.

    ``backward_fn(grads)`` receives one gradient per output (``None`` where an output got
    no gradient) and returns one per input (``None`` for inputs that need none).
    """

    __slots__ = ("name", "inputs", "backward_fn", "n_outputs", "__weakref__")

    def __init__(self, name: str, inputs: Sequence, backward_fn: Callable, n_outputs: int = 1):
        self.name = name
        self.inputs = tuple(inputs)
        self.backward_fn = backward_fn
        self.n_outputs = n_outputs

    def __repr__(self) -> str:
        return f"<{self.name}Backward>"


def is_grad_enabled() -> bool:
    return _grad_enabled


@contextlib.contextmanager
def _set_grad(enabled: bool) -> Iterator[None]:
    global _grad_enabled
    prev, _grad_enabled = _grad_enabled, enabled
    try:
        yield
    finally:
        _grad_enabled = prev


def no_grad():
    """Context manager: ops inside record nothing on the tape.

    >>> with ct.no_grad():
    ...     w2 = w * 2        # w2.requires_grad is False
    """
    return _set_grad(False)


def enable_grad():
    return _set_grad(True)


def grad_sync_enabled() -> bool:
    return _sync_enabled


@contextlib.contextmanager
def no_sync() -> Iterator[None]:
    """Context manager: backward passes inside leave leaf grads unsynchronised (partial),
    accumulating without communication; the next backward outside boxes the total once.

    >>> with ct.autograd.no_sync():
    ...     loss_a.backward()     # no all-reduce
    >>> loss_b.backward()         # one all-reduce of the accumulated grads
    """
    global _sync_enabled
    prev, _sync_enabled = _sync_enabled, False
    try:
        yield
    finally:
        _sync_enabled = prev


def record(name: str, inputs: Sequence, outputs: Sequence, backward_fn: Callable) -> None:
    """Attach a node to ``outputs`` if grad mode is on and some input requires grad."""
    if not _grad_enabled or not any(getattr(t, "requires_grad", False) for t in inputs):
        return
    node = Node(name, [t if getattr(t, "requires_grad", False) else None for t in inputs],
                backward_fn, len(outputs))
    for i, out in enumerate(outputs):
        if out is not None and out.dtype.kind in "fc":
            out.requires_grad = True
            out._node = node
            out._out_index = i


def _topological(root) -> list:
    """Nodes reachable from ``root``'s node, each after every node that consumes it."""
    order, seen = [], set()
    stack = [(root._node, False)]
    while stack:
        node, expanded = stack.pop()
        if node is None:
            continue
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for t in node.inputs:
            if t is not None and t._node is not None and id(t._node) not in seen:
                stack.append((t._node, False))
    return order[::-1]


def _toward(tensors) -> Optional[tuple]:
    """Where the gradients of ``tensors`` are headed: per tensor ``(shape, placement, sbp)``
    with, per mesh axis, the SBP its gradient is wanted in — a split tensor's gradient
    split alike, a partial one's replicated (dual) — or None (a replicated tensor's gradient
    may come out replicated or partial, whichever is free)."""
    out = []
    for t in tensors:
        if t is None:
            continue
        want = tuple(None if isinstance(s, Broadcast) else d
                     for s, d in zip(t._layout.sbp, dual(t._layout.sbp)))
        if any(w is not None for w in want):
            out.append((t._layout.shape, t._layout.placement, want))
    return tuple(out) or None


def _accumulate(store: dict, key, tensor, grad) -> None:
    global destinations
    if grad is None:
        return
    if key in store:
        previous, destinations = destinations, _toward([tensor])
        try:
            store[key] = (store[key][0], OPS.add(store[key][1], grad))
        finally:
            destinations = previous
    else:
        store[key] = (tensor, grad)


def backward(root, grad, retain_graph: bool = False) -> None:
    """Reverse-mode pass from ``root`` seeded with ``grad`` (both checked by
    :meth:`Tensor.backward`, the public entry point). Each leaf's gradient is handed to
    :mod:`ctensor.gradsync` as soon as it is final (every op that used the leaf has run its
    backward), which buckets the reductions and finishes them before returning."""
    global destinations
    sync = gradsync.Synchronizer(_sync_enabled)
    with no_grad():
        # grads keyed by (id(node), output index) for intermediates, id(tensor) for leaves
        pending: dict = {}
        leaf_grads: dict = {}
        order = _topological(root)
        uses: dict = {}  # id(leaf) -> nodes still to run that take it as an input
        for node in order:
            for t in node.inputs:
                if t is not None and t._node is None:
                    uses[id(t)] = uses.get(id(t), 0) + 1
        if root._node is None:
            _accumulate(leaf_grads, id(root), root, grad)
        else:
            pending[(id(root._node), root._out_index)] = (None, grad)
        for node in order:
            outs = [pending.pop((id(node), i), (None, None))[1] for i in range(node.n_outputs)]
            if any(g is not None for g in outs):
                if node.backward_fn is None:
                    raise RuntimeError("backward: trying to backward through the graph a "
                                       "second time; pass retain_graph=True to the first "
                                       "backward()")
                previous, destinations = destinations, _toward(node.inputs)
                try:
                    in_grads = node.backward_fn(outs)
                finally:
                    destinations = previous
                if not retain_graph:
                    node.backward_fn = None
                for t, g in zip(node.inputs, in_grads):
                    if t is None or g is None:
                        continue
                    if t._node is None:
                        _accumulate(leaf_grads, id(t), t, g)
                    else:
                        _accumulate(pending, (id(t._node), t._out_index), t, g)
            for t in node.inputs:  # leaves whose every use has run: their gradient is final
                if t is not None and t._node is None:
                    uses[id(t)] -= 1
                    if uses[id(t)] == 0 and id(t) in leaf_grads:
                        sync.deposit(*leaf_grads.pop(id(t)))
            sync.progress()
        for leaf, g in leaf_grads.values():  # the root itself, when it is a leaf
            sync.deposit(leaf, g)
        sync.finish()


def grad_layout(tensor, placement=None, sbp=None) -> None:
    """Make ``backward()`` leave the gradient of the leaf ``tensor`` in ``placement`` and
    ``sbp`` instead of the leaf's own layout (``sbp=None``: back to the leaf's layout).
    Sharded optimizer states use it: with ``shard_states_along`` a broadcast parameter's
    gradient is reduce-scattered straight into the states' split (ZeRO-2) instead of being
    all-reduced and sliced.

    >>> ct.autograd.grad_layout(w, sbp=ct.sbp.split(0))    # w.grad comes back S(0)
    """
    from .layout import Layout  # pure module
    from .sbp import normalize_sbp
    if not getattr(tensor, "is_leaf", False):
        raise ValueError("grad_layout: argument 'tensor' must be a leaf ct.Tensor (a "
                         "parameter), got a non-leaf or another type")
    if sbp is None:
        tensor._grad_layout = None
        return
    placement = placement or tensor.placement
    sbp = normalize_sbp(sbp, placement.ndim, tensor.ndim, "grad_layout")
    tensor._grad_layout = Layout(tensor.shape, tensor.dtype, placement, sbp)
