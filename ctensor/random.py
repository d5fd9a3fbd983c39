"""Counter-based random numbers whose values do not depend on placement, SBP or world size.

Every random call takes the next *call counter* ``c`` of the generator (seed ``s``) and
defines the logical tensor elementwise: the element at row-major linear index ``i`` is a
pure function of ``(s, c, i)``, computed with Philox4x32-10 (key ``s``, counter built
from ``i``'s block and ``c``; the exact bit recipe is in :mod:`ctensor._philox`). Each rank
computes just its own shard from the logical region it holds, so ``ct.randn(8, 16)`` has the
same bits for every placement and SBP (split, nested, uneven, partial), world size,
simulation or MPI, NumPy or CuPy. Every call advances the counter by one on every process,
inside the placement or not, so ranks stay in step.

>>> ct.manual_seed(0)
>>> a = ct.randn(4, 6, placement=ct.placement("cpu", [0, 1]), sbp=ct.sbp.split(1))
>>> ct.manual_seed(0)
>>> b = ct.randn(4, 6)                       # same logical value, other layout
>>> bool((a.numpy() == b.numpy()).all())
True
"""
from __future__ import annotations

import numpy as np

from ._args import unpack_sizes
from ._philox import Kind, Scratch, cuda_fill, elements_per_block, fill_blocks, philox4x32
from .creation import generate, resolve
from .layout import Layout
from .sbp import without_partial
from .tensor import Tensor

__all__ = ["Kind", "manual_seed", "initial_seed", "get_state", "set_state", "next_key", "region",
           "rand", "randn", "randint", "rand_like", "randn_like"]

DEFAULT_SEED = 0
_UINT64 = 1 << 64
_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
# blocks per vectorised step: the working arrays of Philox and Box-Muller stay in cache
_CHUNK_BLOCKS = 8192
_CHUNK_RANGE = np.arange(_CHUNK_BLOCKS, dtype=np.int64)


class _Generator:
    """The generator's whole state: a 64-bit seed and a 64-bit call counter."""

    __slots__ = ("seed", "counter")

    def __init__(self, seed: int):
        self.seed = seed
        self.counter = 0


_generator = _Generator(DEFAULT_SEED)


def _check_int(fn: str, arg: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{fn}: argument '{arg}' must be an int, got {value!r} "
                        f"({type(value).__name__})")
    return int(value)


def manual_seed(seed: int) -> None:
    """Seed the generator and reset its call counter (every rank must use the same seed).

    Any int is accepted and taken modulo 2^64 (so ``-1`` is ``2^64 - 1``).

    >>> ct.manual_seed(1234)
    """
    _generator.seed = _check_int("manual_seed", "seed", seed) % _UINT64
    _generator.counter = 0


def initial_seed() -> int:
    """The seed given to the last :func:`manual_seed` (``0`` by default)."""
    return _generator.seed


def get_state() -> dict:
    """The generator's state ``{"seed": int, "counter": int}``, e.g. for a checkpoint.

    >>> state = ct.random.get_state()
    >>> a = ct.rand(3); ct.random.set_state(state); b = ct.rand(3)    # a equals b
    """
    return {"seed": _generator.seed, "counter": _generator.counter}


def set_state(state: dict) -> None:
    """Restore a state returned by :func:`get_state` (``{"seed": s, "counter": c}``)."""
    if not isinstance(state, dict) or set(state) != {"seed", "counter"}:
        raise TypeError(f"set_state: argument 'state' must be a dict with keys 'seed' and "
                        f"'counter' (from ct.random.get_state()), got {state!r}")
    values = {}
    for name in ("seed", "counter"):
        v = _check_int("set_state", f"state[{name!r}]", state[name])
        if not 0 <= v < _UINT64:
            raise ValueError(f"set_state: state[{name!r}] must be in [0, 2**64), got {v}")
        values[name] = v
    _generator.seed, _generator.counter = values["seed"], values["counter"]


def next_key() -> tuple:
    """``(seed, call)`` for one random call, advancing the counter (for kernels that draw
    their own numbers through :func:`region`; every rank must call it alike).

    >>> seed, call = ct.random.next_key()
    """
    key = (_generator.seed, _generator.counter)
    _generator.counter = (_generator.counter + 1) % _UINT64
    return key


# ------------------------------------------------------------------------------ one region
def _runs(shape: tuple, box: tuple):
    """The region as row-major runs of consecutive linear indices: ``(starts, length)``."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    strides.reverse()
    # the region's rows are contiguous over the trailing dims that it covers fully
    last = max((d for d, (a, b) in enumerate(box) if (a, b) != (0, shape[d])), default=-1)
    if last < 0:
        return np.zeros(1, np.int64), step
    length = (box[last][1] - box[last][0]) * strides[last]
    starts = np.array(box[last][0] * strides[last], dtype=np.int64)
    for d in range(last):
        starts = np.add.outer(starts, np.arange(*box[d], dtype=np.int64) * strides[d])
    return starts.reshape(-1), length


def _numpy_region(kind: int, shape: tuple, box: tuple, dtype: np.dtype, key: tuple,
                  low: int, span: int) -> np.ndarray:
    seed, call = key
    starts, length = _runs(shape, box)
    E = elements_per_block(kind, dtype)
    first, offsets = np.divmod(starts, E)
    uniform = bool((offsets == offsets[0]).all())
    # blocks per run: enough for the run's own offset, or for the worst offset (E - 1)
    per_run = ((int(offsets[0]) if uniform else E - 1) + length - 1) // E + 1
    total = len(starts) * per_run
    values = np.empty((total, E), dtype)
    scratch = Scratch()
    for q0 in range(0, total, _CHUNK_BLOCKS):
        size = min(_CHUNK_BLOCKS, total - q0)
        q = np.add(_CHUNK_RANGE[:size], q0, out=scratch("q", (_CHUNK_BLOCKS,), np.int64)[:size])
        if len(starts) == 1:
            q += first[0]
        else:
            run, within = np.divmod(q, per_run)
            np.take(first, run, out=q)
            q += within
        A, B = philox4x32(q.view(np.uint64), call, seed, scratch)
        fill_blocks(values[q0:q0 + size], A, B, kind, low, span, scratch)
    rows = values.reshape(len(starts), per_run * E)
    if uniform:
        return rows[:, int(offsets[0]):int(offsets[0]) + length]
    return np.take_along_axis(rows, offsets[:, None] + np.arange(length), axis=1)


def region(kind: int, shape: tuple, box: tuple, dtype, key: tuple, xp=np, low: int = 0,
           span: int = 0):
    """The values in the logical region ``box`` (``(start, stop)`` per dim) of the random
    tensor of ``shape`` drawn with ``key`` (from :func:`next_key`), as an ``xp`` array.

    ``kind`` is ``Kind.UNIFORM``, ``Kind.NORMAL`` or ``Kind.INTEGER`` (``low + (v mod span)``,
    span 0 meaning 2^64). Only the region is computed, never the whole tensor.

    >>> key = ct.random.next_key()
    >>> part = ct.random.region(ct.random.Kind.UNIFORM, (4, 6), ((0, 4), (2, 5)),
    ...                         np.float32, key)            # columns 2..4 of a (4, 6) draw
    """
    dtype = np.dtype(dtype)
    local = tuple(b - a for a, b in box)
    if 0 in local:
        return xp.empty(local, dtype)
    if xp is not np:  # CuPy: one elementwise kernel over the region's global indices
        idx = xp.zeros((), xp.uint64)
        stride = 1
        for d in reversed(range(len(shape))):
            axis = xp.arange(box[d][0], box[d][1], dtype=xp.uint64) * xp.uint64(stride)
            idx = idx + axis.reshape((-1,) + (1,) * (len(shape) - 1 - d))
            stride *= shape[d]
        return cuda_fill(xp, idx, dtype, kind, key[0], key[1], low, span)
    return _numpy_region(kind, tuple(shape), tuple(box), dtype, key, low, span).reshape(local)


def _draw(layout: Layout, kind: int, requires_grad: bool = False, low: int = 0,
          span: int = 0) -> Tensor:
    key = next_key()  # taken on every process, in the placement or not
    return generate(layout, lambda xp, box, dtype: region(kind, layout.shape, box, dtype, key,
                                                          xp, low, span), requires_grad)


# ------------------------------------------------------------------------------ public
def _float_layout(fn: str, shape, placement, sbp, dtype, requires_grad) -> Layout:
    layout = resolve(fn, shape, placement, sbp, dtype)
    if layout.dtype not in _FLOATS:
        raise TypeError(f"{fn}: argument 'dtype' must be float16, float32 or float64, got "
                        f"{layout.dtype}; draw floats and cast with .to(dtype), or use randint")
    if not isinstance(requires_grad, bool):
        raise TypeError(f"{fn}: argument 'requires_grad' must be a bool, got {requires_grad!r}")
    return layout


def rand(*size, placement=None, sbp=None, dtype=None, requires_grad: bool = False) -> Tensor:
    """Uniform numbers in ``[0, 1)`` (float32: 24 random bits, float64: 53).

    >>> ct.manual_seed(0)
    >>> x = ct.rand(4, 8, placement=ct.placement("cpu", [0, 1]), sbp=ct.sbp.split(0))
    """
    layout = _float_layout("rand", unpack_sizes(size), placement, sbp, dtype, requires_grad)
    return _draw(layout, Kind.UNIFORM, requires_grad)


def randn(*size, placement=None, sbp=None, dtype=None, requires_grad: bool = False) -> Tensor:
    """Standard normal numbers (Box-Muller on Philox bits).

    >>> ct.manual_seed(0)
    >>> w = ct.randn(16, 32, sbp=ct.sbp.broadcast, requires_grad=True)
    """
    layout = _float_layout("randn", unpack_sizes(size), placement, sbp, dtype, requires_grad)
    return _draw(layout, Kind.NORMAL, requires_grad)


def randint(low, high=None, size=None, placement=None, sbp=None, dtype=None,
            requires_grad: bool = False) -> Tensor:
    """Integers drawn uniformly from ``[low, high)`` (``randint(high, size)`` means low 0).

    >>> ids = ct.randint(0, 50, (4, 16), sbp=ct.sbp.split(0))        # int64
    >>> ids = ct.randint(50, (4, 16))
    """
    fn = "randint"
    if size is None:
        if not isinstance(high, (tuple, list)):
            raise TypeError(f"{fn}: argument 'size' is missing; call randint(low, high, size) "
                            f"or randint(high, size) with size a tuple, got high={high!r}")
        low, high, size = 0, low, high
    low = _check_int(fn, "low", low)
    high = _check_int(fn, "high", high)
    if low >= high:
        raise ValueError(f"{fn}: needs low < high, got low={low}, high={high}")
    shape = tuple(size) if isinstance(size, (tuple, list)) else (size,)
    layout = resolve(fn, shape, placement, sbp, np.int64 if dtype is None else dtype)
    if layout.dtype.kind not in "iu":
        raise TypeError(f"{fn}: argument 'dtype' must be an integer dtype (int8..int64, "
                        f"uint8..uint64), got {layout.dtype}; cast the result with .to(dtype)")
    if requires_grad:
        raise ValueError(f"{fn}: requires_grad=True needs a floating dtype, got {layout.dtype}")
    info = np.iinfo(layout.dtype)
    if low < info.min or high - 1 > info.max:
        raise ValueError(f"{fn}: [low, high) = [{low}, {high}) does not fit dtype "
                         f"{layout.dtype} (values {info.min}..{info.max})")
    return _draw(layout, Kind.INTEGER, False, low, (high - low) % _UINT64)


def _like(fn: str, kind: int, x: Tensor, dtype, placement, sbp, requires_grad) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{fn}: argument 'x' must be a ct.Tensor, got {type(x).__name__}")
    if sbp is None:
        sbp = without_partial(x.sbp)
    layout = _float_layout(fn, x.shape, placement or x.placement, sbp,
                           x.dtype if dtype is None else dtype, requires_grad)
    return _draw(layout, kind, requires_grad)


def rand_like(x: Tensor, dtype=None, placement=None, sbp=None,
              requires_grad: bool = False) -> Tensor:
    """:func:`rand` with ``x``'s shape, dtype, placement and SBP (partial axes become
    broadcast); the dropout mask is ``ct.rand_like(x) >= p``.

    >>> keep = ct.rand_like(h) >= 0.1
    """
    return _like("rand_like", Kind.UNIFORM, x, dtype, placement, sbp, requires_grad)


def randn_like(x: Tensor, dtype=None, placement=None, sbp=None,
               requires_grad: bool = False) -> Tensor:
    """:func:`randn` with ``x``'s shape, dtype, placement and SBP (partial axes become
    broadcast).

    >>> noise = ct.randn_like(h) * 0.01
    """
    return _like("randn_like", Kind.NORMAL, x, dtype, placement, sbp, requires_grad)
