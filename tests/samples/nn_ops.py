import numpy as np

import ctensor as ct
from ctensor.dispatch import apply
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


SAMPLES = [
    Sample("embedding", ct.embedding, lambda ids, w: w[ids], [(4, 3), (VOCAB, 4)],
           uneven=[(5, 3), (7, 5)], make=_ids_first, grad=(1,)),
    Sample("embedding", ct.embedding, lambda ids, w: w[ids], [(4,), (VOCAB, 3)],
           uneven=[(7,), (7, 2)], make=_ids_first, grad=(1,), name="embedding_1d"),
    Sample("embedding_grad", lambda ids, g, w: apply("embedding_grad", [ids, g, w]),
           _embedding_grad_ref, [(4, 3), (4, 3, 4), (VOCAB, 4)],
           uneven=[(5, 3), (5, 3, 5), (7, 5)], make=_grad_inputs, grad=()),
    Sample("pick", ct.pick, _pick_ref, [(4, 5), (4,)], uneven=[(7, 5), (7,)],
           make=_ids_second),
    Sample("pick", ct.pick, _pick_ref, [(2, 3, 4), (2, 3)], uneven=[(3, 5, 7), (3, 5)],
           make=_ids_second, name="pick_3d"),
    Sample("pick_grad", lambda g, i, x: apply("pick_grad", [g, i, x]), _pick_grad_ref,
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
    Sample("linear", ct.linear, lambda x, w, b: x @ w.T + b, [(4, 3), (2, 3), (2,)],
           uneven=[(7, 5), (3, 5), (3,)], grad=(0, 1, 2)),
    Sample("linear", ct.linear, lambda x, w: x @ w.T, [(2, 4, 3), (4, 3)],
           uneven=[(3, 5, 7), (5, 7)], grad=(0, 1), name="linear_nobias"),
]

COVERED_ELSEWHERE = {
    "softmax_grad": "internal: the backward kernel of the fused softmax/log_softmax, checked "
                    "by their gradient tests",
}
