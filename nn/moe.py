"""A mixture-of-experts layer, ``MoE``: a router, top-k gating, experts as one parameter.

Written for one device, as the rest of :mod:`ctensor.nn`; expert parallelism is a layout
(GShard, Lepikhin et al. 2020; Mesh-TensorFlow): lay the expert weights ``S(0)`` on an
expert mesh axis and the tokens' batch ``S(0)`` on the same axis, and dispatch's
``(G, E, C, d)`` tensor, computed where its tokens live (split on ``G``), meets weights
split on ``E``: the expert einsum boxes it ``S(0) -> S(1)`` (one all-to-all) and the combine
boxes the experts' output back (the second). Nothing here communicates.

Routing, exactly as one process computes it in every layout:

* ``probs = softmax(router(x))`` over the ``E`` experts (``router``: ``Linear(d, E)``
  without bias), then the ``top_k`` largest per token (ties: the lower expert id). With
  ``top_k > 1`` the chosen ``k`` probabilities are renormalised to sum to one (GShard's
  top-2, Mixtral, Megatron-Core's ``moe_router_topk`` with ``norm_topk_prob``); with
  ``top_k == 1`` the gate is the probability itself (Switch Transformer), so the router
  learns through it.
* Tokens come in groups fixed by the model, not the layout: one group per row of the batch
  (``(batch, time, d)`` input; a 2-D ``(tokens, d)`` input is one group). Each (group,
  expert) has ``capacity = ceil(capacity_factor * tokens_per_group * top_k / E)`` slots,
  filled in GShard's order: every token's first choice before any second choice, tokens in
  their order within the group (a cumulative sum). A choice past its expert's capacity is
  dropped (its gate contributes nothing: the token keeps its residual), as GShard and
  Switch drop overflow. Since the groups are the model's, so are the dropped tokens.
* The auxiliary load-balancing loss (Switch / GShard): per group ``E * sum_e f_e * P_e``,
  ``f_e`` the fraction of the group's ``tokens * top_k`` choices routed to expert ``e``
  (before capacity), ``P_e`` the mean router probability of ``e``; averaged over groups.
  ``1.0`` for uniform routing. After each forward it is ``moe.aux_loss`` (a scalar tensor
  in the graph: add ``coefficient * moe.aux_loss`` to the loss). Or ``aux_loss_coef > 0``:
  the output carries the aux loss's gradient times it in its own backward (Megatron-Core's
  ``MoEAuxLossAutoScaler``), so nothing is added to the loss but for reporting
  (``coef * moe.aux_loss.detach()``); ``nn.GPT`` does that, which keeps activation
  recompute and pipeline stages exact.
* ``moe.stats`` after a forward: ``tokens_per_expert`` (kept choices per expert, the
  whole batch), ``dropped`` (choices dropped) and ``drop_rate`` (dropped / all choices):
  read lazily, so a forward does not communicate for them.

Parameters: ``router.weight (E, d)``, ``w1 (E, d, hidden)``, ``w2 (E, hidden, d)``; an
expert is ``act(t @ w1[e]) @ w2[e]`` (no biases, as Mixtral and Megatron-Core's grouped
experts). Expert tensor parallelism (ETP): ``w1`` also ``S(2)`` and ``w2`` ``S(1)`` on a
tensor axis: a partial output, reduced once (Megatron's column/row pair).
:func:`ctensor.nn.parallel.expert_parallel_rules` writes these layouts.

>>> moe = nn.MoE(16, n_experts=4, top_k=2, capacity_factor=1.25)
>>> y = moe(x)                      # x (batch, time, 16) -> (batch, time, 16)
>>> loss = task_loss + 0.01 * moe.aux_loss
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

import ctensor as ct

from . import functional as F
from .layers import Dropout, Linear, uniform_param
from .module import Module

__all__ = ["MoE", "capacity"]

ACTIVATIONS = ("gelu", "gelu_tanh", "silu", "relu")


def capacity(capacity_factor: float, tokens_per_group: int, top_k: int,
             n_experts: int) -> int:
    """Slots per (group, expert): ``ceil(capacity_factor * tokens * top_k / E)``, at least 1.

    >>> nn.moe.capacity(1.25, 64, 2, 8)      # 20
    """
    return max(1, math.ceil(capacity_factor * tokens_per_group * top_k / n_experts))


def _positive(arg: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"MoE: argument '{arg}' must be a positive int, got {value!r}")
    return int(value)


def _activation(name: str, h: ct.Tensor) -> ct.Tensor:
    if name == "gelu":
        return F.gelu(h)
    if name == "gelu_tanh":
        return F.gelu(h, approximate="tanh")
    if name == "silu":
        return F.silu(h)
    return F.relu(h)


def _group_sbp(x: ct.Tensor) -> tuple:
    """The layout of a new tensor indexed by ``x``'s groups: ``x``'s split of the group
    dim (0) kept, broadcast on every other mesh axis."""
    split = ct.sbp.split(0)
    return tuple(p if p == split else ct.sbp.broadcast for p in x.sbp)


class _AttachAux(ct.autograd.Function):
    """``y`` unchanged; its backward also gives the aux loss the gradient ``coef``
    (Megatron-Core's ``MoEAuxLossAutoScaler``): the load-balancing term reaches the router
    through the activations' own graph, so activation recompute and pipeline stages carry
    it without the loss having to collect it."""

    @staticmethod
    def forward(ctx, y, aux, coef):
        ctx.aux_placement, ctx.coef, ctx.dtype = aux.placement, coef, aux.dtype
        return y

    @staticmethod
    def backward(ctx, g):
        return g, ct.tensor(ctx.coef, dtype=ctx.dtype, placement=ctx.aux_placement), None


class MoE(Module):
    """Top-k routed mixture of ``n_experts`` MLPs ``act(x @ w1[e]) @ w2[e]`` on
    ``(batch, time, d)`` (or ``(tokens, d)``) inputs; see the module docstring for the
    routing, the capacity, the dropped tokens and :attr:`aux_loss` / :attr:`stats`.

    >>> moe = nn.MoE(16, n_experts=4, top_k=2, capacity_factor=2.0, activation="silu")
    >>> y = moe(x); moe.aux_loss; moe.stats["drop_rate"]
    """

    def __init__(self, d: int, n_experts: int, top_k: int = 2,
                 capacity_factor: float = 1.25, hidden: Optional[int] = None,
                 activation: str = "gelu", dropout: float = 0.0,
                 aux_loss_coef: float = 0.0, dtype=None):
        super().__init__()
        self.d = _positive("d", d)
        self.n_experts = _positive("n_experts", n_experts)
        self.top_k = _positive("top_k", top_k)
        if self.top_k > self.n_experts:
            raise ValueError(f"MoE: argument 'top_k' is {top_k} but there are only "
                             f"{n_experts} experts; accepted: 1 <= top_k <= n_experts")
        if isinstance(capacity_factor, bool) or \
                not isinstance(capacity_factor, (int, float, np.floating)) or \
                not capacity_factor > 0 or not math.isfinite(capacity_factor):
            raise ValueError(f"MoE: argument 'capacity_factor' must be a positive number, "
                             f"got {capacity_factor!r}")
        self.capacity_factor = float(capacity_factor)
        self.hidden = 4 * self.d if hidden is None else _positive("hidden", hidden)
        if activation not in ACTIVATIONS:
            raise ValueError(f"MoE: argument 'activation' is {activation!r}; accepted: "
                             f"{', '.join(ACTIVATIONS)}")
        self.activation = activation
        self.dropout = Dropout(F.check_probability("MoE", "dropout", dropout))
        if isinstance(aux_loss_coef, bool) or not isinstance(aux_loss_coef, (int, float)) \
                or not aux_loss_coef >= 0 or not math.isfinite(aux_loss_coef):
            raise ValueError(f"MoE: argument 'aux_loss_coef' must be a number >= 0, got "
                             f"{aux_loss_coef!r}")
        #: > 0: the aux loss's gradient, times this, is attached to the output (see forward)
        self.aux_loss_coef = float(aux_loss_coef)
        self.router = Linear(self.d, self.n_experts, bias=False, dtype=dtype)
        e, f = self.n_experts, self.hidden
        self.w1 = uniform_param((e, self.d, f), 1.0 / math.sqrt(self.d), dtype)
        self.w2 = uniform_param((e, f, self.d), 1.0 / math.sqrt(f), dtype)
        #: the load-balancing loss of the last forward (a scalar tensor), None before one
        self.aux_loss: Optional[ct.Tensor] = None
        self._counts: Optional[ct.Tensor] = None
        self._choices = 0

    def capacity(self, tokens_per_group: int) -> int:
        """Slots per (group, expert) for groups of ``tokens_per_group`` tokens."""
        return capacity(self.capacity_factor, tokens_per_group, self.top_k, self.n_experts)

    def forward(self, x: ct.Tensor) -> ct.Tensor:
        if not isinstance(x, ct.Tensor) or x.ndim not in (2, 3) or x.shape[-1] != self.d:
            shape = tuple(x.shape) if isinstance(x, ct.Tensor) else type(x).__name__
            raise ValueError(f"MoE: input must have shape (batch, time, {self.d}) or "
                             f"(tokens, {self.d}), got {shape}; the last dim is the model "
                             f"width d={self.d}")
        if x.dtype.kind != "f":
            raise TypeError(f"MoE: input must be floating, got {x.dtype}; convert it with "
                            f".float()")
        if x.ndim == 2:
            return self.forward(x.unsqueeze(0)).squeeze(0)
        self._check_expert_layout()
        g, s, d = x.shape
        e, k = self.n_experts, self.top_k
        cap = self.capacity(s)
        probs = F.softmax(self.router(x), dim=-1)                         # (G, S, E)
        top_p, top_e = probs.topk(k, dim=-1)                              # (G, S, k)
        gates = top_p / top_p.sum(-1, keepdim=True) if k > 1 else top_p
        # choices in priority order: every first choice, then every second, ... (G, k*S)
        choice_e = top_e.transpose(1, 2).reshape(g, k * s)
        experts = ct.arange(e, placement=x.placement)
        routed = (choice_e.unsqueeze(-1) == experts).long()               # (G, kS, E)
        position = ((routed.cumsum(1) - 1) * routed).sum(-1)              # slot at its expert
        keep = position < cap                                             # (G, kS)
        slot = ct.where(keep, choice_e * cap + position, e * cap)         # e*cap: dropped
        self._record(routed, keep, probs, g * s * k)
        # dispatch: slot -> token (s: an empty slot, reading the zero row appended to x)
        rows = _group_sbp(x)
        token = (ct.arange(k * s, placement=x.placement) % s).expand(g, k * s)
        slot_token = ct.full((g, e * cap + 1), s, dtype=ct.int64, placement=x.placement,
                             sbp=rows).scatter(1, slot, token)[:, :e * cap]
        slot_token = slot_token.unsqueeze(-1).expand(g, e * cap, d)
        padded = ct.cat([x, ct.zeros(g, 1, d, dtype=x.dtype, placement=x.placement,
                                     sbp=rows)], dim=1)
        dispatched = padded.gather(1, slot_token).reshape(g, e, cap, d)
        # the experts: (G, E, C, d) meets (E, d, f) split on E (expert parallel)
        h = _activation(self.activation, ct.einsum("gecd,edf->gecf", dispatched, self.w1))
        out = ct.einsum("gecf,efd->gecd", h, self.w2).reshape(g, e * cap, d)
        # combine: each token's k choices, weighted by their gates (a dropped one by zero)
        keep_k = keep.reshape(g, k, s).transpose(1, 2)                    # (G, S, k)
        slot_k = ct.where(keep_k, slot.reshape(g, k, s).transpose(1, 2), 0)
        picked = out.gather(1, slot_k.reshape(g, s * k, 1).expand(g, s * k, d))
        weights = gates * keep_k.to(gates.dtype)
        y = self.dropout((picked.reshape(g, s, k, d) * weights.unsqueeze(-1)).sum(2))
        if self.aux_loss_coef and ct.is_grad_enabled() and self.aux_loss.requires_grad:
            y = _AttachAux.apply(y, self.aux_loss, self.aux_loss_coef)
        return y

    def _check_expert_layout(self) -> None:
        """Experts split over a mesh axis must split evenly: the expert output's reshape
        ``(G, E, C, d) -> (G, E*C, d)`` keeps an even split of ``E`` only (an uneven one
        would all-gather every expert's output)."""
        split = ct.sbp.split(0)
        for axis, (entry, size) in enumerate(zip(self.w1.sbp, self.w1.placement.shape)):
            if entry == split and self.n_experts % size:
                raise ValueError(f"MoE: n_experts ({self.n_experts}) is not a multiple of the "
                                 f"size ({size}) of mesh axis {axis}, which splits the experts "
                                 f"(w1 S(0) there); an uneven split would all-gather every "
                                 f"expert's output: use a multiple of {size} experts or lay "
                                 f"the experts out on another axis")

    def _record(self, routed: ct.Tensor, keep: ct.Tensor, probs: ct.Tensor,
                choices: int) -> None:
        """The auxiliary loss (per group, then the mean) and the counts behind ``stats``."""
        g, ks, e = routed.shape
        fraction = routed.to(probs.dtype).sum(1) / ks                     # f_e (G, E)
        self.aux_loss = ((fraction * probs.mean(1)).sum(-1) * e).mean()
        with ct.no_grad():
            self._counts = (routed * keep.unsqueeze(-1).long()).sum((0, 1))
        self._choices = choices

    @property
    def stats(self) -> dict:
        """``tokens_per_expert`` (kept choices per expert, NumPy int64), ``dropped`` and
        ``drop_rate`` of the last forward (reading them is a collective: every rank reads)."""
        if self._counts is None:
            raise ValueError("MoE: stats are read after a forward; none has run")
        counts = self._counts.numpy().astype(np.int64)
        dropped = self._choices - int(counts.sum())
        return {"tokens_per_expert": counts, "dropped": dropped,
                "drop_rate": dropped / self._choices if self._choices else 0.0}

    def extra_repr(self) -> str:
        return (f"d={self.d}, n_experts={self.n_experts}, top_k={self.top_k}, "
                f"capacity_factor={self.capacity_factor}, hidden={self.hidden}, "
                f"activation={self.activation!r}")

