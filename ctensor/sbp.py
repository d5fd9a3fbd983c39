"""SBP values (split / broadcast / partial) and the shard arithmetic behind them.

An SBP says how a logical tensor is laid out over one mesh axis:

* ``split(d)`` (printed ``S(d)``): dim ``d`` is cut into consecutive parts, one per
  rank of the axis, by the uneven rule below;
* ``broadcast`` (``B``): every rank of the axis holds the whole value;
* ``partial_sum`` / ``partial_max`` / ``partial_min`` (``P``, ``P(max)``, ``P(min)``):
  every rank holds an array of the full shape and the logical value is the
  reduction of those arrays over the axis.

Uneven rule (one rule everywhere): a dim of size ``n`` split over ``k`` ranks gives
part ``i`` the size ``n // k + (1 if i < n % k else 0)``, in order. Parts may be
empty. Nested splits of one dim over several mesh axes split in mesh-axis order.

This module is pure: no communication, no arrays beyond NumPy scalars.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

__all__ = [
    "SBP", "Split", "Broadcast", "Partial", "ReduceOp", "split", "broadcast",
    "partial_sum", "partial_max", "partial_min", "split_sizes", "split_range",
    "local_region", "local_shape", "normalize_sbp", "format_sbp", "without_partial",
    "dual",
]


class ReduceOp(enum.Enum):
    """The reduction a partial tensor stands for."""

    SUM = "sum"
    MAX = "max"
    MIN = "min"

    def identity(self, dtype: np.dtype):
        """The value that leaves the reduction unchanged (0, -inf, +inf, or int limits)."""
        dtype = np.dtype(dtype)
        if self is ReduceOp.SUM:
            return dtype.type(0)
        if dtype.kind == "b":
            return dtype.type(self is ReduceOp.MIN)
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            return dtype.type(info.min if self is ReduceOp.MAX else info.max)
        return dtype.type(-np.inf if self is ReduceOp.MAX else np.inf)

    def reduce(self, xp, a, b):
        """Elementwise combination of two arrays with this reduction."""
        if self is ReduceOp.SUM:
            return a + b
        return xp.maximum(a, b) if self is ReduceOp.MAX else xp.minimum(a, b)


class SBP:
    """Base class of the three SBP kinds; instances are immutable and compare by value."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Split(SBP):
    """``S(dim)``: the tensor is cut along ``dim`` into one part per rank of the mesh axis.

    >>> ct.sbp.split(0)
    S(0)
    """

    dim: int

    def __post_init__(self):
        if isinstance(self.dim, bool) or not isinstance(self.dim, (int, np.integer)):
            raise TypeError(f"sbp.split: argument 'dim' must be an int, got {self.dim!r} "
                            f"({type(self.dim).__name__})")
        object.__setattr__(self, "dim", int(self.dim))

    def __repr__(self) -> str:
        return f"S({self.dim})"


@dataclass(frozen=True, slots=True)
class Broadcast(SBP):
    """``B``: every rank of the mesh axis holds the whole value."""

    def __repr__(self) -> str:
        return "B"

    def __call__(self) -> "Broadcast":  # ``sbp.broadcast()`` reads naturally too
        return self


@dataclass(frozen=True, slots=True)
class Partial(SBP):
    """``P`` / ``P(max)`` / ``P(min)``: the value is the reduction of the ranks' arrays."""

    op: ReduceOp = ReduceOp.SUM

    def __repr__(self) -> str:
        return "P" if self.op is ReduceOp.SUM else f"P({self.op.value})"

    def __call__(self) -> "Partial":
        return self


split = Split
broadcast = Broadcast()
partial_sum = Partial(ReduceOp.SUM)
partial_max = Partial(ReduceOp.MAX)
partial_min = Partial(ReduceOp.MIN)


def without_partial(sbp: Iterable) -> tuple:
    """``sbp`` with every partial entry replaced by broadcast: the layout a partial tensor
    has once it is reduced (splits stay).

    >>> ct.sbp.without_partial((ct.sbp.partial_sum, ct.sbp.split(0)))
    (B, S(0))
    """
    return tuple(broadcast if isinstance(s, Partial) else s for s in sbp)


def dual(sbp: Iterable) -> tuple:
    """The SBP of a gradient that flows back through a layout: broadcast <-> partial sum
    (a replicated value's gradient is the sum of every replica's contribution; a partial
    value's gradient is the same on every rank); splits stay.

    >>> ct.sbp.dual((ct.sbp.broadcast, ct.sbp.split(1)))
    (P, S(1))
    """
    return tuple(partial_sum if isinstance(s, Broadcast) else
                 broadcast if isinstance(s, Partial) else s for s in sbp)


def format_sbp(sbp: Iterable) -> str:
    """``(S(0), B)`` style text of an SBP tuple (any entries are shown by their repr)."""
    return "(" + ", ".join(repr(s) for s in sbp) + ")"


def normalize_sbp(sbp, mesh_ndim: int, ndim: int, fn: str = "to_global") -> tuple[SBP, ...]:
    """Validate an SBP argument and return it as a tuple with non-negative split dims.

    A single SBP is accepted for a 1-D mesh. Raises ``TypeError``/``ValueError`` naming
    ``fn`` and what was accepted.
    """
    if isinstance(sbp, SBP):
        sbp = (sbp,)
    elif isinstance(sbp, list):
        sbp = tuple(sbp)
    if not isinstance(sbp, tuple):
        raise TypeError(f"{fn}: argument 'sbp' must be an SBP (ct.sbp.split(d), ct.sbp.broadcast, "
                        f"ct.sbp.partial_sum, ...) or a tuple of them, got {sbp!r} "
                        f"({type(sbp).__name__})")
    if len(sbp) != mesh_ndim:
        raise ValueError(f"{fn}: argument 'sbp' has {len(sbp)} entries {format_sbp(sbp)} but the "
                         f"placement's mesh has {mesh_ndim} axes; give one SBP per mesh axis")
    out = []
    for entry in sbp:
        if not isinstance(entry, SBP):
            raise TypeError(f"{fn}: argument 'sbp' must hold SBP values (ct.sbp.split(d), "
                            f"ct.sbp.broadcast, ct.sbp.partial_sum, ...), got {entry!r} "
                            f"({type(entry).__name__})")
        if isinstance(entry, Split):
            d = entry.dim
            if not -ndim <= d < ndim:
                raise ValueError(f"{fn}: argument 'sbp' has {entry!r} but the tensor has {ndim} "
                                 f"dims; accepted split dims are {-ndim}..{ndim - 1}"
                                 if ndim else
                                 f"{fn}: argument 'sbp' has {entry!r} but a 0-dim tensor cannot be "
                                 f"split; use ct.sbp.broadcast or a partial SBP")
            entry = Split(d % ndim)
        out.append(entry)
    return tuple(out)


def split_sizes(n: int, k: int) -> list[int]:
    """Sizes of the ``k`` parts of a dim of size ``n`` under the uneven rule."""
    q, r = divmod(n, k)
    return [q + (1 if i < r else 0) for i in range(k)]


def split_range(n: int, k: int, i: int) -> tuple[int, int]:
    """``(start, stop)`` of part ``i`` of ``k`` of a dim of size ``n``."""
    q, r = divmod(n, k)
    start = i * q + min(i, r)
    return start, start + q + (1 if i < r else 0)


def local_region(shape: Sequence[int], sbp: Sequence[SBP], mesh_shape: Sequence[int],
              coord: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """The ``(start, stop)`` per dim of the logical region held at mesh coordinate ``coord``.

    Splits of one dim over several mesh axes nest in mesh-axis order. Partial and
    broadcast axes hold the whole range (a partial rank's array covers the full region).
    """
    box = [(0, n) for n in shape]
    for axis, entry in enumerate(sbp):
        if isinstance(entry, Split):
            start, stop = box[entry.dim]
            a, b = split_range(stop - start, mesh_shape[axis], coord[axis])
            box[entry.dim] = (start + a, start + b)
    return tuple(box)


def local_shape(shape: Sequence[int], sbp: Sequence[SBP], mesh_shape: Sequence[int],
                coord: Sequence[int]) -> tuple[int, ...]:
    """Shape of the shard held at mesh coordinate ``coord``."""
    return tuple(b - a for a, b in local_region(shape, sbp, mesh_shape, coord))
