"""Pipeline parallelism expressed with placements.

Each stage is a callable (usually an ``nn.Module``) whose parameters live on the stage's own
placement (a sub-mesh). Activations move between stages with ``to_global`` — a point-to-point
transfer between the two sub-meshes — and gradients flow back through the same moves. The
schedule only decides the *order* in which every rank walks through (stage, micro-batch)
events; ranks outside a stage's placement hold no shards and pass over that stage's work at
once, so each rank effectively runs its own stage's sequence, and the transfers pair them up.

Gradients of parameters accumulate over micro-batches without communication (inside
``ct.autograd.no_sync()``); each stage's last backward synchronises them once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import ctensor as ct

__all__ = ["Stage", "schedule", "pipeline_step"]

FORWARD, BACKWARD = "F", "B"


@dataclass
class Stage:
    """One pipeline stage: ``module`` runs on ``placement``; its input arrives with
    ``input_sbp`` (default: the sending stage's SBP when the meshes have the same number of
    axes, else broadcast)."""

    module: Callable
    placement: "ct.Placement"
    input_sbp: Optional[tuple] = None


def schedule(num_stages: int, num_micro_batches: int, kind: str = "1f1b") -> list:
    """The global order of ``(F|B, stage, micro_batch)`` events.

    ``"gpipe"``: every forward, then every backward. ``"1f1b"``: stage ``s`` runs
    ``num_stages - s - 1`` warm-up forwards, then alternates one forward and one backward,
    then drains — which bounds the activations each stage keeps to ``num_stages``
    micro-batches. The per-stage sequences are merged into one order that respects the
    dependencies (F(s, m) after F(s-1, m); B(s, m) after B(s+1, m)), identically on all
    ranks.
    """
    if kind not in ("gpipe", "1f1b"):
        raise ValueError(f"schedule: argument 'kind' must be 'gpipe' or '1f1b', got {kind!r}")
    if num_stages < 1 or num_micro_batches < 1:
        raise ValueError(f"schedule: need >= 1 stage and micro-batch, got {num_stages} and "
                         f"{num_micro_batches}")
    S, M = num_stages, num_micro_batches
    if kind == "gpipe":
        return ([(FORWARD, s, m) for m in range(M) for s in range(S)]
                + [(BACKWARD, s, m) for m in range(M) for s in reversed(range(S))])
    per_stage = []
    for s in range(S):
        warm = min(S - s - 1, M)
        seq = [(FORWARD, s, m) for m in range(warm)]
        f, b = warm, 0
        while f < M:
            seq.append((FORWARD, s, f))
            f += 1
            seq.append((BACKWARD, s, b))
            b += 1
        seq += [(BACKWARD, s, m) for m in range(b, M)]
        per_stage.append(seq)
    done, order, pos = set(), [], [0] * S
    while len(order) < 2 * S * M:
        progressed = False
        for s in range(S):
            if pos[s] == len(per_stage[s]):
                continue
            kind_, _, m = ev = per_stage[s][pos[s]]
            ready = ((FORWARD, s - 1, m) in done or s == 0) if kind_ == FORWARD else \
                ((BACKWARD, s + 1, m) in done or s == S - 1) and (FORWARD, s, m) in done
            if ready:
                order.append(ev)
                done.add(ev)
                pos[s] += 1
                progressed = True
        if not progressed:  # cannot happen for the sequences above; guard against hangs
            raise RuntimeError("schedule: no event is ready; the schedule is inconsistent")
    return order


def pipeline_step(stages: Sequence[Stage], inputs: Sequence, loss_fn: Callable,
                  targets: Sequence, kind: str = "1f1b") -> float:
    """Forward and backward of one global batch split into micro-batches.

    ``inputs[m]`` is micro-batch ``m``'s input on the first stage's placement,
    ``targets[m]`` its target on the last stage's placement; ``loss_fn(output, target)``
    returns a scalar. The loss of the whole batch is the mean over micro-batches; parameter
    grads accumulate accordingly (call ``optimizer.step()`` afterwards). Returns the loss as
    a float on every rank.

    >>> loss = pipeline_step([Stage(first, p0), Stage(second, p1)], xs, F.cross_entropy, ys)
    """
    if not stages:
        raise ValueError("pipeline_step: argument 'stages' is empty")
    if len(inputs) != len(targets) or not inputs:
        raise ValueError(f"pipeline_step: got {len(inputs)} input and {len(targets)} target "
                         f"micro-batches; give the same non-zero number")
    S, M = len(stages), len(inputs)
    stage_in, stage_out, grad_in, losses = {}, {}, {}, []
    for kind_, s, m in schedule(S, M, kind):
        stage = stages[s]
        if kind_ == FORWARD:
            x = inputs[m] if s == 0 else stage_out[(s - 1, m)].detach()
            if x.placement != stage.placement:
                sbp = stage.input_sbp
                if sbp is None:
                    sbp = x.sbp if x.placement.ndim == stage.placement.ndim else \
                        (ct.sbp.broadcast,) * stage.placement.ndim
                x = x.to_global(stage.placement, sbp)
            if s > 0 and x.dtype.kind in "fc":
                x = x.detach().requires_grad_()
            stage_in[(s, m)] = x
            out = stage.module(x)
            if s == S - 1:
                out = loss_fn(out, targets[m]) * (1.0 / M)
                losses.append(out.detach())
            stage_out[(s, m)] = out
        else:
            out = stage_out.pop((s, m))
            grad = None
            if s < S - 1:
                grad = grad_in.pop((s + 1, m))
                grad = grad.to_global(out.placement, out.sbp)
            last = m == M - 1
            if last:
                out.backward(grad)
            else:
                with ct.autograd.no_sync():
                    out.backward(grad)
            x = stage_in.pop((s, m))
            if s > 0 and x.requires_grad:
                grad_in[(s, m)] = x.grad
    total = losses[0]
    for loss in losses[1:]:
        total = total + loss
    return float(total.item())
