"""The step plan's solver: every recorded op call's signature chosen jointly.

Input: the calls of one recorded step (:class:`Call`, from :mod:`ctensor.stepplan`), each
with the *value* each input is (an earlier call's output, the copy an earlier call boxed
one of its inputs to — what its backward reads —, or an external tensor of fixed layout).
A call's **options** are its op's declared signatures, one per mesh axis combined (capped:
beyond :data:`_MAX_OPTIONS` combinations only one axis at a time differs from the per-op
choice). The total the solver minimises is the cost model's (:mod:`ctensor.cost`, through
:func:`ctensor.boxing.cost` and :func:`ctensor.cost.compute`, the terms
:mod:`ctensor.choice` prices):

* per call, the kernel's compute on the largest shard in the option's layouts;
* per value, boxing it once into each *distinct* layout its consumers take it in (dispatch
  keeps one boxed copy per tensor and target, so a partial value needed whole by three
  consumers is reduced once); moving a parameter costs ``choice._PINNED``;
* the gradient synchronisation: each parameter's gradient (a *deposit*: the value and the
  layout its ``.grad`` takes) joins the bucket of the reduction it needs, one collective
  per bucket (:class:`_Sync`), or is boxed on its own. (On a (data, tensor) mesh a norm
  weight's gradient left partial on the tensor axis needs a bucket of its own.)

The search is an iterated local search from the per-op choice (what eager dispatch picked
while the step was recorded), in the spirit of OneFlow's auto-parallel SBP search: a move
sets one call's option and then re-chooses, greedily and in program order, each later call
whose inputs it changed (a bounded cascade: changing a producer is only worth something if
its consumers follow); the move is kept when the total falls. Besides: all consumers of a
value to one layout (one boxed copy), the producers of a communicating input to make it
directly, and every member of one bucket into the layout of another (a bucket's latency
is saved only with its last member, which no single move sees). A single move dearer for
the call itself both with and without its outputs' boxing is not tried. Sweeps over the
calls repeat until one finds nothing (or :data:`_SWEEPS`). Each move touches a bounded
neighbourhood, so a sweep is linear in the calls. Deterministic: lists and program order
only (no set or hash order), so every rank, given the same record, makes the same plan.
"""
from __future__ import annotations

import heapq
import itertools
from typing import Optional

import numpy as np

from . import boxing
from . import cost as cost_model
from .choice import _PINNED
from .gradsync import _reduction, bucket_size
from .layout import Layout
from .sbp import Broadcast, partial_sum

__all__ = ["solve", "options_of", "same_choice", "idle_reason", "SolverCall"]

_MAX_OPTIONS = 16  # per call: beyond this many per-axis combinations, one axis at a time
_CASCADE = 24  # calls re-chosen by one move at most
_SWEEPS = 4
_PULL_DEPTH = 8  # producers a pull move walks up at most
_MOVES_PER_CALL = 6  # the search's budget: tried moves per recorded call
_TOL = 1e-12  # seconds: a move must gain more than this


class Option:
    """One way to run a call: per mesh axis the signature (``picks``, indices into that
    axis's candidate list), the input layouts after boxing, the output layouts, and the
    kernel's estimated seconds."""

    __slots__ = ("picks", "sigs", "targets", "outs", "compute")

    def __init__(self, picks, sigs, targets, outs, compute):
        self.picks, self.sigs = picks, sigs
        self.targets, self.outs, self.compute = targets, outs, compute


def _candidates(opdef, layouts, attrs, ndim):
    if opdef.per_axis:
        return [list(opdef.signatures(layouts, mesh_axis=a, **attrs)) for a in range(ndim)]
    cands = list(opdef.signatures(layouts, **attrs))
    return [cands] * ndim


def _option(opdef, layouts, attrs, out_meta, axis_cands, picks) -> Optional[Option]:
    placement = layouts[0].placement
    in_sbp = [list(l.sbp) for l in layouts]
    out_sbp = [[None] * placement.ndim for _ in out_meta]
    for axis, p in enumerate(picks):
        cand = axis_cands[axis][p]
        if cand.composite:
            return None
        for i in range(len(layouts)):
            in_sbp[i][axis] = cand.inputs[i]
        for j in range(len(out_meta)):
            out_sbp[j][axis] = cand.outputs[j]
    targets = tuple(l.with_sbp(tuple(s)) for l, s in zip(layouts, in_sbp))
    outs = tuple(Layout(tuple(shape), np.dtype(dtype), placement, tuple(s))
                 for (shape, dtype), s in zip(out_meta, out_sbp))
    seconds = 0.0
    if not opdef.view:
        flops, nbytes = cost_model.kernel_work(opdef, targets, outs, attrs)
        seconds = cost_model.compute(placement.device, nbytes, flops)
    sigs = tuple(axis_cands[axis][p] for axis, p in enumerate(picks))
    return Option(tuple(picks), sigs, targets, outs, seconds)


def options_of(call) -> tuple:
    """``(options, index of the recorded choice)`` of one recorded call. A call whose
    layouts are fixed (an explicit redistribution, a composite) has its one option; the
    recorded choice is the option whose outputs are the ones the call gave (ties: the one
    that boxes fewest inputs, then the earlier declared)."""
    layouts = call.layouts
    if call.fixed or not layouts:
        return [Option(None, None, call.targets, call.outs, 0.0)], 0
    opdef, attrs = call.opdef, call.attrs
    ndim = layouts[0].placement.ndim
    axis_cands = _candidates(opdef, layouts, attrs, ndim)
    out_meta = [(l.shape, l.dtype) for l in call.outs]
    recorded = tuple(_recorded_pick(cands, axis, call) for axis, cands in enumerate(axis_cands))
    if None in recorded:
        return [Option(None, None, layouts, call.outs, 0.0)], 0
    mesh = layouts[0].placement.shape
    if 1 in mesh:  # (an axis of one rank: every signature holds the same data; keep its label)
        axis_cands = [c if n > 1 else [c[r]] for c, n, r in zip(axis_cands, mesh, recorded)]
        recorded = tuple(r if n > 1 else 0 for n, r in zip(mesh, recorded))
    sizes = [len(c) for c in axis_cands]
    if int(np.prod(sizes)) <= _MAX_OPTIONS:
        combos = itertools.product(*[range(s) for s in sizes])
    else:
        combos = [recorded] + [recorded[:a] + (p,) + recorded[a + 1:]
                               for a in range(ndim) for p in range(sizes[a])
                               if p != recorded[a]]
    options, chosen = [], None
    for picks in combos:
        opt = _option(opdef, layouts, attrs, out_meta, axis_cands, tuple(picks))
        if opt is None:
            continue
        if tuple(picks) == recorded:
            chosen = len(options)
        options.append(opt)
    if chosen is None:
        return [Option(None, None, layouts, call.outs, 0.0)], 0
    return options, chosen


def _recorded_pick(cands, axis, call):
    best, best_moved = None, None
    for p, c in enumerate(cands):
        if c.composite or any(o.sbp[axis] != e for o, e in zip(call.outs, c.outputs)):
            continue
        moved = sum(l.sbp[axis] != e for l, e in zip(call.layouts, c.inputs))
        if best is None or moved < best_moved:
            best, best_moved = p, moved
    return best


def same_choice(call, per_op, chosen) -> bool:
    """Whether the plan runs the recorded ``call`` as the per-op choice does, where it
    matters: the same signature on every mesh axis of more than one rank (on an axis of
    one, split, broadcast and partial hold the same data)."""
    if chosen is per_op or chosen.sigs is None or per_op.sigs is None:
        return True
    mesh = call.layouts[0].placement.shape if call.layouts else ()
    return all(a is b or (a.inputs, a.outputs) == (b.inputs, b.outputs) or
               (axis < len(mesh) and mesh[axis] == 1)
               for axis, (a, b) in enumerate(zip(per_op.sigs, chosen.sigs)))


def idle_reason(calls, plan, always: bool, replay_seconds: float):
    """Why ``plan`` (solved for the recorded ``calls``) is not followed, or False:
    ``"same"`` where it runs every call as the per-op choice does (a data-parallel step,
    say); ``"small"`` where its estimated saving per step does not pay for replaying it
    (``replay_seconds`` a call; unless ``always``). Either way the step plan stops
    recording, so the loop pays nothing for it from there on."""
    if all(same_choice(c, p, q) for c, p, q in zip(calls, plan.per_op, plan.chosen)):
        return "same"
    planned, per_op = plan.totals
    if not always and per_op - planned <= len(calls) * replay_seconds:
        return "small"
    return False


class SolverCall:
    """What the solver reads of a recorded call (:class:`ctensor.stepplan.Call`): its op,
    attributes, input layouts, the layouts it ran in, whether they are fixed, and the values
    it takes (None for a composite, whose inner calls take them)."""

    __slots__ = ("opdef", "attrs", "layouts", "targets", "outs", "fixed", "inputs")

    def __init__(self, call):
        self.opdef, self.attrs, self.layouts = call.opdef, call.attrs, call.layouts
        self.targets, self.outs, self.fixed = call.targets, call.outs, call.fixed
        self.inputs = None if call.transparent else call.inputs


class _Problem:
    """The calls as integers: values, their consumers, the current option per call."""

    def __init__(self, calls, values, deposits=()):
        self.opts, self.cur = [], []
        for call in calls:
            opts, chosen = options_of(call)
            self.opts.append(opts)
            self.cur.append(chosen)
        self.recorded = list(self.cur)
        # values: ("ext", layout, pinned) | ("out", i, k) | ("box", i, k) |
        # ("to", source value, layout)
        self.values = values
        self.inputs = [call.inputs for call in calls]
        self.consumers = [[] for _ in values]
        self.produced = [[] for _ in calls]
        # a value moved by to_global: its source is boxed to the fixed layout once more
        self.moves = [[] for _ in values]
        for v, val in enumerate(values):
            if val[0] in ("out", "box"):
                self.produced[val[1]].append(v)
            elif val[0] == "to":
                self.moves[val[1]].append(val[2])
        for i, ins in enumerate(self.inputs):
            if ins is None:
                continue
            for k, v in enumerate(ins):
                self.consumers[v].append((i, k))
        # a parameter's gradient on its way to the buckets: priced as the synchronisation
        # prices it (see _Sync); another output no recorded call takes (the loss) leaves
        # the step: it is charged the move back to the layout the per-op choice gave it
        self.sync = _Sync(deposits)
        for v, val in enumerate(values):
            if val[0] == "out" and not self.consumers[v] and not self.moves[v] and \
                    v not in self.sync.target:
                self.moves[v].append(self.opts[val[1]][self.cur[val[1]]].outs[val[2]])
        self._box_cost: dict = {}
        self.edge = [self.edge_cost(v) for v in range(len(values))]
        self.sync.fixed(self.layout)  # (notes each gradient's bucket, for _Sync.changed)

    def layout(self, v):
        val = self.values[v]
        if val[0] == "ext":
            return val[1]
        if val[0] == "to":
            return val[2]
        opt = self.opts[val[1]][self.cur[val[1]]]
        return (opt.outs if val[0] == "out" else opt.targets)[val[2]]

    def box(self, src, dst) -> float:
        key = (src, dst)
        hit = self._box_cost.get(key)
        if hit is None:
            hit = boxing.cost(src, dst) + 1e-12
            self._box_cost[key] = hit
        return hit

    def edge_cost(self, v) -> float:
        """Seconds of boxing value ``v`` into each distinct layout its consumers take."""
        src = self.layout(v)
        opts, cur = self.opts, self.cur
        seen, total = None, 0.0
        for i, k in self.consumers[v]:
            t = opts[i][cur[i]].targets[k]
            if t is src or (seen is not None and t in seen):
                continue
            if seen is None:
                seen = [t]
            else:
                seen.append(t)
            total += self.box(src, t)
        for t in self.moves[v]:
            if t is not src and (seen is None or t not in seen):
                seen = [t] if seen is None else seen + [t]
                total += self.box(src, t)
        if seen is not None and self.values[v][0] == "ext" and self.values[v][2]:
            total += sum(_PINNED for t in seen if boxing.communicates(src, t))
        if v in self.sync.target:
            total += self.sync.member(src, self.sync.target[v], self.box)
        return total

    def local(self, i, o, outputs: bool = True) -> float:
        """Call ``i``'s own share with option ``o``: its compute, the boxing of its inputs
        (with what other consumers take), and (``outputs``) its outputs' boxing into what
        their consumers take now."""
        saved = self.cur[i]
        self.cur[i] = o
        total = self.opts[i][o].compute
        if self.inputs[i] is not None:
            for v in dict.fromkeys(self.inputs[i]):
                total += self.edge_cost(v)
        if outputs:
            for v in self.produced[i]:
                total += self.edge_cost(v)
        self.cur[i] = saved
        return total

    def total(self) -> float:
        return sum(self.opts[i][c].compute for i, c in enumerate(self.cur)) + \
            sum(self.edge) + self.sync.fixed(self.layout)


class _Sync:
    """The gradient synchronisation at the step's end (:mod:`ctensor.gradsync`): each
    deposited gradient whose layout differs from its destination only by partial sums
    joins the bucket of its reduction (one collective per bucket: its latency is paid once,
    :meth:`fixed`, its bytes per member, :meth:`member`); another is boxed on its own."""

    def __init__(self, deposits):
        self.target = {}
        for v, target in deposits:
            self.target.setdefault(v, target)
        self._keys: dict = {}
        self.buckets = bucket_size() > 0  # (0: every gradient reduced on its own)

    def key(self, src, dst):
        """``(placement, dtype, kind, group size, reduced axes)`` of the bucket ``src``
        joins, or None (boxed on its own)."""
        hit = self._keys.get((src, dst), False)
        if hit is False:
            plan = _reduction(src, dst) if src is not dst and self.buckets else None
            hit = None
            if plan is not None:
                axes, scatter = plan
                shape = src.placement.shape
                group = int(np.prod([shape[a] for a in axes]))
                hit = (src.placement, src.dtype, "all_reduce" if scatter is None else
                       "reduce_scatter", group, axes)
            self._keys[(src, dst)] = hit
        return hit

    def member(self, src, dst, box) -> float:
        """A gradient's own share: its bytes in its bucket's collective, or its boxing."""
        if src is dst or src == dst:
            return 0.0
        key = self.key(src, dst)
        if key is None:
            return box(src, dst)
        placement, _, kind, group, _ = key
        nbytes = src.local_nbytes(placement.rank_list[0])
        return (cost_model.collective(kind, group, nbytes, placement.device) -
                cost_model.collective(kind, group, 0, placement.device))

    def fixed(self, layout_of) -> float:
        """Per bucket its collective's latency (``layout_of``: a value's current layout).
        Also notes each gradient's bucket and the members per bucket, which
        :meth:`changed` updates."""
        self.joined = {v: self.key(layout_of(v), dst) for v, dst in self.target.items()}
        self.members: dict = {}
        for key in self.joined.values():
            if key is not None:
                self.members[key] = self.members.get(key, 0) + 1
        return sum(self.latency(key) for key in self.members)

    @staticmethod
    def latency(key) -> float:
        placement, _, kind, group, _ = key
        return cost_model.collective(kind, group, 0, placement.device)

    def changed(self, values, layout_of) -> tuple:
        """``(change of the buckets' latency, the move)`` were ``values`` (gradients among
        them) in their current layouts: buckets emptied or started (the solver's move
        touches a few gradients; :meth:`fixed` counts them all). The move (each moved
        gradient's new bucket, and the change of members per bucket) is :meth:`join`'s."""
        moved, count = {}, {}
        for v in values:
            if v in self.target:
                key = self.key(layout_of(v), self.target[v])
                if key != self.joined[v]:
                    moved[v] = key
                    for k, n in ((self.joined[v], -1), (key, 1)):
                        if k is not None:
                            count[k] = count.get(k, 0) + n
        delta = 0.0
        for key, n in count.items():
            had = self.members.get(key, 0)
            delta += self.latency(key) * ((had + n > 0) - (had > 0))
        return delta, (moved, count)

    def join(self, move: tuple) -> None:
        """Keep a move :meth:`changed` priced (the solver took it)."""
        moved, count = move
        self.joined.update(moved)
        for key, n in count.items():
            left = self.members.get(key, 0) + n
            if left:
                self.members[key] = left
            else:
                self.members.pop(key, None)


def _try(problem: _Problem, seeds: list, lookahead: bool) -> bool:
    """Set each call ``i`` of ``seeds`` (``(i, option)`` pairs) to its option, re-choose
    the later calls that changes, and keep the result when the total falls (else put
    everything back). Each re-chosen call weighs its inputs' boxing and compute, and with
    ``lookahead`` its outputs' boxing into what their consumers take now (without it a
    partial value flows on to where it is needed: the consumers re-choose after it)."""
    p = problem
    old, touched, heap = {}, {}, []
    for i, o in seeds:
        if i not in old:  # (a call may take the value twice: its first option is kept)
            old[i] = p.cur[i]
        p.cur[i] = o
        touched.update(dict.fromkeys(p.produced[i]))
        if p.inputs[i] is not None:
            touched.update(dict.fromkeys(p.inputs[i]))
    for i, _ in seeds:
        _push_changed(p, i, old[i], old, heap)
    done = 0
    while heap and done < _CASCADE:
        j = heapq.heappop(heap)
        if j in old or len(p.opts[j]) == 1:
            continue
        done += 1
        before = p.cur[j]
        best = min(range(len(p.opts[j])), key=lambda q: (p.local(j, q, lookahead), q != before))
        if best == before:
            continue
        old[j] = before
        p.cur[j] = best
        touched.update(dict.fromkeys(p.produced[j]))
        touched.update(dict.fromkeys(p.inputs[j]))
        _push_changed(p, j, before, old, heap)
    new_edges = {v: p.edge_cost(v) for v in touched}
    delta = sum(p.opts[j][p.cur[j]].compute - p.opts[j][was].compute for j, was in old.items())
    delta += sum(new_edges[v] - p.edge[v] for v in touched)
    change, move = p.sync.changed(touched, p.layout)
    delta += change
    if delta < -_TOL:
        for v, c in new_edges.items():
            p.edge[v] = c
        p.sync.join(move)
        return True
    for j, was in old.items():
        p.cur[j] = was
    return False


def _pull(p: _Problem, v: int, layout, seeds: dict, depth: int) -> bool:
    """Add to ``seeds`` the producers that make value ``v`` in ``layout`` directly (and,
    up to ``depth`` calls up, their producers in turn for what they then take): a
    gather paid late is paid early instead, on the smaller or unsplit producer."""
    val = p.values[v]
    if val[0] != "out" or depth == 0:
        return False
    i, k = val[1], val[2]
    if i in seeds:
        return seeds[i] is not None and p.opts[i][seeds[i]].outs[k] is layout
    fits = [q for q, opt in enumerate(p.opts[i]) if opt.outs[k] is layout]
    if not fits:
        return False
    q = min(fits, key=lambda q: (p.local(i, q, False), q))
    seeds[i] = q
    for kk, u in enumerate(p.inputs[i] or ()):
        target = p.opts[i][q].targets[kk]
        src = p.layout(u)
        if src is not target and boxing.communicates(src, target):
            _pull(p, u, target, seeds, depth - 1)
    return True


def _pull_moves(p: _Problem, j: int) -> list:
    """Per input of call ``j`` whose boxing communicates: the upstream move that produces
    it in the layout ``j`` takes (see :func:`_pull`)."""
    moves = []
    opt = p.opts[j][p.cur[j]]
    for k, v in enumerate(p.inputs[j] or ()):
        src, target = p.layout(v), opt.targets[k]
        if src is target or not boxing.communicates(src, target):
            continue
        seeds: dict = {}
        if _pull(p, v, target, seeds, _PULL_DEPTH):
            moves.append([(i, q) for i, q in sorted(seeds.items()) if q != p.cur[i]])
    return [m for m in moves if m]


def _push_changed(p: _Problem, i: int, before: int, old: dict, heap: list) -> None:
    """Queue the later consumers of the values call ``i`` now makes in another layout than
    with option ``before``."""
    now, was = p.opts[i][p.cur[i]], p.opts[i][before]
    for v in p.produced[i]:
        val = p.values[v]
        layouts = (now.outs, was.outs) if val[0] == "out" else (now.targets, was.targets)
        if layouts[0][val[2]] is layouts[1][val[2]]:
            continue
        for j, _ in p.consumers[v]:
            if j > i and j not in old:
                heapq.heappush(heap, j)


def _shared_moves(p: _Problem, v: int) -> list:
    """The joint moves of value ``v``'s consumers: per layout some consumer could take it
    in, every consumer that can set to its cheapest option taking ``v`` so (one boxed copy
    shared, or none)."""
    consumers = [(i, k) for n, (i, k) in enumerate(p.consumers[v]) if len(p.opts[i]) > 1
                 and all(i != j for j, _ in p.consumers[v][:n])]
    if len(consumers) < 2:
        return []
    layouts = []
    for i, k in consumers:
        for opt in p.opts[i]:
            if opt.targets[k] not in layouts:
                layouts.append(opt.targets[k])
    moves = []
    for layout in layouts:
        seeds = []
        for i, k in consumers:
            fits = [q for q, opt in enumerate(p.opts[i]) if opt.targets[k] is layout]
            if fits:
                seeds.append((i, min(fits, key=lambda q: (p.local(i, q, False), q))))
        if len(seeds) >= 2 and any(p.cur[i] != q for i, q in seeds):
            moves.append(seeds)
    return moves


def _merge_moves(p: _Problem) -> list:
    """Per bucket the deposited gradients join now (see :class:`_Sync`), per other
    all-reduce bucket: the move whose producers make every member in the layout that joins
    the other one (:func:`_pull`). One bucket's latency is saved only when its last member
    leaves it, which no single move sees."""
    sync, groups = p.sync, []
    for v, dst in sync.target.items():
        key = sync.key(p.layout(v), dst)
        if key is None:
            continue
        for g in groups:
            if g[0] == key:
                g[1].append(v)
                break
        else:
            groups.append((key, [v]))
    moves = []
    for key, members in groups:
        for other, _ in groups:
            if other is key or other[:3] != (key[0], key[1], "all_reduce"):
                continue
            seeds: dict = {}
            for v in members:
                dst = sync.target[v]
                if not all(isinstance(dst.sbp[a], Broadcast) for a in other[4]):
                    break
                joins = dst.with_sbp([partial_sum if a in other[4] else e
                                      for a, e in enumerate(dst.sbp)])
                if not _pull(p, v, joins, seeds, _PULL_DEPTH):
                    break
            else:
                move = [(i, q) for i, q in sorted(seeds.items()) if q != p.cur[i]]
                if move:
                    moves.append(move)
    return moves


def _promising(p: _Problem, i: int, o: int) -> bool:
    """Whether setting call ``i`` to option ``o`` is cheaper for the call itself, counting
    its outputs' boxing into what their consumers take now or not (a move dearer both ways
    cannot gain in the cascade it starts: its consumers re-choose after it either way)."""
    cur = p.cur[i]
    return p.local(i, o, True) < p.local(i, cur, True) - _TOL or \
        p.local(i, o, False) < p.local(i, cur, False) - _TOL


def solve(calls, values, deposits=(), moves_per_call: int = _MOVES_PER_CALL) -> tuple:
    """Per call the chosen :class:`Option` and the per-op one, and the estimated totals
    ``(planned, per-op)`` in seconds. At most ``moves_per_call`` tried moves per call and
    mesh axis in all (a budget in moves, not seconds, so that every rank stops at the same
    point)."""
    p = _Problem(calls, values, deposits)
    before = p.total()
    # (per mesh axis: an N-D mesh has as many more ways to run each call)
    ndim = max((c.layouts[0].placement.ndim for c in calls if c.layouts), default=1)
    budget = [moves_per_call * ndim * max(1, len(calls))]

    def attempt(seeds, *modes) -> bool:
        for lookahead in modes:
            if budget[0] <= 0:
                return False
            budget[0] -= 1
            if _try(p, seeds, lookahead):
                return True
        return False

    for _ in range(_SWEEPS):
        improved = False
        for i in range(len(calls)):
            for o in range(len(p.opts[i])):
                if o != p.cur[i] and _promising(p, i, o) and attempt([(i, o)], True):
                    improved = True
            for v in p.produced[i]:
                for seeds in _shared_moves(p, v):
                    if attempt(seeds, True):
                        improved = True
            for seeds in _pull_moves(p, i):
                if attempt(seeds, True):
                    improved = True
        # (outside the budget: a few moves per pair of buckets, none once there is one)
        for seeds in _merge_moves(p):
            if _try(p, seeds, True) or _try(p, seeds, False):
                improved = True
        if not improved or budget[0] <= 0:
            break
    chosen = [p.opts[i][c] for i, c in enumerate(p.cur)]
    per_op = [p.opts[i][c] for i, c in enumerate(p.recorded)]
    return chosen, per_op, (p.total(), before)
