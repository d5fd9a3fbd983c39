"""What the benchmark scripts share: argument checks, the ``--quick`` settings, timing.

Every benchmark has a default mode (the real measurement, the figures in ``RESULTS.md``) and
``--quick`` (tiny sizes, one or two repeats: it checks in seconds that the script runs, as
CI does). An option given explicitly wins over both.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Optional


def positive_int(text: str) -> int:
    """``type=`` for argparse: an int >= 1, else a clear usage error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def int_list(text: str) -> list:
    """``type=`` for argparse: comma-separated positive ints (``"1,16,64"``)."""
    return [positive_int(part) for part in text.split(",")]


def add_quick(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes and 1-2 repeats: checks in seconds that it runs")


def settle(args: argparse.Namespace, default: dict, quick: dict) -> argparse.Namespace:
    """Fill every option left at ``None`` from ``quick`` (with ``--quick``) or ``default``."""
    chosen = quick if args.quick else default
    for key, value in chosen.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def mpiexec() -> str:
    """The mpiexec next to this Python (the MPICH wheel's), else the one on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else (shutil.which("mpiexec") or "mpiexec")


def one_blas_thread() -> None:
    """One BLAS thread per rank, set before NumPy is imported: several ranks share the cores
    and oversubscribed BLAS threads would measure the scheduler, not the code. A value the
    user exported wins."""
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, "1")


def slowest_median(fn: Callable[[], object], repeats: int, comm) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls, each started together on every
    rank (a barrier first); the slowest rank's median decides."""
    from mpi4py import MPI
    times = []
    for _ in range(repeats):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return comm.allreduce(statistics.median(times), op=MPI.MAX)


def interleaved(steps: dict, repeats: int, comm, warmup: int = 1,
                barrier: Optional[Callable] = None) -> dict:
    """Median seconds per step of each of ``steps`` (name -> function), the slowest rank's,
    run interleaved: every round runs each once, so a slower phase of the machine hits all
    alike. ``warmup`` untimed rounds first (plans, signature caches, connections); each
    timed call starts together on every rank (``barrier(comm)``, default ``comm.Barrier``)."""
    from mpi4py import MPI
    times: dict = {name: [] for name in steps}
    for _ in range(warmup):
        for fn in steps.values():
            fn()
    for _ in range(repeats):
        for name, fn in steps.items():
            barrier(comm) if barrier is not None else comm.Barrier()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: comm.allreduce(statistics.median(t), op=MPI.MAX) for name, t in times.items()}


def torch_init_method(comm) -> str:
    """A ``torch.distributed`` init method for the ranks of ``comm`` (one machine): a
    file store in a fresh directory rank 0 makes and removes at exit. No TCP port: a port
    picked free and then bound by torch could be taken in between by another job."""
    path = None
    if comm.rank == 0:
        import atexit
        import tempfile
        folder = tempfile.mkdtemp(prefix="ctensor-torch-store-")
        atexit.register(shutil.rmtree, folder, True)
        path = os.path.join(folder, "store")
    return "file://" + comm.bcast(path, root=0)
