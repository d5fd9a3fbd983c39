"""Executors: how a planned op (:class:`ctensor.planner.OpPlan`) runs on its tensors.

One interface, :class:`Executor`: ``box(opdef, t, target)`` (one input to the layout the
plan wants) and ``run(opdef, plan, boxed, attrs)`` (the kernel on every held shard: the
outputs). :func:`execute` boxes the inputs that move (each distinct input once, through
:func:`boxed`, which keeps the copy on the tensor while it lives) and runs the plan with
the executor of the inputs:

* :data:`ARRAYS`: the kernel loop over the held shards' arrays (NumPy or CuPy), the
  common case (one output, no kernel context, one or two inputs) unrolled;
* :data:`SHAPE_ONLY`: ``ct.simulate(n, meta=True)``'s tensors, whose shards are one
  :class:`~ctensor.meta.MetaBuffer` (:mod:`ctensor.shapeonly`: no kernel, no data, every
  boxing step recorded). Which one runs is decided here, by the inputs' shards: the one
  place dispatch asks whether a run is shape-only;
* :data:`STARTED`: a redistribution that starts now and finishes when waited for
  (``to_global(..., async_op=True)``, :func:`start`).

Like :mod:`ctensor.dispatch`, this module calls boxing; dispatch calls it.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from . import boxing, quiet, shapeonly
from . import timing as _profile
from .arrays import array_module
from .comm import context
from .layout import Layout
from .meta import MetaBuffer
from .runtime import world
from .sbp import format_sbp
from .tensor import Tensor

__all__ = ["Executor", "ARRAYS", "SHAPE_ONLY", "STARTED", "execute", "boxed", "start",
           "new_tensor", "write_into", "copied_shards", "KernelContext"]


class KernelContext:
    """What a kernel may need about its shard: its rank and the logical regions
    (``(start, stop)`` per dim) of its (boxed) inputs and of its outputs."""

    __slots__ = ("rank", "in_layouts", "out_layouts")

    def __init__(self, rank: int, in_layouts: tuple, out_layouts: tuple):
        self.rank, self.in_layouts, self.out_layouts = rank, in_layouts, out_layouts

    def in_region(self, i: int) -> tuple:
        return self.in_layouts[i].region(self.rank)

    def out_region(self, i: int = 0) -> tuple:
        return self.out_layouts[i].region(self.rank)


class Executor:
    """The interface every executor has (see the module docstring)."""

    def box(self, opdef, t: Tensor, target: Layout) -> Tensor:
        """``t`` in ``target`` (a new tensor; views of ``t`` where the boxing only views)."""
        raise NotImplementedError

    def run(self, opdef, plan, boxed, attrs: dict) -> list:
        """The outputs of ``opdef`` on the boxed inputs."""
        raise NotImplementedError


class _Arrays(Executor):
    def box(self, opdef, t: Tensor, target: Layout) -> Tensor:
        return Tensor(target, boxing.box(t._shards, t._layout, target))

    def run(self, opdef, plan, boxed, attrs: dict) -> list:
        xp = plan.xp or array_module(plan.out_layouts[0].placement.device)
        token = quiet.off()  # no RuntimeWarning: inf/nan as PyTorch gives (ctensor/quiet.py)
        try:
            if plan.unrolled:
                return [_unrolled(opdef, plan, boxed, attrs, xp)]
            return _general(opdef, plan, boxed, attrs, xp)
        finally:
            quiet.restore(token)


def _unrolled(opdef, plan, boxed, attrs: dict, xp) -> Tensor:
    """The common case, unrolled: one output, no kernel context, one or two inputs; each
    result's local shape is checked on the plan's first run, its dtype and array type on
    every run."""
    kernel, layout = opdef.kernel, plan.out_layouts[0]
    result, first, check = {}, boxed[0]._shards, not plan.verified
    second = boxed[1]._shards if len(boxed) == 2 else None
    dtype = layout.dtype
    for rank, a in first.items():
        arr = kernel(xp, a, **attrs) if second is None else kernel(xp, a, second[rank], **attrs)
        if type(arr) is not np.ndarray or arr.dtype is not dtype or \
                (check and arr.shape != plan.shapes[rank][0]):
            arr = _conform(opdef, arr, xp, rank, layout, plan.shapes[rank][0])
        result[rank] = arr
    plan.verified = True
    return Tensor(layout, result)


def _general(opdef, plan, boxed, attrs: dict, xp) -> list:
    """The kernel loop of any op (several outputs, a kernel context, many inputs): every
    result checked on every run."""
    out_layouts, kernel = plan.out_layouts, opdef.kernel
    results: list = [{} for _ in out_layouts]
    for rank in boxed[0]._shards:
        arrays = [b._shards[rank] for b in boxed]
        if opdef.needs_ctx:
            out = kernel(xp, *arrays, ctx=KernelContext(rank, plan.targets, out_layouts),
                         **attrs)
        else:
            out = kernel(xp, *arrays, **attrs)
        if plan.single:
            out = (out,)
        expected = plan.shapes[rank]
        for j, arr in enumerate(out):
            results[j][rank] = _conform(opdef, arr, xp, rank, out_layouts[j], expected[j])
    return [Tensor(l, r) for l, r in zip(out_layouts, results)]


def _conform(opdef, arr, xp, rank: int, layout: Layout, expected: tuple):
    """A kernel's local result as an array of the output's dtype, checked to have the
    local shape the output layout gives ``rank`` (a mismatch is a kernel bug, never user
    error)."""
    if type(arr) is not np.ndarray:
        arr = xp.asarray(arr)
    if arr.dtype is not layout.dtype and arr.dtype != layout.dtype:
        arr = arr.astype(layout.dtype)
    if arr.shape != expected:
        raise RuntimeError(f"{opdef.name}: kernel returned local shape {arr.shape} on rank "
                           f"{rank}, expected {expected} for {format_sbp(layout.sbp)} of "
                           f"{layout.shape}")
    return arr


class _ShapeOnly(Executor):
    def box(self, opdef, t: Tensor, target: Layout) -> Tensor:
        return Tensor(target, shapeonly.box(t._shards, t._layout, target))

    def run(self, opdef, plan, boxed, attrs: dict) -> list:
        return shapeonly.run(opdef, boxed, plan.targets, plan.out_layouts, attrs, plan)


class _Started:
    """Starts a redistribution (:func:`boxing.box_start`); its tensor is made on wait."""

    def start(self, opdef, t: Tensor, target: Layout):
        context.op_stack.append(opdef.name)  # names the op in the communication log
        try:
            return boxing.box_start(t._shards, t._layout, target)
        finally:
            context.op_stack.pop()


ARRAYS, SHAPE_ONLY, STARTED = _Arrays(), _ShapeOnly(), _Started()


def new_tensor(layout: Layout, shards: Callable[[], dict],
               requires_grad: bool = False) -> Tensor:
    """A new tensor of ``layout`` whose shards are ``shards()`` (``{rank: array}``), or, in
    a shape-only world, one :class:`~ctensor.meta.MetaBuffer` (``shards`` is not called)."""
    if world().meta:
        return Tensor(layout, MetaBuffer.of(layout), requires_grad=requires_grad)
    return Tensor(layout, shards(), requires_grad=requires_grad)


def write_into(x: Tensor, value: Tensor) -> None:
    """Write ``value``'s shards (``x``'s layout) into ``x``'s arrays in place, copying a
    read-only shard first (never writing into a shared copy); shape-only: nothing to
    write."""
    if type(x._shards) is MetaBuffer:
        return
    for rank, arr in x._shards.items():
        src = value._shards[rank]
        if src is arr:
            continue
        if isinstance(arr, np.ndarray) and not arr.flags.writeable:
            arr = x._shards[rank] = arr.copy()
        arr[...] = src


def copied_shards(x: Tensor):
    """A copy of ``x``'s shards (shape-only: a new buffer of the same size)."""
    shards = x._shards
    if type(shards) is MetaBuffer:
        return MetaBuffer(shards.placement, shards.nbytes)
    return {r: a.copy() for r, a in shards.items()}


def boxed(opdef, t: Tensor, target: Layout, aliases: bool) -> Tensor:
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
    shape_only = type(t._shards) is MetaBuffer
    context.op_stack.append(opdef.name)  # names the op in the communication log
    try:
        copy = (SHAPE_ONLY if shape_only else ARRAYS).box(opdef, t, target)
    finally:
        context.op_stack.pop()
    if aliases:  # views of t: they share t's count of in-place writes
        copy._version = t._version
    elif opdef.fixed_layout is None and not (t.requires_grad and t._node is None):
        if not shape_only:
            for arr in copy._shards.values():
                if type(arr) is np.ndarray:
                    arr.flags.writeable = False
        if cache is None:
            cache = t._boxed = {}
        cache[target] = (t._version.value, t._layout, copy)
    return copy


def execute(opdef, plan, tensors, attrs: dict) -> tuple:
    """Box the inputs that move and run the plan: ``(boxed inputs, outputs)``."""
    moved = plan.moved
    if moved:
        boxed_in = list(tensors)
        for i in moved:
            boxed_in[i] = boxed(opdef, tensors[i], plan.targets[i], plan.aliases[i])
    else:
        boxed_in = tensors
    if type(boxed_in[0]._shards) is MetaBuffer:  # shape-only: no kernel, no data
        return boxed_in, SHAPE_ONLY.run(opdef, plan, boxed_in, attrs)
    timed = _profile.on and _profile.kernel_enter(opdef)  # (ct.debug.profile())
    token = quiet.off()  # no RuntimeWarning: inf/nan as PyTorch gives (ctensor/quiet.py)
    try:
        xp = plan.xp or array_module(plan.out_layouts[0].placement.device)
        if not plan.unrolled:
            return boxed_in, _general(opdef, plan, boxed_in, attrs, xp)
        # ARRAYS.run's common case (_unrolled) written out here: this is every op's hot
        # path, and a call less is measurable (benchmarks/dispatch.py)
        kernel, layout = opdef.kernel, plan.out_layouts[0]
        result, first, check = {}, boxed_in[0]._shards, not plan.verified
        second = boxed_in[1]._shards if len(boxed_in) == 2 else None
        dtype = layout.dtype
        for rank, a in first.items():
            if second is None:
                arr = kernel(xp, a, **attrs) if attrs else kernel(xp, a)
            else:  # (no attributes is the common case, and a call without ** is cheaper)
                arr = kernel(xp, a, second[rank], **attrs) if attrs else \
                    kernel(xp, a, second[rank])
            if type(arr) is not np.ndarray or arr.dtype is not dtype or \
                    (check and arr.shape != plan.shapes[rank][0]):
                arr = _conform(opdef, arr, xp, rank, layout, plan.shapes[rank][0])
            result[rank] = arr
        if check:
            plan.verified = True
        return boxed_in, [Tensor(layout, result)]
    except KeyError:
        _stale(opdef, tensors)
        raise
    finally:
        quiet.restore(token)
        if timed:
            _profile.leave()


def start(opdef, plan, t: Tensor, finish: Callable):
    """Start ``plan`` (one input, a fixed layout, an identity kernel: ``to_global``) on
    ``t`` with :data:`STARTED`; ``finish(boxed inputs, outputs)`` makes the result when it
    is waited for. Returns ``(pending, finish_shards)`` where ``finish_shards(shards)``
    gives that result; ``pending`` is None when nothing needs to move (shape-only: the
    result is made now)."""
    target = plan.targets[0]
    if type(t._shards) is MetaBuffer:  # nothing moves in a shape-only run: done now
        return None, finish(*execute(opdef, plan, (t,), {}))

    def made(shards: dict):
        out = Tensor(target, shards)
        if plan.aliases[0]:  # slices of t's shards: they share its count of in-place writes
            out._version = t._version
        return finish((out,), [out])

    return STARTED.start(opdef, t, target), made


def _stale(opdef, tensors) -> None:
    """Raise the error for tensors whose shards belong to another world (a finished
    simulation), or return to re-raise the original problem."""
    w = world()
    for t in tensors:
        missing = [r for r in w.held_ranks if r in t.placement and r not in t._shards]
        if missing or any(r not in w.held_ranks for r in t._shards):
            raise ValueError(f"{opdef.name}: an input tensor of shape {tuple(t.shape)} on "
                             f"{t.placement!r} belongs to another world (its shards are those "
                             f"of ranks {sorted(t._shards)}, this process now holds ranks "
                             f"{list(w.held_ranks)}): tensors made inside a ct.simulate block "
                             f"cannot be used after it ends; keep the work inside the block "
                             f"or take its value with .numpy() before leaving it")
