"""Predict, then measure: the cost model (``ctensor/cost.py``, the ``cpu`` table of
``ctensor/devices.toml`` that ``python benchmarks/calibrate.py`` measured) against the time of
the GPT example's training step on this machine, for seven layouts.

    python benchmarks/predict.py [--quick] [--rounds 3] [--steps 6]

**Predicted**: ``examples/gpt/plan.py --device cpu --unfused`` — the step run shape-only
(``ct.simulate(n, meta=True)``) with the layout ``train.py`` gives it, its ops and
collectives traced, and ``ct.plan.step_report`` pricing them with the one cost model (every
kernel's roofline, ``op_overhead`` per dispatched op, every collective, the pipeline
schedule replayed). **Measured**: ``examples/gpt/train.py`` with the same options (one
process, or ``mpiexec -n 2``), the median step time after two warm-up steps, repeated
``--rounds`` times in a rotated order; the median over rounds is reported. The layouts: one
process, DP 2, TP 2, TP 2 + sequence parallel, PP 2 (1F1B, 4 micro-batches), FSDP 2
(ZeRO-3) — and the two-stage pipeline block of ``benchmarks/pipeline.py``
(``Linear - ReLU - Linear`` per stage on ranks 0 and 1, 1F1B, forward and backward only),
predicted from one micro-batch's per-stage traces and ``ct.plan.replay``.

Prints per layout the prediction, the measured median, the error, and the layouts ranked
by each. The target (issue 21): every error within 15% and the same ranking. One BLAS
thread per rank; a loaded machine measures the other processes too (the load average is
printed); ``--calibrate`` measures the ``cpu`` table before each round (``--quick``
calibration) and predicts with it, so predictions and runs see the same load; both are
medians over rounds.
``--quiet S``: before each measured run (and calibration) wait up to ``S`` seconds for the
machine to be idle (other processes, niced ones too, under 10% of the cores for 5 s, from
``/proc/stat``; on a shared machine their load is what a prediction cannot know) and print
the share of the cores they took during each run.
``--quick``: a tiny model, one round, in under two minutes.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import add_quick, mpiexec, one_blas_thread, positive_int, settle

one_blas_thread()

import numpy as np  # noqa: E402

from calibrate import busy_since, cpu_times, wait_quiet  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GPT_DIR = ROOT / "examples" / "gpt"
TRAIN = GPT_DIR / "train.py"
sys.path.insert(0, str(GPT_DIR))
WARMUP_STEPS = 2  # not timed: plans, signature caches, connections

#: (name, ranks, train.py / plan.py options)
LAYOUTS = [("one process", 1, ["--dp", "1"]),
           ("dp 2", 2, ["--dp", "2"]),
           ("tp 2", 2, ["--dp", "1", "--tp", "2"]),
           ("tp 2 + sp", 2, ["--dp", "1", "--tp", "2", "--sp"]),
           ("pp 2", 2, ["--dp", "1", "--pp", "2", "--micro-batches", "4"]),
           ("fsdp 2", 2, ["--dp", "2", "--fsdp"])]
BLOCK = "pipeline block"


def model_options(a) -> list:
    return ["--layers", str(a.layers), "--hidden", str(a.hidden), "--heads", str(a.heads),
            "--seq-len", str(a.seq_len), "--global-batch", str(a.global_batch),
            "--dropout", "0", "--clip", "1.0"]


# ----------------------------------------------------------------------------- predictions
def predict_gpt(a, options: list) -> float:
    """Seconds of one training step as ``ct.plan`` predicts it on the ``cpu`` table."""
    import plan
    from data import VOCAB_SIZE
    args = plan.parse_args(model_options(a) + options +
                           ["--device", "cpu", "--unfused", "--precision", "fp32",
                            "--vocab", str(VOCAB_SIZE)])
    return plan.plan(args).step_seconds


def _block_stages(a, placements):
    import ctensor as ct
    import ctensor.nn as nn
    from ctensor.nn.pipeline import Stage
    stages = []
    for p in placements:
        module = nn.Sequential(nn.Linear(a.width, a.block_hidden, dtype=np.float32),
                               nn.ReLU(), nn.Linear(a.block_hidden, a.width, dtype=np.float32))
        module.to_global(p, ct.sbp.broadcast)
        stages.append(Stage(module, p))
    return stages


def mse(out, y):
    return ((out - y) ** 2).mean()


def predict_block(a) -> float:
    """Seconds of the block's 1F1B step: one micro-batch traced stage by stage
    (``examples/gpt/plan.py``'s ``one_micro_batch``), each stage's forward and backward
    priced (``ct.plan.stage_seconds``), the schedule replayed (``ct.plan.replay``)."""
    import ctensor as ct
    import plan
    from ctensor.nn.pipeline import schedule
    dev = ct.plan.device("cpu")
    with ct.simulate(2, meta=True), ct.debug.track_memory():
        stages = _block_stages(a, [ct.placement("cpu", [0]), ct.placement("cpu", [1])])
        x = ct.zeros(a.rows, a.width, placement=stages[0].placement)
        y = ct.zeros(a.rows, a.width, placement=stages[1].placement)
        forward, backward, _ = plan.one_micro_batch(stages, x, y, mse)
    # both ranks of the machine compute at once (its table's contention)
    t_f = ct.plan.stage_seconds(forward, dev, 8, fused=False, ranks=2)
    t_b = ct.plan.stage_seconds(backward, dev, 8, fused=False, ranks=2)
    seconds, _ = ct.plan.replay(schedule(2, a.block_micro_batches, "1f1b"), t_f, t_b)
    return seconds


# ----------------------------------------------------------------------------- measurements
def measure_gpt(a, ranks: int, options: list) -> float:
    """Median seconds of ``train.py``'s steps after the warm-up (its JSON log)."""
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "log.json")
        cmd = [sys.executable, str(TRAIN), *model_options(a), *options,
               "--steps", str(WARMUP_STEPS + a.steps), "--log-json", log, "--no-progress"]
        if ranks > 1:
            cmd = [mpiexec(), "-n", str(ranks)] + cmd
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if out.returncode:
            raise SystemExit(f"predict.py: {' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
        rows = [json.loads(line) for line in open(log)]
    tokens = a.global_batch * a.seq_len
    steps = [tokens / r["tokens_per_s"] for r in rows if "tokens_per_s" in r and
             not r.get("summary")][WARMUP_STEPS:]
    return statistics.median(steps)


def measure_block(a) -> float:
    cmd = [mpiexec(), "-n", "2", sys.executable, __file__, "--block-worker",
           "--width", str(a.width), "--block-hidden", str(a.block_hidden), "--rows",
           str(a.rows), "--block-micro-batches", str(a.block_micro_batches),
           "--steps", str(a.steps)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise SystemExit(f"predict.py: {' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def block_worker(a) -> None:
    """Under ``mpiexec -n 2``: the block's 1F1B step, slowest rank's median (rank 0
    prints it)."""
    from mpi4py import MPI
    import ctensor as ct
    from ctensor.nn.pipeline import pipeline_step
    from harness import slowest_median
    comm = MPI.COMM_WORLD
    ct.manual_seed(0)
    p0, p1 = ct.placement("cpu", [0]), ct.placement("cpu", [1])
    stages = _block_stages(a, [p0, p1])
    params = [t for st in stages for t in st.module.parameters()]
    rng = np.random.default_rng(1)
    xs = [ct.tensor(rng.standard_normal((a.rows, a.width)).astype(np.float32), placement=p0)
          for _ in range(a.block_micro_batches)]
    ys = [ct.tensor(rng.standard_normal((a.rows, a.width)).astype(np.float32), placement=p1)
          for _ in range(a.block_micro_batches)]

    def step():
        for t in params:
            t.grad = None
        pipeline_step(stages, xs, mse, ys, kind="1f1b")
    for _ in range(WARMUP_STEPS):
        step()
    seconds = slowest_median(step, a.steps, comm)
    if comm.rank == 0:
        print(seconds)


# ----------------------------------------------------------------------------- the table
def ranking(times: dict) -> list:
    return sorted(times, key=times.get)


def report(predicted: dict, measured: dict) -> dict:
    print(f"{'layout':<16} {'predicted ms':>13} {'measured ms':>12} {'error':>8}")
    errors = {}
    for name in predicted:
        errors[name] = predicted[name] / measured[name] - 1
        print(f"{name:<16} {1e3 * predicted[name]:>13.2f} {1e3 * measured[name]:>12.2f} "
              f"{100 * errors[name]:>+7.1f}%")
    by_p, by_m = ranking(predicted), ranking(measured)
    print(f"ranked by prediction:  {' < '.join(by_p)}")
    print(f"ranked by measurement: {' < '.join(by_m)}")
    within = sum(abs(e) <= 0.15 for e in errors.values())
    print(f"within 15%: {within} of {len(errors)}; same ranking: "
          f"{'yes' if by_p == by_m else 'no'}; largest error "
          f"{100 * max(abs(e) for e in errors.values()):.1f}%")
    return dict(predicted=predicted, measured=measured, errors=errors,
                same_ranking=by_p == by_m, within=within)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_quick(p)
    for name, text in (("layers", 2), ("hidden", 128), ("heads", 4), ("seq-len", 64),
                       ("global-batch", 16), ("steps", 6), ("rounds", 3), ("width", 512),
                       ("block-hidden", 2048), ("rows", 256), ("block-micro-batches", 4)):
        p.add_argument(f"--{name}", type=positive_int, help=f"default {text}")
    p.add_argument("--calibrate", action="store_true",
                   help="before each round run python benchmarks/calibrate.py --quick (rewrites "
                        "the [cpu] table of ctensor/devices.toml) and predict with it: each "
                        "round's predictions and runs see the same load; medians over rounds")
    p.add_argument("--json", help="also write the figures to this file")
    p.add_argument("--quiet", type=float, default=0.0, metavar="S",
                   help="wait up to S seconds for an idle machine before each measured run")
    p.add_argument("--block-worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    return settle(a, dict(layers=2, hidden=128, heads=4, seq_len=64, global_batch=16, steps=6,
                          rounds=3, width=512, block_hidden=2048, rows=256,
                          block_micro_batches=4),
                  dict(layers=2, hidden=64, heads=4, seq_len=32, global_batch=8, steps=4,
                       rounds=1, width=256, block_hidden=1024, rows=128,
                       block_micro_batches=4))


def predict_all(a) -> dict:
    """Every layout's predicted step; with ``--calibrate`` the ``cpu`` table measured first
    (``python benchmarks/calibrate.py --quick``: it rewrites ``ctensor/devices.toml``, which the
    measured runs then read too, so both choose alike)."""
    if a.calibrate:
        import ctensor as ct
        quiet = ["--quiet", str(a.quiet)] if a.quiet else []
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "calibrate.py"), "--quick",
                        *quiet], check=True, timeout=1200, stdout=subprocess.DEVNULL)
        ct.cost.load_devices()  # the new table, for the choice and the prices here
    predicted = {name: predict_gpt(a, options) for name, _, options in LAYOUTS}
    predicted[BLOCK] = predict_block(a)
    return predicted


def main(argv=None) -> dict:
    a = parse_args(argv)
    if a.block_worker:
        block_worker(a)
        return {}
    t0 = time.perf_counter()
    jobs = [(name, lambda r=ranks, o=options: measure_gpt(a, r, o))
            for name, ranks, options in LAYOUTS] + [(BLOCK, lambda: measure_block(a))]
    guesses: dict = {name: [] for name, _ in jobs}
    rounds: dict = {name: [] for name, _ in jobs}
    for r in range(a.rounds):
        if a.calibrate or r == 0:  # (with --calibrate: each round under its own load)
            for name, seconds in predict_all(a).items():
                guesses[name].append(seconds)
        for name, job in jobs[r % len(jobs):] + jobs[:r % len(jobs)]:
            if a.quiet:
                waited = wait_quiet(a.quiet)
            start = cpu_times()
            rounds[name].append(job())
            if a.quiet:
                print(f"  {name}: {1e3 * rounds[name][-1]:.2f} ms, other processes "
                      f"{100 * busy_since(start):.0f}% of the cores (waited {waited:.0f} s)",
                      flush=True)
    predicted = {name: statistics.median(v) for name, v in guesses.items()}
    measured = {name: statistics.median(v) for name, v in rounds.items()}
    print(f"GPT {a.layers} layers, hidden {a.hidden}, {a.heads} heads, sequence {a.seq_len}, "
          f"batch {a.global_batch}, float32; block {a.width}-{a.block_hidden}-{a.width}, "
          f"{a.block_micro_batches} x {a.rows} rows; {a.rounds} round(s) of {a.steps} "
          f"steps{', each calibrated first' if a.calibrate else ''}; load now "
          f"{os.getloadavg()[0]:.1f}; {time.perf_counter() - t0:.0f} s in all")
    figures = report(predicted, measured)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(figures, f, indent=1)
    return figures


if __name__ == "__main__":
    main()
