import numpy as np

import ctensor as ct
from . import Sample

VOCAB = 6  # ids lie in [0, VOCAB); weights have VOCAB (even) or 7 (uneven) rows


def _ids_first(rng, shape, i):
    return rng.integers(0, VOCAB, shape) if i == 0 else rng.standard_normal(shape)


def _ids_second(rng, shape, i):
    return rng.integers(-1, 5, shape) if i == 1 else rng.standard_normal(shape)


def _grad_inputs(rng, shape, i):
    return rng.integers(0, VOCAB, shape) if i == 0 else rng.standard_normal(shape)


def _pick_grad_inputs(rng, shape, i):
    return rng.integers(-1, 5, shape) if i == 1 else rng.standard_normal(shape)


def _embedding_grad_ref(ids, g, w):
    out = np.zeros_like(w)
    np.add.at(out, ids, g)
    return out


def _pick_ref(x, index):
    inside = (index >= 0) & (index < x.shape[-1])
    picked = np.take_along_axis(x, np.where(inside, index, 0)[..., None], -1)[..., 0]
    return np.where(inside, picked, 0.0)


def _pick_grad_ref(g, index, x):
    out = np.zeros_like(x)
    inside = (index >= 0) & (index < x.shape[-1])
    np.put_along_axis(out, np.where(inside, index, 0)[..., None],
                      np.where(inside, g, 0.0)[..., None], -1)
    return out


def _causal_ref(value, diagonal):
    def ref(x):
        rows = np.arange(x.shape[-2])[:, None]
        cols = np.arange(x.shape[-1])[None, :]
        return np.where(cols > rows + diagonal, value, x)
    return ref


def _softmax_ref(dim, log=False):
    def ref(x):
        z = x - x.max(dim, keepdims=True)
        s = np.exp(z).sum(dim, keepdims=True)
        return z - np.log(s) if log else np.exp(z) / s
    return ref


def _layer_norm_ref(ndims):
    def ref(x, w=1.0, b=0.0):
        axes = tuple(range(x.ndim - ndims, x.ndim))
        xc = x - x.mean(axes, keepdims=True)
        return xc / np.sqrt((xc * xc).mean(axes, keepdims=True) + 1e-5) * w + b
    return ref


def _ce_inputs(rng, shape, i):
    """logits (i == 0), then targets in [-1, C) with -1 the ignore_index."""
    return rng.standard_normal(shape) * 2 if i == 0 else rng.integers(-1, 5, shape)


def _ce_ref(logits, target):
    z = logits - logits.max(-1, keepdims=True)
    lse = np.log(np.exp(z).sum(-1))
    valid = target != -1
    picked = np.take_along_axis(z, np.where(valid, target, 0)[..., None], -1)[..., 0]
    return np.where(valid, lse - picked, 0.0)


def _ce_grad_inputs(rng, shape, i):
    return rng.integers(-1, 5, shape) if i == 2 else rng.standard_normal(shape)


def _ce_grad_ref(g, logits, target):
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    valid = target != -1
    onehot = np.eye(logits.shape[-1])[np.where(valid, target, 0)]
    return (p - onehot) * np.where(valid, g, 0.0)[..., None]


def _layer_norm_grad_ref(g, x):
    xc = x - x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt((xc * xc).mean(-1, keepdims=True) + 1e-5)
    xhat = xc * rstd
    return rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))


def _layer_norm_affine_grad_ref(k):
    """Output ``k`` of ``layer_norm.grad_affine(g, x, w)``: d/dx, then the weight's and the
    bias's gradients (sums over the rows)."""
    def ref(g, x, w):
        if k == 0:
            return _layer_norm_grad_ref(g * w, x)
        xc = x - x.mean(-1, keepdims=True)
        xhat = xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + 1e-5)
        return (g * xhat).sum(0) if k == 1 else g.sum(0)
    return ref


def _layer_norm_affine_grad(k):
    grad = ct.layer_norm.op.grads["grad_affine"]
    return lambda g, x, w: grad(g, x, w, ndims=1, eps=1e-5)[k]


def _adam_inputs(rng, shape, i):
    """param, grad, exp_avg, exp_avg_sq (positive)."""
    return rng.uniform(0.1, 1.0, shape) if i == 3 else rng.standard_normal(shape)


def _adam_ref(k, decoupled):
    def ref(p, g, m, v):
        if decoupled:
            p = p * (1 - 0.1 * 0.01)
        else:
            g = g + p * 0.01
        m = m * 0.9 + g * 0.1
        v = v * 0.99 + g * g * 0.01
        new = p - m / (np.sqrt(v) / np.sqrt(1 - 0.99 ** 3) + 1e-8) * (0.1 / (1 - 0.9 ** 3))
        return (new, m, v)[k]
    return ref


def _adam(k, decoupled):
    return lambda p, g, m, v: ct.fused_adam(p, g, m, v, lr=0.1, beta1=0.9, beta2=0.99,
                                            eps=1e-8, weight_decay=0.01, decoupled=decoupled,
                                            step=3)[k]


def _ce(logits, target):
    return ct.softmax_cross_entropy(logits, target, ignore_index=-1)


SAMPLES = [
    Sample("embedding", ct.embedding, lambda ids, w: w[ids], [(4, 3), (VOCAB, 4)],
           uneven=[(5, 3), (7, 5)], make=_ids_first, grad=(1,)),
    Sample("embedding", ct.embedding, lambda ids, w: w[ids], [(4,), (VOCAB, 3)],
           uneven=[(7,), (7, 2)], make=_ids_first, grad=(1,), name="embedding_1d"),
    Sample("embedding.grad_weight", ct.embedding.op.grads["grad_weight"],
           _embedding_grad_ref, [(4, 3), (4, 3, 4), (VOCAB, 4)],
           uneven=[(5, 3), (5, 3, 5), (7, 5)], make=_grad_inputs, grad=()),
    Sample("pick", ct.pick, _pick_ref, [(4, 5), (4,)], uneven=[(7, 5), (7,)],
           make=_ids_second),
    Sample("pick", ct.pick, _pick_ref, [(2, 3, 4), (2, 3)], uneven=[(3, 5, 7), (3, 5)],
           make=_ids_second, name="pick_3d"),
    Sample("pick.grad", ct.pick.op.grads["grad"], _pick_grad_ref,
           [(4, 3), (4, 3), (4, 3, 4)], uneven=[(5, 3), (5, 3), (5, 3, 7)],
           make=_pick_grad_inputs, grad=()),
    Sample("causal_fill", lambda x: ct.causal_fill(x, -5.0), _causal_ref(-5.0, 0), [(4, 4)],
           uneven=[(7, 7)]),
    Sample("causal_fill", lambda x: ct.causal_fill(x, -5.0, diagonal=1),
           _causal_ref(-5.0, 1), [(2, 3, 4)], uneven=[(3, 5, 7)], name="causal_fill_3d"),
    Sample("softmax", lambda x: ct.softmax(x, -1), _softmax_ref(-1), [(4, 3)]),
    Sample("softmax", lambda x: ct.softmax(x, 0), _softmax_ref(0), [(4, 3, 2)],
           name="softmax_dim0"),
    Sample("log_softmax", lambda x: ct.log_softmax(x, -1), _softmax_ref(-1, True), [(4, 3)]),
    Sample("log_softmax", lambda x: ct.log_softmax(x, 1), _softmax_ref(1, True), [(2, 4, 3)],
           name="log_softmax_dim1"),
    Sample("layer_norm", lambda x: ct.layer_norm(x, x.shape[-1]), _layer_norm_ref(1), [(4, 3)],
           uneven=[(7, 5)], rtol=1e-6, atol=1e-8, name="layer_norm"),
    Sample("layer_norm", lambda x, w, b: ct.layer_norm(x, w.shape, w, b), _layer_norm_ref(2),
           [(2, 3, 2), (3, 2), (3, 2)], uneven=[(3, 5, 2), (5, 2), (5, 2)], grad=(0, 1, 2),
           rtol=1e-6, atol=1e-8, name="layer_norm_affine"),
    Sample("softmax_cross_entropy", _ce, _ce_ref, [(4, 5), (4,)],
           uneven=[(7, 5), (7,)], make=_ce_inputs, rtol=1e-7, atol=1e-9),
    Sample("softmax_cross_entropy", _ce, _ce_ref, [(2, 3, 5), (2, 3)],
           uneven=[(3, 5, 7), (3, 5)], make=_ce_inputs, name="softmax_cross_entropy_3d"),
    Sample("softmax_cross_entropy.grad",
           lambda g, x, t: ct.softmax_cross_entropy.op.grads["grad"](g, x, t, ignore_index=-1),
           _ce_grad_ref, [(4,), (4, 5), (4,)], uneven=[(7,), (7, 5), (7,)],
           make=_ce_grad_inputs, grad=()),
    Sample("causal_fill", lambda x: ct.causal_fill(x, 0.0), _causal_ref(0.0, 0), [(4, 4)],
           uneven=[(7, 7)], name="causal_fill_zero"),
    Sample("softmax.grad", lambda g, y: ct.softmax.op.grads["grad"](g, y, dim=1, log=False),
           lambda g, y: y * (g - (g * y).sum(1, keepdims=True)), [(4, 3), (4, 3)],
           grad=()),
    Sample("softmax.grad", lambda g, y: ct.softmax.op.grads["grad"](g, y, dim=0, log=True),
           lambda g, y: g - np.exp(y) * g.sum(0, keepdims=True), [(4, 3), (4, 3)],
           grad=(), name="log_softmax_grad"),
    Sample("layer_norm.grad",
           lambda g, x: ct.layer_norm.op.grads["grad"](g, x, ndims=1, eps=1e-5),
           _layer_norm_grad_ref, [(4, 3), (4, 3)], grad=(), rtol=1e-6, atol=1e-8),
    *[Sample("layer_norm.grad_affine", _layer_norm_affine_grad(k),
             _layer_norm_affine_grad_ref(k), [(4, 3), (4, 3), (3,)],
             uneven=[(7, 5), (7, 5), (5,)], grad=(), rtol=1e-6, atol=1e-8,
             name=f"layer_norm_grad_affine_{part}")
      for k, part in enumerate(("input", "weight", "bias"))],
    *[Sample("fused_adam", _adam(k, decoupled), _adam_ref(k, decoupled), [(4, 3)] * 4,
             make=_adam_inputs, grad=(), rtol=1e-12, atol=1e-12,
             name=f"fused_adam_{'adamw' if decoupled else 'l2'}_{part}")
      for k, part in enumerate(("param", "exp_avg", "exp_avg_sq"))
      for decoupled in (True, False)],
    Sample("pick", lambda x, i: ct.pick(x, i, ignore_index=-1), _pick_ref, [(4, 5), (4,)],
           uneven=[(7, 5), (7,)], make=_ids_second, name="pick_ignore_index"),
]

COVERED_ELSEWHERE = {}
