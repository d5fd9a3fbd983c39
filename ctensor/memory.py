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

In a shape-only world (``ct.simulate(n, meta=True)``) a tensor's shards are one
:class:`~ctensor.meta.MetaBuffer` for all its ranks; it is counted the same way, once per
buffer, as vectors over the world's ranks (no loop over ranks), and buffers made by boxing
are also summed apart (:func:`meta_peaks`' ``boxing``: part of ``activations``).
"""
from __future__ import annotations

import gc
import weakref

import numpy as np

from .meta import for_shards

__all__ = ["KINDS", "tracking", "enable", "disable", "track", "tag", "reset_peak", "snapshot",
           "meta_peaks"]

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
    shards = tensor._shards
    # {rank: array}, or one MetaBuffer for all ranks (shape-only)
    for_shards(shards, _track_arrays, _meta.track)(shards, kind)


def _track_arrays(shards: dict, kind: str) -> None:
    for rank, arr in shards.items():
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
    for_shards(tensor._shards, _tag_arrays, _meta.tag)(tensor._shards, kind)


def _tag_arrays(shards: dict, kind: str) -> None:
    for arr in shards.values():
        entry = _buffers.get(id(_root(arr)))
        if entry is not None:
            _move(entry, kind)


def _clear() -> None:
    _meta.clear()
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
    _meta.reset_peak()
    for rank, cur in _current.items():
        _peak[rank] = dict(cur)
        _peak_total[rank] = _total.get(rank, 0)


def snapshot(rank: int, meta: bool = False) -> tuple:
    """``(current by kind, peak by kind, peak total)`` of ``rank`` (zeros if unseen);
    ``meta``: the figures of shape-only buffers."""
    if meta:
        return _meta.snapshot(rank)
    zeros = dict.fromkeys(KINDS, 0)
    return (dict(_current.get(rank, zeros)), dict(_peak.get(rank, zeros)),
            _peak_total.get(rank, 0))


def meta_peaks(size: int | None = None) -> dict:
    """Shape-only runs: ``{kind: int64 array over world ranks}`` of peak bytes per kind,
    plus ``"total"`` (the peak of the sum, not the sum of peaks), ``"boxing"`` (peak of the
    buffers boxing made, counted within ``activations``) and ``"current_<kind>"``.
    ``size``: every array that long (ranks beyond it dropped, missing ones zero); default:
    as far as the highest rank seen."""
    out = _meta.peaks()
    if size is not None:
        for k, v in out.items():
            out[k] = np.pad(v[:size], (0, max(0, size - v.size)))
    return out


class _MetaAccount:
    """The figures of shape-only buffers: one int64 vector over world ranks per kind."""

    KEYS = KINDS + ("boxing",)

    def __init__(self) -> None:
        self.size = 0
        self.buffers: dict = {}  # id(buffer) -> [kind, its sizes, finalizer]
        self.clear()

    def clear(self) -> None:
        for entry in getattr(self, "buffers", {}).values():
            entry[2].detach()
        self.buffers = {}
        self.size = 0
        self.cur = {k: np.zeros(0, np.int64) for k in self.KEYS}
        self.peak = {k: np.zeros(0, np.int64) for k in self.KEYS}
        self.total = np.zeros(0, np.int64)
        self.peak_total = np.zeros(0, np.int64)

    def _grow(self, n: int) -> None:
        if n <= self.size:
            return
        pad = lambda a: np.concatenate([a, np.zeros(n - a.size, np.int64)])  # noqa: E731
        for table in (self.cur, self.peak):
            for k in table:
                table[k] = pad(table[k])
        self.total, self.peak_total = pad(self.total), pad(self.peak_total)
        self.size = n

    def _add(self, buffer, kind: str, sign: int) -> None:
        ranks = buffer.placement.ranks.reshape(-1)
        nbytes = buffer.nbytes if isinstance(buffer.nbytes, int) else \
            np.asarray(buffer.nbytes).reshape(-1)
        self._grow(int(ranks.max()) + 1)
        kinds = (kind, "boxing") if buffer.boxing and kind == DEFAULT_KIND else (kind,)
        for k in kinds:
            self.cur[k][ranks] += sign * nbytes
            if sign > 0:
                self.peak[k][ranks] = np.maximum(self.peak[k][ranks], self.cur[k][ranks])
        self.total[ranks] += sign * nbytes
        if sign > 0:
            self.peak_total[ranks] = np.maximum(self.peak_total[ranks], self.total[ranks])

    def _release(self, key: int) -> None:
        entry = self.buffers.pop(key, None)
        if entry is not None:
            self._add(entry[1], entry[0], -1)

    def track(self, buffer, kind: str) -> None:
        key = id(buffer)
        entry = self.buffers.get(key)
        if entry is None:
            # the finalizer must not hold the buffer: it keeps a stand-in of its size
            stand_in = _Sized(buffer.placement, buffer.nbytes, buffer.boxing)
            finalizer = weakref.finalize(buffer, self._release, key)
            finalizer.atexit = False
            self.buffers[key] = [kind, stand_in, finalizer]
            self._add(stand_in, kind, 1)
        elif entry[0] == DEFAULT_KIND and kind != DEFAULT_KIND:
            self.tag(buffer, kind)

    def tag(self, buffer, kind: str) -> None:
        entry = self.buffers.get(id(buffer))
        if entry is None or entry[0] == kind:
            return
        self._add(entry[1], entry[0], -1)
        entry[0] = kind
        self._add(entry[1], kind, 1)

    def reset_peak(self) -> None:
        for k in self.KEYS:
            self.peak[k] = self.cur[k].copy()
        self.peak_total = self.total.copy()

    def snapshot(self, rank: int) -> tuple:
        if rank >= self.size:
            zeros = dict.fromkeys(KINDS, 0)
            return dict(zeros), dict(zeros), 0
        return ({k: int(self.cur[k][rank]) for k in KINDS},
                {k: int(self.peak[k][rank]) for k in KINDS}, int(self.peak_total[rank]))

    def peaks(self) -> dict:
        out = {k: self.peak[k].copy() for k in self.KEYS}
        out["total"] = self.peak_total.copy()
        for k in self.KEYS:
            out["current_" + k] = self.cur[k].copy()
        out["current_total"] = self.total.copy()
        return out


class _Sized:
    """What the accounting keeps of a shape-only buffer: its ranks and sizes."""

    __slots__ = ("placement", "nbytes", "boxing")

    def __init__(self, placement, nbytes, boxing) -> None:
        self.placement, self.nbytes, self.boxing = placement, nbytes, boxing


_meta = _MetaAccount()
