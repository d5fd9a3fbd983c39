"""Parsing a basic index (ints, positive-step slices, ``None``, ``...``) into hashable
entries, one per item that produces or consumes a dim: pure functions of the index and the
shape, shared by ``getitem`` (:mod:`ctensor.ops.indexing`) and the advanced forms
(:mod:`ctensor.ops.advanced_indexing`)."""
from __future__ import annotations

import operator

import numpy as np

from ..tensor import Tensor

__all__ = ["IndexOutOfRangeError", "parse_index", "out_shape", "whole_dims", "local_index",
           "NEW", "INT", "ALL", "SLICE"]

NEW, INT, ALL, SLICE = "new", "int", "all", "slice"


class IndexOutOfRangeError(IndexError, ValueError):
    """An int index outside its dim: a ``ValueError`` like every bad argument, and an
    ``IndexError`` so that Python's sequence protocol (``for row in x``) stops on it."""


# ----------------------------------------------------------------------------- parsing
def _index_int(v, what: str) -> int:
    if isinstance(v, bool):
        raise TypeError(f"getitem: {what} must be an int or None, got {v!r} (bool)")
    try:
        return operator.index(v)
    except TypeError:
        given = "a ct.Tensor" if isinstance(v, Tensor) else f"{v!r} ({type(v).__name__})"
        raise TypeError(f"getitem: {what} must be an int or None, got {given}") from None


def parse_index(index, shape: tuple) -> tuple:
    """Normalise a basic index for ``shape`` into hashable entries, one per output-producing
    item: ``("new",)`` for None, ``("int", i)`` (i >= 0), ``("all",)`` for a dim kept
    whole, ``("slice", start, stop, step)`` otherwise. Every input dim gets an entry."""
    items = index if isinstance(index, tuple) else (index,)
    for it in items:
        if it is None or it is Ellipsis or isinstance(it, slice):
            continue
        if isinstance(it, bool) or isinstance(it, (Tensor, list, np.ndarray)) or \
                not hasattr(it, "__index__"):
            given = (f"a ct.Tensor of shape {tuple(it.shape)}" if isinstance(it, Tensor)
                     else f"{it!r} ({type(it).__name__})")  # a Tensor's repr would gather
            raise TypeError(f"getitem: index {given} is not supported; accepted: ints, "
                            f"slices, None, ..., integer or bool tensors, lists and arrays, "
                            f"and tuples of these")
    if sum(it is Ellipsis for it in items) > 1:
        raise ValueError(f"getitem: index {index!r} has more than one '...'; accepted: at "
                         f"most one")
    used = sum(1 for it in items if it is not None and it is not Ellipsis)
    if used > len(shape):
        raise IndexOutOfRangeError(f"getitem: index {index!r} indexes {used} dims but the "
                                   f"tensor has {len(shape)} (shape {tuple(shape)})")
    expanded = []
    for it in items:
        if it is Ellipsis:
            expanded += [slice(None)] * (len(shape) - used)
        else:
            expanded.append(it)
    if not any(it is Ellipsis for it in items):
        expanded += [slice(None)] * (len(shape) - used)
    entries, d = [], 0
    for it in expanded:
        if it is None:
            entries.append((NEW,))
            continue
        n = shape[d]
        if isinstance(it, slice):
            start = None if it.start is None else _index_int(it.start, "a slice start")
            stop = None if it.stop is None else _index_int(it.stop, "a slice stop")
            step = 1 if it.step is None else _index_int(it.step, "a slice step")
            if step == 0:
                raise ValueError(f"getitem: slice step 0 on dim {d}; accepted: a non-zero "
                                 f"step")
            if step < 0:  # (advanced_indexing turns negative steps into flips first)
                raise ValueError(f"getitem: slice step {step} on dim {d} reached basic "
                                 f"indexing; accepted here: steps > 0")
            start, stop, step = slice(start, stop, step).indices(n)
            stop = max(stop, start)
            whole = start == 0 and stop == n and step == 1
            entries.append((ALL,) if whole else (SLICE, start, stop, step))
        else:
            i = _index_int(it, "an index")
            if not -n <= i < n:
                raise IndexOutOfRangeError(f"getitem: index {i} is out of range for dim {d} "
                                           f"of size {n}; accepted: {-n}..{n - 1}")
            entries.append((INT, i % n))
        d += 1
    return tuple(entries)


def out_shape(entries: tuple, shape: tuple) -> tuple:
    out, d = [], 0
    for e in entries:
        if e[0] == NEW:
            out.append(1)
            continue
        if e[0] == ALL:
            out.append(shape[d])
        elif e[0] == SLICE:
            out.append(len(range(e[1], e[2], e[3])))
        d += 1
    return tuple(out)


def whole_dims(entries: tuple) -> list:
    """``(input dim, output dim)`` of every dim the index keeps whole."""
    pairs, d, j = [], 0, 0
    for e in entries:
        if e[0] == NEW:
            j += 1
        elif e[0] == INT:
            d += 1
        else:
            if e[0] == ALL:
                pairs.append((d, j))
            d += 1
            j += 1
    return pairs


def local_index(entries: tuple) -> tuple:
    """The NumPy index of the local selection: whole dims take the shard as it is (so a
    split of them needs no offset); the trailing ``...`` keeps 0-d results arrays."""
    out = []
    for e in entries:
        out.append(None if e[0] == NEW else e[1] if e[0] == INT else
                   slice(None) if e[0] == ALL else slice(e[1], e[2], e[3]))
    return tuple(out) + (Ellipsis,)
