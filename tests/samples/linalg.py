import numpy as np

import ctensor as ct
from ctensor.ops.linalg import matmul_t
from . import Sample


def _t(x):
    return np.swapaxes(x, -1, -2)


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
    Sample("linear", ct.linear, lambda x, w: x @ w.T, [(2, 4, 3), (4, 3)],
           uneven=[(3, 5, 7), (5, 7)], grad=(0, 1), name="linear_nobias"),
]
