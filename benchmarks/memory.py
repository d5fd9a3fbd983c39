"""What each memory technique saves, and what it costs: peak bytes per rank of the GPT
example with and without activation recompute, fully sharded data parallel and float16.

    python benchmarks/memory.py [--quick]

Each row is one run of ``examples/gpt/train.py --track-memory`` (``mpiexec -n 4`` for the
data-parallel pair), compared with the run above it that differs by one option:

* **recompute vs none** where activations dominate (sequence 256, one process): peak
  activation bytes (``ct.debug.memory()``), peak bytes of everything, step time;
* **FSDP (ZeRO-3) vs DP** on 4 ranks where parameters and Adam states dominate (hidden 256,
  sequence 32): parameters + gradients + optimizer states per rank (the sum of each kind's
  peak), peak of everything, step time;
* **fp16 vs fp32** (one process, sequence 256): peak activation bytes, step time.

Also each run's peak resident memory per rank (RSS, which includes Python, NumPy and MPI:
tens of MiB that no technique changes). Loss curves are checked: recompute and FSDP give
the baseline's to 1e-9 (float64 for those pairs), fp16 within 3%. ``--quick``: tiny sizes,
3 steps (CI).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import add_quick, mpiexec, one_blas_thread, positive_int, settle

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "gpt" / "train.py"
MIB = 2.0 ** 20


def run(options: list, nprocs: int, steps: int, log: Path) -> dict:
    cmd = [sys.executable, str(TRAIN), "--steps", str(steps), "--no-progress", "--dropout", "0",
           "--track-memory", "--log-json", str(log), "--warmup", "1"] + options
    if nprocs > 1:
        cmd = [mpiexec(), "-n", str(nprocs)] + cmd
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=3600)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    steps_ = [r for r in records if "step" in r]
    summary = next(r for r in records if r.get("summary"))
    timed = steps_[1:] if len(steps_) > 1 else steps_
    return {"losses": [r["loss"] for r in steps_],
            "step_s": statistics.median(1.0 / r["tokens_per_s"] for r in timed),
            "peak": summary["memory_peak_bytes_per_rank"], "rss": summary["peak_mib_per_rank"]}


def model(hidden: int, layers: int, seq: int, batch: int, dtype: str) -> list:
    return ["--hidden", str(hidden), "--layers", str(layers), "--heads", "4", "--seq-len",
            str(seq), "--global-batch", str(batch), "--dtype", dtype]


def check(name: str, a: list, b: list, rtol: float) -> float:
    worst = max(abs(x - y) / abs(y) for x, y in zip(a, b))
    if not worst <= rtol:
        raise SystemExit(f"memory.py: the loss curve of {name} differs from its baseline by "
                         f"{worst:.1e} (allowed {rtol:g}): {a} vs {b}")
    return worst


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=positive_int, help="training steps per run (default 4)")
    p.add_argument("--seq-len", type=positive_int, help="recompute and fp16 rows (default 256)")
    p.add_argument("--hidden", type=positive_int, help="FSDP rows (default 256)")
    add_quick(p)
    a = settle(p.parse_args(), dict(steps=4, seq_len=256, hidden=256),
               dict(steps=3, seq_len=32, hidden=32))
    one_blas_thread()
    small = 32 if a.quick else 128
    act = model(small, 2 if a.quick else 4, a.seq_len, 4 if a.quick else 8, "float64")
    par = model(a.hidden, 2 if a.quick else 4, 16 if a.quick else 32, 8, "float64")
    fp = model(small, 2 if a.quick else 4, a.seq_len, 4 if a.quick else 8, "float32")
    runs = [("none", act, 1), ("recompute", act + ["--recompute"], 1),
            ("DP 4", par, 4), ("FSDP 4 (ZeRO-3)", par + ["--fsdp"], 4),
            ("fp32", fp, 1), ("fp16", fp + ["--precision", "fp16"], 1)]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, options, nprocs) in enumerate(runs):
            results[name] = run(options, nprocs, a.steps, Path(tmp) / f"{i}.jsonl")
    worst = [check("recompute", results["recompute"]["losses"], results["none"]["losses"],
                   1e-9),
             check("FSDP", results["FSDP 4 (ZeRO-3)"]["losses"], results["DP 4"]["losses"],
                   1e-9),
             check("fp16", results["fp16"]["losses"], results["fp32"]["losses"], 0.03)]

    def states(r):  # parameters + gradients + optimizer states, per rank, at their peaks
        pk = r["peak"]
        return max(pk["parameters"][i] + pk["gradients"][i] + pk["optimizer"][i]
                   for i in range(len(pk["total"])))

    def kind(r, k):
        return max(r["peak"][k])

    print(f"GPT example, peak bytes of shards per rank (ct.debug.memory) and peak RSS per rank; "
          f"{a.steps} steps{' (--quick: tiny sizes, the figures mean nothing)' if a.quick else ''}")
    print(f"{'pair':<34}{'measure':<28}{'baseline':>12}{'with':>12}{'ratio':>8}"
          f"{'step time':>11}{'RSS MiB (base -> with)':>26}")
    pairs = [("recompute vs none", "none", "recompute", "peak activations",
              lambda r: kind(r, "activations")),
             ("FSDP (ZeRO-3) vs DP, dp=4", "DP 4", "FSDP 4 (ZeRO-3)", "params+grads+states",
              states),
             ("fp16 vs fp32", "fp32", "fp16", "peak activations",
              lambda r: kind(r, "activations"))]
    for label, base, with_, measure, fn in pairs:
        b, w = results[base], results[with_]
        rss = f"{max(b['rss']):.0f} -> {max(w['rss']):.0f}"
        print(f"{label:<34}{measure:<28}{fn(b) / MIB:>10.2f}Mi{fn(w) / MIB:>10.2f}Mi"
              f"{fn(w) / fn(b):>7.2f}x{w['step_s'] / b['step_s']:>10.2f}x{rss:>26}")
        print(f"{'':<34}{'peak of everything':<28}{kind(b, 'total') / MIB:>10.2f}Mi"
              f"{kind(w, 'total') / MIB:>10.2f}Mi{kind(w, 'total') / kind(b, 'total'):>7.2f}x")
    print(f"(ratio: with / baseline; step time: median seconds per token, with / baseline.) "
          f"Loss curves: recompute and FSDP equal their baselines to {max(worst[:2]):.1e}, "
          f"fp16 follows fp32 within {worst[2]:.1%}.")


if __name__ == "__main__":
    main()
