import numpy as np

import ctensor as ct
from ctensor.ops.linalg import matmul_t
from . import Sample


def _t(x):
    return np.swapaxes(x, -1, -2)


def _matrix_norm_ref(a, ord, axis=(-2, -1), keepdims=False):
    return np.linalg.norm(a, ord=ord, axis=axis, keepdims=keepdims)


def _distinct_abs(rng, shape, i):
    """Distinct absolute values with both signs (no ties between row / column sums)."""
    n = int(np.prod(shape))
    return ((rng.permutation(n) + 1.0) * rng.choice([-1.0, 1.0], n)).reshape(shape) / n


def _near(rng, shape, i):
    """Pairs that are equal, close, or far apart, with infinities and nans."""
    base = np.random.default_rng(7).standard_normal(shape)
    if i == 0:
        flat = base.reshape(-1)
        flat[::5] = np.inf
        flat[1::7] = np.nan
        return base
    steps = rng.choice([0.0, 1e-9, 1e-3, 1.0], shape)
    return base + steps


SAMPLES = [
    Sample("matmul", lambda a, b: a @ b, np.matmul, [(4, 3), (3, 2)], grad=(0, 1),
           uneven=[(5, 7), (7, 3)]),
    Sample("matmul", ct.matmul, np.matmul, [(2, 4, 3), (2, 3, 4)], grad=(0, 1),
           uneven=[(3, 5, 7), (3, 7, 2)], name="matmul_batched"),
    Sample("matmul", ct.matmul, np.matmul, [(2, 1, 4, 3), (3, 3, 2)], grad=(0, 1),
           uneven=[(3, 1, 5, 2), (2, 2, 7)], name="matmul_bcast_batch"),
    Sample("matmul", ct.matmul, np.matmul, [(4, 3), (2, 3, 4)], grad=(0, 1),
           uneven=[(5, 3), (3, 3, 7)], name="matmul_bcast_matrix"),
    Sample("matmul", ct.matmul, np.matmul, [(4,), (4,)], grad=(0, 1), uneven=[(7,), (7,)],
           name="matmul_dot"),
    Sample("matmul", ct.matmul, np.matmul, [(4,), (2, 4, 3)], grad=(0, 1),
           uneven=[(5,), (3, 5, 7)], name="matmul_vec_mat"),
    Sample("matmul", ct.matmul, np.matmul, [(2, 3, 4), (4,)], grad=(0, 1),
           uneven=[(3, 7, 5), (5,)], name="matmul_mat_vec"),
    Sample("matmul", lambda a, b: matmul_t(a, b, transpose_b=True),
           lambda a, b: a @ _t(b), [(4, 3), (2, 3)], grad=(0, 1), uneven=[(5, 7), (3, 7)],
           name="matmul_nt"),
    Sample("matmul", lambda a, b: matmul_t(a, b, transpose_a=True),
           lambda a, b: _t(a) @ b, [(2, 3, 4), (3, 2)], grad=(0, 1),
           uneven=[(3, 7, 5), (7, 3)], name="matmul_tn"),
    Sample("matmul", lambda a, b: matmul_t(a, b, True, True),
           lambda a, b: _t(a) @ _t(b), [(3, 4), (2, 2, 3)], grad=(0, 1),
           uneven=[(7, 5), (3, 2, 7)], name="matmul_tt"),
    Sample("matmul", lambda a, b: a @ b, np.matmul, [(4, 3), (3, 2)], grad=(),
           make=lambda r, s, i: r.integers(-3, 4, s), name="matmul_int"),
    Sample("linear", ct.linear, lambda x, w, b: x @ w.T + b, [(4, 3), (2, 3), (2,)],
           uneven=[(7, 5), (3, 5), (3,)], grad=(0, 1, 2)),
    Sample("linear", ct.linear, lambda x, w, b: x @ w.T + b, [(2, 4, 3), (4, 3), (4,)],
           uneven=[(3, 5, 7), (5, 7), (5,)], grad=(0, 1, 2), name="linear_batch"),
    Sample("linear", ct.linear, lambda x, w: x @ w.T, [(2, 4, 3), (4, 3)],
           uneven=[(3, 5, 7), (5, 7)], grad=(0, 1), name="linear_nobias"),
    # PyTorch's fixed-rank forms of matmul, and the fused sums
    Sample("mm", lambda a, b: a.mm(b), np.matmul, [(4, 3), (3, 2)], grad=(0, 1),
           uneven=[(5, 7), (7, 3)]),
    Sample("bmm", ct.bmm, np.matmul, [(2, 4, 3), (2, 3, 4)], grad=(0, 1),
           uneven=[(3, 5, 7), (3, 7, 2)]),
    Sample("mv", ct.mv, np.matmul, [(4, 3), (3,)], grad=(0, 1), uneven=[(5, 7), (7,)]),
    Sample("dot", lambda a, b: a.dot(b), np.dot, [(4,), (4,)], grad=(0, 1),
           uneven=[(7,), (7,)]),
    Sample("addmm", lambda c, a, b: ct.addmm(c, a, b, beta=0.5, alpha=2.0),
           lambda c, a, b: 0.5 * c + 2.0 * (a @ b), [(2,), (4, 3), (3, 2)], grad=(0, 1, 2),
           uneven=[(3,), (5, 7), (7, 3)]),
    Sample("addmm", lambda c, a, b: c.addmm(a, b), lambda c, a, b: c + a @ b,
           [(4, 2), (4, 3), (3, 2)], grad=(0, 1, 2), uneven=[(5, 3), (5, 7), (7, 3)],
           name="addmm_full"),
    Sample("baddbmm", lambda c, a, b: ct.baddbmm(c, a, b, alpha=0.25),
           lambda c, a, b: c + 0.25 * (a @ b), [(1, 4, 4), (2, 4, 3), (2, 3, 4)],
           grad=(0, 1, 2), uneven=[(1, 5, 2), (3, 5, 7), (3, 7, 2)]),
    Sample("outer", ct.outer, np.outer, [(4,), (3,)], grad=(0, 1), uneven=[(7,), (5,)]),
    Sample("ger", lambda a, b: a.ger(b), np.outer, [(4,), (3,)], grad=(0, 1)),
    # ct.linalg norms: composites of sum and amax / amin
    Sample("linalg.norm", lambda a: ct.linalg.norm(a), lambda a: np.linalg.norm(a.reshape(-1)),
           [(4, 3, 2)]),
    Sample("linalg.norm", lambda a: ct.linalg.norm(a, dim=1, keepdim=True),
           lambda a: np.linalg.norm(a, axis=1, keepdims=True), [(4, 3)], name="linalg.norm_dim"),
    Sample("linalg.norm", lambda a: ct.linalg.norm(a, ord=float("inf")),
           lambda a: np.linalg.norm(a, np.inf), [(4, 3)], make=_distinct_abs,
           name="linalg.norm_matrix_inf"),
    Sample("linalg.norm", lambda a: ct.linalg.norm(a, ord=1, dim=(0, 2)),
           lambda a: np.linalg.norm(a, 1, axis=(0, 2)), [(4, 3, 2)], make=_distinct_abs,
           name="linalg.norm_matrix_1"),
    Sample("linalg.vector_norm", lambda a: ct.linalg.vector_norm(a, ord=3, dim=-1),
           lambda a: (np.abs(a) ** 3).sum(-1) ** (1 / 3), [(4, 3)], make=_distinct_abs),
    Sample("linalg.matrix_norm", lambda a: ct.linalg.matrix_norm(a),
           lambda a: _matrix_norm_ref(a, "fro"), [(2, 4, 3)]),
    Sample("linalg.matrix_norm", lambda a: ct.linalg.matrix_norm(a, ord=-1, keepdim=True),
           lambda a: _matrix_norm_ref(a, -1, keepdims=True), [(2, 4, 3)], make=_distinct_abs,
           name="linalg.matrix_norm_-1"),
    Sample("linalg.matrix_norm", lambda a: ct.linalg.matrix_norm(a, ord=-float("inf")),
           lambda a: _matrix_norm_ref(a, -np.inf), [(4, 3)], make=_distinct_abs,
           name="linalg.matrix_norm_-inf"),
    # isclose / allclose / equal (composites of elementwise ops and all)
    Sample("isclose", lambda a, b: ct.isclose(a, b, rtol=1e-4),
           lambda a, b: np.isclose(a, b, rtol=1e-4, atol=1e-8), [(4, 3), (4, 3)], make=_near,
           grad=(), kinds=("S", "B")),
    Sample("isclose", lambda a, b: a.isclose(b, atol=1e-2, equal_nan=True),
           lambda a, b: np.isclose(a, b, rtol=1e-5, atol=1e-2, equal_nan=True),
           [(4, 3), (4, 3)], make=_near, grad=(), kinds=("S", "B"), name="isclose_equal_nan"),
    Sample("allclose", lambda a, b: ct.tensor(ct.allclose(a, b, atol=1e-6)),
           lambda a, b: np.allclose(a, b, atol=1e-6), [(4, 3), (4, 3)],
           make=lambda r, s, i: np.ones(s) + 1e-9 * i, grad=()),
    Sample("allclose", lambda a, b: ct.tensor(a.allclose(b)), lambda a, b: np.allclose(a, b),
           [(4, 3), (4, 3)], grad=(), name="allclose_false"),
    Sample("equal", lambda a, b: ct.tensor(ct.equal(a, b)), lambda a, b: np.array_equal(a, b),
           [(4, 3), (4, 3)], make=lambda r, s, i: np.arange(np.prod(s)).reshape(s) * 0.5,
           grad=()),
    Sample("equal", lambda a, b: ct.tensor(a.equal(b)), lambda a, b: np.array_equal(a, b),
           [(4, 3), (4, 3)], grad=(), name="equal_false"),
]
