"""Fully sharded data parallel (ZeRO-3) step vs the data-parallel step, with and without prefetch.

    mpiexec -n 2 python benchmarks/fsdp.py [--hidden 384] [--rounds 9] [--quick]

One GPT (``--layers`` blocks, ``--hidden`` wide, sequence ``--seq-len``, global batch
``--batch``, no dropout) trained with AdamW four ways in one job, interleaved round by round
so a busy machine slows all alike: data parallel (every parameter broadcast), and
``nn.fully_shard`` (ZeRO-3) with ``prefetch=0`` (each module gathers its parameters when it
runs), ``prefetch=1`` (the default: the next module's gathers started while this one
computes, and likewise the backward's gathers again) and ``prefetch=2``. Each round times
``--steps`` steps of each (forward, backward, optimizer step); the slowest rank's time
counts. It prints, per way, the median step time, the median of the per-round ratios to the
DP step (target for ZeRO-3 with prefetch: <= 1.15x at h >= 384, where parameters dominate),
and the last loss (the same bits with any ``prefetch``; DP's within float32 rounding). One
BLAS thread per rank.
"""
from __future__ import annotations

import argparse
import statistics
import time

import harness

harness.one_blas_thread()  # before NumPy starts its BLAS threads

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import ctensor as ct  # noqa: E402
import ctensor.nn as nn  # noqa: E402
import ctensor.optim as optim  # noqa: E402
from harness import add_quick, positive_int, settle  # noqa: E402

TARGET = 1.15  # ZeRO-3's step time / DP's
WAYS = ("DP", "ZeRO-3 prefetch=0", "ZeRO-3 prefetch=1", "ZeRO-3 prefetch=2")
DEFAULT = dict(hidden=384, layers=4, heads=6, seq_len=64, batch=8, vocab=512, rounds=9,
               steps=4)
QUICK = dict(hidden=32, layers=1, heads=2, seq_len=8, batch=4, vocab=64, rounds=1, steps=1)


def build(way: str, a):
    mesh = ct.placement("cpu", list(range(ct.world_size())))
    ct.manual_seed(0)
    model = nn.GPT(a.vocab, a.seq_len, a.layers, a.heads, a.hidden, dropout=0.0)
    if way == "DP":
        nn.parallel.data_parallel(model, mesh)
    else:
        nn.fully_shard(model, mesh, prefetch=int(way[-1]))
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(0)
    idx = ct.tensor(rng.integers(0, a.vocab, (a.batch, a.seq_len)), placement=mesh,
                    sbp=nn.parallel.batch_sbp(mesh))
    return model, opt, idx


def step(model, opt, idx):
    _, loss = model(idx, idx)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in DEFAULT:
        p.add_argument("--" + name.replace("_", "-"), type=positive_int, default=None)
    add_quick(p)
    a = settle(p.parse_args(), DEFAULT, QUICK)
    comm = MPI.COMM_WORLD
    runs = {w: build(w, a) for w in WAYS}
    for w in WAYS:  # warm up: the first step learns the prefetch orders
        for _ in range(2 if not a.quick else 1):
            step(*runs[w])
    times: dict = {w: [] for w in WAYS}
    losses = {}
    for _ in range(a.rounds):
        for w in WAYS:
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(a.steps):
                loss = step(*runs[w])
            times[w].append(comm.allreduce((time.perf_counter() - t0) / a.steps, op=MPI.MAX))
            losses[w] = float(loss.item())
    if comm.rank != 0:
        return
    print(f"GPT h={a.hidden} layers={a.layers} seq={a.seq_len} batch={a.batch} on "
          f"{comm.size} ranks, {a.rounds} rounds x {a.steps} steps, slowest rank")
    width = max(5 * a.rounds + 2, 18)
    print(f"{'way':<20}{'ms/step':>10}{'vs DP':>8}   {'per-round ratios':<{width}}last loss")
    for w in WAYS:
        ratios = [t / d for t, d in zip(times[w], times["DP"])]
        print(f"{w:<20}{statistics.median(times[w]) * 1e3:>10.1f}"
              f"{statistics.median(ratios):>7.3f}x   "
              f"{' '.join(f'{r:.2f}' for r in ratios):<{width}}{losses[w]:.6f}")
    best = statistics.median([t / d for t, d in zip(times["ZeRO-3 prefetch=1"], times["DP"])])
    print(f"ZeRO-3 (prefetch=1) / DP = {best:.3f}x (target <= {TARGET}x at h >= 384)")
    zero3 = {losses[w] for w in WAYS[1:]}
    if len(zero3) != 1 or abs(zero3.pop() - losses["DP"]) > 1e-4 * abs(losses["DP"]):
        raise SystemExit(f"the losses differ: {losses}")


if __name__ == "__main__":
    main()
