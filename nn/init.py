"""``nn.init``: PyTorch's parameter initialisers (``normal_``, ``xavier_uniform_``,
``kaiming_uniform_``, ``trunc_normal_``, ...), with PyTorch's fan computations, gains and
defaults.

Each one fills its tensor *in place* (under ``no_grad``) with numbers from ctensor's
counter-based generator drawn on the tensor's own placement and SBP (a partial axis is
drawn broadcast; ``generator=`` takes a ``ct.Generator`` of its own), so the logical
values depend only on the seed and the order of calls, never on the layout or the world
size: a model initialised after ``to_global`` gets the
same weights as one initialised on one rank. (They are not PyTorch's numbers: its
generator is another one; copy a ``state_dict`` to match PyTorch exactly.)

>>> model.apply(lambda m: nn.init.xavier_uniform_(m.weight) if isinstance(m, nn.Linear)
...             else None)
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

import ctensor as ct

__all__ = ["calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "zeros_",
           "ones_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
           "kaiming_normal_"]

_LINEAR = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
           "conv_transpose3d", "sigmoid")


def calculate_gain(nonlinearity: str, param: Optional[float] = None) -> float:
    """PyTorch's recommended gain for ``nonlinearity``: 1 for linear/conv/sigmoid, 5/3 for
    tanh, sqrt(2) for relu, sqrt(2 / (1 + a^2)) for leaky_relu (``param`` = a, default
    0.01), 3/4 for selu.

    >>> nn.init.calculate_gain("relu")
    1.4142135623730951
    """
    if nonlinearity in _LINEAR:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, (int, float)) and not isinstance(param, bool):
            slope = float(param)
        else:
            raise ValueError(f"calculate_gain: negative_slope {param!r} is not a valid number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}; accepted "
                     f"{_LINEAR + ('tanh', 'relu', 'leaky_relu', 'selu')}")


def _check(fn: str, tensor) -> None:
    if not isinstance(tensor, ct.Tensor):
        raise TypeError(f"{fn}: argument 'tensor' must be a ct.Tensor (a parameter), got "
                        f"{type(tensor).__name__}")
    if tensor.dtype.kind not in "fc":
        raise TypeError(f"{fn}: argument 'tensor' must be floating, got {tensor.dtype}")


def _fans(fn: str, tensor) -> tuple:
    """PyTorch's ``(fan_in, fan_out)``: ``shape[1] * receptive`` and ``shape[0] *
    receptive``, the receptive field being the product of the dims after the second."""
    if tensor.ndim < 2:
        raise ValueError(f"{fn}: fan in and fan out can not be computed for a tensor with "
                         f"fewer than 2 dimensions (shape {tuple(tensor.shape)})")
    receptive = math.prod(tensor.shape[2:]) if tensor.ndim > 2 else 1
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def _fan(fn: str, tensor, mode: str) -> int:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"{fn}: argument 'mode' is {mode!r}, accepted 'fan_in' or 'fan_out'")
    fan_in, fan_out = _fans(fn, tensor)
    return fan_in if mode == "fan_in" else fan_out


def _drawing_layout(tensor) -> tuple:
    """Where to draw: the tensor's placement and SBP, partial axes drawn broadcast (each
    rank then holds the whole value there, as a broadcast copy does)."""
    sbp = tuple(ct.sbp.broadcast if isinstance(s, ct.sbp.Partial) else s for s in tensor.sbp)
    return tensor.placement, sbp


def _fill(tensor, new) -> ct.Tensor:
    with ct.no_grad():
        tensor.copy_(new)
    return tensor


def _check_generator(fn: str, generator) -> None:
    if generator is not None and not isinstance(generator, ct.Generator):
        raise TypeError(f"{fn}: argument 'generator' must be a ct.Generator or None, got "
                        f"{type(generator).__name__}")


def uniform_(tensor, a: float = 0.0, b: float = 1.0, generator=None) -> ct.Tensor:
    """Fill with U(a, b).

    >>> nn.init.uniform_(w, -0.1, 0.1)
    """
    _check("uniform_", tensor)
    _check_generator("uniform_", generator)
    placement, sbp = _drawing_layout(tensor)
    u = ct.rand(*tensor.shape, generator=generator, placement=placement, sbp=sbp,
                dtype=tensor.dtype)
    return _fill(tensor, u * (float(b) - float(a)) + float(a))


def normal_(tensor, mean: float = 0.0, std: float = 1.0, generator=None) -> ct.Tensor:
    """Fill with N(mean, std^2).

    >>> nn.init.normal_(w, std=0.02)
    """
    _check("normal_", tensor)
    _check_generator("normal_", generator)
    placement, sbp = _drawing_layout(tensor)
    z = ct.randn(*tensor.shape, generator=generator, placement=placement, sbp=sbp,
                 dtype=tensor.dtype)
    return _fill(tensor, z * float(std) + float(mean))


def _normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def trunc_normal_(tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0,
                  b: float = 2.0, generator=None) -> ct.Tensor:
    """Fill with N(mean, std^2) truncated to ``[a, b]`` (absolute bounds, as PyTorch: the
    default ``[-2, 2]`` truncates ``std=0.02`` nowhere in practice).

    Exact rejection sampling: every value outside ``[a, b]`` is drawn again (a fresh,
    layout-independent draw each round; ranks agree on when to stop). ``ValueError`` when
    ``[a, b]`` holds under 1% of the distribution (rejection would take too long).

    >>> nn.init.trunc_normal_(w, std=0.02)
    """
    fn = "trunc_normal_"
    _check(fn, tensor)
    _check_generator(fn, generator)
    if not (std > 0) or not (a < b):
        raise ValueError(f"{fn}: needs std > 0 and a < b, got std={std!r}, a={a!r}, b={b!r}")
    mass = _normal_cdf((b - mean) / std) - _normal_cdf((a - mean) / std)
    if mass < 0.01:
        raise ValueError(f"{fn}: [a, b] = [{a}, {b}] holds {mass:.2e} of N({mean}, {std}^2); "
                         f"accepted: an interval holding at least 1% of it (widen a, b)")
    placement, sbp = _drawing_layout(tensor)

    def draw():
        z = ct.randn(*tensor.shape, generator=generator, placement=placement, sbp=sbp,
                     dtype=np.float64)
        return z * float(std) + float(mean)

    with ct.no_grad():
        x = draw()
        for _ in range(10_000):
            outside = ct.logical_or(x < a, x > b)
            if not bool(outside.sum().item()):  # (a collective: every rank stops together)
                break
            x = ct.where(outside, draw(), x)
        return _fill(tensor, x.to(tensor.dtype))


def constant_(tensor, val: float) -> ct.Tensor:
    """Fill with ``val``.

    >>> nn.init.constant_(b, 0.1)
    """
    _check("constant_", tensor)
    with ct.no_grad():
        tensor.fill_(float(val))
    return tensor


def zeros_(tensor) -> ct.Tensor:
    """Fill with zeros."""
    return constant_(tensor, 0.0)


def ones_(tensor) -> ct.Tensor:
    """Fill with ones."""
    return constant_(tensor, 1.0)


def xavier_uniform_(tensor, gain: float = 1.0, generator=None) -> ct.Tensor:
    """Glorot uniform: U(-t, t) with ``t = gain * sqrt(6 / (fan_in + fan_out))``.

    >>> nn.init.xavier_uniform_(attn.in_proj_weight)
    """
    _check("xavier_uniform_", tensor)
    fan_in, fan_out = _fans("xavier_uniform_", tensor)
    bound = math.sqrt(3.0) * gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return uniform_(tensor, -bound, bound, generator)


def xavier_normal_(tensor, gain: float = 1.0, generator=None) -> ct.Tensor:
    """Glorot normal: N(0, std^2) with ``std = gain * sqrt(2 / (fan_in + fan_out))``."""
    _check("xavier_normal_", tensor)
    fan_in, fan_out = _fans("xavier_normal_", tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / float(fan_in + fan_out)), generator)


def kaiming_uniform_(tensor, a: float = 0.0, mode: str = "fan_in",
                     nonlinearity: str = "leaky_relu", generator=None) -> ct.Tensor:
    """He uniform: U(-t, t) with ``t = gain / sqrt(fan) * sqrt(3)``, ``gain =
    calculate_gain(nonlinearity, a)`` (``a=sqrt(5)`` is ``nn.Linear``'s default init).

    >>> nn.init.kaiming_uniform_(w, a=math.sqrt(5))
    """
    _check("kaiming_uniform_", tensor)
    fan = _fan("kaiming_uniform_", tensor, mode)
    if fan == 0:  # a zero-element tensor: nothing to fill (PyTorch warns and returns)
        return tensor
    bound = math.sqrt(3.0) * calculate_gain(nonlinearity, a) / math.sqrt(fan)
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor, a: float = 0.0, mode: str = "fan_in",
                    nonlinearity: str = "leaky_relu", generator=None) -> ct.Tensor:
    """He normal: N(0, std^2) with ``std = gain / sqrt(fan)``.

    >>> nn.init.kaiming_normal_(w, mode="fan_out", nonlinearity="relu")
    """
    _check("kaiming_normal_", tensor)
    fan = _fan("kaiming_normal_", tensor, mode)
    if fan == 0:
        return tensor
    return normal_(tensor, 0.0, calculate_gain(nonlinearity, a) / math.sqrt(fan), generator)
