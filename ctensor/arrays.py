"""Array-module helpers: which module (NumPy or CuPy) holds an array, and moves between them.

The one place that tells NumPy and CuPy arrays apart. CuPy is imported lazily (through
:mod:`ctensor._device`), so nothing here needs it on a CPU-only machine.
"""
from __future__ import annotations

import numpy as np

from . import _device

__all__ = ["array_module", "is_host", "to_host", "to_device"]


def is_host(arr) -> bool:
    """True for NumPy arrays and scalars (host memory), False for CuPy arrays."""
    return isinstance(arr, (np.ndarray, np.generic)) or \
        not type(arr).__module__.startswith("cupy")


def array_module(arr_or_device):
    """NumPy for ``cpu`` arrays/placements, CuPy for ``cuda`` ones (its GPU made current)."""
    if isinstance(arr_or_device, str):
        device = arr_or_device
    elif isinstance(arr_or_device, np.ndarray) or np.isscalar(arr_or_device):
        return np
    else:
        device = "cpu" if is_host(arr_or_device) else "cuda"
    if device == "cuda":  # CuPy on this rank's GPU, or an error saying what to install
        return _device.module()
    return np


def to_host(arr, explicit: bool = False) -> np.ndarray:
    """``arr`` as a NumPy array (a device-to-host copy for CuPy arrays, else no copy).

    ``explicit``: the user asked for this copy (``numpy()``, ``item()``, a checkpoint save);
    other copies count as implicit host synchronisations (``ct.debug.set_sync_debug_mode``).
    A device copy also brings the device-side checks recorded since the last one (ids out
    of range, bad targets: :func:`ctensor._device.check_later`) in the same transfer, and
    raises the first failed one's ``ValueError``."""
    if is_host(arr):
        return np.asarray(arr)
    if explicit:
        with _device.explicit():
            return _fetch(arr)
    return _fetch(arr)


def _fetch(arr) -> np.ndarray:
    _device.host_sync("a device array read on the host")
    pending = _device.pending_checks()
    if pending is None:
        return arr.get()
    xp, flat, messages = pending
    data = xp.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    host = xp.concatenate([data, flat.view(np.uint8)]).get()  # one copy for both
    n = int(data.size)
    _device.raise_checks(host[n:].copy().view(np.int64), messages)
    return host[:n].copy().view(arr.dtype).reshape(arr.shape)


def to_device(arr, device: str):
    """``arr`` in ``device``'s array module (no copy when it is already there)."""
    if device == "cpu":
        return to_host(arr)
    return array_module(device).asarray(arr)
