"""Per-op dispatch overhead: ``mpiexec -n 2 python benchmarks/dispatch.py`` (or plain python).

Times ``a + b``, ``a @ b`` and ``a.sum(0)`` on 8x8 float32 tensors laid out (B, B) and
(S0, B), with and without ``requires_grad``, against the same NumPy call on the local
arrays, and prints the added microseconds per op (targets: <= 5 us on a signature-cache hit
without grad, <= 10 us with grad). Then a 2-layer tensor-parallel MLP step (h=256, 2048
tokens) against the same model on one process. ``--quick``: fewer calls, a smaller MLP.
"""
from __future__ import annotations

import argparse
import time

import harness

harness.one_blas_thread()  # before NumPy starts its BLAS threads

import numpy as np  # noqa: E402

import ctensor as ct  # noqa: E402
from harness import add_quick, positive_int, settle  # noqa: E402


def _per_call(fn, number: int) -> float:
    fn()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def op_overhead(number: int) -> list:
    p = ct.placement.all()
    S0, B = ct.sbp.split(0), ct.sbp.broadcast
    rng = np.random.default_rng(0)
    av = rng.standard_normal((8, 8), dtype=np.float32)
    bv = rng.standard_normal((8, 8), dtype=np.float32)
    rows = []
    for layout_name, sa in [("B,B", B), ("S0,B", S0)]:
        for grad in (False, True):
            a = ct.tensor(av, placement=p, sbp=sa, requires_grad=grad)
            b = ct.tensor(bv, placement=p, sbp=B, requires_grad=grad)
            la, lb = next(iter(a.local_shards().values())), next(iter(b.local_shards().values()))
            lb_rows = lb[:la.shape[0]]  # what a + b adds locally when a is split
            for name, ours, ref in [("a + b", lambda: a + b, lambda: la + lb_rows),
                                    ("a @ b", lambda: a @ b, lambda: la @ lb),
                                    ("a.sum(0)", lambda: a.sum(0), lambda: la.sum(0))]:
                t_ours, t_ref = _per_call(ours, number), _per_call(ref, number)
                rows.append((name, layout_name, grad, t_ours, t_ref))
    return rows


def mlp_step(tokens: int, hidden: int, steps: int):
    """Column-parallel then row-parallel MLP, forward + backward, vs the same on rank 0."""
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((tokens, hidden), dtype=np.float32)
    w1v = rng.standard_normal((hidden, 4 * hidden), dtype=np.float32) / np.sqrt(hidden)
    w2v = rng.standard_normal((4 * hidden, hidden), dtype=np.float32) / np.sqrt(4 * hidden)
    S0, S1, B = ct.sbp.split(0), ct.sbp.split(1), ct.sbp.broadcast

    def run(placement, s1, s2):
        x = ct.tensor(xv, placement=placement, sbp=B)
        w1 = ct.tensor(w1v, placement=placement, sbp=s1, requires_grad=True)
        w2 = ct.tensor(w2v, placement=placement, sbp=s2, requires_grad=True)

        def step():
            loss = ((x @ w1).relu() @ w2).pow(2).mean()
            loss.backward()
            w1.grad = w2.grad = None
        step()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        return (time.perf_counter() - t0) / steps

    t_tp = run(ct.placement.all(), S1, S0)
    t_one = run(ct.placement("cpu", [0]), B, B)
    return t_tp, t_one


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=positive_int, help="calls per timing (default 2000)")
    parser.add_argument("--steps", type=positive_int, help="timed MLP steps (default 5)")
    parser.add_argument("--tokens", type=positive_int, help="MLP tokens (default 2048)")
    parser.add_argument("--hidden", type=positive_int, help="MLP hidden size (default 256)")
    add_quick(parser)
    args = settle(parser.parse_args(), dict(number=2000, steps=5, tokens=2048, hidden=256),
                  dict(number=20, steps=1, tokens=128, hidden=32))
    rows = op_overhead(args.number)
    t_tp, t_one = mlp_step(args.tokens, args.hidden, args.steps)
    if ct.rank() == 0:
        print(f"dispatch overhead on {ct.world_size()} rank(s), 8x8 float32 (best of 5)")
        print(f"{'op':<10}{'sbp':<6}{'grad':<6}{'ctensor us':>11}{'numpy us':>10}{'added us':>10}")
        for name, lay, grad, t_ours, t_ref in rows:
            print(f"{name:<10}{lay:<6}{str(grad):<6}{t_ours * 1e6:>11.1f}{t_ref * 1e6:>10.1f}"
                  f"{(t_ours - t_ref) * 1e6:>10.1f}")
        print(f"\n2-layer TP MLP (h={args.hidden}, {args.tokens} tokens) fwd+bwd: "
              f"{t_tp * 1e3:.1f} ms on "
              f"{ct.world_size()} rank(s) vs {t_one * 1e3:.1f} ms on one rank "
              f"(ratio {t_tp / t_one:.2f}x)")


if __name__ == "__main__":
    main()
