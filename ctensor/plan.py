"""Plan a training step without running it: memory, communication and predicted step time.

A plan reads what a shape-only run (``ct.simulate(n, meta=True)``, see :mod:`ctensor.meta`)
recorded — the kernels and communication steps of :func:`record`'s traces and the bytes of
``ct.debug.track_memory`` — and prices them on a :class:`Device`:

Every price comes from the one cost model, :mod:`ctensor.cost` (the one the signature
choice uses), on a :class:`~ctensor.cost.Device` of ``ctensor/devices.toml``:

* **compute**: each kernel's time on its largest shard is ``max(flops / rate, bytes /
  memory_bandwidth) / efficiency`` (:func:`ctensor.cost.compute`, every size an op ran at
  priced on its own; ``rate``: the device's half-precision peak for float16 kernels, its
  float32 peak otherwise, or a measured table's ``gemm`` / ``gemm_fp64`` rate at the
  kernel's arithmetic intensity; ``efficiency``: the op's in a measured table's ``kernels``,
  else the device's — :data:`EFFICIENCY` for every data-sheet GPU; times the table's
  ``contention`` when more than one rank of a node computes at once), plus the device's
  ``op_overhead`` per dispatched op, views included (0 on the GPU tables). By default
  (``fused=True``) kernels that declare no FLOPs (elementwise, LayerNorm, casts:
  memory-bound) are taken as fused into their neighbours, as Megatron-LM's fused kernels
  (or a compiler) run them, and cost nothing —
  except the softmax family (:data:`OWN_KERNELS`), charged at memory bandwidth;
  ``fused=False`` (a CPU step) charges every memory-bound kernel;
* **communication**: :func:`ctensor.cost.collective` per collective (alpha-beta per ring
  step), inside a node when the whole group sits on one (``gpus_per_node`` consecutive
  ranks), else over the network with the per-GPU bandwidth times the group's ranks per node;
* **pipeline**: one micro-batch is traced; the schedule (the event order of
  ``nn.pipeline.schedule``) is replayed with each stage's forward and backward times, so
  the bubble is what the schedule leaves idle; the gradient reduction (``grad_sync``) and
  the optimizer step run once per step after the last backward (not overlapped);
* **memory** per rank: parameters, gradients and optimizer states as held after the step,
  plus the activations one micro-batch keeps from its forward to its backward times the
  micro-batches the schedule keeps in flight on the rank's stage (1F1B: ``stages - s``;
  GPipe: all), plus the transient peak of one micro-batch's forward and backward. Buffers
  made by boxing are reported too (they are part of the activations).

>>> with ct.simulate(8, meta=True), ct.plan.record() as trace:
...     y = x @ w                      # shapes only
>>> ct.plan.op_seconds(trace, ct.plan.device("a100-80gb"))
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

import numpy as np

from . import cost
from .cost import EFFICIENCY, Device, device, devices, load_devices
from .placement import Placement
from .worktrace import CommWork, Trace

__all__ = ["EFFICIENCY", "OWN_KERNELS", "Device", "devices", "device", "load_devices", "record",
           "op_seconds", "comm_seconds", "stage_seconds", "is_intra_node", "replay",
           "StepReport", "step_report"]

#: memory-bound kernels that run on their own even when the rest fuse: a softmax reduces
#: along rows of a matmul's output (attention's ``s x s`` scores, the loss's logits), so it
#: cannot fuse into that matmul; Megatron-LM runs it as one fused scale-mask-softmax kernel
#: (and one for its gradient), reading and writing the scores once each
OWN_KERNELS = ("softmax",)


def record() -> Trace:
    """A :class:`~ctensor.worktrace.Trace` of the kernels and communication run while it is
    open (``with ct.plan.record() as trace: ...``)."""
    return Trace()


# ----------------------------------------------------------------------------- pricing
def op_seconds(trace: Trace, dev: Device, efficiency: Optional[float] = None,
               fused: bool = True, ranks: int = 1) -> dict:
    """``{placement: seconds}`` of the ops in ``trace``: each kernel on its largest shard
    (:func:`ctensor.cost.compute`) plus the device's ``op_overhead`` per dispatched op, views
    included (:func:`ctensor.cost.dispatch`). ``efficiency``: instead of the device's.
    ``fused``: kernels without declared FLOPs (memory-bound) cost nothing, except the
    softmax family (see :data:`OWN_KERNELS`) — as fused GPU kernels run them; a CPU step
    runs every kernel (``fused=False``). ``ranks``: the ranks computing at once on a
    machine (:func:`ctensor.cost.compute`)."""
    if efficiency is not None:
        dev = replace(dev, efficiency=efficiency)
    out: dict = {}
    for w in trace.ops.values():
        seconds = cost.dispatch(dev, w.count)
        if not w.view and not (fused and not w.flops and not w.op.startswith(OWN_KERNELS)):
            seconds += sum(runs * cost.compute(dev, nbytes, flops, w.dtype.itemsize, w.op, ranks)
                           for (flops, nbytes), runs in (w.sizes or {(w.flops, w.nbytes):
                                                                     1}).items())
        if seconds:
            out[w.placement] = out.get(w.placement, 0.0) + seconds
    return out


def is_intra_node(comm: CommWork, gpus_per_node: int) -> bool:
    """Whether every group of ``comm`` stays inside one node of ``gpus_per_node``
    consecutive ranks."""
    nodes = comm.groups() // gpus_per_node
    return bool((nodes == nodes[:, :1]).all()) if nodes.size else True


def _ranks_per_node(comm: CommWork, gpus_per_node: int) -> int:
    """How many ranks of one group share a node (the fewest over the group's nodes)."""
    groups = comm.groups()
    if not groups.size:
        return 1
    nodes = groups[0] // gpus_per_node
    return int(np.unique(nodes, return_counts=True)[1].min())


def comm_seconds(comm: CommWork, dev: Device, gpus_per_node: int) -> float:
    """Seconds of one run of ``comm`` (:func:`ctensor.cost.collective`): inside a node when
    every group is (:func:`is_intra_node`), else across nodes with the group's ranks per
    node."""
    if comm.group_size <= 1:
        return 0.0
    intra = is_intra_node(comm, gpus_per_node)
    return cost.collective(comm.collective, comm.group_size, comm.nbytes, dev, intra=intra,
                           ranks_per_node=1 if intra else _ranks_per_node(comm, gpus_per_node))


def replay(order: Sequence, forward: Sequence[float], backward: Sequence[float],
           devices: Optional[int] = None, weights: Optional[Sequence[float]] = None,
           events: Optional[list] = None) -> tuple:
    """Replay a pipeline schedule: ``order`` is the event list ``[("F"|"B", stage,
    micro_batch), ...]`` (``nn.pipeline.schedule``), ``forward[j]``/``backward[j]`` one
    micro-batch's seconds on (virtual) stage ``j``, which runs on device ``j % devices``
    (default: one stage per device). A forward waits for the previous stage's forward of
    its micro-batch, a backward for the next stage's backward (the last stage: its own
    forward); each device runs one event at a time. Returns ``(seconds, in_flight)``: when
    the last event ends, and per stage how many micro-batches were between their forward
    and their backward there when its device held the most — the most of ``sum(weights[j]
    * alive[j])`` over the device's stages (``weights``: e.g. each stage's bytes kept per
    micro-batch; default 1). With one stage per device, the most micro-batches alive.
    ``events``: a list that gets ``(kind, stage, micro_batch, start, end)`` of each event."""
    n = len(forward)
    p = n if devices is None else devices
    w = [1.0] * n if weights is None else list(weights)
    free = [0.0] * p
    done: dict = {}
    alive, in_flight, most = [0] * n, [0] * n, [-1.0] * p
    for kind, j, m in order:
        d = j % p
        if kind == "F":
            dep = done.get(("F", j - 1, m), 0.0)
            alive[j] += 1
            held = sum(w[i] * alive[i] for i in range(d, n, p))
            if held > most[d]:
                most[d] = held
                for i in range(d, n, p):
                    in_flight[i] = alive[i]
        else:
            dep = done.get(("B", j + 1, m)) if j + 1 < n else done.get(("F", j, m), 0.0)
            alive[j] -= 1
        start = max(free[d], dep or 0.0)
        free[d] = done[(kind, j, m)] = start + (forward[j] if kind == "F" else backward[j])
        if events is not None:
            events.append((kind, j, m, start, free[d]))
    return max(free), in_flight


# ----------------------------------------------------------------------------- the report
def _gib(n: float) -> str:
    return f"{n / 2 ** 30:.2f} GiB"


@dataclass
class StepReport:
    """One planned training step (see :func:`step_report`). ``classes``: per class of
    identical ranks a dict (``ranks``: how many, ``first``: the first, ``stage``, and bytes
    ``parameters``, ``gradients``, ``optimizer``, ``activations``, ``boxing``, ``total``);
    ``collectives``: per distinct communication step a dict (op and phase, collective,
    group size, number of groups, bytes per rank, runs per group and step, whether every
    group is inside a node, seconds per group and step); times in seconds. Per (virtual)
    stage ``j`` (on device ``j % devices``): ``stage_forward``, ``stage_backward`` (one
    micro-batch) and ``in_flight`` (micro-batches kept when its device holds the most)."""

    device: Device
    world_size: int
    gpus_per_node: int
    micro_batches: int
    schedule: str
    stage_forward: list
    stage_backward: list
    in_flight: list
    pipeline_seconds: float
    sync_seconds: float
    update_seconds: float
    step_seconds: float
    bubble_fraction: float
    classes: list
    collectives: list
    model_flops: Optional[float] = None
    devices: int = 0  # pipeline devices (stages per device: len(stage_forward) / devices)
    #: the replayed schedule: ``(kind, stage, micro_batch, start, end)`` per event (seconds)
    events: list = None
    stage_ranks: list = None  # per (virtual) stage, its placement's ranks

    def in_flight_on(self, device: int) -> int:
        """Micro-batches (of each of its stages) device ``device`` keeps at its fullest."""
        p = self.devices or len(self.in_flight)
        return sum(self.in_flight[device::p])

    @property
    def fits(self) -> bool:
        """Whether every rank's peak fits in the device's memory."""
        return all(c["total"] <= self.device.memory_bytes for c in self.classes)

    @property
    def worst(self) -> dict:
        """The class of ranks with the largest peak."""
        return max(self.classes, key=lambda c: c["total"])

    @property
    def tflops_per_gpu(self) -> Optional[float]:
        """``model_flops / (step_seconds * world_size)`` in teraFLOP/s (None without
        ``model_flops``)."""
        if not self.model_flops:
            return None
        return self.model_flops / (self.step_seconds * self.world_size) / 1e12

    def verdict(self) -> str:
        """``fits`` or ``does not fit: rank R (stage s) needs X > Y: ...``."""
        w = self.worst
        if self.fits:
            return (f"fits: the fullest rank ({w['first']}, stage {w['stage']}) peaks at "
                    f"{_gib(w['total'])} of {_gib(self.device.memory_bytes)}")
        parts = ", ".join(f"{k} {_gib(w[k])}" for k in
                          ("parameters", "gradients", "optimizer", "activations"))
        return (f"does not fit: rank {w['first']} (stage {w['stage']}, {w['ranks']} ranks "
                f"alike) needs {_gib(w['total'])} > {_gib(self.device.memory_bytes)} of "
                f"{self.device.name}: {parts} ({self.in_flight_on(w['stage'])} micro-batches' "
                f"activations in flight)")

    def __str__(self) -> str:
        lines = [f"plan of one step on {self.world_size} x {self.device.name} "
                 f"({self.gpus_per_node} per node), {self.micro_batches} micro-batches, "
                 f"{self.schedule}"]
        lines.append("peak memory per class of ranks:")
        lines.append(f"  {'ranks':>6} {'first':>6} {'stage':>5} {'params':>10} {'grads':>10} "
                     f"{'optim':>10} {'activ':>10} {'boxing':>10} {'total':>10}")
        for c in self.classes:
            lines.append(f"  {c['ranks']:>6} {c['first']:>6} {c['stage']:>5} " + " ".join(
                f"{c[k] / 2 ** 30:>10.2f}" for k in ("parameters", "gradients", "optimizer",
                                                     "activations", "boxing", "total"))
                         + "  GiB")
        lines.append("collectives per step:")
        lines.append(f"  {'op':<22} {'collective':<15} {'group':>5} {'groups':>6} "
                     f"{'MiB/rank':>10} {'runs':>6} {'where':<6} {'seconds':>9}")
        for c in self.collectives:
            lines.append(f"  {c['op'][:22]:<22} {c['collective']:<15} {c['group_size']:>5} "
                         f"{c['groups']:>6} {c['nbytes'] / 2 ** 20:>10.2f} {c['runs']:>6} "
                         f"{'intra' if c['intra'] else 'inter':<6} {c['seconds']:>9.4f}")
        p = self.devices or len(self.stage_forward)
        fwd = [sum(self.stage_forward[d::p]) for d in range(p)]
        bwd = [sum(self.stage_backward[d::p]) for d in range(p)]
        slow = int(np.argmax(np.add(fwd, bwd)))
        chunks = len(self.stage_forward) // p
        lines.append(f"time: pipeline {self.pipeline_seconds:.3f} s (bubble "
                     f"{100 * self.bubble_fraction:.1f}%; slowest stage {slow}"
                     f"{f' ({chunks} chunks)' if chunks > 1 else ''}: forward "
                     f"{fwd[slow] * 1e3:.2f} ms, backward "
                     f"{bwd[slow] * 1e3:.2f} ms per micro-batch), gradient "
                     f"sync {self.sync_seconds:.3f} s, optimizer {self.update_seconds:.3f} s"
                     f" -> step {self.step_seconds:.3f} s")
        if self.model_flops:
            lines.append(f"throughput: {self.tflops_per_gpu:.1f} model TFLOP/s per GPU "
                         f"({100 * self.tflops_per_gpu * 1e12 / self.device.peak_flops:.1f}% "
                         f"of peak)")
        lines.append(self.verdict())
        return "\n".join(lines)


def _device_count(stages: Sequence[Placement]) -> int:
    """``p``: the stages' placements repeat with period ``p`` (virtual stage ``j`` on device
    ``j % p``; ``p == len(stages)`` without interleaving)."""
    p = len(dict.fromkeys(stages))
    if len(stages) % p or any(stages[j] != stages[j % p] for j in range(len(stages))):
        raise ValueError(f"step_report: argument 'stages': virtual stage j must be on the "
                         f"placement of stage j % p for p = {p} devices (the interleaved "
                         f"layout of nn.pipeline), got {len(stages)} placements that do not "
                         f"repeat so")
    return p


def _device_of(stages: Sequence[Placement], world_size: int) -> np.ndarray:
    table = np.full(world_size, -1, dtype=np.int64)
    for s, p in enumerate(stages):
        table[p.ranks.reshape(-1)] = s
    return table


def _per_device(seconds: dict, comms: list, device_of, n: int, dev, gpn, skip=()) -> list:
    out = [0.0] * n
    for placement, t in seconds.items():
        out[device_of[placement.rank_list[0]]] += t
    for c in comms:
        if c.op not in skip:
            out[device_of[c.placement.rank_list[0]]] += comm_seconds(c, dev, gpn) * c.count
    return out


def stage_seconds(traces: Sequence[Trace], dev: Device, gpus_per_node: int,
                  efficiency: Optional[float] = None, fused: bool = True, skip=(),
                  ranks: int = 1) -> list:
    """Seconds of one micro-batch per stage (one trace per stage): its ops
    (:func:`op_seconds`, ``ranks`` of a node computing at once) and its communication
    (:func:`comm_seconds`, less the ops named in ``skip``), one after the other."""
    return [sum(op_seconds(t, dev, efficiency, fused, ranks).values()) +
            sum(comm_seconds(c, dev, gpus_per_node) * c.count for c in t.comms.values()
                if c.op not in skip) for t in traces]


def _memory_classes(memory: dict, saved: list, in_flight: list, device_of, per_rank) -> list:
    """Memory per rank (what each device keeps at its fullest), as classes of identical
    ranks (see :class:`StepReport`)."""
    memory = {k: per_rank(v) for k, v in memory.items() if k != "saved"}
    kept = sum(saved)  # one micro-batch
    held = sum(v * in_flight[j] for j, v in enumerate(saved))
    act = np.maximum(held - kept, 0) + memory["transient"]
    static = memory["parameters"] + memory["gradients"] + memory["optimizer"]
    rows = np.stack([device_of, memory["parameters"], memory["gradients"],
                     memory["optimizer"], act, memory["boxing"], static + act], axis=1)
    unique, first, counts = np.unique(rows, axis=0, return_index=True, return_counts=True)
    return [dict(ranks=int(c), first=int(i), stage=int(u[0]), parameters=int(u[1]),
                 gradients=int(u[2]), optimizer=int(u[3]), activations=int(u[4]),
                 boxing=int(u[5]), total=int(u[6]))
            for u, i, c in sorted(zip(unique, first, counts), key=lambda z: z[1])]


def _collective_rows(fwd_comms, bwd_comms, update_comms, micro_batches, dev, gpn) -> list:
    """One row per distinct communication step of the step: identical steps on different
    stages (other placements, the same groups' shape and bytes) are one row, their groups
    added up, each group running them ``runs`` times a step."""
    merged: dict = {}
    for phase, comms, per in (("forward", fwd_comms, micro_batches),
                              ("backward", bwd_comms, micro_batches),
                              ("update", update_comms, 1)):
        for c in comms:
            runs = c.count * (1 if c.op == "grad_sync" else per)
            intra = is_intra_node(c, gpn)
            key = (f"{c.op} ({phase})", c.collective, c.group_size, c.nbytes, intra)
            row = merged.get(key)
            if row is None:
                row = merged[key] = dict(op=key[0], collective=c.collective,
                                         group_size=c.group_size, groups=0, nbytes=c.nbytes,
                                         runs=0, intra=intra, seconds=0.0)
            row["groups"] += len(c.groups())
            row["runs"] = max(row["runs"], runs)
            row["seconds"] = max(row["seconds"], comm_seconds(c, dev, gpn) * runs)
    return list(merged.values())


def step_report(*, stages: Sequence[Placement], forward: Sequence[Trace],
                backward: Sequence[Trace], update: Trace, memory: dict, order: Sequence,
                micro_batches: int, schedule: str, dev: Device, gpus_per_node: int,
                world_size: int, model_flops: Optional[float] = None,
                efficiency: Optional[float] = None, fused: bool = True) -> StepReport:
    """Price one step from the traces of one micro-batch's ``forward`` and ``backward``
    (its ``grad_sync`` reductions run once per step) and of the optimizer ``update``.
    ``stages``: the placement of each (virtual) stage — with an interleaved schedule,
    stage ``j`` on the placement of stage ``j % p``. ``forward``/``backward``: one
    :class:`~ctensor.worktrace.Trace` per stage. ``memory``: int64 vectors over ranks —
    ``parameters``, ``gradients``, ``optimizer`` (held after the step), ``saved`` (a list:
    per stage the activations one micro-batch keeps there for its backward),
    ``transient`` (the peak of one micro-batch's forward and backward above what it
    started with), ``boxing`` (peak bytes of buffers boxing made). ``order``: the
    schedule's events; ``model_flops``: the step's model FLOPs (for TFLOP/s)."""
    n, p = len(stages), _device_count(stages)
    device_of = _device_of(stages[:p], world_size)
    if len(forward) != n or len(backward) != n or len(memory["saved"]) != n:
        raise ValueError(f"step_report: give one forward trace, one backward trace and one "
                         f"'saved' vector per stage ({n}); got {len(forward)}, "
                         f"{len(backward)} and {len(memory['saved'])}")
    fwd_comms = [c for t in forward for c in t.comms.values()]
    bwd_comms = [c for t in backward for c in t.comms.values()]
    at_once = min(world_size, gpus_per_node)  # ranks of a node computing at once
    t_f = stage_seconds(forward, dev, gpus_per_node, efficiency, fused, ranks=at_once)
    t_b = stage_seconds(backward, dev, gpus_per_node, efficiency, fused, skip=("grad_sync",),
                        ranks=at_once)

    def per_rank(v):
        v = np.asarray(v, np.int64)[:world_size]
        return np.pad(v, (0, max(0, world_size - v.size)))

    saved = [per_rank(v) for v in memory["saved"]]
    # each stage weighs in with the bytes its fullest rank keeps per micro-batch
    events: list = []
    pipeline, in_flight = replay(order, t_f, t_b, p, [float(v.max()) for v in saved], events)
    sync = [0.0] * p
    for c in bwd_comms:
        if c.op == "grad_sync":
            sync[device_of[c.placement.rank_list[0]]] += comm_seconds(c, dev, gpus_per_node) \
                * c.count
    upd = _per_device(op_seconds(update, dev, efficiency, False, at_once),
                      list(update.comms.values()),
                      device_of, p, dev, gpus_per_node)
    tail = [a + b for a, b in zip(sync, upd)]
    slowest = int(np.argmax(tail))
    step = pipeline + tail[slowest]
    busy = micro_batches * max(sum(t_f[d::p]) + sum(t_b[d::p]) for d in range(p))
    bubble = max(0.0, 1.0 - busy / pipeline) if pipeline else 0.0

    classes = _memory_classes(memory, saved, in_flight, device_of, per_rank)
    collectives = _collective_rows(fwd_comms, bwd_comms, list(update.comms.values()),
                                   micro_batches, dev, gpus_per_node)
    return StepReport(dev, world_size, gpus_per_node, micro_batches, schedule, t_f, t_b,
                      in_flight, pipeline, sync[slowest], upd[slowest], step, bubble,
                      classes, collectives, model_flops, p, events,
                      [tuple(st.rank_list) for st in stages])
