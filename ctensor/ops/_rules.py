"""Shared helpers for op declarations: metadata checks, signature builders, and the
:func:`defop` every op family uses (dispatch's, with PyTorch-keyword errors)."""
from __future__ import annotations

import functools
import inspect
from collections import namedtuple
from typing import Callable, Optional, Sequence

import numpy as np

from .._args import norm_dim
from ..dtypes import result_type
from .. import dispatch
from ..dispatch import Signature, sig
from .. import cost
from ..registry import OPS
from ..sbp import Broadcast, Partial, ReduceOp, Split, dual, without_partial

B = Broadcast()
P = Partial(ReduceOp.SUM)
PMAX = Partial(ReduceOp.MAX)
PMIN = Partial(ReduceOp.MIN)
S = Split


_HALF = np.dtype(np.float16)


def widen(xp, *arrays):
    """``arrays`` with float16 ones as float32: kernels that reduce (softmax, layer norm,
    cross entropy statistics) or accumulate (NumPy's matmul, which has no float16 BLAS) work
    in float32 and dispatch casts their result back to the op's float16 output, as GPUs
    accumulate float16 products in float32."""
    for a in arrays:
        if a.dtype.char == "e":  # float16
            break
    else:
        return arrays if len(arrays) > 1 else arrays[0]
    out = tuple(a.astype(np.float32) if a.dtype == _HALF else a for a in arrays)
    return out if len(out) > 1 else out[0]


def widened(fn: Callable) -> Callable:
    """A composite run in float32 when its first input is float16, its results cast back:
    the composites of softmax, layer norm and cross entropy keep their row statistics
    (sums of exponentials, variances) in float32."""
    @functools.wraps(fn)
    def run(x, *rest, **attrs):
        if x.dtype != _HALF:
            return fn(x, *rest, **attrs)
        out = fn(OPS.to(x, np.float32), *rest, **attrs)
        return OPS.to(out, _HALF)
    return run


def broadcast_shapes(opname: str, *shapes) -> tuple:
    """NumPy/PyTorch broadcasting of ``shapes``; ``ValueError`` naming the op otherwise."""
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(f"{opname}: shapes {', '.join(str(tuple(s)) for s in shapes)} cannot "
                         f"be broadcast together (each dim must match or be 1)") from None


def elementwise_signatures(layouts: Sequence, out_shape: tuple, partial: Sequence = ()) -> list:
    """B..->B first (ties prefer no split), then S(d) for each output dim (inputs that
    broadcast along d stay B), then the given partial signatures.

    ``partial``: tuples of input SBPs whose output is P, e.g. ``[(P, P)]`` for add.
    """
    n = len(out_shape)
    cands = [sig([B] * len(layouts), B)]
    for d in range(n):
        ins, any_split = [], False
        for l in layouts:
            k = d - (n - l.ndim)
            if k >= 0 and l.shape[k] == out_shape[d]:
                ins.append(S(k))
                any_split = True
            else:
                ins.append(B)
        if any_split:
            cands.append(sig(ins, S(d)))
    for ins in partial:
        cands.append(sig(list(ins), P))
    return cands


def result_dtype(opname: str, dtypes: Sequence) -> np.dtype:
    """The promoted dtype of tensors of ``dtypes`` (PyTorch's table, :mod:`ctensor.dtypes`:
    int64 + float16 -> float16, not NumPy's float64)."""
    try:
        return result_type(dtypes)
    except TypeError:
        raise TypeError(f"{opname}: no common dtype for {[str(d) for d in dtypes]}") from None


def transposed_signatures(forward: Sequence, wrt: int, order: Sequence) -> list:
    """The signatures of the kernel that computes the gradient of a *linear* op with respect
    to its input ``wrt``, derived from the forward op's signatures (so the two lists never
    drift apart). Each forward rule ``ins -> out`` gives ``grad ins -> dual(ins[wrt])``,
    where the gradient kernel's inputs are, per entry of ``order``: ``"g"`` -> the incoming
    gradient, laid out ``dual(out)``, and ``i`` -> forward input ``i`` with its forward SBP
    (the transpose of a linear map sends the dual layouts back). Every input broadcast ->
    broadcast (each rank computing the whole gradient) comes first; rules with P(max) or
    P(min) are left out (they are not linear), duplicates are dropped.
    """
    out = [sig([B] * len(order), B)]
    for rule in forward:
        entries = list(rule.inputs) + list(rule.outputs)
        if any(isinstance(s, Partial) and s.op is not ReduceOp.SUM for s in entries):
            continue
        ins = [dual((rule.outputs[0],))[0] if i == "g" else rule.inputs[i] for i in order]
        cand = sig(ins, dual((rule.inputs[wrt],))[0])
        if cand not in out:
            out.append(cand)
    return out


def row_stats_comm(n_reductions: int, dims_of):
    """The ``comm`` estimate (seconds) of a composite that reduces ``n_reductions`` row
    statistics (max, sum, mean) over the dims ``dims_of(layout, attrs)`` of its first input:
    each is an all-reduce of one value per row. (Its elementwise passes are those the fused
    kernel makes too, on the shard the cost model already charges.)"""
    def comm(layouts, axis, **attrs):
        x = layouts[0]
        reduced_size = int(np.prod([x.shape[d] for d in dims_of(x, attrs)], dtype=np.int64))
        rows = x.numel // max(1, reduced_size)
        p = x.placement
        if p.shape[axis] == 1:  # a size-1 axis: nothing to reduce, the layout stays as it is
            return 0.0
        return n_reductions * cost.collective("all_reduce", p.shape[axis],
                                              rows * x.dtype.itemsize, p.device)
    return comm


def reduced(t):
    """``t`` with its partial axes reduced (boxed to broadcast): a small reduction result
    made whole before it meets the big tensor it normalises."""
    if not t._layout.has_partial:
        return t
    return OPS.to_global(t, None, without_partial(t.sbp))


def split_along(layout, dim: int) -> bool:
    """Whether some mesh axis splits ``dim``."""
    return any(isinstance(s, Split) and s.dim == dim for s in layout.sbp)


#: what ``max(dim)``, ``min(dim)``, ``sort`` and ``topk`` return: ``values, indices = ...``
#: or ``out.values`` / ``out.indices`` (PyTorch's return types)
ValuesIndices = namedtuple("ValuesIndices", ["values", "indices"])


# ----------------------------------------------------------------------------- keywords
#: NumPy keyword -> the PyTorch name ctensor uses
NUMPY_KEYWORDS = {"axis": "dim", "axes": "dims", "keepdims": "keepdim", "newshape": "shape",
                  "ddof": "correction", "ord": "p", "axis1": "dim0", "axis2": "dim1",
                  "indices": "index", "a": "input", "reps": "sizes", "kind": "stable"}


def unexpected_keyword(opname: str, keyword: str, front: Callable) -> TypeError:
    """The ``TypeError`` for a keyword ``front`` does not take, naming the PyTorch
    spelling when the keyword is NumPy's (``axis`` -> ``dim``)."""
    params = list(inspect.signature(front).parameters.values())
    if params and params[0].name == "op":
        params = params[1:]
    head = f"{opname}: got an unexpected keyword argument '{keyword}'"
    torch_name = NUMPY_KEYWORDS.get(keyword)
    for p in params:
        if p.name != torch_name:
            continue
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            return TypeError(f"{head}; ctensor follows PyTorch: pass {torch_name} "
                             f"positionally, e.g. x.{opname}(2, 3)")
        return TypeError(f"{head}; ctensor follows PyTorch: use {torch_name}=")
    names = [p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                  inspect.Parameter.KEYWORD_ONLY)]
    return TypeError(f"{head}; accepted keywords: {', '.join(names) or 'none'}")


def defop(name: Optional[str] = None, **declaration) -> Callable:
    """:func:`ctensor.dispatch.defop` for the op families: the same declaration, with an
    unknown keyword raising :func:`unexpected_keyword`'s message (``x.mean(axis=1)`` says
    "use dim=")."""
    return dispatch.defop(name, keyword_error=unexpected_keyword, **declaration)


__all__ = ["defop", "unexpected_keyword", "ValuesIndices", "B", "P",
           "PMAX", "PMIN", "S", "Signature", "sig", "broadcast_shapes", "norm_dim",
           "elementwise_signatures", "result_dtype", "transposed_signatures",
           "row_stats_comm", "reduced", "split_along"]
