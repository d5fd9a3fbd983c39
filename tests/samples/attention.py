"""Samples of the fused attention core (``ops/attention.py``) and its gradient kernel,
against NumPy; the ring, Ulysses and the zig-zag order are in tests/test_context_parallel.py."""
import numpy as np

import ctensor as ct
from . import Sample

_SCALE = 1.0 / np.sqrt(3.0)


def _scores(q, k):
    s = q @ k.swapaxes(-1, -2) * _SCALE
    return np.where(np.arange(k.shape[-2])[None, :] > np.arange(q.shape[-2])[:, None],
                    -np.inf, s)


def _attention_ref(q, k, v):
    s = _scores(q, k)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def _grad_ref(g, q, k, v, out, lse):
    """dq + 2 dk + 3 dv of the gradient kernel's recurrences (p from the given lse)."""
    p = np.exp(_scores(q, k) - lse[..., None])
    dv = p.swapaxes(-1, -2) @ g
    ds = p * (g @ v.swapaxes(-1, -2) - (g * out).sum(-1, keepdims=True))
    return ds @ k * _SCALE + 2 * ds.swapaxes(-1, -2) @ q * _SCALE + 3 * dv


def _grad(g, q, k, v, out, lse):
    dq, dk, dv = ct.attention.op.grads["grad"](g, q, k, v, out, lse, causal=True,
                                               scale=_SCALE, zigzag=0)
    return dq + 2 * dk + 3 * dv


SAMPLES = [
    Sample("attention", lambda q, k, v: ct.attention(q, k, v, causal=True),
           _attention_ref, [(2, 4, 3), (2, 5, 3), (2, 5, 2)],
           uneven=[(2, 7, 3), (2, 5, 3), (2, 5, 2)], grad=(0, 1, 2), rtol=1e-7, atol=1e-9),
    # (2-D and no partial inputs: six inputs on a 2 x 2 mesh make the table's layout
    # combinations many)
    Sample("attention.grad", _grad, _grad_ref, [(4, 3)] * 5 + [(4,)],
           uneven=[(5, 3)] * 5 + [(5,)], grad=(), kinds=("S", "B")),
]
