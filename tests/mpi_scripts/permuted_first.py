"""The first collective of the job runs on a group whose ranks are listed in another order
on each rank: rank 0 all-gathers over ``placement("cpu", [0, 1])``, rank 1 over
``[1, 0]`` (run by tests/test_reliability.py with ``mpiexec -n 2``).

Neither rank has a communicator yet, so both first agree on the one they create: the
records name different groups, so both raise ``ct.DivergenceError`` at once, each naming
both sides, instead of hanging in the creation (rank 0 in ``Dup`` of the world, rank 1 in
``Create_group``). The argument ``nccl`` runs the same on the NCCL backend's id exchange
(the unique-id agreement) through a CPU stand-in of NCCL.
"""
import sys
import time

import numpy as np

import ctensor as ct

ranks = [0, 1] if ct.rank() == 0 else [1, 0]
x = ct.from_local(np.ones((2, 6)), ct.placement("cpu", ranks), ct.sbp.split(0)) \
    if "from_local" in sys.argv else \
    ct.ones(4, 6, placement=ct.placement("cpu", ranks), sbp=ct.sbp.split(0))
print(f"rank {ct.rank()} starts its first collective at {time.time():.3f}", flush=True)
x.to_global(sbp=ct.sbp.broadcast)
print(f"rank {ct.rank()} finished without an error", flush=True)
