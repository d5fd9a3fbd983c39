"""Boxing vs raw mpi4py: run as ``mpiexec -n 2 python benchmarks/boxing.py``.

For float32 tensors of 1, 16 and 64 MiB it times each conversion through ``to_global`` and
the raw mpi4py buffer collective that moves the same data into a preallocated buffer, in
the same run: each repeat times the raw call and then the conversion, one after the other,
so that a change of load on a shared machine reaches both. It prints the median times (the
slowest rank's) and the median of the per-repeat ratios (target <= 1.10x at 16 and 64 MiB). The raw baseline does
no rearrangement: for S0->S1 it sends blocks packed beforehand, for S1->B and S1->S0 it
leaves the received blocks one after the other. B->S0 moves no data; its baseline is the
NumPy copy of the local slice. ``--quick``: 1 MiB, 2 repeats.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import ctensor as ct
from harness import add_quick, int_list, positive_int, settle


def interleaved(ours, raw, repeats: int, comm) -> tuple:
    """``ours()`` and ``raw()`` timed alternately (a barrier before each call) ``repeats``
    times each: their median seconds and the median of the per-repeat ratios, each call's
    time the slowest rank's (a ratio of two neighbouring calls shares their load)."""
    times = np.zeros((2, repeats))
    for i in range(repeats):
        for k, fn in enumerate((raw, ours)):
            comm.Barrier()
            t0 = time.perf_counter()
            fn()
            times[k, i] = time.perf_counter() - t0
    comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    t_raw, t_ours = np.median(times, axis=1)
    return t_ours, t_raw, float(np.median(times[1] / times[0]))


def cases(comm, mib: int) -> list:
    """``(name, ours, raw)`` for a float32 tensor of about ``mib`` MiB."""
    n, rank = comm.Get_size(), comm.rank
    placement = ct.placement.all()
    S0, S1, B, P = ct.sbp.split(0), ct.sbp.split(1), ct.sbp.broadcast, ct.sbp.partial_sum
    elems = mib * 2**20 // 4
    side = int(np.sqrt(elems))
    side -= side % n
    shape = (elems // side // n * n, side)
    full = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    rows, cols = shape[0] // n, shape[1] // n
    row_part = np.ascontiguousarray(full[rank * rows:(rank + 1) * rows])
    col_part = np.ascontiguousarray(full[:, rank * cols:(rank + 1) * cols])
    x_s0 = ct.from_local(row_part, placement, S0)
    x_s1 = ct.from_local(col_part, placement, S1)
    x_p = ct.from_local(full, placement, P)
    x_b = ct.from_local(full, placement, B)
    recv_full = np.empty_like(full)
    recv_row = np.empty_like(row_part)
    recv_col = np.empty_like(col_part)
    row_blocks = np.ascontiguousarray(row_part.reshape(rows, n, cols).transpose(1, 0, 2))
    return [
        ("S0->B", lambda: x_s0.to_global(sbp=B), lambda: comm.Allgather(row_part, recv_full)),
        ("S1->B", lambda: x_s1.to_global(sbp=B), lambda: comm.Allgather(col_part, recv_full)),
        ("P->B", lambda: x_p.to_global(sbp=B), lambda: comm.Allreduce(full, recv_full)),
        ("P->S0", lambda: x_p.to_global(sbp=S0),
         lambda: comm.Reduce_scatter_block(full, recv_row)),
        ("P->S1", lambda: x_p.to_global(sbp=S1),
         lambda: comm.Reduce_scatter_block(full, recv_col)),
        ("S0->S1", lambda: x_s0.to_global(sbp=S1),
         lambda: comm.Alltoall(row_blocks, recv_col)),
        ("S1->S0", lambda: x_s1.to_global(sbp=S0), lambda: comm.Alltoall(col_part, recv_row)),
        ("B->S0", lambda: x_b.to_global(sbp=S0),
         lambda: np.ascontiguousarray(full[rank * rows:(rank + 1) * rows])),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int_list, help="MiB, comma separated (default 1,16,64)")
    parser.add_argument("--repeats", type=positive_int, help="timed calls each (default 15)")
    add_quick(parser)
    args = settle(parser.parse_args(), dict(sizes=[1, 16, 64], repeats=15),
                  dict(sizes=[1], repeats=2))
    comm = MPI.COMM_WORLD
    rows = []
    for mib in args.sizes:
        for name, ours, raw in cases(comm, mib):
            ours(), raw()  # warm-up (plans, communicators, pooled buffers)
            rows.append((mib, name) + interleaved(ours, raw, args.repeats, comm))
    if comm.rank == 0:
        print(f"boxing on {comm.Get_size()} MPI ranks (raw and ctensor timed alternately, "
              f"{args.repeats} each; slowest rank; ratio: median of the per-repeat ratios)")
        print(f"{'MiB':>5} {'conversion':<10} {'ctensor ms':>11} {'raw ms':>9} {'ratio':>7}")
        for mib, name, t_ours, t_raw, ratio in rows:
            print(f"{mib:>5} {name:<10} {t_ours * 1e3:>11.3f} {t_raw * 1e3:>9.3f} "
                  f"{ratio:>6.2f}x")


if __name__ == "__main__":
    main()
