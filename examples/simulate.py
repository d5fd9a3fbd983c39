"""Simulation walk-through: one process plays 4 ranks; print where data lives and which
collectives each step needs. Run: ``python examples/simulate.py``."""
import argparse

import numpy as np

import ctensor as ct

S0, S1, B, P = ct.sbp.split(0), ct.sbp.split(1), ct.sbp.broadcast, ct.sbp.partial_sum


def show(title, x):
    print(f"\n== {title}")
    print(ct.debug.visualize(x))


def main() -> None:
    with ct.simulate(4):
        line = ct.placement("cpu", [0, 1, 2, 3])
        mesh = ct.placement("cpu", [[0, 1], [2, 3]])

        x = ct.tensor(np.arange(13 * 6, dtype=np.float32).reshape(13, 6), placement=line,
                      sbp=S0)
        show("13x6 split over 4 ranks: the uneven rule gives 4, 3, 3, 3 rows", x)
        for r, shard in x.local_shards().items():
            print(f"  rank {r} holds rows {shard[:, 0].astype(int) // 6}")

        with ct.debug.comm_log() as log:
            y = x.to_global(sbp=S1)                      # one all-to-all
            z = y.to_global(sbp=B)                       # one all-gather
            s = (x * 2.0).sum(0)                         # local sums -> partial
            total = s.to_global(sbp=B)                   # one all-reduce
            w = x.to_global(mesh, (S0, S1))              # point-to-point to the 2x2 mesh
        show("S(0) -> S(1)", y)
        show("sum over the split dim stays partial until it is needed", s)
        show("moved to a 2x2 mesh as (S(0), S(1))", w)
        print("\n== communication log")
        for event in log:
            print(" ", event)
        print()
        print(log.summary())
        assert np.allclose(z.numpy(), x.numpy()) and np.allclose(total.numpy(),
                                                                 2 * x.numpy().sum(0))


if __name__ == "__main__":
    # no options: an argument given by mistake is an error, not silently ignored
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
