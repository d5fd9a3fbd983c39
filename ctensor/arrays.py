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


def to_host(arr) -> np.ndarray:
    """``arr`` as a NumPy array (a device-to-host copy for CuPy arrays, else no copy)."""
    if is_host(arr):
        return np.asarray(arr)
    return arr.get()


def to_device(arr, device: str):
    """``arr`` in ``device``'s array module (no copy when it is already there)."""
    if device == "cpu":
        return to_host(arr)
    return array_module(device).asarray(arr)
