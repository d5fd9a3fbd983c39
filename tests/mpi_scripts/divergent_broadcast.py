"""Broadcast data that differ between ranks (run by tests/test_reliability.py with
``mpiexec -n 2``): each case must raise ``ValueError`` on every rank, which prints it and
goes on to the next case, so the job exits 0 and the test reads every rank's message.

* ``from_local``: each rank passes ``np.full(3, rank)`` as a broadcast shard (before the
  check, ``x.sum().item()`` gave 0.0 on rank 0 and 6.0 on rank 1);
* ``module``: ``ct.manual_seed(rank)`` then ``nn.Linear(4, 4).to_global(all, B)``;
* ``data_parallel``: the same through ``nn.parallel.data_parallel``;
* ``off``: ``ct.debug.check_tensor_data(False)`` accepts both (the documented switch).
"""
import numpy as np

import ctensor as ct
from ctensor import nn

rank, every = ct.rank(), ct.placement.all()


def attempt(name, fn):
    try:
        fn()
        print(f"rank {rank} {name}: accepted", flush=True)
    except ValueError as exc:
        print(f"rank {rank} {name}: ValueError: {exc}", flush=True)


attempt("from_local", lambda: ct.from_local(np.full(3, float(rank)), every, ct.sbp.broadcast))
ct.manual_seed(rank)
attempt("module", lambda: nn.Linear(4, 4).to_global(every, ct.sbp.broadcast))
attempt("data_parallel", lambda: nn.parallel.data_parallel(nn.Linear(4, 4), every))
with ct.debug.check_tensor_data(False):
    attempt("off", lambda: (ct.from_local(np.full(3, float(rank)), every, ct.sbp.broadcast),
                            nn.Linear(4, 4).to_global(every, ct.sbp.broadcast)))
ct.manual_seed(0)  # the fix: one seed on every rank
attempt("seeded", lambda: nn.Linear(4, 4).to_global(every, ct.sbp.broadcast))
