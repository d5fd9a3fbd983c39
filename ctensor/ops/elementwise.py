"""Elementwise ops with broadcasting and dtype promotion.

Signatures (1-D, per mesh axis): B..->B; S(d)..->S(d) for every output dim d, inputs that
broadcast along d staying B; and partial rules where the op is linear in its partial inputs:

* ``add/sub``: P,P -> P (sum_r (x_r + y_r) = X + Y). ``P + scalar`` boxes the scalar B -> P
  (value on index 0, zeros elsewhere) for free, so it computes X + c, never X + N*c.
* ``mul``: P,B -> P and B,P -> P; ``div``: P,B -> P (linear in the numerator).
* ``neg``: P -> P; ``where(c, x, y)``: B,P,P -> P.
* everything non-linear (exp, comparisons, ...) has no P rule, so a partial input is
  reduced first (boxing picks reduce-scatter over all-reduce when it moves less).

Backwards are written in ctensor ops; gradients of broadcast inputs are summed back to the
input's shape by :func:`sum_to`.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..arrays import is_host
from ..dispatch import as_tensor
from ..registry import OPS
from ..runtime import get_default_dtype
from ._rules import B, P, broadcast_shapes, defop, elementwise_signatures, result_dtype


# ----------------------------------------------------------------------------- helpers
def sum_to(g, shape: tuple):
    """Sum ``g`` over the dims along which an input of ``shape`` was broadcast."""
    if g is None or tuple(g.shape) == tuple(shape):
        return g
    lead = g.ndim - len(shape)
    ones = tuple(i + lead for i, n in enumerate(shape) if n == 1 and g.shape[i + lead] != 1)
    if ones:
        g = OPS.sum(g, dim=ones, keepdim=True)
    if lead:
        g = OPS.sum(g, dim=tuple(range(lead)))
    return g


def float_dtype(dtype: np.dtype) -> np.dtype:
    """``dtype`` if it is floating or complex, else the default float dtype."""
    return dtype if dtype.kind in "fc" else get_default_dtype()


def _out_dtype(kind: str, dtype: np.dtype) -> np.dtype:
    if kind == "bool":
        return np.dtype(bool)
    if kind == "float":
        return float_dtype(dtype)
    return dtype


def _binary(name: str, kernel: Callable, backward, partial=(), kind: str = "same",
            method: bool = True, doc: str = "", saves=None):
    """Declare the broadcasting binary op ``name``; ``kind`` is the output dtype rule
    ("same": promoted, "float": promoted then floating, "bool")."""
    def meta(layouts):
        shape = broadcast_shapes(name, *(l.shape for l in layouts))
        return [(shape, _out_dtype(kind, result_dtype(name, [l.dtype for l in layouts])))]

    def signatures(layouts):
        shape = broadcast_shapes(name, *(l.shape for l in layouts))
        return elementwise_signatures(layouts, shape, partial)

    def front(op, a, b):
        return op(a, b)
    front.__name__ = name
    front.__doc__ = doc or f"Elementwise ``{name}`` with broadcasting (``ct.{name}(a, b)``)."
    return defop(name, kernel=kernel, meta=meta, signatures=signatures, backward=backward,
                 method=method, saves=saves, forwards=True)(front)


def _unary(name: str, kernel: Callable, backward, partial: bool = False, kind: str = "same",
           method: bool = True, doc: str = "", saves=None):
    """Declare the unary op ``name`` (``partial``: linear, so P -> P holds)."""
    def meta(layouts):
        return [(layouts[0].shape, _out_dtype(kind, layouts[0].dtype))]

    def signatures(layouts):
        return elementwise_signatures(layouts, layouts[0].shape, [(P,)] if partial else ())

    def front(op, x):
        return op(x)
    front.__name__ = name
    front.__doc__ = doc or f"Elementwise ``{name}`` (``x.{name}()`` or ``ct.{name}(x)``)."
    return defop(name, kernel=kernel, meta=meta, signatures=signatures, backward=backward,
                 method=method, saves=saves, forwards=True)(front)


# ----------------------------------------------------------------------------- arithmetic
# each backward computes only the gradients an input needs (``ctx.needs_grad``): a constant
# operand's (a loss's count of targets, a power's exponent) would cost ops and, on a partial
# or split operand, a collective for nothing
def _add_bw(ctx, g):
    a, b = ctx.inputs
    return (sum_to(g, a.shape) if ctx.needs_grad(0) else None,
            sum_to(g, b.shape) if ctx.needs_grad(1) else None)


def _sub_bw(ctx, g):
    a, b = ctx.inputs
    return (sum_to(g, a.shape) if ctx.needs_grad(0) else None,
            sum_to(-g, b.shape) if ctx.needs_grad(1) else None)


def _mul_bw(ctx, g):
    a, b = ctx.inputs  # (only the operands a needed gradient reads are kept: see mul)
    return (sum_to(g * b, a.shape) if ctx.needs_grad(0) else None,
            sum_to(g * a, b.shape) if ctx.needs_grad(1) else None)


def _div_bw(ctx, g):
    a, b = ctx.inputs
    return (sum_to(g / b, a.shape) if ctx.needs_grad(0) else None,
            sum_to(-(g * ctx.outputs[0]) / b, b.shape) if ctx.needs_grad(1) else None)


def _pow_bw(ctx, g):
    a, b = ctx.inputs
    ga = sum_to(g * b * a ** (b - 1), a.shape) if ctx.needs_grad(0) else None
    gb = None
    if b.dtype.kind in "fc" and ctx.needs_grad(1):
        gb = sum_to(g * ctx.outputs[0] * OPS.log(OPS.where(a > 0, a, 1.0)), b.shape)
    return ga, gb


def _select_bw(beats: Callable):
    """Backward of maximum/minimum (PyTorch's rule): each input's gradient is ``g`` except
    where the other one beats it (0) or ties with it (``g / 2``); clamp, written with where,
    passes it whole at its bounds."""
    def backward(ctx, g):
        a, b = ctx.inputs
        split = OPS.where(a == b, g * 0.5, g)
        return (sum_to(OPS.where(beats(b, a), 0.0, split), a.shape),
                sum_to(OPS.where(beats(a, b), 0.0, split), b.shape))
    return backward


add = _binary("add", lambda xp, a, b: xp.add(a, b), _add_bw, partial=[(P, P)],
              saves=())
sub = _binary("sub", lambda xp, a, b: xp.subtract(a, b), _sub_bw, partial=[(P, P)],
              saves=())
# d(a b)/da reads b and d(a b)/db reads a: keep only what a needed gradient reads (a
# dropout's or a scale's constant factor needs none, so the product's other operand is freed)
mul = _binary("mul", lambda xp, a, b: xp.multiply(a, b), _mul_bw, partial=[(P, B), (B, P)],
              saves=lambda grads, layouts: ((1,) if grads & 1 else ()) +
              ((0,) if grads & 2 else ()))
div = _binary("div", lambda xp, a, b: xp.true_divide(a, b), _div_bw, partial=[(P, B)],
              kind="float")
def _pow_kernel(xp, a, b):
    """``a ** b``; on the host a floating ``a`` to the scalar power 2 (``x.pow(2)`` of an
    RMSNorm, a variance) is ``a * a`` and to the power 1 (that power's gradient) a copy:
    NumPy's ``power`` is a generic per-element pow, 2-3x slower. The same bits: a square is
    one correctly rounded product either way (exact in the wider type float16 computes in)."""
    if xp is np and b.ndim == 0 and b.dtype == a.dtype and a.dtype.kind == "f":
        e = b.item()
        if e == 2.0:
            return np.multiply(a, a)
        if e == 1.0:
            return np.positive(a)
    return xp.power(a, b)


pow = _binary("pow", _pow_kernel, _pow_bw)  # noqa: A001
maximum = _binary("maximum", lambda xp, a, b: xp.maximum(a, b),
                  _select_bw(lambda a, b: a > b))
minimum = _binary("minimum", lambda xp, a, b: xp.minimum(a, b),
                  _select_bw(lambda a, b: a < b))

for _name, _fn in [("eq", "equal"), ("ne", "not_equal"), ("lt", "less"),
                   ("le", "less_equal"), ("gt", "greater"), ("ge", "greater_equal"),
                   ("logical_and", "logical_and"), ("logical_or", "logical_or")]:
    _binary(_name, (lambda f: lambda xp, a, b: getattr(xp, f)(a, b))(_fn), None, kind="bool")
_unary("logical_not", lambda xp, x: xp.logical_not(x), None, kind="bool")


# ----------------------------------------------------------------------------- unary maths
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _erf(xp, x):
    if xp is np:
        return np.vectorize(math.erf, otypes=[x.dtype])(x) if x.size else x.copy()
    from cupyx.scipy.special import erf  # CuPy ships it
    return erf(x)


neg = _unary("neg", lambda xp, x: xp.negative(x), lambda ctx, g: (-g,), partial=True,
             saves=())
abs = _unary("abs", lambda xp, x: xp.abs(x),  # noqa: A001
             lambda ctx, g: (g * OPS.sign(ctx.inputs[0]),))
sign = _unary("sign", lambda xp, x: xp.sign(x), lambda ctx, g: (g * 0.0,))
# exp, sqrt, rsqrt, tanh and sigmoid differentiate through their output alone: the input is
# not kept, so changing it in place after use is no error (PyTorch's rule)
_OUT = ("outputs",)
exp = _unary("exp", lambda xp, x: xp.exp(x), lambda ctx, g: (g * ctx.outputs[0],),
             kind="float", saves=_OUT)
log = _unary("log", lambda xp, x: xp.log(x), lambda ctx, g: (g / ctx.inputs[0],), kind="float")
sqrt = _unary("sqrt", lambda xp, x: xp.sqrt(x), lambda ctx, g: (g * 0.5 / ctx.outputs[0],),
              kind="float", saves=_OUT)
rsqrt = _unary("rsqrt", lambda xp, x: 1.0 / xp.sqrt(x),
               lambda ctx, g: (g * -0.5 * ctx.outputs[0] ** 3,), kind="float", saves=_OUT)
tanh = _unary("tanh", lambda xp, x: xp.tanh(x),
              lambda ctx, g: (g * (1.0 - ctx.outputs[0] * ctx.outputs[0]),), kind="float",
              saves=_OUT)
sigmoid = _unary("sigmoid", lambda xp, x: 0.5 * (xp.tanh(0.5 * x) + 1.0),
                 lambda ctx, g: (g * ctx.outputs[0] * (1.0 - ctx.outputs[0]),), kind="float",
                 saves=_OUT)
relu = _unary("relu", lambda xp, x: xp.maximum(x, 0).astype(x.dtype, copy=False),
              lambda ctx, g: (OPS.where(ctx.inputs[0] > 0, g, 0.0),))
square = _unary("square", lambda xp, x: x * x, lambda ctx, g: (2.0 * g * ctx.inputs[0],))
sin = _unary("sin", lambda xp, x: xp.sin(x), lambda ctx, g: (g * OPS.cos(ctx.inputs[0]),),
             kind="float")
cos = _unary("cos", lambda xp, x: xp.cos(x), lambda ctx, g: (-g * OPS.sin(ctx.inputs[0]),),
             kind="float")


_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
erf = _unary("erf", _erf, lambda ctx, g: (g * _TWO_OVER_SQRT_PI *
                                          OPS.exp(-ctx.inputs[0] * ctx.inputs[0]),),
             kind="float", doc="The error function ``2/sqrt(pi) * integral_0^x exp(-t^2) dt``"
                               " (``x.erf()`` or ``ct.erf(x)``).")
isnan = _unary("isnan", lambda xp, x: xp.isnan(x), None, kind="bool")
isinf = _unary("isinf", lambda xp, x: xp.isinf(x), None, kind="bool")
isfinite = _unary("isfinite", lambda xp, x: xp.isfinite(x), None, kind="bool")


# ----------------------------------------------------------------------------- rounding
def _rounding(fn: str):
    """The kernel of floor / ceil / trunc: integers come back as they are (a copy)."""
    def kernel(xp, x):
        return x.copy() if x.dtype.kind in "biu" else getattr(xp, fn)(x)
    return kernel


def _zero_grad(ctx, g):
    """Piecewise-constant ops: the gradient is zero (PyTorch's rule for floor, round...)."""
    return (OPS.zeros_like(g),)


floor = _unary("floor", _rounding("floor"), _zero_grad, saves=(),
               doc="The largest integer <= ``x``, elementwise; integer tensors unchanged "
                   "(``x.floor()``). The gradient is zero.")
ceil = _unary("ceil", _rounding("ceil"), _zero_grad, saves=(),
              doc="The smallest integer >= ``x``, elementwise (``x.ceil()``); zero gradient.")
trunc = _unary("trunc", _rounding("trunc"), _zero_grad, saves=(),
               doc="``x`` rounded towards zero, elementwise (``x.trunc()``); zero gradient.")


def _round_kernel(xp, x, decimals):
    if x.dtype.kind in "biu":
        return x.copy() if decimals >= 0 else \
            (xp.round(x.astype(np.float64), decimals)).astype(x.dtype)
    return xp.round(x, decimals)


@defop(kernel=_round_kernel, meta=lambda layouts, decimals: [(layouts[0].shape,
                                                              layouts[0].dtype)],
       signatures=lambda layouts, decimals: elementwise_signatures(layouts, layouts[0].shape),
       backward=_zero_grad, saves=(), method=True)
def round(op, x, decimals: int = 0):  # noqa: A001 - PyTorch's name
    """``x`` rounded to ``decimals`` decimal places, halves to even (PyTorch's and NumPy's
    rule: ``round(2.5) == 2``, ``round(-0.5) == -0``); a negative ``decimals`` rounds to
    tens, hundreds, ... The gradient is zero.

    >>> x.round(); ct.round(x, decimals=2)
    """
    (x,) = as_tensor([x], "round")
    if isinstance(decimals, bool) or not isinstance(decimals, (int, np.integer)):
        raise TypeError(f"round: argument 'decimals' must be an int, got {decimals!r}")
    return op(x, decimals=int(decimals))


def _nan_to_num_kernel(xp, x, nan, posinf, neginf):
    if x.dtype.kind not in "fc":
        return x.copy()
    return xp.nan_to_num(x, nan=nan, posinf=posinf, neginf=neginf)


@defop(kernel=_nan_to_num_kernel, meta=lambda layouts, **_: [(layouts[0].shape,
                                                              layouts[0].dtype)],
       signatures=lambda layouts, **_: elementwise_signatures(layouts, layouts[0].shape),
       backward=lambda ctx, g: (OPS.where(isfinite(ctx.inputs[0]), g, 0.0),), method=True)
def nan_to_num(op, x, nan: float = 0.0, posinf: float = None, neginf: float = None):
    """``x`` with NaN replaced by ``nan``, +inf by ``posinf`` and -inf by ``neginf`` (by
    default the dtype's largest and smallest finite values, as PyTorch). The gradient
    passes where ``x`` is finite and is zero elsewhere.

    >>> ct.nan_to_num(x, nan=0.0, posinf=1e4)
    """
    (x,) = as_tensor([x], "nan_to_num")
    for arg, v in (("nan", nan), ("posinf", posinf), ("neginf", neginf)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float,
                                                                        np.number))):
            raise TypeError(f"nan_to_num: argument '{arg}' must be a number or None, got "
                            f"{v!r}")
    return op(x, nan=float(nan), posinf=None if posinf is None else float(posinf),
              neginf=None if neginf is None else float(neginf))


# ----------------------------------------------------------------------------- division
def _quotient_bw(rounding: str):
    """Backward of remainder (``a - floor(a/b) b``) and fmod (``a - trunc(a/b) b``):
    ``d/da = 1``, ``d/db = -rounded(a/b)`` (PyTorch's rule, zero-measure jumps aside)."""
    def backward(ctx, g):
        a, b = ctx.inputs
        gb = None
        if ctx.needs_grad(1):
            gb = sum_to(-g * getattr(OPS, rounding)(a / b), b.shape)
        return sum_to(g, a.shape), gb
    return backward


remainder = _binary("remainder", lambda xp, a, b: xp.remainder(a, b), _quotient_bw("floor"),
                    doc="``a - floor(a / b) * b`` elementwise, the sign of ``b`` (Python's "
                        "``%``, ``a % b``, PyTorch's ``remainder``); broadcasting.")
fmod = _binary("fmod", lambda xp, a, b: xp.fmod(a, b), _quotient_bw("trunc"),
               doc="``a - trunc(a / b) * b`` elementwise, the sign of ``a`` (C's ``fmod``, "
                   "PyTorch's ``fmod``); broadcasting.")
floor_divide = _binary("floor_divide", lambda xp, a, b: xp.floor_divide(a, b), None,
                       doc="``floor(a / b)`` elementwise (``a // b``; PyTorch rounds down "
                           "since 1.13); broadcasting. Not differentiable, as in PyTorch.")


# ----------------------------------------------------------------------------- gelu
def _floating(x):
    """``x`` itself when floating, else as float64 (the kernels below work in place)."""
    return x if x.dtype.kind == "f" else x.astype(np.float64)


def _tanh_inner(x):
    """``sqrt(2/pi) * (x + 0.044715 x^3)`` as ``sqrt(2/pi) * x * (1 + 0.044715 x^2)``, in
    one new buffer (the GELU runs at memory speed: every temporary is a pass over it)."""
    inner = x * x
    inner *= 0.044715
    inner += 1.0
    inner *= x
    inner *= _SQRT_2_OVER_PI
    return inner


def _gelu_kernel(xp, x, approximate="none"):
    if approximate == "tanh":
        x = _floating(x)
        y = _tanh_inner(x)
        xp.tanh(y, out=y)
        y += 1.0
        y *= x
        y *= 0.5
        return y
    return 0.5 * x * (1.0 + _erf(xp, x / math.sqrt(2.0)))


def _gelu_grad_kernel(xp, g, x, approximate="none"):
    if approximate == "tanh":
        # g * (0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)), t = tanh(inner)
        x = _floating(x)
        t = _tanh_inner(x)
        xp.tanh(t, out=t)
        d_inner = x * x
        d_inner *= 3 * 0.044715
        d_inner += 1.0
        d_inner *= _SQRT_2_OVER_PI
        slope = t * t
        slope -= 1.0
        slope *= -0.5
        slope *= x
        slope *= d_inner
        t += 1.0
        t *= 0.5
        t += slope
        t *= g
        return t
    cdf = 0.5 * (1.0 + _erf(xp, x / math.sqrt(2.0)))
    pdf = xp.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    return g * (cdf + x * pdf)


def _gelu_meta(layouts, **_):
    return [(layouts[-1].shape, float_dtype(layouts[-1].dtype))]


def _same_shape_signatures(layouts, **_):
    return elementwise_signatures(layouts, layouts[0].shape)


@defop(kernel=_gelu_kernel, meta=_gelu_meta, signatures=_same_shape_signatures,
       backward=lambda ctx, g: (ctx.op.grads["grad"](g, ctx.inputs[0], **ctx.attrs),))
def gelu(op, x, approximate: str = "none"):
    """GELU: ``x * Phi(x)`` (``approximate="tanh"`` for the GPT-2 tanh form)."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: argument 'approximate' must be 'none' or 'tanh', got "
                         f"{approximate!r}")
    return op(x, approximate=approximate)


gelu.op.grad_kernel("grad", _gelu_grad_kernel, meta=_gelu_meta,
                    signatures=_same_shape_signatures)


# ----------------------------------------------------------------------------- selection
def _where_meta(layouts):
    c, x, y = layouts
    if c.dtype != np.dtype(bool):
        raise TypeError(f"where: argument 'condition' must be a bool tensor, got {c.dtype}")
    return [(broadcast_shapes("where", c.shape, x.shape, y.shape),
             result_dtype("where", [x.dtype, y.dtype]))]


def _where_signatures(layouts):
    shape = broadcast_shapes("where", *(l.shape for l in layouts))
    return elementwise_signatures(layouts, shape, [(B, P, P)])


def _where_bw(ctx, g):
    c, x, y = ctx.inputs
    return None, sum_to(OPS.where(c, g, 0.0), x.shape), sum_to(OPS.where(c, 0.0, g), y.shape)


def _is_zero(a) -> bool:
    return getattr(a, "ndim", None) == 0 and a.dtype.kind == "f" and not a


def _where_kernel(xp, c, x, y):
    """``xp.where``, but a choice against a zero scalar (relu's backward, every masked
    gradient) as a product with the mask: ``where`` branches per element and takes ~15x a
    multiply (1.9 ms vs 0.12 ms for 256x2048 float32). ``x * c + 0.0`` is ``x`` where ``c``
    and ``+0.0`` elsewhere (adding zero turns ``-0.0`` into ``+0.0``) whenever ``x`` is
    finite; an infinite or NaN value would turn into NaN where ``c`` is False, so then
    ``where`` itself runs. On a device ``where`` runs at once: deciding the fast path
    would read the constant and ``isfinite(out).all()`` on the host (a synchronisation per
    call), and a GPU's ``where`` costs about a multiply."""
    if is_host(c) and c.dtype == np.bool_ and (_is_zero(y) or _is_zero(x)):
        keep, mask = (x, c) if _is_zero(y) else (y, ~c)
        if keep.dtype.kind == "f" and keep.shape == np.broadcast_shapes(keep.shape, c.shape):
            out = xp.multiply(keep, mask)
            out += 0.0
            if xp.isfinite(out).all():
                return out
    return xp.where(c, x, y)


@defop(kernel=_where_kernel, meta=_where_meta, saves=(0,),
       signatures=_where_signatures, backward=_where_bw)
def where(op, condition, x=None, y=None):
    """``x`` where ``condition`` holds, else ``y`` (broadcasting; scalars allowed); with
    ``condition`` alone, ``nonzero(condition, as_tuple=True)`` (PyTorch's one-argument form).
    """
    if x is None and y is None:
        return OPS.nonzero(condition, as_tuple=True)
    return op(condition, x, y)


@defop(method=True)
def masked_fill(x, mask, value):
    """``x`` with ``value`` where the bool ``mask`` (broadcastable to ``x``) is True."""
    x_, mask_, value_ = as_tensor([x, mask, value], "masked_fill")
    if mask_.dtype != np.dtype(bool):
        raise TypeError(f"masked_fill: argument 'mask' must be a bool tensor, got "
                        f"{mask_.dtype}")
    broadcast_shapes("masked_fill", x_.shape, mask_.shape)
    if value_.dtype != x_.dtype:
        value_ = OPS.to(value_, x_.dtype)
    out = where(mask_, value_, x_)
    if tuple(out.shape) != tuple(x_.shape):
        raise ValueError(f"masked_fill: mask of shape {tuple(mask_.shape)} would broadcast "
                         f"the input of shape {tuple(x_.shape)} to {tuple(out.shape)}")
    return out


@defop(method=True)
def clamp(x, min=None, max=None):  # noqa: A002
    """Limit values to ``[min, max]`` (either may be None; numbers or tensors that
    broadcast). The gradient passes where ``min <= x <= max``, the bounds included
    (PyTorch's rule), and goes to a tensor bound where it is the value.

    >>> x.clamp(-1.0, 1.0); x.clamp(min=0.0)
    """
    if min is not None:
        x = where(x < min, min, x) if _same_dtype(x, min) else maximum(x, min)
    if max is not None:
        x = where(x > max, max, x) if _same_dtype(x, max) else minimum(x, max)
    return x


def _same_dtype(x, bound) -> bool:
    """Whether ``where`` keeps ``x``'s dtype against ``bound`` (a number of x's kind or
    lower, or a tensor of x's dtype); otherwise the bound promotes, as ``maximum`` does."""
    if hasattr(bound, "dtype"):
        return bound.dtype == getattr(x, "dtype", None)
    kind = getattr(getattr(x, "dtype", None), "kind", "")
    return isinstance(bound, (int, float)) and (kind in "fc" or isinstance(bound, int))


@defop(method=True)
def clip(x, min=None, max=None):  # noqa: A002
    """The same as :func:`clamp` (PyTorch's and NumPy's other name).

    >>> x.clip(-1.0, 1.0)
    """
    return clamp(x, min, max)
