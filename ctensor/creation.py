"""Constructors: ``tensor``, ``from_local``, ``zeros``, ``ones``, ``full``, ``arange``, ``eye``,
``linspace``, ``logspace``, ``from_numpy``, ``as_tensor`` and the ``*_like`` forms.

Every constructor builds only the shards this process holds, straight from the logical
description; the only one that communicates is :func:`from_local`, which checks the shards
that the ranks passed in against the uneven-split rule.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import numpy as np

from . import datacheck, debug
from .executor import new_tensor
from .layout import Layout
from .meta import MetaBuffer, for_world
from .placement import Placement
from ._args import unpack_sizes
from .registry import OPS, OpRecord
from .arrays import array_module, is_host, to_host
from .runtime import get_default_dtype, world
from .sbp import Broadcast, Partial, format_sbp, local_shape, normalize_sbp, without_partial
from .tensor import Tensor

__all__ = ["tensor", "from_local", "zeros", "ones", "full", "arange", "zeros_like",
           "ones_like", "full_like", "empty", "empty_like", "eye", "linspace", "logspace",
           "from_numpy", "as_tensor"]


def resolve(fn: str, shape, placement, sbp, dtype) -> Layout:
    """Check and default the (shape, placement, sbp, dtype) arguments of a constructor."""
    if placement is None:
        placement = Placement.all()
    elif not isinstance(placement, Placement):
        raise TypeError(f"{fn}: argument 'placement' must be a ct.placement, got "
                        f"{placement!r} ({type(placement).__name__})")
    placement.check_world(world().size, fn)
    try:
        shape = tuple(shape)
    except TypeError:
        raise TypeError(f"{fn}: argument 'shape' must be a sequence of non-negative ints, got "
                        f"{shape!r} ({type(shape).__name__})") from None
    for n in shape:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"{fn}: argument 'shape' must hold non-negative ints, got "
                             f"{shape!r}")
    shape = tuple(int(n) for n in shape)
    if math.prod(shape) >= 2**62:
        raise ValueError(f"{fn}: argument 'shape' {shape} has {math.prod(shape)} elements, "
                         f"more than any machine holds; accepted: shapes of fewer than 2**62 "
                         f"elements")
    if sbp is None:
        sbp = (Broadcast(),) * placement.ndim
    sbp = normalize_sbp(sbp, placement.ndim, len(shape), fn)
    try:
        dtype = np.dtype(get_default_dtype() if dtype is None else dtype)
    except TypeError as exc:
        raise TypeError(f"{fn}: argument 'dtype' is not a dtype: {dtype!r}") from exc
    if dtype.kind not in "biufc":
        raise TypeError(f"{fn}: argument 'dtype' must be a bool, integer, floating or complex "
                        f"dtype, got {dtype}")
    return Layout(shape, dtype, placement, sbp)


def generate(layout: Layout, fill: Callable, requires_grad: bool = False) -> Tensor:
    """A tensor whose every shard is ``fill(xp, region, dtype)`` (the logical values in region
    ``region``). Partial axes: the value sits at index 0 of each partial axis, the reduction's
    identity elsewhere, so the logical value is the stated one."""
    def shards() -> dict:  # (not called in a shape-only world: the layout is the tensor)
        xp = array_module(layout.placement.device)
        p = layout.placement
        partial_axes = [(a, s.op) for a, s in enumerate(layout.sbp) if isinstance(s, Partial)]
        made = {}
        for r in world().held_ranks:
            if r not in p:
                continue
            region = layout.region(r)
            coord = p.coord(r)
            ops = [op for a, op in partial_axes if coord[a] != 0]
            if ops:
                made[r] = xp.full(layout.local_shape(r), ops[0].identity(layout.dtype),
                                  dtype=layout.dtype)
            else:
                made[r] = xp.asarray(fill(xp, region, layout.dtype), dtype=layout.dtype)
        return made

    return new_tensor(layout, shards, requires_grad)


def _check_grad(fn: str, dtype: np.dtype, requires_grad: bool) -> None:
    if not isinstance(requires_grad, (bool, np.bool_)):
        raise TypeError(f"{fn}: argument 'requires_grad' must be True or False, got "
                        f"{requires_grad!r} ({type(requires_grad).__name__})")
    if requires_grad and dtype.kind not in "fc":
        raise ValueError(f"{fn}: requires_grad=True needs a floating dtype, got {dtype}")


def tensor(data, placement: Optional[Placement] = None, sbp=None, dtype=None,
           requires_grad: bool = False) -> Tensor:
    """A global tensor from its full logical value ``data`` (the same on every rank).

    >>> x = ct.tensor([[1., 2.], [3., 4.]], placement=ct.placement("cpu", [0, 1]),
    ...               sbp=ct.sbp.split(0))     # rank 0 holds row 0, rank 1 row 1
    """
    if isinstance(data, Tensor):
        raise TypeError("tensor: argument 'data' is already a ct.Tensor; use "
                        "x.to_global(placement, sbp) or x.to(dtype)")
    src = data if is_host(data) else to_host(data)
    if dtype is not None:
        try:
            dtype = np.dtype(dtype)
        except TypeError as exc:
            raise TypeError(f"tensor: argument 'dtype' is not a dtype: {dtype!r}") from exc
    try:
        if dtype is None and not isinstance(src, (np.ndarray, np.generic)):
            arr = np.asarray(src)
            if arr.dtype.kind == "f":
                arr = arr.astype(get_default_dtype())
        else:
            arr = np.asarray(src, dtype=dtype)
    except (ValueError, TypeError, OverflowError) as exc:
        raise ValueError(f"tensor: argument 'data' must be a number, a rectangular nested list "
                         f"or an array convertible to dtype {dtype}, got "
                         f"{type(data).__name__} ({exc})") from None
    if arr.dtype == object or arr.dtype.kind in "USV":
        raise TypeError(f"tensor: argument 'data' must be numeric (a number, nested list or "
                        f"array), got dtype {arr.dtype}")
    layout = resolve("tensor", arr.shape, placement, sbp, arr.dtype)
    _check_grad("tensor", layout.dtype, requires_grad)
    debug.check_same_data("tensor", arr, layout.placement)  # several processes: one all-reduce
    return generate(layout, lambda xp, region, dt: arr[tuple(slice(a, b) for a, b in region)].copy(),
                    requires_grad)


def from_local(local, placement: Placement, sbp, shape=None) -> Tensor:
    """A global tensor from the shards the ranks hold (collective: every rank calls it).

    ``local`` is this rank's array (``None`` outside the placement) or, in a simulation
    holding several ranks, a ``{rank: array}`` mapping. Shards must fit the uneven-split
    rule for the (given or inferred) logical ``shape``.

    >>> with ct.simulate(2):
    ...     x = ct.from_local({0: np.ones((3, 2)), 1: np.ones((2, 2))},
    ...                       ct.placement("cpu", [0, 1]), ct.sbp.split(0))   # shape (5, 2)
    """
    fn = "from_local"
    w = world()
    if not isinstance(placement, Placement):
        raise TypeError(f"{fn}: argument 'placement' must be a ct.placement, got "
                        f"{placement!r} ({type(placement).__name__})")
    placement.check_world(w.size, fn)
    return for_world(_from_local_arrays, _from_local_meta)(fn, local, placement, sbp, shape)


def _from_local_arrays(fn, local, placement, sbp, shape) -> Tensor:
    """:func:`from_local` in a world with data: every rank's shard, shapes exchanged."""
    w = world()
    held = [r for r in w.held_ranks if r in placement]
    try:
        arrays, problem = _local_arrays(fn, local, w, held, array_module(placement.device)), None
    except (ValueError, TypeError) as exc:  # this rank's 'local' alone may be bad: report it
        arrays, problem = {}, exc            # in the gather below, so no rank is left waiting
    # every rank of the world learns every shard's shape and dtype, so all of them (those
    # outside the placement too) build the same layout and raise the same errors; along a
    # broadcast mesh axis also its digest, checked once the layout is known
    digest = datacheck.enabled() and _may_broadcast(sbp)
    meta = {r: (f"{type(problem).__name__}: {problem}" if problem is not None else
                (tuple(arrays[r].shape), str(arrays[r].dtype),
                 datacheck.shard_digest(arrays[r]) if digest else None)
                if r in arrays else None)
            for r in w.held_ranks}
    world_ranks = tuple(range(w.size))
    listing = w.exchange(meta)
    failed = {r: m for r, m in zip(world_ranks, listing) if isinstance(m, str)}
    if problem is not None:
        raise problem
    if failed:
        raise ValueError(f"{fn}: ranks {sorted(failed)} passed an invalid argument 'local' "
                         f"({next(iter(failed.values()))}); every rank must pass its shard")
    everyone = {r: m for r, m in zip(world_ranks, listing) if r in placement}
    x = _assemble(fn, arrays, {r: m[:2] for r, m in everyone.items()}, placement, sbp, shape)
    if digest:
        digests = {r: m[2] for r, m in everyone.items()}
        problems = datacheck.broadcast_differences(placement, x.sbp, digests)
        if problems:
            raise ValueError(f"{fn}: the shards passed as argument 'local' differ where the "
                             f"SBP says they are equal: "
                             f"{datacheck._describe('the tensor', placement, x.sbp, problems, digests)}"
                             f". {datacheck.FIX}")
    return x


def _may_broadcast(sbp) -> bool:
    """Whether ``sbp`` (as passed to :func:`from_local`, not yet checked) has a broadcast
    entry, so the shards' digests are worth computing."""
    entries = sbp if isinstance(sbp, (tuple, list)) else (sbp,)
    return any(isinstance(s, Broadcast) for s in entries)


def _from_local_meta(fn, local, placement, sbp, shape) -> Tensor:
    """:func:`from_local` in a shape-only world: ``local`` is one array (or a mapping of
    arrays) giving the shard's shape and dtype, alike on every rank; without ``shape`` the
    logical shape is the shard's times the mesh sizes splitting each dim (an even split)."""
    sample = next(iter(local.values()), None) if isinstance(local, dict) else local
    if sample is None or not hasattr(sample, "shape") or not hasattr(sample, "dtype"):
        raise TypeError(f"{fn}: in a shape-only world (ct.simulate(n, meta=True)) argument "
                        f"'local' must be an array (or a {{rank: array}} mapping) whose shape "
                        f"and dtype stand for every rank's shard, got {type(local).__name__}")
    sbp_t = normalize_sbp(sbp, placement.ndim, len(sample.shape), fn)
    if shape is None:
        shape = list(sample.shape)
        for axis, entry in enumerate(sbp_t):
            if getattr(entry, "dim", None) is not None:
                shape[entry.dim] *= placement.shape[axis]
    layout = resolve(fn, shape, placement, sbp_t, sample.dtype)
    first = layout.local_shape(placement.rank_list[0])
    if tuple(sample.shape) != first:
        raise ValueError(f"{fn}: the shard of shape {tuple(sample.shape)} does not fit shape "
                         f"{layout.shape} with sbp {format_sbp(layout.sbp)} (rank "
                         f"{placement.rank_list[0]} holds {first})")
    return Tensor(layout, MetaBuffer.of(layout))


def _local_arrays(fn, local, w, held, xp) -> dict:
    """This process's ``{rank: array}`` from the ``local`` argument of :func:`from_local`."""
    if isinstance(local, dict):
        missing = [r for r in held if r not in local]
        extra = [r for r in local if r not in held]
        if missing or extra:
            raise ValueError(f"{fn}: argument 'local' must map every rank this process holds "
                             f"in the placement {held} to its array; missing {missing}, "
                             f"not held or not in the placement {extra}")
        arrays = dict(local)
    elif len(w.held_ranks) > 1:
        raise ValueError(f"{fn}: argument 'local' must be a {{rank: array}} mapping in a "
                         f"simulation of {w.size} ranks, got {type(local).__name__}")
    elif held and local is None:
        raise ValueError(f"{fn}: rank {held[0]} is in the placement but passed local=None")
    else:
        arrays = {held[0]: local} if held else {}
    try:
        return {r: xp.asarray(a) for r, a in arrays.items()}
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{fn}: argument 'local' must be an array (or a {{rank: array}} "
                         f"mapping) per rank, got an invalid value ({exc})") from None


def _assemble(fn, arrays, everyone, placement, sbp, shape) -> Tensor:
    shapes = {r: tuple(s) for r, (s, _) in everyone.items()}
    dtypes = {d for _, d in everyone.values()}
    if len(dtypes) != 1:
        raise ValueError(f"{fn}: ranks passed shards of different dtypes "
                         f"{ {r: d for r, (_, d) in everyone.items()} }; cast them to one dtype")
    ndims = {len(s) for s in shapes.values()}
    if len(ndims) != 1:
        raise ValueError(f"{fn}: ranks passed shards with different numbers of dims {shapes}")
    ndim = ndims.pop()
    sbp_t = normalize_sbp(sbp, placement.ndim, ndim, fn)
    if shape is None:
        shape = []
        for d in range(ndim):
            axes = [a for a, s in enumerate(sbp_t) if getattr(s, "dim", None) == d]
            total = 0
            for r in placement.rank_list:
                c = placement.coord(r)
                if all(c[a] == 0 for a in range(placement.ndim) if a not in axes):
                    total += shapes[r][d]
            shape.append(total if axes else shapes[placement.rank_list[0]][d])
    layout = resolve(fn, shape, placement, sbp_t, dtypes.pop())
    bad = {r: s for r, s in shapes.items()
           if s != local_shape(layout.shape, layout.sbp, placement.shape, placement.coord(r))}
    if bad:
        want = {r: layout.local_shape(r) for r in bad}
        raise ValueError(f"{fn}: shards do not fit the uneven-split rule for shape "
                         f"{layout.shape} with sbp {format_sbp(layout.sbp)}: given {bad}, "
                         f"expected {want} (part i of n split over k has n//k + (i < n%k))")
    return Tensor(layout, arrays)


def full(*size, fill_value=None, placement=None, sbp=None, dtype=None,
         requires_grad: bool = False) -> Tensor:
    """A tensor of ``size`` filled with ``fill_value`` (``ct.full((2, 3), 7.0)``)."""
    return _full("full", size, fill_value, placement, sbp, dtype, requires_grad)


def _full(fn, size, fill_value, placement, sbp, dtype, requires_grad) -> Tensor:
    if fill_value is None:
        if len(size) >= 2 and not isinstance(size[-1], (tuple, list)):
            *size, fill_value = size
            size = tuple(size)
        else:
            raise TypeError(f"{fn}: missing argument 'fill_value'")
    shape = unpack_sizes(size)
    if not isinstance(fill_value, (bool, int, float, complex, np.number, np.bool_)):
        raise TypeError(f"{fn}: argument 'fill_value' must be a number, got {fill_value!r} "
                        f"({type(fill_value).__name__})")
    if dtype is None:
        dtype = (np.dtype(bool) if isinstance(fill_value, bool) else
                 np.dtype(np.int64) if isinstance(fill_value, int) else None)
    layout = resolve(fn, shape, placement, sbp, dtype)
    _check_grad(fn, layout.dtype, requires_grad)
    try:
        np.full((), fill_value, dtype=layout.dtype)
    except (OverflowError, ValueError, TypeError) as exc:
        raise ValueError(f"{fn}: argument 'fill_value' {fill_value!r} does not fit dtype "
                         f"{layout.dtype} ({exc})") from None
    return generate(layout, lambda xp, region, dt: xp.full(tuple(b - a for a, b in region),
                                                        fill_value, dtype=dt), requires_grad)


def zeros(*size, placement=None, sbp=None, dtype=None, requires_grad: bool = False) -> Tensor:
    """A tensor of zeros (``ct.zeros(4, 8, placement=p, sbp=ct.sbp.split(0))``)."""
    return _full("zeros", unpack_sizes(size), 0.0 if dtype is None else 0,
                 placement, sbp, dtype, requires_grad)


def ones(*size, placement=None, sbp=None, dtype=None, requires_grad: bool = False) -> Tensor:
    """A tensor of ones; with a partial SBP the logical value is still ones."""
    return _full("ones", unpack_sizes(size), 1.0 if dtype is None else 1,
                 placement, sbp, dtype, requires_grad)


def empty(*size, placement=None, sbp=None, dtype=None, requires_grad: bool = False) -> Tensor:
    """Same as :func:`zeros` (shards are always initialised)."""
    return zeros(*size, placement=placement, sbp=sbp, dtype=dtype, requires_grad=requires_grad)


def arange(start, end=None, step=1, placement=None, sbp=None, dtype=None,
           requires_grad: bool = False) -> Tensor:
    """``start, start+step, ...`` below ``end`` (``ct.arange(10, sbp=ct.sbp.split(0))``)."""
    if end is None:
        start, end = 0, start
    for name, v in (("start", start), ("end", end), ("step", step)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer,
                                                                  np.floating)):
            raise TypeError(f"arange: argument {name!r} must be a real number, got {v!r} "
                            f"({type(v).__name__})")
        if (isinstance(v, int) and abs(v) >= 2**63) or not np.isfinite(float(v)):
            raise ValueError(f"arange: argument {name!r} must be finite and fit int64, got "
                             f"{v!r}")
    if step == 0:
        raise ValueError("arange: argument 'step' must be non-zero")
    n = max(0, int(np.ceil((end - start) / step)))
    if dtype is None:
        ints = all(isinstance(v, (int, np.integer)) for v in (start, end, step))
        dtype = np.int64 if ints else None
    layout = resolve("arange", (n,), placement, sbp, dtype)
    _check_grad("arange", layout.dtype, requires_grad)
    return generate(layout, lambda xp, region, dt: (start + step * xp.arange(region[0][0], region[0][1]))
                    .astype(dt), requires_grad)


def _like(fn, x, fill, dtype, placement, sbp, requires_grad):
    return full(x.shape, fill_value=fill, placement=placement or x.placement,
                sbp=sbp if sbp is not None else without_partial(x.sbp),
                dtype=dtype or x.dtype, requires_grad=requires_grad)


def zeros_like(x: Tensor, dtype=None, placement=None, sbp=None, requires_grad=False) -> Tensor:
    """Zeros with ``x``'s shape, dtype, placement and (non-partial) SBP."""
    return _like("zeros_like", x, 0, dtype, placement, sbp, requires_grad)


def ones_like(x: Tensor, dtype=None, placement=None, sbp=None, requires_grad=False) -> Tensor:
    """Ones with ``x``'s shape, dtype, placement and (non-partial) SBP."""
    return _like("ones_like", x, 1, dtype, placement, sbp, requires_grad)


def full_like(x: Tensor, fill_value, dtype=None, placement=None, sbp=None,
              requires_grad=False) -> Tensor:
    return _like("full_like", x, fill_value, dtype, placement, sbp, requires_grad)


def empty_like(x: Tensor, dtype=None, placement=None, sbp=None, requires_grad=False) -> Tensor:
    """A tensor with ``x``'s shape, dtype, placement and (non-partial) SBP, its values
    unspecified (ctensor fills it with zeros: shards are always initialised)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"empty_like: argument 'input' must be a ct.Tensor, got "
                        f"{type(x).__name__}")
    return _like("empty_like", x, 0, dtype, placement, sbp, requires_grad)


def eye(n: int, m: Optional[int] = None, *, placement=None, sbp=None, dtype=None,
        requires_grad: bool = False) -> Tensor:
    """The ``n x m`` (default ``n x n``) matrix with ones on the diagonal; each rank builds
    only its shard.

    >>> i = ct.eye(4, sbp=ct.sbp.split(0))
    """
    sizes = []
    for name, v in (("n", n), ("m", n if m is None else m)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"eye: argument {name!r} must be an int >= 0, got {v!r}")
        sizes.append(int(v))
    layout = resolve("eye", tuple(sizes), placement, sbp, dtype)
    _check_grad("eye", layout.dtype, requires_grad)

    def fill(xp, region, dt):
        (r0, r1), (c0, c1) = region
        return (xp.arange(r0, r1)[:, None] == xp.arange(c0, c1)[None, :]).astype(dt)
    return generate(layout, fill, requires_grad)


def _real(fn: str, name: str, v) -> float:
    if isinstance(v, Tensor):
        if v.numel() != 1:
            raise ValueError(f"{fn}: argument {name!r} must be a number or a one-element "
                             f"tensor, got shape {tuple(v.shape)}")
        v = v.item()
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer,
                                                              np.floating)):
        raise TypeError(f"{fn}: argument {name!r} must be a real number, got {v!r} "
                        f"({type(v).__name__})")
    return v


def _steps(fn: str, steps) -> int:
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
        raise ValueError(f"{fn}: argument 'steps' must be an int >= 0, got {steps!r}")
    return int(steps)


def linspace(start, end, steps: int, *, placement=None, sbp=None, dtype=None,
             requires_grad: bool = False) -> Tensor:
    """``steps`` evenly spaced values from ``start`` to ``end`` inclusive (PyTorch's formula:
    ``start + i * step`` for the first half, ``end - (steps - 1 - i) * step`` for the rest,
    ``step = (end - start) / (steps - 1)``, in the dtype for floating dtypes and in float64
    for integer ones; the default float dtype unless ``dtype``).

    >>> ct.linspace(0, 1, 5)          # 0, 0.25, 0.5, 0.75, 1
    """
    start, end = _real("linspace", "start", start), _real("linspace", "end", end)
    steps = _steps("linspace", steps)
    layout = resolve("linspace", (steps,), placement, sbp, dtype)
    _check_grad("linspace", layout.dtype, requires_grad)
    dt = layout.dtype
    work = dt if dt.kind in "fc" else np.dtype(np.float64)
    lo, hi = np.array(start).astype(dt).astype(work), np.array(end).astype(dt).astype(work)
    step = ((hi - lo) / work.type(max(steps - 1, 1))).item()
    # Python numbers (exact copies of the work-dtype values) do not widen the work dtype's
    # arrays, in NumPy and CuPy alike, so the arithmetic below is done in that dtype
    lo, hi = lo.item(), hi.item()
    half = max(steps // 2, 1)  # one step: [start], as PyTorch

    def fill(xp, region, dt):
        i = xp.arange(region[0][0], region[0][1])
        first = lo + step * i.astype(work)
        second = hi - step * (steps - 1 - i).astype(work)
        return xp.where(i < half, first, second).astype(dt)
    return generate(layout, fill, requires_grad)


def logspace(start, end, steps: int, base: float = 10.0, *, placement=None, sbp=None,
             dtype=None, requires_grad: bool = False) -> Tensor:
    """``base ** e`` for ``steps`` exponents ``e`` evenly spaced from ``start`` to ``end``
    (PyTorch's formula: exponents in float64 as in :func:`linspace`, the power in float64,
    then cast).

    >>> ct.logspace(-3, 0, 4)          # 0.001, 0.01, 0.1, 1
    """
    start, end = _real("logspace", "start", start), _real("logspace", "end", end)
    base = float(_real("logspace", "base", base))
    steps = _steps("logspace", steps)
    layout = resolve("logspace", (steps,), placement, sbp, dtype)
    _check_grad("logspace", layout.dtype, requires_grad)
    dt = layout.dtype
    lo, hi = np.array(start).astype(dt), np.array(end).astype(dt)
    step = float(hi - lo) / max(steps - 1, 1)
    lo, hi = float(lo), float(hi)
    half = max(steps // 2, 1)  # one step: [base ** start], as PyTorch

    def fill(xp, region, dt):
        i = xp.arange(region[0][0], region[0][1])
        e = xp.where(i < half, lo + step * i, hi - step * (steps - 1 - i))
        return xp.power(base, e).astype(dt)
    return generate(layout, fill, requires_grad)


def from_numpy(ndarray: np.ndarray, placement: Optional[Placement] = None, sbp=None) -> Tensor:
    """A global tensor of the NumPy array's value and dtype (the same array on every rank).
    Unlike PyTorch's, it copies: each rank keeps its shard, and writes to the array later
    do not show in the tensor.

    >>> x = ct.from_numpy(np.arange(6.0).reshape(2, 3))        # float64
    """
    if not isinstance(ndarray, np.ndarray):
        raise TypeError(f"from_numpy: expected np.ndarray (got {type(ndarray).__name__}); "
                        f"use ct.tensor(data) for lists and numbers")
    return tensor(ndarray, placement=placement, sbp=sbp)


def as_tensor(data, dtype=None, placement: Optional[Placement] = None, sbp=None) -> Tensor:
    """``data`` as a ct.Tensor: a ct.Tensor itself (cast to ``dtype``, moved to
    ``placement``/``sbp`` when they are given and differ), anything else as
    :func:`tensor` makes it (a copy: a rank's shard is its own).

    >>> x = ct.as_tensor([1, 2, 3], dtype=ct.float32)
    """
    if isinstance(data, Tensor):
        if placement is not None or sbp is not None:
            data = data.to_global(placement, sbp)
        return data if dtype is None else data.to(dtype)
    return tensor(data, placement=placement, sbp=sbp, dtype=dtype)


# constructors the Tensor type and autograd call through the op registry
for _fn in (tensor, zeros_like, ones_like, full_like):
    OPS.declare(OpRecord(_fn.__name__, _fn))
