"""``ct.cuda``: is a GPU usable, how many, and which one this process uses.

``cuda`` placements hold CuPy arrays. CuPy is an optional dependency (``pip install -e
".[gpu-cu13]"`` or ``".[gpu-cu12]"`` adds CuPy 14 and the NCCL runtime of that CUDA major
version; a machine with CuPy installs plain ctensor); :mod:`ctensor._device` imports it, lazily, so
``import ctensor`` never needs it. It imports the package ``cupy`` only, whatever
distribution provides it (a machine may ship its own CuPy build for another CUDA version).

Device choice: in MPI mode each process uses GPU ``local_rank % device_count``, where
``local_rank`` is its rank among the processes of its node (the world learns every rank's
host when it starts). In a single process and in simulation it is the current CuPy device
(GPU 0 unless the user picked another one), so all simulated ranks share one GPU.

>>> ct.cuda.is_available()         # CuPy importable and a CUDA GPU visible
False
>>> ct.cuda.device_count()
0
"""
from __future__ import annotations

from . import _device, runtime
from .comm import nccl

__all__ = ["is_available", "device_count", "nccl_available", "local_rank", "current_device",
           "module", "backend"]

is_available = _device.is_available
device_count = _device.device_count
module = _device.module
current_device = _device.current_device


def nccl_available() -> bool:
    """Whether CuPy's NCCL binding has a loadable NCCL library (``nvidia-nccl-cu12`` /
    ``-cu13``)."""
    return nccl.loadable()


def local_rank() -> int:
    """This process's rank among the processes of its node (0 outside MPI)."""
    return runtime.world().local_rank


def backend() -> str:
    """How ``cuda`` placements communicate in the world in force: ``"simulated"`` (one
    process: in-process CuPy maths), ``"nccl"`` or ``"host-staged"`` (MPI mode; the first
    call there is collective, as it makes the choice).

    >>> ct.cuda.backend()
    'simulated'
    """
    comm = runtime.world().comm_for("cuda")
    return getattr(comm, "backend_name", "simulated")
