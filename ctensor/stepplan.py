"""The step plan: learn a training step's op sequence once, choose every op's layouts
jointly, replay the choice on the steps that repeat it.

Eager dispatch chooses each op's signature alone (:mod:`ctensor.choice`): it cannot know
that the partial value it leaves will be needed whole by three later ops (the residual
stream of a model that writes RMSNorm as ``x * rsqrt(x.pow(2).mean(-1) + eps) * w`` is
reduced at ``pow``, again at ``mul`` and again at the next ``matmul``). A training loop runs
the same ops every step, so ctensor learns the step and plans it:

* **the step** — a window of op calls that ends where an outermost ``backward()`` ends
  (after its gradient buckets). The first window of a world starts at its first op that
  records autograd history (the first forward's first op: setup before it is not part of
  the loop); each later window starts where the previous one ended, so it holds the
  optimizer's update, ``zero_grad``, the forward and the backward;
* **record** — per call: the op, its attribute key, the input layouts, which *value* each
  input is (an earlier call's output, the copy an earlier call boxed one of its inputs to
  that its backward reads, or a tensor from outside the window), which inputs need a
  gradient or are parameters, and the layouts the call ran in; and which value each
  parameter's gradient is when the backward hands it to the buckets (observed by wrapping
  :meth:`ctensor.gradsync.Synchronizer.deposit`), with its destination layout. Every rank
  records the same window (layouts are global metadata);
* **solve** — only when the loop repeats: a window that runs the same calls (ops,
  attributes but an op's ``value_attrs``, input layouts) as one of the three before it is
  solved at its end (a script of one step never pays for a solve; a loop is planned after
  its second or third step, a period of 2-3, gradient accumulation, soon after).
  :func:`ctensor.stepsolve.solve` picks every call's signature to minimise the cost
  model's total (boxing each value once into each distinct layout its consumers take, plus
  compute), starting from the per-op choice; deterministic, so every rank plans alike.
  Parameters keep their layouts (moving one is priced as :mod:`ctensor.choice` prices it:
  never worth it);
* **replay** — on the next window each call still dispatches through its own signature
  table; only the candidate the choice takes comes from the plan (through the planner's
  advisor seam, :func:`ctensor.planner.set_advisor`). A guard compares each call with the
  plan's (op, attributes, which values, gradient bits, and the input layouts the *plan*
  expects there). The first difference — another op, shape, layout, a data-dependent
  branch — ends the replay for the rest of the window: later calls take the per-op choice
  (every candidate computes the same value, so nothing changes but where collectives run)
  and the deviation is counted. The next window follows the plan again (a one-off step —
  an evaluation, the epoch's short last batch, the update of gradient accumulation — costs
  no solve); a window that repeats one before it is learned anew, or given the plan solved
  for its sequence before (:data:`_SOLVED` are kept). After
  :data:`_GIVE_UP` windows in a row fail, the process stops planning (counted) until
  :func:`step_plan` is called again.

A plan that chooses what the per-op choice chooses at every call (a data-parallel step, where
each op's choice is already the best) leaves nothing to replay: the process then stops
recording (``idle`` in the report; each later step counts as replayed), so such a loop pays
for the step plan only during its first steps. It still counts each window's calls: four
windows in a row whose count is none of the first four idle ones' (another loop: a second
model) start recording again. ``ct.step_plan(True)`` learns again.

On by default (``CTENSOR_STEP_PLAN=0`` starts a process with it off); ``ct.step_plan(False)``
turns it off (and forgets the plan). A program whose windows never repeat (batches of
changing shapes) stops being recorded (``gave up``). What the plan
chose against the per-op choice, per call: :func:`ctensor.stepview.report`
(``ct.debug.step_plan()``).

How it plugs in: calls are observed by wrapping :func:`ctensor.dispatch.apply` (every op
front calls it through the module) and the step's end by wrapping
:func:`ctensor.autograd.backward`; the choice is changed only through the planner's advisor.
"""
from __future__ import annotations

import os
import time
import weakref
from typing import Optional

from . import autograd, dispatch, gradsync, planner, runtime
from . import timing as _profile
from .layout import same_shards
from .stepsolve import SolverCall as _SolverCall, idle_reason, solve

__all__ = ["step_plan", "enabled", "reset", "REPLAY_SECONDS_PER_CALL"]

#: whether a process starts with step planning on: unless ``CTENSOR_STEP_PLAN=0``. A recorded
#: op's dispatch costs about twice an unrecorded one's, so recording is bounded: a loop's
#: first steps, :data:`_NO_REPEAT` windows of a program that never repeats, and
#: :data:`_MAX_CALLS` calls (~0.7 KB each) of ops with grad and no ``backward()``
DEFAULT_ON = os.environ.get("CTENSOR_STEP_PLAN", "1") != "0"
_MAX_CALLS = 50_000  # a window longer than this is not recorded (no backward in sight)
_GIVE_UP = 3  # windows in a row that fail the plan (and repeat none before): stop planning
#: windows in a row that end unplanned: stop planning (a loop's first window, forward and
#: backward, differs from its second, update + forward + backward; the third repeats it)
_NO_REPEAT = 4
_SOLVED = 8  # plans kept for the sequences they were solved for (then forgotten, all)
#: what replaying a planned step costs per op call, on top of its dispatch (recording the
#: call, the guard, the advice; measured here: 12-15 us on a 2-core x86 machine): a plan
#: whose estimated saving per step is below ``calls x`` this is not followed by default
REPLAY_SECONDS_PER_CALL = 13e-6


class Call:
    """One recorded op call (see the module docstring)."""

    __slots__ = ("opdef", "attrs_key", "attrs", "layouts", "inputs", "req", "targets", "outs",
                 "fixed", "out_values", "out_shards", "transparent", "per_op")

    def __init__(self, opdef, attrs_key, attrs, layouts, inputs, req, targets, outs, fixed):
        self.opdef, self.attrs_key, self.attrs = opdef, attrs_key, attrs
        self.layouts, self.inputs, self.req = layouts, inputs, req
        self.targets, self.outs, self.fixed = targets, outs, fixed
        self.out_values = self.out_shards = ()
        self.transparent = False  # a composite: its inner calls take the inputs
        self.per_op = None  # while replayed: the per-op choice's signature per mesh axis


class _Plan:
    """A solved window: the calls, per call the chosen option and the per-op one, the
    input layouts the plan expects at each call."""

    def __init__(self, calls, values, deposits, chosen, per_op, totals, seconds):
        self.calls, self.values, self.deposits = calls, values, deposits
        self.chosen, self.per_op = chosen, per_op
        self.totals, self.seconds = totals, seconds
        layout = []
        for val in values:
            if val[0] == "ext":
                layout.append(val[1])
            elif val[0] == "to":
                layout.append(val[2])
            else:
                opt = chosen[val[1]]
                layout.append((opt.outs if val[0] == "out" else opt.targets)[val[2]])
        self.expected = [tuple(layout[v] for v in c.inputs) for c in calls]
        self.rows = None
        self.advise = [True] * len(calls)  # per call: advise (not once it chose as the plan)
        self.picks: list = [None] * len(calls)  # per call, the advisor's picks once seen
        self.sources = [_sources(values, c.inputs) for c in calls]  # (for the guard)


class _State:
    def __init__(self):
        self.enabled = DEFAULT_ON
        self.world = None
        self.started = False
        self.window = 0
        self.plan: Optional[_Plan] = None
        self.following = False
        self.always = False  # follow a plan whatever its saving (step_plan(always=True))
        self.idle = False  # the plan is not followed (stepsolve.idle_reason): unrecorded
        # while idle: the calls of this window, of the first _NO_REPEAT idle ones, windows
        # in a row unlike all of those (_NO_REPEAT of them: another loop, recorded again)
        self.idle_calls, self.idle_base, self.idle_changed = 0, [], 0
        self.failures = 0  # windows in a row that failed the plan
        self.unrepeated = 0  # windows in a row that ended with no plan
        self.stats = dict(learned=0, reused=0, replayed=0, deviations=0, gave_up=False,
                          idle=False, solve_seconds=0.0, last_deviation=None)
        self.solved: dict = {}  # window sequence (_shape) -> its plan, up to _SOLVED
        self.recent: list = []  # the last windows' sequences since a replay (_shape)
        self.depth = 0  # nested backward() calls
        self.inside = None  # the call being recorded (op, tensors)
        self._new_window()

    def _new_window(self):
        self.calls: list = []
        self.values: list = []
        self.ids: dict = {}  # id(tensor) -> (weakref, value)
        self.boxes: dict = {}  # (call, input) -> value
        self.frames: list = []  # the calls whose backward functions are running
        self.deposits: list = []  # (value, destination layout): gradients to the buckets
        self.overflow = False


_state = _State()
_advice: Optional[tuple] = None  # (op, layouts, signatures per axis, answered) for the planner


# ----------------------------------------------------------------------------- switches
def step_plan(enable: bool = True, *, always: bool = False) -> None:
    """Turn whole-step planning on or off (the default: :data:`DEFAULT_ON`). Either way the learned plan and
    the counters are forgotten. Call it alike on every rank.

    ``always``: follow a plan the cost model prices cheaper than the per-op choice even when
    its saving per step is below what replaying costs (:data:`REPLAY_SECONDS_PER_CALL` per
    call); by default such a plan is learned, reported and not followed.

    >>> ct.step_plan(False)     # every op chooses its layouts alone, as before
    """
    for name, value in (("enable", enable), ("always", always)):
        if not isinstance(value, bool):
            raise TypeError(f"step_plan: argument {name!r} must be a bool, got "
                            f"{type(value).__name__}")
    reset()
    _state.enabled, _state.always = enable, always
    _install(enable)


def enabled() -> bool:
    """Whether whole-step planning is on."""
    return _state.enabled


def reset() -> None:
    """Forget the plan, the window being recorded and the counters."""
    global _state
    was = _state.enabled, _state.always
    _state = _State()
    _state.enabled, _state.always = was


# ----------------------------------------------------------------------------- recording
def _value(t, st: _State) -> int:
    """The value ``t`` is in this window (a new external one on first sight). Inside the
    backward of call ``i`` (``st.frames``), one of ``i``'s inputs is what ``i`` saved of it
    (its boxed copy, or the input itself where it was not moved), and an unknown tensor is
    a saved output (detached) or a saved boxed copy, told apart by layout."""
    entry = st.ids.get(id(t))
    v = entry[1] if entry is not None and entry[0]() is t else None
    if st.frames:
        i = st.frames[-1]
        call = st.calls[i]
        if v is not None:
            return _box_value(st, i, call.inputs.index(v)) if v in call.inputs else v
        # a saved output is a detached view of an output: the same shards
        shards = id(t._shards)
        for k, o in enumerate(call.out_shards):
            if o == shards:
                return call.out_values[k]
        layout = t._layout
        for k, x in enumerate(call.layouts):
            if x.shape == layout.shape and x.dtype == layout.dtype and x is not layout:
                return _box_value(st, i, k)
    if v is not None:
        return v
    v = len(st.values)
    st.values.append(("ext", t._layout, bool(t.requires_grad and t._node is None)))
    st.ids[id(t)] = (weakref.ref(t), v)
    return v


def _box_value(st: _State, i: int, k: int) -> int:
    v = st.boxes.get((i, k))
    if v is None:
        v = st.boxes[(i, k)] = len(st.values)
        st.values.append(("box", i, k))
    return v


def _observed(apply):
    """``apply`` recorded (and, while a plan is followed, advised)."""

    def observed_apply(opdef, tensors, attrs, started=False):
        st = _state
        if started:  # a started move (to_global(..., async_op=True)): an outside value
            return apply(opdef, tensors, attrs, started=True)
        if not st.enabled or st.overflow or st.idle:
            st.idle_calls += 1
            return apply(opdef, tensors, attrs)
        if not st.calls:
            if st.started and runtime.world() is not st.world:
                reset()  # another world: what was learned is for the old one
                st = _state
            if not st.started:
                if not (autograd.grad_mode.enabled and
                        any(t.requires_grad for t in tensors)):
                    return apply(opdef, tensors, attrs)
                st.started, st.world = True, runtime.world()
        if len(st.calls) >= _MAX_CALLS:
            st.overflow, st.following = True, False
            return apply(opdef, tensors, attrs)
        inside = st.inside
        if inside is not None and inside[0] is opdef and inside[1] is tensors:
            return apply(opdef, tensors, attrs)  # the same call, re-entered (the profiler)
        st.inside = (opdef, tensors)
        own = _profile.on and _profile.enter(_profile.PLAN, "step plan")  # (the op: inside)
        try:
            return _record(apply, st, opdef, tensors, attrs)
        finally:
            st.inside = inside
            if own:
                _profile.leave()

    observed_apply.__wrapped__ = apply
    return observed_apply


def _record_move(apply, st: _State, opdef, tensors, attrs):
    """A ``to_global`` call: not a call of the sequence (its front skips it when the tensor
    is already where it is sent, so whether it runs depends on layouts), but a value: its
    input boxed to a fixed layout."""
    source = _value(tensors[0], st)
    out = apply(opdef, tensors, attrs)
    v = len(st.values)
    st.values.append(("to", source, out._layout))
    st.ids[id(out)] = (weakref.ref(out), v)
    return out


def _record(apply, st: _State, opdef, tensors, attrs):
    global _advice
    if opdef.name == "to_global":
        return _record_move(apply, st, opdef, tensors, attrs)
    layouts = tuple([t._layout for t in tensors])
    ids = st.ids  # (outside a backward function, a value seen before is _value inlined)
    inputs = tuple([_value(t, st) for t in tensors] if st.frames else [
        e[1] if (e := ids.get(id(t))) is not None and e[0]() is t else _value(t, st)
        for t in tensors])
    # (which inputs need a gradient decides what is recorded: only while grad mode is on)
    req = tuple([t.requires_grad for t in tensors]) if autograd.grad_mode.enabled else ()
    # (an op's value_attrs left out: the loop repeats whatever they are)
    attrs_key = planner._attrs_key(planner.choice_attrs(opdef, attrs)) if attrs else ()
    pos = len(st.calls)
    call = Call(opdef, attrs_key, attrs, layouts, inputs, req, None, None, False)
    st.calls.append(call)
    plan = st.plan if st.following else None
    if plan is not None and not _follows(plan, pos, call):
        st.following, plan = False, None
        st.stats["deviations"] += 1
        st.stats["last_deviation"] = (st.plan, pos, call, st.values)  # (stepview._why)
    # (the planner prices every candidate again while an advisor is installed: only the
    # calls where the plan differs from the per-op choice are advised after the first replay)
    advised = plan is not None and plan.advise[pos] and plan.chosen[pos].sigs is not None
    if advised:  # (op, layouts, signatures, -, per-op picks, picks made, picks known before)
        _advice = [opdef, layouts, plan.chosen[pos].sigs, False, [], [], plan.picks[pos]]
        advice = _advice
        previous = planner.set_advisor(_advisor)
    try:
        out = apply(opdef, tensors, attrs)
    finally:
        if advised:
            planner.set_advisor(previous)
            if len(advice[4]) == len(advice[2]):
                call.per_op = tuple(advice[4])
                plan.advise[pos] = call.per_op != advice[2]
                plan.picks[pos] = tuple(advice[5])
            elif advice[6] is not None:  # served from the planner's cache: as before
                call.per_op = plan.calls[pos].per_op
            _advice = None
    _finish(st, call, pos, opdef, out if type(out) is tuple else (out,))
    return out


def _finish(st: _State, call: Call, pos: int, opdef, outs) -> None:
    """Note what the call ran in and its outputs; own its backward."""
    if len(st.calls) > pos + 1:  # a composite: its inner calls ran (and recorded) it
        call.outs = tuple([o._layout for o in outs])
        call.fixed, call.transparent = True, True
        call.targets = call.layouts
        return
    fixed = opdef.fixed_layout
    if fixed is not None:
        call.fixed = True
        call.targets = fixed(call.layouts, **call.attrs)[0]
    values, ids = st.values, st.ids
    if len(outs) == 1:  # (the common case, unrolled)
        o = outs[0]
        call.outs = (o._layout,)
        v = len(values)
        values.append(("out", pos, 0))
        ids[id(o)] = (weakref.ref(o), v)
        call.out_values, call.out_shards = (v,), (id(o._shards),)
    else:
        call.outs = tuple([o._layout for o in outs])
        made = []
        for k, o in enumerate(outs):
            made.append(len(values))
            values.append(("out", pos, k))
            ids[id(o)] = (weakref.ref(o), made[-1])
        call.out_values = tuple(made)
        call.out_shards = tuple([id(o._shards) for o in outs])
    if outs and outs[0].requires_grad:
        node = outs[0]._node
        if node is not None and node.backward_fn is not None and \
                type(node.backward_fn) is not _Owned:
            node.backward_fn = _Owned(node.backward_fn, pos, st.window)


class _Owned:
    """A node's backward function run with call ``pos`` as the owner of what it reads."""

    __slots__ = ("backward_fn", "pos", "window")

    def __init__(self, backward_fn, pos: int, window: int):
        self.backward_fn, self.pos, self.window = backward_fn, pos, window

    def __call__(self, grads):
        st = _state
        if st.window != self.window or not st.started or self.pos >= len(st.calls):
            return self.backward_fn(grads)
        _known(st, self.pos, grads, getattr(self.backward_fn, "inputs", ()))
        st.frames.append(self.pos)
        try:
            return self.backward_fn(grads)
        finally:
            st.frames.pop()


def _known(st: _State, pos: int, grads, saved) -> None:
    """Name by identity what call ``pos``'s backward reads, leaving :func:`_value`'s guess
    by layout to what it cannot see: an unseen incoming gradient (the seed) is an outside
    value; a saved input that is not the input itself is the call's boxed copy of it (a
    loss's sum and its count, alike in shape and dtype, were told apart wrongly)."""
    ids, call = st.ids, st.calls[pos]
    for k, t in [(None, g) for g in grads] + list(enumerate(saved[:len(call.inputs)])):
        entry = ids.get(id(t))
        if getattr(t, "_shards", None) is None or (entry is not None and entry[0]() is t):
            continue
        v = _box_value(st, pos, k) if k is not None else len(st.values)
        if k is None:
            st.values.append(("ext", t._layout, False))
        ids[id(t)] = (weakref.ref(t), v)


def _follows(plan: _Plan, pos: int, call: Call) -> bool:
    """The replay guard: whether ``call`` is the plan's call ``pos`` in the layouts the
    plan expects there."""
    if pos >= len(plan.calls):
        return False
    rec = plan.calls[pos]
    if rec.opdef is not call.opdef or rec.req != call.req or rec.attrs_key != call.attrs_key:
        return False
    expected = plan.expected[pos]  # (layouts are interned: == is identity)
    if call.layouts != expected and not all(map(same_shards, call.layouts, expected)):
        return False
    return plan.sources[pos] == _sources(_state.values, call.inputs)


def _sources(values: list, inputs: tuple) -> tuple:
    """Where each input comes from, comparable across windows: an earlier call's output or
    boxed input by position, or "outside the window"; through ``to_global`` (its layout is
    checked apart)."""
    out = []
    for v in inputs:
        val = values[v]
        while val[0] == "to":
            val = values[val[1]]
        # (a saved boxed copy read in a backward and a tensor from outside are one kind:
        # which a backward reads depends on the layouts the forward ran in, and the
        # layouts are checked apart)
        out.append(val if val[0] == "out" else "ext")
    return tuple(out)


def _advisor(opcall, choice):
    """The planner's advisor while a planned call runs: the plan's signature per axis
    (asked before any inner call of the op can run; it answers the one call only, and
    :func:`_record` removes it when the call returns)."""
    global _advice
    advice = _advice
    if advice is None or opcall.op is not advice[0] or opcall.layouts != advice[1]:
        return None
    sigs = advice[2]
    advice[4].append(choice.picked)
    if choice.axis == len(sigs) - 1:  # answered: an inner call of the op is not advised
        _advice = None
    sig = sigs[choice.axis]
    taken = None if sig == choice.picked or sig not in choice.candidates else sig
    advice[5].append(None if taken is None else choice.candidates.index(taken))
    return taken


def _picks_for(op, layouts):
    """The planner's question ahead of pricing (:func:`ctensor.planner.plan_for`): the picks
    this advice will make, once a replay has seen them at this call."""
    advice = _advice
    if advice is None or op is not advice[0] or layouts != advice[1]:
        return None
    return advice[6]


_advisor.picks_for = _picks_for


# ----------------------------------------------------------------------------- the step's end
def _observed_backward(backward):
    """``autograd.backward`` whose outermost end closes the step's window."""

    def observed_backward(*args, **kwargs):
        st = _state
        st.depth += 1
        ok = False
        try:
            out = backward(*args, **kwargs)
            ok = True
            return out
        finally:
            st.depth -= 1
            if st.depth == 0 and st is _state:
                _step_end(st, ok)

    observed_backward.__wrapped__ = backward
    return observed_backward


def _step_end(st: _State, ok: bool) -> None:
    if not st.enabled or not st.started:
        return
    if st.idle:  # the plan is not followed: steps run the per-op choice, unrecorded
        st.stats["replayed"] += ok and st.idle == "same"
        calls, st.idle_calls = st.idle_calls, 0
        if len(st.idle_base) < _NO_REPEAT:  # (the loop's kinds of windows: accumulation's)
            st.idle_base.append(calls)
        else:
            st.idle_changed = st.idle_changed + 1 if calls not in st.idle_base else 0
        if st.idle_changed >= _NO_REPEAT:  # another loop than the one learned: record it
            st.idle = st.stats["idle"] = False
            st.plan, st.following, st.unrepeated, st.recent = None, False, 0, []
        return
    plan = st.plan
    if ok and plan is not None and st.following and len(st.calls) == len(plan.calls):
        st.stats["replayed"] += 1
        st.failures, st.recent = 0, []
    elif ok and st.calls and not st.overflow:
        if plan is not None:
            if st.following:  # it ended early
                st.stats["deviations"] += 1
            st.failures += 1  # (the plan is kept: the next window follows it again)
        shape = _shape(st.calls)
        if shape not in st.recent and shape not in st.solved:
            st.recent = [shape] + st.recent[:_NO_REPEAT - 2]
        else:  # the loop repeats (a period of 1-3 windows), or a solved kind of step is back
            st.plan = _learn(st, shape)
            st.idle = st.stats["idle"] = idle_reason(st.calls, st.plan, st.always,
                                                     REPLAY_SECONDS_PER_CALL)
            st.idle_calls, st.idle_base, st.idle_changed = 0, [], 0
            st.unrepeated, st.failures, st.recent = 0, 0, []
    else:
        st.recent = []
    st.unrepeated += st.plan is None
    if st.failures >= _GIVE_UP or st.unrepeated >= _NO_REPEAT:  # stop recording
        st.enabled = False
        st.stats["gave_up"] = True
    st.window += 1
    st._new_window()
    st.following = st.plan is not None


def _shape(calls: list) -> tuple:
    """What two windows must share for the loop to count as repeating: per call the op,
    its attributes and input layouts."""
    return tuple((c.opdef, c.attrs_key, c.layouts) for c in calls)


def _learn(st: _State, shape: tuple) -> _Plan:
    """The window's plan: the one solved for this sequence before (each kind of step of a
    loop that alternates between kinds is solved once), or solved now."""
    plan = st.solved.get(shape)
    if plan is not None:
        st.stats["reused"] += 1
        return plan
    start = time.perf_counter()
    own = _profile.on and _profile.enter(_profile.PLAN, "step plan solve")
    try:
        chosen, per_op, totals = solve([_SolverCall(c) for c in st.calls], st.values,
                                       st.deposits)
    finally:
        if own:
            _profile.leave()
    seconds = time.perf_counter() - start
    st.stats.update(learned=st.stats["learned"] + 1, solve_seconds=seconds)
    if len(st.solved) >= _SOLVED:
        st.solved.clear()
    # (the window's own lists: the next window starts new ones)
    plan = _Plan(st.calls, st.values, st.deposits, chosen, per_op, totals, seconds)
    st.solved[shape] = plan
    return plan


def _observed_deposit(deposit):
    """``Synchronizer.deposit`` that notes which recorded value goes to the buckets and
    where (the leaf's gradient layout): the solver prices the gradient synchronisation
    (:func:`ctensor.stepsolve.solve`)."""

    def observed_deposit(sync, leaf, g):
        st = _state
        if st.enabled and st.started and not st.idle and sync.sync and leaf.grad is None \
                and g.dtype == leaf.dtype:
            entry = st.ids.get(id(g))
            if entry is not None and entry[0]() is g:
                st.deposits.append(
                    (entry[1], getattr(leaf, "_grad_layout", None) or leaf._layout))
        return deposit(sync, leaf, g)

    observed_deposit.__wrapped__ = deposit
    return observed_deposit


# ----------------------------------------------------------------------------- installation
_plain_apply = getattr(dispatch.apply, "__wrapped__", dispatch.apply)
_observed_apply = _observed(_plain_apply)
_plain_deposit = getattr(gradsync.Synchronizer.deposit, "__wrapped__",
                         gradsync.Synchronizer.deposit)
_observed_deposit_fn = _observed_deposit(_plain_deposit)


def _install(on: bool) -> None:
    """Observe ``dispatch.apply`` (and the gradients' deposits) only while step planning is
    on: off, every op calls the plain one (the wrapper's call and tests cost ~0.1-0.2 us per
    op, benchmarks/dispatch.py)."""
    dispatch.apply = _observed_apply if on else _plain_apply
    gradsync.Synchronizer.deposit = _observed_deposit_fn if on else _plain_deposit


_install(_state.enabled)
if not hasattr(autograd.backward, "__wrapped__"):
    autograd.backward = _observed_backward(autograd.backward)
