"""Fully sharded data parallel (ZeRO-2/3) as an SBP choice, and mixed-precision compute.

Both work the same way: each module that owns parameters gets a forward pre-hook that puts
a *materialised* copy of each of its parameters where ``self.<name>`` finds it for the
forward (``Module._param_overrides``), and a post-hook that takes it away again. The
Parameter objects themselves never change during a step, so optimizers, ``state_dict``
and checkpoints see the stored layout and the master dtype.

**Fully sharded** (:func:`fully_shard`): a parameter is *stored* ``S(d)`` along the
data-parallel mesh axis (on top of whatever tensor-parallel SBP it has on the other axes;
``d`` the first dim not split elsewhere and at least as long as the axis, as optimizer
states choose it; a parameter with no such dim stays broadcast). Materialising it is an
all-gather along that axis, done by :class:`_Gather`, an autograd Function whose backward
returns the incoming gradient unchanged: the leaf (the shard) thus receives the full-shape
gradient, partial along the data-parallel axis, and ``backward()`` reduce-scatters it into
the shard's layout — in buckets, one collective for many parameters
(:mod:`ctensor.gradsync`). Optimizer states take the parameter's layout, so they are
sharded too (ZeRO-1), and each rank updates its shard only.

* ``reshard_after_forward=True`` (ZeRO-3): the gathered copy is freed when the module's
  forward returns; the ops that saved it for the backward keep, through
  ``ct.autograd.saved_tensors_hooks``, only a reference to the shard, and the backward
  gathers it again when it needs it.
* ``reshard_after_forward=False`` (ZeRO-2): the gathered copy lives until the backward has
  used it (one gather per step, more memory between forward and backward).

There is no prefetch: ctensor's collectives block, so the next module's gather cannot
overlap the current module's compute.

**Mixed precision** (:func:`mixed_precision`): the materialised copy is cast to the
compute dtype (``float16``) before it is gathered (so the gather moves half the bytes);
the cast's backward casts the gradient back, so gradients arrive, are reduced and are
applied in the parameter's own dtype (float32 master weights), and activations are
float16. Use :class:`ctensor.optim.GradScaler` for the loss scaling float16 needs.

>>> mesh = ct.placement("cpu", [0, 1, 2, 3])
>>> nn.fully_shard(model, mesh)                      # ZeRO-3 over 4 ranks
>>> nn.mixed_precision(model, ct.float16)            # float16 compute, float32 master
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Optional

import numpy as np

import ctensor as ct

from . import utils
from .module import Module

__all__ = ["fully_shard", "mixed_precision", "compute_dtype", "FSDPSpec"]

S, B = ct.sbp.split, ct.sbp.broadcast


@dataclass(frozen=True)
class FSDPSpec:
    """How a module was fully sharded: the placement, its data-parallel mesh axis and
    whether gathered parameters are freed after the forward (ZeRO-3)."""

    placement: "ct.Placement"
    dp_axis: int
    reshard_after_forward: bool

    def __repr__(self) -> str:
        return (f"fully_shard({self.placement!r}, dp_axis={self.dp_axis}, "
                f"reshard_after_forward={self.reshard_after_forward})")


class _Gather(ct.autograd.Function):
    """All-gather a parameter shard along the data-parallel axis; the backward hands the
    full-shape gradient through unchanged (partial along that axis), so the leaf's gradient
    is reduce-scattered into its shard by ``backward()``'s bucketed gradient sync."""

    @staticmethod
    def forward(ctx, shard, full_sbp):
        return shard.to_global(shard.placement, full_sbp)

    @staticmethod
    def backward(ctx, g):
        return g, None


class _Regather:
    """What a ZeRO-3 module's saved-tensor hook keeps of a gathered parameter: the shard
    and how to gather it again. The backward's gathers of one parameter share a copy while
    it is alive."""

    __slots__ = ("source", "full_sbp", "cache")

    def __init__(self, source, full_sbp):
        self.source, self.full_sbp, self.cache = source, full_sbp, None

    def get(self):
        full = self.cache() if self.cache is not None else None
        if full is None:
            with ct.no_grad():
                full = self.source.detach().to_global(self.source.placement, self.full_sbp)
            self.cache = weakref.ref(full)
        return full


class _Recast:
    """What a mixed-precision module's saved-tensor hook keeps of a parameter's half copy:
    the parameter, cast again when a backward reads it (so a micro-batch in flight does not
    hold a half copy of every weight; one recast per backward, shared while alive)."""

    __slots__ = ("param", "dtype", "cache")

    def __init__(self, param, dtype):
        self.param, self.dtype, self.cache = param, dtype, None

    def get(self):
        half = self.cache() if self.cache is not None else None
        if half is None:
            # a differentiable cast of the parameter, as in the forward, so that the ops of
            # the backward keep it where the parameter was laid out (a cast of a parameter
            # is pinned like it); nothing differentiates through it
            with ct.enable_grad():
                half = self.param.to(self.dtype)
            self.cache = weakref.ref(half)
        return half


class _Unit:
    """The hooks of one module that owns parameters: cast (mixed precision) and gather
    (fully sharded) each parameter for the forward, free the gathered copies after it."""

    def __init__(self, module: Module):
        self.spec: Optional[FSDPSpec] = None
        self.dtype: Optional[np.dtype] = None
        self.full_sbp: dict = {}  # parameter name -> its gathered SBP (sharded ones only)
        self.gathered: dict = {}  # parameter name -> (gathered tensor, its source)
        self.casts: dict = {}  # parameter name -> (half copy, parameter), not gathered ones
        self.hooks = None  # the saved_tensors_hooks context of the running forward
        module.register_forward_pre_hook(self.before)
        module.register_forward_hook(self.after, always_call=True)

    def _zero3(self) -> bool:
        return (self.spec is not None and self.spec.reshard_after_forward and
                ct.is_grad_enabled() and not utils.is_recomputing())

    def before(self, module, args):
        overrides, self.gathered, self.casts = {}, {}, {}
        for name, p in module.named_parameters(recurse=False, remove_duplicate=False):
            t = p
            if self.dtype is not None and p.dtype.kind == "f" and p.dtype != self.dtype:
                t = p.to(self.dtype)  # differentiable: the gradient comes back in p.dtype
            full = self.full_sbp.get(name)
            if full is not None:
                source, t = t, _Gather.apply(t, full)
                self.gathered[name] = (t, source)
            elif t is not p:
                self.casts[name] = (t, p)
            overrides[name] = t
        module.set_parameter_overrides(overrides)
        if (self.gathered and self._zero3()) or (self.casts and ct.is_grad_enabled()):
            self.hooks = ct.autograd.saved_tensors_hooks(*self._saved_hooks())
            self.hooks.__enter__()
        if self.dtype is not None and any(isinstance(a, ct.Tensor) and a.dtype.kind == "f"
                                          and a.dtype != self.dtype for a in args):
            # floating inputs in the compute dtype too (FSDP's cast_forward_inputs), or a
            # float32 input would promote the whole layer back to float32
            return tuple(a.to(self.dtype) if isinstance(a, ct.Tensor) and a.dtype.kind == "f"
                         else a for a in args)
        return None

    def after(self, module, args, output):
        if self.hooks is not None:
            self.hooks.__exit__(None, None, None)
            self.hooks = None
        module.set_parameter_overrides(None)
        gathered, self.gathered, self.casts = self.gathered, {}, {}
        if self._zero3():
            for t, _ in gathered.values():
                t.free_()  # the gathered copy goes; its graph node stays usable
        return None

    def _saved_hooks(self):
        """``(pack, unpack)``: a saved gathered parameter becomes a :class:`_Regather`;
        anything else goes to the hooks around this forward, if any."""
        outer = ct.autograd.saved_hooks()
        # weak references: the hooks outlive the forward (each op's backward keeps them),
        # and must not keep what they are meant to free
        gathered = [(weakref.ref(t), source, self.full_sbp[name])
                    for name, (t, source) in self.gathered.items()] if self._zero3() else []
        # a half copy is recognised by identity (weakly: the hooks must not keep it alive)
        casts = {id(t): (weakref.ref(t), p) for t, p in self.casts.values()}
        dtype = self.dtype

        def pack(t):
            hit = casts.get(id(t))
            if hit is not None and hit[0]() is t:
                return _Recast(hit[1], dtype)
            for ref, source, full in gathered:
                g = ref()  # (alive while the forward runs: self.gathered holds it)
                if g is not None and (t is g or t.shares_shards(g)):
                    return _Regather(source, full)
            return outer[0](t) if outer is not None else t

        def unpack(obj):
            if isinstance(obj, (_Regather, _Recast)):
                return obj.get()
            return outer[1](obj) if outer is not None else obj

        return pack, unpack


#: module -> its :class:`_Unit` (weakly: a module that goes takes its unit with it)
_units: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _unit(module: Module) -> _Unit:
    unit = _units.get(module)
    if unit is None:
        unit = _units[module] = _Unit(module)
    return unit


def _owners(module: Module) -> list:
    """Every module of the tree that owns parameters directly."""
    return [m for _, m in module.named_modules() if any(True for _ in m.parameters(False))]


def _check_module(fn: str, module) -> None:
    if not isinstance(module, Module):
        raise TypeError(f"{fn}: argument 'module' must be an nn.Module, got "
                        f"{type(module).__name__}")


def _stored_sbp(shape: tuple, sbp: tuple, axis: int, size: int) -> tuple:
    """The SBP a parameter is stored in: ``sbp`` with ``S(d)`` on the data-parallel
    ``axis`` (``d`` the first dim not split elsewhere with at least ``size`` entries, as
    :meth:`ctensor.optim.Optimizer.state_layout` chooses), or ``sbp`` unchanged."""
    taken = {s.dim for s in sbp if isinstance(s, ct.sbp.Split)}
    out = list(sbp)
    for d, n in enumerate(shape):
        if d not in taken and n >= size:
            out[axis] = S(d)
            break
    return tuple(out)


def fully_shard(module: Module, placement, dp_axis: int = 0,
                reshard_after_forward: bool = True) -> Module:
    """Shard ``module``'s parameters along the data-parallel mesh axis ``dp_axis`` of
    ``placement`` (fully sharded data parallel, ZeRO-3; ZeRO-2 with
    ``reshard_after_forward=False``) and return it. See the module docstring for the
    design: each parameter is stored ``S(d)`` along ``dp_axis``, gathered just before the
    forward of the module that owns it and freed after it (or after its backward), and its
    gradient is reduce-scattered back to the shard in buckets. Feed the model a batch split
    along ``dp_axis`` (:func:`ctensor.nn.parallel.batch_sbp`). Results equal data
    parallelism's.

    Parameters already on ``placement`` keep their SBP on the other mesh axes (lay the
    model out tensor-parallel first: ``to_global`` with ``hybrid_parallel_rules``); others
    are moved to ``placement``, broadcast. Call it once (again with the same arguments is
    a no-op); ``state_dict()`` and ``ct.save`` give full logical tensors, so checkpoints
    move between this and any other layout. A parameter must be used only inside the
    forward of the module that owns it. Collective.

    >>> mesh = ct.placement("cpu", [[0, 1], [2, 3]])              # (dp, tp)
    >>> model.to_global(mesh, nn.parallel.hybrid_parallel_rules(model))
    >>> nn.fully_shard(model, mesh, dp_axis=0)                    # ZeRO-3 x Megatron
    """
    fn = "fully_shard"
    _check_module(fn, module)
    if not isinstance(placement, ct.Placement):
        raise TypeError(f"{fn}: argument 'placement' must be a ct.placement, got "
                        f"{placement!r} ({type(placement).__name__})")
    if isinstance(dp_axis, bool) or not isinstance(dp_axis, (int, np.integer)) or \
            not 0 <= dp_axis < placement.ndim:
        raise ValueError(f"{fn}: argument 'dp_axis' is {dp_axis!r}, but {placement!r} has "
                         f"{placement.ndim} mesh axis(es), 0..{placement.ndim - 1}; pass the "
                         f"data-parallel mesh axis")
    dp_axis = int(dp_axis)
    spec = FSDPSpec(placement, dp_axis, bool(reshard_after_forward))
    owners = _owners(module)
    for name, m in module.named_modules():
        unit = _units.get(m)
        if unit is not None and unit.spec is not None and unit.spec != spec:
            raise ValueError(f"{fn}: module {name or type(m).__name__!r} is already fully "
                             f"sharded as {unit.spec!r}, not as {spec!r}; shard a module "
                             f"once (build it anew to change how)")
    if all(_unit(m).spec == spec for m in owners) and owners:
        return module
    size = placement.shape[dp_axis]
    plans = []
    for name, p in module.named_parameters():
        if p.placement == placement:
            current = p.sbp
            entry = current[dp_axis]
            if not isinstance(entry, ct.sbp.Broadcast):
                raise ValueError(f"{fn}: parameter {name!r} is {ct.sbp.format_sbp(current)} "
                                 f"on {placement!r}, not broadcast along mesh axis {dp_axis} "
                                 f"(the data-parallel axis); lay it out with the other "
                                 f"axes' (tensor-parallel) SBPs only, broadcast along "
                                 f"{dp_axis}, before fully_shard")
        else:
            current = (B,) * placement.ndim
        plans.append((p, current, _stored_sbp(tuple(p.shape), current, dp_axis, size)))
    ct.debug.check_broadcast_data(dict(module.named_parameters()), fn, "parameter")
    for p, _, stored in plans:  # everything checked: now move
        p.reshard_(placement, stored)
    for m in owners:
        unit = _unit(m)
        unit.spec = spec
        for pname, p in m.named_parameters(recurse=False, remove_duplicate=False):
            if isinstance(p.sbp[dp_axis], ct.sbp.Split):
                full = list(p.sbp)
                full[dp_axis] = B
                unit.full_sbp[pname] = tuple(full)
    return module


_NO_BF16 = ("bfloat16 is not available: NumPy (and CuPy) have no bfloat16 dtype, and ctensor "
            "does not add one through the ml_dtypes package (its bfloat16 products have no "
            "BLAS kernel, so on a CPU they would be slower than float32 and save no more "
            "memory than float16); use float16 (ct.float16 with optim.GradScaler) or float32")


def compute_dtype(dtype) -> np.dtype:
    """``dtype`` (a dtype or one of ``"fp32" "float32" "fp16" "float16" "half" "fp64"
    "float64"``) as a NumPy floating dtype; ``"bf16"``/``"bfloat16"`` raise ``TypeError``
    saying what to use instead.

    >>> nn.compute_dtype("fp16")
    dtype('float16')
    """
    names = {"fp16": np.float16, "half": np.float16, "float16": np.float16,
             "fp32": np.float32, "float32": np.float32, "float": np.float32,
             "fp64": np.float64, "float64": np.float64, "double": np.float64}
    if isinstance(dtype, str):
        if dtype.lower() in ("bf16", "bfloat16"):
            raise TypeError(f"mixed_precision: {_NO_BF16}")
        if dtype.lower() not in names:
            raise ValueError(f"mixed_precision: unknown dtype {dtype!r}; accepted "
                             f"{sorted(names)} or a floating dtype")
        return np.dtype(names[dtype.lower()])
    try:
        out = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"mixed_precision: argument 'dtype' must be a floating dtype, got "
                        f"{dtype!r}") from None
    if "bfloat16" in str(out):
        raise TypeError(f"mixed_precision: {_NO_BF16}")
    if out.kind != "f":
        raise TypeError(f"mixed_precision: argument 'dtype' must be a floating dtype, got "
                        f"{out}")
    return out


def mixed_precision(module: Module, dtype=np.float16) -> Module:
    """Compute ``module``'s forward and backward in ``dtype`` (float16) while its
    parameters stay float32 masters: each module casts its parameters to ``dtype`` just
    before its forward (a differentiable cast, so gradients come back float32 and are
    reduced and applied in float32), floating inputs are cast to ``dtype`` too, and every
    activation is ``dtype``. Composes with
    :func:`fully_shard` (the shard is cast before it is gathered) and with any layout.
    Softmax, layer norm and cross entropy keep their statistics in float32 inside; the
    mean cross entropy comes out float32. Scale the loss with
    :class:`ctensor.optim.GradScaler`. ``dtype=None`` (or the parameters' own dtype)
    turns it off. Returns the module.

    >>> nn.mixed_precision(model, ct.float16)
    >>> scaler = optim.GradScaler()
    >>> scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
    """
    _check_module("mixed_precision", module)
    dtype = None if dtype is None else compute_dtype(dtype)
    for m in _owners(module):
        _unit(m).dtype = dtype
    return module
