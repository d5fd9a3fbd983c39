"""Checks of integer data (ids, indices, targets) that never stop a GPU for a flag.

On the host (NumPy shards) a check reads its values at once and raises a ``ValueError``
in the call, as always. On a device (CuPy shards) reading them would be a device->host
round trip per call: the check is recorded as device values instead
(:func:`ctensor._device.check_later`) and its ``ValueError`` is raised, naming the op and the
values, at the next explicit transfer (``numpy()``, ``item()``: the loss a training loop
prints), in the same copy.
"""
from __future__ import annotations

from .. import _device
from ..arrays import is_host

__all__ = ["check_range", "check_where"]


def check_range(xp, key, values, size: int, message, low_end: int = 0,
                error: type = ValueError) -> None:
    """Every value in ``[low_end, size)``, else ``error(message(min, max))``."""
    if not values.size:
        return
    low, high = values.min(), values.max()
    if is_host(values):
        if low < low_end or high >= size:
            raise error(message(int(low), int(high)))
        return
    _device.check_later(xp, (key, size, low_end), (low < low_end) | (high >= size), low, high,
                        message, error)


def check_where(xp, key, bad, values, message) -> None:
    """No ``bad`` entry, else ``ValueError(message(v, v))`` with ``v`` the first bad value
    (on a device: the smallest bad one)."""
    if not bad.size:
        return
    if is_host(bad):
        if bad.any():
            v = int(values[bad].reshape(-1)[0])
            raise ValueError(message(v, v))
        return
    picked = xp.where(bad, values, values.max()).min()
    _device.check_later(xp, key, bad.any(), picked, picked, message)
