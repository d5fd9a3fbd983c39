"""Rank 0 all-gathers over the placement [0, 1] while rank 1 all-gathers over [1, 0], a
different group (run by tests/test_reliability.py with ``mpiexec -n 2``).

``ct.tensor`` first checks its data over the sorted ranks, which makes the world's
communicator; so rank 0 waits in the guard of that communicator while rank 1 waits in the
agreement on creating the one of [1, 0]. Neither ever completes: after ``CTENSOR_TIMEOUT``
seconds both ranks raise ``ct.CommTimeoutError``, each naming what the other answered it
was doing and saying how to turn on ``CTENSOR_DEBUG=1`` and how to raise
``CTENSOR_TIMEOUT``; the excepthook then aborts the job.
"""
import numpy as np

import ctensor as ct

ranks = [0, 1] if ct.rank() == 0 else [1, 0]
x = ct.tensor(np.arange(24.0).reshape(4, 6), placement=ct.placement("cpu", ranks),
              sbp=ct.sbp.split(0))
print(f"rank {ct.rank()} starts the all-gather", flush=True)
x.to_global(sbp=ct.sbp.broadcast)
print(f"rank {ct.rank()} finished without an error", flush=True)
