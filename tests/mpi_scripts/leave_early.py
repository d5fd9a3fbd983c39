"""The last rank leaves while the others wait for it in a collective (run by
tests/test_reliability.py under ``mpiexec -n 2`` and ``-n 3``).

``python leave_early.py HOW``: the last rank calls ``sys.exit(0)`` (``exit0``),
``sys.exit(3)`` (``exit3``) or returns from ``main`` (``return``) after a first collective;
the other ranks then wait for it in a second one and raise ``ct.RankExitedError`` within
about a second, naming it (the excepthook then aborts the job). With ``normal`` every rank
runs both collectives and the job ends cleanly.
"""
import sys

import numpy as np

import ctensor as ct


def main(how: str) -> None:
    x = ct.tensor(np.arange(12.0).reshape(4, 3), sbp=ct.sbp.split(0))
    x.to_global(sbp=ct.sbp.broadcast)  # a collective every rank completes
    if ct.rank() == ct.world_size() - 1:
        if how == "exit0":
            sys.exit(0)
        if how == "exit3":
            sys.exit(3)
        if how == "return":
            return
    y = x.to_global(sbp=ct.sbp.split(1))  # the other ranks wait here for the last one
    # one write per line: mpiexec forwards the ranks' output as it comes
    sys.stdout.write(f"rank {ct.rank()} finished with {y.numpy().sum():g}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1])
