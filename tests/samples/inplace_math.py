"""In-place forms of the rounding, clipping and division ops (ctensor/ops/inplace_math.py):
each updates a clone and must equal the out-of-place NumPy result in every layout."""
import numpy as np

from . import Sample


def _quotients(rng, shape, i):
    if i == 0:
        return rng.uniform(-4.0, 4.0, shape)
    return rng.uniform(0.7, 1.6, shape) * rng.choice([-1.0, 1.0], shape)


def _specials(rng, shape, i):
    x = rng.standard_normal(shape)
    flat = x.reshape(-1)
    flat[::4], flat[1::4], flat[2::5] = np.inf, -np.inf, np.nan
    return x


def _imod(a, b):
    a %= b
    return a


def _ifloordiv(a, b):
    a //= b
    return a


SAMPLES = [
    Sample("floor_", lambda a: a.clone().floor_(), np.floor, [(4, 3)]),
    Sample("ceil_", lambda a: a.clone().ceil_(), np.ceil, [(4, 3)]),
    Sample("trunc_", lambda a: a.clone().trunc_(), np.trunc, [(4, 3)]),
    Sample("round_", lambda a: a.clone().round_(decimals=1), lambda a: np.round(a, 1), [(4, 3)]),
    Sample("clip_", lambda a: a.clone().clip_(-0.5, 0.5), lambda a: np.clip(a, -0.5, 0.5),
           [(4, 3)], make=lambda r, s, i: (r.permutation(int(np.prod(s))).reshape(s) + 0.37)
           / 6.0 - 1),
    Sample("nan_to_num_", lambda a: a.clone().nan_to_num_(posinf=2.0, neginf=-3.0),
           lambda a: np.nan_to_num(a, posinf=2.0, neginf=-3.0), [(4, 3)], make=_specials,
           grad=(), kinds=("S", "B")),
    Sample("remainder_", lambda a, b: _imod(a.clone(), b), np.remainder, [(4, 3), (3,)],
           make=_quotients, grad=(0, 1)),
    Sample("fmod_", lambda a, b: a.clone().fmod_(b), np.fmod, [(4, 3), (4, 3)],
           make=_quotients, grad=(0, 1)),
    Sample("floor_divide_", lambda a, b: _ifloordiv(a.clone(), b), np.floor_divide,
           [(4, 3), (4, 3)], make=_quotients, grad=()),
]
