"""CuPy and the GPU this process uses: the one place that imports CuPy (lazily).

Pure device handling, no communication and no other ctensor module: the array helpers and
the GPU communicators use it; :mod:`ctensor.cuda` is the public face. The GPU is chosen on
the first call of :func:`module`: under MPI the runtime first tells this module the
process's rank among those of its node (:func:`set_local_rank`), and the process takes GPU
``local_rank % device_count``; otherwise (one process, simulation) the current CuPy device,
which all simulated ranks share.
"""
from __future__ import annotations

from typing import Optional

__all__ = ["import_cupy", "is_available", "device_count", "module", "current_device",
           "set_local_rank", "INSTALL"]

INSTALL = ("pip install -e '.[gpu-cu13]' or '.[gpu-cu12]' (CuPy 14 and the NCCL runtime for "
           "your CUDA major version; nvidia-smi shows it), or any CuPy build matching your CUDA")

_cupy = None                   # set once CuPy works and this process's GPU is chosen
_device: Optional[int] = None
_local_rank: Optional[int] = None


def import_cupy():
    """The ``cupy`` module, or ``None`` when it cannot be imported."""
    try:
        import cupy
    except Exception:  # ImportError, or a broken install raising something else
        return None
    return cupy


def is_available() -> bool:
    """Whether CuPy imports and a CUDA GPU is visible."""
    if _cupy is not None:
        return True
    cupy = import_cupy()
    if cupy is None:
        return False
    try:
        return bool(cupy.is_available())
    except Exception:
        return False


def device_count() -> int:
    """Number of CUDA GPUs this process sees (0 without CuPy or without a GPU)."""
    cupy = import_cupy()
    if cupy is None:
        return 0
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # CUDARuntimeError: no driver, no device
        return 0


def set_local_rank(rank: int) -> None:
    """This process's rank among the processes of its node (set by the MPI runtime)."""
    global _local_rank
    _local_rank = int(rank)


def _fail(reason: str) -> RuntimeError:
    return RuntimeError(f"ct.placement('cuda', ...) {reason}")


def module():
    """CuPy, checked, with this process's GPU made current (chosen on the first call).

    Raises ``RuntimeError`` saying what to install when CuPy is missing, or that no GPU is
    visible.
    """
    global _cupy, _device
    if _cupy is not None:
        return _cupy
    cupy = import_cupy()
    if cupy is None:
        raise _fail(f"needs CuPy, which is not installed: {INSTALL}; or use "
                    f"ct.placement('cpu', ...)")
    try:
        visible = bool(cupy.is_available())
    except Exception:
        visible = False
    if not visible:
        raise _fail("needs a CUDA GPU, but no CUDA GPU is visible (cupy.is_available() is "
                    "False: check the NVIDIA driver and CUDA_VISIBLE_DEVICES); use "
                    "ct.placement('cpu', ...) on this machine")
    if _local_rank is not None:
        # one GPU per process of a node, round robin when ranks outnumber GPUs
        _device = _local_rank % int(cupy.cuda.runtime.getDeviceCount())
        cupy.cuda.Device(_device).use()
    else:
        _device = int(cupy.cuda.Device().id)
    _cupy = cupy
    return cupy


def current_device() -> int:
    """The GPU index this process uses for ``cuda`` placements (chooses it if needed)."""
    module()
    return int(_device)
