"""The world: which backend runs, how many ranks there are and which ones this process holds.

Three modes share one code path:

* MPI — under ``mpiexec -n N`` each process holds its own rank (detected from the
  launcher's environment, so a plain ``python script.py`` never starts MPI);
* single process — a world of one rank;
* simulation — ``ct.simulate(n)``: this process holds all ``n`` ranks and collectives
  are computed in-process. Use it as a context manager or, at a REPL, as a plain call.

This is the only global mutable state of the library (plus the default dtype/device).
"""
from __future__ import annotations

import enum
import os
from typing import Optional

import numpy as np

from .comm.base import Communicator
from .comm.simulated import SimulatedCommunicator

__all__ = ["Mode", "simulate", "rank", "world_size", "world", "set_default_dtype",
           "get_default_dtype", "set_default_device", "default_device", "array_module"]

_LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")


class Mode(enum.Enum):
    SINGLE = "single"
    MPI = "mpi"
    SIMULATION = "simulation"


class World:
    """A communicator plus the mode it was made for."""

    def __init__(self, mode: Mode, comm: Communicator):
        self.mode = mode
        self.comm = comm
        self.size = comm.size
        self.held_ranks = comm.held_ranks
        self._cuda_comm: Optional[Communicator] = None

    # --- GPU backend (issue 6): the communicator for each device kind
    def comm_for(self, *devices: str) -> Communicator:
        """The communicator for arrays on ``devices`` (``"cpu"``/``"cuda"``).

        ``cuda`` only when every device given is ``cuda``; a move between ``cpu`` and
        ``cuda`` goes through the host communicator. In one process (simulation, single
        rank) it is :attr:`comm`, which computes with the arrays' own module (CuPy for
        ``cuda``). Under MPI, ``cuda`` gets NCCL when every rank has a GPU of its own, else
        the host-staged MPI path (chosen on the first call, collectively, and reported once).
        """
        if not devices or any(d != "cuda" for d in devices) \
                or isinstance(self.comm, SimulatedCommunicator):
            return self.comm
        if self._cuda_comm is None:
            from .comm.nccl import cuda_communicator
            self._cuda_comm = cuda_communicator(self.comm)
        return self._cuda_comm

    def __repr__(self) -> str:
        return f"World(mode={self.mode.value}, size={self.size}, held={list(self.held_ranks)})"


_stack: list[World] = []
_base: Optional[World] = None
_default_dtype = np.dtype(np.float32)
_default_device = "cpu"


def launched_by_mpi() -> bool:
    """True when this process was started by ``mpiexec``/``mpirun`` (read from the launcher's
    environment, without starting MPI). Scripts use it to simulate when run alone::

        with (contextlib.nullcontext() if ct.launched_by_mpi() else ct.simulate(4)):
            main()
    """
    return any(v in os.environ for v in _LAUNCHER_VARS)


def _base_world() -> World:
    global _base
    if _base is None:
        if launched_by_mpi():
            from .comm.mpi import MPICommunicator, install_excepthook, install_exit_handler
            comm = MPICommunicator()  # reads CTENSOR_DEBUG and CTENSOR_TIMEOUT
            if comm.size > 1:  # an uncaught exception on one rank aborts the whole job, and
                install_excepthook(comm.world, comm.watchdog)  # a rank that leaves early
                install_exit_handler(comm)                     # fails those waiting for it
            _base = World(Mode.MPI if comm.size > 1 else Mode.SINGLE, comm)
        else:
            _base = World(Mode.SINGLE, SimulatedCommunicator(1))
    return _base


def world() -> World:
    """The world in force: the innermost simulation, else the process's own world."""
    return _stack[-1] if _stack else _base_world()


def rank() -> int:
    """This process's rank (0 in a simulation, which holds every rank)."""
    return world().held_ranks[0]


def world_size() -> int:
    """Number of ranks in the world in force."""
    return world().size


class simulate:
    """Simulate a world of ``world_size`` ranks in this process.

    >>> with ct.simulate(4):           # as a context manager
    ...     x = ct.ones(8, sbp=ct.sbp.split(0))
    >>> ct.simulate(4)                 # or, at a REPL, as a plain call (until ct.simulate.end())
    """

    def __init__(self, world_size: int):
        if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)):
            raise TypeError(f"simulate: argument 'world_size' must be an int >= 1, got "
                            f"{world_size!r}")
        if world_size < 1:
            raise ValueError(f"simulate: argument 'world_size' must be >= 1, got {world_size}")
        self.world = World(Mode.SIMULATION, SimulatedCommunicator(int(world_size)))
        _stack.append(self.world)

    def __enter__(self) -> World:
        return self.world

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Leave this simulation (and any started inside it)."""
        if self.world in _stack:
            del _stack[_stack.index(self.world):]

    @staticmethod
    def end() -> None:
        """Leave every simulation started with a plain call."""
        _stack.clear()

    def __repr__(self) -> str:
        return f"simulate({self.world.size})"


def set_default_dtype(dtype) -> None:
    """Dtype for tensors made from Python scalars and lists (default float32)."""
    global _default_dtype
    _default_dtype = np.dtype(dtype)


def get_default_dtype() -> np.dtype:
    return _default_dtype


def set_default_device(device: str) -> None:
    """Device of placements made without one (``ct.placement.all()``, default tensors)."""
    global _default_device
    if device not in ("cpu", "cuda"):
        raise ValueError(f"set_default_device: argument 'device' must be 'cpu' or 'cuda', "
                         f"got {device!r}")
    _default_device = device


def default_device() -> str:
    return _default_device


def array_module(arr_or_device):
    """NumPy for ``cpu`` arrays/placements, CuPy for ``cuda`` ones."""
    if isinstance(arr_or_device, str):
        device = arr_or_device
    elif isinstance(arr_or_device, np.ndarray) or np.isscalar(arr_or_device):
        return np
    else:
        device = "cuda" if type(arr_or_device).__module__.startswith("cupy") else "cpu"
    if device == "cuda":
        from . import cuda  # CuPy on this rank's GPU, or a RuntimeError saying what to install
        return cuda.module()
    return np
