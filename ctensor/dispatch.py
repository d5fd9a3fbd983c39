"""The op registry and the one dispatch path every op goes through.

An op is declared once (see ``ops/``) as an :class:`OpDef`:

* ``meta(layouts, **attrs)`` -> ``[(shape, dtype), ...]`` of the outputs; it validates the
  arguments and raises ``ValueError``/``TypeError`` before any communication;
* ``signatures(layouts, **attrs)`` -> the 1-D :class:`Signature` list (input SBPs ->
  output SBPs), written for one mesh axis and expanded over N-D meshes here;
* ``kernel(xp, *arrays, **attrs)`` -> the local result(s) of one shard (``ctx=`` is passed
  too when the op declares ``needs_ctx``: the shard's rank and regions);
* ``backward(ctx, *grads)`` -> one grad per tensor input, written in ctensor ops.

:func:`apply` checks placements, computes the output metadata, picks per mesh axis the
signature that moves the fewest bytes (ties: the earlier declared; cached per op,
attributes and input layouts), boxes the inputs, runs the kernel on every held shard and
records the op on the autograd tape.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

from . import autograd, boxing, debug
from .layout import Layout
from .placement import Placement
from .runtime import array_module, get_default_dtype, world
from .sbp import Broadcast, format_sbp
from .tensor import Tensor

__all__ = ["OpDef", "Signature", "apply", "op", "REGISTRY", "as_tensor", "KernelContext",
           "BackwardContext", "sig"]


@dataclass(frozen=True)
class Signature:
    """One 1-D rule: the SBP each tensor input must have and the SBP of each output."""

    inputs: tuple
    outputs: tuple

    def __repr__(self) -> str:
        return f"{format_sbp(self.inputs)} -> {format_sbp(self.outputs)}"


def sig(inputs: Sequence, outputs) -> Signature:
    """Shorthand: ``sig([S(0), B], S(0))``."""
    outputs = tuple(outputs) if isinstance(outputs, (list, tuple)) else (outputs,)
    return Signature(tuple(inputs), outputs)


@dataclass
class OpDef:
    name: str
    meta: Callable
    signatures: Callable
    kernel: Callable
    backward: Optional[Callable] = None
    needs_ctx: bool = False
    n_outputs: int = 1


REGISTRY: dict[str, OpDef] = {}


def op(name: str, *, meta: Callable, signatures: Callable, backward: Optional[Callable] = None,
       needs_ctx: bool = False, n_outputs: int = 1) -> Callable:
    """Decorator on a kernel: declare the op ``name`` (kernel, signatures, backward together)."""
    def wrap(kernel: Callable) -> OpDef:
        opdef = OpDef(name, meta, signatures, kernel, backward, needs_ctx, n_outputs)
        REGISTRY[name] = opdef
        return opdef
    return wrap


@dataclass
class KernelContext:
    """What a kernel may need about its shard: its rank and the logical regions
    (``(start, stop)`` per dim) of its inputs and outputs."""

    rank: int
    in_layouts: tuple
    out_layouts: tuple

    def in_box(self, i: int) -> tuple:
        return self.in_layouts[i].box(self.rank)

    def out_box(self, i: int = 0) -> tuple:
        return self.out_layouts[i].box(self.rank)

    def coord(self) -> tuple:
        return self.out_layouts[0].placement.coord(self.rank)


@dataclass
class BackwardContext:
    """Handed to an op's backward: the (boxed) inputs, the outputs and the attributes."""

    inputs: tuple
    outputs: tuple
    attrs: dict
    extra: dict = field(default_factory=dict)


# --------------------------------------------------------------------------- helpers
def _freeze(v):
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, slice):
        return ("slice", v.start, v.stop, v.step)
    if isinstance(v, np.ndarray):
        return ("array", v.shape, v.dtype.str, v.tobytes())
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    return v


def _attrs_key(attrs: dict):
    """A hashable key of the op attributes (ops pass them in a fixed order)."""
    key = tuple(attrs.items())
    try:
        hash(key)
        return key
    except TypeError:
        return tuple((k, _freeze(v)) for k, v in attrs.items())


_constants: dict = {}


def _constant(value, placement: Placement, dtype=None) -> Tensor:
    """A Python scalar or array as a broadcast constant on ``placement``. Scalars are cached
    (tensors are immutable to ops, and internal constants never escape to in-place writes)."""
    scalar = isinstance(value, (bool, int, float))
    if scalar:
        key = (type(value), value, dtype, placement, world())
        hit = _constants.get(key)
        if hit is not None:
            return hit
    arr = np.asarray(value, dtype=dtype)
    if arr.dtype == object:
        raise TypeError(f"cannot use {value!r} ({type(value).__name__}) as a tensor operand")
    xp = array_module(placement.device)
    layout = Layout(tuple(arr.shape), arr.dtype, placement, (Broadcast(),) * placement.ndim)
    held = [r for r in world().held_ranks if r in placement]
    out = Tensor(layout, {r: xp.asarray(arr) for r in held})
    if scalar:
        if len(_constants) > 4096:
            _constants.clear()
        _constants[key] = out
    return out


def _scalar_dtype(value, others: Sequence[np.dtype]) -> np.dtype:
    """dtype of a Python scalar operand: it follows the tensors' kind like PyTorch does."""
    if isinstance(value, np.generic) or isinstance(value, np.ndarray):
        return np.asarray(value).dtype
    if isinstance(value, bool):
        return np.dtype(bool)
    if isinstance(value, int):
        for d in others:
            if d.kind in "iufc":
                return d if d.kind != "u" else np.dtype(np.int64)
        return np.dtype(np.int64)
    if isinstance(value, float):
        for d in others:
            if d.kind in "fc":
                return d
        return get_default_dtype()
    if isinstance(value, complex):
        return np.dtype(np.complex128)
    return np.asarray(value).dtype


def _same_placement(opname: str, placements: list) -> Placement:
    """The one placement of an op's inputs; ``ValueError`` naming both when they differ."""
    first = placements[0]
    for p in placements[1:]:
        if p != first:
            raise ValueError(f"{opname}: inputs have different placements {first!r} and {p!r}; "
                             f"move one with .to_global(placement=...) first")
    return first


def as_tensor(values: Sequence, opname: str) -> list:
    """Promote scalars/arrays among ``values`` to broadcast constants on the tensors'
    placement; check that all tensors share one placement."""
    if all(type(v) is Tensor for v in values):
        placement = values[0].placement
        if all(v.placement is placement or v.placement == placement for v in values):
            return list(values)
    tensors = [v for v in values if isinstance(v, Tensor)]
    if not tensors:
        raise TypeError(f"{opname}: expected at least one ct.Tensor argument, got "
                        f"{[type(v).__name__ for v in values]}")
    placement = _same_placement(opname, [t.placement for t in tensors])
    dtypes = [t.dtype for t in tensors]
    out = []
    for v in values:
        if isinstance(v, Tensor) or v is None:
            out.append(v)
        elif isinstance(v, (bool, int, float, complex, np.generic, np.ndarray, list)):
            out.append(_constant(v, placement, None if isinstance(v, (np.ndarray, list))
                                 else _scalar_dtype(v, dtypes)))
        else:
            raise TypeError(f"{opname}: unsupported operand {v!r} ({type(v).__name__}); "
                            f"expected a ct.Tensor, a Python number or a NumPy array")
    return out


# --------------------------------------------------------------------------- choice
def _choose(opdef: OpDef, layouts: tuple, attrs: dict, out_meta) -> tuple:
    """Per mesh axis, the declared signature whose input boxing costs least (ties: the
    earlier declared); returns (input layouts after boxing, output layouts). Called once per
    (op, attributes, input layouts): apply caches the result."""
    placement = layouts[0].placement
    candidates = opdef.signatures(layouts, **attrs)
    if not candidates:
        raise ValueError(f"{opdef.name}: no SBP signature for inputs "
                         f"{[format_sbp(l.sbp) for l in layouts]}")
    in_sbp = [list(l.sbp) for l in layouts]
    out_sbp = [[None] * placement.ndim for _ in out_meta]
    for axis in range(placement.ndim):
        best, best_cost = None, None
        for cand in candidates:
            total = 0.0
            for i, l in enumerate(layouts):
                if l.sbp[axis] == cand.inputs[i]:
                    continue
                sbp = list(l.sbp)
                sbp[axis] = cand.inputs[i]
                total += boxing.cost(l, l.with_sbp(sbp)) + 1e-9 * (axis + 1)
            if best is None or total < best_cost:
                best, best_cost = cand, total
        for i in range(len(layouts)):
            in_sbp[i][axis] = best.inputs[i]
        for j in range(len(out_meta)):
            out_sbp[j][axis] = best.outputs[j]
    targets = tuple(l.with_sbp(s) for l, s in zip(layouts, in_sbp))
    outs = tuple(Layout(tuple(shape), np.dtype(dtype), placement, tuple(s))
                 for (shape, dtype), s in zip(out_meta, out_sbp))
    return targets, outs


# --------------------------------------------------------------------------- apply
_apply_cache: dict = {}


class _Plan:
    """What one (op, attributes, input layouts) resolves to, computed once."""

    __slots__ = ("targets", "out_layouts", "xp", "single", "shapes")

    def __init__(self, opdef: OpDef, targets: tuple, out_layouts: tuple):
        self.targets, self.out_layouts = targets, out_layouts
        self.xp = array_module(out_layouts[0].placement.device)
        self.single = opdef.n_outputs == 1
        # the local shape every output must have on each rank (kernel bugs are caught)
        p = out_layouts[0].placement
        self.shapes = {r: tuple(l.local_shape(r) for l in out_layouts) for r in p.rank_list}


def apply(name: str, inputs: Sequence, **attrs):
    """Run op ``name`` on ``inputs`` (tensors; scalars already promoted) with ``attrs``."""
    opdef = REGISTRY[name]
    tensors = inputs
    layouts = tuple([t._layout for t in tensors])
    key = (name, _attrs_key(attrs) if attrs else (), layouts)
    plan = _apply_cache.get(key)
    if plan is None:
        _same_placement(name, [l.placement for l in layouts])
        out_meta = opdef.meta(layouts, **attrs)
        plan = _Plan(opdef, *_choose(opdef, layouts, attrs, out_meta))
        if len(_apply_cache) > 65536:
            _apply_cache.clear()
        _apply_cache[key] = plan
    targets, out_layouts, single = plan.targets, plan.out_layouts, plan.single

    boxed = tensors
    for i, t in enumerate(tensors):
        target = targets[i]
        if t._layout is not target:
            if boxed is tensors:
                boxed = list(tensors)
            debug._op_stack.append(name)  # names the op in the communication log
            try:
                boxed[i] = Tensor(target, boxing.box(t._shards, t._layout, target))
            finally:
                debug._op_stack.pop()

    results: list = [{} for _ in out_layouts]
    xp, kernel, shapes = plan.xp, opdef.kernel, plan.shapes
    for rank in boxed[0]._shards:
        arrays = [b._shards[rank] for b in boxed]
        if opdef.needs_ctx:
            out = kernel(xp, *arrays, ctx=KernelContext(rank, targets, out_layouts), **attrs)
        else:
            out = kernel(xp, *arrays, **attrs)
        if single:
            out = (out,)
        expected = shapes[rank]
        for j, arr in enumerate(out):
            if type(arr) is not np.ndarray:
                arr = xp.asarray(arr)
            dtype = out_layouts[j].dtype
            if arr.dtype is not dtype and arr.dtype != dtype:
                arr = arr.astype(dtype)
            if arr.shape != expected[j]:  # a kernel bug, never user error
                layout = out_layouts[j]
                raise RuntimeError(f"{name}: kernel returned local shape {arr.shape} on rank "
                                   f"{rank}, expected {expected[j]} for "
                                   f"{format_sbp(layout.sbp)} of {layout.shape}")
            results[j][rank] = arr
    outputs = [Tensor(l, r) for l, r in zip(out_layouts, results)]

    if opdef.backward is not None and autograd._grad_enabled:
        for t in tensors:
            if t.requires_grad:
                break
        else:
            return outputs[0] if single else tuple(outputs)
        # inputs as they are (the backward runs under no_grad, and they point upstream
        # only); outputs detached, or output -> node -> context -> output would be a cycle
        ctx = BackwardContext(tuple(boxed), tuple([o.detach() for o in outputs]), attrs)
        backward = opdef.backward

        def backward_fn(grads, ctx=ctx, backward=backward):
            if single:
                return backward(ctx, grads[0])
            return backward(ctx, *grads)

        autograd.record(name, tensors, outputs, backward_fn)
    return outputs[0] if single else tuple(outputs)
