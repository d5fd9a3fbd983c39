"""The multi-tensor update (PyTorch's ``foreach``): one kernel per group of parameters laid
out alike, over one flat buffer per rank.

A step of a model with many small parameters is otherwise a few ops per parameter, each
paying dispatch (four ops and two layout checks per parameter for AdamW: about a third of
a data-parallel GPT step at h=128, found with ``ct.debug.profile()``). Parameters of one
parameter group with the same placement, SBP and dtype, whose states are laid out like
them and whose gradients already are in that layout (after ``backward()``'s bucketed
all-reduce they are), are updated together:

* the gradients are read in place when they are consecutive views of one buffer (the
  gradient bucket's flat storage, as ``backward()`` leaves them), else concatenated;
* the states live in one flat buffer per rank, updated in place (as PyTorch's), and each
  state tensor is a view of it (``state_dict`` sees ordinary tensors whose values, as in
  PyTorch, move on with later steps; a loaded or replaced state is gathered again);
* a large parameter (a quarter of :data:`SLICE` or more) is updated by the kernel in its
  own array when this process holds one rank (in a simulation ranks may share arrays);
  smaller ones are gathered into buffers of at most a slice, updated by the same kernel,
  and written back into their own shards in place (their identity and in-place write
  count as ``copy_`` keeps them).

The arithmetic is elementwise and the same as the per-parameter kernel's, in the same
order, so the bits are the same. The kernel's temporaries are a few times a chunk's size:
:data:`CHUNK` bounds a chunk (parameters past it start another). Anything else (sharded
states, a gradient in another layout, shape-only tensors, mixed steps) takes the
per-parameter path. :func:`clip_grad_norm` is the gradient clip's multi-tensor path (in a
shape-only run too: the same collectives as a real step).
"""
from __future__ import annotations

import math

import numpy as np

import ctensor as ct
from ctensor.arrays import array_module
from ctensor.layout import Layout
from ctensor.meta import local_arrays
from ctensor.tensor import Tensor

__all__ = ["plan_groups", "FlatStates", "CHUNK"]

#: the most elements one multi-tensor kernel call takes (its temporaries are a few times
#: this; a longer group is cut into chunks of whole parameters)
CHUNK = 2 ** 22

#: on the host, the kernel runs over slices of this many elements of the flat buffers: its
#: dozen elementwise passes then read and write a slice in the core's cache (256 KiB of
#: float32 a buffer) instead of memory (the same arithmetic per element, so the same bits;
#: the AdamW kernel over the GPT's 867k parameters: 3.2-3.4 ms whole, 2.2-2.6 ms sliced)
SLICE = 2 ** 16


def plan_groups(optimizer, group: dict, names: tuple) -> tuple:
    """Split ``group``'s parameters with a gradient into ``(flat, single)``: ``flat`` maps a
    key to the parameters updated together, ``single`` the rest (one by one)."""
    flat: dict = {}
    single = []
    for p in group["params"]:
        g = p.grad
        if g is None:
            continue
        layout = p._layout
        if local_arrays(p) is None or local_arrays(g) is None or \
                g._layout != layout or optimizer.state_layout(p) != (layout.placement,
                                                                     layout.sbp) or \
                layout.dtype.kind != "f":
            single.append(p)
            continue
        state = optimizer.state.get(id(p))
        step = state.get("step") if state else 0
        if state and any(not isinstance(state.get(n), Tensor) or
                         state[n]._layout != layout for n in names):
            single.append(p)
            continue
        flat.setdefault((layout.placement, layout.sbp, layout.dtype, step), []).append(p)
    return flat, single


def _consecutive(arrays: list):
    """The 1-D buffer that ``arrays`` are consecutive C-contiguous views of, in order (or
    None): read in place instead of concatenated."""
    first = arrays[0]
    base = first.base
    if base is None or not all(a.flags.c_contiguous and a.base is base for a in arrays):
        return None
    if not isinstance(base, np.ndarray) or base.ndim != 1 or not base.flags.c_contiguous:
        return None
    item = first.itemsize
    start = (first.__array_interface__["data"][0] - base.__array_interface__["data"][0])
    if start % item:
        return None
    pos = start
    for a in arrays:
        if a.__array_interface__["data"][0] - base.__array_interface__["data"][0] != pos:
            return None
        pos += a.nbytes
    return base[start // item:pos // item]


def _gather(xp, arrays: list):
    """One flat array of ``arrays`` (read in place when they already are one)."""
    if xp is np:
        joined = _consecutive(arrays)
        if joined is not None:
            return joined
    return xp.concatenate([a.reshape(-1) for a in arrays]) if len(arrays) > 1 else \
        arrays[0].reshape(-1).copy()


def adam_kernel(xp, p, g, m, v, lr, beta1, beta2, eps, weight_decay, decoupled, step):
    """``ct.fused_adam``'s kernel (the same operations in the same order, so the same
    bits) updating ``p``, ``m`` and ``v`` in place: flat buffers this module owns."""
    if weight_decay and decoupled:
        p *= 1.0 - lr * weight_decay
    elif weight_decay:
        g = g + p * weight_decay
    m *= beta1
    m += g * (1.0 - beta1)
    gg = g * g
    gg *= 1.0 - beta2
    v *= beta2
    v += gg
    denom = xp.sqrt(v)
    denom /= math.sqrt(1.0 - beta2 ** step)
    denom += eps
    update = xp.divide(m, denom, out=gg)  # (gg is free again: one array fewer)
    update *= lr / (1.0 - beta1 ** step)
    p -= update


class FlatStates:
    """The flat state buffers of one group of parameters: ``{name: {rank: 1-D array}}`` and
    the state tensors that are views of them (to notice a state replaced from outside)."""

    def __init__(self, params: list, names: tuple):
        self.ids = tuple(id(p) for p in params)
        self.names = names
        self.flats: dict = {n: {} for n in names}  # (empty on a rank outside the placement)
        self.views: dict = {}  # name -> [state tensor per parameter]

    def valid(self, params: list, states: list) -> bool:
        return self.ids == tuple(id(p) for p in params) and all(
            all(s.get(n) is v for s, v in zip(states, self.views[n])) for n in self.names)


def apply(params: list, states: list, cache: "FlatStates | None", names: tuple, kernel,
          **attrs) -> "FlatStates":
    """Run ``kernel(xp, P, G, *states, **attrs)``, which updates ``P`` (a gathered copy of
    the parameters) and the flat states in place, over one flat buffer per rank for
    ``params`` (laid out alike, states initialised; see the module docstring); write the
    parameters back in place. Returns the flat states to reuse at the next step."""
    fresh = cache is None or not cache.valid(params, states)
    if fresh:
        cache = FlatStates(params, names)
    writes = []  # (rank, [(parameter index, its offset)], their new values in one array)
    ranges = {}  # rank -> the parameters' offsets in the flat buffers
    alone = len(params[0]._shards) == 1  # one rank in this process: no shard is shared
    for rank, p0 in params[0]._shards.items():  # every rank's update before any write: in
        xp = array_module(p0)                   # a simulation ranks may share an array
        shards = [p._shards[rank] for p in params]
        offsets = ranges[rank] = np.cumsum([0] + [a.size for a in shards]).tolist()
        if fresh:  # (copies: the states' own buffers may be shared)
            for n in names:
                cache.flats.setdefault(n, {})[rank] = xp.concatenate(
                    [s[n]._shards[rank].reshape(-1) for s in states]).astype(p0.dtype,
                                                                            copy=False)
        G = _gather(xp, [p.grad._shards[rank] for p in params])
        flats = [cache.flats[n][rank] for n in names]
        for lo, hi, run, direct in _runs(shards, offsets, alone):
            if direct:  # a large parameter updated where it lies
                P = shards[run[0]].reshape(-1)
            else:  # small ones gathered (a copy: written back below)
                P = xp.concatenate([shards[i].reshape(-1) for i in run])
                writes.append((rank, [(i, offsets[i] - lo) for i in run], P))
            _sliced(xp, kernel, [P, G[lo:hi]] + [f[lo:hi] for f in flats], attrs)
    for rank, members, new in writes:  # in place, as copy_ writes
        for i, lo in members:
            p = params[i]
            a = p._shards[rank]
            if isinstance(a, np.ndarray) and not a.flags.writeable:
                a = p._shards[rank] = a.copy()  # never into a shared read-only shard
            a[...] = new[lo:lo + a.size].reshape(a.shape)
    for p in params:
        p._version.value += 1
    if not fresh:  # the state tensors are views of the flat buffers, written in place
        for n in names:
            for t in cache.views[n]:
                t._version.value += 1
        return cache
    for n in names:
        views = []
        for i, (p, s) in enumerate(zip(params, states)):
            shards = {rank: flat[ranges[rank][i]:ranges[rank][i + 1]].reshape(
                p._shards[rank].shape) for rank, flat in cache.flats[n].items()}
            s[n] = Tensor(p._layout, shards)
            ct.debug.tag_memory(s[n], "optimizer")
            views.append(s[n])
        cache.views[n] = views
    return cache


def _runs(shards: list, offsets: list, alone: bool) -> list:
    """The parameters of one rank as ``(lo, hi, indices, direct)`` runs of the flat buffers:
    a large parameter alone, ``direct`` (updated where it lies) when this process holds one
    rank (no shard is shared) and its shard is a writable C-contiguous array; smaller ones
    together, at most :data:`SLICE` elements a run (gathered, written back)."""
    runs, run = [], []
    for i, a in enumerate(shards):
        if alone and a.size >= SLICE // 4 and a.flags.c_contiguous and \
                (not isinstance(a, np.ndarray) or a.flags.writeable):
            if run:
                runs.append((offsets[run[0]], offsets[i], run, False))
                run = []
            runs.append((offsets[i], offsets[i + 1], [i], True))
            continue
        if run and offsets[i + 1] - offsets[run[0]] > SLICE:
            runs.append((offsets[run[0]], offsets[i], run, False))
            run = []
        run.append(i)
    if run:
        runs.append((offsets[run[0]], offsets[len(shards)], run, False))
    return runs


def _sliced(xp, kernel, flats: list, attrs: dict) -> None:
    """``kernel(xp, *flats, **attrs)`` (elementwise, in place), over slices of
    :data:`SLICE` elements on the host, in one call on a GPU."""
    n = flats[0].size
    if xp is not np or n <= SLICE:
        kernel(xp, *flats, **attrs)
        return
    for lo in range(0, n, SLICE):
        kernel(xp, *[f[lo:lo + SLICE] for f in flats], **attrs)


def _summed_sbp(layout):
    """The SBP of a 0-d sum over ``layout``'s local shards: partial (sum) along the mesh
    axes that split it (of more than one rank), broadcast along the others; None when an
    axis holds partial values (their squares do not add up: the per-gradient path)."""
    out = []
    for s, n in zip(layout.sbp, layout.placement.shape):
        if n == 1 or isinstance(s, ct.sbp.Broadcast):
            out.append(ct.sbp.broadcast)
        elif isinstance(s, ct.sbp.Split):
            out.append(ct.sbp.partial_sum)
        else:
            return None
    return tuple(out)


def clip_grad_norm(grads: list, max_norm, norm_type: float):
    """``nn.utils.clip_grad_norm_``'s multi-tensor path for the 2-norm of floating
    gradients split or broadcast in any way, on any placements: per rank, the squared sums
    of its shards (``abs``, ``pow``, ``sum``, the running ``add``: the per-gradient ops'
    kernels, in the gradients' order) per (placement, summed SBP); each such partial sum
    reduced and moved to the first gradient's placement once (one all-reduce for all the
    tensor-parallel gradients, not one each), added there, and the norm's ``pow``,
    ``add``, ``div``, ``clamp`` as ops; the scale applied in place (on the bucket's flat
    buffer when the gradients are views of it). Replicated gradients of one placement get
    the per-gradient path's bits. Shape-only, the same moves without values (so a plan
    counts the collectives a real step makes). Returns the norm (a 0-d tensor, replicated)
    or None when it does not apply (another norm, partial or integer gradients)."""
    if norm_type != 2.0 or not grads:
        return None
    dtype, home = grads[0].dtype, grads[0].placement
    parts: dict = {}  # (placement, summed SBP) -> {rank: running squared sum}
    for g in grads:
        layout = g._layout
        summed = _summed_sbp(layout)
        if summed is None or layout.dtype.kind != "f":
            return None
        arrays = local_arrays(g)
        if arrays is None:  # shape-only: no values, the same collectives (a plan counts them)
            parts.setdefault((layout.placement, summed), None)
            continue
        totals = parts.setdefault((layout.placement, summed), {})
        for rank, a in arrays.items():
            xp = array_module(a)
            part = xp.multiply(a, a).sum(axis=tuple(range(a.ndim)))  # (g * g, as the clip)
            if part.dtype != dtype:
                part = part.astype(dtype)
            total = totals.get(rank)
            totals[rank] = part if total is None else xp.add(total, part)
    replicated = (ct.sbp.broadcast,) * home.ndim
    per_placement: dict = {}  # placement -> the sum of its parts (partial where split)
    with ct.no_grad():
        for (placement, summed), shards in parts.items():
            t = ct.zeros((), dtype=dtype, placement=placement, sbp=summed) if shards is None \
                else Tensor(Layout((), dtype, placement, summed),
                            {r: array_module(v).asarray(v, dtype) for r, v in shards.items()})
            got = per_placement.get(placement)
            per_placement[placement] = t if got is None else got + t
        total = None
        for t in per_placement.values():  # reduced and moved once per placement
            t = t.to_global(home, replicated)
            total = t if total is None else total + t
        total = total ** (1.0 / norm_type)
        coef = ct.clamp(max_norm / (total + 1e-6), max=1.0)
        _scale(grads, coef)
    return total


def _scale(grads: list, coef) -> None:
    """Every gradient times ``coef`` (a 0-d replicated tensor) in place: per placement and
    dtype, on the flat buffer when the gradients are consecutive views of one."""
    groups: dict = {}
    for g in grads:
        groups.setdefault((g._layout.placement, g._layout.dtype), []).append(g)
    for (placement, dtype), members in groups.items():
        c = coef if placement == coef.placement else \
            coef.to_global(placement, (ct.sbp.broadcast,) * placement.ndim)
        values = local_arrays(c)
        if values is None:  # shape-only: nothing to scale (the move above is what is sent)
            continue
        for rank, value in values.items():  # (after every rank's norm: ranks may share
            shards = [g._shards[rank] for g in members]  # arrays in a simulation)
            xp = array_module(shards[0])
            value = xp.asarray(value, dtype)
            flat = _consecutive(shards) if xp is np else None
            if flat is not None and all(a.flags.writeable for a in shards):
                flat *= value
                continue
            for g in members:
                a = g._shards[rank]
                if isinstance(a, np.ndarray) and not a.flags.writeable:
                    a = g._shards[rank] = a.copy()
                a *= value
    for g in grads:
        g._version.value += 1


def chunks(params: list) -> list:
    """``params`` cut into runs of whole parameters of at most :data:`CHUNK` elements each
    (one parameter longer than that is a run of its own)."""
    runs, run, size = [], [], 0
    for p in params:
        n = p.numel()
        if run and size + n > CHUNK:
            runs.append(run)
            run, size = [], 0
        run.append(p)
        size += n
    return runs + [run] if run else runs
