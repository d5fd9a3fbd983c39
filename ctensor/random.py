"""Counter-based random numbers whose values do not depend on placement, SBP or world size.

A generator (:class:`Generator`; ``ct.default_generator`` unless a call passes
``generator=``) is a 64-bit seed and a 64-bit call counter. Every random call takes the next
*call counter* ``c`` of its generator (seed ``s``) and
defines the logical tensor elementwise: the element at row-major linear index ``i`` is a
pure function of ``(s, c, i)``, computed with Philox4x32-10 (key ``s``, counter built
from ``i``'s block and ``c``; the exact bit recipe is in :mod:`ctensor._philox`). Each rank
computes just its own shard from the logical region it holds, so ``ct.randn(8, 16)`` has the
same bits for every placement and SBP (split, nested, uneven, partial), world size,
simulation or MPI, NumPy or CuPy. Every call advances the counter by one on every process,
inside the placement or not, so ranks stay in step.

:func:`randperm` is defined over the logical index too: ``randperm(n)`` is the stable
argsort of ``n`` random 63-bit integers drawn in one call (element ``i`` the integer of index
``i``), so its shards do not depend on the layout either (each rank draws the ``n`` keys and
keeps its part of the order). The distributions of ``ctensor.ops.sampling``
(``uniform_ normal_ exponential_ bernoulli multinomial``) are maps of one such draw.

>>> ct.manual_seed(0)
>>> a = ct.randn(4, 6, placement=ct.placement("cpu", [0, 1]), sbp=ct.sbp.split(1))
>>> ct.manual_seed(0)
>>> b = ct.randn(4, 6)                       # same logical value, other layout
>>> bool((a.numpy() == b.numpy()).all())
True
"""
from __future__ import annotations

import os

import numpy as np

from ._args import unpack_sizes
from ._philox import Kind, Scratch, cuda_fill, elements_per_block, fill_blocks, philox4x32
from .creation import generate, resolve
from .layout import Layout
from .runtime import world
from .sbp import without_partial
from .tensor import Tensor

__all__ = ["Kind", "Generator", "default_generator", "manual_seed", "seed", "initial_seed",
           "get_state", "set_state", "next_key", "region", "draw", "rand", "randn", "randint",
           "rand_like", "randn_like", "randint_like", "randperm"]

DEFAULT_SEED = 0
_UINT64 = 1 << 64
_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
# blocks per vectorised step: the working arrays of Philox and Box-Muller stay in cache
_CHUNK_BLOCKS = 8192
_CHUNK_RANGE = np.arange(_CHUNK_BLOCKS, dtype=np.int64)


def _check_int(fn: str, arg: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{fn}: argument '{arg}' must be an int, got {value!r} "
                        f"({type(value).__name__})")
    return int(value)


def _check_state(fn: str, state) -> tuple:
    if not isinstance(state, dict) or set(state) != {"seed", "counter"}:
        raise TypeError(f"{fn}: argument 'state' must be a dict with keys 'seed' and "
                        f"'counter' (from get_state()), got {state!r}")
    values = []
    for name in ("seed", "counter"):
        v = _check_int(fn, f"state[{name!r}]", state[name])
        if not 0 <= v < _UINT64:
            raise ValueError(f"{fn}: state[{name!r}] must be in [0, 2**64), got {v}")
        values.append(v)
    return tuple(values)


class Generator:
    """A random-number generator (PyTorch's ``torch.Generator``): a 64-bit seed and a 64-bit
    call counter, nothing else, so the numbers it gives are the same for every layout,
    world size and device. Pass it as ``generator=`` to ``rand randn randint randperm
    rand_like randn_like multinomial bernoulli`` and the in-place ``uniform_ normal_
    exponential_ bernoulli_``; it advances on every process alike (every rank must make
    the same calls). ``device`` is accepted for PyTorch's signature; the bits do not depend
    on it.

    >>> g = ct.Generator().manual_seed(42)
    >>> a = ct.rand(3, generator=g)               # the default generator does not move
    >>> state = g.get_state(); b = ct.rand(3, generator=g)
    >>> g.set_state(state); bool((ct.rand(3, generator=g) == b).all())
    True
    """

    __slots__ = ("_seed", "_counter", "device")

    def __init__(self, device: str = "cpu"):
        device = getattr(device, "device", device)  # a ct.placement names its device too
        if device not in ("cpu", "cuda"):
            raise ValueError(f"Generator: argument 'device' must be 'cpu' or 'cuda', got "
                             f"{device!r}")
        self.device = device
        self._seed, self._counter = DEFAULT_SEED, 0

    def manual_seed(self, seed: int) -> "Generator":
        """Seed it and reset its counter (any int, taken modulo 2^64); returns it."""
        self._seed = _check_int("manual_seed", "seed", seed) % _UINT64
        self._counter = 0
        return self

    def seed(self) -> int:
        """Seed it from the operating system's entropy (rank 0's, sent to every rank:
        collective, every rank must call it) and return the seed."""
        w = world()
        mine = int.from_bytes(os.urandom(8), "little")
        values = w.exchange({r: mine for r in w.held_ranks})
        self.manual_seed(values[0] if values else mine)
        return self._seed

    def initial_seed(self) -> int:
        """The seed it was last given (``0`` for a fresh generator)."""
        return self._seed

    def get_state(self) -> dict:
        """``{"seed": int, "counter": int}``: everything it holds (for a checkpoint)."""
        return {"seed": self._seed, "counter": self._counter}

    def set_state(self, state: dict) -> "Generator":
        """Restore a state returned by :meth:`get_state`; returns it."""
        self._seed, self._counter = _check_state("set_state", state)
        return self

    def next_key(self) -> tuple:
        """``(seed, call)`` for one random call, advancing the counter."""
        key = (self._seed, self._counter)
        self._counter = (self._counter + 1) % _UINT64
        return key

    def __repr__(self) -> str:
        return f"ct.Generator(seed={self._seed}, counter={self._counter})"


#: the generator of every random call that passes no ``generator=``
default_generator = Generator()


def _generator(fn: str, generator) -> Generator:
    if generator is None:
        return default_generator
    if not isinstance(generator, Generator):
        raise TypeError(f"{fn}: argument 'generator' must be a ct.Generator, got "
                        f"{type(generator).__name__}")
    return generator


def manual_seed(seed: int) -> Generator:
    """Seed the default generator and reset its call counter (every rank must use the same
    seed); returns the default generator, as PyTorch.

    Any int is accepted and taken modulo 2^64 (so ``-1`` is ``2^64 - 1``).

    >>> ct.manual_seed(1234)
    """
    return default_generator.manual_seed(seed)


def seed() -> int:
    """Seed the default generator non-deterministically (rank 0's entropy, the same on
    every rank: collective) and return the seed."""
    return default_generator.seed()


def initial_seed() -> int:
    """The seed given to the last :func:`manual_seed` (``0`` by default)."""
    return default_generator.initial_seed()


def get_state() -> dict:
    """The default generator's state ``{"seed": int, "counter": int}``, e.g. for a
    checkpoint.

    >>> state = ct.random.get_state()
    >>> a = ct.rand(3); ct.random.set_state(state); b = ct.rand(3)    # a equals b
    """
    return default_generator.get_state()


def set_state(state: dict) -> None:
    """Restore a state returned by :func:`get_state` (``{"seed": s, "counter": c}``)."""
    default_generator.set_state(state)


def next_key(generator=None) -> tuple:
    """``(seed, call)`` for one random call of ``generator`` (default: the default one),
    advancing its counter (for kernels that draw their own numbers through :func:`region`;
    every rank must call it alike).

    >>> seed, call = ct.random.next_key()
    """
    return _generator("next_key", generator).next_key()


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


def draw(layout: Layout, kind: int, generator=None, requires_grad: bool = False, low: int = 0,
         span: int = 0) -> Tensor:
    """A random tensor of ``layout`` drawn with one call of ``generator`` (the default when
    None): each shard is its :func:`region` (the building block of every random function).

    >>> u = ct.random.draw(x._layout, ct.random.Kind.UNIFORM)
    """
    key = _generator("draw", generator).next_key()  # on every process, in the placement or not
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


def rand(*size, generator=None, placement=None, sbp=None, dtype=None,
         requires_grad: bool = False) -> Tensor:
    """Uniform numbers in ``[0, 1)`` (float32: 24 random bits, float64: 53).

    >>> ct.manual_seed(0)
    >>> x = ct.rand(4, 8, placement=ct.placement("cpu", [0, 1]), sbp=ct.sbp.split(0))
    """
    gen = _generator("rand", generator)
    layout = _float_layout("rand", unpack_sizes(size), placement, sbp, dtype, requires_grad)
    return draw(layout, Kind.UNIFORM, gen, requires_grad)


def randn(*size, generator=None, placement=None, sbp=None, dtype=None,
          requires_grad: bool = False) -> Tensor:
    """Standard normal numbers (Box-Muller on Philox bits).

    >>> ct.manual_seed(0)
    >>> w = ct.randn(16, 32, sbp=ct.sbp.broadcast, requires_grad=True)
    """
    gen = _generator("randn", generator)
    layout = _float_layout("randn", unpack_sizes(size), placement, sbp, dtype, requires_grad)
    return draw(layout, Kind.NORMAL, gen, requires_grad)


def randint(low, high=None, size=None, placement=None, sbp=None, dtype=None,
            requires_grad: bool = False, generator=None) -> Tensor:
    """Integers drawn uniformly from ``[low, high)`` (``randint(high, size)`` means low 0).

    >>> ids = ct.randint(0, 50, (4, 16), sbp=ct.sbp.split(0))        # int64
    >>> ids = ct.randint(50, (4, 16))
    """
    fn = "randint"
    gen = _generator(fn, generator)
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
    return draw(layout, Kind.INTEGER, gen, False, low, (high - low) % _UINT64)


def _like(fn: str, kind: int, x: Tensor, dtype, placement, sbp, requires_grad,
          generator) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{fn}: argument 'x' must be a ct.Tensor, got {type(x).__name__}")
    gen = _generator(fn, generator)
    if sbp is None:
        sbp = without_partial(x.sbp)
    layout = _float_layout(fn, x.shape, placement or x.placement, sbp,
                           x.dtype if dtype is None else dtype, requires_grad)
    return draw(layout, kind, gen, requires_grad)


def rand_like(x: Tensor, dtype=None, placement=None, sbp=None,
              requires_grad: bool = False, generator=None) -> Tensor:
    """:func:`rand` with ``x``'s shape, dtype, placement and SBP (partial axes become
    broadcast); the dropout mask is ``ct.rand_like(x) >= p``.

    >>> keep = ct.rand_like(h) >= 0.1
    """
    return _like("rand_like", Kind.UNIFORM, x, dtype, placement, sbp, requires_grad, generator)


def randn_like(x: Tensor, dtype=None, placement=None, sbp=None,
               requires_grad: bool = False, generator=None) -> Tensor:
    """:func:`randn` with ``x``'s shape, dtype, placement and SBP (partial axes become
    broadcast).

    >>> noise = ct.randn_like(h) * 0.01
    """
    return _like("randn_like", Kind.NORMAL, x, dtype, placement, sbp, requires_grad, generator)


def randint_like(x: Tensor, low, high=None, *, generator=None, dtype=None, placement=None,
                 sbp=None, requires_grad: bool = False) -> Tensor:
    """:func:`randint` with ``x``'s shape, dtype (a floating one holds the integers, as in
    PyTorch), placement and SBP (partial axes become broadcast); ``randint_like(x, high)``
    means ``low = 0``.

    >>> ids = ct.randint_like(tokens, 50257)
    """
    fn = "randint_like"
    if not isinstance(x, Tensor):
        raise TypeError(f"{fn}: argument 'input' must be a ct.Tensor, got {type(x).__name__}")
    if high is None:
        low, high = 0, low
    dtype = np.dtype(x.dtype if dtype is None else dtype)
    if dtype.kind not in "iuf":
        raise TypeError(f"{fn}: argument 'dtype' must be an integer or floating dtype, got "
                        f"{dtype}")
    if dtype.kind == "f" and max(abs(_check_int(fn, "low", low)),
                                 abs(_check_int(fn, "high", high))) > \
            2 ** (np.finfo(dtype).nmant + 1):
        raise ValueError(f"{fn}: [low, high) = [{low}, {high}) holds integers that {dtype} "
                         f"does not represent exactly; use a wider dtype")
    if requires_grad and dtype.kind != "f":
        raise ValueError(f"{fn}: requires_grad=True needs a floating dtype, got {dtype}")
    out = randint(low, high, x.shape, placement=placement or x.placement,
                  sbp=without_partial(x.sbp) if sbp is None else sbp,
                  dtype=dtype if dtype.kind in "iu" else np.int64, generator=generator)
    if dtype.kind == "f":
        out = out.to(dtype)
        out.requires_grad = bool(requires_grad)
    return out


def randperm(n: int, *, generator=None, dtype=None, placement=None, sbp=None,
             requires_grad: bool = False) -> Tensor:
    """A random permutation of ``0 .. n-1`` (int64 unless ``dtype``): the stable argsort of
    ``n`` random 63-bit integers drawn in one call, so the same for every layout (each rank
    draws the ``n`` keys, O(n log n), and keeps its part).

    >>> order = ct.randperm(10, sbp=ct.sbp.split(0))
    """
    fn = "randperm"
    gen = _generator(fn, generator)
    n = _check_int(fn, "n", n)
    if n < 0:
        raise ValueError(f"{fn}: argument 'n' must be >= 0, got {n}")
    layout = resolve(fn, (n,), placement, sbp, np.int64 if dtype is None else dtype)
    kind = layout.dtype.kind
    exact = (np.iinfo(layout.dtype).max if kind in "iu" else
             2 ** (np.finfo(layout.dtype).nmant + 1) if kind == "f" else -1)
    if n - 1 > exact:  # every integer up to n - 1 must be exact in the dtype
        raise TypeError(f"{fn}: argument 'dtype' must be an integer or floating dtype that "
                        f"holds 0..{n - 1} exactly, got {layout.dtype}; use ct.int64")
    if requires_grad and layout.dtype.kind != "f":
        raise ValueError(f"{fn}: requires_grad=True needs a floating dtype, got {layout.dtype}")
    key = gen.next_key()
    whole = ((0, n),)

    def fill(xp, box, dtype):
        keys = region(Kind.INTEGER, (n,), whole, np.int64, key, xp, 0, 1 << 63)
        order = xp.argsort(keys, kind="stable") if xp is np else xp.argsort(keys)
        return order[box[0][0]:box[0][1]].astype(dtype)
    return generate(layout, fill, requires_grad)
