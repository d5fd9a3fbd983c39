"""Boxing vs raw mpi4py: run as ``mpiexec -n 2 python benchmarks/boxing.py``.

For float32 tensors of 1, 16 and 64 MiB it times each conversion through ``to_global`` and
the raw mpi4py buffer collective that moves the same data, in the same run, and prints the
median times and their ratio (target <= 1.10x at 16 and 64 MiB). B->S0 moves no data; its
baseline is the NumPy copy of the local slice. ``--quick``: 1 MiB, 2 repeats.
"""
from __future__ import annotations

import argparse

import numpy as np
from mpi4py import MPI

import ctensor as ct
from harness import add_quick, int_list, positive_int, settle, slowest_median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int_list, help="MiB, comma separated (default 1,16,64)")
    parser.add_argument("--repeats", type=positive_int, help="timed calls each (default 15)")
    add_quick(parser)
    args = settle(parser.parse_args(), dict(sizes=[1, 16, 64], repeats=15),
                  dict(sizes=[1], repeats=2))
    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    placement = ct.placement.all()
    S0, S1, B, P = ct.sbp.split(0), ct.sbp.split(1), ct.sbp.broadcast, ct.sbp.partial_sum
    rows = []
    for mib in args.sizes:
        elems = mib * 2**20 // 4
        side = int(np.sqrt(elems))
        side -= side % n
        shape = (elems // side // n * n, side)
        full = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
        local_rows = shape[0] // n
        part = np.ascontiguousarray(full[comm.rank * local_rows:(comm.rank + 1) * local_rows])
        x_s0 = ct.from_local(part, placement, S0)
        x_p = ct.from_local(full, placement, P)
        x_b = ct.from_local(full, placement, B)
        recv_full = np.empty_like(full)
        recv_part = np.empty_like(part)
        blocks = np.ascontiguousarray(part.reshape(local_rows, n, side // n).transpose(1, 0, 2))

        cases = [
            ("S0->B", lambda: x_s0.to_global(sbp=B), lambda: comm.Allgather(part, recv_full)),
            ("P->B", lambda: x_p.to_global(sbp=B), lambda: comm.Allreduce(full, recv_full)),
            ("P->S0", lambda: x_p.to_global(sbp=S0),
             lambda: comm.Reduce_scatter_block(full, recv_part)),
            ("S0->S1", lambda: x_s0.to_global(sbp=S1),
             lambda: comm.Alltoall(blocks, recv_part)),
            ("B->S0", lambda: x_b.to_global(sbp=S0),
             lambda: np.ascontiguousarray(full[comm.rank * local_rows:(comm.rank + 1) *
                                               local_rows])),
        ]
        for name, ours, raw in cases:
            ours(), raw()  # warm-up (plans, communicators)
            t_raw = slowest_median(raw, args.repeats, comm)
            t_ours = slowest_median(ours, args.repeats, comm)
            rows.append((mib, name, t_ours, t_raw))
    if comm.rank == 0:
        print(f"boxing on {n} MPI ranks (median of {args.repeats}; slowest rank)")
        print(f"{'MiB':>5} {'conversion':<10} {'ctensor ms':>11} {'raw ms':>9} {'ratio':>7}")
        for mib, name, t_ours, t_raw in rows:
            print(f"{mib:>5} {name:<10} {t_ours * 1e3:>11.3f} {t_raw * 1e3:>9.3f} "
                  f"{t_ours / t_raw:>6.2f}x")


if __name__ == "__main__":
    main()
