"""Layout-independent random numbers against NumPy's generator: ``python benchmarks/rng.py``.

Times ``ct.randn`` / ``ct.rand`` / ``ct.randint`` on one rank (a 1-rank placement, so the
time is the Philox + transform work of :mod:`ctensor.random`, no communication) against
``numpy.random.default_rng()`` drawing the same number of values, and prints the ratio
(target for 16M float32 normals: <= 3x). Also times one shard of a column-split (S(1))
tensor, the layout whose shard is not one contiguous run of the logical tensor. Best of
``--repeat`` runs each, interleaved, so a busy machine slows both sides alike. ``--quick``:
65,536 values, one run.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import ctensor as ct
from harness import add_quick, positive_int, settle


def _best(fns: list, repeat: int) -> list:
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=positive_int, help="values per draw (default 16Mi)")
    parser.add_argument("--repeat", type=positive_int, help="runs each, best taken (default 5)")
    add_quick(parser)
    args = settle(parser.parse_args(), dict(n=16 * 2 ** 20, repeat=5), dict(n=2 ** 16, repeat=1))
    n = args.n
    one = ct.placement("cpu", [0])
    rng = np.random.default_rng(0)
    f32, f64 = np.float32, np.float64
    side = int(np.sqrt(n))
    cases = [
        ("randn f32", lambda: ct.randn(n, placement=one, dtype=f32),
         lambda: rng.standard_normal(n, dtype=f32)),
        ("randn f64", lambda: ct.randn(n, placement=one, dtype=f64),
         lambda: rng.standard_normal(n, dtype=f64)),
        ("rand f32", lambda: ct.rand(n, placement=one, dtype=f32),
         lambda: rng.random(n, dtype=f32)),
        ("rand f64", lambda: ct.rand(n, placement=one, dtype=f64),
         lambda: rng.random(n, dtype=f64)),
        ("randint int64 [0,1000)", lambda: ct.randint(0, 1000, (n,), placement=one),
         lambda: rng.integers(0, 1000, n)),
        (f"randn f32 ({side},{side}) S(1), shard of 4",
         lambda: ct.random.region(ct.random.Kind.NORMAL, (side, side),
                                  ((0, side), (0, side // 4)), f32, (0, 0)),
         lambda: rng.standard_normal((side, side // 4), dtype=f32)),
    ]
    print(f"{'draw':34s} {'ctensor ms':>11s} {'numpy ms':>9s} {'ratio':>6s}")
    for name, ours, ref in cases:
        t_ours, t_ref = _best([ours, ref], args.repeat)
        print(f"{name:34s} {t_ours * 1e3:11.1f} {t_ref * 1e3:9.1f} {t_ours / t_ref:6.2f}")
    print(f"(n = {n:,} values; target: randn f32 ratio <= 3)")


if __name__ == "__main__":
    main()
