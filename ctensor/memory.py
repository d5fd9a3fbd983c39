"""Bytes of shards held, per rank and kind, now and at peak: what ``ct.debug.memory()`` reads.

While tracking is on (:func:`ctensor.debug.track_memory`), every tensor made registers the
arrays behind its shards: each array is reduced to the buffer that owns its memory (the
root of its ``.base`` chain, so views, ``detach()`` and the per-gradient slices of a
bucket count once), and that buffer is counted once per rank holding it until it is
freed (a ``weakref.finalize`` on the buffer). Each buffer has one kind:

* ``parameters`` — shards of an ``nn.Parameter``;
* ``gradients`` — a leaf's ``.grad`` as ``backward()`` leaves it;
* ``optimizer`` — optimizer states (tagged by ``ctensor.optim`` after each step);
* ``activations`` — everything else a tensor holds: activations saved for the backward,
  temporaries, gathered parameters (fully sharded data parallel), boxed copies.

Arrays that never become a tensor (scratch inside a kernel, communication buffers) are not
seen. Off (the default), the only cost is one flag test per tensor made.
"""
from __future__ import annotations

import gc
import weakref

__all__ = ["KINDS", "tracking", "enable", "disable", "track", "tag", "reset_peak", "snapshot"]

KINDS = ("parameters", "gradients", "optimizer", "activations")
DEFAULT_KIND = "activations"

tracking = False
_tensor_class = None  # set by tensor.py (which imports this module): what enable() scans for
_buffers: dict = {}   # id(buffer) -> [kind, {rank: nbytes}, finalizer]
_current: dict = {}   # rank -> {kind: bytes}
_peak: dict = {}      # rank -> {kind: bytes}
_total: dict = {}     # rank -> bytes
_peak_total: dict = {}  # rank -> bytes


def _root(arr):
    """The array that owns ``arr``'s memory (NumPy and CuPy views keep it in ``.base``)."""
    while True:
        base = getattr(arr, "base", None)
        if base is None or not hasattr(base, "nbytes") or not hasattr(base, "shape"):
            return arr
        arr = base


def _add(rank: int, kind: str, nbytes: int) -> None:
    cur = _current.setdefault(rank, dict.fromkeys(KINDS, 0))
    peak = _peak.setdefault(rank, dict.fromkeys(KINDS, 0))
    cur[kind] += nbytes
    if cur[kind] > peak[kind]:
        peak[kind] = cur[kind]
    total = _total[rank] = _total.get(rank, 0) + nbytes
    if total > _peak_total.get(rank, 0):
        _peak_total[rank] = total


def _sub(rank: int, kind: str, nbytes: int) -> None:
    _current[rank][kind] -= nbytes
    _total[rank] -= nbytes


def _release(key: int) -> None:
    entry = _buffers.pop(key, None)
    if entry is not None:
        for rank, nbytes in entry[1].items():
            _sub(rank, entry[0], nbytes)


def _move(entry, kind: str) -> None:
    if entry[0] == kind:
        return
    for rank, nbytes in entry[1].items():
        _sub(rank, entry[0], nbytes)
        _add(rank, kind, nbytes)
    entry[0] = kind


def _pointer(arr) -> int:
    try:
        return int(arr.__array_interface__["data"][0])  # NumPy
    except (AttributeError, TypeError, KeyError):
        try:
            return int(arr.data.ptr)  # CuPy
        except AttributeError:
            return id(arr)


def _set_bytes(entry, rank: int, nbytes: int) -> None:
    old = entry[1].get(rank, 0)
    if nbytes != old:
        entry[1][rank] = nbytes
        if nbytes > old:
            _add(rank, entry[0], nbytes - old)
        else:
            _sub(rank, entry[0], old - nbytes)


def track(tensor, kind: str | None = None) -> None:
    """Count the buffers behind ``tensor``'s shards (called for every tensor made while
    tracking is on). ``kind=None``: the tensor type's (``parameters`` for a Parameter);
    a buffer already counted under a kind other than ``activations`` keeps it.

    A buffer held by one rank counts whole. A buffer whose views several ranks hold (in a
    simulation, where a collective may hand each rank a slice of one result) counts, for
    each rank, the bytes of that rank's own views: what the rank would hold on its own."""
    kind = kind or getattr(type(tensor), "_memory_kind", DEFAULT_KIND)
    for rank, arr in tensor._shards.items():
        root = _root(arr)
        key = id(root)
        entry = _buffers.get(key)
        if entry is None:
            try:
                finalizer = weakref.finalize(root, _release, key)
            except TypeError:  # an array type without weak references: not seen
                continue
            finalizer.atexit = False
            entry = _buffers[key] = [kind, {}, finalizer, {}, int(root.nbytes)]
        elif entry[0] == DEFAULT_KIND and kind != DEFAULT_KIND:
            _move(entry, kind)
        views = entry[3]
        view = (_pointer(arr), int(arr.nbytes))
        mine = views.setdefault(rank, set())
        if view in mine:
            continue
        mine.add(view)
        whole = entry[4]
        if len(views) == 1:
            _set_bytes(entry, rank, whole)
        else:  # shared between ranks: each rank its own views
            for r, vs in views.items():
                _set_bytes(entry, r, min(whole, sum(n for _, n in vs)))


def tag(tensor, kind: str) -> None:
    """Count ``tensor``'s buffers under ``kind`` from now on (no-op unless tracking)."""
    if not tracking:
        return
    if kind not in KINDS:
        raise ValueError(f"tag_memory: argument 'kind' must be one of {KINDS}, got {kind!r}")
    track(tensor, kind)
    for arr in tensor._shards.values():
        entry = _buffers.get(id(_root(arr)))
        if entry is not None:
            _move(entry, kind)


def _clear() -> None:
    for entry in _buffers.values():
        entry[2].detach()
    for table in (_buffers, _current, _peak, _total, _peak_total):
        table.clear()


def register_tensor_class(cls: type) -> None:
    """Name the tensor class :func:`enable` looks for among live objects (tensor.py calls this
    once; importing it here would close an import cycle)."""
    global _tensor_class
    _tensor_class = cls


def enable() -> None:
    """Start counting: from now on, and every tensor alive now (found once through the
    garbage collector's list of objects)."""
    global tracking
    if tracking:
        return
    _clear()
    tracking = True
    gc.collect()  # unreachable tensors (cycles not yet collected) are not held
    for obj in gc.get_objects():
        if _tensor_class is not None and isinstance(obj, _tensor_class):
            track(obj)
            grad = obj.grad
            if grad is not None and obj.is_leaf:
                tag(grad, "gradients")


def disable() -> None:
    """Stop counting and forget every figure."""
    global tracking
    tracking = False
    _clear()


def reset_peak() -> None:
    """Set every peak to what is held now."""
    for rank, cur in _current.items():
        _peak[rank] = dict(cur)
        _peak_total[rank] = _total.get(rank, 0)


def snapshot(rank: int) -> tuple:
    """``(current by kind, peak by kind, peak total)`` of ``rank`` (zeros if unseen)."""
    zeros = dict.fromkeys(KINDS, 0)
    return (dict(_current.get(rank, zeros)), dict(_peak.get(rank, zeros)),
            _peak_total.get(rank, 0))
