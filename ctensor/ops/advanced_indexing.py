"""Advanced indexing ``x[index]`` and assignment ``x[index] = value``, written with the ops
that lay them out (basic ``getitem``, ``flip``, ``reshape``/``permute``, ``index_select``,
``index_copy`` / ``index_add``, ``where``), so every layout rule and gradient is theirs.

What an index may hold, beyond ints, positive-step slices, ``None`` and ``...`` (basic
indexing, :mod:`ctensor.ops.indexing`):

* integer ct.Tensors, lists and NumPy arrays (negative entries count from the end);
* bool ct.Tensors, lists and arrays: a mask over as many dims as it has, which must match
  them; it selects like the integer indices of its True entries (``nonzero``), read with one
  host sync (a constant list or array needs none), and a 0-d mask or Python ``True`` /
  ``False`` adds a dim of size 1 / 0;
* slices with negative steps, as NumPy takes them (PyTorch refuses them): ``x[::-1]`` is
  ``x.flip(0)``, ``x[5:1:-2]`` picks 5 and 3.

Several advanced indices broadcast together (PyTorch's and NumPy's rule): the result's
indexed dims are replaced by the broadcast shape, in place when the advanced indices are
next to each other and in front otherwise. An int between two of them does not separate
them (PyTorch applies ints first; NumPy would count the int as advanced and put the block in
front of ``x[0, :, idx]``: ctensor follows PyTorch).

Layouts (what the ops above make of them): an index along a dim that is not split stays
local (``x[:, idx]`` of a row-split ``x`` keeps ``S(0)``); along a split dim each rank looks
up the entries it holds and the result is partial (``P``, summed when read: the embedding
rule), so nothing is gathered. A mask over the leading dims of ``x`` keeps the split of the
remaining ones. Assignment: ``x[mask] = v`` with a ``v`` that does not depend on the mask
position is an elementwise ``where`` (every split local, no host sync); ``x[..., idx, ...]
= v`` along one dim is ``index_copy`` (masked local writes into a split dim); other
advanced assignments write through the flat positions of the selected elements (summed
per dim from views of ``n_d`` positions: memory of a few selections, not of ``x``).
"""
from __future__ import annotations

import math

import numpy as np

from .. import autograd
from ..dispatch import as_tensor
from ..registry import OPS
from ..tensor import Tensor
from .inplace import update as update_in_place
from ._rules import defop
from .index_parse import ALL, IndexOutOfRangeError, out_shape, parse_index
from .selection import index_add, index_copy, index_select, nonzero_positions

__all__ = ["is_advanced", "advanced_getitem", "setitem", "index_put", "index_put_"]


def _negative_step(it) -> bool:
    step = it.step
    return isinstance(step, (int, np.integer)) and not isinstance(step, bool) and step < 0


def is_advanced(index) -> bool:
    """Whether ``index`` holds more than basic indexing: tensors, lists, arrays, bools or a
    negative step."""
    for it in index if type(index) is tuple else (index,):
        kind = type(it)
        if kind is int or it is None or it is Ellipsis:  # (the common items first)
            continue
        if kind is slice:
            if it.step is not None and _negative_step(it):
                return True
        elif isinstance(it, (Tensor, list, np.ndarray, bool, np.bool_, tuple)):
            return True
    return False


# ----------------------------------------------------------------------------- parsing
class _Adv:
    """One advanced item: its value (a ct.Tensor or a NumPy array), whether it is a mask,
    and the number of input dims it covers."""

    __slots__ = ("value", "mask", "ndim", "pos")

    def __init__(self, value, mask: bool, ndim: int):
        self.value, self.mask, self.ndim, self.pos = value, mask, ndim, None


def _classify(opname: str, it):
    if isinstance(it, (bool, np.bool_)):
        return _Adv(np.asarray(bool(it)), True, 0)
    if isinstance(it, Tensor):
        kind = it.dtype.kind
        if kind not in "biu":
            raise TypeError(f"{opname}: tensors used as indices must hold integers or bools, "
                            f"got dtype {it.dtype}; convert the index with .long()")
        return _Adv(it, kind == "b", it.ndim if kind == "b" else 1)
    if isinstance(it, (list, tuple, np.ndarray)):  # (a tuple inside the index: a list)
        if isinstance(it, (list, tuple)) and any(isinstance(v, Tensor) for v in it):
            raise TypeError(f"{opname}: a list of ct.Tensors is not an index; pass a tuple "
                            f"of index tensors (x[rows, cols]) or stack them")
        arr = np.asarray(it)
        if arr.size == 0 and arr.dtype.kind not in "biu":
            arr = arr.astype(np.int64)
        if arr.dtype.kind not in "biu":
            raise TypeError(f"{opname}: an index list or array must hold ints or bools, got "
                            f"dtype {arr.dtype}")
        mask = arr.dtype.kind == "b"
        return _Adv(arr if mask else arr.astype(np.int64), mask, arr.ndim if mask else 1)
    return it


def _expand(opname: str, index, shape: tuple) -> list:
    items = [_classify(opname, it) for it in (index if isinstance(index, tuple) else (index,))]
    if sum(it is Ellipsis for it in items) > 1:
        raise ValueError(f"{opname}: the index has more than one '...'; accepted: at most one")
    used = sum(it.ndim if isinstance(it, _Adv) else 1 for it in items
               if it is not None and it is not Ellipsis)
    if used > len(shape):
        raise IndexOutOfRangeError(f"{opname}: the index covers {used} dims but the tensor "
                                   f"has {len(shape)} (shape {tuple(shape)})")
    fill = [slice(None)] * (len(shape) - used)
    if Ellipsis in [it for it in items if not isinstance(it, _Adv)]:
        k = next(i for i, it in enumerate(items) if it is Ellipsis)
        return items[:k] + fill + items[k + 1:]
    return items + fill


def _split(opname: str, x, index):
    """The basic part of ``index`` (advanced items as whole slices, negative steps as
    positive ones), the dims of its result to flip, and the advanced items with their
    positions in that result."""
    shape = tuple(x.shape)
    basic, flips, adv, d, j = [], [], [], 0, 0
    for it in _expand(opname, index, shape):
        if it is None:
            basic.append(None)
            j += 1
        elif isinstance(it, _Adv):
            got = tuple(it.value.shape) if it.mask else None
            if it.mask and got != shape[d:d + it.ndim]:
                raise IndexOutOfRangeError(f"{opname}: a mask of shape {got} indexes dims "
                                           f"{d}..{d + it.ndim - 1} of shape "
                                           f"{shape[d:d + it.ndim]}; accepted: a mask of "
                                           f"exactly the shape of the dims it covers")
            basic += [slice(None)] * it.ndim
            it.pos = j
            adv.append(it)
            d += it.ndim
            j += it.ndim
        elif isinstance(it, slice) and _negative_step(it):
            r = range(*it.indices(shape[d]))
            if len(r):  # the same elements in increasing order, flipped afterwards
                basic.append(slice(r[-1], r[0] + 1, -r.step))
                flips.append(j)
            else:
                basic.append(slice(0, 0))
            d += 1
            j += 1
        else:
            basic.append(it)
            if not isinstance(it, slice):
                j -= 1  # an int removes its dim
            d += 1
            j += 1
    return tuple(basic), tuple(flips), adv


def _host_index(opname: str, arr: np.ndarray, size: int) -> np.ndarray:
    if arr.size and (arr.min() < -size or arr.max() >= size):
        raise IndexOutOfRangeError(f"{opname}: index holds values in [{arr.min()}, "
                                   f"{arr.max()}], out of range for a dim of size {size}; "
                                   f"accepted: {-size}..{size - 1}")
    return np.where(arr < 0, arr + size, arr)


# ----------------------------------------------------------------------------- getitem
def advanced_getitem(x: Tensor, index, opname: str = "getitem") -> Tensor:
    """``x[index]`` for an index :func:`is_advanced` accepts (see the module docstring)."""
    basic, flips, adv = _split(opname, x, index)
    y = OPS.getitem(x, basic)
    if flips:
        y = OPS.flip(y, flips)
    if not adv:
        return y
    shift, positions, indices = 0, [], []
    for it in adv:  # masks -> flat int positions over their (merged) dims
        j = it.pos - shift
        if it.mask:
            shape = tuple(y.shape)
            y = y.reshape(shape[:j] + (math.prod(shape[j:j + it.ndim]),) + shape[j + it.ndim:])
            shift += it.ndim - 1
            value = np.flatnonzero(it.value) if isinstance(it.value, np.ndarray) else \
                nonzero_positions(it.value.reshape(-1), True, opname)
        else:
            value = it.value
        positions.append(j)
        indices.append(value)
    if len(indices) == 1:
        (j,), (idx,) = positions, indices
        if isinstance(idx, np.ndarray):
            idx = _host_index(opname, idx, y.shape[j])
        out = index_select(y, j, idx.reshape(-1))
        if idx.ndim != 1:
            shape = tuple(y.shape)
            out = out.reshape(shape[:j] + tuple(idx.shape) + shape[j + 1:])
        return out
    return _several(opname, y, positions, indices)


def _several(opname: str, y: Tensor, positions: list, indices: list) -> Tensor:
    """Advanced indices on dims ``positions`` of ``y``, broadcast together: the dims are
    brought to the front and merged, and the broadcast indices become one flat position."""
    sizes = [y.shape[j] for j in positions]
    try:
        bshape = tuple(np.broadcast_shapes(*[tuple(i.shape) for i in indices]))
    except ValueError:
        raise IndexOutOfRangeError(
            f"{opname}: index shapes {[tuple(i.shape) for i in indices]} cannot be broadcast "
            f"together (each dim must match or be 1)") from None
    strides = [math.prod(sizes[k + 1:]) for k in range(len(sizes))]
    if all(isinstance(i, np.ndarray) for i in indices):  # constants: on the host
        flat = sum(_host_index(opname, i, n) * s for i, n, s in zip(indices, sizes, strides))
        flat = np.broadcast_to(flat, bshape)
    else:
        flat = None
        for i, n, s in zip(indices, sizes, strides):
            if isinstance(i, np.ndarray):
                i = as_tensor([y, _host_index(opname, i, n)], opname)[1]
            else:  # negatives wrapped and every value range-checked by the lookup
                table = as_tensor([y, np.arange(n, dtype=np.int64)], opname)[1]
                i = index_select(table, 0, i.reshape(-1)).reshape(tuple(i.shape))
            term = i * s if s != 1 else i
            flat = term if flat is None else flat + term
        if tuple(flat.shape) != bshape:
            flat = OPS.expand(flat, *bshape)
    rest = [j for j in range(y.ndim) if j not in positions]
    moved = OPS.permute(y, tuple(positions) + tuple(rest)) if positions != \
        list(range(len(positions))) else y
    rest_shape = tuple(y.shape[j] for j in rest)
    merged = moved.reshape((math.prod(sizes),) + rest_shape)
    out = index_select(merged, 0, flat.reshape(-1)).reshape(bshape + rest_shape)
    first, nb = positions[0], len(bshape)
    if positions == list(range(first, first + len(positions))) and first:
        order = [nb + i for i in range(first)] + list(range(nb)) + \
            [nb + i for i in range(first, len(rest))]
        out = OPS.permute(out, tuple(order))
    return out


# ----------------------------------------------------------------------------- setitem
def _fit(opname: str, value: Tensor, shape: tuple) -> Tensor:
    """``value`` broadcast to ``shape`` (leading size-1 dims beyond it dropped, as PyTorch
    does)."""
    while value.ndim > len(shape) and value.shape[0] == 1:
        value = value.reshape(tuple(value.shape[1:]))
    try:
        fits = np.broadcast_shapes(tuple(value.shape), shape) == shape
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"{opname}: a value of shape {tuple(value.shape)} cannot be assigned "
                         f"to the {shape} elements the index selects; accepted: a number or "
                         f"a tensor that broadcasts to {shape}")
    return value if tuple(value.shape) == shape else OPS.expand(value, *shape)


def _value(opname: str, x: Tensor, value) -> Tensor:
    if not isinstance(value, (Tensor, bool, int, float, complex, np.number, np.bool_,
                              np.ndarray, list)):
        raise TypeError(f"{opname}: cannot assign a {type(value).__name__}; accepted: a "
                        f"number, a ct.Tensor, a list or a NumPy array")
    v = as_tensor([x, value], opname)[1]
    return v if v.dtype == x.dtype else OPS.to(v, x.dtype)  # cast, as PyTorch does


def _mask_only(index, ndim: int):
    """The mask of an index that is one mask over leading dims (``x[mask]``,
    ``x[mask, ...]``), else None."""
    items = index if isinstance(index, tuple) else (index,)
    if len(items) == 2 and items[1] is Ellipsis:
        items = items[:1]
    if len(items) != 1:
        return None
    it = items[0]
    if isinstance(it, Tensor) and it.dtype.kind == "b" and 0 < it.ndim <= ndim:
        return it
    if isinstance(it, (list, np.ndarray)) and not isinstance(it, Tensor):
        arr = np.asarray(it)
        if arr.dtype.kind == "b" and 0 < arr.ndim <= ndim:
            return arr
    return None


def _one_dim(index, ndim: int):
    """``(dim, integer index)`` of an index that is one integer index among whole slices
    (``x[idx]``, ``x[:, idx]``, ``x[..., idx]``), else None."""
    items = list(index) if isinstance(index, tuple) else [index]
    if sum(it is Ellipsis for it in items) > 1:
        return None
    if Ellipsis in [it for it in items if not isinstance(it, (Tensor, list, np.ndarray))]:
        k = next(i for i, it in enumerate(items) if it is Ellipsis)
        items = items[:k] + [slice(None)] * (ndim - len(items) + 1) + items[k + 1:]
    found = None
    for d, it in enumerate(items):
        if isinstance(it, slice) and it == slice(None):
            continue
        if isinstance(it, Tensor) and it.dtype.kind in "iu" or \
                isinstance(it, (list, np.ndarray)) and np.asarray(it).dtype.kind in "iu":
            if found is not None:
                return None
            found = (d, it)
            continue
        return None
    return found if found is not None and len(items) <= ndim else None


def assigned(t: Tensor, index, value, accumulate: bool = False, opname: str = "setitem"):
    """``t`` with ``t[index]`` replaced by (or, with ``accumulate``, increased by)
    ``value``: a new tensor (the out-of-place form of ``t[index] = value``)."""
    shape = tuple(t.shape)
    v = _value(opname, t, value)
    if not is_advanced(index):
        entries = parse_index(index, shape)
        sel = out_shape(entries, shape)
        v = _fit(opname, v, sel)
        if accumulate:
            v = OPS.getitem(t, index) + v
        if all(e[0] == ALL for e in entries):
            return v
        return OPS.record("getitem").opdef.grads["assign"](t, v, index=entries)
    mask = _mask_only(index, t.ndim)
    if mask is not None and tuple(mask.shape) == shape[:mask.ndim]:  # (else: the error below)
        k, rest = mask.ndim, shape[mask.ndim:]
        w = v.reshape(tuple(v.shape[1:])) if v.ndim == len(rest) + 1 and v.shape[0] == 1 \
            else v
        if w.ndim <= len(rest):  # the same value at every selected position: elementwise
            w = _fit(opname, w, rest)
            m = as_tensor([t, mask], opname)[1]
            m = m.reshape(tuple(m.shape) + (1,) * (t.ndim - k))
            return OPS.where(m, t + w if accumulate else w, t)
    one = _one_dim(index, t.ndim)
    if one is not None:
        d, idx = one
        idx = np.asarray(idx, dtype=np.int64) if not isinstance(idx, Tensor) else idx
        if isinstance(idx, np.ndarray):
            idx = _host_index(opname, idx, shape[d])
        v = _fit(opname, v, shape[:d] + tuple(idx.shape) + shape[d + 1:])
        v = v.reshape(shape[:d] + (math.prod(idx.shape),) + shape[d + 1:])
        put = index_add if accumulate else index_copy
        return put(t, d, idx.reshape(-1), v)
    flat = _flat_positions(opname, t, index)
    v = _fit(opname, v, tuple(flat.shape))
    put = index_add if accumulate else index_copy
    return put(t.reshape(-1), 0, flat.reshape(-1), v.reshape(-1)).reshape(shape)


def _flat_positions(opname: str, t: Tensor, index) -> Tensor:
    """The flat positions in ``t`` of the elements ``t[index]`` selects, shaped like the
    selection. Indexing is linear, so they are the sum over dims ``d`` of the selection
    from ``position_d * stride_d`` broadcast over ``t``'s shape (a view of ``n_d`` values):
    memory of ``ndim`` selections, never of ``t``'s size; tensor masks become their
    integer positions once (one host sync each)."""
    items = index if isinstance(index, tuple) else (index,)
    converted = []
    for it in items:
        if isinstance(it, Tensor) and it.dtype.kind == "b" and it.ndim:
            converted += list(OPS.nonzero(it, as_tuple=True))
        else:
            converted.append(it)
    index = tuple(converted)
    shape = tuple(t.shape)
    flat = None
    with autograd.no_grad():
        for d, n in enumerate(shape):
            along = [1] * len(shape)
            along[d] = n
            positions = np.arange(n, dtype=np.int64) * math.prod(shape[d + 1:])
            view = OPS.expand(as_tensor([t, positions.reshape(along)], opname)[1], *shape)
            part = advanced_getitem(view, index, opname)
            flat = part if flat is None else flat + part
        if flat is None:  # a 0-d t
            flat = advanced_getitem(as_tensor([t, np.zeros((), np.int64)], opname)[1], index,
                                    opname)
    return flat


@defop()
def setitem(x, index, value):
    """``x[index] = value`` in place (``Tensor.__setitem__``): any index ``x[index]`` takes,
    a number or a tensor broadcast to the selection (cast to ``x``'s dtype). Recorded by
    autograd like the other in-place ops.

    >>> x[:, 0] = 0; x[x > 1] = 1.0; x[idx] = rows
    """
    return update_in_place("setitem", x, lambda t: assigned(t, index, value), (value,))


def _indices(opname: str, indices) -> tuple:
    if not isinstance(indices, (tuple, list)):
        raise TypeError(f"{opname}: argument 'indices' must be a tuple of index tensors, got "
                        f"{type(indices).__name__}")
    return tuple(slice(None) if i is None else i for i in indices)


@defop(method=True)
def index_put(input, indices, values, accumulate: bool = False):  # noqa: A002
    """``input`` with ``input[indices] = values`` (``+=`` with ``accumulate``, repeated
    positions adding up), out of place (PyTorch's ``index_put``).

    >>> ct.index_put(x, (rows, cols), ct.tensor(1.0, placement=p), accumulate=True)
    """
    return assigned(input, _indices("index_put", indices), values, bool(accumulate),
                    "index_put")


@defop(method=True)
def index_put_(input, indices, values, accumulate: bool = False):  # noqa: A002
    """``index_put`` in place (returns ``input``).

    >>> x.index_put_((idx,), src, accumulate=True)
    """
    index = _indices("index_put_", indices)
    return update_in_place("index_put_", input,
                           lambda t: assigned(t, index, values, bool(accumulate), "index_put_"),
                           (values,))
