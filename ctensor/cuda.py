"""``ct.cuda``: is a GPU usable, how many, and which one this process uses.

``cuda`` placements hold CuPy arrays. CuPy is an optional dependency (``pip install -e
".[gpu]"`` adds CuPy for CUDA 12 and the NCCL runtime); this module is the one place that
imports it, lazily, so ``import ctensor`` never needs it. It imports the package ``cupy``
only, whatever distribution provides it (a machine may ship its own CuPy build for another
CUDA version).

Device choice: in MPI mode each process uses GPU ``local_rank % device_count``, where
``local_rank`` is its rank among the processes of its node (from an MPI shared-memory
split of the world). In a single process and in simulation it is the current CuPy device
(GPU 0 unless the user picked another one), so all simulated ranks share one GPU.

>>> ct.cuda.is_available()         # CuPy importable and a CUDA GPU visible
False
>>> ct.cuda.device_count()
0
"""
from __future__ import annotations

from typing import Optional

from . import runtime

__all__ = ["is_available", "device_count", "nccl_available", "local_rank", "current_device",
           "module", "backend"]

_INSTALL = ("pip install -e '.[gpu]' (CuPy for CUDA 12 and the NCCL runtime), or a CuPy "
            "build matching your CUDA version")

# set once CuPy is known to work and this process's GPU is chosen: the fast path of module()
_cupy = None
_device: Optional[int] = None
_local_rank: Optional[int] = None


def _import_cupy():
    """The ``cupy`` module, or ``None`` when it cannot be imported."""
    try:
        import cupy
    except Exception:  # ImportError, or a broken install raising something else
        return None
    return cupy


def is_available() -> bool:
    """Whether ``cuda`` placements can be used: CuPy imports and a CUDA GPU is visible.

    >>> ct.cuda.is_available()
    False
    """
    if _cupy is not None:
        return True
    cupy = _import_cupy()
    if cupy is None:
        return False
    try:
        return bool(cupy.is_available())
    except Exception:
        return False


def device_count() -> int:
    """Number of CUDA GPUs this process sees (0 without CuPy or without a GPU)."""
    cupy = _import_cupy()
    if cupy is None:
        return 0
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # CUDARuntimeError: no driver, no device
        return 0


def nccl_available() -> bool:
    """Whether CuPy's NCCL binding has a loadable NCCL library (``nvidia-nccl-cu12``)."""
    if _import_cupy() is None:
        return False
    try:
        from cupy.cuda import nccl
    except Exception:
        return False
    return bool(getattr(nccl, "available", False))


def _mpi_host():
    """The MPI communicator of the process's own world, or ``None`` outside MPI."""
    if not runtime.launched_by_mpi():
        return None
    comm = runtime._base_world().comm
    return comm if hasattr(comm, "world") else None


def local_rank() -> int:
    """This process's rank among the processes of its node (0 outside MPI).

    Under MPI the first call is collective over the world (an MPI shared-memory split);
    ctensor makes it when the first ``cuda`` tensor is built, which every rank does alike.
    """
    global _local_rank
    if _local_rank is None:
        host = _mpi_host()
        if host is None or host.size == 1:
            _local_rank = 0
        else:
            from .comm.nccl import node_layout
            _local_rank = node_layout(host.world)[0]
    return _local_rank


def _fail(reason: str) -> RuntimeError:
    return RuntimeError(f"ct.placement('cuda', ...) {reason}")


def module():
    """CuPy, checked, with this process's GPU made current (chosen on the first call).

    Raises ``RuntimeError`` saying what to install when CuPy is missing, or that no GPU is
    visible. :func:`ctensor.runtime.array_module` calls this for ``cuda`` placements.
    """
    global _cupy, _device
    if _cupy is not None:
        return _cupy
    cupy = _import_cupy()
    if cupy is None:
        raise _fail(f"needs CuPy, which is not installed: {_INSTALL}; or use "
                    f"ct.placement('cpu', ...)")
    try:
        visible = bool(cupy.is_available())
    except Exception:
        visible = False
    if not visible:
        raise _fail("needs a CUDA GPU, but no CUDA GPU is visible (cupy.is_available() is "
                    "False: check the NVIDIA driver and CUDA_VISIBLE_DEVICES); use "
                    "ct.placement('cpu', ...) on this machine")
    host = _mpi_host()
    if host is not None and host.size > 1:
        # one GPU per process of a node, round robin when ranks outnumber GPUs
        _device = local_rank() % int(cupy.cuda.runtime.getDeviceCount())
        cupy.cuda.Device(_device).use()
    else:
        _device = int(cupy.cuda.Device().id)
    _cupy = cupy
    return cupy


def current_device() -> int:
    """The GPU index this process uses for ``cuda`` placements (chooses it if needed)."""
    module()
    return int(_device)


def backend() -> str:
    """How ``cuda`` placements communicate in the world in force: ``"simulated"`` (one
    process: in-process CuPy maths), ``"nccl"`` or ``"host-staged"`` (MPI mode; the first
    call there is collective, as it makes the choice).

    >>> ct.cuda.backend()
    'simulated'
    """
    comm = runtime.world().comm_for("cuda")
    return getattr(comm, "backend_name", "simulated")
