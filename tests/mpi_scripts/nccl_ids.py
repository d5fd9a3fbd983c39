"""The NCCL backend's unique-id exchange (run by tests/test_reliability.py with
``mpiexec -n 2``): ``comm/nccl.py`` ``_share_unique_id`` on the real MPI host, with a
stand-in ``make`` for NCCL's ``get_unique_id`` (no GPU needed).

* ``same``: both ranks set up the collectives communicator of [0, 1], then the transfers
  one of the same group: each time both get rank 0's id, and the two ids differ.
* ``permuted``: rank 0 sets up [0, 1], rank 1 [1, 0] (each is its group's first rank, so
  each would make an id of its own and both would hang in ``ncclCommInitRank``).
* ``purpose``: rank 0 sets up the collectives communicator of [0, 1], rank 1 the
  transfers one of the same group (two communicators of one group must not pair up).
The last two raise ``ct.DivergenceError`` on both ranks, naming both sides.
"""
import itertools
import sys

import ctensor as ct
from ctensor import runtime
from ctensor.comm import nccl

host = runtime.world().comm
counter = itertools.count()


def make():
    return f"id {next(counter)} of rank {ct.rank()}"


how = sys.argv[1]
if how == "same":
    ids = [nccl._share_unique_id(host, (0, 1), make, purpose)
           for purpose in ("collectives", "transfers")]
    print(f"rank {ct.rank()} got {ids}", flush=True)
elif how == "permuted":
    nccl._share_unique_id(host, (0, 1) if ct.rank() == 0 else (1, 0), make)
elif how == "purpose":
    nccl._share_unique_id(host, (0, 1), make, "collectives" if ct.rank() == 0 else "transfers")
print(f"rank {ct.rank()} finished without an error", flush=True)
