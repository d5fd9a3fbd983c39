"""Host memory for training loops: glibc ``malloc`` told to keep what a step frees.

A training step allocates and frees the same arrays step after step (activations, their
gradients, temporaries of 0.1-30 MiB). glibc's allocator serves arrays above its mmap
threshold with fresh ``mmap``s and gives the top of its heap back to the system above its
trim threshold; both thresholds start low (128 KiB) and adapt only partly, so a step
of the GPT example on a CPU touched ~4,000 fresh pages (minor page faults, each a zeroed
4 KiB page) where the same NumPy step written by hand touched ~1,300, and most of them
again on the next step. Fixing both thresholds keeps the freed memory for the next
step: the faults fell 7-9x (one process and DP 2) with the same peak resident memory.

:func:`tune` (called when this module is imported, the first thing ``import ctensor``
does) sets ``M_MMAP_THRESHOLD`` to
:data:`MMAP_THRESHOLD` (glibc's largest, 32 MiB: larger arrays are still mapped and
unmapped each time) and ``M_TRIM_THRESHOLD`` to :data:`TRIM_THRESHOLD` (free memory at the
heap's top beyond it is given back). It does nothing where the C library is not glibc
(macOS, musl), where the user set either threshold (``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TRIM_THRESHOLD_``, ``GLIBC_TUNABLES``), or with ``CTENSOR_MALLOC_TUNE=0``.
:data:`tuned` says whether it did. The settings are the process's: everything else in it
(NumPy, a hand-written baseline in the same process) allocates the same way.
"""
from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["tune", "tuned", "MMAP_THRESHOLD", "TRIM_THRESHOLD"]

#: bytes from which an allocation is its own ``mmap`` (glibc's maximum for 64-bit)
MMAP_THRESHOLD = 32 * 1024 * 1024
#: bytes of free memory at the heap's top kept before any is given back to the system
TRIM_THRESHOLD = 256 * 1024 * 1024
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")

#: whether :func:`tune` set the thresholds in this process
tuned = False


def tune() -> bool:
    """Fix glibc's mmap and trim thresholds (see the module docstring); True if set."""
    global tuned
    if tuned:
        return True
    if os.environ.get("CTENSOR_MALLOC_TUNE", "1").strip() == "0" or \
            not sys.platform.startswith("linux") or \
            any(k in os.environ for k in _USER_SETTINGS):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc only (musl has a mallopt that does nothing)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    tuned = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
        bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return tuned


tune()
