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
import weakref
from typing import Callable, Iterator, Optional, Sequence

from . import grad_hooks, gradsync
from . import graph  # ct.autograd.graph (PyTorch's torch.autograd.graph): saved-tensor hooks
from .graph import regather_saved, saved_hooks, saved_tensors_hooks
from . import timing as _profile
from .grad_hooks import RemovableHandle
from .registry import OPS
from .sbp import Broadcast, dual

__all__ = ["Node", "backward", "grad", "raw_grad", "forward_context", "Function",
           "FunctionContext", "RemovableHandle", "graph", "saved_tensors_hooks", "saved_hooks",
           "regather_saved",
           "graph_handle", "graph_leaves", "no_grad",
           "enable_grad", "is_grad_enabled", "no_sync", "grad_sync_enabled", "grad_layout",
           "bucket_size", "set_bucket_size", "bucket_overlap", "set_bucket_overlap",
           "GradMode", "grad_mode"]

bucket_size, set_bucket_size = gradsync.bucket_size, gradsync.set_bucket_size
bucket_overlap, set_bucket_overlap = gradsync.bucket_overlap, gradsync.set_bucket_overlap

_sync_enabled = True


class GradMode:
    """The autograd state an op's plan depends on, read by dispatch and handed to the
    planner inside each :class:`~ctensor.planner.OpCall` (one object, so dispatch reads
    attributes, never this module's globals): ``enabled`` (grad mode: ``no_grad`` turns it
    off) and ``destinations`` (while a backward function runs, where the gradients of its
    inputs are headed: per tensor ``(shape, placement, wanted SBP)``, which the choice of
    the backward ops' signatures weighs; None otherwise)."""

    __slots__ = ("enabled", "destinations")

    def __init__(self) -> None:
        self.enabled, self.destinations = True, None


#: the one autograd state of this process (see :class:`GradMode`)
grad_mode = GradMode()


class Node:
    """One recorded op: its inputs and how to map output grads to input grads.

    ``backward_fn(grads)`` receives one gradient per output (``None`` where an output got
    no gradient) and returns one per input (``None`` for inputs that need none).
    """

    __slots__ = ("name", "inputs", "backward_fn", "n_outputs", "hooks", "__weakref__")

    def __init__(self, name: str, inputs: Sequence, backward_fn: Callable, n_outputs: int = 1):
        self.name = name
        self.inputs = tuple(inputs)
        self.backward_fn = backward_fn
        self.n_outputs = n_outputs
        self.hooks = None  # {output index: {key: fn}} of Tensor.register_hook (grad_hooks)

    def __repr__(self) -> str:
        return f"<{self.name}Backward>"


class Edge:
    """What a node keeps of a non-leaf input: the node that made it and which of its
    outputs it is, its layout (where its gradient is headed) and a weak reference to the
    tensor itself (for ``retain_grad`` and ``autograd.grad(inputs=...)``, which hold it).
    The graph thus never keeps an activation's shards alive: only what the backward
    contexts save does (a leaf — a parameter — is kept as it is)."""

    __slots__ = ("_node", "_out_index", "_layout", "_ref", "requires_grad")

    def __init__(self, t) -> None:
        self._node, self._out_index, self._layout = t._node, t._out_index, t._layout
        self._ref = weakref.ref(t)
        self.requires_grad = True

    @property
    def grad_fn(self):
        return self._node

    @property
    def tensor(self):
        """The tensor, while it lives (else None)."""
        return self._ref()


def _edge(t):
    """A node's record of input ``t``: a leaf as it is, a non-leaf as its :class:`Edge`."""
    if t is None or not getattr(t, "requires_grad", False):
        return None
    return t if t._node is None else Edge(t)


def _tensor(t):
    """The tensor behind a node input (an :class:`Edge`'s, if it still lives)."""
    return t._ref() if type(t) is Edge else t


def is_grad_enabled() -> bool:
    return grad_mode.enabled


@contextlib.contextmanager
def _set_grad(enabled: bool) -> Iterator[None]:
    prev, grad_mode.enabled = grad_mode.enabled, enabled
    try:
        yield
    finally:
        grad_mode.enabled = prev


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
    if not grad_mode.enabled or not any(getattr(t, "requires_grad", False) for t in inputs):
        return
    _link(Node(name, [_edge(t) for t in inputs], backward_fn, len(outputs)), outputs)


def _link(node: Node, outputs: Sequence) -> None:
    """Make ``node`` the producer of each floating output (None: an output not made)."""
    for i, out in enumerate(outputs):
        if out is not None and out._layout.dtype.kind in "fc":
            out.requires_grad = True
            out._node = node
            out._out_index = i


def graph_handle(t):
    """A stand-in for ``t`` as the root of a later ``backward(grad)``: ``t``'s layout and
    its place in the graph, none of its values, so ``t``'s shards are freed as soon as
    nothing else holds them. What a pipeline keeps of a stage's output once it has been
    sent on (Megatron-LM's ``deallocate_output_tensor``); pass the gradient explicitly.

    >>> out = stage(x); y = out.detach().to_global(next_placement, sbp)
    >>> root = ct.autograd.graph_handle(out); del out     # keeps no activation
    >>> root.backward(grad)
    """
    if t._node is None:
        raise ValueError("graph_handle: the tensor is not the output of a recorded op (a "
                         "leaf, or made under no_grad); keep the tensor itself")
    handle = type(t)(t._layout, {}, requires_grad=True)
    handle._node, handle._out_index = t._node, t._out_index
    return handle


def graph_leaves(outputs) -> list:
    """The leaves that require grad behind ``outputs`` (what their backward would give a
    gradient to: parameters, inputs), each once, in the order the backward reaches them.

    >>> ct.autograd.graph_leaves([loss]) == list(model.parameters())   # (in some order)
    """
    found: dict = {}
    for node in _topological(list(outputs)):
        for t in node.inputs:
            if t is not None and t._node is None:
                found.setdefault(id(t), t)
    return list(found.values())


def _topological(roots) -> list:
    """Nodes reachable from the ``roots``' nodes, each after every node that consumes it."""
    order, seen = [], set()
    stack = [(r._node, False) for r in reversed(roots)]
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


def casts_leaf(node) -> bool:
    """Whether ``node`` is a dtype cast of a leaf (mixed precision's half copy of a float32
    master parameter). Such a copy counts as its parameter: dispatch pins it where the
    parameter was laid out, and its gradient is headed where the parameter's is."""
    if node.name != "to" or not node.inputs:  # (no inputs: a node that has run its backward)
        return False
    src = node.inputs[0]
    return src is not None and src._node is None


def _toward(tensors) -> Optional[tuple]:
    """Where the gradients of ``tensors`` are headed: per tensor ``(shape, placement, sbp)``
    with, per mesh axis, the SBP its gradient is wanted in — a split tensor's gradient
    split alike, a partial one's replicated, a replicated leaf's partial (the dual: the
    gradient buckets reduce it) — or None (a replicated intermediate's gradient may come
    out replicated or partial, whichever is free)."""
    out = []
    for t in tensors:
        if t is None:
            continue
        # a leaf's gradient goes to a bucket, which reduces partial sums best: partial it is
        # (so does a parameter's dtype cast's: its backward, a cast, takes a partial
        # gradient to the parameter as it is)
        node = t._node
        leaf = node is None or casts_leaf(node)
        want = tuple(None if isinstance(s, Broadcast) and not leaf else d
                     for s, d in zip(t._layout.sbp, dual(t._layout.sbp)))
        if any(w is not None for w in want):
            out.append((t._layout.shape, t._layout.placement, want))
    return tuple(out) or None


def _accumulate(store: dict, key, tensor, grad) -> None:
    if grad is None:
        return
    if key in store:
        previous, grad_mode.destinations = grad_mode.destinations, _toward([tensor])
        try:
            store[key] = (store[key][0], OPS.add(store[key][1], grad))
        finally:
            grad_mode.destinations = previous
    else:
        store[key] = (tensor, grad)


#: the leaf gradients of the backward pass that is running (a backward started from inside
#: a backward function, as activation recompute does, adds its leaf gradients here)
_outer_leaves: Optional[dict] = None


def _run(roots: Sequence, grads: Sequence, retain_graph: bool, capture=None) -> dict:
    """The reverse pass from ``roots`` seeded with ``grads``. Without ``capture`` each leaf's
    final gradient goes to ``.grad`` through a :class:`gradsync.Synchronizer`; with
    ``capture`` (ids of tensors) nothing is deposited and ``{id: gradient}`` of those
    tensors is returned instead."""
    global _outer_leaves
    nested = _outer_leaves is not None and capture is None
    sync = None if capture is not None or nested else gradsync.Synchronizer(_sync_enabled)
    captured: dict = {}
    pending: dict = {}  # (id(node), output index) -> (tensor, gradient)
    leaf_grads: dict = {}  # id(leaf) -> (leaf, gradient)
    order = _topological(roots)
    uses: dict = {}  # id(leaf) -> nodes still to run that take it as an input
    for node in order:
        for t in node.inputs:
            if t is not None and t._node is None:
                uses[id(t)] = uses.get(id(t), 0) + 1
    for root, grad in zip(roots, grads):
        if root._node is None:
            _accumulate(leaf_grads, id(root), root, grad)
        else:
            _accumulate(pending, (id(root._node), root._out_index), root, grad)
    outer = _outer_leaves
    if capture is None and not nested:
        _outer_leaves = leaf_grads
    try:
        with no_grad():
            for node in order:
                _run_node(node, pending, leaf_grads, uses, sync, capture, captured,
                          retain_graph)
                if sync is not None:
                    sync.progress()
            if capture is not None:
                for key, (_, g) in leaf_grads.items():
                    if key in capture:
                        captured[key] = g
                return captured
            if nested:  # hand the leaf gradients to the backward pass that runs this one
                for key, (leaf, g) in leaf_grads.items():
                    _accumulate(outer, key, leaf, g)
                return captured
            for leaf, g in list(leaf_grads.values()):  # leaves used only by nested passes
                _deposit(sync, leaf, g)
            leaf_grads.clear()
            sync.finish()
    finally:
        if capture is None and not nested:
            _outer_leaves = outer
    return captured


def _run_node(node: Node, pending: dict, leaf_grads: dict, uses: dict, sync, capture,
              captured: dict, retain_graph: bool) -> None:
    """One node of :func:`_run`: its output gradients through their hooks, its backward,
    the input gradients accumulated (a leaf's handed to ``sync`` once final)."""
    entries = [pending.pop((id(node), i), (None, None)) for i in range(node.n_outputs)]
    if node.hooks:  # Tensor.register_hook on this node's outputs
        entries = [(t, g if g is None else grad_hooks.apply(node.hooks.get(i), g))
                   for i, (t, g) in enumerate(entries)]
    for t, g in entries:  # a non-leaf's gradient is complete when its node runs
        t = _tensor(t)
        if t is not None and g is not None:
            if capture is not None and id(t) in capture:
                captured[id(t)] = g
            elif t._retains_grad and capture is None:
                t.grad = g.detach() if t.grad is None else OPS.add(t.grad, g)
    outs = [g for _, g in entries]
    if any(g is not None for g in outs):
        if node.backward_fn is None:
            raise RuntimeError("backward: trying to backward through the graph "
                               "a second time; pass retain_graph=True to the "
                               "first backward()")
        previous = grad_mode.destinations
        grad_mode.destinations = _toward(node.inputs)
        try:
            in_grads = node.backward_fn(outs)
        finally:
            grad_mode.destinations = previous
        if not retain_graph:
            node.backward_fn = None
        for t, g in zip(node.inputs, in_grads):
            if t is None or g is None:
                continue
            if t._node is None:
                _accumulate(leaf_grads, id(t), t, g)
            else:
                _accumulate(pending, (id(t._node), t._out_index), t, g)
    for t in node.inputs:  # leaves whose every use has run: gradient final
        if t is not None and t._node is None:
            uses[id(t)] -= 1
            if uses[id(t)] == 0 and id(t) in leaf_grads and sync is not None:
                _deposit(sync, *leaf_grads.pop(id(t)))
    if not retain_graph and node.backward_fn is None:
        # the node has run for good: let go of its inputs, so activations are
        # freed as the backward goes (not only when the graph's last tensor
        # goes); a second backward through it still raises, via backward_fn
        node.inputs = ()


def _deposit(sync, leaf, g) -> None:
    """Hand a leaf's final gradient of this pass, through its hooks, to the synchronizer."""
    sync.deposit(leaf, grad_hooks.apply(grad_hooks.leaf_hooks(leaf), g))


def backward(root, grad, retain_graph: bool = False) -> None:
    """Reverse-mode pass from ``root`` seeded with ``grad`` (both checked by
    :meth:`Tensor.backward`, the public entry point). Each leaf's gradient is handed to
    :mod:`ctensor.gradsync` as soon as it is final (every op that used the leaf has run its
    backward), which buckets the reductions and finishes them before returning."""
    with _profile.phase("backward"):  # (ct.debug.profile(); a no-op when none is open)
        _run([root], [grad], retain_graph)


def grad(outputs, inputs, grad_outputs=None, retain_graph: Optional[bool] = None,
         create_graph: bool = False, allow_unused: bool = False) -> tuple:
    """The gradients of ``outputs`` with respect to ``inputs`` (tensors or a sequence),
    returned as a tuple in each input's own layout, without touching any ``.grad``
    (PyTorch's ``torch.autograd.grad``). ``grad_outputs`` are required for outputs with
    more than one element. Collective.

    >>> (gw,) = ct.autograd.grad(loss, [w])
    """
    single_out = not isinstance(outputs, (list, tuple))
    outputs = [outputs] if single_out else list(outputs)
    inputs = [inputs] if not isinstance(inputs, (list, tuple)) else list(inputs)
    if create_graph:
        raise ValueError("grad: create_graph=True (gradients of gradients) is not supported; "
                         "compute first-order gradients only")
    if grad_outputs is None:
        grad_outputs = [None] * len(outputs)
    elif not isinstance(grad_outputs, (list, tuple)):
        grad_outputs = [grad_outputs]
    if len(grad_outputs) != len(outputs):
        raise ValueError(f"grad: got {len(outputs)} outputs and {len(grad_outputs)} "
                         f"grad_outputs; give one per output (None for scalars)")
    seeds = []
    for i, (out, g) in enumerate(zip(outputs, grad_outputs)):
        if not getattr(out, "requires_grad", False):
            raise ValueError(f"grad: output {i} does not require grad (no input of its "
                             f"computation had requires_grad=True, or it ran under no_grad)")
        if g is None:
            if out.numel() != 1:
                raise ValueError(f"grad: output {i} has shape {tuple(out.shape)}; pass "
                                 f"grad_outputs for outputs with more than one element")
            g = OPS.ones_like(out)
        seeds.append(g)
    for i, t in enumerate(inputs):
        if not getattr(t, "requires_grad", False):
            raise ValueError(f"grad: input {i} does not require grad")
    keep = bool(retain_graph) if retain_graph is not None else False
    captured = _run(outputs, seeds, keep, capture={id(t) for t in inputs})
    result = []
    with no_grad():
        for i, t in enumerate(inputs):
            g = captured.get(id(t))
            if g is not None and t._node is None:  # a leaf's hooks, as in PyTorch
                g = grad_hooks.apply(grad_hooks.leaf_hooks(t), g)
            if g is None:
                if not allow_unused:
                    raise ValueError(f"grad: input {i} was not used to compute the outputs; "
                                     f"pass allow_unused=True to get None for it")
                result.append(None)
                continue
            g = g.to_global(t.placement, t.sbp)
            result.append((g.to(t.dtype) if g.dtype != t.dtype else g).detach())
    return tuple(result)


def raw_grad(outputs: Sequence, inputs: Sequence, grad_outputs: Sequence) -> tuple:
    """The gradients of ``outputs`` (seeded with ``grad_outputs``, ``None`` for none) with
    respect to ``inputs``, each as the graph produced it: in the layout and dtype of its
    last op (partial where a sum over ranks is still owed), ``None`` where an input was not
    reached; no ``.grad`` is touched and nothing is reduced.

    This is what a :class:`Function`'s ``backward`` returns for its inputs when it runs a
    graph of its own (activation recompute, :func:`ctensor.nn.utils.checkpoint`): the
    backward pass that called it then accumulates, buckets and reduces those gradients
    exactly as if the inner graph had been part of it. Unlike :func:`grad` it neither boxes
    the gradients to the inputs' layouts (which would all-reduce every parameter's gradient
    on its own, and also inside ``no_sync``) nor checks that every input was used.

    >>> gx, gw = ct.autograd.raw_grad([y], [x, w], [g])
    """
    pairs = [(o, g) for o, g in zip(outputs, grad_outputs)
             if g is not None and getattr(o, "requires_grad", False)]
    if not pairs:
        return tuple(None for _ in inputs)
    captured = _run([o for o, _ in pairs], [g for _, g in pairs], False,
                    capture={id(t) for t in inputs})
    return tuple(captured.get(id(t)) for t in inputs)


@contextlib.contextmanager
def forward_context() -> Iterator[None]:
    """Run a forward pass from inside a backward function (activation recompute) as if it
    ran outside any backward: grad mode on and no gradient destinations for dispatch to
    weigh, so every op picks the very signatures (and so computes the very bits) that it
    picked in the original forward.

    >>> with ct.autograd.forward_context():
    ...     y = block(x)            # recomputed, recorded on a fresh graph
    """
    previous, grad_mode.destinations = grad_mode.destinations, None
    try:
        with enable_grad():
            yield
    finally:
        grad_mode.destinations = previous


class FunctionContext:
    """What a :class:`Function`'s ``forward`` hands its ``backward``: saved tensors and any
    attributes set on it (PyTorch's ``ctx``)."""

    def __init__(self, needs_input_grad: tuple):
        self.needs_input_grad = needs_input_grad
        self.saved_tensors: tuple = ()

    def save_for_backward(self, *tensors) -> None:
        self.saved_tensors = tuple(tensors)


class Function:
    """A differentiable operation with a hand-written backward (PyTorch's API): subclass it
    with static ``forward(ctx, *args)`` (runs without recording; returns a tensor or a tuple
    of tensors) and ``backward(ctx, *grads)`` (one gradient per forward argument, ``None``
    where there is none; it runs under no_grad and may call :func:`backward` or ops), then
    call ``MyFunction.apply(*args)``.

    >>> class Square(ct.autograd.Function):
    ...     @staticmethod
    ...     def forward(ctx, x):
    ...         ctx.save_for_backward(x)
    ...         return x * x
    ...     @staticmethod
    ...     def backward(ctx, g):
    ...         (x,) = ctx.saved_tensors
    ...         return 2.0 * x * g
    >>> y = Square.apply(x)
    """

    @staticmethod
    def forward(ctx, *args):  # pragma: no cover - subclasses define it
        raise TypeError("Function: subclasses must define a static forward(ctx, *args)")

    @staticmethod
    def backward(ctx, *grads):  # pragma: no cover - subclasses define it
        raise TypeError("Function: subclasses must define a static backward(ctx, *grads)")

    @classmethod
    def apply(cls, *args):
        tensors = [a if getattr(a, "requires_grad", None) is not None else None for a in args]
        needs = tuple(bool(t is not None and t.requires_grad) for t in tensors)
        ctx = FunctionContext(needs)
        with no_grad():
            out = cls.forward(ctx, *args)
        single = not isinstance(out, tuple)
        outputs = (out,) if single else out
        for o in outputs:
            if getattr(o, "_layout", None) is None:
                raise TypeError(f"{cls.__name__}.forward must return ct tensors, got "
                                f"{type(o).__name__}")
        outputs = tuple(o.detach() if o._node is not None else o for o in outputs)
        if grad_mode.enabled and any(needs):
            n_args = len(args)

            def backward_fn(grads):
                result = cls.backward(ctx, *grads)
                result = result if isinstance(result, tuple) else (result,)
                if len(result) != n_args:
                    raise TypeError(f"{cls.__name__}.backward returned {len(result)} "
                                    f"gradients for {n_args} forward arguments")
                return result

            record(cls.__name__, tensors, list(outputs), backward_fn)
        return outputs[0] if single else outputs


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
