"""Neural-network ops (``ctensor.nn.functional``, imported as ``F``), written with ctensor ops.

Every function here is a composition of registered ops, so it runs on any placement and
SBP and becomes parallel by itself: a split along a dim that the function reduces over
turns into partial results (``P``, ``P(max)``) and small reductions, never a gather of the
big tensor. Examples:

* ``cross_entropy`` on vocabulary-split logits (``S(1)``): max via ``P(max)``, sum-exp via
  ``P``, the target logit via :func:`ctensor.pick` (``P``); the logits stay split.
* ``scaled_dot_product_attention`` on head-split ``q, k, v`` (``S(1)``): all local.
* ``linear`` with a column-split weight then a row-split one: Megatron's tensor-parallel
  MLP, with one all-reduce at the end.

The kernels these need of their own (embedding lookup, the target pick, fused softmax,
layer norm and cross entropy, the causal mask) are core ops in ``ctensor/ops/``
(``embedding.py``, ``loss.py``, ``softmax.py``, ``normalization.py``, ``masking.py``),
which also choose between a fused kernel and a composite by cost; a function here picks no
layout itself.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import numpy as np

import ctensor as ct

__all__ = ["linear", "relu", "gelu", "softmax", "log_softmax", "layer_norm", "embedding",
           "cross_entropy", "dropout", "scaled_dot_product_attention"]


# ----------------------------------------------------------------------------- helpers
def _check_tensor(fn: str, arg: str, x) -> None:
    if not isinstance(x, ct.Tensor):
        raise TypeError(f"{fn}: argument '{arg}' must be a ct.Tensor, got "
                        f"{type(x).__name__}")


def _check_float(fn: str, arg: str, x) -> None:
    _check_tensor(fn, arg, x)
    if x.dtype.kind not in "fc":
        raise TypeError(f"{fn}: argument '{arg}' must be a floating tensor, got {x.dtype}; "
                        f"convert it with .float()")


def check_probability(fn: str, arg: str, p) -> float:
    """``p`` as a float in [0, 1]; ``ValueError`` naming the function and argument."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{fn}: argument '{arg}' must be a probability in [0, 1], got {p!r}")
    return float(p)


# ----------------------------------------------------------------------------- layers
def linear(x, weight, bias=None):
    """``x @ weight^T + bias`` with ``weight`` of shape ``(out_features, in_features)``.

    Column-parallel: ``weight`` S(0) (and ``bias`` S(0)) gives an output split on its last
    dim; row-parallel: ``x`` split on its last dim with ``weight`` S(1) gives a partial
    output (reduced when needed).

    >>> y = F.linear(x, w, b)          # x (N, 16), w (32, 16), b (32,) -> (N, 32)
    """
    _check_float("linear", "input", x)
    _check_float("linear", "weight", weight)
    if weight.ndim not in (1, 2):
        raise ValueError(f"linear: argument 'weight' must be 1-D or 2-D (out_features, "
                         f"in_features), got shape {tuple(weight.shape)}")
    if x.ndim == 0 or x.shape[-1] != weight.shape[-1]:
        raise ValueError(f"linear: input of shape {tuple(x.shape)} does not match weight of "
                         f"shape {tuple(weight.shape)}; accepted: input.shape[-1] == "
                         f"weight.shape[-1] (in_features)")
    if bias is not None:
        _check_float("linear", "bias", bias)
        expected = tuple(weight.shape[:-1])
        if tuple(bias.shape) != expected:
            raise ValueError(f"linear: argument 'bias' has shape {tuple(bias.shape)}, "
                             f"accepted {expected} (out_features,)")
    return ct.linear(x, weight, bias)


def relu(x):
    """``max(x, 0)`` elementwise.

    >>> F.relu(x)
    """
    _check_tensor("relu", "input", x)
    return ct.relu(x)


def gelu(x, approximate: str = "none"):
    """GELU, ``x * Phi(x)``; ``approximate="tanh"`` for the tanh form (GPT-2).

    >>> F.gelu(x, approximate="tanh")
    """
    _check_tensor("gelu", "input", x)
    return ct.gelu(x, approximate=approximate)


def softmax(x, dim: int):
    """``exp(x) / sum(exp(x), dim)``, numerically stable. A split along another dim stays
    local; a split along ``dim`` uses a max over ranks (P(max)) and a sum (P).

    >>> p = F.softmax(scores, dim=-1)
    """
    _check_float("softmax", "input", x)
    return ct.softmax(x, dim)


def log_softmax(x, dim: int):
    """``x - logsumexp(x, dim)``, numerically stable; splits as :func:`softmax`.

    >>> logp = F.log_softmax(logits, dim=-1)
    """
    _check_float("log_softmax", "input", x)
    return ct.log_softmax(x, dim)


def layer_norm(x, normalized_shape: Union[int, Sequence[int]], weight=None, bias=None,
               eps: float = 1e-5):
    """Normalise over the last ``len(normalized_shape)`` dims (biased variance), then scale
    by ``weight`` and shift by ``bias`` (both of ``normalized_shape``, optional).

    A split of a normalised dim works through partial means (two small all-reduces);
    other splits stay local.

    >>> y = F.layer_norm(x, (64,), gamma, beta)
    """
    _check_float("layer_norm", "input", x)
    for arg, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            _check_float("layer_norm", arg, t)
    return ct.layer_norm(x, normalized_shape, weight, bias, eps)


def embedding(input, weight):  # noqa: A002 - PyTorch's name
    """Rows of ``weight`` (num_embeddings, embedding_dim) at the integer ids ``input``.

    A vocabulary-split ``weight`` (S(0)) is looked up in place (each rank fills the ids it
    holds, the partial sum is the result); its gradient stays vocabulary-split.

    >>> h = F.embedding(ids, wte)      # (B, T) ids -> (B, T, C)
    """
    _check_tensor("embedding", "input", input)
    _check_float("embedding", "weight", weight)
    if input.dtype.kind not in "iu":
        raise TypeError(f"embedding: argument 'input' must be an integer tensor of ids, got "
                        f"{input.dtype}")
    if weight.ndim != 2:
        raise ValueError(f"embedding: argument 'weight' must be 2-D (num_embeddings, "
                         f"embedding_dim), got shape {tuple(weight.shape)}")
    return ct.embedding(input, weight)


# ----------------------------------------------------------------------------- losses
_REDUCTIONS = ("mean", "sum", "none")


def cross_entropy(logits, target, ignore_index: int = -100, reduction: str = "mean"):
    """Softmax cross entropy of ``logits`` (..., C) against integer class ids ``target``
    (...), e.g. (N, C) with (N,) or (B, T, C) with (B, T); the class dim is the last.

    ``reduction``: ``"mean"`` over the targets that are not ``ignore_index``, ``"sum"``, or
    ``"none"`` (per-target losses, 0 where ignored). For float16 logits the per-target
    losses are computed in float32 inside and the mean or sum is reduced and returned in
    float32 (as PyTorch's autocast does), so loss scaling cannot overflow it. Class-split logits (S(last)) are never
    gathered: max via P(max), sum of exponentials via P, the target logit via
    :func:`ctensor.pick` (P); only row statistics move.

    >>> loss = F.cross_entropy(logits, targets)
    """
    _check_float("cross_entropy", "input", logits)
    _check_tensor("cross_entropy", "target", target)
    if reduction not in _REDUCTIONS:
        raise ValueError(f"cross_entropy: argument 'reduction' is {reduction!r}, accepted "
                         f"{_REDUCTIONS}")
    # the op checks the target's dtype and shape (class dim last)
    loss = ct.softmax_cross_entropy(logits, target, ignore_index=ignore_index)
    if reduction == "none":
        return loss
    if loss.dtype == np.float16:
        # a float16 sum of many per-target losses overflows (65504) or loses its digits:
        # reduce in float32 and return float32, as PyTorch's autocast does for this op
        loss = loss.float()
    total = loss.sum()
    if reduction == "sum":
        return total
    return total / (target != ignore_index).to(loss.dtype).sum()


# ----------------------------------------------------------------------------- dropout
def dropout(x, p: float = 0.5, training: bool = True):
    """Zero each element with probability ``p`` and scale the rest by ``1 / (1 - p)``.

    The mask is a pure function of the seed and the element's logical index
    (``ct.rand_like``), so it is the same for every placement and SBP.

    >>> h = F.dropout(h, 0.1, training=model.training)
    """
    _check_float("dropout", "input", x)
    p = check_probability("dropout", "p", p)
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0
    # the mask takes x's splits (partial axes become broadcast): drawn locally, no traffic;
    # masking is linear, so a partial x stays partial
    keep = ct.rand_like(x) >= p
    return ct.where(keep, x, 0.0) * (1.0 / (1.0 - p))


# ----------------------------------------------------------------------------- attention
def scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal: bool = False,
                                 dropout_p: float = 0.0, scale: Optional[float] = None):
    """``softmax(q @ k^T * scale + mask) @ v`` for ``q`` (..., L, E), ``k`` (..., S, E),
    ``v`` (..., S, Ev), typically (B, H, T, D). ``scale`` defaults to ``1/sqrt(E)``;
    ``is_causal`` masks key positions after the query's (top-left aligned, like PyTorch);
    ``attn_mask`` is a bool mask (True = attend) or a float mask added to the scores.

    Head-split (S(1)) or batch-split inputs run with no communication; the causal mask is
    computed from each shard's offsets.

    >>> y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    """
    fn = "scaled_dot_product_attention"
    for arg, t in (("query", q), ("key", k), ("value", v)):
        _check_float(fn, arg, t)
        if t.ndim < 2:
            raise ValueError(f"{fn}: argument '{arg}' needs at least 2 dims (..., L, E), got "
                             f"shape {tuple(t.shape)}")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"{fn}: shapes query {tuple(q.shape)}, key {tuple(k.shape)}, value "
                         f"{tuple(v.shape)} do not fit; accepted: query (..., L, E), key "
                         f"(..., S, E), value (..., S, Ev)")
    if is_causal and attn_mask is not None:
        raise ValueError(f"{fn}: pass either attn_mask or is_causal=True, not both")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1]) if q.shape[-1] else 1.0
    scores = ct.linear(q, k) * scale  # q @ k^T, no transpose op
    if is_causal:
        scores = ct.causal_fill(scores, float("-inf"))
    elif attn_mask is not None:
        _check_tensor(fn, "attn_mask", attn_mask)
        if attn_mask.dtype == np.dtype(bool):
            scores = ct.where(attn_mask, scores, float("-inf"))
        else:
            scores = scores + attn_mask
    attn = ct.softmax(scores, -1)
    if dropout_p > 0.0:
        attn = dropout(attn, dropout_p, training=True)
    return attn @ v
