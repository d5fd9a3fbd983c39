"""Reductions: sum, mean, prod, amax/amin (and max/min), argmax/argmin, any/all; var, std,
norm and logsumexp written with them.

Signatures (1-D) for a reduction over dims D:

* B -> B;
* S(e), e not in D -> S(e') (e' = e shifted left by the reduced dims before it, unless
  keepdim);
* S(d), d in D -> P for sum/mean (the local sums add up: sum_r sum(x_r) = sum(X); mean
  divides each local sum by the *global* count), P(max)/P(min) for amax/amin;
* P -> P for sum/mean (linear), P(max) -> P(max) for amax (max of maxes), P(min) likewise.

any/all reduce like amax/amin (a split reduced dim gives P(max) / P(min): the OR / AND
across ranks). argmax/argmin need the values and positions together, so they accept B and
S(e), e != d; a split along the reduced dim is boxed first. ``prod`` has no partial-product
SBP either: B -> B and S(e), e not in D, only. ``max(dim)``/``min(dim)`` are argmax/argmin
and a ``gather`` of the values at those indices, so the gradient goes to the returned index
(PyTorch's rule), while ``amax``/``amin`` share it evenly among ties. max, min, amax, amin,
argmax and argmin of an empty selection raise ``ValueError`` before any communication.
"""
from __future__ import annotations

import builtins
import math
from typing import Optional

import numpy as np

from ..registry import OPS
from ..dtypes import reduction_dtype, to_dtype
from ..sbp import ReduceOp
from ..dispatch import apply
from ..tensor import TENSOR_TYPES, Tensor
from ._rules import B, P, PMAX, PMIN, S, ValuesIndices, defop, norm_dim, reduced, sig


def _dims(opname: str, dim, ndim: int) -> tuple:
    if type(dim) is int and 0 <= dim < ndim:  # the common case, checked cheaply
        return (dim,)
    if dim is None:
        return tuple(range(ndim))
    dims = dim if isinstance(dim, (tuple, list)) else (dim,)
    out = tuple(sorted({norm_dim(opname, d, ndim) for d in dims})) if ndim else ()
    if len(out) != len(dims):
        raise ValueError(f"{opname}: argument 'dim' {dim} names a dim twice")
    return out


def _out_shape(shape: tuple, dims: tuple, keepdim: bool) -> tuple:
    if keepdim:
        return tuple(1 if i in dims else n for i, n in enumerate(shape))
    return tuple(n for i, n in enumerate(shape) if i not in dims)


def _shift(e: int, dims: tuple, keepdim: bool) -> int:
    return e if keepdim else e - sum(1 for d in dims if d < e)


def _reduce_signatures(partial_out, partial_in):
    def signatures(layouts, dims, keepdim, **_):
        (x,) = layouts
        cands = [sig([B], B)]
        for e in range(x.ndim):
            if e in dims:
                if partial_out is not None:
                    cands.append(sig([S(e)], partial_out))
            else:
                cands.append(sig([S(e)], S(_shift(e, dims, keepdim))))
        if partial_in is not None:
            cands.append(sig([partial_in], partial_in))
        return cands
    return signatures


def _reduce_meta(opname: str):
    def meta(layouts, dims, keepdim, **_):
        (x,) = layouts
        return [(_out_shape(x.shape, dims, keepdim), reduction_dtype(opname, x.dtype))]
    return meta


def _check_nonempty(opname: str, x, dims: tuple) -> None:
    """``ValueError`` when a reduction without an identity (max, argmax, ...) would reduce
    an empty dim: raised before any communication, as PyTorch does."""
    empty = [d for d in dims if x.shape[d] == 0]
    if empty:
        raise ValueError(f"{opname}: cannot reduce dim {empty[0]} of size 0 (input shape "
                         f"{tuple(x.shape)}): an empty selection has no {opname}; accepted: "
                         f"reduced dims of non-zero size (pass dim= to reduce a non-empty "
                         f"dim; sum, mean and prod of empty tensors are defined)")


def _acc_dtype(dtype):
    """The accumulation dtype of sums and products: int64 for bool/integer inputs."""
    return np.int64 if dtype.kind in "biu" else None


# ----------------------------------------------------------------------------- expand back
def _unreduce_kernel(xp, g, dims, keepdim, shape, ctx):
    """Broadcast a reduced gradient back over the reduced dims (local region of ``shape``)."""
    if not keepdim and dims:
        g = xp.expand_dims(g, dims)
    local = tuple(b - a for a, b in ctx.out_region(0))
    return xp.broadcast_to(g, local).copy()


def _unreduce_signatures(layouts, dims, keepdim, shape, **_):
    # the transposes of the reduction's rules: a kept dim's split maps back; a replicated
    # gradient fills any split of a reduced dim locally (each shard broadcasts into its part)
    cands = [sig([B], B), sig([P], P)]
    kept = [e for e in range(len(shape)) if e not in dims]
    for e in kept:
        cands.append(sig([S(_shift(e, dims, keepdim))], S(e)))
    cands += [sig([B], S(d)) for d in dims]
    return cands


def unreduce(g, dims: tuple, keepdim: bool, shape: tuple):
    """The inverse shape of a reduction: ``g`` (reduced over ``dims`` of an input of
    ``shape``) broadcast back to ``shape``. A gradient kernel of ``sum`` (declared below);
    the backwards of every reduction, and matmul's for 1-D operands, use it."""
    return sum_.op.grads["unreduce"](g, dims=tuple(dims), keepdim=bool(keepdim),
                                     shape=tuple(shape))


def in_dtype(op, opname: str, x, dtype, **attrs):
    """``op`` over ``x`` cast to ``dtype``, the result in ``dtype`` too (PyTorch's
    ``dtype=`` of sum, prod, cumsum, cumprod: ``mask.sum(dtype=ct.int32)`` is int32, not the
    int64 an integer sum gives otherwise)."""
    dtype = to_dtype(opname, "dtype", dtype)
    out = op(OPS.to(x, dtype), **attrs)
    return out if out.dtype == dtype else OPS.to(out, dtype)


def _check(opname, x):
    if not isinstance(x, Tensor):
        raise TypeError(f"{opname}: expected a ct.Tensor, got {type(x).__name__}")


def _floating_only(opname: str, x, fix: str = "") -> None:
    """``TypeError`` for a bool or integer input of a statistic (mean, var, std, norm,
    logsumexp... PyTorch raises there too: the result is not of the input's kind)."""
    if x.dtype.kind not in "fc":
        raise TypeError(f"{opname}: the input has dtype {x.dtype}; accepted: floating or "
                        f"complex tensors (as in PyTorch); convert it with .float(){fix}")


# ----------------------------------------------------------------------------- sum / mean
def _sum_kernel(xp, x, dims, keepdim):
    dtype = np.int64 if x.dtype.kind in "biu" else None  # _acc_dtype, inline (a hot kernel)
    if xp is np:  # the ufunc's reduce with positional arguments: NumPy's cheapest sum call
        return np.add.reduce(x, dims, dtype, None, keepdim)
    return x.sum(axis=dims, dtype=dtype, keepdims=keepdim)


@defop("sum", kernel=_sum_kernel,
       meta=_reduce_meta("sum"), signatures=_reduce_signatures(P, P), saves=(),
       backward=lambda ctx, g: (unreduce(g, ctx.attrs["dims"], ctx.attrs["keepdim"],
                                         ctx.inputs[0].shape),),
       method=True)
def sum_(op, x, dim=None, keepdim: bool = False, *, dtype=None):
    """Sum over ``dim`` (an int, a tuple, or None for all dims); bool and integer tensors
    sum in int64 (PyTorch's promotion: no wrap-around). ``dtype=``: the input is cast to it
    first and summed in it (PyTorch's rule: ``x.sum(dtype=ct.float64)``).

    >>> x.sum(); x.sum(0); ct.sum(x, (0, 2), keepdim=True)
    """
    if type(x) in TENSOR_TYPES and dtype is None and type(keepdim) is bool:
        if type(dim) is int and 0 <= dim < len(x._layout.shape):  # the common cases, cheaply
            return apply(op, (x,), {"dims": (dim,), "keepdim": keepdim})
        if dim is None:
            return apply(op, (x,), {"dims": tuple(range(len(x._layout.shape))),
                                    "keepdim": keepdim})
    _check("sum", x)
    if dtype is None:
        return op(x, dims=_dims("sum", dim, x.ndim), keepdim=bool(keepdim))
    return in_dtype(op, "sum", x, dtype, dims=_dims("sum", dim, x.ndim),
                     keepdim=bool(keepdim))


sum_.op.grad_kernel(
    "unreduce", _unreduce_kernel, needs_ctx=True,
    meta=lambda layouts, dims, keepdim, shape: [(tuple(shape), layouts[0].dtype)],
    signatures=_unreduce_signatures,
    backward=lambda ctx, g: (OPS.sum(g, dim=ctx.attrs["dims"], keepdim=ctx.attrs["keepdim"]),))


def _mean_kernel(xp, x, dims, keepdim, count):
    out = x.sum(axis=dims, keepdims=keepdim, dtype=_acc_dtype(x.dtype))
    return out / count if count else out * np.nan


@defop(kernel=_mean_kernel, meta=_reduce_meta("mean"), signatures=_reduce_signatures(P, P),
       backward=lambda ctx, g: (unreduce(g / max(ctx.attrs["count"], 1), ctx.attrs["dims"],
                                         ctx.attrs["keepdim"], ctx.inputs[0].shape),),
       method=True)
def mean(op, x, dim=None, keepdim: bool = False, *, dtype=None):
    """Mean over ``dim`` (an int, a tuple, or None for all dims); an empty selection gives
    nan. Bool and integer tensors raise ``TypeError`` unless ``dtype=`` names a floating
    dtype to compute in (PyTorch's rule: ``x.mean(dtype=ct.float32)``).

    >>> x.mean(); x.mean(-1, keepdim=True); counts.mean(dtype=ct.float64)
    """
    if type(x) in TENSOR_TYPES and dtype is None and type(keepdim) is bool and \
            x._layout.dtype.kind in "fc":  # the common cases, cheaply
        shape = x._layout.shape
        if type(dim) is int and 0 <= dim < len(shape):
            return apply(op, (x,), {"dims": (dim,), "keepdim": keepdim, "count": shape[dim]})
        if dim is None:
            return apply(op, (x,), {"dims": tuple(range(len(shape))), "keepdim": keepdim,
                                    "count": x._layout.numel})
    _check("mean", x)
    if dtype is not None:
        dtype = to_dtype("mean", "dtype", dtype)
        if dtype.kind not in "fc":
            raise TypeError(f"mean: argument 'dtype' is {dtype}; accepted: a floating or "
                            f"complex dtype (a mean is not an integer)")
        x = OPS.to(x, dtype)
    _floating_only("mean", x, "; pass dtype=ct.float32 to average it as floats")
    dims = _dims("mean", dim, x.ndim)
    count = int(np.prod([x.shape[d] for d in dims], dtype=np.int64))
    return op(x, dims=dims, keepdim=bool(keepdim), count=count)


# ----------------------------------------------------------------------------- max / min
def _extreme_bw(ctx, g):
    (x,), (out,) = ctx.inputs, ctx.outputs
    dims, keepdim = ctx.attrs["dims"], ctx.attrs["keepdim"]
    hit = (x == unreduce(out, dims, keepdim, x.shape)).to(g.dtype)
    count = unreduce(OPS.sum(hit, dim=dims, keepdim=keepdim), dims, keepdim, x.shape)
    return (unreduce(g, dims, keepdim, x.shape) * hit / count,)


def _extreme_kernel(fn: str, reduce_op: ReduceOp):
    def kernel(xp, x, dims, keepdim):
        if x.size:
            return getattr(xp, fn)(x, axis=dims, keepdims=keepdim)
        return xp.full(_out_shape(x.shape, dims, keepdim), reduce_op.identity(x.dtype),
                       x.dtype)
    return kernel


@defop(kernel=_extreme_kernel("max", ReduceOp.MAX), meta=_reduce_meta("amax"),
       signatures=_reduce_signatures(PMAX, PMAX), backward=_extreme_bw, method=True)
def amax(op, x, dim=None, keepdim: bool = False):
    """Largest value over ``dim`` (int, tuple or None); ties share the gradient evenly
    (PyTorch's amax rule). ``ValueError`` for an empty reduced dim.

    >>> ct.amax(x, 0); x.amax((0, 1), keepdim=True)
    """
    _check("amax", x)
    dims = _dims("amax", dim, x.ndim)
    _check_nonempty("amax", x, dims)
    return op(x, dims=dims, keepdim=bool(keepdim))


@defop(kernel=_extreme_kernel("min", ReduceOp.MIN), meta=_reduce_meta("amin"),
       signatures=_reduce_signatures(PMIN, PMIN), backward=_extreme_bw, method=True)
def amin(op, x, dim=None, keepdim: bool = False):
    """Smallest value over ``dim`` (int, tuple or None); ties share the gradient evenly.

    >>> ct.amin(x, 1, keepdim=True)
    """
    _check("amin", x)
    dims = _dims("amin", dim, x.ndim)
    _check_nonempty("amin", x, dims)
    return op(x, dims=dims, keepdim=bool(keepdim))


def _arg_signatures(layouts, dims, keepdim, **_):
    (x,) = layouts
    return [sig([B], B)] + [sig([S(e)], S(_shift(e, dims, keepdim)))
                            for e in range(x.ndim) if e not in dims]


def _arg_kernel(fn):
    def kernel(xp, x, dims, keepdim):
        if not dims:  # over a 0-d tensor
            return xp.zeros(x.shape, dtype=np.int64)
        if len(dims) == x.ndim and x.ndim > 1:
            flat = getattr(xp, fn)(x.reshape(-1))
            return flat.reshape((1,) * x.ndim) if keepdim else flat
        return getattr(xp, fn)(x, axis=dims[0], keepdims=keepdim)
    return kernel


def _arg_front(opname: str, op, x, dim, keepdim):
    _check(opname, x)
    dims = _dims(opname, dim, x.ndim)
    _check_nonempty(opname, x, dims)
    return op(x, dims=dims, keepdim=bool(keepdim))


@defop(kernel=_arg_kernel("argmax"), meta=_reduce_meta("argmax"), signatures=_arg_signatures,
       method=True)
def argmax(op, x, dim: Optional[int] = None, keepdim: bool = False):
    """Index of the largest value along ``dim`` (of the flattened tensor if None); the
    first one among ties.

    >>> x.argmax(1); x.argmax()
    """
    return _arg_front("argmax", op, x, dim, keepdim)


@defop(kernel=_arg_kernel("argmin"), meta=_reduce_meta("argmin"), signatures=_arg_signatures,
       method=True)
def argmin(op, x, dim: Optional[int] = None, keepdim: bool = False):
    """Index of the smallest value along ``dim`` (of the flattened tensor if None).

    >>> x.argmin(0, keepdim=True)
    """
    return _arg_front("argmin", op, x, dim, keepdim)


def _max_or_min(name, extreme, arg):
    elementwise = {"max": "maximum", "min": "minimum"}[name]

    def front(x, dim=None, keepdim: bool = False, *, other=None):
        if isinstance(dim, Tensor) or other is not None:  # ct.max(a, b): elementwise
            if other is None:
                other, dim = dim, None
            if dim is not None:
                raise TypeError(f"{name}: give either 'dim' or a tensor 'other', not both")
            return getattr(OPS, elementwise)(x, other)
        if dim is None:
            _check(name, x)
            _check_nonempty(name, x, tuple(range(x.ndim)))
            return extreme(x)
        _check(name, x)
        d = norm_dim(name, dim, x.ndim)
        _check_nonempty(name, x, (d,) if x.ndim else ())
        indices = arg(x, d, keepdim=True)
        values = OPS.gather(x, d, indices)  # the gradient goes to the returned index only
        if not keepdim and x.ndim:
            values, indices = OPS.squeeze(values, d), OPS.squeeze(indices, d)
        return ValuesIndices(values, indices)
    front.__name__ = name
    front.__doc__ = (f"``x.{name}()`` is the {name} of all elements (ties share the "
                     f"gradient, like amax); ``x.{name}(dim, keepdim=False)`` returns "
                     f"``(values, indices)`` like PyTorch, the values gathered at the "
                     f"returned indices (so the gradient goes to that index only); "
                     f"``ct.{name}(a, b)`` (a tensor second) is ``ct.{elementwise}(a, b)``, "
                     f"elementwise with broadcasting.\n\n"
                     f"    >>> values, indices = x.{name}(1); ct.{name}(a, b)")
    return defop(name, method=True)(front)


max_ = _max_or_min("max", amax, argmax)
min_ = _max_or_min("min", amin, argmin)


# ----------------------------------------------------------------------------- any / all
def _logical_signatures(partial):
    """any (P(max)) / all (P(min)) over dims D: S(d in D) -> the partial (OR / AND of the
    local results); a partial input keeps its kind only when it is bool (the max of bools
    is their OR; a max of numbers says nothing about which of them are non-zero)."""
    reduce_rules = _reduce_signatures(partial, None)

    def signatures(layouts, dims, keepdim):
        cands = reduce_rules(layouts, dims, keepdim)
        if layouts[0].dtype == np.dtype(bool):
            cands.append(sig([partial], partial))
        return cands
    return signatures


def _logical_front(opname: str, op, x, dim, keepdim):
    _check(opname, x)
    return op(x, dims=_dims(opname, dim, x.ndim), keepdim=bool(keepdim))


def _logical_meta(layouts, dims, keepdim):
    return [(_out_shape(layouts[0].shape, dims, keepdim), np.dtype(bool))]


@defop(kernel=lambda xp, x, dims, keepdim: xp.any(x, axis=dims, keepdims=keepdim),
       meta=_logical_meta, signatures=_logical_signatures(PMAX), method=True)
def any(op, x, dim=None, keepdim: bool = False):  # noqa: A001 - PyTorch's name
    """Whether any element over ``dim`` (int, tuple or None for all) is non-zero (True for
    bool tensors); a bool tensor. Over an empty selection: False. A split along a reduced
    dim gives a P(max) result (the OR across ranks), reduced when it is read.

    >>> mask.any(); (x > 0).any(1, keepdim=True)
    """
    return _logical_front("any", op, x, dim, keepdim)


@defop(kernel=lambda xp, x, dims, keepdim: xp.all(x, axis=dims, keepdims=keepdim),
       meta=_logical_meta, signatures=_logical_signatures(PMIN), method=True)
def all(op, x, dim=None, keepdim: bool = False):  # noqa: A001 - PyTorch's name
    """Whether every element over ``dim`` (int, tuple or None for all) is non-zero; a bool
    tensor. Over an empty selection: True. A split along a reduced dim gives P(min) (the AND
    across ranks).

    >>> (x == y).all(); mask.all(dim=0)
    """
    return _logical_front("all", op, x, dim, keepdim)


# ----------------------------------------------------------------------------- logsumexp
@defop(method=True)
def logsumexp(x, dim, keepdim: bool = False):
    """``log(sum(exp(x), dim))``, numerically stable (the max over ``dim`` is taken out,
    as PyTorch; rows of -inf give -inf). Written with amax and sum: a split along ``dim``
    moves one max and one sum per row across ranks (like softmax), never the tensor; the
    gradient is the softmax over ``dim``.

    >>> ct.logsumexp(logits, dim=-1); x.logsumexp((0, 1), keepdim=True)
    """
    x = _float_input("logsumexp", x)
    dims = _dims("logsumexp", dim, x.ndim)
    if builtins.any(x.shape[d] == 0 for d in dims):  # log(0): -inf, as PyTorch
        return OPS.log(sum_(OPS.exp(x), dims, keepdim=bool(keepdim)))
    peak = reduced(amax(x, dims, keepdim=True)).detach()
    # an infinite max (a row of -inf, or a +inf) is not taken out: exp(x - inf) is nan
    peak = OPS.where(OPS.isinf(peak), 0.0, peak)
    out = OPS.log(reduced(sum_(OPS.exp(x - peak), dims, keepdim=True))) + peak
    return out if keepdim else OPS.squeeze(out, dims)


# ----------------------------------------------------------------------------- prod
def _prod_kernel(xp, x, dims, keepdim):
    return xp.prod(x, axis=dims, keepdims=keepdim, dtype=_acc_dtype(x.dtype))


def _others_product(xp, x, dims: tuple):
    """For every element, the product of the *other* elements of its reduced slice, from
    exclusive prefix and suffix products (no division, so zeros are exact)."""
    rest = [d for d in range(x.ndim) if d not in dims]
    order = rest + list(dims)
    moved = xp.transpose(x, order)
    size = int(np.prod([x.shape[d] for d in dims], dtype=np.int64))
    if size == 0:
        return xp.zeros(x.shape, dtype=x.dtype)
    flat = moved.reshape(moved.shape[:len(rest)] + (size,))
    one = xp.ones(flat.shape[:-1] + (1,), dtype=x.dtype)
    before = xp.cumprod(xp.concatenate([one, flat[..., :-1]], axis=-1), axis=-1)
    after = xp.flip(xp.cumprod(xp.flip(xp.concatenate([flat[..., 1:], one], axis=-1),
                                       axis=-1), axis=-1), axis=-1)
    others = (before * after).reshape(moved.shape)
    inverse = [0] * x.ndim
    for j, d in enumerate(order):
        inverse[d] = j
    return xp.transpose(others, inverse)


def _prod_grad_kernel(xp, g, x, dims, keepdim):
    if not keepdim and dims:
        g = xp.expand_dims(g, dims)
    return g * _others_product(xp, x, dims)


def _prod_grad_signatures(layouts, dims, keepdim):
    g, x = layouts
    cands = [sig([B, B], B)]
    cands += [sig([S(_shift(e, dims, keepdim)), S(e)], S(e))
              for e in range(x.ndim) if e not in dims]
    return cands + [sig([P, B], P)]  # linear in the incoming gradient


@defop(kernel=_prod_kernel, meta=_reduce_meta("prod"), signatures=_reduce_signatures(None, None),
       backward=lambda ctx, g: (ctx.op.grads["grad"](g, ctx.inputs[0], **ctx.attrs),),
       method=True)
def prod(op, x, dim=None, keepdim: bool = False, *, dtype=None):
    """Product over ``dim`` (an int, a tuple, or None for all dims); bool and integer
    tensors multiply in int64; the product of an empty selection is 1.

    A split along a reduced dim is gathered first (there is no partial-product SBP); splits
    of other dims stay local. The gradient of each element is the product of the others,
    from exclusive prefix and suffix products (``prod.grad``), exact with zeros present.

    >>> x.prod(1); ct.prod(x); x.prod(dtype=ct.float64)
    """
    _check("prod", x)
    if dtype is None:
        return op(x, dims=_dims("prod", dim, x.ndim), keepdim=bool(keepdim))
    return in_dtype(op, "prod", x, dtype, dims=_dims("prod", dim, x.ndim),
                     keepdim=bool(keepdim))


prod.op.grad_kernel(
    "grad", _prod_grad_kernel, signatures=_prod_grad_signatures,
    meta=lambda layouts, dims, keepdim: [(tuple(layouts[1].shape), layouts[0].dtype)])


# ----------------------------------------------------------------------------- var / std / norm
def _float_input(opname: str, x):
    """``x`` itself, checked to be a real floating tensor (``TypeError`` otherwise)."""
    _check(opname, x)
    if x.dtype.kind == "c":
        raise TypeError(f"{opname}: complex tensors are not supported, got {x.dtype}")
    _floating_only(opname, x)
    return x


def _variance(opname: str, x, dim, correction, keepdim, unbiased):
    x = _float_input(opname, x)
    dims = _dims(opname, dim, x.ndim)
    if unbiased is not None:  # PyTorch's older spelling: unbiased=False is correction=0
        if correction != 1:
            raise TypeError(f"{opname}: give 'correction' or 'unbiased', not both")
        correction = 1 if unbiased else 0
    if isinstance(correction, bool) or not isinstance(correction, (int, float, np.number)):
        raise TypeError(f"{opname}: argument 'correction' must be a number, got "
                        f"{correction!r}")
    count = int(np.prod([x.shape[d] for d in dims], dtype=np.int64))
    # the mean is made whole (an all-reduce of one value per row when dims are split)
    # before it meets x, so a split x stays split and the sum below is a partial sum
    centred = x - reduced(mean(x, dims, keepdim=True))
    squares = sum_(centred * centred, dims, keepdim=bool(keepdim))
    return squares / max(count - correction, 0)


@defop(method=True)
def var(x, dim=None, *, correction=1, keepdim: bool = False,
        unbiased: Optional[bool] = None):
    """Variance over ``dim`` (int, tuple or None for all), ``sum((x - mean)^2) / (N -
    correction)``; ``correction=1`` (the default) is PyTorch's unbiased estimate, 0 the
    population variance (``unbiased=False``, PyTorch's older spelling, is correction 0).
    Bool and integer tensors raise ``TypeError`` (as in PyTorch).

    Written with mean and sum: a split along a reduced dim moves only row statistics (one
    all-reduce for the mean, a partial sum for the squares), never the tensor.

    >>> x.var(); x.var(1, keepdim=True); ct.var(x, (0, 1), correction=0)
    """
    return _variance("var", x, dim, correction, keepdim, unbiased)


@defop(method=True)
def std(x, dim=None, *, correction=1, keepdim: bool = False,
        unbiased: Optional[bool] = None):
    """Standard deviation, ``sqrt(var(x, dim, correction=correction))``.

    >>> x.std(0)
    """
    return OPS.sqrt(_variance("std", x, dim, correction, keepdim, unbiased))


@defop(method=True)
def norm(x, p=2, dim=None, keepdim: bool = False):
    """Vector ``p``-norm over ``dim`` (int, tuple, or None for all dims: with ``p=2`` the
    Frobenius norm): ``p=2`` (default, also ``"fro"``) ``sqrt(sum(x^2))``, ``1`` sum of
    absolute values, ``inf`` / ``-inf`` largest / smallest absolute value, ``0`` the count
    of non-zeros (no gradient), other floats ``sum(|x|^p)^(1/p)``. Written with sum / amax,
    so a split along a reduced dim gives partial sums, never a gather.

    >>> x.norm(); x.norm(1, dim=-1); ct.norm(x, float("inf"), dim=(0, 1))
    """
    x = _float_input("norm", x)
    if p == "fro":
        p = 2
    if isinstance(p, bool) or not isinstance(p, (int, float, np.number)):
        raise ValueError(f"norm: argument 'p' is {p!r}; accepted: a number (2, 1, inf, "
                         f"-inf, 0 or any float) or 'fro'")
    p = float(p)
    dims = _dims("norm", dim, x.ndim)
    keepdim = bool(keepdim)
    if p == 2:
        return OPS.sqrt(sum_(x * x, dims, keepdim))
    if p == math.inf:
        return amax(OPS.abs(x), dims, keepdim)
    if p == -math.inf:
        return amin(OPS.abs(x), dims, keepdim)
    if p == 0:
        return OPS.to(sum_(x != 0, dims, keepdim), x.dtype)
    if p == 1:
        return sum_(OPS.abs(x), dims, keepdim)
    return sum_(OPS.abs(x) ** p, dims, keepdim) ** (1.0 / p)
