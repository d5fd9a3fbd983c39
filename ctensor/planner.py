"""The planner: which layouts one op call runs in, decided once per :class:`OpCall`.

An :class:`OpCall` is the value that holds every input to the decision: the op, its
attributes (in a hashable form), the input layouts, which inputs need a gradient, which are
parameters (pinned), which are one tensor, the default dtype, and the autograd state the
choice weighs (the gradient destinations of the backward function that is running). Nothing
else is read: :func:`plan` is a pure function of the call, so its result is cached by the
call's value (:attr:`OpCall.key`).

:func:`plan` returns an :class:`OpPlan`: the input layouts after boxing, the output
layouts, which inputs move (and whether their boxing only views them), or that the op's
composite runs instead. The per-mesh-axis signature choice is :func:`ctensor.choice.choose`.

**The advisor seam** (a whole-step plan plugs in here): :func:`set_advisor` installs one
callable ``advisor(call: OpCall, choice: AxisChoice) -> Optional[Signature]`` that the
planner consults for every mesh axis of every planned call. ``choice`` holds the candidate
signatures of that axis, their estimated costs, and the one the cost model picked; the
advisor returns ``None`` to keep it, or another candidate of the same list to take instead.
While an advisor is installed the planner asks it on every call, including calls whose
choice is cached, so an advisor may answer the same call differently at different points
of a step; the plans it leads to are cached per (call, picks). Installing or removing an
advisor leaves the cost-only cache as it is.

>>> def prefer_split(call, choice):            # take a split output whenever one is offered
...     for cand in choice.candidates:
...         if any(type(o).__name__ == "Split" for o in cand.outputs):
...             return cand
>>> previous = ct.planner.set_advisor(prefer_split)
>>> ...
>>> ct.planner.set_advisor(previous)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from . import boxing
from . import cost as cost_model
from . import runtime
from .arrays import array_module
from .choice import choose
from .operands import same_placement

__all__ = ["OpCall", "OpPlan", "AxisChoice", "plan", "plan_for", "set_advisor", "advisor",
           "clear", "choice_attrs"]


@dataclass(frozen=True)
class OpCall:
    """One op call as the planner sees it (every input to the layout decision).

    ``grads``: bit ``i`` set when input ``i`` needs a gradient (and the op will be recorded);
    ``pinned``: bit ``i`` set when input ``i`` is a parameter (or a cast of one);
    ``same[i]``: the index of the first input that is the same tensor as input ``i``;
    ``destinations``: while a backward function runs, where its gradients are headed
    (``ctensor.autograd.grad_mode.destinations``), else None. ``attrs`` is the attribute dict as
    the op receives it (not compared: ``attrs_key`` is its hashable form).
    """

    op: Any
    attrs_key: tuple
    layouts: tuple
    destinations: Any = None
    grads: int = 0
    pinned: int = 0
    same: tuple = ()
    default_dtype: Any = None
    attrs: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def key(self) -> tuple:
        """The cache key: the call's value as a tuple (what :func:`plan_for` builds)."""
        return (self.op, self.default_dtype, self.attrs_key, self.layouts, self.destinations,
                self.grads, self.pinned, self.same)


@dataclass(frozen=True)
class AxisChoice:
    """What the advisor sees of one mesh axis's choice: the candidate signatures (in
    declaration order), the estimated seconds of each, and the one the cost model picked
    (the cheapest, ties to the earlier declared)."""

    axis: int
    candidates: tuple
    costs: tuple
    picked: Any


class OpPlan:
    """What one :class:`OpCall` resolves to, computed once: the input layouts after boxing
    (``targets``), the output layouts, which inputs move (``moved``) and whether each
    boxing only views its input (``aliases``), or ``composite`` (the op's composite runs).

    ``keeps`` is reserved for the tape (:func:`ctensor.tape.record`): what it keeps of this
    plan's ops, worked out on the first recorded run. ``verified`` and ``xp`` belong to the
    array executor (:mod:`ctensor.executor`): whether a run has checked the kernel's local
    shapes, and the array module."""

    __slots__ = ("call", "targets", "out_layouts", "single", "composite", "aliases", "moved",
                 "unrolled", "verified", "keeps", "grows", "picks", "xp", "_shapes")

    def __init__(self, call: OpCall, targets: tuple, out_layouts: tuple, composite: bool):
        op = call.op
        self.call, self.targets, self.out_layouts = call, targets, out_layouts
        self.composite = composite
        self.single = op.n_outputs == 1
        self.keeps = None
        self.grows = None  # the moved inputs whose boxing gathers (more bytes per rank)
        # the common case the array executor runs unrolled: one output, no kernel
        # context, one or two inputs
        self.unrolled = self.single and not op.needs_ctx and len(call.layouts) <= 2
        self.verified = False
        self.picks = ()  # per mesh axis, the candidate index an advisor took (None: kept)
        self.xp = self._shapes = None
        if composite:
            self.aliases, self.moved = (), ()
            return
        layouts = call.layouts
        self.moved = tuple(i for i, (l, t) in enumerate(zip(layouts, targets)) if l is not t)
        self.aliases = tuple(l is not t and boxing.aliases(l, t)
                             for l, t in zip(layouts, targets))
        try:
            self.xp = array_module(out_layouts[0].placement.device)
        except RuntimeError:
            # (a GPU placement on a machine without CuPy: only a shape-only run can get
            # here, and it runs no kernel; the array executor raises this again)
            self.xp = None

    @property
    def shapes(self) -> dict:
        """Per rank, each output's local shape (computed when first needed)."""
        if self._shapes is None:
            p = self.out_layouts[0].placement
            self._shapes = {r: tuple(l.local_shape(r) for l in self.out_layouts)
                            for r in p.rank_list}
        return self._shapes

    def __repr__(self) -> str:
        if self.composite:
            return f"<plan {self.call.op.name}: composite>"
        return f"<plan {self.call.op.name}: {self.targets} -> {self.out_layouts}>"


_cache: dict = {}  # OpCall.key -> OpPlan (cost-only choices)
#: where :func:`ctensor.dispatch.apply` looks a call up (by the key :func:`plan_for` builds)
#: before calling :func:`plan_for`: the cost-only cache, or, while an advisor is installed,
#: an empty dict (every call then reaches plan_for, which asks the advisor)
hits: dict = _cache
_NO_HITS: dict = {}  # (stays empty)
_advised: dict = {}  # (OpCall.key, picks) -> OpPlan (choices an advisor changed)
_advisor: Optional[Callable] = None


def plan(call: OpCall) -> OpPlan:
    """The plan of ``call`` (not cached here: :func:`plan_for` caches it), asking the
    installed advisor, if any, on each mesh axis. Validates the inputs (one placement, the
    op's shape rule) and raises ``ValueError``/``TypeError`` before any communication."""
    op, layouts, attrs = call.op, call.layouts, call.attrs
    if op.fixed_layout is not None:
        targets, outs = op.fixed_layout(layouts, **attrs)
        return OpPlan(call, targets, outs, False)
    same_placement(op.name, [l.placement for l in layouts])
    out_meta = op.meta(layouts, **attrs)
    picks, advisor_fn = [], _advisor
    if advisor_fn is None:
        advise = None
    else:
        def advise(axis, candidates, costs, picked):
            chosen = advisor_fn(call, AxisChoice(axis, tuple(candidates), tuple(costs), picked))
            if chosen is not None and chosen not in candidates:
                raise ValueError(f"{op.name}: the plan advisor returned {chosen!r}, which is "
                                 f"not one of the candidates of mesh axis {axis} "
                                 f"({list(candidates)}); return one of them or None")
            picks.append(None if chosen is None else candidates.index(chosen))
            return chosen
    made = OpPlan(call, *choose(op, layouts, attrs, out_meta, call.destinations, call.grads,
                                call.pinned, call.same, advise))
    made.picks = tuple(picks)
    return made


def plan_for(op, attrs: dict, layouts: tuple, destinations, grads: int, pinned: int,
             same: tuple) -> OpPlan:
    """The cached plan of one call (what :func:`ctensor.dispatch.apply` calls when
    :data:`hits` has not got the call's key, which is built here and there alike, except
    that here an op's ``value_attrs`` are left out: no choice depends on them, so a call
    that differs in them alone, as an optimizer's learning rate and step do from step to
    step, takes the plan made before): a dict lookup by the call's value, :func:`plan` on a
    miss (and on every call while an advisor is installed: the plan its picks lead to is
    then cached per picks; an advisor with a ``picks_for(op, layouts)`` attribute that
    returns the picks it will make — per mesh axis the candidate index, None where it keeps
    the cost model's — is served from that cache without pricing the candidates again)."""
    keyed = choice_attrs(op, attrs)
    key = (op, runtime._default_dtype, tuple(keyed.items()) if keyed else (), layouts,
           destinations, grads, pinned, same)
    try:
        hit = _cache.get(key)
    except TypeError:  # an unhashable attribute (a list, an array): its frozen form
        key = (op, key[1], _attrs_key(keyed), *key[3:])
        hit = _cache.get(key)
    if hit is not None and _advisor is None:
        return hit
    if _advisor is not None:  # an advisor that knows its picks ahead skips the pricing
        ahead = getattr(_advisor, "picks_for", None)
        picks = ahead(op, layouts) if ahead is not None else None
        if picks is not None:
            hit = _advised.get((key, picks))
            if hit is not None:
                return hit
    made = plan(OpCall(op, key[2], layouts, destinations, grads, pinned, same, key[1], attrs))
    cache = _cache
    if _advisor is not None:
        cache, key = _advised, (key, made.picks)
        hit = cache.get(key)
        if hit is not None:  # (the one object per call and picks: its run state is kept)
            return hit
    if len(cache) > 65536:
        cache.clear()
    cache[key] = made
    return made


def set_advisor(advisor_fn: Optional[Callable]) -> Optional[Callable]:
    """Install ``advisor_fn(call, choice) -> Optional[Signature]`` (see the module
    docstring; None removes it) and return the one it replaces."""
    global _advisor
    if advisor_fn is not None and not callable(advisor_fn):
        raise TypeError(f"set_advisor: expected a callable or None, got "
                        f"{type(advisor_fn).__name__}")
    global hits
    previous, _advisor = _advisor, advisor_fn
    hits = _cache if advisor_fn is None else _NO_HITS
    return previous


def advisor() -> Optional[Callable]:
    """The installed advisor, or None."""
    return _advisor


def clear() -> None:
    """Forget every cached plan (the machine description changed)."""
    _cache.clear()
    _advised.clear()


cost_model.on_change(clear)


# --------------------------------------------------------------------------- attributes
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


def choice_attrs(op, attrs: dict) -> dict:
    """``attrs`` less ``op``'s ``value_attrs`` (read by its kernel only, no choice depends
    on them): what a call's plan is keyed by, here and in the step plan."""
    free = op.value_attrs
    return {k: v for k, v in attrs.items() if k not in free} if attrs and free else attrs


def _attrs_key(attrs: dict) -> tuple:
    """A hashable key of the op attributes (fronts pass them in a fixed order)."""
    key = tuple(attrs.items())
    try:
        hash(key)
        return key
    except TypeError:
        return tuple((k, _freeze(v)) for k, v in attrs.items())
