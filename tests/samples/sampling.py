"""Random sampling ops (ctensor/ops/sampling.py): each sample seeds the default generator,
so the op's first draw is call 0 of that seed, and the NumPy reference computes the
documented map of that very draw (``ctensor.random.region`` of the whole logical tensor):
equal in every layout means the values do not depend on it."""
import numpy as np

import ctensor as ct
from ctensor.random import Kind, region
from . import Sample, positive

SEED = 1234


def _uniform(shape, dtype=np.float64, call=0):
    return region(Kind.UNIFORM, shape, tuple((0, n) for n in shape), dtype, (SEED, call))


def _normal(shape, dtype=np.float64):
    return region(Kind.NORMAL, shape, tuple((0, n) for n in shape), dtype, (SEED, 0))


def _seeded(fn):
    def run(*xs):
        ct.manual_seed(SEED)
        return fn(*xs)
    return run


def _multinomial_ref(p, k, replacement):
    rows = p.reshape(-1, p.shape[-1])
    if replacement:
        u = _uniform(p.shape[:-1] + (k,)).reshape(rows.shape[0], k)
        cdf = np.cumsum(rows, axis=-1)
        out = np.stack([np.searchsorted(c, uu * c[-1], side="right") for c, uu in zip(cdf, u)])
    else:
        u = _uniform(p.shape).reshape(rows.shape)
        with np.errstate(divide="ignore", invalid="ignore"):
            keys = -np.log(1.0 - u) / rows
        out = np.argsort(keys, axis=-1, kind="stable")[:, :k]
    return out.reshape(p.shape[:-1] + (k,))


def _probabilities(rng, shape, i):
    return rng.uniform(0.0, 1.0, shape)


SAMPLES = [
    Sample("uniform_", _seeded(lambda a: a.clone().uniform_(-1.0, 3.0)),
           lambda a: _uniform(a.shape) * 4.0 - 1.0, [(4, 3)], grad=()),
    Sample("normal_", _seeded(lambda a: a.clone().normal_(0.5, 2.0)),
           lambda a: _normal(a.shape) * 2.0 + 0.5, [(4, 3)], grad=()),
    Sample("exponential_", _seeded(lambda a: a.clone().exponential_(2.0)),
           lambda a: np.log(1.0 - _uniform(a.shape)) * -0.5, [(4, 3)], grad=()),
    Sample("bernoulli_", _seeded(lambda a, p: a.clone().bernoulli_(p)),
           lambda a, p: (_uniform(a.shape) < p).astype(a.dtype), [(4, 3), (3,)],
           make=lambda r, s, i: r.standard_normal(s) if i == 0 else r.uniform(0, 1, s),
           grad=(), kinds=("S", "B")),
    Sample("bernoulli", _seeded(lambda p: ct.bernoulli(p)),
           lambda p: (_uniform(p.shape) < p).astype(p.dtype), [(4, 3)], make=_probabilities,
           grad=(), kinds=("S", "B")),
    Sample("multinomial", _seeded(lambda p: ct.multinomial(p, 3)),
           lambda p: _multinomial_ref(p, 3, False), [(4, 6)], make=positive, grad=()),
    Sample("multinomial", _seeded(lambda p: p.multinomial(5, replacement=True)),
           lambda p: _multinomial_ref(p, 5, True), [(4, 6)], make=positive, grad=(),
           name="multinomial_replacement"),
    Sample("multinomial", _seeded(lambda p: ct.multinomial(p, 4)),
           lambda p: _multinomial_ref(p, 4, False), [(6,)], make=positive, grad=(),
           name="multinomial_1d"),
]
