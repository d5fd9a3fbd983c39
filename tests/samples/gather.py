import numpy as np

import ctensor as ct
from . import Sample


def _gather_inputs(dim_size):
    """x (normals), then an index with values in [0, dim_size) (the even size of x along
    the gathered dim, which the uneven shapes only enlarge)."""
    def make(rng, shape, i):
        return rng.standard_normal(shape) if i == 0 else rng.integers(0, dim_size, shape)
    return make


def _gather_ref(dim):
    def ref(x, index):
        x = x[tuple(slice(0, n) if d != dim else slice(None)
                    for d, n in enumerate(index.shape))]
        return np.take_along_axis(x, index, dim)
    return ref


def _scatter_add_inputs(rng, shape, i):
    return rng.integers(0, 3, shape) if i == 1 else rng.standard_normal(shape)


def _scatter_add_ref(g, index, x):
    out = np.zeros_like(x)
    for idx in np.ndindex(index.shape):
        pos = list(idx)
        pos[1] = index[idx]
        out[tuple(pos)] += g[idx]
    return out


SAMPLES = [
    Sample("gather", lambda x, i: ct.gather(x, 1, i), _gather_ref(1), [(4, 3), (4, 2)],
           uneven=[(7, 5), (7, 2)], make=_gather_inputs(3)),
    Sample("gather", lambda x, i: x.gather(0, i), _gather_ref(0), [(4, 3), (2, 3)],
           uneven=[(7, 5), (3, 4)], make=_gather_inputs(4), name="gather_dim0_smaller"),
    Sample("gather", lambda x, i: x.gather(-1, i), _gather_ref(2), [(2, 4, 3), (2, 4, 5)],
           uneven=[(3, 5, 7), (3, 5, 4)], make=_gather_inputs(3), name="gather_repeats"),
    Sample("gather.scatter_add",
           lambda g, i, x: ct.gather.op.grads["scatter_add"](g, i, x, dim=1),
           _scatter_add_ref, [(4, 2), (4, 2), (4, 3)], uneven=[(7, 4), (7, 4), (7, 5)],
           make=_scatter_add_inputs),
]
