"""Per-op dispatch overhead: ``mpiexec -n 2 python benchmarks/dispatch.py`` (or plain python).

Times ``a + b``, ``a @ b`` and ``a.sum(0)`` on 8x8 float32 tensors laid out (B, B) and
(S0, B), with and without ``requires_grad``, against the same NumPy call on the local
arrays, and prints the added microseconds per op (targets: <= 5 us on a signature-cache hit
without grad, <= 10 us with grad). When ``torch`` is importable (an optional peer, never a
dependency) the same calls run on PyTorch DTensor (gloo, the same mesh) against the same
torch call on the local tensors, in the same run and interleaved with ctensor's, and the
last column is ctensor's added time over DTensor's (target for the 8x8 add: <= 0.35x).
Then a 2-layer tensor-parallel MLP step (h=256, 2048 tokens) against the same model on one process.
``--quick``: fewer calls, a smaller MLP.
"""
from __future__ import annotations

import argparse
import statistics
import time

import harness

harness.one_blas_thread()  # before NumPy starts its BLAS threads

import numpy as np  # noqa: E402

import ctensor as ct  # noqa: E402
from harness import add_quick, positive_int, settle, torch_init_method  # noqa: E402


def _per_call(fn, number: int, rounds: int = 5) -> float:
    """Best seconds per call of ``fn`` over ``rounds`` windows of ``number`` calls."""
    fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def _best_interleaved(fns: list, number: int, rounds: int = 5) -> list:
    """Per function, the best seconds per call, the functions' windows taken in turn (a
    noisy spell then hits every column alike)."""
    best = [float("inf")] * len(fns)
    for fn in fns:
        fn()
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            best[i] = min(best[i], _per_call(fn, number, rounds=1))
    return best


CASES = [("a + b", lambda a, b: a + b, lambda a, b: a + b),
         ("a @ b", lambda a, b: a @ b, lambda a, b: a @ b),
         ("a.sum(0)", lambda a, b: a.sum(0), lambda a, b: a.sum(0))]


def _dtensor(av, bv, split: bool, grad: bool):
    """``(a, b, local a, local b)`` as PyTorch DTensors on every rank (gloo) and the local
    torch tensors the same ops see, or None when torch is not importable."""
    try:
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    except ImportError:
        return None
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    torch.set_num_threads(1)  # as NumPy's one BLAS thread per rank
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=torch_init_method(comm),
                                rank=comm.rank, world_size=comm.size)
    mesh = init_device_mesh("cpu", (comm.size,))
    a = distribute_tensor(torch.from_numpy(av), mesh, [Shard(0) if split else Replicate()])
    b = distribute_tensor(torch.from_numpy(bv), mesh, [Replicate()])
    if grad:
        a.requires_grad_()
        b.requires_grad_()
    la, lb = a.to_local().detach(), b.to_local().detach()
    if grad:
        la.requires_grad_()
        lb.requires_grad_()
    return a, b, la, lb


def op_overhead(number: int) -> list:
    """Rows ``(op, layout, grad, ctensor s, numpy s, DTensor s or None, torch s or None)``.
    With the step plan off: these loops of ops with grad never call ``backward()``, so the
    plan (on by default) would record them, about doubling their dispatch until its cap
    (``stepplan._MAX_CALLS``); a training loop's steps are recorded only until its plan is
    learned (its first three), and replayed or left unrecorded after."""
    ct.step_plan(False)
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
            peer = _dtensor(av, bv, sa is S0, grad)
            for name, ours, ref in CASES:
                # what the op computes locally (a + b on a split a adds b's matching rows)
                lb_used = lb[:la.shape[0]] if name == "a + b" else lb
                fns = [lambda: ours(a, b), lambda: ref(la, lb_used)]
                if peer is not None:
                    da, db, ta, tb = peer
                    tb_used = tb[:ta.shape[0]] if name == "a + b" else tb
                    fns += [lambda: ours(da, db), lambda: ref(ta, tb_used)]
                times = _best_interleaved(fns, number)
                times += [None] * (4 - len(times))
                rows.append((name, layout_name, grad, *times))
    return rows


def mlp_step(tokens: int, hidden: int, steps: int):
    """Column-parallel then row-parallel MLP, forward + backward, vs the same on rank 0."""
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((tokens, hidden), dtype=np.float32)
    # (a NumPy float64 scalar would make the weights float64: matmul refuses mixed dtypes)
    w1v = rng.standard_normal((hidden, 4 * hidden), dtype=np.float32) / np.float32(hidden) ** 0.5
    w2v = rng.standard_normal((4 * hidden, hidden), dtype=np.float32) / \
        np.float32(4 * hidden) ** 0.5
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
    ct.step_plan(ct.stepplan.DEFAULT_ON)  # (the default again: the MLP step is a loop)
    t_tp, t_one = mlp_step(args.tokens, args.hidden, args.steps)
    if ct.rank() == 0:
        print(f"dispatch overhead on {ct.world_size()} rank(s), 8x8 float32 (best of 5 "
              f"windows, ctensor's and DTensor's taken in turn)")
        print(f"{'op':<10}{'sbp':<6}{'grad':<6}{'ctensor us':>11}{'numpy us':>10}{'added us':>10}"
              f"{'DTensor us':>12}{'torch us':>10}{'added us':>10}{'ours/theirs':>13}")
        ratios, add_ratios = [], []
        for name, lay, grad, t_ours, t_ref, t_dt, t_torch in rows:
            line = (f"{name:<10}{lay:<6}{str(grad):<6}{t_ours * 1e6:>11.1f}{t_ref * 1e6:>10.1f}"
                    f"{(t_ours - t_ref) * 1e6:>10.1f}")
            if t_dt is not None:
                ratio = (t_ours - t_ref) / max(t_dt - t_torch, 1e-9)
                ratios.append(ratio)
                if name == "a + b":
                    add_ratios.append(ratio)
                line += (f"{t_dt * 1e6:>12.1f}{t_torch * 1e6:>10.1f}"
                         f"{(t_dt - t_torch) * 1e6:>10.1f}{ratio:>12.2f}x")
            print(line)
        if ratios:
            print(f"ctensor's added time / DTensor's: the 8x8 add worst {max(add_ratios):.2f}x "
                  f"(target <= 0.35x); every row median {statistics.median(ratios):.2f}x, "
                  f"worst {max(ratios):.2f}x")
        else:
            print("PyTorch DTensor: torch not importable, comparison skipped")
        print(f"\n2-layer TP MLP (h={args.hidden}, {args.tokens} tokens) fwd+bwd: "
              f"{t_tp * 1e3:.1f} ms on "
              f"{ct.world_size()} rank(s) vs {t_one * 1e3:.1f} ms on one rank "
              f"(ratio {t_tp / t_one:.2f}x)")


if __name__ == "__main__":
    main()
