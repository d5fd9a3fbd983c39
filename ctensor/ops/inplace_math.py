"""In-place forms of issue 25's elementwise ops, with ``ctensor/ops/inplace.py``'s rules
(the out-of-place op, then one write into ``x``'s shards in its own layout; a leaf that
requires grad refuses them while grad mode is on): ``floor_ ceil_ trunc_ round_ clip_
nan_to_num_ remainder_`` (``%=``) ``fmod_ floor_divide_`` (``//=``).
"""
from __future__ import annotations

from ..registry import OPS
from ._rules import defop
from .inplace import update

__all__ = ["floor_", "ceil_", "trunc_", "round_", "clip_", "nan_to_num_", "remainder_",
           "fmod_", "floor_divide_"]


def _unary(name: str):
    fn = getattr(OPS, name[:-1])

    def front(x):
        return update(name, x, fn, ())
    front.__name__ = name
    front.__doc__ = f"``x = {name[:-1]}(x)`` in place (returns ``x``)."
    return defop(name, method=True)(front)


def _binary(name: str):
    fn = getattr(OPS, name[:-1])

    def front(x, other):
        return update(name, x, lambda t: fn(t, other), (other,))
    front.__name__ = name
    front.__doc__ = f"``x = {name[:-1]}(x, other)`` in place (returns ``x``)."
    return defop(name, method=True)(front)


floor_, ceil_, trunc_ = _unary("floor_"), _unary("ceil_"), _unary("trunc_")
remainder_, fmod_, floor_divide_ = _binary("remainder_"), _binary("fmod_"), \
    _binary("floor_divide_")


@defop(method=True)
def round_(x, decimals: int = 0):
    """``x = round(x, decimals)`` in place (halves to even)."""
    return update("round_", x, lambda t: OPS.round(t, decimals), ())


@defop(method=True)
def clip_(x, min=None, max=None):  # noqa: A002 - PyTorch's names
    """``x = clip(x, min, max)`` in place (``clamp_``'s other name)."""
    return update("clip_", x, lambda t: OPS.clip(t, min, max), (min, max))


@defop(method=True)
def nan_to_num_(x, nan: float = 0.0, posinf: float = None, neginf: float = None):
    """``x = nan_to_num(x, nan, posinf, neginf)`` in place."""
    return update("nan_to_num_", x, lambda t: OPS.nan_to_num(t, nan, posinf, neginf), ())
