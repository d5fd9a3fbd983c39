"""The user-written Llama (tests/test_pytorch_programs.py: RMSNorm written out, rotary with
chunk/cat, SwiGLU, masked_fill + softmax attention) tensor-parallel on 2 ranks by SBP rules
alone, against the same step written by hand in NumPy + mpi4py with Megatron's placement
(``benchmarks/llama_hand.py``).

One forward + backward, float64, with the step plan (ctensor/stepplan.py, followed with
``always=True``) and with the per-op choice (``ct.step_plan(False)``). Each is timed in the
same loop as the hand-written step, step for step (so a busy machine slows both alike).
Prints per row: median step ms (the slowest rank's), the ratio ctensor / hand, the
collectives and bytes per rank of one step (ctensor's from ``ct.debug.comm_log()``, the
hand version's counted call by call). Before timing it checks that the hand-written loss
and every gradient shard equal ctensor's on every rank (float64, relative 1e-10; exit 1
if not). ``--profile``: ``ct.debug.profile``'s table of the planned step (where the time
goes).

    mpiexec -n 2 python benchmarks/llama_tp.py                      # the test's model
    mpiexec -n 2 python benchmarks/llama_tp.py --dim 256 --seq 64    # compute matters
    mpiexec -n 2 python benchmarks/llama_tp.py --dim 512 --seq 128 --vocab 2048  # dominates
    python benchmarks/llama_tp.py --quick                           # simulated, seconds

Without mpiexec it runs simulated: ctensor's counts only (the hand-written step needs two
real ranks).
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
import llama_hand  # noqa: E402

TARGET = 1.15  # ctensor's step time / the hand-written step's (issue 21)
TOLERANCE = 1e-10
SIZES = ("batch", "seq", "dim", "heads", "layers", "vocab")


def build(args):
    """The program's Transformer at the sizes asked for, laid out by ``LLAMA_TP``; its
    inputs (tokens, targets), broadcast, and as NumPy arrays."""
    import test_pytorch_programs as programs
    transformer = type(programs.llama(ct, ct.nn, ct.nn.functional))
    ct.manual_seed(0)
    model = transformer(vocab_size=args.vocab, dim=args.dim, n_layers=args.layers,
                        n_heads=args.heads, max_seq_len=args.seq)
    mesh = ct.placement("cpu", [0, 1])
    model.to_global(mesh, programs.LLAMA_TP)
    rng = np.random.default_rng(1)
    arrays = [rng.integers(0, args.vocab, (args.batch, args.seq)) for _ in range(2)]
    inputs = [ct.tensor(a).to_global(mesh, ct.sbp.broadcast) for a in arrays]
    return model, inputs, arrays


def ct_step(model, inputs):
    loss = model(*inputs)
    loss.backward()
    return loss


def clear(model) -> None:
    for p in model.parameters():
        p.grad = None


def check(model, loss, hand_loss: float, hand_grads: dict, comm) -> float:
    """The largest relative difference, over every rank, between ctensor's loss and
    gradient shards and the hand-written step's."""
    worst = abs(loss.item() - hand_loss) / abs(hand_loss)
    for name, p in model.named_parameters():
        mine = np.asarray(p.grad.to_local())
        scale = max(float(np.abs(mine).max()), 1e-300)
        worst = max(worst, float(np.abs(mine - hand_grads[name]).max()) / scale)
    from mpi4py import MPI
    return comm.allreduce(worst, op=MPI.MAX)


def run(plan_on: bool, args, comm) -> dict:
    """One row: build, warm up (the plan learned), log one step's collectives, check the
    hand-written step against it, then time both step for step."""
    ct.step_plan(plan_on, always=plan_on)  # (followed even where it does not pay)
    model, inputs, arrays = build(args)
    for _ in range(args.warmup):
        ct_step(model, inputs)
        clear(model)
    with ct.debug.comm_log() as log:
        loss = ct_step(model, inputs)
    row = {"collectives": len(log.collectives()), "bytes": log.total_bytes}
    if comm is None:
        clear(model)
        row["report"] = ct.debug.step_plan()
        return row
    params = {n: np.asarray(p.to_local()).copy() for n, p in model.named_parameters()}
    counted = llama_hand.Counted(comm)
    hand = llama_hand.Step(params, args.layers, args.heads, args.vocab, ct.rank(), 2, counted)
    hand_loss, hand_grads = hand(*arrays)
    row.update(hand_collectives=counted.calls, hand_bytes=counted.nbytes,
               error=check(model, loss, hand_loss, hand_grads, comm))
    clear(model)
    ours, theirs, in_comm = [], [], []
    for _ in range(args.repeats):
        comm.Barrier()
        start = time.perf_counter()
        ct_step(model, inputs)
        ours.append(time.perf_counter() - start)
        clear(model)
        comm.Barrier()
        counted.seconds = 0.0
        start = time.perf_counter()
        hand(*arrays)
        theirs.append(time.perf_counter() - start)
        in_comm.append(counted.seconds)
    from mpi4py import MPI
    row["seconds"] = comm.allreduce(statistics.median(ours), op=MPI.MAX)
    row["hand_seconds"] = comm.allreduce(statistics.median(theirs), op=MPI.MAX)
    row["hand_comm"] = comm.allreduce(statistics.median(in_comm), op=MPI.MAX)
    row["report"] = ct.debug.step_plan()
    if args.profile and plan_on:
        with ct.debug.profile() as prof:
            for _ in range(args.repeats):
                ct_step(model, inputs)
                clear(model)
                prof.step()
        row["profile"] = prof.table()
    return row


def check_sizes(args, parser) -> None:
    if args.dim % args.heads or (args.dim // args.heads) % 2:
        parser.error(f"--dim {args.dim} must be a multiple of --heads {args.heads} with an "
                     f"even head size (rotary halves)")
    for name, n in (("heads", args.heads), ("vocab", args.vocab), ("dim", args.dim)):
        if n % 2:
            parser.error(f"--{name} {n} must be even: tensor parallel over 2 ranks splits it")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_quick(parser)
    parser.add_argument("--repeats", type=harness.positive_int, default=None)
    parser.add_argument("--warmup", type=harness.positive_int, default=None)
    for name in SIZES:
        parser.add_argument(f"--{name}", type=harness.positive_int, default=None)
    parser.add_argument("--profile", action="store_true",
                        help="print ct.debug.profile's table of the planned step")
    model = dict(batch=4, seq=8, dim=16, heads=4, layers=2, vocab=32)  # the test's model
    args = harness.settle(parser.parse_args(), {"repeats": 20, "warmup": 3, **model},
                          {"repeats": 2, "warmup": 3, **model})
    check_sizes(args, parser)
    ct.set_default_dtype(np.float64)
    mpi = ct.launched_by_mpi()
    comm = None
    if mpi:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        if comm.size != 2:
            raise SystemExit(f"llama_tp.py: run it on 2 ranks (mpiexec -n 2), got "
                             f"{comm.size}")
    context = ct.simulate(2) if not mpi else None
    if context is not None:
        context.__enter__()
    try:
        rows = [("per-op choice", run(False, args, comm)), ("step plan", run(True, args, comm))]
    finally:
        if context is not None:
            context.__exit__(None, None, None)
    if ct.rank() == 0:
        report(rows, args, mpi)
    if mpi and any(row["error"] > TOLERANCE for _, row in rows):
        raise SystemExit(1)


def report(rows, args, mpi: bool) -> None:
    print(f"Llama L={args.layers} d={args.dim} heads={args.heads} vocab={args.vocab} "
          f"batch={args.batch} seq={args.seq} TP 2 ({'mpiexec' if mpi else 'simulated'}), "
          f"one forward + backward, float64, {args.repeats} steps each")
    print(f"{'':<28}{'step ms':>10}{'/ hand':>9}{'collectives':>13}{'KiB/rank':>10}")
    for name, row in rows:
        ms = f"{row['seconds'] * 1e3:.2f}" if mpi else "-"
        ratio = f"{row['seconds'] / row['hand_seconds']:.2f}x" if mpi else "-"
        print(f"{'ctensor, ' + name:<28}{ms:>10}{ratio:>9}{row['collectives']:>13}"
              f"{row['bytes'] / 1024:>10.1f}")
    if mpi:
        for name, row in rows:
            print(f"{'hand, beside ' + name:<28}{row['hand_seconds'] * 1e3:>10.2f}"
                  f"{'1.00x':>9}{row['hand_collectives']:>13}{row['hand_bytes'] / 1024:>10.1f}"
                  f"   ({row['hand_comm'] * 1e3:.2f} ms of it in Allreduce)")
        worst = max(row["error"] for _, row in rows)
        print(f"hand-written loss and gradients vs ctensor's: largest relative difference "
              f"{worst:.1e} ({'equal' if worst <= TOLERANCE else 'DIFFERENT'} to "
              f"{TOLERANCE:g}); target ctensor / hand <= {TARGET}x")
    else:
        print("hand-written step: needs two real ranks (mpiexec -n 2)")
    plan = rows[1][1]["report"]
    print(f"plan: solved in {plan.solve_seconds:.2f} s, replayed {plan.replayed} steps, "
          f"{plan.deviations} deviations")
    if "profile" in rows[1][1]:
        print(rows[1][1]["profile"])


if __name__ == "__main__":
    main()
