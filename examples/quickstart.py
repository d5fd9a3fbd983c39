"""The README walk-through. Run as ``python examples/quickstart.py`` (simulates 4 ranks) or
``mpiexec -n 4 python examples/quickstart.py`` (one process per rank)."""
import argparse
import contextlib

import numpy as np

import ctensor as ct


def main() -> None:
    mesh = ct.placement("cpu", [[0, 1], [2, 3]])
    S0, S1, B = ct.sbp.split(0), ct.sbp.split(1), ct.sbp.broadcast

    x = ct.tensor(np.random.default_rng(0).standard_normal((8, 16)),
                  placement=mesh, sbp=(S0, B))             # rows split over mesh axis 0
    w = ct.tensor(np.random.default_rng(1).standard_normal((16, 32)),
                  placement=mesh, sbp=(B, S1), requires_grad=True)

    with ct.debug.comm_log() as log:
        y = (x @ w).relu()                     # (S0, S1): no communication at all
    loss = (y * y).mean()
    loss.backward()                            # w.grad comes back with w's layout
    value = loss.item()

    # the same computation on plain NumPy, for comparison
    xv = np.random.default_rng(0).standard_normal((8, 16))
    wv = np.random.default_rng(1).standard_normal((16, 32))
    ref = np.maximum(xv @ wv, 0)
    if ct.rank() == 0:
        print("y:", y.sbp, "collectives in the forward:", log.collectives())
        print("w.grad:", w.grad.sbp)
        print(f"loss {value:.6f} (NumPy {np.mean(ref ** 2):.6f})")
        print(ct.debug.visualize(y))
    grad = w.grad.numpy()
    assert np.allclose(grad, xv.T @ (2 * ref / ref.size))


if __name__ == "__main__":
    # no options: an argument given by mistake is an error, not silently ignored
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    with (contextlib.nullcontext() if ct.launched_by_mpi() else ct.simulate(4)):
        main()
