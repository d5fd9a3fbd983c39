"""A GPT-2 style decoder: ``CausalSelfAttention``, ``MLP``, pre-LayerNorm ``Block``, ``GPT``.

Written for one device; the layouts of :mod:`ctensor.nn.parallel` make it data, tensor
(Megatron) or 2-D parallel with no change here. Query, key and value are three separate
``Linear`` layers so that a column split of each weight (S(0), whole heads per rank when
``n_head`` is a multiple of the tensor-parallel size) keeps the head reshape local.

Initialisation follows GPT-2: weights N(0, 0.02), biases zero, the residual projections
N(0, 0.02 / sqrt(2 n_layer)), embeddings N(0, 0.02); all drawn with ``ct.randn``, so the
logical weights are the same for every layout.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

import ctensor as ct

from . import functional as F
from .layers import Dropout, Embedding, GELU, LayerNorm, Linear, ModuleList
from .module import Module
from .moe import MoE
from .utils import checkpoint

__all__ = ["CausalSelfAttention", "MLP", "Block", "GPT"]


def _check(fn: str, arg: str, value, positive: bool = True) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
            (value <= 0 if positive else value < 0):
        raise ValueError(f"{fn}: argument '{arg}' must be a positive int, got {value!r}")
    return int(value)


class CausalSelfAttention(Module):
    """Multi-head causal self-attention on ``(batch, time, n_embd)`` inputs.

    >>> attn = nn.CausalSelfAttention(n_embd=16, n_head=2)
    >>> y = attn(x)                       # x (B, T, 16) -> (B, T, 16)
    """

    def __init__(self, n_embd: int, n_head: int, dropout: float = 0.0, bias: bool = True,
                 dtype=None):
        super().__init__()
        n_embd = _check("CausalSelfAttention", "n_embd", n_embd)
        n_head = _check("CausalSelfAttention", "n_head", n_head)
        if n_embd % n_head:
            raise ValueError(f"CausalSelfAttention: argument 'n_embd' ({n_embd}) must be a "
                             f"multiple of 'n_head' ({n_head})")
        self.n_embd, self.n_head = n_embd, n_head
        self.dropout = F.check_probability("CausalSelfAttention", "dropout", dropout)
        self.query = Linear(n_embd, n_embd, bias=bias, dtype=dtype)
        self.key = Linear(n_embd, n_embd, bias=bias, dtype=dtype)
        self.value = Linear(n_embd, n_embd, bias=bias, dtype=dtype)
        self.proj = Linear(n_embd, n_embd, bias=bias, dtype=dtype)
        self.resid_dropout = Dropout(self.dropout)
        #: selective recompute (Korthikanti et al. 2022): keep q, k, v for the backward and
        #: recompute the attention core (scores, softmax, dropout, the weighted sum)
        self.recompute_core = False

    def forward(self, x: ct.Tensor) -> ct.Tensor:
        if x.ndim != 3 or x.shape[-1] != self.n_embd:
            raise ValueError(f"CausalSelfAttention: input must have shape (batch, time, "
                             f"{self.n_embd}), got {tuple(x.shape)}")
        b, t, c = x.shape
        hd = c // self.n_head

        def heads(y):  # (B, T, C) -> (B, nh, T, hd)
            return y.reshape(b, t, self.n_head, hd).transpose(1, 2)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        p = self.dropout if self.training else 0.0

        def core(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)

        y = checkpoint(core, q, k, v) if self.recompute_core and ct.is_grad_enabled() \
            else core(q, k, v)
        y = y.transpose(1, 2).reshape(b, t, c)
        return self.resid_dropout(self.proj(y))

    def extra_repr(self) -> str:
        return f"n_embd={self.n_embd}, n_head={self.n_head}, dropout={self.dropout}"


class MLP(Module):
    """``proj(gelu(fc(x)))`` with a hidden width of ``4 * n_embd`` (GPT-2's tanh GELU).

    >>> mlp = nn.MLP(16)
    """

    def __init__(self, n_embd: int, dropout: float = 0.0, bias: bool = True,
                 hidden: Optional[int] = None, dtype=None):
        super().__init__()
        n_embd = _check("MLP", "n_embd", n_embd)
        hidden = 4 * n_embd if hidden is None else _check("MLP", "hidden", hidden)
        self.fc = Linear(n_embd, hidden, bias=bias, dtype=dtype)
        self.act = GELU(approximate="tanh")
        self.proj = Linear(hidden, n_embd, bias=bias, dtype=dtype)
        self.dropout = Dropout(F.check_probability("MLP", "dropout", dropout))

    def forward(self, x: ct.Tensor) -> ct.Tensor:
        return self.dropout(self.proj(self.act(self.fc(x))))


class Block(Module):
    """Pre-LayerNorm transformer block: ``x + attn(ln_1(x))`` then ``x + mlp(ln_2(x))``.

    ``recompute=True`` (or setting ``block.recompute``) runs the block under
    :func:`ctensor.nn.utils.checkpoint` while gradients are recorded: only its input is
    kept for the backward, which recomputes the rest (same values and gradients).
    ``recompute="selective"`` recomputes only the attention core (its scores and softmax,
    the largest activations: Korthikanti et al. 2022).

    ``moe={"n_experts": 4, "top_k": 2, ...}`` makes the MLP an :class:`~ctensor.nn.MoE`
    (those arguments; GPT-2's tanh GELU, the block's dropout).

    >>> block = nn.Block(n_embd=16, n_head=2, recompute=True)
    """

    def __init__(self, n_embd: int, n_head: int, dropout: float = 0.0, bias: bool = True,
                 dtype=None, recompute: bool = False, moe: Optional[dict] = None):
        super().__init__()
        if recompute not in (False, True, "selective"):
            raise ValueError(f"Block: argument 'recompute' must be False, True or "
                             f"'selective', got {recompute!r}")
        self.recompute = recompute
        self.ln_1 = LayerNorm(n_embd, dtype=dtype)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, bias, dtype)
        self.ln_2 = LayerNorm(n_embd, dtype=dtype)
        # moe: nn.MoE's arguments (n_experts, top_k, ...): a mixture of experts as the MLP
        self.mlp = MLP(n_embd, dropout, bias, dtype=dtype) if not moe else \
            MoE(n_embd, dropout=dropout, dtype=dtype, activation="gelu_tanh", **moe)

    def forward(self, x: ct.Tensor) -> ct.Tensor:
        self.attn.recompute_core = self.recompute == "selective"
        if self.recompute is True and ct.is_grad_enabled():
            return checkpoint(self._forward, x)
        return self._forward(x)

    def _forward(self, x: ct.Tensor) -> ct.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(Module):
    """GPT-2 style language model: token + position embeddings, ``n_layer`` blocks, a final
    LayerNorm and a linear head (tied to the token embedding when ``tie_weights``).

    ``forward(idx, targets=None)`` takes integer ids ``(batch, time)`` with
    ``time <= block_size`` and returns ``(logits, loss)``; ``loss`` is the mean cross
    entropy against ``targets`` (None without targets).

    ``recompute=True`` checkpoints every block (activation recompute: each block keeps only
    its input for the backward and recomputes the rest; same values and gradients).

    ``moe_experts=E`` makes the MLP of every ``moe_every``-th block (the last of each run of
    ``moe_every``: all with 1, every other with 2 as GShard) an :class:`~ctensor.nn.MoE` of
    ``E`` experts (``moe_top_k``, ``moe_capacity_factor``; hidden ``4 * n_embd``). Each
    one's load-balancing loss times ``moe_aux_loss_coef`` is in ``loss`` (its value added;
    its gradient reaches the router through the block's output, as Megatron-Core's
    ``MoEAuxLossAutoScaler``, so recompute and pipeline stages keep it).

    >>> model = nn.GPT(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=16)
    >>> logits, loss = model(idx, targets)
    """

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int,
                 n_embd: int, dropout: float = 0.0, tie_weights: bool = True, bias: bool = True,
                 dtype=None, recompute: bool = False, moe_experts: int = 0, moe_top_k: int = 2,
                 moe_capacity_factor: float = 1.25, moe_aux_loss_coef: float = 0.01,
                 moe_every: int = 1):
        super().__init__()
        self.vocab_size = _check("GPT", "vocab_size", vocab_size)
        self.block_size = _check("GPT", "block_size", block_size)
        self.n_layer = _check("GPT", "n_layer", n_layer)
        self.tie_weights = bool(tie_weights)
        dropout = F.check_probability("GPT", "dropout", dropout)
        self.wte = Embedding(vocab_size, n_embd, std=0.02, dtype=dtype)
        self.wpe = Embedding(block_size, n_embd, std=0.02, dtype=dtype)
        self.drop = Dropout(dropout)
        moe_experts = _check("GPT", "moe_experts", moe_experts, positive=False)
        moe_every = _check("GPT", "moe_every", moe_every)
        moe = {"n_experts": moe_experts, "top_k": moe_top_k,
               "capacity_factor": moe_capacity_factor,
               "aux_loss_coef": moe_aux_loss_coef} if moe_experts else None
        self.blocks = ModuleList([Block(n_embd, n_head, dropout, bias, dtype, recompute,
                                        moe if i % moe_every == moe_every - 1 else None)
                                  for i in range(n_layer)])
        self.ln_f = LayerNorm(n_embd, dtype=dtype)
        self.lm_head = Linear(n_embd, vocab_size, bias=False, dtype=dtype)
        if self.tie_weights:
            self.lm_head.weight = self.wte.weight
        self._init_weights()

    def _init_weights(self) -> None:
        residual_std = 0.02 / math.sqrt(2 * self.n_layer)
        with ct.no_grad():
            for name, mod in self.named_modules():
                if isinstance(mod, MoE):  # w2 projects back into the residual stream
                    for w, std in ((mod.w1, 0.02), (mod.w2, residual_std)):
                        w.copy_(ct.randn(*w.shape, dtype=w.dtype) * std)
                if not isinstance(mod, Linear) or (self.tie_weights and mod is self.lm_head):
                    continue
                std = residual_std if name.endswith(".proj") else 0.02
                w = mod.weight
                w.copy_(ct.randn(*w.shape, dtype=w.dtype) * std)
                if mod.bias is not None:
                    mod.bias.zero_()

    def forward(self, idx: ct.Tensor, targets: Optional[ct.Tensor] = None):
        if not isinstance(idx, ct.Tensor) or idx.ndim != 2 or idx.dtype.kind not in "iu":
            raise TypeError(f"GPT: argument 'idx' must be an integer ct.Tensor of shape "
                            f"(batch, time), got {idx!r}")
        t = idx.shape[1]
        if t > self.block_size:
            raise ValueError(f"GPT: the sequence has {t} tokens but block_size is "
                             f"{self.block_size}; crop the input")
        pos = ct.arange(t, placement=idx.placement)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else \
            F.cross_entropy(logits.flatten(0, -2), targets.flatten())
        if loss is not None:
            for moe in self.moe_layers():  # (the gradient travels with the activations)
                loss = loss + moe.aux_loss_coef * moe.aux_loss.detach()
        return logits, loss

    def moe_layers(self) -> list:
        """The :class:`~ctensor.nn.MoE` layers of the blocks (their ``aux_loss`` and
        ``stats`` are the last forward's)."""
        return [b.mlp for b in self.blocks if isinstance(b.mlp, MoE)]

    def extra_repr(self) -> str:
        return (f"vocab_size={self.vocab_size}, block_size={self.block_size}, "
                f"n_layer={self.n_layer}, tie_weights={self.tie_weights}")

    @property
    def recompute(self):
        """Whether every block is checkpointed (``True``), only its attention core
        (``"selective"``) or neither; assign to switch (``model.recompute = True``)."""
        kinds = {b.recompute for b in self.blocks}
        return kinds.pop() if len(kinds) == 1 else False

    @recompute.setter
    def recompute(self, value) -> None:
        value = value if value == "selective" else bool(value)
        for b in self.blocks:
            b.recompute = value
