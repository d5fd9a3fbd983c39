"""Rank 0 raises while rank 1 waits in a collective (run by tests/test_reliability.py
with ``mpiexec -n 2``): the excepthook prints rank 0's traceback once and aborts the job,
so mpiexec exits non-zero in seconds instead of rank 1 waiting ``CTENSOR_TIMEOUT``."""
import numpy as np

import ctensor as ct

x = ct.tensor(np.ones((4, 3)), sbp=ct.sbp.split(0))
x.to_global(sbp=ct.sbp.broadcast)  # a collective both ranks complete
if ct.rank() == 0:
    raise ValueError("rank 0 fails on purpose")
x.to_global(sbp=ct.sbp.split(1))  # rank 1 waits here for rank 0
print("rank 1 was not aborted", flush=True)
