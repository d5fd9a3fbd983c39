"""Pipeline parallelism: ctensor's ``nn.pipeline`` against the same pipeline written by hand,
and the GPT example's pipeline layouts against one process (CPU, in one MPI job).

    mpiexec -n 2 python benchmarks/pipeline.py [--quick]     # the two-stage block, GPT --pp 2
    mpiexec -n 4 python benchmarks/pipeline.py [--quick]     # GPT --pp 2 (dp 2) and --pp 4

**The two-stage block** (2 ranks): each stage is ``Linear(512, 2048) - ReLU -
Linear(2048, 512)``, the loss the MSE against a target, ``m`` micro-batches of 256 rows,
forward and backward (1F1B), float32. Four ways, interleaved in every round:

* *by hand, one rank*: NumPy on rank 0, both stages one after the other;
* *by hand, 2 ranks*: NumPy + mpi4py, stage ``s`` on rank ``s``, 1F1B order, each output
  ``Isend`` the moment a forward ends (each input gradient when a backward ends), receives
  posted up front and waited for when needed — the pipeline as one would write it;
* *ctensor, one rank*: ``pipeline_step`` with both stages on placement ``[0]``
  (``ct.simulate(1)`` on rank 0);
* *ctensor, 2 ranks*: ``pipeline_step(..., "1f1b")`` with the stages on ``[0]`` and ``[1]``
  (and GPipe, for comparison).

Before timing, the hand-written step is checked to compute ctensor's loss and every
gradient (float64). Reported: the median step time (slowest rank, steps started together),
ctensor's time over the hand-written one's, and each one's speed-up over its own one-rank
run.

**The GPT example** (``examples/gpt/train.py``, in this process: every rank runs it): one
process (``--simulate 1`` on rank 0 while the others wait) against the pipeline layouts
with 8 micro-batches: tokens/s, the measured idle share of each rank in the last step
(its ``--timeline``) against the theory ``(p - 1) / (v m + p - 1)``, and the activation
memory each stage keeps (GPipe: all ``m`` micro-batches; 1F1B: at most ``p``). The loss
curves are checked against one process's. ``--quick``: tiny sizes, one round.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from harness import add_quick, one_blas_thread, positive_int, settle

one_blas_thread()

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "gpt" / "train.py"
WARMUP_STEPS = 2


# ----------------------------------------------------------------------------- the block
def block_weights(width: int, hidden: int, dtype, seed: int = 0) -> list:
    """The two stages' ``(W1, b1, W2, b2)`` as NumPy arrays: ctensor's ``nn.Linear``
    initialisation, drawn in one process (the same numbers on every rank)."""
    import ctensor as ct
    import ctensor.nn as nn
    with ct.simulate(1):
        ct.manual_seed(seed)
        out = []
        for _ in range(2):
            a, b = nn.Linear(width, hidden, dtype=dtype), nn.Linear(hidden, width, dtype=dtype)
            out.append([np.ascontiguousarray(t.numpy()) for t in
                        (a.weight, a.bias, b.weight, b.bias)])
    return out


def block_data(m: int, rows: int, width: int, dtype, seed: int = 1) -> tuple:
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((rows, width)).astype(dtype) for _ in range(m)]
    ys = [rng.standard_normal((rows, width)).astype(dtype) for _ in range(m)]
    return xs, ys


class HandStage:
    """One stage ``relu(x W1^T + b1) W2^T + b2`` in NumPy, with its gradients."""

    def __init__(self, weights: list):
        self.w1, self.b1, self.w2, self.b2 = weights
        self.zero_grad()

    def zero_grad(self) -> None:
        self.grads = [np.zeros_like(w) for w in (self.w1, self.b1, self.w2, self.b2)]
        self.saved: dict = {}

    def forward(self, m: int, x: np.ndarray) -> np.ndarray:
        h = np.maximum(x @ self.w1.T + self.b1, 0)
        self.saved[m] = (x, h)
        return h @ self.w2.T + self.b2

    def backward(self, m: int, g: np.ndarray, input_grad: bool = True):
        """Accumulate the weight gradients; the input's gradient only when asked (the
        first stage's input is data)."""
        x, h = self.saved.pop(m)
        dw1, db1, dw2, db2 = self.grads
        dw2 += g.T @ h
        db2 += g.sum(0)
        gh = (g @ self.w2) * (h > 0)
        dw1 += gh.T @ x
        db1 += gh.sum(0)
        return gh @ self.w1 if input_grad else None


def mse_grad(out: np.ndarray, y: np.ndarray, m: int) -> tuple:
    """``mean((out - y)^2) / m`` and its gradient."""
    d = out - y
    return float((d * d).mean()) / m, (2.0 / (d.size * m)) * d


def hand_one_rank(stages: list, xs: list, ys: list) -> float:
    """Both stages on this rank, micro-batch after micro-batch (1F1B on one device)."""
    loss = 0.0
    for st in stages:
        st.zero_grad()
    for m, (x, y) in enumerate(zip(xs, ys)):
        out = stages[1].forward(m, stages[0].forward(m, x))
        value, g = mse_grad(out, y, len(xs))
        loss += value
        stages[0].backward(m, stages[1].backward(m, g), input_grad=False)
    return loss


def hand_pipeline(stage: HandStage, rank: int, xs: list, ys: list, comm) -> float:
    """Rank ``rank`` runs stage ``rank`` of two, 1F1B: warm-up forwards ``1 - rank``, then
    one forward and one backward in turn; each forward's output is ``Isend`` to rank 1 when
    it is computed (each input gradient to rank 0 when a backward ends); the receives are
    posted up front and waited for only when needed. Returns the loss on rank 1 (0 on 0)."""
    from mpi4py import MPI
    M = len(xs)
    stage.zero_grad()
    shape, dtype = xs[0].shape, xs[0].dtype
    bufs = [np.empty(shape, dtype) for _ in range(M)]
    recvs = [comm.Irecv(b, source=1 - rank, tag=m) for m, b in enumerate(bufs)]
    sends, keep, loss = [], [], 0.0
    warm = min(1 - rank, M)
    order = [("F", k) for k in range(warm)]
    for k in range(M - warm):
        order += [("F", k + warm), ("B", k)]
    order += [("B", k) for k in range(M - warm, M)]
    for kind, m in order:
        if rank == 0 and kind == "F":
            out = stage.forward(m, xs[m])
            sends.append(comm.Isend(out, dest=1, tag=m))
            keep.append(out)  # alive until sent
        elif rank == 0:
            recvs[m].Wait()
            stage.backward(m, bufs[m], input_grad=False)
        elif kind == "F":
            recvs[m].Wait()
            stage.saved[("out", m)] = stage.forward(m, bufs[m])
        else:
            value, g = mse_grad(stage.saved.pop(("out", m)), ys[m], M)
            loss += value
            gx = stage.backward(m, g)
            sends.append(comm.Isend(gx, dest=0, tag=m))
            keep.append(gx)
    MPI.Request.Waitall(sends)
    return loss


def ctensor_block(placements: list, weights: list, dtype):
    """The two stages as ``nn.pipeline.Stage``s with ``weights``."""
    import ctensor as ct
    import ctensor.nn as nn
    from ctensor.nn.pipeline import Stage
    stages, params = [], []
    for p, (w1, b1, w2, b2) in zip(placements, weights):
        a = nn.Linear(w1.shape[1], w1.shape[0], dtype=dtype)
        b = nn.Linear(w2.shape[1], w2.shape[0], dtype=dtype)
        module = nn.Sequential(a, nn.ReLU(), b)
        module.to_global(p, ct.sbp.broadcast)
        for t, v in zip((a.weight, a.bias, b.weight, b.bias), (w1, b1, w2, b2)):
            with ct.no_grad():
                t.copy_(ct.tensor(v, placement=p, sbp=ct.sbp.broadcast))
        stages.append(Stage(module, p))
        params += [a.weight, a.bias, b.weight, b.bias]
    return stages, params


def ctensor_step(stages, params, xs, ys, kind: str) -> float:
    import ctensor.nn.functional as F  # noqa: F401
    from ctensor.nn.pipeline import pipeline_step
    for t in params:
        t.grad = None
    return pipeline_step(stages, xs, lambda out, y: ((out - y) ** 2).mean(), ys, kind=kind)


def check_block(comm) -> float:
    """The hand-written step (one rank and the 2-rank pipeline) computes ctensor's loss
    and gradients: float64, the benchmark's widths, 16 rows, 3 micro-batches. Returns the
    largest relative difference."""
    import ctensor as ct
    rank = comm.Get_rank()
    dtype = np.float64
    weights = block_weights(64, 256, dtype, seed=5)
    xs, ys = block_data(3, 16, 64, dtype, seed=6)
    ref = [HandStage(w) for w in weights]
    ref_loss = hand_one_rank(ref, xs, ys)
    mine = HandStage(weights[rank])
    pipe_loss = comm.bcast(hand_pipeline(mine, rank, xs, ys, comm), root=1)
    pipe_grads = comm.allgather(mine.grads)
    placements = [ct.placement("cpu", [0]), ct.placement("cpu", [1])]
    stages, params = ctensor_block(placements, weights, dtype)
    cx = [ct.tensor(x, placement=placements[0], sbp=ct.sbp.broadcast) for x in xs]
    cy = [ct.tensor(y, placement=placements[1], sbp=ct.sbp.broadcast) for y in ys]
    loss = ctensor_step(stages, params, cx, cy, "1f1b")
    got = [t.grad.numpy() for t in params]
    worst = abs(loss - ref_loss) / abs(ref_loss)
    worst = max(worst, abs(pipe_loss - ref_loss) / abs(ref_loss))
    want = [g for st in ref for g in st.grads]
    for g, hand, w in zip(got, [g for gs in pipe_grads for g in gs], want):
        scale = np.abs(w).max()
        worst = max(worst, np.abs(g - w).max() / scale, np.abs(hand - w).max() / scale)
    if worst > 1e-10:
        raise SystemExit(f"pipeline.py: the hand-written step and ctensor's differ (relative "
                         f"{worst:.1e}); they do not compute the same thing")
    return worst


def sleep_until_all(comm) -> None:
    """Wait at a barrier without spinning (ranks idle while rank 0 runs alone)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(1e-3)


def step_time(fn, comm, alone: bool = False) -> float:
    """Seconds of one ``fn()``, started together on every rank, the slowest rank's;
    ``alone``: only rank 0 runs it (the others wait without spinning)."""
    from mpi4py import MPI
    comm.Barrier()
    t0 = time.perf_counter()
    if not alone or comm.Get_rank() == 0:
        fn()
    elapsed = time.perf_counter() - t0
    if alone:
        sleep_until_all(comm)
    return comm.allreduce(elapsed, op=MPI.MAX)


def bench_block(a, comm) -> None:
    import ctensor as ct
    rank = comm.Get_rank()
    dtype = np.float32
    worst = check_block(comm)
    weights = block_weights(a.width, a.hidden, dtype)
    rows = {}
    for m in a.micro_batches:
        xs, ys = block_data(m, a.rows, a.width, dtype)
        hand = [HandStage(w) for w in weights]
        mine = HandStage(weights[rank]) if rank < 2 else None
        placements = [ct.placement("cpu", [0]), ct.placement("cpu", [1])]
        stages, params = ctensor_block(placements, weights, dtype)
        cx = [ct.tensor(x, placement=placements[0], sbp=ct.sbp.broadcast) for x in xs]
        cy = [ct.tensor(y, placement=placements[1], sbp=ct.sbp.broadcast) for y in ys]
        with ct.simulate(1):
            alone = [ct.placement("cpu", [0])] * 2
            s1, p1 = ctensor_block(alone, weights, dtype)
            x1 = [ct.tensor(x, placement=alone[0], sbp=ct.sbp.broadcast) for x in xs]
            y1 = [ct.tensor(y, placement=alone[0], sbp=ct.sbp.broadcast) for y in ys]

            def ctensor_alone():
                ctensor_step(s1, p1, x1, y1, "1f1b")
        runs = {
            "by hand, one rank": (lambda: hand_one_rank(hand, xs, ys), True),
            "by hand, 2 ranks (1F1B)": (lambda: hand_pipeline(mine, rank, xs, ys, comm), False),
            "ctensor, one rank": (ctensor_alone, True),
            "ctensor, 2 ranks (1F1B)": (lambda: ctensor_step(stages, params, cx, cy, "1f1b"),
                                        False),
            "ctensor, 2 ranks (GPipe)": (lambda: ctensor_step(stages, params, cx, cy, "gpipe"),
                                         False),
        }
        names = list(runs)
        samples = {n: [] for n in names}
        # one step of every run in turn, in a rotated order, repeated: the machine drifts
        # within minutes (other jobs share the cores), so runs compared are measured side
        # by side; the first round is a warm-up
        for r in range(a.rounds * a.repeats + 1):
            for n in names[r % len(names):] + names[:r % len(names)]:
                fn, alone_ = runs[n]
                if alone_:
                    with ct.simulate(1):
                        t = step_time(fn, comm, alone=True)
                else:
                    t = step_time(fn, comm)
                if r:
                    samples[n].append(t)
        rows[m] = {n: statistics.median(v) for n, v in samples.items()}
    if rank == 0:
        print(f"two-stage block: each stage Linear({a.width}, {a.hidden})-ReLU-Linear("
              f"{a.hidden}, {a.width}), MSE, micro-batches of {a.rows} rows, float32, forward "
              f"+ backward; median of {a.repeats * a.rounds} steps each, taken in turn, slowest "
              f"rank. "
              f"The hand-written step computes ctensor's loss and gradients (float64, "
              f"{worst:.0e}).")
        print(f"{'m':>3}  {'run':<26}{'ms':>9}{'vs by hand':>12}{'speed-up over one rank':>24}")
        for m, times in rows.items():
            for n, t in times.items():
                hand2 = times["by hand, 2 ranks (1F1B)"]
                one = times["by hand, one rank"] if n.startswith("by hand") else \
                    times["ctensor, one rank"]
                vs = f"{t / hand2:.2f}x" if "2 ranks" in n else "-"
                speed = f"{one / t:.2f}x" if "2 ranks" in n else "1.00x"
                print(f"{m:>3}  {n:<26}{1e3 * t:>9.1f}{vs:>12}{speed:>24}")
            ct_speed = times["ctensor, one rank"] / times["ctensor, 2 ranks (1F1B)"]
            hand_speed = times["by hand, one rank"] / times["by hand, 2 ranks (1F1B)"]
            print(f"     1F1B: ctensor {times['ctensor, 2 ranks (1F1B)'] / hand2:.2f}x the "
                  f"hand-written step (target <= 1.15x); speed-up {ct_speed:.2f}x vs "
                  f"{hand_speed:.2f}x by hand ({ct_speed / hand_speed:.0%} of it; target >= "
                  f"90%)")


# ----------------------------------------------------------------------------- the GPT example
def gpt_configs(size: int, quick: bool) -> list:
    """``(name, train.py options)`` of the pipeline layouts for this world size."""
    if size == 2:
        layouts = [("1x1x2 1F1B", ["--pp", "2"]),
                   ("1x1x2 GPipe", ["--pp", "2", "--schedule", "gpipe"]),
                   ("1x1x2 interleaved v=2", ["--pp", "2", "--schedule", "interleaved",
                                              "--virtual-stages", "2"])]
    else:
        layouts = [("2x1x2 1F1B", ["--dp", "2", "--pp", "2"]),
                   ("2x1x2 GPipe", ["--dp", "2", "--pp", "2", "--schedule", "gpipe"]),
                   ("1x1x4 1F1B", ["--pp", "4"]),
                   ("1x1x4 GPipe", ["--pp", "4", "--schedule", "gpipe"]),
                   ("1x1x4 interleaved v=2", ["--pp", "4", "--schedule", "interleaved",
                                              "--virtual-stages", "2"])]
    return layouts


def run_gpt(train, argv: list, log: Path, timeline: Path) -> None:
    train.run(argv + ["--log-json", str(log), "--timeline", str(timeline)])


def read_log(path: Path, warmup: int) -> dict:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    steps = [r for r in records if "step" in r]
    summary = next(r for r in records if r.get("summary"))
    return {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in steps[warmup:]),
            "losses": [r["loss"] for r in steps], "timeline": summary.get("timeline")}


def bench_gpt(a, comm) -> None:
    import importlib.util
    import contextlib
    import io
    rank, size = comm.Get_rank(), comm.Get_size()
    spec = importlib.util.spec_from_file_location("gpt_train", TRAIN)
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    model = ["--hidden", str(a.gpt_hidden), "--layers", str(a.gpt_layers), "--heads", "4",
             "--seq-len", str(a.gpt_seq_len), "--global-batch", str(a.gpt_batch),
             "--micro-batches", str(a.gpt_micro_batches), "--steps", str(a.gpt_steps),
             "--dropout", "0.1", "--no-progress"]
    warmup = min(WARMUP_STEPS, a.gpt_steps - 1)
    layouts = [("one process", None)] + gpt_configs(size, a.quick)
    tmp = Path(tempfile.mkdtemp(prefix="ctensor-pipeline-")) if rank == 0 else None
    tmp = Path(comm.bcast(str(tmp) if tmp else None, root=0))
    results = {name: [] for name, _ in layouts}
    for r in range(a.rounds):
        for name, opts in layouts[r % len(layouts):] + layouts[:r % len(layouts)]:
            log = tmp / f"{len(results[name])}-{name.replace(' ', '_')}.jsonl"
            quiet = io.StringIO()
            with contextlib.redirect_stdout(quiet):
                if opts is None:  # one process: rank 0 alone, the others wait
                    if rank == 0:
                        train.run(model + ["--simulate", "1", "--log-json", str(log)])
                    sleep_until_all(comm)
                else:
                    run_gpt(train, model + opts, log, tmp / f"{name.replace(' ', '_')}.svg")
            comm.Barrier()
            if rank == 0:
                results[name].append(read_log(log, warmup))
    if rank != 0:
        return
    res = {n: sorted(rs, key=lambda x: x["tokens_per_s"])[len(rs) // 2] for n, rs in
           results.items()}
    ref = np.array(res["one process"]["losses"])
    worst = 0.0
    for name, r in res.items():
        diff = np.abs(np.array(r["losses"]) - ref) / np.abs(ref)
        if not (diff[0] <= 1e-5 and diff.max() <= 2e-3):
            raise SystemExit(f"pipeline.py: the loss curve of {name} differs from one "
                             f"process's ({r['losses']} vs {ref.tolist()})")
        worst = max(worst, float(diff.max()))
    one = res["one process"]["tokens_per_s"]
    print(f"\nGPT example: h={a.gpt_hidden} l={a.gpt_layers} seq={a.gpt_seq_len} batch="
          f"{a.gpt_batch}, {a.gpt_micro_batches} micro-batches, dropout 0.1, float32, "
          f"{size} ranks; median tokens/s of steps {warmup + 1}-{a.gpt_steps}, median of "
          f"{a.rounds} round(s); idle and activations from the last step's timeline. Loss "
          f"curves equal one process's to {worst:.0e}.")
    print(f"{'layout':<24}{'tokens/s':>9}{'vs one':>8}  {'idle per rank (theory)':<34}"
          f"{'peak activations MiB per rank (live micro-batches)'}")
    for name, r in res.items():
        tl = r["timeline"]
        if tl is None:
            print(f"{name:<24}{r['tokens_per_s']:>9.0f}{1.0:>7.2f}x")
            continue
        idle = " ".join(f"{v:.0%}" for v in tl["idle_fraction"].values())
        idle += f" ({tl['theoretical_idle']:.0%})"
        live = tl["peak_live_micro_batches"]
        mem = " ".join(f"{b / 2**20:.1f}({live[k]})"
                       for k, b in tl["peak_activation_bytes"].items())
        print(f"{name:<24}{r['tokens_per_s']:>9.0f}{r['tokens_per_s'] / one:>7.2f}x  "
              f"{idle:<34}{mem}")
    if a.quick:  # a check that it runs: nothing to keep
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"(pictures of the last steps: {tmp}/*.svg)")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--micro-batches", type=lambda t: [positive_int(x) for x in t.split(",")],
                   help="the block's micro-batch counts (default 4,8)")
    p.add_argument("--rows", type=positive_int, help="rows per micro-batch (default 256)")
    p.add_argument("--width", type=positive_int, help="default 512")
    p.add_argument("--hidden", type=positive_int, help="default 2048")
    p.add_argument("--repeats", type=positive_int,
                   help="timed steps of every run, times --rounds (default 5 x 3)")
    p.add_argument("--rounds", type=positive_int,
                   help="rounds (default 3; for the GPT: runs of each layout)")
    p.add_argument("--gpt-hidden", type=positive_int, help="default 64")
    p.add_argument("--gpt-layers", type=positive_int, help="default 8")
    p.add_argument("--gpt-seq-len", type=positive_int, help="default 64")
    p.add_argument("--gpt-batch", type=positive_int, help="default 16")
    p.add_argument("--gpt-micro-batches", type=positive_int, help="default 8")
    p.add_argument("--gpt-steps", type=positive_int, help="default 6")
    add_quick(p)
    a = settle(p.parse_args(argv),
               dict(micro_batches=[4, 8], rows=256, width=512, hidden=2048, repeats=5,
                    rounds=3, gpt_hidden=64, gpt_layers=8, gpt_seq_len=64, gpt_batch=16,
                    gpt_micro_batches=8, gpt_steps=6),
               dict(micro_batches=[4], rows=16, width=32, hidden=64, repeats=1, rounds=1,
                    gpt_hidden=16, gpt_layers=8, gpt_seq_len=8, gpt_batch=8,
                    gpt_micro_batches=4, gpt_steps=2))
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    size = comm.Get_size()
    if size not in (2, 4):
        p.error(f"run it under mpiexec -n 2 or mpiexec -n 4 (the world has {size} ranks)")
    if a.gpt_batch % a.gpt_micro_batches or (a.gpt_batch // a.gpt_micro_batches) % 2:
        p.error("--gpt-batch must be a multiple of 2 x --gpt-micro-batches (dp 2)")
    if a.gpt_layers % 8 or a.gpt_micro_batches < 4:
        p.error("--gpt-layers must be a multiple of 8 (pp 4 x 2 virtual stages) and "
                "--gpt-micro-batches >= 4 (interleaved on 4 stages)")
    import ctensor  # noqa: F401  (the world: ct runs on this MPI job)
    if size == 2:
        bench_block(a, comm)
    bench_gpt(a, comm)


if __name__ == "__main__":
    main()
