"""Op declarations and the one dispatch path every op goes through.

An op is declared once, in its family's module under ``ops/``, with :func:`defop`::

    @defop(kernel=lambda xp, x, dims, keepdim: xp.sum(x, axis=dims, keepdims=keepdim),
           meta=reduce_meta("sum"), signatures=reduce_signatures(P, P),
           backward=_sum_backward, method=True)
    def sum(op, x, dim=None, keepdim=False):
        '''Sum over ``dim``.'''
        return op(x, dims=_dims("sum", dim, x.ndim), keepdim=bool(keepdim))

One declaration makes:

* the kernel declaration, an :class:`OpDef`:

  - ``kernel(xp, *arrays, **attrs)`` -> the local result(s) of one shard, written against
    the array module ``xp`` (NumPy or CuPy); ``ctx=`` (a :class:`KernelContext`: the
    shard's rank and logical regions) is passed too when the op declares ``needs_ctx``;
  - ``meta(layouts, **attrs)`` -> ``[(shape, dtype), ...]`` of the outputs; it validates
    and raises ``ValueError``/``TypeError`` before any communication;
  - ``signatures(layouts, **attrs)`` -> the 1-D :class:`Signature` list (input SBPs ->
    output SBPs), written for one mesh axis and expanded over N-D meshes here;
  - ``backward(ctx, *grads)`` -> one grad per tensor input, written in ctensor ops (a
    :class:`BackwardContext` holds the boxed inputs, the outputs and the attributes);
  - optionally ``composite(*tensors, **attrs)``: the same op written with other ops, run
    when the cost model prefers a signature marked ``composite`` (softmax along a split
    dim: a max and a sum over ranks instead of gathering the input);
  - gradient kernels of its own, declared with :meth:`OpDef.grad_kernel` next to it;

* the public function (``ct.sum``): the decorated *front* with its first parameter (the
  OpDef) bound; the front parses the user's arguments into tensor inputs and attributes;
* where ``method`` is given, the ``Tensor`` method of that name (``x.sum(...)``), bound to
  the same function;
* the record of all three in :data:`ctensor.registry.OPS`, the one registry.

An op written entirely with other ops (``clamp``) is declared with :func:`defop` too,
without a kernel: its front is the public function.

:func:`apply` is the one op lifecycle (``docs/design.md``, "How an op runs"): the call's
bits (which inputs need a gradient, are parameters, are one tensor) and the autograd state
(:data:`ctensor.autograd.grad_mode`) go to the planner (:func:`ctensor.planner.plan_for`:
the signature per mesh axis, cached per :class:`~ctensor.planner.OpCall`); the executor
(:func:`ctensor.executor.execute`) boxes the inputs that move and runs the kernel on every
held shard (arrays, shape-only, or started: ``to_global(..., async_op=True)``); the tape
(:func:`ctensor.tape.record`) records the op for its backward.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Callable, Optional, Sequence


from . import planner, runtime, tape
from . import timing as _profile
from .autograd import casts_leaf, grad_mode
from .executor import KernelContext, execute, start
from .operands import as_tensor
from .planner import plan_for
from .registry import OPS, OpRecord
from .saved import BackwardContext
from .sbp import format_sbp
from .tensor import TENSOR_TYPES, Tensor

_SINGLE, _PAIR, _PAIR_SAME = (0,), (0, 1), (0, 0)

__all__ = ["OpDef", "Signature", "sig", "defop", "apply", "as_tensor", "KernelContext",
           "BackwardContext"]


@dataclass(frozen=True)
class Signature:
    """One 1-D rule: the SBP each tensor input must have and the SBP of each output.

    ``composite``: this layout is served by the op's composite (written with other ops)
    rather than by its kernel; ``comm(layouts, axis, **attrs)`` then estimates the bytes
    per rank the composite moves itself along that mesh axis (its small reductions).
    """

    inputs: tuple
    outputs: tuple
    composite: bool = False
    comm: Optional[Callable] = None

    def __repr__(self) -> str:
        mark = " (composite)" if self.composite else ""
        return f"{format_sbp(self.inputs)} -> {format_sbp(self.outputs)}{mark}"


def sig(inputs: Sequence, outputs, composite: bool = False,
        comm: Optional[Callable] = None) -> Signature:
    """Shorthand: ``sig([S(0), B], S(0))``."""
    outputs = tuple(outputs) if isinstance(outputs, (list, tuple)) else (outputs,)
    return Signature(tuple(inputs), outputs, composite, comm)


class OpDef:
    """The kernel declaration of one op (see the module docstring). Calling it runs the op
    on tensor inputs: ``opdef(x, dims=(0,), keepdim=False)``."""

    __slots__ = ("name", "kernel", "meta", "signatures", "backward", "needs_ctx",
                 "n_outputs", "composite", "grads", "fixed_layout", "flops", "view", "per_axis",
                 "saves", "value_attrs", "__weakref__")

    def __init__(self, name: str, kernel: Callable, meta: Callable, signatures: Callable,
                 backward: Optional[Callable] = None, needs_ctx: bool = False,
                 n_outputs: int = 1, composite: Optional[Callable] = None,
                 fixed_layout: Optional[Callable] = None, flops: Optional[Callable] = None,
                 view: bool = False, per_axis: bool = False, saves=None,
                 value_attrs: frozenset = frozenset()):
        self.name = name
        self.kernel = kernel
        self.meta = meta
        self.signatures = signatures
        self.backward = backward
        self.needs_ctx = needs_ctx
        self.n_outputs = n_outputs
        self.composite = composite
        # (layouts, **attrs) -> (targets, out_layouts): the layouts, fixed (no choice)
        self.fixed_layout = fixed_layout
        self.flops = flops  # (local input shapes, local output shapes, **attrs) -> FLOPs
        self.view = view  # the kernel only re-views its input: no compute to speak of
        self.per_axis = per_axis  # signatures(..., mesh_axis=a) differ per mesh axis
        # which values the backward reads: input indices and/or "outputs" (None: all of
        # them); an in-place write to one of them before the backward is an error
        self.saves = saves
        # attributes only the kernel reads (an optimizer's learning rate and step count):
        # no signature depends on them, so a step whose calls differ in them alone repeats
        self.value_attrs = value_attrs
        self.grads: dict[str, OpDef] = {}

    def __call__(self, *inputs, **attrs):
        if len(inputs) == 1 and type(inputs[0]) in TENSOR_TYPES:
            return apply(self, inputs, attrs)
        return apply(self, as_tensor(inputs, self.name), attrs)

    def grad_kernel(self, suffix: str, kernel: Callable, *, meta: Callable,
                    signatures: Callable, needs_ctx: bool = False,
                    backward: Optional[Callable] = None,
                    flops: Optional[Callable] = None, saves=None,
                    n_outputs: int = 1) -> "OpDef":
        """Declare a kernel that computes a gradient of this op (``gelu.grad_kernel("grad",
        ...)``), named ``<op>.<suffix>``. It is part of this op's declaration: it has no
        public name and is reached through this OpDef (``opdef.grads[suffix]``)."""
        child = OpDef(f"{self.name}.{suffix}", kernel, meta, signatures, backward, needs_ctx,
                      n_outputs, flops=flops, saves=saves)
        self.grads[suffix] = child
        return child

    def __repr__(self) -> str:
        return f"<op {self.name}>"


def _public(front: Callable, opdef: OpDef, keyword_error: Optional[Callable],
            forwards: bool = False) -> Callable:
    """The public function: ``front`` with its first parameter (the OpDef) bound; with
    ``keyword_error(opname, keyword, front)`` an unknown keyword raises what it returns
    (one call layer for both: this is every op's hot path). ``forwards``: the front only
    calls ``op(*its arguments)``, so the public function dispatches without it."""
    params = list(inspect.signature(front).parameters.values())[1:]
    accepted = _accepted_keywords(params)
    if forwards:
        public = _forwarding(front, opdef, [p.name for p in params], keyword_error)
    elif keyword_error is None or accepted is None:
        def public(*args, **kwargs):
            return front(opdef, *args, **kwargs)
    else:
        def public(*args, **kwargs):
            if kwargs:
                _refuse_unknown(opdef.name, kwargs, accepted, keyword_error, front)
                return front(opdef, *args, **kwargs)
            return front(opdef, *args)  # (a call without ** is cheaper)

    functools.update_wrapper(public, front)
    public.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return public


def _forwarding(front: Callable, opdef: OpDef, names: list,
                keyword_error: Optional[Callable]) -> Callable:
    """The public function of a front that is ``return op(x)`` or ``return op(a, b)``: the
    same, without the front and ``OpDef.__call__`` between the caller and :func:`apply`."""
    name = opdef.name

    def refuse(kwargs: dict):
        bad = next(iter(kwargs))
        if keyword_error is None:
            return TypeError(f"{name}() got an unexpected keyword argument '{bad}'")
        return keyword_error(name, bad, front)

    if names == ["x"]:
        def public(x, **kwargs):
            if kwargs:
                raise refuse(kwargs)
            if type(x) in TENSOR_TYPES:
                return apply(opdef, (x,), {})
            return apply(opdef, as_tensor((x,), name), {})
    elif names == ["a", "b"]:
        def public(a, b, **kwargs):
            if kwargs:
                raise refuse(kwargs)
            if type(a) in TENSOR_TYPES and type(b) in TENSOR_TYPES and \
                    a._layout.placement is b._layout.placement:
                return apply(opdef, (a, b), {})
            return apply(opdef, as_tensor((a, b), name), {})
    else:
        raise TypeError(f"defop({name!r}): forwards=True takes a front (op, x) or "
                        f"(op, a, b), got the parameters {names}")
    return public


def _checked_keywords(opname: str, front: Callable, keyword_error: Callable) -> Callable:
    """``front`` (an op without a kernel: its front is the public function) with unknown
    keywords raising ``keyword_error(opname, keyword, front)``."""
    accepted = _accepted_keywords(inspect.signature(front).parameters.values())
    if accepted is None:
        return front

    @functools.wraps(front)
    def checked(*args, **kwargs):
        if kwargs:
            _refuse_unknown(opname, kwargs, accepted, keyword_error, front)
        return front(*args, **kwargs)
    return checked


def _accepted_keywords(params) -> Optional[frozenset]:
    """The names a front's parameters take by keyword; None when it takes any
    (``**kwargs``)."""
    params = list(params)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params
                     if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                   inspect.Parameter.KEYWORD_ONLY))


def _refuse_unknown(opname: str, kwargs: dict, accepted: frozenset, keyword_error: Callable,
                    front: Callable) -> None:
    """Raise ``keyword_error``'s exception for the first keyword not in ``accepted``."""
    if not accepted.issuperset(kwargs):
        bad = next(k for k in kwargs if k not in accepted)
        raise keyword_error(opname, bad, front)


def defop(name: Optional[str] = None, *, kernel: Optional[Callable] = None,
          meta: Optional[Callable] = None, signatures: Optional[Callable] = None,
          backward: Optional[Callable] = None, needs_ctx: bool = False, n_outputs: int = 1,
          composite: Optional[Callable] = None, fixed_layout: Optional[Callable] = None,
          flops: Optional[Callable] = None, view: bool = False, per_axis: bool = False,
          saves=None, method=False, keyword_error: Optional[Callable] = None,
          forwards: bool = False, value_attrs=()) -> Callable:
    """Declare an op (see the module docstring): decorates its front and returns the public
    function, which carries the OpDef as ``.op`` (``None`` for an op without a kernel).

    ``flops(local input shapes, local output shapes, **attrs)`` gives the kernel's
    floating-point operations for the cost model (default: memory-bound); ``view=True``
    marks a kernel that only re-views its input (reshape, permute); ``per_axis=True``
    passes ``mesh_axis=`` to ``signatures`` (rules that depend on the other axes' splits,
    such as reshape's alignment); ``saves`` names what the backward reads the values of
    (input indices and/or ``"outputs"``; default: everything; or a function of the
    bitmask of inputs needing a gradient and the input layouts that returns them), so that
    an in-place write to anything else after the op is allowed and the backward context
    keeps nothing else alive (the rest is kept as a :class:`LayoutOnly`). ``name`` defaults to
    the front's name; ``method=True`` binds ``Tensor.<name>``, ``method="other"``
    ``Tensor.other``. ``keyword_error(opname, keyword, front)`` makes the exception of an
    unknown keyword (the families pass PyTorch's wording, ``ops/_rules.py``). ``forwards=True``:
    the front is ``def front(op, x): return op(x)`` or ``(op, a, b): return op(a, b)``, so
    the public function dispatches directly (the hottest ops: arithmetic, unary math).
    ``value_attrs`` names attributes that only the kernel reads (no signature, meta or cost
    depends on them: an optimizer's learning rate and step): the planner's cache and the
    step plan (:mod:`ctensor.stepplan`) key a call without them
    (:func:`ctensor.planner.choice_attrs`).
    """
    def wrap(front: Callable) -> Callable:
        opname = name or front.__name__
        if kernel is None:
            if any(v is not None for v in (meta, signatures, backward, composite, fixed_layout,
                                           flops)):
                raise TypeError(f"defop({opname!r}): meta, signatures, backward, composite "
                                f"and fixed_layout need a kernel")
            opdef, public = None, front
            if keyword_error is not None:
                public = _checked_keywords(opname, front, keyword_error)
        else:
            if fixed_layout is None and (meta is None or signatures is None):
                raise TypeError(f"defop({opname!r}): a kernel needs meta and signatures "
                                f"(or a fixed_layout)")
            opdef = OpDef(opname, kernel, meta, signatures, backward, needs_ctx, n_outputs,
                          composite, fixed_layout, flops, view, per_axis, saves,
                          frozenset(value_attrs))
            public = _public(front, opdef, keyword_error, forwards)
        public.__name__ = opname
        public.op = opdef  # type: ignore[attr-defined]
        method_name = (opname if method is True else method) or None
        OPS.declare(OpRecord(opname, public, opdef, method_name))
        if method_name:
            Tensor._bind_method(method_name, public)
        return public
    return wrap


# --------------------------------------------------------------------------- apply
_CAST = "to"  # (checked inline before casts_leaf: the hot path calls it for casts only)


def apply(opdef: OpDef, tensors: Sequence, attrs: dict, started: bool = False):
    """Run ``opdef`` on ``tensors`` (scalars already promoted) with ``attrs``: the one op
    lifecycle (see "How an op runs" in docs/design.md). ``started=True`` (a fixed-layout op
    of one input: ``to_global(..., async_op=True)``) returns ``(pending, finish)`` from
    :func:`ctensor.executor.start` instead of the output."""
    if _profile.on and not started and _profile.outer(opdef):  # ct.debug.profile()
        return _profile.op(apply, opdef, tensors, attrs)
    # (the hot path of every op: on a plan-cache hit it does little more than the kernel)
    grads = pinned = 0  # bit i: input i needs a gradient / is a parameter
    n = len(tensors)
    if n == 2:
        t, u = tensors
        layouts = (t._layout, u._layout)
        # which inputs are one tensor (y * y): it is boxed once, and the choice knows it
        same = _PAIR_SAME if u is t else _PAIR
        if t.requires_grad:
            node = t._node
            grads = 1  # (a conditional, not int(): a builtin call less)
            pinned = 1 if node is None or node.name == _CAST and casts_leaf(node) else 0
        if u.requires_grad:
            node = u._node
            grads |= 2
            pinned |= (node is None or node.name == _CAST and casts_leaf(node)) << 1
    elif n == 1:
        t = tensors[0]
        layouts, same = (t._layout,), _SINGLE
        if t.requires_grad:
            node = t._node
            grads = 1
            pinned = 1 if node is None or node.name == _CAST and casts_leaf(node) else 0
    else:
        layouts = tuple([t._layout for t in tensors])
        for i, t in enumerate(tensors):
            if t.requires_grad:
                node = t._node
                pinned |= (node is None or node.name == _CAST and casts_leaf(node)) << i
                grads |= 1 << i
        same = tuple([next(j for j in range(i + 1) if tensors[j] is t)
                      for i, t in enumerate(tensors)])
    if grads and (opdef.backward is None or not grad_mode.enabled):
        grads = 0  # (the choice weighs the backward only when there will be one)
    # the plan: planner.hits by the key planner.plan_for builds (a call less on a hit)
    destinations = grad_mode.destinations
    try:
        plan = planner.hits.get((opdef, runtime._default_dtype, tuple(attrs.items()) if attrs
                                 else (), layouts, destinations, grads, pinned, same))
    except TypeError:  # an unhashable attribute: plan_for freezes it
        plan = None
    if plan is None:
        plan = plan_for(opdef, attrs, layouts, destinations, grads, pinned, same)
    if plan.composite:  # written with other ops, which dispatch and record themselves
        return opdef.composite(*tensors, **attrs)
    if started:
        return _start(opdef, plan, tensors, attrs, grads)
    boxed, outputs = execute(opdef, plan, tensors, attrs)
    if opdef.view and boxed[0] is tensors[0]:  # outputs share the input's shards, and so
        for o in outputs:                        # its count of in-place writes
            o._version = tensors[0]._version
    if grads:
        tape.record(opdef, plan, tensors, boxed, outputs, attrs, grads)
    return outputs[0] if plan.single else tuple(outputs)


def _start(opdef: OpDef, plan, tensors: Sequence, attrs: dict, grads: int):
    """:func:`apply` with the started executor (``to_global(..., async_op=True)``): the move
    starts now; the result is made, and recorded on the tape, when it is waited for."""
    def finish(boxed, outputs):
        if grads:
            tape.record(opdef, plan, tensors, boxed, outputs, attrs, grads)
        return outputs[0]

    return start(opdef, plan, tensors[0], finish)
