"""Nonblocking transfers (``to_global(..., async_op=True)``) that go wrong, run by
tests/test_reliability.py with ``mpiexec -n 2``; the first argument says how:

* ``shapes``: rank 0 sends a (4, 3) tensor, rank 1 expects (5, 3). The header that precedes
  every transfer disagrees, so rank 1 raises ``ct.DivergenceError`` naming what both sides
  were doing, before any of the data is used; the excepthook aborts the job.
* ``sender-leaves``: rank 0 leaves (``sys.exit(0)``) before sending; rank 1, waiting for
  the data, raises ``ct.RankExitedError`` within about a second.
* ``receiver-leaves``: rank 1 leaves before receiving a large tensor rank 0 sends; rank 0
  goes on (a sender never waits), finishes its script, and its exit (which first completes
  its sends) fails with ``ct.RankExitedError`` instead of hanging in ``MPI_Finalize``.
* ``normal``: both sides agree: the data arrive and both ranks finish cleanly.
"""
import sys

import numpy as np

import ctensor as ct

how = sys.argv[1]
src, dst = ct.placement("cpu", [0]), ct.placement("cpu", [1])
warm = ct.tensor(np.ones(3), placement=ct.placement("cpu", [0, 1]))  # a first collective
rows = 4 if (how != "shapes" or ct.rank() == 0) else 5
if how == "receiver-leaves":
    rows = 512  # 512 x 512 float64: 2 MiB, past any eager limit: the send needs a receiver
if how == "sender-leaves" and ct.rank() == 0:
    sys.exit(0)
if how == "receiver-leaves" and ct.rank() == 1:
    sys.exit(0)
x = ct.zeros(rows, rows if how == "receiver-leaves" else 3, placement=src)
moving = x.to_global(dst, ct.sbp.broadcast, async_op=True)
y = moving.wait()
total = float(y.sum().item()) if how == "normal" else 0
sys.stdout.write(f"rank {ct.rank()} finished with {total}\n")  # one write: lines stay whole
sys.stdout.flush()
