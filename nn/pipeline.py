"""Pipeline parallelism expressed with placements.

Each stage is a callable (usually an ``nn.Module``) whose parameters live on the stage's own
placement (a sub-mesh). A stage's output moves to the next stage with
``to_global(..., async_op=True)`` the moment the stage has computed it — the producer starts
the transfer and goes on, the consumer waits only when it needs the data — and the gradient
of a stage's input moves back the same way as soon as its backward has run (the reverse
move). Gradients of parameters accumulate over micro-batches without communication (inside
``ct.autograd.no_sync()``); each stage's last backward synchronises them once.

**One order, walked by every rank.** :func:`schedule` merges the per-device orders of the
literature's schedules into one global order of ``(F|B, stage, micro_batch)`` events, the
same on every rank. Every rank walks it and computes the events of the stages it holds part
of; of another stage it needs only the layout of what the stage hands on (to post the
receive of a move it takes part in), which it learns by running that stage once on a
tensor it holds nothing of (per input layout: the ops find no shards to compute). Each rank
thus runs its own stages' events in its device's order and waits only for its own inputs
and gradients. A stage's module must therefore communicate only within its placement (no
``.item()`` or ``.numpy()`` inside a stage: that would need the other ranks too).

**Random numbers do not depend on the schedule or the layout.** Micro-batch ``m`` draws
from its own range of the generator's call counter: stage ``j``'s forward of micro-batch
``m`` starts at ``base + m * 2**32 + (the calls of stages 0..j-1 for m)`` — a number that
travels with the activation — so a dropout mask is the same whatever the number of stages,
the schedule (GPipe, 1F1B, interleaved) or the order the micro-batches' forwards run in;
after the step the counter is ``base + M * 2**32`` on every rank.

Schedules (``kind``): ``"gpipe"`` (Huang et al. 2019: every forward, then every backward;
each stage keeps all ``m`` micro-batches' activations), ``"1f1b"`` (PipeDream-flush,
Narayanan et al. 2021: ``p - d - 1`` warm-up forwards on device ``d``, then one forward and
one backward in turn, then the remaining backwards; at most ``p - d`` micro-batches live),
``"interleaved"`` (Narayanan et al. 2021, section 2.2, as in Megatron-LM: ``v`` model
chunks per device, virtual stage ``j`` on device ``j % p``, micro-batches in groups of ``p``
that each chunk takes in turn; ``2 (p - d - 1) + (v - 1) p`` warm-up forwards; the bubble
shrinks by ``v``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import ctensor as ct

from .timeline import Timeline, bubble_fraction

__all__ = ["Stage", "schedule", "device_orders", "pipeline_step", "bubble_fraction",
           "SCHEDULES", "Timeline"]

FORWARD, BACKWARD = "F", "B"
#: the schedules :func:`pipeline_step` runs
SCHEDULES = ("gpipe", "1f1b", "interleaved")
#: calls of the random generator reserved for each micro-batch of a pipeline step
RNG_STRIDE = 1 << 32


@dataclass
class Stage:
    """One pipeline stage: ``module`` runs on ``placement``; its input arrives with
    ``input_sbp`` (default: the sending stage's SBP when the meshes have the same number of
    axes, else broadcast).

    >>> first = Stage(nn.Sequential(nn.Linear(8, 8), nn.ReLU()).to_global(p0), p0)
    """

    module: Callable
    placement: "ct.Placement"
    input_sbp: Optional[tuple] = None


# ----------------------------------------------------------------------------- schedules
def _check_counts(fn: str, num_stages, num_micro_batches, kind, num_model_chunks) -> None:
    """The ValueErrors of bad schedule arguments, named after ``fn`` (before any work)."""
    for name, value in (("num_stages", num_stages), ("num_micro_batches", num_micro_batches),
                        ("num_model_chunks", num_model_chunks)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{fn}: argument {name!r} must be an int >= 1, got {value!r}")
    if kind not in SCHEDULES:
        raise ValueError(f"{fn}: argument 'kind' must be one of {', '.join(map(repr, SCHEDULES))}, "
                         f"got {kind!r}")
    if num_model_chunks > 1 and kind != "interleaved":
        raise ValueError(f"{fn}: argument 'num_model_chunks' is {num_model_chunks}, but only "
                         f"kind='interleaved' runs several model chunks per device (kind is "
                         f"{kind!r}); pass kind='interleaved' or num_model_chunks=1")
    # (with one chunk the schedule is 1F1B's, but the rule is the README's: m >= p always)
    if kind == "interleaved" and num_micro_batches < num_stages:
        raise ValueError(f"{fn}: kind='interleaved' needs at least as many micro-batches as "
                         f"pipeline stages (each chunk takes the micro-batches in groups of "
                         f"num_stages), got {num_micro_batches} micro-batches for {num_stages} "
                         f"stages; give >= {num_stages} micro-batches or use kind='1f1b'")


def _group_size(p: int, m: int) -> int:
    """Micro-batches per group of the interleaved schedule: ``p`` (Megatron-LM's default
    ``microbatch_group_size_per_vp_stage``), or the smallest larger size that leaves no
    group smaller than ``p`` (which would stall the pipeline), at most ``m``."""
    for n in range(p, m + 1):
        if m % n == 0 or m % n >= p:
            return n
    return m


def device_orders(num_stages: int, num_micro_batches: int, kind: str = "1f1b",
                  num_model_chunks: int = 1) -> list:
    """Each device's own order of ``(F|B, virtual stage, micro_batch)`` events, as the
    literature gives it: ``result[d]`` for device ``d`` of ``num_stages``. Virtual stage
    ``j`` runs on device ``j % num_stages`` (with one chunk, stage ``j`` on device ``j``).

    >>> device_orders(2, 3, "1f1b")[0]
    [('F', 0, 0), ('F', 0, 1), ('B', 0, 0), ('F', 0, 2), ('B', 0, 1), ('B', 0, 2)]
    """
    _check_counts("device_orders", num_stages, num_micro_batches, kind, num_model_chunks)
    p, m, v = num_stages, num_micro_batches, num_model_chunks
    if kind == "gpipe":
        return [[(FORWARD, d, i) for i in range(m)] + [(BACKWARD, d, i) for i in range(m)]
                for d in range(p)]
    if kind == "1f1b" or v == 1:  # interleaved with one chunk is 1F1B
        table = [(i, 0) for i in range(m)]
        warm = [min(p - d - 1, m) for d in range(p)]
    else:
        n = _group_size(p, m)
        table = []  # (micro-batch, chunk) of the k-th forward of every device
        for first in range(0, m, n):
            last = m if first + n >= m else first + n  # the last group takes the rest
            table += [(i, c) for c in range(v) for i in range(first, last)]
        warm = [min(2 * (p - d - 1) + (v - 1) * n, m * v) for d in range(p)]
    total = len(table)
    orders = []
    for d in range(p):
        def fwd(k: int) -> tuple:
            i, c = table[k]
            return (FORWARD, c * p + d, i)

        def bwd(k: int) -> tuple:
            i, c = table[k]
            return (BACKWARD, (v - 1 - c) * p + d, i)

        seq = [fwd(k) for k in range(warm[d])]
        for k in range(total - warm[d]):  # steady state: one forward, one backward
            seq += [fwd(k + warm[d]), bwd(k)]
        seq += [bwd(k) for k in range(total - warm[d], total)]
        orders.append(seq)
    return orders


def schedule(num_stages: int, num_micro_batches: int, kind: str = "1f1b",
             num_model_chunks: int = 1) -> list:
    """The global order of ``(F|B, virtual stage, micro_batch)`` events every rank walks:
    the devices' orders (:func:`device_orders`) merged so that each event comes after what
    it needs — ``F(j, m)`` after ``F(j-1, m)``, ``B(j, m)`` after ``B(j+1, m)`` and
    ``F(j, m)`` — taking the devices in turn, identically on all ranks. ``num_stages`` is
    the number of devices ``p``; there are ``p * num_model_chunks`` virtual stages.

    >>> schedule(2, 2, "gpipe")
    [('F', 0, 0), ('F', 1, 0), ('F', 0, 1), ('F', 1, 1), ('B', 1, 0), ('B', 0, 0), ...]
    """
    _check_counts("schedule", num_stages, num_micro_batches, kind, num_model_chunks)
    orders = device_orders(num_stages, num_micro_batches, kind, num_model_chunks)
    last = num_stages * num_model_chunks - 1
    done, order, pos = set(), [], [0] * num_stages
    total = sum(len(seq) for seq in orders)
    while len(order) < total:
        progressed = False
        for d, seq in enumerate(orders):
            while pos[d] < len(seq):
                ev = seq[pos[d]]
                k, j, i = ev
                ready = (j == 0 or (FORWARD, j - 1, i) in done) if k == FORWARD else \
                    (j == last or (BACKWARD, j + 1, i) in done) and (FORWARD, j, i) in done
                if not ready:
                    break
                order.append(ev)
                done.add(ev)
                pos[d] += 1
                progressed = True
                break  # one event per device per round: the devices take turns
        if not progressed:  # cannot happen for the orders above; guard against hangs
            raise RuntimeError(f"schedule: no event is ready ({kind}, {num_stages} stages, "
                               f"{num_micro_batches} micro-batches, {num_model_chunks} "
                               f"chunks); the devices' orders are inconsistent")
    return order


# ----------------------------------------------------------------------------- the step
def _devices(stages: Sequence[Stage], num_model_chunks: int) -> int:
    """The number of devices ``p``; checks that virtual stage ``j`` sits on the placement of
    stage ``j % p`` and that the devices' placements are different."""
    if len(stages) % num_model_chunks:
        raise ValueError(f"pipeline_step: argument 'stages' has {len(stages)} stages, which "
                         f"num_model_chunks={num_model_chunks} does not divide; give "
                         f"num_model_chunks stages per device")
    p = len(stages) // num_model_chunks
    for j, stage in enumerate(stages):
        if not isinstance(stage, Stage):
            raise TypeError(f"pipeline_step: stages[{j}] must be an nn.pipeline.Stage, got "
                            f"{type(stage).__name__}")
        if j >= p and stage.placement != stages[j % p].placement:
            raise ValueError(f"pipeline_step: with num_model_chunks={num_model_chunks}, "
                             f"stages[{j}] (chunk {j // p} of device {j % p}) must have the "
                             f"placement of stages[{j % p}], {stages[j % p].placement!r}; got "
                             f"{stage.placement!r}")
    if num_model_chunks > 1 and len({s.placement for s in stages[:p]}) < p:
        raise ValueError(f"pipeline_step: the first {p} stages (one per device) must have "
                         f"different placements for kind='interleaved'")
    return p


def _input_sbp(stage: Stage, x) -> tuple:
    sbp = stage.input_sbp
    if sbp is None:
        sbp = x.sbp if x.placement.ndim == stage.placement.ndim else \
            (ct.sbp.broadcast,) * stage.placement.ndim
    return sbp


def pipeline_step(stages: Sequence[Stage], inputs: Sequence, loss_fn: Callable,
                  targets: Sequence, kind: str = "1f1b", num_model_chunks: int = 1,
                  timeline: Optional[Timeline] = None) -> float:
    """Forward and backward of one global batch split into micro-batches.

    ``inputs[m]`` is micro-batch ``m``'s input on the first stage's placement,
    ``targets[m]`` its target on the last stage's placement; ``loss_fn(output, target)``
    returns a scalar. The loss of the whole batch is the mean over micro-batches; parameter
    grads accumulate accordingly (call ``optimizer.step()`` afterwards). Returns the loss as
    a float on every rank (nan in a shape-only world, ``ct.simulate(n, meta=True)``, where
    no values exist). ``kind`` is one of :data:`SCHEDULES`; for ``"interleaved"``,
    ``stages`` holds ``p * num_model_chunks`` virtual stages in model order, stage ``j`` on
    the placement of stage ``j % p``. ``timeline`` (a :class:`Timeline`) records when each
    rank computed and waited, and the activation memory each stage held (one small
    collective at the end gathers it on every rank).

    >>> loss = pipeline_step([Stage(first, p0), Stage(second, p1)], xs, F.cross_entropy, ys)
    >>> loss = pipeline_step([Stage(a, p0), Stage(b, p1), Stage(c, p0), Stage(d, p1)], xs,
    ...                      F.cross_entropy, ys, kind="interleaved", num_model_chunks=2)
    """
    if not isinstance(stages, (list, tuple)) or not stages:
        raise ValueError("pipeline_step: argument 'stages' must be a non-empty list of Stage")
    if len(inputs) != len(targets) or not inputs:
        raise ValueError(f"pipeline_step: got {len(inputs)} input and {len(targets)} target "
                         f"micro-batches; give the same non-zero number")
    if kind not in SCHEDULES:
        raise ValueError(f"pipeline_step: argument 'kind' must be one of "
                         f"{', '.join(map(repr, SCHEDULES))}, got {kind!r}")
    if isinstance(num_model_chunks, bool) or not isinstance(num_model_chunks, int) or \
            num_model_chunks < 1:
        raise ValueError(f"pipeline_step: argument 'num_model_chunks' must be an int >= 1, got "
                         f"{num_model_chunks!r}")
    if timeline is not None and not isinstance(timeline, Timeline):
        raise TypeError(f"pipeline_step: argument 'timeline' must be an nn.pipeline.Timeline "
                        f"or None, got {type(timeline).__name__}")
    if timeline is not None:
        ct.meta.needs_values(ValueError(
            "pipeline_step: argument 'timeline': a shape-only world (ct.simulate(n, "
            "meta=True)) computes nothing, so there are no times to record; plan the "
            "schedule with ct.plan.replay instead"))
    p = _devices(stages, num_model_chunks)
    _check_counts("pipeline_step", p, len(inputs), kind, num_model_chunks)
    order = schedule(p, len(inputs), kind, num_model_chunks)

    walk = _Walk(stages, inputs, loss_fn, targets, timeline, p, num_model_chunks, kind)
    for k, j, m in order:
        begin = time.perf_counter()
        ready = walk.forward(j, m) if k == FORWARD else walk.backward(j, m)
        if walk.recorder is not None and walk.mine[j]:
            walk.recorder.event(k, j, m, begin, ready or begin, time.perf_counter())
    return walk.finish()


def _like(t, placement=None, sbp=None):
    """A tensor of ``t``'s shape and dtype on ``placement`` (default ``t``'s), holding nothing
    of value: what a rank outside the placement uses for a layout (it allocates nothing)."""
    return ct.zeros(t.shape, dtype=t.dtype, placement=placement or t.placement,
                    sbp=sbp if sbp is not None else t.sbp)


@ct.meta.reads_values(default=0)
def _offset(moved: ct.Tensor) -> int:
    """The random-number offset a stage's input arrived with (shape-only: 0, no random
    values to align)."""
    return int(next(iter(moved.local_shards().values()))[0])


@ct.meta.reads_values(default=float("nan"))
def _loss_value(total: ct.Tensor) -> float:
    """The step's summed loss (``.item()``: every rank of the world; shape-only: nan)."""
    return float(total.item())


class _Walk:
    """The state of one :func:`pipeline_step` on this process while it walks the order.

    A rank runs its own stages' events. Of another stage it needs only layouts: the shape,
    dtype and SBP of what that stage hands on (to post the receive of a move it takes part
    in, to build the loss). It learns them by running the stage once on a tensor it holds
    no shard of (the ops find nothing to compute), for each input layout, and afterwards
    uses a tensor of that layout that holds nothing; that first run's graph is kept, and
    backed through at the stage's last backward, so that every parameter's (empty here)
    ``.grad`` looks as on the stage's own ranks. The random-number offset of micro-batch
    ``m`` at stage ``j`` travels with the activation, as a one-element tensor."""

    def __init__(self, stages, inputs, loss_fn, targets, timeline, p, v, kind):
        self.stages, self.inputs, self.loss_fn, self.targets = stages, inputs, loss_fn, targets
        self.J, self.M = len(stages), len(inputs)
        held = ct.runtime.world().held_ranks
        self.held = held
        self.mine = [any(r in s.placement for r in held) for s in stages]
        self.rng = ct.random.get_state()
        self.base = self.rng["counter"]
        self.arriving: dict = {}   # (j, m) -> (PendingTensor of the input, of its offset)
        self.grads: dict = {}      # (j, m) -> PendingTensor of stage j's output gradient
        self.inputs_of: dict = {}  # (j, m) -> stage j's input (kept for its backward)
        self.outputs: dict = {}    # (j, m) -> stage j's output (its graph, or a layout)
        self.learned: dict = {}    # (j, input layout) -> a tensor of the output's layout
        self.first: dict = {}      # j -> the output of the run that learned it (its graph)
        self.losses: list = []
        self.recorder = timeline._start(stages, p, self.M, v, kind, held) \
            if timeline is not None else None

    def _run(self, j: int, m: int, x):
        out = self.stages[j].module(x)
        if j == self.J - 1:
            out = self.loss_fn(out, self.targets[m]) * (1.0 / self.M)
        return out

    def forward(self, j: int, m: int) -> Optional[float]:
        stage, mine = self.stages[j], self.mine[j]
        offset = 0
        if j == 0:
            x = self.inputs[m]
            if x.placement != stage.placement:
                x = x.to_global(stage.placement, _input_sbp(stage, x))
        else:
            moving, moving_offset = self.arriving.pop((j, m))
            if moving is None:  # neither end of the move: only the layout matters here
                y = self.outputs[(j - 1, m)]
                x = _like(y, stage.placement, _input_sbp(stage, y))
            else:
                x = moving.wait()
                if mine:
                    offset = _offset(moving_offset.wait())
        ready = time.perf_counter()
        if j > 0 and x.dtype.kind in "fc":
            x = x.detach().requires_grad_()
        self.inputs_of[(j, m)] = x
        if mine:
            start = self.base + m * RNG_STRIDE + offset
            ct.random.set_state({"seed": self.rng["seed"], "counter": start % (1 << 64)})
            if self.recorder is not None:
                with self.recorder.saving(j, m):
                    out = self._run(j, m, x)
            else:
                out = self._run(j, m, x)
            calls = (ct.random.get_state()["counter"] - self.base - m * RNG_STRIDE) % (1 << 64)
            if calls >= RNG_STRIDE:
                raise RuntimeError(f"pipeline_step: micro-batch {m} drew more than 2**32 "
                                   f"random numbers")
        else:
            key = (j, x.layout, self.targets[m].layout if j == self.J - 1 else None)
            if key not in self.learned:
                out = self._run(j, m, x)
                self.learned[key] = _like(out.detach())
                self.first.setdefault(j, out)
            else:
                out = self.learned[key]
            calls = 0
        if j == self.J - 1:
            self.losses.append(out.detach())
        elif mine or self.mine[j + 1]:  # hand the output on now: the producer does not wait
            nxt = self.stages[j + 1]
            y = out.detach()
            # the random offset is host state: it travels on cpu placements of the same
            # ranks, so reading it is no device->host copy on a GPU stage
            offset_now = ct.full((1,), calls, dtype=ct.int64,
                                 placement=ct.placement("cpu", stage.placement.ranks.tolist()),
                                 sbp=(ct.sbp.broadcast,) * stage.placement.ndim)
            self.arriving[(j + 1, m)] = (
                y.to_global(nxt.placement, _input_sbp(nxt, y), async_op=True),
                offset_now.to_global(ct.placement("cpu", nxt.placement.ranks.tolist()),
                                     (ct.sbp.broadcast,) * nxt.placement.ndim, async_op=True))
        else:
            self.arriving[(j + 1, m)] = (None, None)  # a move this rank takes no part in
        if mine and j < self.J - 1 and out.grad_fn is not None:
            # sent on: the backward needs its place in the graph, not its values
            out = ct.autograd.graph_handle(out)
        self.outputs[(j, m)] = out
        return ready

    def backward(self, j: int, m: int) -> Optional[float]:
        out = self.outputs.pop((j, m))
        x = self.inputs_of.pop((j, m))
        ready = None
        sends = j > 0 and x.requires_grad
        if self.mine[j]:
            grad = self.grads.pop((j, m)).wait() if j < self.J - 1 else None
            ready = time.perf_counter()
            if m == self.M - 1:  # the stage's last backward synchronises its gradients
                out.backward(grad)
            else:
                with ct.autograd.no_sync():
                    out.backward(grad)
            if sends:  # in the input's own layout, which every rank knows
                g = x.grad if x.grad is not None else ct.zeros_like(x)
                g = g.detach().to_global(x.placement, x.sbp)
        else:
            if m == self.M - 1 and j in self.first:  # see the class docstring
                first = self.first.pop(j)
                first.backward(None if j == self.J - 1 else _like(first))
            sends = sends and self.mine[j - 1]  # the receiving end needs the layouts only
            if sends:
                g = _like(x)
        if sends:  # back to the previous stage's output layout, now: B(j - 1, m) pops it
            prev = self.outputs[(j - 1, m)]
            self.grads[(j - 1, m)] = g.to_global(prev.placement, prev.sbp, async_op=True)
        return ready

    def finish(self) -> float:
        ct.random.set_state({"seed": self.rng["seed"],
                             "counter": (self.base + self.M * RNG_STRIDE) % (1 << 64)})
        total = self.losses[0]
        for loss in self.losses[1:]:
            total = total + loss
        value = _loss_value(total)
        if self.recorder is not None:
            self.recorder.finish()
        return value
