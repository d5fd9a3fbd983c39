"""Random sampling ops: the in-place fills ``uniform_ normal_ exponential_ bernoulli_``,
``bernoulli`` and ``multinomial``, each with PyTorch's arguments and ``generator=``.

Every one is a map of one layout-independent draw of :mod:`ctensor.random` (element ``i``
of call ``c`` a pure function of ``(seed, c, i)``), so its values do not depend on the
placement, SBP or world size either:

==================  =====================================================================
op                  value (``u``: one uniform draw, ``z``: one normal draw)
==================  =====================================================================
``uniform_(a, b)``  ``a + (b - a) * u``, ``u`` in ``x``'s dtype
``normal_(m, s)``   ``m + s * z``, ``z`` in ``x``'s dtype
``exponential_(l)`` ``-log(1 - u) / l``, ``u`` float64 (53 bits), cast to ``x``'s dtype
``bernoulli_(p)``   ``u < p``, ``u`` float64, cast to ``x``'s dtype
``bernoulli(p)``    ``u < p`` in ``p``'s dtype (``p`` holds the probabilities)
``multinomial``     per row of ``p`` (categories ``n``), in float64: with replacement, sample
                    ``j`` is the first category whose cumulative sum exceeds
                    ``u_j * total`` (``u`` of shape ``(rows, num_samples)``); without, the
                    ``num_samples`` categories of smallest ``-log(1 - u_c) / p_c`` (``u`` of
                    shape ``(rows, n)``; the exponential race, which draws categories one
                    by one in proportion to ``p`` among those left), in that order
==================  =====================================================================

``multinomial`` is an op with a kernel (whole rows: S(0) over rows or B; a split of the
category dim is gathered); its probabilities are checked (finite, non-negative, a positive
sum, enough non-zero categories without replacement) with one small reduction before the
kernel runs, so every rank raises alike. The fills are recorded as writes (``x`` no longer
depends on the graph); a leaf that requires grad refuses them outside ``ct.no_grad()``.
"""
from __future__ import annotations

import numpy as np

from .. import _device, random
from ..layout import Layout
from ..meta import reads_values
from ..random import Kind
from ..registry import OPS
from ..sbp import Broadcast, Split, without_partial
from ..tensor import Tensor
from ._rules import B, S, defop, sig
from .inplace import _check_target, write

__all__ = ["uniform_", "normal_", "exponential_", "bernoulli_", "bernoulli", "multinomial"]

_F64 = np.dtype(np.float64)


def _floating(opname: str, x) -> None:
    _check_target(opname, x)
    if x.dtype.kind != "f":
        raise TypeError(f"{opname}: the tensor has dtype {x.dtype}; only float16, float32 and "
                        f"float64 tensors can be filled with {opname[:-1]} numbers (PyTorch "
                        f"neither); fill a float tensor and cast it")


def _number(opname: str, arg: str, value) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise TypeError(f"{opname}: argument '{arg}' must be a real number, got {value!r} "
                        f"({type(value).__name__})")
    value = float(value)
    if not np.isfinite(value):
        raise ValueError(f"{opname}: argument '{arg}' must be finite, got {value}")
    return value


def _draw_like(x: Tensor, kind: int, dtype, generator) -> Tensor:
    """One draw of ``x``'s shape on ``x``'s placement and SBP (partial axes broadcast)."""
    layout = Layout(x.shape, np.dtype(dtype), x.placement, without_partial(x.sbp))
    return random.draw(layout, kind, generator)


def _fill(opname: str, x: Tensor, value: Tensor) -> Tensor:
    # cast before write() boxes it to x's layout: a cast of a tensor boxed to P(max) would
    # box it again (a cast does not commute with a max of partial values)
    return write(opname, x, OPS.to(value, x.dtype))


# ----------------------------------------------------------------------------- in-place fills
@defop(method=True)
def uniform_(x, *args, generator=None, **kwargs):
    """Fill ``x`` with numbers drawn uniformly from ``[from, to)`` (PyTorch's
    ``uniform_(from=0, to=1, *, generator=None)``; ``from`` is a keyword Python reserves, so
    pass it positionally or as ``**{"from": a}``).

    >>> w.uniform_(-0.1, 0.1)
    """
    names = ("from", "to")
    unknown = sorted(set(kwargs) - set(names))
    if unknown or len(args) > 2:
        raise TypeError(f"uniform_: got unexpected arguments {unknown or args[2:]}; accepted: "
                        f"uniform_(from=0, to=1, *, generator=None)")
    values = dict(zip(names, args))
    for k, v in kwargs.items():
        if k in values:
            raise TypeError(f"uniform_: got argument '{k}' twice")
        values[k] = v
    low = _number("uniform_", "from", values.get("from", 0.0))
    high = _number("uniform_", "to", values.get("to", 1.0))
    if low > high:
        raise ValueError(f"uniform_: expects from <= to, got from={low}, to={high}")
    _floating("uniform_", x)
    u = _draw_like(x, Kind.UNIFORM, x.dtype, generator)
    return _fill("uniform_", x, u * (high - low) + low)


@defop(method=True)
def normal_(x, mean=0.0, std=1.0, *, generator=None):
    """Fill ``x`` with numbers drawn from N(mean, std^2).

    >>> w.normal_(0.0, 0.02)
    """
    mean, std = _number("normal_", "mean", mean), _number("normal_", "std", std)
    if std < 0:
        raise ValueError(f"normal_: expects std >= 0.0, got {std}")
    _floating("normal_", x)
    z = _draw_like(x, Kind.NORMAL, x.dtype, generator)
    return _fill("normal_", x, z * std + mean)


@defop(method=True)
def exponential_(x, lambd=1.0, *, generator=None):
    """Fill ``x`` with numbers drawn from the exponential distribution of rate ``lambd``
    (density ``lambd * exp(-lambd * v)``, ``v >= 0``), as PyTorch's ``exponential_``.

    >>> t.exponential_(2.0)
    """
    lambd = _number("exponential_", "lambd", lambd)
    if lambd <= 0:
        raise ValueError(f"exponential_: expects lambd > 0.0, got {lambd}")
    _floating("exponential_", x)
    u = _draw_like(x, Kind.UNIFORM, _F64, generator)
    return _fill("exponential_", x, OPS.log(1.0 - u) * (-1.0 / lambd))


def _probability(opname: str, p) -> float:
    p = _number(opname, "p", p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{opname}: expects 0 <= p <= 1, got p={p}")
    return p


def _check_probabilities(opname: str, p: Tensor) -> None:
    """Every element of the tensor ``p`` in [0, 1] (one reduction; skipped shape-only)."""
    if p.dtype.kind != "f":
        raise TypeError(f"{opname}: a tensor 'p' must have a floating dtype, got {p.dtype}")
    _check_probability_values(opname, p)


@reads_values()
def _check_probability_values(opname: str, p: Tensor) -> None:
    with _device.implicit():  # the op's own read, for ct.debug.set_sync_debug_mode
        bad = ((p < 0.0) | (p > 1.0) | (p != p)).sum().item()
    if bad:
        raise ValueError(f"{opname}: expects every probability in [0, 1]; {bad} elements of "
                         f"'p' are outside it (or nan)")


@defop(method=True)
def bernoulli_(x, p=0.5, *, generator=None):
    """Fill ``x`` (any dtype) with 1 where a uniform draw falls below ``p`` (a number or a
    floating tensor broadcastable to ``x``), else 0.

    >>> keep = ct.empty(4, 8).bernoulli_(0.9)
    """
    _check_target("bernoulli_", x)
    if isinstance(p, Tensor):
        _check_probabilities("bernoulli_", p)
    else:
        p = _probability("bernoulli_", p)
    u = _draw_like(x, Kind.UNIFORM, _F64, generator)
    return _fill("bernoulli_", x, OPS.to(u < p, x.dtype))


@defop(method=True)
def bernoulli(input, p=None, *, generator=None):  # noqa: A002 - PyTorch's name
    """Draws of 0 and 1: 1 with probability ``input`` elementwise (a floating tensor of
    probabilities; the result has its dtype), or with probability ``p`` everywhere when
    ``p`` is given (``input`` then gives only the shape, layout and dtype).

    >>> mask = ct.bernoulli(ct.full((4, 8), 0.9))
    """
    if not isinstance(input, Tensor):
        raise TypeError(f"bernoulli: argument 'input' must be a ct.Tensor, got "
                        f"{type(input).__name__}")
    if p is None:
        _check_probabilities("bernoulli", input)
        p = input
    else:
        p = _probability("bernoulli", p)
    if input.dtype.kind != "f":
        raise TypeError(f"bernoulli: argument 'input' must have a floating dtype, got "
                        f"{input.dtype}")
    u = _draw_like(input, Kind.UNIFORM, _F64, generator)
    return OPS.to(u < p, input.dtype)


# ----------------------------------------------------------------------------- multinomial
def _multinomial_kernel(xp, p, u, num_samples, replacement):
    rows = (p[None] if p.ndim == 1 else p).astype(np.float64)  # (a shard may have 0 rows)
    draws = u[None] if u.ndim == 1 else u
    if replacement:
        cdf = xp.cumsum(rows, axis=-1)
        targets = draws * cdf[:, -1:]       # below each row's total (u < 1), so the first
        out = xp.empty(draws.shape, np.int64)  # category whose sum exceeds it has p > 0
        for r in range(rows.shape[0]):
            out[r] = xp.searchsorted(cdf[r], targets[r], side="right")
    else:
        # exponential draws (1 - u is exact and positive), over the weights: a zero weight
        # gives inf (nan when u is 0), which sorts after every finite key, as NumPy and CuPy
        # sort nan last (kernels run with floating-point warnings off)
        keys = xp.log(1.0 - draws)
        keys *= -1.0
        keys /= rows
        if num_samples < keys.shape[-1]:  # the k smallest (all finite: k <= positives), then
            part = xp.argpartition(keys, num_samples - 1, axis=-1)[:, :num_samples]
            keys = xp.take_along_axis(keys, part, axis=-1)      # in order
        else:
            part = None
        order = xp.argsort(keys, axis=-1, kind="stable") if xp is np else \
            xp.argsort(keys, axis=-1)
        out = order if part is None else xp.take_along_axis(part, order, axis=-1)
    return out[0] if p.ndim == 1 else out


@reads_values()
def _check_weights(fn: str, input: Tensor, num_samples: int, replacement: bool) -> None:
    """Finite, non-negative weights with a positive sum (and enough non-zero ones without
    replacement) in every row: one reduction, the same answer on every rank (skipped
    shape-only)."""
    n = input.shape[-1]
    bad = ((input < 0.0) | (input != input) | (input.abs() == float("inf"))).sum()
    rows = input if input.ndim == 2 else OPS.reshape(input, (1, n))
    short = ((rows > 0.0).sum(-1) < (1 if replacement else num_samples)).sum()
    bad, short = (int(v) for v in OPS.stack([bad, short]).numpy())
    if bad:
        raise ValueError(f"{fn}: the weights must be finite and non-negative; {bad} "
                         f"elements of 'input' are negative, inf or nan")
    if short:
        why = "" if replacement else " (without replacement each sample needs its own " \
                                     "category)"
        raise ValueError(f"{fn}: {short} rows of 'input' have fewer than "
                         f"{1 if replacement else num_samples} positive weights{why}")


def _multinomial_meta(layouts, num_samples, replacement):
    p, u = layouts
    return [(p.shape[:-1] + (num_samples,), np.dtype(np.int64))]


def _multinomial_signatures(layouts, num_samples, replacement):
    """Whole rows: the rows (dim 0 of a 2-D input) may be split, with the draws alike."""
    cands = [sig([B, B], B)]
    if layouts[0].ndim == 2:
        cands.append(sig([S(0), S(0)], S(0)))
    return cands


@defop(kernel=_multinomial_kernel, meta=_multinomial_meta, signatures=_multinomial_signatures,
       method=True, saves=())
def multinomial(op, input, num_samples: int, replacement: bool = False, *,  # noqa: A002
                generator=None):
    """``num_samples`` category indices per row of ``input`` (1-D: the categories; 2-D:
    rows of them), drawn in proportion to the row's non-negative weights (they need not
    sum to 1), with or without replacement (the exponential race: the module table).
    Returns int64 of shape ``input.shape[:-1] + (num_samples,)``.

    >>> next_token = ct.multinomial(ct.softmax(logits, -1), 1)
    """
    fn = "multinomial"
    if not isinstance(input, Tensor):
        raise TypeError(f"{fn}: argument 'input' must be a ct.Tensor, got "
                        f"{type(input).__name__}")
    if input.ndim not in (1, 2) or input.dtype.kind != "f":
        raise ValueError(f"{fn}: argument 'input' must be a 1-D or 2-D floating tensor of "
                         f"weights, got shape {tuple(input.shape)} and dtype {input.dtype}")
    if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)):
        raise TypeError(f"{fn}: argument 'num_samples' must be an int, got {num_samples!r}")
    if not isinstance(replacement, (bool, np.bool_)):
        raise TypeError(f"{fn}: argument 'replacement' must be True or False, got "
                        f"{replacement!r}")
    num_samples, replacement = int(num_samples), bool(replacement)
    n = input.shape[-1]
    if num_samples <= 0 or n == 0 or (not replacement and num_samples > n):
        limit = ("any positive int" if replacement else
                 f"1..{n} (without replacement at most the number of categories; pass "
                 f"replacement=True)")
        raise ValueError(f"{fn}: argument 'num_samples' is {num_samples} for {n} categories; "
                         f"accepted: {limit}")
    gen = random._generator(fn, generator)
    _check_weights(fn, input, num_samples, replacement)
    rows_sbp = tuple(s if isinstance(s, Split) and s.dim == 0 and input.ndim == 2
                     else Broadcast() for s in input.sbp)
    m = input.shape[:-1]
    draws = random.draw(Layout(m + ((num_samples,) if replacement else (n,)), _F64,
                               input.placement, rows_sbp), Kind.UNIFORM, gen)
    return op(input, draws, num_samples=num_samples, replacement=replacement)
