"""``nn.MultiheadAttention`` with PyTorch's arguments, parameter names and masks.

Parameters as PyTorch (so a PyTorch ``state_dict`` loads as it is): ``in_proj_weight``
``(3E, E)`` and ``in_proj_bias`` ``(3E,)`` when query, key and value have one width
(otherwise ``q_proj_weight``, ``k_proj_weight``, ``v_proj_weight``), and ``out_proj`` a
``Linear(E, E)``. Initialised as PyTorch: ``in_proj_weight`` Xavier-uniform, biases zero,
``out_proj.weight`` as ``Linear``'s.

Masks follow ``nn.MultiheadAttention`` (not ``scaled_dot_product_attention``): a *bool*
``attn_mask`` or ``key_padding_mask`` is True where attention is **not** allowed; a float
mask is added to the scores.
"""
from __future__ import annotations

import copy
import math
from typing import Optional

import numpy as np

import ctensor as ct

from . import functional as F
from . import init
from ._checks import check_probability, check_tensor
from .layers import (Dropout, LayerNorm, Linear, ModuleList, _dtype, _positive,
                     check_device)
from .module import Module, Parameter

__all__ = ["MultiheadAttention", "TransformerEncoderLayer", "TransformerEncoder"]


def _additive(fn: str, arg: str, mask, dtype):
    """A mask as a float mask added to the scores: bool True -> -inf."""
    check_tensor(fn, arg, mask)
    if mask.dtype == np.dtype(bool):
        return ct.where(mask, float("-inf"), 0.0).to(dtype)
    if mask.dtype.kind != "f":
        raise TypeError(f"{fn}: argument '{arg}' must be a bool or floating tensor, got "
                        f"{mask.dtype}")
    return mask.to(dtype)


class MultiheadAttention(Module):
    """Multi-head attention ``softmax(q k^T / sqrt(d) + mask) v`` over ``num_heads`` heads,
    PyTorch's ``nn.MultiheadAttention``.

    ``forward(query, key, value, key_padding_mask=None, need_weights=True,
    attn_mask=None, average_attn_weights=True, is_causal=False)`` returns ``(output,
    weights)``: inputs ``(L, N, E)`` (``(N, L, E)`` with ``batch_first=True``; ``(L, E)``
    unbatched); ``weights`` ``(N, L, S)`` averaged over heads (``(N, H, L, S)`` with
    ``average_attn_weights=False``), None with ``need_weights=False``. ``attn_mask``
    ``(L, S)`` or ``(N * H, L, S)``; ``key_padding_mask`` ``(N, S)``. ``is_causal`` is a
    hint that ``attn_mask`` is the causal mask (it must still be given, as in PyTorch).

    >>> mha = nn.MultiheadAttention(16, 4, batch_first=True)
    >>> y, w = mha(x, x, x, key_padding_mask=pad)    # x (N, L, 16), pad (N, L) bool
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0,
                 bias: bool = True, add_bias_kv: bool = False, add_zero_attn: bool = False,
                 kdim: Optional[int] = None, vdim: Optional[int] = None,
                 batch_first: bool = False, device=None, dtype=None):
        super().__init__()
        fn = "MultiheadAttention"
        check_device(fn, device)
        self.embed_dim = _positive(fn, "embed_dim", embed_dim)
        self.num_heads = _positive(fn, "num_heads", num_heads)
        if self.embed_dim % self.num_heads:
            raise ValueError(f"{fn}: argument 'embed_dim' ({embed_dim}) must be divisible by "
                             f"'num_heads' ({num_heads})")
        if add_bias_kv or add_zero_attn:
            raise ValueError(f"{fn}: add_bias_kv and add_zero_attn are not supported; append "
                             f"the extra key/value row to key and value yourself")
        self.kdim = self.embed_dim if kdim is None else _positive(fn, "kdim", kdim)
        self.vdim = self.embed_dim if vdim is None else _positive(fn, "vdim", vdim)
        self._qkv_same_embed_dim = self.kdim == self.embed_dim and self.vdim == self.embed_dim
        self.dropout = check_probability(fn, "dropout", dropout)
        self.batch_first = bool(batch_first)
        self.head_dim = self.embed_dim // self.num_heads
        dt = _dtype(dtype)
        e = self.embed_dim
        if self._qkv_same_embed_dim:
            self.in_proj_weight = Parameter(ct.zeros(3 * e, e, dtype=dt))
            init.xavier_uniform_(self.in_proj_weight)
            for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                self.register_parameter(name, None)
        else:
            self.register_parameter("in_proj_weight", None)
            for name, d in (("q_proj_weight", e), ("k_proj_weight", self.kdim),
                            ("v_proj_weight", self.vdim)):
                setattr(self, name, Parameter(ct.zeros(e, d, dtype=dt)))
                init.xavier_uniform_(getattr(self, name))
        if bias:
            self.in_proj_bias = Parameter(ct.zeros(3 * e, dtype=dt))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(e, e, bias=bias, dtype=dt)
        if bias:
            init.zeros_(self.out_proj.bias)

    def _projections(self, query, key, value):
        e = self.embed_dim
        b = self.in_proj_bias
        biases = (None, None, None) if b is None else \
            (b.narrow(0, 0, e), b.narrow(0, e, e), b.narrow(0, 2 * e, e))
        if self._qkv_same_embed_dim:
            w = self.in_proj_weight
            if query is key and key is value:  # self-attention: one matmul, then split
                qkv = F.linear(query, w, b)
                return qkv.narrow(-1, 0, e), qkv.narrow(-1, e, e), qkv.narrow(-1, 2 * e, e)
            weights = (w.narrow(0, 0, e), w.narrow(0, e, e), w.narrow(0, 2 * e, e))
        else:
            weights = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
        return tuple(F.linear(x, wt, bt) for x, wt, bt in zip((query, key, value), weights,
                                                              biases))

    def forward(self, query, key, value, key_padding_mask=None, need_weights: bool = True,
                attn_mask=None, average_attn_weights: bool = True, is_causal: bool = False):
        fn = "MultiheadAttention"
        for arg, t in (("query", query), ("key", key), ("value", value)):
            check_tensor(fn, arg, t)
        if is_causal and attn_mask is None:
            raise ValueError(f"{fn}: is_causal=True is a hint that attn_mask is the causal "
                             f"mask; pass attn_mask too (e.g. ct.ones(L, L).triu(1).bool())")
        unbatched = query.ndim == 2
        if unbatched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif query.ndim != 3:
            raise ValueError(f"{fn}: query must be 2-D (L, E) or 3-D, got shape "
                             f"{tuple(query.shape)}")
        if self.batch_first and not unbatched:  # (N, L, E) -> (L, N, E)
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        if query.shape[-1] != self.embed_dim or key.shape[-1] != self.kdim or \
                value.shape[-1] != self.vdim or key.shape[:2] != value.shape[:2] or \
                query.shape[1] != key.shape[1]:
            raise ValueError(f"{fn}: shapes query {tuple(query.shape)}, key "
                             f"{tuple(key.shape)}, value {tuple(value.shape)} do not fit "
                             f"embed_dim {self.embed_dim}, kdim {self.kdim}, vdim "
                             f"{self.vdim} (sequence-first unless batch_first=True)")
        tgt, n, e = query.shape
        src = key.shape[0]
        h, hd = self.num_heads, self.head_dim
        q, k, v = self._projections(query, key, value)

        def heads(x, length):  # (length, N, E) -> (N, H, length, hd)
            return x.reshape(length, n, h, hd).permute(1, 2, 0, 3)

        q, k, v = heads(q, tgt), heads(k, src), heads(v, src)
        scores = ct.linear(q, k) * (1.0 / math.sqrt(hd))          # (N, H, L, S)
        if attn_mask is not None:
            mask = _additive(fn, "attn_mask", attn_mask, scores.dtype)
            if mask.ndim == 3:
                mask = mask.reshape(n, h, tgt, src)
            elif mask.ndim != 2:
                raise ValueError(f"{fn}: argument 'attn_mask' must be (L, S) or (N * H, L, "
                                 f"S), got shape {tuple(attn_mask.shape)}")
            scores = scores + mask
        if key_padding_mask is not None:
            pad = _additive(fn, "key_padding_mask", key_padding_mask, scores.dtype)
            if tuple(pad.shape) != (n, src):
                raise ValueError(f"{fn}: argument 'key_padding_mask' must have shape "
                                 f"(N, S) = {(n, src)}, got {tuple(key_padding_mask.shape)}")
            scores = scores + pad.reshape(n, 1, 1, src)
        attn = ct.softmax(scores, -1)
        if self.training and self.dropout > 0.0:
            attn = F.dropout(attn, self.dropout, training=True)
        out = (attn @ v).permute(2, 0, 1, 3).reshape(tgt, n, e)    # (L, N, E)
        out = self.out_proj(out)
        if self.batch_first and not unbatched:
            out = out.transpose(0, 1)
        if unbatched:
            out = out.squeeze(1)
        if not need_weights:
            return out, None
        weights = attn.mean(1) if average_attn_weights else attn
        return out, (weights.squeeze(0) if unbatched else weights)

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"dropout={self.dropout}, batch_first={self.batch_first}")


_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


class TransformerEncoderLayer(Module):
    """PyTorch's ``nn.TransformerEncoderLayer``: self-attention and a feed-forward block,
    each with a residual and a LayerNorm (after, or before with ``norm_first``), under
    PyTorch's parameter names (``self_attn``, ``linear1``, ``linear2``, ``norm1``,
    ``norm2``), so its ``state_dict`` loads.

    >>> layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, batch_first=True)
    >>> y = layer(x, src_key_padding_mask=pad)
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation="relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True,
                 device=None, dtype=None):
        super().__init__()
        fn = "TransformerEncoderLayer"
        check_device(fn, device)
        if isinstance(activation, str):
            if activation not in _ACTIVATIONS:
                raise ValueError(f"{fn}: argument 'activation' is {activation!r}, accepted "
                                 f"{sorted(_ACTIVATIONS)} or a callable")
            activation = _ACTIVATIONS[activation]
        elif not callable(activation):
            raise TypeError(f"{fn}: argument 'activation' must be a str or callable, got "
                            f"{type(activation).__name__}")
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first, dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, dtype=dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, dtype=dtype)
        self.norm_first = bool(norm_first)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = activation

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           need_weights=False, is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x):
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal: bool = False):
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x))


class TransformerEncoder(Module):
    """``num_layers`` copies of ``encoder_layer`` (its weights copied, as PyTorch's
    ``deepcopy``), then ``norm`` if given; ``layers.0``, ``layers.1``, ... as PyTorch.

    >>> enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 4, 32), num_layers=2)
    """

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int,
                 norm: Optional[Module] = None, enable_nested_tensor: bool = True,
                 mask_check: bool = True):
        super().__init__()
        num_layers = _positive("TransformerEncoder", "num_layers", num_layers)
        self.layers = ModuleList([copy.deepcopy(encoder_layer) for _ in range(num_layers)])
        self.num_layers = num_layers
        if norm is not None:
            self.norm = norm
        else:
            self.register_parameter("norm", None)

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        out = src
        for layer in self.layers:
            out = layer(out, src_mask=mask, src_key_padding_mask=src_key_padding_mask,
                        is_causal=bool(is_causal))
        return out if self.norm is None else self.norm(out)
