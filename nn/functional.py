"""Neural-network ops (``ctensor.nn.functional``, imported as ``F``), written with ctensor ops.

Every function here is a composition of registered ops, so it runs on any placement and
SBP and becomes parallel by itself: a split along a dim that the function reduces over
turns into partial results (``P``, ``P(max)``) and small reductions, never a gather of the
big tensor. Examples:

* ``cross_entropy`` on vocabulary-split logits (``S(1)`` of ``(N, C)``): max via
  ``P(max)``, sum-exp via ``P``, the target logit via :func:`ctensor.pick` (``P``); the
  logits stay split. The losses live in :mod:`ctensor.nn.losses` and are re-exported here.
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

from ._checks import check_float, check_int, check_probability, check_tensor
from .losses import (binary_cross_entropy, binary_cross_entropy_with_logits,  # noqa: F401
                     cross_entropy, huber_loss, kl_div, l1_loss, mse_loss, nll_loss,
                     smooth_l1_loss)

__all__ = ["linear", "relu", "gelu", "silu", "sigmoid", "tanh", "softplus", "leaky_relu",
           "elu", "selu", "logsigmoid", "mish", "hardtanh", "relu6", "hardswish", "glu",
           "cosine_similarity",
           "softmax", "log_softmax", "layer_norm", "rms_norm", "embedding", "one_hot", "pad",
           "normalize", "dropout", "scaled_dot_product_attention",
           "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
           "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div"]


# ----------------------------------------------------------------------------- helpers
_check_tensor, _check_float = check_tensor, check_float


# ----------------------------------------------------------------------------- layers
def linear(input, weight, bias=None):
    """``x @ weight^T + bias`` with ``weight`` of shape ``(out_features, in_features)``.

    Column-parallel: ``weight`` S(0) (and ``bias`` S(0)) gives an output split on its last
    dim; row-parallel: ``x`` split on its last dim with ``weight`` S(1) gives a partial
    output (reduced when needed).

    >>> y = F.linear(x, w, b)          # x (N, 16), w (32, 16), b (32,) -> (N, 32)
    """
    _check_float("linear", "input", input)
    _check_float("linear", "weight", weight)
    if weight.ndim not in (1, 2):
        raise ValueError(f"linear: argument 'weight' must be 1-D or 2-D (out_features, "
                         f"in_features), got shape {tuple(weight.shape)}")
    if input.ndim == 0 or input.shape[-1] != weight.shape[-1]:
        raise ValueError(f"linear: input of shape {tuple(input.shape)} does not match weight of "
                         f"shape {tuple(weight.shape)}; accepted: input.shape[-1] == "
                         f"weight.shape[-1] (in_features)")
    if bias is not None:
        _check_float("linear", "bias", bias)
        expected = tuple(weight.shape[:-1])
        if tuple(bias.shape) != expected:
            raise ValueError(f"linear: argument 'bias' has shape {tuple(bias.shape)}, "
                             f"accepted {expected} (out_features,)")
    return ct.linear(input, weight, bias)


def _result(input, out, inplace: bool):  # noqa: A002
    """``out``; with ``inplace`` (PyTorch's ``inplace=True``) written into ``input`` and
    ``input`` returned, except for a tensor that autograd records (its op keeps what it
    needs for the backward, which the write would change): then the result is returned
    and ``input`` is left as it is — use the returned tensor, as ``x = F.relu(x, True)``."""
    if not inplace or input.requires_grad:
        return out
    return input.copy_(out)


def relu(input, inplace: bool = False):  # noqa: A002 - PyTorch's name
    """``max(x, 0)`` elementwise.

    >>> F.relu(x)
    """
    _check_tensor("relu", "input", input)
    return _result(input, ct.relu(input), inplace)


def gelu(input, approximate: str = "none"):
    """GELU, ``x * Phi(x)``; ``approximate="tanh"`` for the tanh form (GPT-2).

    >>> F.gelu(x, approximate="tanh")
    """
    _check_tensor("gelu", "input", input)
    return ct.gelu(input, approximate=approximate)


def silu(input, inplace: bool = False):
    """SiLU (swish), ``x * sigmoid(x)``: the gate of SwiGLU (Llama's MLP).

    >>> h = F.silu(w1(x)) * w3(x)
    """
    _check_float("silu", "input", input)
    return _result(input, input * ct.sigmoid(input), inplace)


def sigmoid(input):
    """``1 / (1 + exp(-x))`` elementwise.

    >>> F.sigmoid(z)
    """
    _check_float("sigmoid", "input", input)
    return ct.sigmoid(input)


def tanh(input):
    """Hyperbolic tangent elementwise.

    >>> F.tanh(z)
    """
    _check_float("tanh", "input", input)
    return ct.tanh(input)


def softplus(input, beta: float = 1.0, threshold: float = 20.0):
    """``log(1 + exp(beta x)) / beta``, and ``x`` itself where ``beta x > threshold`` (as
    PyTorch); computed as ``(relu(beta x) + log(1 + exp(-|beta x|))) / beta``, which
    never overflows.

    >>> F.softplus(z)
    """
    _check_float("softplus", "input", input)
    bx = input * beta if beta != 1.0 else input
    soft = ct.relu(bx) + ct.log(1.0 + ct.exp(-bx.abs()))
    soft = soft * (1.0 / beta) if beta != 1.0 else soft
    return ct.where(bx > threshold, input, soft)


def leaky_relu(input, negative_slope: float = 0.01, inplace: bool = False):
    """``x`` where ``x > 0``, else ``negative_slope * x``.

    >>> F.leaky_relu(z, 0.2)
    """
    _check_float("leaky_relu", "input", input)
    return _result(input, ct.where(input > 0, input, input * float(negative_slope)), inplace)


def elu(input, alpha: float = 1.0, inplace: bool = False):  # noqa: A002 - PyTorch's name
    """``x`` where ``x > 0``, else ``alpha (exp(x) - 1)`` (the exponential of ``min(x, 0)``,
    so a large ``x`` never overflows the unused branch).

    >>> F.elu(z)
    """
    _check_float("elu", "input", input)
    neg = (ct.exp(ct.clamp(input, max=0.0)) - 1.0) * float(alpha)
    return _result(input, ct.where(input > 0, input, neg), inplace)


_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


def selu(input, inplace: bool = False):  # noqa: A002 - PyTorch's name
    """``scale * elu(x, alpha)`` with SELU's constants."""
    _check_float("selu", "input", input)
    return _result(input, elu(input, _SELU_ALPHA) * _SELU_SCALE, inplace)


def logsigmoid(input):  # noqa: A002 - PyTorch's name
    """``log(sigmoid(x))`` computed as ``min(x, 0) - log(1 + exp(-|x|))`` (stable)."""
    _check_float("logsigmoid", "input", input)
    return ct.clamp(input, max=0.0) - ct.log(1.0 + ct.exp(-input.abs()))


def mish(input, inplace: bool = False):  # noqa: A002 - PyTorch's name
    """``x * tanh(softplus(x))``."""
    _check_float("mish", "input", input)
    return _result(input, input * ct.tanh(softplus(input)), inplace)


def hardtanh(input, min_val: float = -1.0, max_val: float = 1.0,  # noqa: A002
             inplace: bool = False):
    """``x`` clipped to ``[min_val, max_val]``; gradient 1 strictly inside, else 0 (as
    PyTorch)."""
    _check_float("hardtanh", "input", input)
    lo, hi = float(min_val), float(max_val)
    if lo > hi:
        raise ValueError(f"hardtanh: min_val ({lo}) must not exceed max_val ({hi})")
    out = ct.where(input <= lo, lo, ct.where(input >= hi, hi, input))
    return _result(input, out, inplace)


def relu6(input, inplace: bool = False):  # noqa: A002 - PyTorch's name
    """``min(max(x, 0), 6)``."""
    return hardtanh(input, 0.0, 6.0, inplace)


def hardswish(input, inplace: bool = False):  # noqa: A002 - PyTorch's name
    """``x * relu6(x + 3) / 6``."""
    _check_float("hardswish", "input", input)
    return _result(input, input * relu6(input + 3.0) * (1.0 / 6.0), inplace)


def glu(input, dim: int = -1):  # noqa: A002 - PyTorch's name
    """Gated linear unit: the first half of ``dim`` times the sigmoid of the second.

    >>> F.glu(ct.randn(4, 10))          # (4, 5)
    """
    _check_float("glu", "input", input)
    if input.ndim == 0 or input.shape[dim] % 2:
        raise ValueError(f"glu: dim {dim} of input of shape {tuple(input.shape)} must have an "
                         f"even size (it is halved)")
    a, b = input.chunk(2, dim)
    return a * ct.sigmoid(b)


def cosine_similarity(x1, x2, dim: int = 1, eps: float = 1e-8):
    """``sum(x1 / max(||x1||, eps) * x2 / max(||x2||, eps), dim)``, broadcasting ``x1``
    and ``x2`` (PyTorch's formula: each normalised first).

    >>> F.cosine_similarity(a, b, dim=-1)
    """
    _check_float("cosine_similarity", "x1", x1)
    _check_float("cosine_similarity", "x2", x2)
    n1 = ct.clamp(ct.norm(x1, 2, dim, True), min=float(eps))
    n2 = ct.clamp(ct.norm(x2, 2, dim, True), min=float(eps))
    return ((x1 / n1) * (x2 / n2)).sum(dim)


def softmax(input, dim: int, _stacklevel: int = 3, dtype=None):
    """``exp(x) / sum(exp(x), dim)``, numerically stable (``dtype``: cast first, as
    PyTorch). A split along another dim stays local; a split along ``dim`` uses a max over
    ranks (P(max)) and a sum (P).

    >>> p = F.softmax(scores, dim=-1)
    """
    _check_float("softmax", "input", input)
    return ct.softmax(input if dtype is None else input.to(dtype), dim)


def log_softmax(input, dim: int, _stacklevel: int = 3, dtype=None):
    """``x - logsumexp(x, dim)``, numerically stable; splits as :func:`softmax`.

    >>> logp = F.log_softmax(logits, dim=-1)
    """
    _check_float("log_softmax", "input", input)
    return ct.log_softmax(input if dtype is None else input.to(dtype), dim)


def layer_norm(input, normalized_shape: Union[int, Sequence[int]], weight=None, bias=None,
               eps: float = 1e-5):
    """Normalise over the last ``len(normalized_shape)`` dims (biased variance), then scale
    by ``weight`` and shift by ``bias`` (both of ``normalized_shape``, optional).

    A split of a normalised dim works through partial means (two small all-reduces);
    other splits stay local.

    >>> y = F.layer_norm(x, (64,), gamma, beta)
    """
    _check_float("layer_norm", "input", input)
    for arg, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            _check_float("layer_norm", arg, t)
    return ct.layer_norm(input, normalized_shape, weight, bias, eps)


def _normalized_dims(fn: str, x, normalized_shape) -> tuple:
    shape = (int(normalized_shape),) if isinstance(normalized_shape, (int, np.integer)) \
        else tuple(int(n) for n in normalized_shape)
    if not shape or tuple(x.shape[x.ndim - len(shape):]) != shape or len(shape) > x.ndim:
        raise ValueError(f"{fn}: argument 'normalized_shape' {shape} does not match the last "
                         f"dims of input of shape {tuple(x.shape)}; accepted: the input's "
                         f"trailing dims")
    return tuple(range(x.ndim - len(shape), x.ndim))


def rms_norm(input, normalized_shape: Union[int, Sequence[int]], weight=None,
             eps: Optional[float] = None):
    """Root-mean-square normalisation over the last ``len(normalized_shape)`` dims:
    ``x * rsqrt(mean(x^2) + eps) * weight``; ``eps`` defaults to the dtype's machine
    epsilon (PyTorch's default). A split of a normalised dim reduces the partial mean
    (one small all-reduce); other splits stay local.

    >>> y = F.rms_norm(x, (64,), w, eps=1e-6)
    """
    _check_float("rms_norm", "input", input)
    dims = _normalized_dims("rms_norm", input, normalized_shape)
    if eps is None:
        eps = float(np.finfo(input.dtype).eps)
    y = input * ct.rsqrt((input * input).mean(dims, keepdim=True) + eps)
    if weight is not None:
        _check_float("rms_norm", "weight", weight)
        y = y * weight
    return y


def zero_padding_row(weight, padding_idx: int):
    """``weight`` with row ``padding_idx`` set to zero (elementwise, so any layout)."""
    rows = ct.arange(weight.shape[0], placement=weight.placement).unsqueeze(-1)
    return ct.where(rows == padding_idx, 0.0, weight)


def embedding(input, weight, padding_idx: Optional[int] = None,  # noqa: A002 - PyTorch's
              max_norm=None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
              sparse: bool = False):
    """Rows of ``weight`` (num_embeddings, embedding_dim) at the integer ids ``input``;
    ``padding_idx``: that row gets no gradient (its value is looked up as it is).

    A vocabulary-split ``weight`` (S(0)) is looked up in place (each rank fills the ids it
    holds, the partial sum is the result); its gradient stays vocabulary-split.

    >>> h = F.embedding(ids, wte)      # (B, T) ids -> (B, T, C)
    """
    if max_norm is not None or scale_grad_by_freq or sparse:
        raise ValueError("embedding: max_norm, scale_grad_by_freq and sparse are not "
                         "supported; renormalise or rescale the weight explicitly")
    _check_tensor("embedding", "input", input)
    _check_float("embedding", "weight", weight)
    if input.dtype.kind not in "iu":
        raise TypeError(f"embedding: argument 'input' must be an integer tensor of ids, got "
                        f"{input.dtype}")
    if weight.ndim != 2:
        raise ValueError(f"embedding: argument 'weight' must be 2-D (num_embeddings, "
                         f"embedding_dim), got shape {tuple(weight.shape)}")
    if padding_idx is not None:
        # the padding row's value, detached: its gradient is zero (PyTorch's rule)
        rows = ct.arange(weight.shape[0], placement=weight.placement).unsqueeze(-1)
        weight = ct.where(rows == int(padding_idx) % weight.shape[0], weight.detach(), weight)
    return ct.embedding(input, weight)


def one_hot(tensor, num_classes: int = -1):
    """``(..., num_classes)`` int64 with a 1 at each class id of ``tensor``;
    ``num_classes=-1`` takes ``tensor.max() + 1`` (a collective: every rank calls it).
    Split ids stay split (the class dim is new and whole).

    >>> F.one_hot(ct.tensor([0, 2]), 3)       # [[1, 0, 0], [0, 0, 1]]
    """
    check_int("one_hot", "tensor", tensor)
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)):
        raise TypeError(f"one_hot: argument 'num_classes' must be an int, got "
                        f"{num_classes!r}")
    if tensor.numel() and int(tensor.min().item()) < 0:
        raise ValueError("one_hot: class ids must be non-negative; got a negative id")
    if num_classes == -1:
        num_classes = int(tensor.max().item()) + 1 if tensor.numel() else 0
    elif num_classes < 1 or (tensor.numel() and int(tensor.max().item()) >= num_classes):
        raise ValueError(f"one_hot: argument 'num_classes' is {num_classes}; accepted: -1 or "
                         f"a number larger than every class id")
    classes = ct.arange(int(num_classes), placement=tensor.placement, dtype=tensor.dtype)
    return (tensor.unsqueeze(-1) == classes).to(np.int64)


PAD_MODES = ("constant", "reflect", "replicate", "circular")


def _pad_block(x, dim: int, size: int, value):
    """A ``value``-filled block shaped like ``x`` but ``size`` long along ``dim``, laid out
    like ``x`` (splits of other dims kept, so ``cat`` needs no communication for them)."""
    shape = list(x.shape)
    shape[dim] = size
    sbp = tuple(s if isinstance(s, ct.sbp.Split) and s.dim != dim else ct.sbp.broadcast
                for s in x.sbp)
    return ct.full(*shape, fill_value=value, placement=x.placement, sbp=sbp, dtype=x.dtype)


def pad(input, pad: Sequence[int], mode: str = "constant",  # noqa: A002 - PyTorch's names
        value: Optional[float] = None):
    """Pad ``input``: ``pad`` is ``(left_last, right_last, left_second_last, ...)`` as in
    PyTorch (negative amounts crop, ``constant`` mode). Modes: ``constant`` (``value``,
    default 0), ``reflect`` (mirror without the edge), ``replicate`` (the edge repeated),
    ``circular`` (wrap around). Written with ``narrow``, ``flip`` and ``cat``: works on every
    layout (a split of a padded dim is boxed by ``cat``, other splits stay local).

    >>> F.pad(x, (1, 1))                      # last dim +2, zeros
    >>> F.pad(img, (2, 2, 2, 2), mode="reflect")
    """
    _check_tensor("pad", "input", input)
    pad = tuple(pad)
    if len(pad) % 2 or len(pad) // 2 > input.ndim or \
            not all(isinstance(p, (int, np.integer)) and not isinstance(p, bool) for p in pad):
        raise ValueError(f"pad: argument 'pad' must hold an even number of ints, at most "
                         f"2 * input.ndim ({2 * input.ndim}), got {pad!r}")
    if mode not in PAD_MODES:
        raise ValueError(f"pad: argument 'mode' is {mode!r}, accepted {PAD_MODES}")
    if mode != "constant" and value:
        raise ValueError(f"pad: argument 'value' is only for mode='constant', got mode "
                         f"{mode!r} and value {value!r}")
    x = input
    for i in range(len(pad) // 2):
        dim = x.ndim - 1 - i
        left, right = int(pad[2 * i]), int(pad[2 * i + 1])
        n = x.shape[dim]
        if mode != "constant" and (left < 0 or right < 0 or
                                   max(left, right) > (n - 1 if mode == "reflect" else n) or
                                   n == 0):
            most = n - 1 if mode == "reflect" else n
            raise ValueError(f"pad: mode {mode!r} pads dim {dim} of size {n} by "
                             f"({left}, {right}); accepted: amounts in 0..{most}")
        if mode == "constant":
            if left < 0:
                x, left, n = x.narrow(dim, -left, n + left), 0, n + left
            if right < 0:
                x, right, n = x.narrow(dim, 0, n + right), 0, n + right
            fill = 0 if value is None else value
            lo = _pad_block(x, dim, left, fill) if left else None
            hi = _pad_block(x, dim, right, fill) if right else None
        elif mode == "reflect":
            lo = x.narrow(dim, 1, left).flip(dim) if left else None
            hi = x.narrow(dim, n - 1 - right, right).flip(dim) if right else None
        elif mode == "replicate":
            def edge(start, size):
                shape = list(x.shape)
                shape[dim] = size
                return x.narrow(dim, start, 1).expand(*shape)
            lo = edge(0, left) if left else None
            hi = edge(n - 1, right) if right else None
        else:
            lo = x.narrow(dim, n - left, left) if left else None
            hi = x.narrow(dim, 0, right) if right else None
        parts = [p for p in (lo, x, hi) if p is not None]
        x = ct.cat(parts, dim) if len(parts) > 1 else x
    return x


def normalize(input, p: float = 2.0, dim: int = 1, eps: float = 1e-12,  # noqa: A002
              out=None):
    """``input / max(||input||_p, eps)`` along ``dim`` (PyTorch's default ``dim=1``);
    ``out``: written there too.

    >>> F.normalize(emb, dim=-1)
    """
    _check_float("normalize", "input", input)
    norm = ct.norm(input, p, dim, True)
    result = input / ct.clamp(norm, min=float(eps))
    return result if out is None else out.copy_(result)


# ----------------------------------------------------------------------------- dropout
def dropout(input, p: float = 0.5, training: bool = True,  # noqa: A002 - PyTorch's name
            inplace: bool = False):
    """Zero each element with probability ``p`` and scale the rest by ``1 / (1 - p)``.

    The mask is a pure function of the seed and the element's logical index
    (``ct.rand_like``), so it is the same for every placement and SBP.

    >>> h = F.dropout(h, 0.1, training=model.training)
    """
    _check_float("dropout", "input", input)
    p = check_probability("dropout", "p", p)
    if not training or p == 0.0:
        return input
    if p == 1.0:
        return _result(input, input * 0.0, inplace)
    # the mask takes input's splits (partial axes become broadcast): drawn locally, no
    # traffic; masking is linear, so a partial input stays partial
    keep = ct.rand_like(input) >= p
    return _result(input, ct.where(keep, input, 0.0) * (1.0 / (1.0 - p)), inplace)


# ----------------------------------------------------------------------------- attention
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0,
                                 is_causal: bool = False, *, scale: Optional[float] = None,
                                 enable_gqa: bool = False):
    """``softmax(q @ k^T * scale + mask) @ v`` for ``q`` (..., L, E), ``k`` (..., S, E),
    ``v`` (..., S, Ev), typically (B, H, T, D); PyTorch's arguments in PyTorch's order.
    ``scale`` defaults to ``1/sqrt(E)``; ``is_causal`` masks key positions after the
    query's (top-left aligned, like PyTorch); ``attn_mask`` is a bool mask (True = attend)
    or a float mask added to the scores. ``enable_gqa``: key and value with fewer heads
    (dim -3) than the query are repeated to its number (grouped-query attention).

    Without a mask it is the fused core :func:`ctensor.attention` (scores never held
    whole; inputs split on the sequence run as a ring over that mesh axis, or as Ulysses'
    head split, as the cost model picks; dropout draws the bits the composite draws); with
    one, the composite of ``linear``, ``causal_fill``/``where``, ``softmax``, ``dropout``
    and a matmul. Head-split (S(1)) or
    batch-split inputs run with no communication; the causal mask is computed from each
    shard's offsets.

    >>> y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    """
    fn = "scaled_dot_product_attention"
    q, k, v = query, key, value
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
    if enable_gqa and q.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        if k.shape[-3] == 0 or q.shape[-3] % k.shape[-3]:
            raise ValueError(f"{fn}: enable_gqa needs the query's heads ({q.shape[-3]}) to be "
                             f"a multiple of the key's ({k.shape[-3]})")
        group = q.shape[-3] // k.shape[-3]
        k = k.repeat_interleave(group, dim=-3)
        v = v.repeat_interleave(group, dim=-3)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1]) if q.shape[-1] else 1.0
    if attn_mask is None and dropout_p < 1.0 and q.shape[:-2] == k.shape[:-2] and \
            k.shape[:-2] == v.shape[:-2] and q.dtype == k.dtype == v.dtype:
        # the fused core: O(L) activations; a sequence split runs as a ring (or Ulysses);
        # its dropout draws the composite's bits (ct.rand_like of the probabilities)
        return ct.attention(q, k, v, causal=is_causal, scale=scale, dropout=float(dropout_p))
    # (a mask or broadcast batch dims: the composite, which materialises the scores; a
    # sequence split of q, k, v gathers there)
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
