"""Fully sharded data parallel (ZeRO-2/3) as an SBP choice, and mixed-precision compute.

Both work the same way: each module that owns parameters gets a forward pre-hook that puts
a *materialised* copy of each of its parameters where ``self.<name>`` finds it for the
forward (:meth:`Module.set_parameter_overrides`), and a post-hook that takes it away
again (``always_call``: after a forward that raises too). The Parameter objects
themselves never change during a step, so optimizers, ``state_dict`` and checkpoints see
the stored layout and the master dtype.

**Fully sharded** (:func:`fully_shard`): a parameter is *stored* ``S(d)`` along the
data-parallel mesh axis (on top of whatever tensor-parallel SBP it has on the other axes;
``d`` the first dim not split elsewhere and at least as long as the axis, as optimizer
states choose it; a parameter with no such dim stays broadcast). Materialising it is an
all-gather along that axis, handed to the forward by :class:`_Gather`, an autograd
Function whose backward returns the incoming gradient unchanged: the leaf (the shard) thus
receives the full-shape gradient, partial along the data-parallel axis, and
``backward()`` reduce-scatters it into the shard's layout — in buckets, one collective for
many parameters (:mod:`ctensor.gradsync`). Optimizer states take the parameter's layout,
so they are sharded too (ZeRO-1), and each rank updates its shard only.

* ``reshard_after_forward=True`` (ZeRO-3): the gathered copy is freed
  (:meth:`ctensor.Tensor.free_`) when the module's forward returns; the ops that saved it
  for the backward keep, through ``ct.autograd.saved_tensors_hooks``, only a reference to
  the shard, and the backward gathers it again when it needs it.
* ``reshard_after_forward=False`` (ZeRO-2): the gathered copy lives until the backward has
  used it (one gather per step, more memory between forward and backward).

**Prefetch** (``fully_shard(..., prefetch=1)``): the modules' forward order is learned
from the first forward; afterwards, once a module's gathers are issued, the gathers of
the next ``prefetch`` modules are *started* (``to_global(..., async_op=True)``, a
:class:`ctensor.PendingTensor`) and waited for only when those modules run, so they move
while this module computes. In a ZeRO-3 backward, a module's first gather again starts
those of the ``prefetch`` modules before it. At most ``prefetch`` modules' gathered
parameters are in flight in each direction (the oldest is given up beyond that); a new
forward pass, and a backward for the forward's, gives up what was not used. Values are
the same with any ``prefetch``; ``prefetch=0`` gathers each module's parameters when it
runs.

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

import dataclasses
import weakref
from dataclasses import dataclass
from typing import Optional

import numpy as np

import ctensor as ct

from . import utils
from .module import Module
from .moe import MoE
from .precision import compute_dtype

__all__ = ["fully_shard", "mixed_precision", "FSDPSpec"]

S, B = ct.sbp.split, ct.sbp.broadcast


@dataclass(frozen=True)
class FSDPSpec:
    """How a module was fully sharded: the placement, its data-parallel mesh axis, whether
    gathered parameters are freed after the forward (ZeRO-3) and how many modules ahead
    the gathers are started (``prefetch``)."""

    placement: "ct.Placement"
    dp_axis: int
    reshard_after_forward: bool
    prefetch: int = 1

    def __repr__(self) -> str:
        return (f"fully_shard({self.placement!r}, dp_axis={self.dp_axis}, "
                f"reshard_after_forward={self.reshard_after_forward}, "
                f"prefetch={self.prefetch})")


class _Gather(ct.autograd.Function):
    """Hand the forward ``full``, ``shard`` gathered along the data-parallel axis (now, or
    started ahead by the schedule); the backward hands the full-shape gradient through
    unchanged (partial along that axis), so the leaf's gradient is reduce-scattered into
    its shard by ``backward()``'s bucketed gradient sync. A backward has begun: forward
    gathers still in flight are given up (the step may update the shards next)."""

    @staticmethod
    def forward(ctx, shard, full, schedule):
        ctx.schedule = schedule
        return full

    @staticmethod
    def backward(ctx, g):
        if ctx.schedule is not None:
            ctx.schedule.drop_ahead()
        return g, None, None


def _start_gather(source, full_sbp):
    """``source`` gathered to ``full_sbp``, started (a PendingTensor); not recorded."""
    with ct.no_grad():
        return source.detach().to_global(source.placement, full_sbp, async_op=True)


class _Regather(ct.autograd.graph.SelfUnpacking):
    """What a ZeRO-3 module's saved-tensor hook keeps of a gathered parameter for one op:
    the shard and how to gather it again (that op's reads share the copy). ``state``: 0
    idle, 1 started ahead (``pending``), 2 no longer started ahead (taken, or given up)."""

    __slots__ = ("source", "full_sbp", "cache", "unit", "run", "pending", "state",
                 "__weakref__")

    def __init__(self, source, full_sbp, unit, run):
        self.source, self.full_sbp, self.cache = source, full_sbp, None
        self.unit, self.run, self.pending, self.state = unit, run, None, 0

    def start(self) -> None:
        self.pending, self.state = _start_gather(self.source, self.full_sbp), 1

    def drop(self) -> None:
        """Give up the started gather (waited for: every rank completes it alike)."""
        if self.pending is not None:
            self.pending.wait()
        self.pending, self.state = None, 2

    def unpack(self, outer_unpack=None):
        return self.get()

    def get(self):
        full = self.cache() if self.cache is not None else None
        if full is None:
            schedule = self.unit.schedule
            if self.pending is not None:
                full = self.pending.wait()
                self.pending, self.state = None, 2
                schedule.taken(self)
            else:
                self.state = 2
                with ct.no_grad():
                    full = self.source.detach().to_global(self.source.placement,
                                                          self.full_sbp)
            self.cache = weakref.ref(full)
            schedule.ahead_of_backward(self)
        return full


class _Schedule:
    """The order in which the modules of one ``fully_shard`` call run their forwards
    (learned from the first forward: it ends when a module comes again) and gather again
    in the backward (ZeRO-3; learned from the first backward), and the gathers started
    ahead, at most ``prefetch`` modules' worth in flight each way: in the forward the next
    modules' gathers start once this module's are issued, in the backward the next
    modules' gathers again start at this module's. Every rank
    runs the same forwards and backwards, so every rank starts the same gathers in the
    same order. A forward of the order's first module begins a pass (``run``) and gives up
    what is still in flight, and so does a backward for the forward gathers."""

    def __init__(self, prefetch: int):
        self.prefetch = prefetch
        self.order: list = []  # the units, in the first forward's order
        self.index: Optional[dict] = None  # id(unit) -> position, once the order is known
        self.run = 0  # forward passes begun
        self.ahead: list = []  # units whose forward gathers are in flight, oldest first
        self.behind: list = []  # lists of _Regather started for the backward, oldest first
        self.back_order: list = []  # the units, in the first backward's order of gathers
        self.back_run: Optional[int] = None  # the pass whose backward it is learned from
        self.back_index: Optional[dict] = None  # id(unit) -> position, once known

    def arrive(self, unit) -> None:
        """``unit``'s forward begins."""
        if self.index is None:
            if not any(u is unit for u in self.order):
                self.run += not self.order
                self.order.append(unit)
                return
            self.index = {id(u): i for i, u in enumerate(self.order)}
        if self.order[0] is unit:
            self.run += 1
            self.drop_ahead()
            self.drop_behind()

    def ahead_of_forward(self, unit) -> None:
        """Start the gathers of the ``prefetch`` modules after ``unit`` in the order."""
        i = self.index.get(id(unit)) if self.index is not None else None
        if i is None or not self.prefetch:
            return
        for nxt in self.order[i + 1:i + 1 + self.prefetch]:
            if nxt.ahead is None and nxt.full_sbp:
                while len(self.ahead) >= self.prefetch:
                    self.ahead.pop(0).take_ahead()
                nxt.start_ahead()
                self.ahead.append(nxt)

    def drop_ahead(self) -> None:
        while self.ahead:
            self.ahead.pop(0).take_ahead()

    def _learn_backward(self, r: _Regather) -> Optional[int]:
        """Learn the backward's order from the first backward (the modules in the order of
        their first gather again; a gather of another pass ends it); ``r.unit``'s place in
        it once known."""
        if self.back_index is None:
            if self.back_run is None:
                self.back_run = r.run
            if r.run == self.back_run:
                if not any(u is r.unit for u in self.back_order):
                    self.back_order.append(r.unit)
                return None
            self.back_index = {id(u): i for i, u in enumerate(self.back_order)}
        return self.back_index.get(id(r.unit))

    def ahead_of_backward(self, r: _Regather) -> None:
        """At a gather again of ``r``'s module: start the gathers again (of the same
        forward pass) of the ``prefetch`` modules after it in the backward's order."""
        i = self._learn_backward(r)
        if i is None or not self.prefetch:
            return
        count = 0
        for j in range(i + 1, len(self.back_order)):
            saved = self.back_order[j].saved(r.run)
            idle = [s for s in saved if s.state == 0]
            if not idle and not any(s.state == 1 for s in saved):
                continue  # nothing to gather again there (or its backward ran already)
            if idle:
                while len(self.behind) >= self.prefetch:
                    for s in self.behind.pop(0):
                        s.drop()
                for s in idle:
                    s.start()
                self.behind.append(idle)
            count += 1
            if count == self.prefetch:
                return

    def taken(self, r: _Regather) -> None:
        for group in self.behind:
            if r in group:
                group.remove(r)
                if not group:
                    self.behind.remove(group)
                return

    def drop_behind(self) -> None:
        while self.behind:
            for s in self.behind.pop(0):
                s.drop()


class _Recast(ct.autograd.graph.SelfUnpacking):
    """What a mixed-precision module's saved-tensor hook keeps of a parameter's half copy:
    the parameter, cast again when a backward reads it (so a micro-batch in flight does not
    hold a half copy of every weight; one recast per backward, shared while alive)."""

    __slots__ = ("param", "dtype", "cache")

    def __init__(self, param, dtype):
        self.param, self.dtype, self.cache = param, dtype, None

    def unpack(self, outer_unpack=None):
        return self.get()

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
        self.module = weakref.ref(module)  # (weakly: the module holds this unit's hooks)
        self.spec: Optional[FSDPSpec] = None
        self.schedule: Optional[_Schedule] = None
        self.dtype: Optional[np.dtype] = None
        self.full_sbp: dict = {}  # parameter name -> its gathered SBP (sharded ones only)
        self.gathered: dict = {}  # parameter name -> (gathered tensor, its source)
        self.casts: dict = {}  # parameter name -> (half copy, parameter), not gathered ones
        self.hooks = None  # the saved_tensors_hooks context of the running forward
        self.ahead: Optional[dict] = None  # name -> (source, PendingTensor): started ahead
        self.regathers: list = []  # weak references to the _Regather of recent forwards
        module.register_forward_pre_hook(self.before)
        module.register_forward_hook(self.after, always_call=True)

    def _zero3(self) -> bool:
        return (self.spec is not None and self.spec.reshard_after_forward and
                ct.is_grad_enabled() and not utils.is_recomputing())

    def _source(self, p):
        """What is gathered of (or given the forward for) parameter ``p``: ``p``, or its
        differentiable cast to the compute dtype (the gradient comes back in p.dtype)."""
        if self.dtype is not None and p.dtype.kind == "f" and p.dtype != self.dtype:
            return p.to(self.dtype)
        return p

    def start_ahead(self) -> None:
        """Start gathering this module's sharded parameters (the schedule's prefetch)."""
        module, self.ahead = self.module(), {}
        for name, p in (module.named_parameters(recurse=False, remove_duplicate=False)
                        if module is not None else ()):
            full = self.full_sbp.get(name)
            if full is not None:
                source = self._source(p)
                self.ahead[name] = (source, _start_gather(source, full))

    def drop_ahead(self) -> None:
        """Give up the gathers started ahead (waited for: every rank completes them)."""
        ahead, self.ahead = self.ahead or {}, None
        for _, pending in ahead.values():
            pending.wait()

    def saved(self, run: int) -> list:
        """The live :class:`_Regather` of this module's forward of pass ``run``."""
        live = [r for r in (w() for w in self.regathers) if r is not None]
        return [r for r in live if r.run == run]

    def before(self, module, args):
        schedule = self.schedule if not utils.is_recomputing() else None
        ahead = {}
        if schedule is not None:  # (a recompute's forward gathers now, as it comes)
            schedule.arrive(self)
            if self in schedule.ahead:
                schedule.ahead.remove(self)
            ahead, self.ahead = self.ahead or {}, None
        overrides, self.gathered, self.casts = {}, {}, {}
        for name, p in module.named_parameters(recurse=False, remove_duplicate=False):
            started = ahead.get(name)
            t = started[0] if started is not None else self._source(p)
            full = self.full_sbp.get(name)
            if full is not None:
                if started is not None:
                    whole = started[1].wait()
                else:
                    with ct.no_grad():
                        whole = t.detach().to_global(t.placement, full)
                source, t = t, _Gather.apply(t, whole, schedule)
                self.gathered[name] = (t, source)
            elif t is not p:
                self.casts[name] = (t, p)
            overrides[name] = t
        module.set_parameter_overrides(overrides)
        if schedule is not None:
            schedule.ahead_of_forward(self)
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
        gathered = [(name, weakref.ref(t), source, self.full_sbp[name])
                    for name, (t, source) in self.gathered.items()] if self._zero3() else []
        # a half copy is recognised by identity (weakly: the hooks must not keep it alive)
        casts = {id(t): (weakref.ref(t), p) for t, p in self.casts.values()}
        dtype, run = self.dtype, self.schedule.run if self.schedule else 0
        if gathered:
            self.regathers = [w for w in self.regathers if w() is not None]

        def pack(t):
            hit = casts.get(id(t))
            if hit is not None and hit[0]() is t:
                return _Recast(hit[1], dtype)
            for name, ref, source, full in gathered:
                g = ref()  # (alive while the forward runs: self.gathered holds it)
                if g is not None and (t is g or t.shares_shards(g)):
                    # one per op that saves it: each backward gathers for itself, so the
                    # gathers do not depend on when another op's backward frees its copy
                    r = _Regather(source, full, self, run)
                    self.regathers.append(weakref.ref(r))
                    return r
            return outer[0](t) if outer is not None else t

        def unpack(obj):  # (hooks inside these unpack a _Regather/_Recast themselves too)
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


def _spec(fn: str, module, placement, dp_axis, reshard_after_forward, prefetch) -> FSDPSpec:
    """The checked arguments of :func:`fully_shard` (``TypeError``/``ValueError`` first)."""
    _check_module(fn, module)
    if not isinstance(placement, ct.Placement):
        raise TypeError(f"{fn}: argument 'placement' must be a ct.placement, got "
                        f"{placement!r} ({type(placement).__name__})")
    if isinstance(dp_axis, bool) or not isinstance(dp_axis, (int, np.integer)) or \
            not 0 <= dp_axis < placement.ndim:
        raise ValueError(f"{fn}: argument 'dp_axis' is {dp_axis!r}, but {placement!r} has "
                         f"{placement.ndim} mesh axis(es), 0..{placement.ndim - 1}; pass the "
                         f"data-parallel mesh axis")
    if isinstance(prefetch, bool) or not isinstance(prefetch, (int, np.integer)) or \
            prefetch < 0:
        raise ValueError(f"{fn}: argument 'prefetch' must be an int >= 0 (how many modules "
                         f"ahead the gathers start; 0: none), got {prefetch!r}")
    return FSDPSpec(placement, int(dp_axis), bool(reshard_after_forward), int(prefetch))


def fully_shard(module: Module, placement, dp_axis: int = 0,
                reshard_after_forward: bool = True, prefetch: int = 1) -> Module:
    """Shard ``module``'s parameters along the data-parallel mesh axis ``dp_axis`` of
    ``placement`` (fully sharded data parallel, ZeRO-3; ZeRO-2 with
    ``reshard_after_forward=False``) and return it. See the module docstring for the
    design: each parameter is stored ``S(d)`` along ``dp_axis``, gathered just before the
    forward of the module that owns it and freed after it (or after its backward), and its
    gradient is reduce-scattered back to the shard in buckets. Feed the model a batch split
    along ``dp_axis`` (:func:`ctensor.nn.parallel.batch_sbp`). Results equal data
    parallelism's.

    ``prefetch`` (an int >= 0, default 1): how many modules ahead the gathers are started
    (``to_global(..., async_op=True)``) while the current module computes, in the forward
    and, with ZeRO-3, for the backward's gathers again; each adds at most one module's
    gathered parameters to the memory in flight. 0 gathers each module's parameters when
    it runs. The order is learned from the first forward (which gathers as it goes);
    calling again with only another ``prefetch`` changes it.

    Parameters already on ``placement`` keep their SBP on the other mesh axes (lay the
    model out tensor-parallel first: ``to_global`` with ``hybrid_parallel_rules``); others
    are moved to ``placement``, broadcast. A parameter already split along ``dp_axis`` is
    sharded by its own layout and kept as it is, never gathered, when it is the experts of
    an :class:`~ctensor.nn.MoE` split ``S(0)`` over an expert axis that is the data axis
    (expert parallelism with FSDP of the rest); any other SBP but broadcast there is an
    error. Call it once (again with the same arguments is
    a no-op); ``state_dict()`` and ``ct.save`` give full logical tensors, so checkpoints
    move between this and any other layout. A parameter must be used only inside the
    forward of the module that owns it. Collective.

    >>> mesh = ct.placement("cpu", [[0, 1], [2, 3]])              # (dp, tp)
    >>> model.to_global(mesh, nn.parallel.hybrid_parallel_rules(model))
    >>> nn.fully_shard(model, mesh, dp_axis=0)                    # ZeRO-3 x Megatron
    """
    fn = "fully_shard"
    spec = _spec(fn, module, placement, dp_axis, reshard_after_forward, prefetch)
    dp_axis = spec.dp_axis
    owners = _owners(module)
    for name, m in module.named_modules():
        unit = _units.get(m)
        if unit is not None and unit.spec is not None and \
                dataclasses.replace(unit.spec, prefetch=spec.prefetch) != spec:
            raise ValueError(f"{fn}: module {name or type(m).__name__!r} is already fully "
                             f"sharded as {unit.spec!r}, not as {spec!r}; shard a module "
                             f"once (build it anew to change how)")
    if owners and all(_unit(m).spec is not None for m in owners):
        for m in owners:  # the same layout again: at most another prefetch
            _unit(m).spec, _unit(m).schedule.prefetch = spec, spec.prefetch
        return module
    size = placement.shape[dp_axis]
    experts = {id(p) for m in module.modules() if isinstance(m, MoE) for p in (m.w1, m.w2)}
    plans, kept = [], set()
    for name, p in module.named_parameters():
        if p.placement == placement:
            current = p.sbp
            entry = current[dp_axis]
            if id(p) in experts and entry == ct.sbp.split(0):  # sharded by expert parallel
                kept.add(id(p))  # over an expert axis that is the data axis: kept as it is
                continue
            if not isinstance(entry, ct.sbp.Broadcast):
                raise ValueError(f"{fn}: parameter {name!r} is {ct.sbp.format_sbp(current)} "
                                 f"on {placement!r}, not broadcast along mesh axis {dp_axis} "
                                 f"(the data-parallel axis); lay it out with the other "
                                 f"axes' (tensor-parallel) SBPs only, broadcast along "
                                 f"{dp_axis}, before fully_shard (only an nn.MoE's experts "
                                 f"may be split there already: expert parallelism)")
        else:
            current = (B,) * placement.ndim
        plans.append((p, current, _stored_sbp(tuple(p.shape), current, dp_axis, size)))
    ct.debug.check_broadcast_data(dict(module.named_parameters()), fn, "parameter")
    for p, _, stored in plans:  # everything checked: now move
        p.reshard_(placement, stored)
    schedule = _Schedule(spec.prefetch)  # one order for the modules sharded together
    for m in owners:
        unit = _unit(m)
        unit.spec, unit.schedule = spec, schedule
        for pname, p in m.named_parameters(recurse=False, remove_duplicate=False):
            if isinstance(p.sbp[dp_axis], ct.sbp.Split) and id(p) not in kept:
                full = list(p.sbp)
                full[dp_axis] = B
                unit.full_sbp[pname] = tuple(full)
    return module


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
