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

from ..dispatch import apply, as_tensor, op
from ..registry import OPS, register
from ..runtime import get_default_dtype
from ._rules import B, P, broadcast_shapes, elementwise_signatures, result_dtype


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


def _float_dtype(dtype: np.dtype) -> np.dtype:
    return dtype if dtype.kind in "fc" else get_default_dtype()


def _binary_meta(name: str, kind: str):
    def meta(layouts, **_):
        shape = broadcast_shapes(name, *(l.shape for l in layouts))
        dtype = result_dtype(name, [l.dtype for l in layouts])
        if kind == "bool":
            dtype = np.dtype(bool)
        elif kind == "float":
            dtype = _float_dtype(dtype)
        return [(shape, dtype)]
    return meta


def _declare_binary(name: str, kernel: Callable, backward, partial=(), kind="same"):
    meta = _binary_meta(name, kind)

    def signatures(layouts, **_):
        shape = broadcast_shapes(name, *(l.shape for l in layouts))
        return elementwise_signatures(layouts, shape, partial)

    op(name, meta=meta, signatures=signatures, backward=backward)(kernel)

    def fn(a, b):
        return apply(name, as_tensor([a, b], name))
    fn.__name__ = name
    fn.__doc__ = f"Elementwise ``{name}`` with broadcasting (``ct.{name}(a, b)``)."
    register(name)(fn)
    return fn


def _declare_unary(name: str, kernel: Callable, backward, partial=False, kind="same"):
    def meta(layouts, **_):
        dtype = layouts[0].dtype
        if kind == "float":
            dtype = _float_dtype(dtype)
        elif kind == "bool":
            dtype = np.dtype(bool)
        return [(layouts[0].shape, dtype)]

    def signatures(layouts, **_):
        return elementwise_signatures(layouts, layouts[0].shape, [(P,)] if partial else ())

    op(name, meta=meta, signatures=signatures, backward=backward)(kernel)

    def fn(x):
        return apply(name, as_tensor([x], name))
    fn.__name__ = name
    fn.__doc__ = f"Elementwise ``{name}`` (``x.{name}()`` or ``ct.{name}(x)``)."
    register(name)(fn)
    return fn


# ----------------------------------------------------------------------------- arithmetic
def _add_bw(ctx, g):
    a, b = ctx.inputs
    return sum_to(g, a.shape), sum_to(g, b.shape)


def _sub_bw(ctx, g):
    a, b = ctx.inputs
    return sum_to(g, a.shape), sum_to(-g, b.shape)


def _mul_bw(ctx, g):
    a, b = ctx.inputs
    return sum_to(g * b, a.shape), sum_to(g * a, b.shape)


def _div_bw(ctx, g):
    a, b = ctx.inputs
    return sum_to(g / b, a.shape), sum_to(-(g * ctx.outputs[0]) / b, b.shape)


def _pow_bw(ctx, g):
    a, b = ctx.inputs
    ga = sum_to(g * b * a ** (b - 1), a.shape)
    gb = None
    if b.dtype.kind in "fc":
        gb = sum_to(g * ctx.outputs[0] * OPS.log(OPS.where(a > 0, a, 1.0)), b.shape)
    return ga, gb


add = _declare_binary("add", lambda xp, a, b: xp.add(a, b), _add_bw, partial=[(P, P)])
sub = _declare_binary("sub", lambda xp, a, b: xp.subtract(a, b), _sub_bw, partial=[(P, P)])
mul = _declare_binary("mul", lambda xp, a, b: xp.multiply(a, b), _mul_bw,
                      partial=[(P, B), (B, P)])
div = _declare_binary("div", lambda xp, a, b: xp.true_divide(a, b), _div_bw, partial=[(P, B)], kind="float")
pow = _declare_binary("pow", lambda xp, a, b: xp.power(a, b), _pow_bw)  # noqa: A001
maximum = _declare_binary(
    "maximum", lambda xp, a, b: xp.maximum(a, b),
    lambda ctx, g: (sum_to(OPS.where(ctx.inputs[0] >= ctx.inputs[1], g, 0.0),
                           ctx.inputs[0].shape),
                    sum_to(OPS.where(ctx.inputs[0] < ctx.inputs[1], g, 0.0),
                           ctx.inputs[1].shape)))
minimum = _declare_binary(
    "minimum", lambda xp, a, b: xp.minimum(a, b),
    lambda ctx, g: (sum_to(OPS.where(ctx.inputs[0] <= ctx.inputs[1], g, 0.0),
                           ctx.inputs[0].shape),
                    sum_to(OPS.where(ctx.inputs[0] > ctx.inputs[1], g, 0.0),
                           ctx.inputs[1].shape)))

for _name, _fn in [("eq", "equal"), ("ne", "not_equal"), ("lt", "less"),
                   ("le", "less_equal"), ("gt", "greater"), ("ge", "greater_equal")]:
    _declare_binary(_name, (lambda f: lambda xp, a, b: getattr(xp, f)(a, b))(_fn), None,
                    kind="bool")
_declare_binary("logical_and", lambda xp, a, b: xp.logical_and(a, b), None, kind="bool")
_declare_binary("logical_or", lambda xp, a, b: xp.logical_or(a, b), None, kind="bool")
_declare_unary("logical_not", lambda xp, x: xp.logical_not(x), None, kind="bool")


# ----------------------------------------------------------------------------- unary maths
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _erf(xp, x):
    if xp is np:
        return np.vectorize(math.erf, otypes=[x.dtype])(x) if x.size else x.copy()
    from cupyx.scipy.special import erf  # CuPy ships it
    return erf(x)


neg = _declare_unary("neg", lambda xp, x: xp.negative(x), lambda ctx, g: (-g,), partial=True)
abs = _declare_unary("abs", lambda xp, x: xp.abs(x),  # noqa: A001
                     lambda ctx, g: (g * OPS.sign(ctx.inputs[0]),))
sign = _declare_unary("sign", lambda xp, x: xp.sign(x), lambda ctx, g: (g * 0.0,))
exp = _declare_unary("exp", lambda xp, x: xp.exp(x), lambda ctx, g: (g * ctx.outputs[0],),
                     kind="float")
log = _declare_unary("log", lambda xp, x: xp.log(x), lambda ctx, g: (g / ctx.inputs[0],),
                     kind="float")
sqrt = _declare_unary("sqrt", lambda xp, x: xp.sqrt(x),
                      lambda ctx, g: (g * 0.5 / ctx.outputs[0],), kind="float")
rsqrt = _declare_unary("rsqrt", lambda xp, x: 1.0 / xp.sqrt(x),
                       lambda ctx, g: (g * -0.5 * ctx.outputs[0] ** 3,), kind="float")
tanh = _declare_unary("tanh", lambda xp, x: xp.tanh(x),
                      lambda ctx, g: (g * (1.0 - ctx.outputs[0] * ctx.outputs[0]),),
                      kind="float")
sigmoid = _declare_unary("sigmoid", lambda xp, x: 0.5 * (xp.tanh(0.5 * x) + 1.0),
                         lambda ctx, g: (g * ctx.outputs[0] * (1.0 - ctx.outputs[0]),),
                         kind="float")
relu = _declare_unary("relu", lambda xp, x: xp.maximum(x, 0).astype(x.dtype),
                      lambda ctx, g: (OPS.where(ctx.inputs[0] > 0, g, 0.0),))
square = _declare_unary("square", lambda xp, x: x * x, lambda ctx, g: (2.0 * g * ctx.inputs[0],))
sin = _declare_unary("sin", lambda xp, x: xp.sin(x),
                     lambda ctx, g: (g * OPS.cos(ctx.inputs[0]),), kind="float")
cos = _declare_unary("cos", lambda xp, x: xp.cos(x),
                     lambda ctx, g: (-g * OPS.sin(ctx.inputs[0]),), kind="float")


def _gelu_kernel(xp, x, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1.0 + xp.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))
    return 0.5 * x * (1.0 + _erf(xp, x / math.sqrt(2.0)))


def _gelu_grad_kernel(xp, g, x, approximate="none"):
    if approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
        t = xp.tanh(inner)
        d_inner = _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x * x)
        return g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * d_inner)
    cdf = 0.5 * (1.0 + _erf(xp, x / math.sqrt(2.0)))
    pdf = xp.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    return g * (cdf + x * pdf)


def _gelu_meta(layouts, **_):
    return [(layouts[-1].shape, _float_dtype(layouts[-1].dtype))]


op("gelu_grad", meta=_gelu_meta,
   signatures=lambda layouts, **_: elementwise_signatures(layouts, layouts[0].shape))(
    _gelu_grad_kernel)
op("gelu", meta=_gelu_meta,
   signatures=lambda layouts, **_: elementwise_signatures(layouts, layouts[0].shape),
   backward=lambda ctx, g: (apply("gelu_grad", [g, ctx.inputs[0]], **ctx.attrs),))(_gelu_kernel)


@register("gelu")
def gelu(x, approximate: str = "none"):
    """GELU: ``x * Phi(x)`` (``approximate="tanh"`` for the GPT-2 tanh form)."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: argument 'approximate' must be 'none' or 'tanh', got "
                         f"{approximate!r}")
    return apply("gelu", as_tensor([x], "gelu"), approximate=approximate)


# ----------------------------------------------------------------------------- selection
def _where_meta(layouts, **_):
    c, x, y = layouts
    if c.dtype != np.dtype(bool):
        raise TypeError(f"where: argument 'condition' must be a bool tensor, got {c.dtype}")
    return [(broadcast_shapes("where", c.shape, x.shape, y.shape),
             result_dtype("where", [x.dtype, y.dtype]))]


def _where_signatures(layouts, **_):
    shape = broadcast_shapes("where", *(l.shape for l in layouts))
    return elementwise_signatures(layouts, shape, [(B, P, P)])


def _where_bw(ctx, g):
    c, x, y = ctx.inputs
    zero = OPS.zeros_like(g)
    return None, sum_to(OPS.where(c, g, zero), x.shape), sum_to(OPS.where(c, zero, g), y.shape)


op("where", meta=_where_meta, signatures=_where_signatures, backward=_where_bw)(
    lambda xp, c, x, y: xp.where(c, x, y))


@register("where")
def where(condition, x, y):
    """``x`` where ``condition`` holds, else ``y`` (broadcasting; scalars allowed)."""
    return apply("where", as_tensor([condition, x, y], "where"))


@register("masked_fill")
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


@register("clamp")
def clamp(x, min=None, max=None):  # noqa: A002
    """Limit values to ``[min, max]`` (either may be None)."""
    if min is not None:
        x = maximum(x, min)
    if max is not None:
        x = minimum(x, max)
    return x
