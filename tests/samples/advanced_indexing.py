"""Advanced indexing and indexed writes: ``x[mask]``, ``x[idx]``, ``x[rows, cols]``,
negative steps, ``x[index] = v``, index_select / index_add / index_copy / index_fill,
scatter / scatter_add, take_along_dim, nonzero, masked_select, and their in-place forms.

Index inputs are made inside the range of the *even* shapes, so the uneven shapes (larger)
take them too; replacing writes get distinct positions, so their values (and gradients)
do not depend on which of two writes wins."""
import numpy as np

import ctensor as ct
from ctensor.ops.index_parse import parse_index
from . import Sample


def _ints(lo, hi, at=(1,)):
    """Inputs ``at`` integers in [lo, hi), the others standard normal."""
    def make(rng, shape, i):
        return rng.integers(lo, hi, shape) if i in at else rng.standard_normal(shape)
    return make


def _mask(at=(1,)):
    def make(rng, shape, i):
        return rng.random(shape) > 0.5 if i in at else rng.standard_normal(shape)
    return make


def _distinct(n, at=1):
    """Input ``at``: distinct values in [0, n) (a prefix of a permutation)."""
    def make(rng, shape, i):
        if i == at:
            return rng.permutation(n)[:shape[0]]
        return rng.standard_normal(shape)
    return make


def _row_distinct(n):
    """Input 1: each row distinct values in [0, n) (scatter along dim 1 without
    collisions)."""
    def make(rng, shape, i):
        if i == 1:
            return np.stack([rng.permutation(n)[:shape[1]] for _ in range(shape[0])])
        return rng.standard_normal(shape)
    return make


def _index_add_ref(dim, alpha=1.0):
    def ref(x, index, src):
        out = np.moveaxis(x.copy(), dim, 0)
        np.add.at(out, index, np.moveaxis(src, dim, 0) * alpha)
        return np.moveaxis(out, 0, dim)
    return ref


def _index_copy_ref(x, index, src):
    out = x.copy()
    out[index] = src
    return out


def _scatter_ref(dim, reduce=None, value=None):
    def ref(x, index, src=None):
        out = x.copy()
        src = np.full(index.shape, value) if src is None else \
            src[tuple(slice(0, n) for n in index.shape)]
        for pos in np.ndindex(index.shape):
            at = list(pos)
            at[dim] = index[pos]
            at = tuple(at)
            if reduce is None:
                out[at] = src[pos]
            elif reduce == "add":
                out[at] += src[pos]
            else:
                out[at] *= src[pos]
        return out
    return ref


def _assigned(index):
    def fn(a, b):
        t = a.clone()
        t[index] = b
        return t

    def ref(a, b):
        t = a.copy()
        t[index] = b
        return t
    return fn, ref


def _assigned_by(fn_index, ref_index=None):
    """``t[index(i)] = v`` with a tensor index input ``i``."""
    ref_index = ref_index or fn_index

    def fn(a, i, v):
        t = a.clone()
        t[fn_index(i)] = v
        return t

    def ref(a, i, v):
        t = a.copy()
        t[ref_index(i)] = v
        return t
    return fn, ref


def _assign_direct(index):
    def fn(a, b):
        entries = parse_index(index, tuple(a.shape))
        return ct.getitem.op.grads["assign"](a, b, index=entries)

    def ref(a, b):
        t = a.copy()
        t[index] = b
        return t
    return fn, ref


def _reduce_ref(dim, reduce, include_self):
    """NumPy's scatter_reduce: per position, the values it receives (and its own)."""
    def ref(x, index, src):
        out = x.copy()
        got = {}
        for pos in np.ndindex(index.shape):
            at = list(pos)
            at[dim] = index[pos]
            got.setdefault(tuple(at), []).append(src[pos])
        for at, values in got.items():
            values = values + ([x[at]] if include_self else [])
            out[at] = {"mean": np.mean, "amax": np.max, "amin": np.min}[reduce](values)
        return out
    return ref


_IDX = [0, -1, 2]  # constant integer indices (the dims they index are at least 3 long)


SAMPLES = [
    # ------------------------------------------------------------------ getitem, advanced
    Sample("getitem", lambda a, m: a[m], lambda a, m: a[m], [(4, 3), (4, 3)],
           make=_mask(), name="getitem_mask"),
    Sample("getitem", lambda a, m: a[m], lambda a, m: a[m], [(4, 3), (4,)],
           uneven=[(7, 5), (7,)], make=_mask(), name="getitem_mask_leading"),
    Sample("getitem", lambda a, m: a[:, m], lambda a, m: a[:, m], [(2, 4, 3), (4, 3)],
           uneven=[(3, 7, 5), (7, 5)], make=_mask(), name="getitem_mask_inner"),
    Sample("getitem", lambda a, i: a[i], lambda a, i: a[i], [(4, 3), (5,)],
           uneven=[(7, 5), (5,)], make=_ints(-4, 4), name="getitem_int_tensor"),
    Sample("getitem", lambda a, i: a[:, i], lambda a, i: a[:, i], [(4, 3), (2, 3)],
           uneven=[(7, 5), (2, 3)], make=_ints(-3, 3), name="getitem_int_tensor_2d"),
    Sample("getitem", lambda a: a[:, _IDX], lambda a: a[:, _IDX], [(4, 3)],
           name="getitem_list"),
    Sample("getitem", lambda a: a[np.array([[1, 0], [2, 2]])],
           lambda a: a[np.array([[1, 0], [2, 2]])], [(4, 3)], name="getitem_array"),
    Sample("getitem", lambda a, r, c: a[r, c], lambda a, r, c: a[r, c],
           [(4, 3), (5,), (5,)], uneven=[(7, 5), (5,), (5,)], make=_ints(-3, 3, (1, 2)),
           name="getitem_rows_cols"),
    Sample("getitem", lambda a, r, c: a[r[:, None], c], lambda a, r, c: a[r[:, None], c],
           [(4, 3), (2,), (3,)], make=_ints(-3, 3, (1, 2)), name="getitem_broadcast"),
    Sample("getitem", lambda a, r: a[r, :, [0, 1]], lambda a, r: a[r, :, [0, 1]],
           [(4, 3, 2), (2,)], uneven=[(7, 5, 2), (2,)], make=_ints(0, 4),
           name="getitem_separated"),
    Sample("getitem", lambda a, r: a[:, r, [1, 0]], lambda a, r: a[:, r, [1, 0]],
           [(2, 4, 3), (2,)], uneven=[(3, 7, 5), (2,)], make=_ints(0, 4),
           name="getitem_adjacent"),
    Sample("getitem", lambda a: a[..., ::-1], lambda a: a[..., ::-1], [(4, 3)],
           name="getitem_reverse"),
    Sample("getitem", lambda a: a[3:0:-2, None, ::-2], lambda a: a[3:0:-2, None, ::-2],
           [(4, 3)], name="getitem_negative_steps"),
    # PyTorch applies ints first (NumPy would count the 1 as advanced and move the block)
    Sample("getitem", lambda a, i: a[None, 1, ..., i], lambda a, i: a[None, 1][..., i],
           [(2, 4, 3), (2,)], uneven=[(2, 7, 5), (2,)], make=_ints(0, 3),
           name="getitem_mixed"),
    Sample("getitem", lambda a: a[[True, False, True, True]],
           lambda a: a[[True, False, True, True]], [(4, 3)], uneven=[(4, 5)],
           name="getitem_bool_list"),
    # ------------------------------------------------------------------ setitem
    Sample("setitem", *_assigned((slice(None), 0)), [(4, 3), (4,)], uneven=[(7, 5), (7,)],
           grad=(0, 1)),
    Sample("setitem", *_assigned((slice(1, 3),)), [(4, 3), (3,)], uneven=[(7, 5), (5,)],
           grad=(0, 1), name="setitem_rows"),
    Sample("setitem", *_assigned((0, slice(None, None, 2))), [(4, 3), (1,)], grad=(0, 1),
           name="setitem_step"),
    Sample("setitem", *_assigned((slice(None), None, 1)), [(4, 3), (4, 1)],
           uneven=[(7, 5), (7, 1)], grad=(0, 1), name="setitem_new_dim"),
    Sample("setitem", *_assigned_by(lambda m: m), [(4, 3), (4, 3), ()], make=_mask(),
           grad=(0, 2), name="setitem_mask_scalar"),
    Sample("setitem", *_assigned_by(lambda m: m), [(4, 3), (4,), (3,)],
           uneven=[(7, 5), (7,), (5,)], make=_mask(), grad=(0, 2), name="setitem_mask_rows"),
    Sample("setitem", *_assigned_by(lambda i: i), [(4, 3), (2,), (2, 3)],
           uneven=[(7, 5), (2,), (2, 5)], make=_distinct(4), grad=(0, 2),
           name="setitem_int_tensor"),
    Sample("setitem", *_assigned_by(lambda i: (slice(None), i)), [(4, 3), (2,), (4, 2)],
           uneven=[(7, 5), (2,), (7, 2)], make=_distinct(3), grad=(0, 2),
           name="setitem_columns"),
    Sample("setitem", *_assigned_by(lambda i: (i, [2, 0])), [(4, 3), (2,), (2,)],
           make=_distinct(4), grad=(0, 2), name="setitem_rows_cols"),
    Sample("setitem", *_assigned((slice(None), slice(None, None, -1))), [(4, 3), (3,)],
           grad=(0, 1), name="setitem_reversed"),
    Sample("getitem.assign", *_assign_direct((slice(None), 1)), [(4, 3), (4,)],
           uneven=[(7, 5), (7,)], grad=(0, 1)),
    Sample("getitem.assign", *_assign_direct((slice(1, None, 2), None, slice(None))),
           [(4, 3), (2, 1, 3)], uneven=[(7, 5), (3, 1, 5)], grad=(0, 1),
           name="assign_slices"),
    Sample("index_put", lambda a, i, v: ct.index_put(a, (i,), v, accumulate=True),
           lambda a, i, v: _index_add_ref(0)(a, i, v), [(4, 3), (5,), (5, 3)],
           uneven=[(7, 5), (5,), (5, 5)], make=_ints(0, 4), grad=(0, 2)),
    Sample("index_put", lambda a, i, v: a.index_put((i, i[::-1]), v),
           lambda a, i, v: _put_pairs(a, i, v), [(4, 4), (4,), (4,)],
           uneven=[(5, 7), (4,), (4,)], make=_distinct(4), grad=(0, 2),
           name="index_put_pairs"),
    Sample("index_put_", lambda a, m: a.clone().index_put_((m,), 0.5),
           lambda a, m: np.where(m, 0.5, a), [(4, 3), (4, 3)], make=_mask()),
    # ------------------------------------------------------------------ index_* ops
    Sample("index_select", lambda a, i: ct.index_select(a, 0, i), lambda a, i: a[i],
           [(4, 3), (5,)], uneven=[(7, 5), (5,)], make=_ints(-4, 4)),
    Sample("index_select", lambda a, i: a.index_select(-1, i), lambda a, i: a[..., i],
           [(2, 4, 3), (4,)], uneven=[(2, 7, 5), (4,)], make=_ints(0, 3),
           name="index_select_last"),
    Sample("index_select", lambda a: a.index_select(0, [1, 1, 0]), lambda a: a[[1, 1, 0]],
           [(4, 3)], make=lambda r, s, i: r.integers(-9, 9, s), grad=(),
           name="index_select_int"),
    Sample("index_add", lambda a, i, s: ct.index_add(a, 0, i, s), _index_add_ref(0),
           [(4, 3), (5,), (5, 3)], uneven=[(7, 5), (5,), (5, 5)], make=_ints(0, 4),
           grad=(0, 2)),
    Sample("index_add", lambda a, i, s: a.index_add(1, i, s, alpha=2.0),
           _index_add_ref(1, 2.0), [(4, 3), (4,), (4, 4)], uneven=[(7, 5), (4,), (7, 4)],
           make=_ints(-3, 3), grad=(0, 2), name="index_add_alpha"),
    Sample("index_copy", lambda a, i, s: ct.index_copy(a, 0, i, s), _index_copy_ref,
           [(4, 3), (3,), (3, 3)], uneven=[(7, 5), (3,), (3, 5)], make=_distinct(4),
           grad=(0, 2)),
    Sample("index_fill", lambda a: a.index_fill(1, [0, 2], -1.5),
           lambda a: _filled_ref(a), [(4, 3)]),
    Sample("nonzero", lambda a: ct.nonzero(a), np.argwhere, [(4, 3)],
           make=lambda r, s, i: r.integers(0, 2, s), grad=()),
    Sample("nonzero", lambda a: ct.stack(ct.where(a > 0)), lambda a: np.stack(np.nonzero(a > 0)),
           [(2, 4, 3)], grad=(), name="nonzero_as_tuple"),
    Sample("argwhere", lambda a: a.argwhere(), lambda a: np.argwhere(a), [(4, 3)], make=_mask(at=(0,)),
           grad=()),
    Sample("masked_select", lambda a, m: ct.masked_select(a, m), lambda a, m: a[m],
           [(4, 3), (4, 3)], make=_mask()),
    Sample("masked_select", lambda a, m: a.masked_select(m),
           lambda a, m: np.broadcast_to(a, np.broadcast_shapes(a.shape, m.shape))[
               np.broadcast_to(m, np.broadcast_shapes(a.shape, m.shape))],
           [(4, 1), (3,)], uneven=[(7, 1), (5,)], make=_mask(), name="masked_select_broadcast"),
    # ------------------------------------------------------------------ scatter
    Sample("scatter", lambda x, i, s: ct.scatter(x, 1, i, s), _scatter_ref(1),
           [(4, 3), (4, 2), (4, 2)], uneven=[(7, 5), (7, 2), (7, 2)], make=_row_distinct(3),
           grad=(0, 2)),
    Sample("scatter", lambda x, i: x.scatter(1, i, 2.5), _scatter_ref(1, value=2.5),
           [(4, 3), (4, 2)], uneven=[(7, 5), (3, 2)], make=_row_distinct(3),
           name="scatter_value"),
    Sample("scatter", lambda x, i, s: x.scatter(0, i, s, reduce="add"),
           _scatter_ref(0, "add"), [(4, 3), (5, 3), (6, 4)], uneven=[(7, 5), (5, 5), (6, 5)],
           make=_ints(0, 4), grad=(0, 2), name="scatter_reduce_add"),
    Sample("scatter", lambda x, i, s: x.scatter(1, i, s, reduce="multiply"),
           _scatter_ref(1, "multiply"), [(4, 3), (4, 3), (4, 3)], make=_ints(0, 3),
           grad=(), name="scatter_reduce_multiply"),
    Sample("scatter_add", lambda x, i, s: ct.scatter_add(x, 1, i, s), _scatter_ref(1, "add"),
           [(4, 3), (4, 5), (4, 5)], uneven=[(7, 5), (7, 6), (7, 6)], make=_ints(0, 3),
           grad=(0, 2)),
    Sample("scatter_add", lambda x, i, s: x.scatter_add(0, i, s), _scatter_ref(0, "add"),
           [(4, 3), (2, 3), (3, 3)], uneven=[(7, 5), (3, 4), (3, 5)], make=_ints(0, 4),
           grad=(0, 2), name="scatter_add_smaller"),
    Sample("scatter_reduce", lambda x, i, s: x.scatter_reduce(1, i, s, "sum"),
           _scatter_ref(1, "add"), [(4, 3), (4, 5), (4, 5)], uneven=[(7, 5), (7, 6), (7, 6)],
           make=_ints(0, 3), grad=(0, 2)),
    Sample("scatter_reduce", lambda x, i, s: ct.scatter_reduce(x, 0, i, s, "mean",
                                                               include_self=False),
           _reduce_ref(0, "mean", False), [(4, 3), (5, 3), (5, 3)],
           uneven=[(7, 5), (5, 5), (5, 5)], make=_ints(0, 4), grad=(0, 2),
           name="scatter_reduce_mean"),
    Sample("scatter_reduce", lambda x, i, s: x.scatter_reduce(1, i, s, "amax"),
           _reduce_ref(1, "amax", True), [(4, 3), (4, 5), (4, 5)],
           uneven=[(7, 5), (7, 6), (7, 6)], make=_ints(0, 3), grad=(0, 2),
           name="scatter_reduce_amax"),
    Sample("scatter_reduce", lambda x, i, s: x.scatter_reduce(1, i, s, "amin",
                                                              include_self=False),
           _reduce_ref(1, "amin", False), [(4, 3), (4, 2), (4, 2)],
           uneven=[(7, 5), (7, 2), (7, 2)], make=_ints(0, 3), grad=(0, 2),
           name="scatter_reduce_amin"),
    Sample("scatter_reduce", lambda x, i, s: x.scatter_reduce(1, i, s, "prod"),
           _scatter_ref(1, "multiply"), [(4, 3), (4, 3), (4, 3)], make=_ints(0, 3), grad=(),
           name="scatter_reduce_prod"),
    Sample("scatter_reduce_", lambda x, i, s: x.clone().scatter_reduce_(1, i, s, "sum"),
           _scatter_ref(1, "add"), [(4, 3), (4, 5), (4, 5)], uneven=[(7, 5), (7, 6), (7, 6)],
           make=_ints(0, 3), grad=(0, 2)),
    Sample("take_along_dim", lambda x, i: ct.take_along_dim(x, i, 1),
           lambda x, i: np.take_along_axis(x, i, 1), [(4, 3), (4, 2)],
           uneven=[(7, 5), (7, 2)], make=_ints(0, 3)),
    Sample("take_along_dim", lambda x, i: x.take_along_dim(i, dim=0),
           lambda x, i: np.take_along_axis(x, np.broadcast_to(i, (i.shape[0], x.shape[1])), 0),
           [(4, 3), (2, 1)], uneven=[(7, 5), (3, 1)], make=_ints(0, 4),
           name="take_along_dim_broadcast"),
    Sample("take_along_dim", lambda x, i: ct.take_along_dim(x, i),
           lambda x, i: x.reshape(-1)[i], [(4, 3), (5,)], make=_ints(0, 12),
           name="take_along_dim_flat"),
    # ------------------------------------------------------------------ in place
    Sample("masked_fill_", lambda a, m: a.clone().masked_fill_(m, -2.0),
           lambda a, m: np.where(m, -2.0, a), [(4, 3), (3,)], make=_mask()),
    Sample("index_add_", lambda a, i, s: a.clone().index_add_(0, i, s), _index_add_ref(0),
           [(4, 3), (5,), (5, 3)], uneven=[(7, 5), (5,), (5, 5)], make=_ints(0, 4),
           grad=(0, 2)),
    Sample("index_copy_", lambda a, i, s: a.clone().index_copy_(0, i, s), _index_copy_ref,
           [(4, 3), (3,), (3, 3)], uneven=[(7, 5), (3,), (3, 5)], make=_distinct(4),
           grad=(0, 2)),
    Sample("index_fill_", lambda a: a.clone().index_fill_(1, [0, 2], -1.5),
           lambda a: _filled_ref(a), [(4, 3)]),
    Sample("scatter_", lambda x, i, s: x.clone().scatter_(1, i, s), _scatter_ref(1),
           [(4, 3), (4, 2), (4, 2)], make=_row_distinct(3), grad=(0, 2)),
    Sample("scatter_add_", lambda x, i, s: x.clone().scatter_add_(1, i, s),
           _scatter_ref(1, "add"), [(4, 3), (4, 5), (4, 5)], make=_ints(0, 3), grad=(0, 2)),
]


def _filled_ref(a):
    out = a.copy()
    out[:, [0, 2]] = -1.5
    return out


def _put_pairs(a, i, v):
    out = a.copy()
    out[i, i[::-1]] = v
    return out
