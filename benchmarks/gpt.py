"""GPT training throughput and memory: one process vs DP, TP and PP on 2 ranks (CPU).

    python benchmarks/gpt.py [--steps 8] [--hidden 128] [--layers 4] [--device cpu|cuda]

Runs ``examples/gpt/train.py`` once per configuration (``mpiexec -n 2`` for the parallel
ones, each in its own job so peak memory is per configuration), reads the tokens/s of the
steps after the first two (warm-up: plans, signature caches) and the peak resident memory of
each rank, and prints them with ratios against the one-process run.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "gpt" / "train.py"
CONFIGS = [("one process", 1, 1, 1), ("DP 2", 2, 1, 1), ("TP 2", 1, 2, 1), ("PP 2", 1, 1, 2)]


def mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else (shutil.which("mpiexec") or "mpiexec")


def run(dp, tp, pp, a) -> dict:
    n = dp * tp * pp
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "log.jsonl"
        cmd = [sys.executable, str(TRAIN), "--dp", str(dp), "--tp", str(tp), "--pp", str(pp),
               "--steps", str(a.steps), "--hidden", str(a.hidden), "--layers", str(a.layers),
               "--heads", str(a.heads), "--seq-len", str(a.seq_len), "--global-batch",
               str(a.global_batch), "--micro-batches", str(2 if pp > 1 else 1),
               "--device", a.device, "--no-progress", "--log-json", str(log)]
        if n > 1:
            cmd = [mpiexec(), "-n", str(n)] + cmd
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, timeout=1800)
        records = [json.loads(line) for line in log.read_text().splitlines()]
    steps = [r["tokens_per_s"] for r in records if "step" in r][2:]
    summary = next(r for r in records if r.get("summary"))
    return {"tokens_per_s": statistics.median(steps), "peak_mib": summary["peak_mib_per_rank"]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    results = [(name, run(dp, tp, pp, a)) for name, dp, tp, pp in CONFIGS]
    base = results[0][1]
    print(f"GPT h={a.hidden} l={a.layers} seq={a.seq_len} batch={a.global_batch} on {a.device} "
          f"(median tokens/s after 2 warm-up steps; one BLAS thread per rank)")
    print(f"{'config':<12}{'tokens/s':>10}{'vs one':>8}{'peak MiB per rank':>24}{'vs one':>8}")
    for name, r in results:
        peak = max(r["peak_mib"])
        print(f"{name:<12}{r['tokens_per_s']:>10.0f}{r['tokens_per_s'] / base['tokens_per_s']:>7.2f}x"
              f"{str(r['peak_mib']):>24}{peak / max(base['peak_mib']):>7.2f}x")


if __name__ == "__main__":
    main()
