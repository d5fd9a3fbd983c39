"""In-place updates with PyTorch's semantics: ``x.add_(y)``, ``x -= y``, ``fill_``, ``copy_``...

``x.op_(y)`` computes ``op(x, y)`` like the out-of-place op (any layouts, broadcasting, the
same signature choice), boxes the result to ``x``'s own placement and SBP, casts it to
``x``'s dtype and writes it into ``x``'s shards, on every rank. Rules, as in PyTorch:

* a leaf that requires grad cannot be updated in place while grad mode is on (wrap
  optimizer-like updates in ``ct.no_grad()``); a non-leaf can, and its gradient then flows
  through the in-place op;
* the result must have ``x``'s shape (``y`` broadcasts to ``x``, never ``x`` to ``y``) and a
  dtype that can be cast to ``x``'s without changing kind (``int_tensor += 0.5`` is an
  error);
* a tensor saved for a backward and modified afterwards makes that backward raise (every
  tensor counts its in-place writes; tensors sharing shards share the count).

Shards a tensor shares read-only (cached constants, boxed copies) are copied before the
write, so no other tensor changes.
"""
from __future__ import annotations

import numpy as np

from .. import autograd, executor
from ..dispatch import as_tensor
from ..registry import OPS
from ..tensor import Tensor
from ._rules import defop

__all__ = ["add_", "sub_", "mul_", "div_", "pow_", "clamp_", "neg_", "fill_", "zero_", "copy_",
           "masked_fill_", "index_add_", "index_copy_", "index_fill_", "scatter_",
           "scatter_add_", "exp_"]

_KIND_ORDER = "biufc"


def _check_target(opname: str, x) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{opname}: expected a ct.Tensor to update, got {type(x).__name__}")
    if x.requires_grad and x.is_leaf and autograd.is_grad_enabled():
        raise RuntimeError(f"{opname}: a leaf tensor that requires grad cannot be modified in "
                           f"place while grad mode is on (its gradient would be lost); wrap "
                           f"the update in `with ct.no_grad():`, or update x.detach()")


def write(opname: str, x: Tensor, result: Tensor) -> Tensor:
    """Make ``result`` (a value of ``x``'s shape) the contents of ``x``, in place."""
    if tuple(result.shape) != tuple(x.shape):
        raise ValueError(f"{opname}: the result has shape {tuple(result.shape)} but the tensor "
                         f"updated in place has shape {tuple(x.shape)}; the other operand must "
                         f"broadcast to {tuple(x.shape)}")
    if _KIND_ORDER.index(result.dtype.kind) > _KIND_ORDER.index(x.dtype.kind):
        raise TypeError(f"{opname}: the result has dtype {result.dtype}, which cannot be cast "
                        f"to the updated tensor's dtype {x.dtype} in place; convert the tensor "
                        f"first (x = x.to({result.dtype.name}))")
    tracked = autograd.is_grad_enabled() and result.requires_grad
    with autograd.no_grad():
        # cast first, then box: the boxing is the last step, so the value has x's layout
        # exactly (a cast may choose another layout, e.g. of a P(max) value)
        value = OPS.to(result, x.dtype) if result.dtype != x.dtype else result
        value = OPS.to_global(value, x.placement, x.sbp)
    executor.write_into(x, value)
    x._version.value += 1
    if tracked:  # the gradient of x now flows through the in-place op
        x._node, x._out_index = result._node, result._out_index
        x.requires_grad = True
    elif autograd.is_grad_enabled() and x._node is not None:
        x._node, x.requires_grad = None, False  # its value no longer depends on the graph
    return x


def _earlier(x: Tensor) -> Tensor:
    """A copy of ``x`` in ``x``'s place in the graph, for an in-place op that autograd
    records: the op computes from the copy, so its backward reads the values from before
    the write whatever it saved (boxing may save views of its input)."""
    alias = Tensor(x._layout, executor.copied_shards(x), requires_grad=x.requires_grad)
    alias._node, alias._out_index = x._node, x._out_index
    return alias


def update(opname: str, x, compute, operands=None) -> Tensor:
    """``x = compute(x)`` in place (``compute`` runs ops on what it is given). ``operands``:
    the other values ``compute`` reads, when known; if neither they nor ``x`` require grad
    nothing is recorded, so no copy of ``x`` is made for a backward."""
    _check_target(opname, x)
    if not autograd.is_grad_enabled() or operands is not None and not x.requires_grad and \
            not any(isinstance(o, Tensor) and o.requires_grad for o in operands):
        return write(opname, x, compute(x))
    return write(opname, x, compute(_earlier(x)))


def _binary(name: str, out_of_place: str):
    fn = getattr(OPS, out_of_place)

    def front(x, other):
        return update(name, x, lambda t: fn(t, other), (other,))
    front.__name__ = name
    front.__doc__ = (f"``x.{name}(other)``: ``x = x {out_of_place} other`` in place (returns "
                     f"``x``). See :mod:`ctensor.ops.inplace` for the rules.")
    return defop(name, method=True)(front)


add_ = _binary("add_", "add")
sub_ = _binary("sub_", "sub")
mul_ = _binary("mul_", "mul")
div_ = _binary("div_", "div")
pow_ = _binary("pow_", "pow")


@defop(method=True)
def clamp_(x, min=None, max=None):  # noqa: A002 - PyTorch's names
    """Limit ``x``'s values to ``[min, max]`` in place."""
    return update("clamp_", x, lambda t: OPS.clamp(t, min, max), (min, max))


@defop(method=True)
def neg_(x):
    """Negate ``x`` in place."""
    return update("neg_", x, OPS.neg, ())


@defop(method=True)
def exp_(x):
    """``x = exp(x)`` in place (PyTorch's ``exp_``; the exponential *distribution* is
    ``exponential_``)."""
    return update("exp_", x, OPS.exp)


@defop(method=True)
def fill_(x, value):
    """Set every element of ``x`` to ``value`` (a number or a one-element tensor)."""
    _check_target("fill_", x)
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"fill_: argument 'value' must be a number or a one-element "
                             f"tensor, got a tensor of shape {tuple(value.shape)}")
        source = OPS.reshape(value, ()) if value.ndim else value
    elif isinstance(value, (bool, int, float, complex, np.number, np.bool_)):
        source = as_tensor([x, value], "fill_")[1]
    else:
        raise TypeError(f"fill_: argument 'value' must be a number or a one-element tensor, "
                        f"got {type(value).__name__}")
    return write("fill_", x, OPS.expand(OPS.to(source, x.dtype), *x.shape))


@defop(method=True)
def zero_(x):
    """Fill ``x`` with zeros in place (returns ``x``)."""
    return fill_(x, 0)


@defop(method=True)
def copy_(dst: Tensor, src) -> Tensor:
    """Overwrite ``dst``'s values in place with ``src`` (any layout: boxed to ``dst``'s;
    cast to its dtype; a 0-d or broadcastable ``src`` fills it). Optimizers and
    ``load_state_dict`` use it so that parameters keep their identity."""
    _check_target("copy_", dst)
    if not isinstance(src, Tensor):
        src = as_tensor([dst, src], "copy_")[1]
    if tuple(src.shape) != tuple(dst.shape):
        try:
            fits = np.broadcast_shapes(tuple(src.shape), tuple(dst.shape)) == tuple(dst.shape)
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f"copy_: source shape {tuple(src.shape)} does not match "
                             f"destination shape {tuple(dst.shape)}")
        src = OPS.expand(src, *dst.shape)
    if src.dtype.kind != dst.dtype.kind:  # copy_ casts across kinds, like PyTorch
        src = OPS.to(src, dst.dtype)
    return write("copy_", dst, src)


# ----------------------------------------------------------------------------- indexed writes
@defop(method=True)
def masked_fill_(x, mask, value):
    """``value`` where the bool ``mask`` (broadcastable to ``x``) is True, in place.

    >>> scores.masked_fill_(~keep, float("-inf"))
    """
    return update("masked_fill_", x, lambda t: OPS.masked_fill(t, mask, value), (value,))


@defop(method=True)
def index_add_(x, dim: int, index, source, *, alpha=1):
    """:func:`ct.index_add` in place (returns ``x``).

    >>> out.index_add_(0, token_ids, expert_out)
    """
    return update("index_add_", x, lambda t: OPS.index_add(t, dim, index, source, alpha=alpha),
                  (source,))


@defop(method=True)
def index_copy_(x, dim: int, index, source):
    """:func:`ct.index_copy` in place (returns ``x``).

    >>> cache.index_copy_(1, positions, new_keys)
    """
    return update("index_copy_", x, lambda t: OPS.index_copy(t, dim, index, source), (source,))


@defop(method=True)
def index_fill_(x, dim: int, index, value):
    """:func:`ct.index_fill` in place (returns ``x``).

    >>> x.index_fill_(1, [0, 2], 0.0)
    """
    return update("index_fill_", x, lambda t: OPS.index_fill(t, dim, index, value), (value,))


@defop(method=True)
def scatter_(x, dim: int, index, src=None, *, value=None, reduce=None):
    """:func:`ct.scatter` in place (returns ``x``).

    >>> one_hot.scatter_(1, labels[:, None], 1.0)
    """
    return update("scatter_", x, lambda t: OPS.scatter(t, dim, index, src, value=value,
                                                       reduce=reduce), (src,))


@defop(method=True)
def scatter_add_(x, dim: int, index, src):
    """:func:`ct.scatter_add` in place (returns ``x``).

    >>> counts.scatter_add_(0, labels, ones)
    """
    return update("scatter_add_", x, lambda t: OPS.scatter_add(t, dim, index, src), (src,))


@defop(method=True)
def scatter_reduce_(x, dim: int, index, src, reduce: str, *, include_self: bool = True):
    """:func:`ct.scatter_reduce` in place (returns ``x``).

    >>> best.scatter_reduce_(0, labels, scores, "amax")
    """
    return update("scatter_reduce_", x, lambda t: OPS.scatter_reduce(
        t, dim, index, src, reduce, include_self=include_self), (src,))
