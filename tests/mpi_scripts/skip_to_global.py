"""Rank 1 skips a ``to_global`` that rank 0 runs (run by tests/test_reliability.py with
``mpiexec -n 2``).

Rank 0 enters the all-gather of ``x.to_global(sbp=B)``; rank 1 skips it and goes on to the
next line, a move to another placement (point-to-point sends). With ``CTENSOR_DEBUG=1``
the fingerprints differ and both ranks raise ``ct.DivergenceError`` at once; without it
both wait ``CTENSOR_TIMEOUT`` seconds and raise ``ct.CommTimeoutError``, each naming the
other rank and what it answered it was doing. Either way the excepthook then aborts the job.
"""
import numpy as np

import ctensor as ct

S0, B = ct.sbp.split(0), ct.sbp.broadcast
x = ct.tensor(np.arange(24.0).reshape(4, 6), placement=ct.placement("cpu", [0, 1]), sbp=S0)
if ct.rank() != 1:
    x.to_global(sbp=B)  # rank 1 skips this all-gather
x.to_global(placement=ct.placement("cpu", [1, 0]), sbp=S0)  # point-to-point moves
print(f"rank {ct.rank()} finished without an error", flush=True)
