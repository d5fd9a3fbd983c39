import numpy as np

import ctensor as ct
from . import Sample, positive
from math import erf, sqrt

_verf = np.vectorize(erf)


def _gelu(x):
    return 0.5 * x * (1 + _verf(x / sqrt(2)))


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _bool(rng, shape, i):
    return rng.standard_normal(shape) > 0


def _cond_first(rng, shape, i):
    return rng.standard_normal(shape) > 0 if i == 0 else rng.standard_normal(shape)


def _pos_base(rng, shape, i):
    return rng.uniform(0.5, 2.0, shape) if i == 0 else rng.uniform(-1.5, 1.5, shape)


def _away_from_zero(rng, shape, i):
    x = rng.standard_normal(shape)
    return np.where(np.abs(x) < 0.1, 0.5, x)


def _distinct(rng, shape, i):
    return rng.permutation(int(np.prod(shape))).reshape(shape) / 3.0 + i * 0.1


def _specials(rng, shape, i):
    """Normals with a NaN, a +inf and a -inf in them (where the shape has room)."""
    x = rng.standard_normal(shape)
    flat = x.reshape(-1)
    for j, v in zip(range(0, flat.size, 3), (np.nan, np.inf, -np.inf)):
        flat[j] = v
    return x


def _quotients(rng, shape, i):
    """A dividend of both signs and a divisor of both signs away from zero."""
    if i == 0:
        return rng.uniform(-4.0, 4.0, shape)
    return rng.uniform(0.7, 1.6, shape) * rng.choice([-1.0, 1.0], shape)


def _erf_ref(x):
    return _verf(x)


SAMPLES = [
    Sample("add", lambda a, b: a + b, np.add, [(4, 3), (4, 3)], grad=(0, 1)),
    Sample("add", lambda a, b: a + b, np.add, [(4, 3), (3,)], grad=(0, 1), name="add_bcast"),
    Sample("add", lambda a: a + 1.5, lambda a: a + 1.5, [(4, 3)], name="add_scalar"),
    Sample("sub", lambda a, b: a - b, np.subtract, [(4, 3), (4, 1)], grad=(0, 1)),
    Sample("sub", lambda a: 2.0 - a, lambda a: 2.0 - a, [(4, 3)], name="rsub_scalar"),
    Sample("mul", lambda a, b: a * b, np.multiply, [(4, 3), (4, 3)], grad=(0, 1)),
    Sample("mul", lambda a: a * 3.0, lambda a: a * 3.0, [(4, 3)], name="mul_scalar"),
    Sample("div", lambda a, b: a / b, np.divide, [(4, 3), (3,)], make=positive, grad=(0, 1)),
    Sample("pow", lambda a, b: a ** b, np.power, [(4, 3), (4, 3)], make=_pos_base,
           grad=(0, 1)),
    Sample("pow", lambda a: a ** 2, lambda a: a ** 2, [(4, 3)], name="pow_scalar"),
    Sample("maximum", ct.maximum, np.maximum, [(4, 3), (4, 3)], make=_distinct, grad=(0, 1)),
    Sample("minimum", ct.minimum, np.minimum, [(4, 3), (3,)], make=_distinct, grad=(0, 1)),
    Sample("neg", lambda a: -a, np.negative, [(4, 3)]),
    Sample("abs", abs, np.abs, [(4, 3)], make=_away_from_zero),
    Sample("sign", ct.sign, np.sign, [(4, 3)], make=_away_from_zero),
    Sample("exp", lambda a: a.exp(), np.exp, [(4, 3)]),
    Sample("log", lambda a: a.log(), np.log, [(4, 3)], make=positive),
    Sample("sqrt", lambda a: a.sqrt(), np.sqrt, [(4, 3)], make=positive),
    Sample("rsqrt", lambda a: a.rsqrt(), lambda a: 1 / np.sqrt(a), [(4, 3)], make=positive),
    Sample("tanh", lambda a: a.tanh(), np.tanh, [(4, 3)]),
    Sample("sigmoid", lambda a: a.sigmoid(), lambda a: 1 / (1 + np.exp(-a)), [(4, 3)]),
    Sample("relu", lambda a: a.relu(), lambda a: np.maximum(a, 0), [(4, 3)],
           make=_away_from_zero),
    Sample("square", ct.square, np.square, [(4, 3)]),
    Sample("sin", ct.sin, np.sin, [(4, 3)]),
    Sample("cos", ct.cos, np.cos, [(4, 3)]),
    Sample("gelu", lambda a: ct.gelu(a), _gelu, [(4, 3)]),
    Sample("gelu", lambda a: ct.gelu(a, approximate="tanh"), _gelu_tanh, [(4, 3)],
           name="gelu_tanh"),
    Sample("eq", lambda a, b: a == b, np.equal, [(4, 3), (4, 3)], make=lambda r, s, i:
           r.integers(0, 2, s).astype(float), grad=()),
    Sample("ne", lambda a, b: a != b, np.not_equal, [(4, 3), (4, 3)], make=lambda r, s, i:
           r.integers(0, 2, s).astype(float), grad=()),
    Sample("lt", lambda a, b: a < b, np.less, [(4, 3), (4, 3)], grad=()),
    Sample("le", lambda a, b: a <= b, np.less_equal, [(4, 3), (3,)], grad=()),
    Sample("gt", lambda a: a > 0.2, lambda a: a > 0.2, [(4, 3)], grad=()),
    Sample("ge", lambda a, b: a >= b, np.greater_equal, [(4, 3), (4, 3)], grad=()),
    Sample("logical_and", lambda a, b: a & b, np.logical_and, [(4, 3), (4, 3)], make=_bool,
           grad=(), kinds=("S", "B")),
    Sample("logical_or", lambda a, b: a | b, np.logical_or, [(4, 3), (4, 3)], make=_bool,
           grad=(), kinds=("S", "B")),
    Sample("logical_not", lambda a: ~a, np.logical_not, [(4, 3)], make=_bool, grad=(),
           kinds=("S", "B")),
    Sample("where", ct.where, np.where, [(4, 3), (4, 3), (3,)], make=_cond_first,
           grad=(1, 2)),
    Sample("masked_fill", lambda a, m: a.masked_fill(m, -1.0),
           lambda a, m: np.where(m, -1.0, a), [(4, 3), (4, 3)],
           make=lambda r, s, i: r.standard_normal(s) if i == 0 else r.standard_normal(s) > 0),
    Sample("clamp", lambda a: a.clamp(-0.5, 0.5), lambda a: np.clip(a, -0.5, 0.5), [(4, 3)],
           make=_distinct),
    Sample("clip", lambda a: a.clip(max=0.5), lambda a: np.minimum(a, 0.5), [(4, 3)],
           make=_distinct),
    # erf, rounding, non-finite values, division
    Sample("erf", lambda a: a.erf(), _erf_ref, [(4, 3)]),
    Sample("floor", lambda a: a.floor(), np.floor, [(4, 3)]),
    Sample("ceil", ct.ceil, np.ceil, [(4, 3)]),
    Sample("trunc", lambda a: a.trunc(), np.trunc, [(4, 3)]),
    Sample("floor", lambda a: a.floor(), lambda a: a, [(4, 3)],
           make=lambda r, s, i: r.integers(-5, 5, s), grad=(), name="floor_int"),
    Sample("round", lambda a: a.round(), np.round, [(4, 3)],
           make=lambda r, s, i: r.integers(-8, 8, s) / 2.0, grad=(), name="round_halves"),
    Sample("round", lambda a: ct.round(a * 10.0, decimals=-1), lambda a: np.round(a * 10.0, -1),
           [(4, 3)]),
    Sample("round", lambda a: a.round(decimals=2), lambda a: np.round(a, 2), [(4, 3)],
           name="round_decimals"),
    Sample("isnan", lambda a: a.isnan(), np.isnan, [(4, 3)], make=_specials, grad=(),
           kinds=("S", "B")),
    Sample("isinf", ct.isinf, np.isinf, [(4, 3)], make=_specials, grad=(), kinds=("S", "B")),
    Sample("isfinite", lambda a: a.isfinite(), np.isfinite, [(4, 3)], make=_specials,
           grad=(), kinds=("S", "B")),
    Sample("nan_to_num", lambda a: a.nan_to_num(posinf=9.0), lambda a: np.nan_to_num(
           a, posinf=9.0), [(4, 3)], make=_specials, grad=(), kinds=("S", "B")),
    Sample("nan_to_num", lambda a: ct.nan_to_num(a, nan=1.0, neginf=-2.0),
           lambda a: np.nan_to_num(a, nan=1.0, neginf=-2.0), [(4, 3)], name="nan_to_num_grad"),
    Sample("remainder", lambda a, b: a % b, np.remainder, [(4, 3), (4, 3)], make=_quotients,
           grad=(0, 1)),
    Sample("remainder", lambda a: 2.5 % a, lambda a: np.remainder(2.5, a), [(4, 3)],
           make=lambda r, s, i: _quotients(r, s, 1), name="rmod_scalar"),
    Sample("remainder", lambda a: a % 3, lambda a: a % 3, [(4, 3)],
           make=lambda r, s, i: r.integers(-9, 9, s), grad=(), name="remainder_int"),
    Sample("fmod", ct.fmod, np.fmod, [(4, 3), (3,)], make=_quotients, grad=(0, 1)),
    Sample("floor_divide", lambda a, b: a // b, np.floor_divide, [(4, 3), (4, 3)],
           make=_quotients, grad=()),
    Sample("floor_divide", lambda a: 7 // a, lambda a: 7 // a, [(4, 3)],
           make=lambda r, s, i: r.integers(1, 4, s) * r.choice([-1, 1], s), grad=(),
           name="floor_divide_int"),
]

COVERED_ELSEWHERE = {
    "gelu.grad": "the gradient kernel of gelu, checked by gelu's gradient test",
}
