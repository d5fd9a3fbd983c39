import numpy as np

import ctensor as ct
from . import Sample


def _distinct(rng, shape, i):
    return rng.permutation(int(np.prod(shape))).reshape(shape) / 7.0 - 1.0


def _topk_ref(k, largest):
    def ref(a):
        order = np.argsort(-a if largest else a, axis=-1, kind="stable")[..., :k]
        return np.take_along_axis(a, order, -1)
    return ref


SAMPLES = [
    Sample("argsort", lambda a: a.argsort(1), lambda a: np.argsort(a, 1, kind="stable"),
           [(4, 3)], make=_distinct, grad=()),
    Sample("argsort", lambda a: ct.argsort(a, 0, descending=True),
           lambda a: np.argsort(-a, 0, kind="stable"), [(4, 3)],
           make=lambda r, s, i: r.integers(0, 3, s).astype(float), grad=(),
           name="argsort_descending_ties"),
    Sample("sort", lambda a: a.sort().values, lambda a: np.sort(a, -1), [(4, 3)],
           make=_distinct),
    Sample("sort", lambda a: a.sort(0, descending=True)[0], lambda a: -np.sort(-a, 0),
           [(2, 4, 3)], make=_distinct, name="sort_descending"),
    Sample("sort", lambda a: a.sort(1)[1], lambda a: np.argsort(a, 1, kind="stable"),
           [(4, 3)], make=lambda r, s, i: r.integers(-5, 5, s), grad=(), name="sort_int"),
    Sample("topk", lambda a: a.topk(2)[0], _topk_ref(2, True), [(4, 3)], make=_distinct),
    Sample("topk", lambda a: ct.topk(a, 2, dim=-1, largest=False).values,
           _topk_ref(2, False), [(2, 4, 3)], make=_distinct, name="topk_smallest"),
    Sample("topk", lambda a: a.topk(1, dim=0)[1], lambda a: np.argmax(a, 0)[None],
           [(4, 3)], make=_distinct, grad=(), name="topk_indices"),
    Sample("cumsum", lambda a: a.cumsum(1), lambda a: np.cumsum(a, 1), [(4, 3)]),
    Sample("cumsum", lambda a: ct.cumsum(a, dim=0), lambda a: np.cumsum(a, 0), [(4, 3, 2)],
           name="cumsum_dim0"),
    Sample("cumsum", lambda a: a.cumsum(-1), lambda a: np.cumsum(a, -1, dtype=np.int64),
           [(4, 3)], make=lambda r, s, i: r.integers(-5, 5, s).astype(np.int32), grad=(),
           name="cumsum_int"),
]
