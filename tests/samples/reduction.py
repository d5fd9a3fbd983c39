import numpy as np

import ctensor as ct
from . import Sample


def _distinct(rng, shape, i):
    return rng.permutation(int(np.prod(shape))).reshape(shape) / 7.0 - 1.0


SAMPLES = [
    Sample("sum", lambda a: a.sum(), np.sum, [(4, 3)]),
    Sample("sum", lambda a: a.sum(0), lambda a: a.sum(0), [(4, 3)], name="sum_dim0"),
    Sample("sum", lambda a: a.sum(-1, keepdim=True), lambda a: a.sum(-1, keepdims=True),
           [(4, 3)], name="sum_keepdim"),
    Sample("sum", lambda a: a.sum((0, 2)), lambda a: a.sum((0, 2)), [(4, 3, 2)],
           name="sum_dims"),
    Sample("mean", lambda a: a.mean(), np.mean, [(4, 3)]),
    Sample("mean", lambda a: a.mean(1), lambda a: a.mean(1), [(4, 3)], name="mean_dim1"),
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
]

COVERED_ELSEWHERE = {
    "sum.unreduce": "the gradient kernel of sum, checked by every reduction's gradient test",
}
