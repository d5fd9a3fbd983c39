import numpy as np

import ctensor as ct
from . import Sample


def _distinct(rng, shape, i):
    return rng.permutation(int(np.prod(shape))).reshape(shape) / 7.0 - 1.0


def _with_zeros(rng, shape, i):
    """Normals with exact zeros: one in the first row, two in the last (prod's gradient
    without division must be exact there)."""
    x = rng.standard_normal(shape)
    flat = x.reshape(-1, x.shape[-1]) if x.ndim > 1 else x.reshape(1, -1)
    flat[0, 0] = 0.0
    flat[-1, :2] = 0.0
    return x


def _distinct_abs(rng, shape, i):
    """Distinct absolute values with both signs (no ties for amax(abs))."""
    n = int(np.prod(shape))
    return ((rng.permutation(n) + 1.0) * rng.choice([-1.0, 1.0], n)).reshape(shape) / n


def _others_product(x, axis):
    """d prod(x, axis) / dx by brute force: the product with x[idx] replaced by 1."""
    out = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        y = x.copy()
        y[idx] = 1.0
        out[idx] = np.prod(y, axis=axis)[idx[:axis] + idx[axis + 1:]]
    return out


def _prod_grad_inputs(rng, shape, i):
    return rng.standard_normal(shape) if i == 0 else _with_zeros(rng, shape, i)


def _logsumexp(a, axis, keepdims=False):
    peak = np.max(a, axis=axis, keepdims=True)
    out = np.log(np.sum(np.exp(a - peak), axis=axis, keepdims=True)) + peak
    return out if keepdims else np.squeeze(out, axis)


def _cumprod_grad_ref(g, x, axis=1):
    """sum_j g_j d(prod_{k<=j} x_k)/dx_i, brute force (the product without x_i)."""
    g, x = np.moveaxis(g, axis, -1), np.moveaxis(x, axis, -1)
    out = np.zeros_like(x)
    n = x.shape[-1]
    for i in range(n):
        for j in range(i, n):
            others = np.prod(np.delete(x[..., :j + 1], i, axis=-1), axis=-1)
            out[..., i] += g[..., j] * others
    return np.moveaxis(out, -1, axis)


def _diff_ref(a, n=1, axis=-1, prepend=None):
    return np.diff(a, n=n, axis=axis, prepend=prepend) if prepend is not None else \
        np.diff(a, n=n, axis=axis)


def _no_ties(rng, shape, i):
    return _distinct(rng, shape, i) + 0.05 * i


def _mostly_true(rng, shape, i):
    return rng.uniform(0, 1, shape) > 0.15


SAMPLES = [
    Sample("sum", lambda a: a.sum(), np.sum, [(4, 3)]),
    Sample("sum", lambda a: a.sum(0), lambda a: a.sum(0), [(4, 3)], name="sum_dim0"),
    Sample("sum", lambda a: a.sum(-1, keepdim=True), lambda a: a.sum(-1, keepdims=True),
           [(4, 3)], name="sum_keepdim"),
    Sample("sum", lambda a: a.sum((0, 2)), lambda a: a.sum((0, 2)), [(4, 3, 2)],
           name="sum_dims"),
    Sample("mean", lambda a: a.mean(), np.mean, [(4, 3)]),
    Sample("mean", lambda a: a.mean(1), lambda a: a.mean(1), [(4, 3)], name="mean_dim1"),
    Sample("sum", lambda a: a.sum(1, dtype=ct.float64), lambda a: a.sum(1, dtype=np.float64),
           [(4, 3)], make=lambda r, s, i: r.integers(-5, 5, s).astype(np.int32), grad=(),
           name="sum_dtype"),
    Sample("prod", lambda a: a.prod(0, dtype=ct.int16), lambda a: a.prod(0, dtype=np.int16),
           [(4, 3)], make=lambda r, s, i: r.integers(-3, 4, s), grad=(), name="prod_dtype"),
    Sample("cumprod", lambda a: a.cumprod(1, dtype=ct.float64), lambda a: np.cumprod(a, 1),
           [(4, 3)], make=lambda r, s, i: r.integers(-3, 4, s).astype(np.int32), grad=(),
           name="cumprod_dtype"),
    Sample("cumsum", lambda a: (a > 0).cumsum(0, dtype=ct.int32),
           lambda a: np.cumsum(a > 0, 0, dtype=np.int32), [(4, 3)], grad=(),
           name="cumsum_dtype"),
    Sample("mean", lambda a: a.mean(0, dtype=ct.float64), lambda a: a.mean(0), [(4, 3)],
           make=lambda r, s, i: r.integers(-5, 5, s), grad=(), name="mean_int_dtype"),
    # any / all: OR / AND across ranks (P(max) / P(min)) over a split reduced dim
    Sample("any", lambda a: a.any(), np.any, [(4, 3)], make=_mostly_true, grad=(),
           kinds=("S", "B")),
    Sample("any", lambda a: (a > 1.2).any(1), lambda a: (a > 1.2).any(1), [(4, 3)], grad=(),
           name="any_dim_float"),
    Sample("any", lambda a: ct.any(a, 0, keepdim=True), lambda a: (a != 0).any(0, keepdims=True),
           [(4, 3)], make=lambda r, s, i: r.integers(0, 2, s) * (r.uniform(0, 1, s) > 0.7),
           grad=(), name="any_int_keepdim"),
    Sample("all", lambda a: a.all(0), lambda a: a.all(0), [(4, 3)], make=_mostly_true,
           grad=(), kinds=("S", "B")),
    Sample("all", lambda a: (a < 1.5).all(dim=(0, 1)), lambda a: (a < 1.5).all((0, 1)),
           [(4, 3, 2)], grad=(), name="all_dims_float"),
    # logsumexp: max and sum across ranks, like softmax
    Sample("logsumexp", lambda a: a.logsumexp(1), lambda a: _logsumexp(a, 1), [(4, 3)]),
    Sample("logsumexp", lambda a: ct.logsumexp(a * 30.0, (0, 1), keepdim=True),
           lambda a: _logsumexp(a * 30.0, (0, 1), keepdims=True), [(4, 3, 2)],
           name="logsumexp_dims_large"),
    # cumprod (exact gradient with zeros) and diff (slices and a sub)
    Sample("cumprod", lambda a: a.cumprod(1), lambda a: np.cumprod(a, 1), [(4, 3)],
           make=_with_zeros),
    Sample("cumprod", lambda a: ct.cumprod(a, dim=0), lambda a: np.cumprod(a, 0), [(4, 3, 2)],
           name="cumprod_dim0"),
    Sample("cumprod", lambda a: a.cumprod(0), lambda a: np.cumprod(a, 0), [(4, 3)],
           make=lambda r, s, i: r.integers(-3, 4, s).astype(np.int32), grad=(),
           name="cumprod_int"),
    Sample("cumprod.grad", lambda g, x: ct.cumprod.op.grads["grad"](g, x, dim=1),
           _cumprod_grad_ref, [(4, 3), (4, 3)], make=_prod_grad_inputs, grad=()),
    Sample("diff", lambda a: a.diff(), lambda a: np.diff(a), [(4, 3)]),
    Sample("diff", lambda a: ct.diff(a, n=2, dim=0), lambda a: np.diff(a, 2, 0), [(4, 3)],
           name="diff_n2_dim0"),
    Sample("diff", lambda a, b: ct.diff(a, dim=0, prepend=b),
           lambda a, b: np.diff(a, axis=0, prepend=b), [(4, 3), (2, 3)], grad=(0, 1),
           name="diff_prepend"),
    Sample("max", lambda a, b: ct.max(a, b), np.maximum, [(4, 3), (3,)], make=_no_ties,
           grad=(0, 1), name="max_elementwise"),
    Sample("min", lambda a, b: a.min(b), np.minimum, [(4, 3), (4, 3)], make=_no_ties,
           grad=(0, 1), name="min_elementwise"),
    Sample("amax", lambda a: ct.amax(a, 0), lambda a: a.max(0), [(4, 3)], make=_distinct),
    Sample("amin", lambda a: ct.amin(a, 1, keepdim=True), lambda a: a.min(1, keepdims=True),
           [(4, 3)], make=_distinct),
    Sample("max", lambda a: a.max(), np.max, [(4, 3)], make=_distinct),
    Sample("max", lambda a: a.max(1)[0], lambda a: a.max(1), [(4, 3)], make=_distinct,
           name="max_dim_values"),
    Sample("max", lambda a: a.max(0)[1], lambda a: a.argmax(0), [(4, 3)], make=_distinct,
           grad=(), name="max_dim_indices"),
    Sample("min", lambda a: a.min(0)[0], lambda a: a.min(0), [(4, 3)], make=_distinct),
    Sample("argmax", lambda a: a.argmax(1), lambda a: a.argmax(1), [(4, 3)], make=_distinct,
           grad=()),
    Sample("argmax", lambda a: a.argmax(), lambda a: np.argmax(a), [(4, 3)], make=_distinct,
           grad=(), name="argmax_flat"),
    Sample("argmin", lambda a: a.argmin(0, keepdim=True), lambda a: a.argmin(0, keepdims=True),
           [(4, 3)], make=_distinct, grad=()),
    Sample("min", lambda a: a.min(1, keepdim=True).indices, lambda a: a.argmin(1, keepdims=True),
           [(4, 3)], make=lambda r, s, i: r.integers(0, 2, s).astype(float), grad=(),
           name="min_dim_ties_indices"),
    Sample("max", lambda a: a.max(0).values, lambda a: a.max(0), [(4, 3)],
           make=lambda r, s, i: r.integers(0, 2, s).astype(float), grad=(),
           name="max_dim_ties_values"),
    # prod: exact zeros in the inputs, and its gradient kernel on every layout
    Sample("prod", lambda a: a.prod(1), lambda a: a.prod(1), [(4, 3)], make=_with_zeros),
    Sample("prod", lambda a: ct.prod(a), np.prod, [(2, 3)], make=_with_zeros,
           name="prod_all"),
    Sample("prod", lambda a: a.prod(0, keepdim=True), lambda a: a.prod(0, keepdims=True),
           [(4, 3)], make=lambda r, s, i: r.integers(-3, 4, s).astype(np.int32), grad=(),
           name="prod_int"),
    Sample("prod.grad", lambda g, x: ct.prod.op.grads["grad"](g, x, dims=(1,), keepdim=False),
           lambda g, x: g[:, None] * _others_product(x, 1), [(4,), (4, 3)],
           uneven=[(7,), (7, 5)], make=_prod_grad_inputs, grad=()),
    # var / std / norm: composites of sum, mean and amax
    Sample("var", lambda a: a.var(), lambda a: a.var(ddof=1), [(4, 3)]),
    Sample("var", lambda a: a.var(1, keepdim=True), lambda a: a.var(1, ddof=1, keepdims=True),
           [(4, 3)], name="var_dim_keepdim"),
    Sample("var", lambda a: ct.var(a, (0, 2), correction=0), lambda a: a.var((0, 2)),
           [(4, 3, 2)], name="var_dims_population"),
    Sample("std", lambda a: a.std(0), lambda a: a.std(0, ddof=1), [(4, 3)]),
    Sample("norm", lambda a: a.norm(), np.linalg.norm, [(4, 3)]),
    Sample("norm", lambda a: a.norm(1, dim=1), lambda a: np.abs(a).sum(1), [(4, 3)],
           make=_distinct_abs, name="norm_p1"),
    Sample("norm", lambda a: ct.norm(a, float("inf"), dim=0, keepdim=True),
           lambda a: np.abs(a).max(0, keepdims=True), [(4, 3)], make=_distinct_abs,
           name="norm_inf"),
    Sample("norm", lambda a: a.norm(3, dim=(0, 1)),
           lambda a: (np.abs(a) ** 3).sum((0, 1)) ** (1 / 3), [(4, 3, 2)],
           make=_distinct_abs, name="norm_p3"),
]

COVERED_ELSEWHERE = {
    "sum.unreduce": "the gradient kernel of sum, checked by every reduction's gradient test",
}
