"""The world: which backend runs, how many ranks there are and which ones this process holds.

Three modes share one code path:

* MPI — under ``mpiexec -n N`` each process holds its own rank (detected from the
  launcher's environment, so a plain ``python script.py`` never starts MPI);
* single process — a world of one rank;
* simulation — ``ct.simulate(n)``: this process holds all ``n`` ranks and collectives
  are computed in-process. Use it as a context manager or, at a REPL, as a plain call.

The world in force (this module's stack of simulations and the process's own world) and
the default dtype and device are the runtime's state. The library keeps other state of its
own, each documented where it lives: caches (op plans in ``dispatch``, boxing plans,
interned layouts, scalar constants, MPI receive buffers and sub-communicators), the random
generator's seed and counter, autograd's modes (grad, sync, saved-tensor hooks), the
communication log, and the chosen GPU.
"""
from __future__ import annotations

import enum
import os
import socket
from typing import Optional

import numpy as np

from . import _device
from .comm.base import Communicator
from .comm.simulated import SimulatedCommunicator
from .sbp import ReduceOp

__all__ = ["Mode", "World", "simulate", "is_meta", "rank", "world_size", "world",
           "set_default_dtype", "get_default_dtype", "set_default_device", "default_device"]

_LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")
#: the launchers' names for a process's rank on its node (MPICH, Open MPI, Slurm)
_LOCAL_RANK_VARS = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")


def _launcher_local_rank() -> Optional[int]:
    """This process's rank on its node, as the launcher tells it (None if it does not)."""
    for name in _LOCAL_RANK_VARS:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


class Mode(enum.Enum):
    SINGLE = "single"
    MPI = "mpi"
    SIMULATION = "simulation"


class World:
    """A communicator plus the mode it was made for, and the one way the rest of the
    library exchanges metadata between ranks (:meth:`exchange`, :meth:`agree`)."""

    def __init__(self, mode: Mode, comm: Communicator, meta: bool = False):
        self.mode = mode
        self.comm = comm
        #: shape-only: tensors are their layouts, kernels and data movement are skipped
        #: (``ct.simulate(n, meta=True)``, see :mod:`ctensor.meta`)
        self.meta = meta
        self.size = comm.size
        self.held_ranks = comm.held_ranks
        self._cuda_comm: Optional[Communicator] = None
        #: this process's rank among the processes of its host (the GPU it uses)
        self.local_rank = 0
        if mode is Mode.MPI:
            self.local_rank = _launcher_local_rank()
            if self.local_rank is None:  # every rank learns every rank's host: one exchange
                hosts = self.exchange({self.held_ranks[0]: socket.gethostname()})
                me = self.held_ranks[0]
                self.local_rank = sum(1 for r in range(me) if hosts[r] == hosts[me])
            _device.set_local_rank(self.local_rank)

    def exchange(self, objs: dict, group: Optional[tuple] = None) -> list:
        """Small Python metadata between ranks (collective over ``group``, default every
        rank): ``objs`` maps each rank of the group this process holds to its object; every
        member gets the list of all members' objects in group order."""
        group = tuple(range(self.size)) if group is None else tuple(group)
        held = {r: objs[r] for r in group if r in objs}
        if not held:
            return []
        return next(iter(self.comm.all_gather_object(group, held).values()))

    def agree(self, values: dict, group: tuple) -> bool:
        """Whether every member of ``group`` holds the same small int64 array (``values``:
        this process's ``{rank: array}``): one all-reduce of the arrays and their
        complements with MAX (equal maxima of both mean equal arrays), the same answer on
        every member."""
        held = {r: np.concatenate([v, ~v]) for r, v in values.items() if r in group}
        if not held or len(group) == 1:
            return True
        seen = next(iter(self.comm.all_reduce(group, held, ReduceOp.MAX).values()))
        mine = next(iter(values.values()))
        n = mine.size
        return bool(np.array_equal(seen[:n], mine) and np.array_equal(seen[n:], ~mine))

    def comm_for(self, *devices: str) -> Communicator:
        """The communicator for arrays on ``devices`` (``"cpu"``/``"cuda"``).

        ``cuda`` only when every device given is ``cuda``; a move between ``cpu`` and
        ``cuda`` goes through the host communicator. In one process (simulation, single
        rank) it is :attr:`comm`, which computes with the arrays' own module (CuPy for
        ``cuda``). Under MPI, ``cuda`` gets NCCL when every rank has a GPU of its own, else
        the host-staged MPI path, chosen on the first call — which is therefore collective
        (boxing makes it, at the same op on every rank) — and reported once.
        """
        if not devices or any(d != "cuda" for d in devices) \
                or isinstance(self.comm, SimulatedCommunicator):
            return self.comm
        if self._cuda_comm is None:
            from .comm.nccl import cuda_communicator
            self._cuda_comm = cuda_communicator(self.comm)
        return self._cuda_comm

    def __repr__(self) -> str:
        if self.meta:
            return f"World(mode={self.mode.value}, size={self.size}, meta=True)"
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


def is_meta() -> bool:
    """Whether the world in force is shape-only (``ct.simulate(n, meta=True)``)."""
    return world().meta


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

    ``meta=True`` runs the script shape-only (see :mod:`ctensor.meta`): tensors hold no
    data, kernels are skipped and boxing only records its steps, so any world size costs
    about what a small one does — to plan a big job's memory and communication:

    >>> with ct.simulate(3072, meta=True):
    ...     w = ct.zeros(25600, 25600, placement=mesh, sbp=ct.sbp.split(0))  # nothing allocated
    """

    def __init__(self, world_size: int, meta: bool = False):
        if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)):
            raise TypeError(f"simulate: argument 'world_size' must be an int >= 1, got "
                            f"{world_size!r}")
        if world_size < 1:
            raise ValueError(f"simulate: argument 'world_size' must be >= 1, got {world_size}")
        if not isinstance(meta, bool):
            raise TypeError(f"simulate: argument 'meta' must be True or False, got {meta!r}")
        self.world = World(Mode.SIMULATION, SimulatedCommunicator(int(world_size)), meta)
        self.meta = meta
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
        return f"simulate({self.world.size}{', meta=True' if self.meta else ''})"


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
