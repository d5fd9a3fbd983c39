"""The user-written Llama (tests/test_pytorch_programs.py: RMSNorm written out, rotary with
chunk/cat, SwiGLU, masked_fill + softmax attention) tensor-parallel on 2 ranks by SBP rules
alone: one forward + backward with the step plan (ctensor/stepplan.py) against the per-op
choice (``ct.step_plan(False)``), and both against Megatron's hand placement.

Prints per layout: median step seconds (the slowest rank's), collectives and bytes per rank
of one step, and the hand placement's collectives and bytes (counted from Megatron's
placement: the embedding's reduction, one all-reduce after each row-parallel linear
forward, one into each norm's input and the head input's gradient backward, the
vocabulary-parallel loss's 3 row statistics, the replicated weights' gradient bucket).

    mpiexec -n 2 python benchmarks/llama_tp.py          # real ranks
    python benchmarks/llama_tp.py --quick               # simulated, seconds

Not here yet: the same step hand-written in NumPy + mpi4py (the issue's 1.15x time target).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import harness

harness.one_blas_thread()
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import numpy as np  # noqa: E402

import ctensor as ct  # noqa: E402
import ctensor.nn  # noqa: E402,F401
import ctensor.nn.functional  # noqa: E402,F401
import ctensor.optim  # noqa: E402,F401


def hand(batch, seq, dim, layers, vocab):
    """Megatron's collectives and bytes per rank of one forward + backward (float64)."""
    activation = batch * seq * dim * 8
    reductions = 1 + 2 * layers + (2 * layers + 1) + 1
    return reductions + 3 + 1, reductions * activation + 3 * batch * seq * 8 + \
        (2 * layers + 1) * dim * 8


def run(plan_on: bool, args) -> tuple:
    import test_pytorch_programs as programs
    ct.step_plan(plan_on, always=plan_on)  # (followed even where it does not pay)
    ct.manual_seed(0)
    model = programs.llama(ct, ct.nn, ct.nn.functional)
    mesh = ct.placement("cpu", [0, 1])
    model.to_global(mesh, programs.LLAMA_TP)
    rng = np.random.default_rng(1)
    inputs = [ct.tensor(rng.integers(0, 32, (args.batch, 8))).to_global(mesh, ct.sbp.broadcast)
              for _ in range(2)]

    def step():
        loss = programs._loss(model, inputs)
        loss.backward()
        for p in model.parameters():
            p.grad = None
        return loss

    for _ in range(args.warmup):
        step()
    with ct.debug.comm_log() as log:
        step()
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    if ct.launched_by_mpi():
        from mpi4py import MPI
        seconds = MPI.COMM_WORLD.allreduce(seconds, op=MPI.MAX)
    return seconds, len(log.collectives()), log.total_bytes, ct.debug.step_plan()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_quick(parser)
    parser.add_argument("--repeats", type=harness.positive_int, default=None)
    parser.add_argument("--warmup", type=harness.positive_int, default=None)
    parser.add_argument("--batch", type=harness.positive_int, default=None)
    args = harness.settle(parser.parse_args(), {"repeats": 20, "warmup": 3, "batch": 4},
                          {"repeats": 2, "warmup": 3, "batch": 4})
    ct.set_default_dtype(np.float64)
    context = ct.simulate(2) if not ct.launched_by_mpi() else None
    if context is not None:
        context.__enter__()
    try:
        rows = [("per-op choice", *run(False, args)[:3]), ("step plan", *run(True, args))]
    finally:
        if context is not None:
            context.__exit__(None, None, None)
    count, nbytes = hand(args.batch, 8, 16, 2, 32)
    if ct.rank() == 0:
        mode = "mpiexec" if ct.launched_by_mpi() else "simulated"
        print(f"Llama L=2 d=16 TP 2 ({mode}), one forward + backward, float64")
        print(f"{'layout':<16}{'step ms':>10}{'collectives':>13}{'KiB/rank':>10}")
        for name, seconds, n, b, *_ in rows:
            print(f"{name:<16}{seconds * 1e3:>10.2f}{n:>13}{b / 1024:>10.1f}")
        print(f"{'hand (Megatron)':<16}{'-':>10}{count:>13}{nbytes / 1024:>10.1f}")
        report = rows[1][4]
        print(f"plan: solved in {report.solve_seconds:.2f} s, replayed {report.replayed} "
              f"steps, {report.deviations} deviations; "
              f"step plan / per-op time {rows[1][1] / rows[0][1]:.2f}x")


if __name__ == "__main__":
    main()
