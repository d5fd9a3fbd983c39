"""Predicted against published: Megatron-LM's GPT runs on A100-80GB planned shape-only.

    python benchmarks/plan_vs_megatron.py            # every row, then the seed's configs
    python benchmarks/plan_vs_megatron.py --quick    # the first row only (CI)

Each row is planned by ``examples/gpt/plan.py`` (the GPT example laid out ``dp x tp x pp``,
one micro-batch traced in ``ct.simulate(n, meta=True)``, the 1F1B schedule replayed) on the
``a100-80gb`` device of ``ctensor/devices.toml`` with 8 GPUs per node and
``ct.plan.EFFICIENCY`` (one constant for every row). Configurations from the papers:

* Narayanan et al., SC'21, Table 1 (weak scaling; measured teraFLOP/s per GPU, counted
  with their formula ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))``, which includes the
  recompute): sequence 2048, vocabulary 51200, full activation recompute, fp16,
  micro-batch size 1 (so ``global batch / dp`` micro-batches), the non-interleaved 1F1B
  schedule (the paper interleaves some rows; a plain 1F1B bubble is larger: conservative);
* Korthikanti et al., 2022 (Table 3 / the Megatron-LM README; model FLOPs utilisation
  ``72 B s l h^2 (1 + s/(6h) + V/(12 l h)) / (time n 312e12)``): sequence parallelism and
  selective recompute, data-parallel size 1, global batch 4 (22B, micro-batch 4), 64
  (175B), 280 (530B), 512 (1T) with micro-batch 1.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples", "gpt"))

import ctensor as ct  # noqa: E402
import plan  # noqa: E402

# params (B), heads, hidden, layers, tp, pp, GPUs, global batch, measured TFLOP/s per GPU
NARAYANAN = [(1.7, 24, 2304, 24, 1, 1, 32, 512, 137), (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
             (7.5, 32, 4096, 36, 4, 1, 128, 512, 142), (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
             (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
             (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
             (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
             (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
             (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
             (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163)]
# name, heads, hidden, layers, tp, pp, GPUs, global batch, micro-batches, measured MFU %
KORTHIKANTI = [("22B", 64, 6144, 48, 8, 1, 8, 4, 1, 41.5),
               ("175B", 96, 12288, 96, 8, 8, 64, 64, 64, 51.4),
               ("530B", 128, 20480, 105, 8, 35, 280, 280, 280, 56.0),
               ("1T", 160, 25600, 128, 8, 64, 512, 512, 512, 56.3)]
SEQ, VOCAB = 2048, 51200
# the seed's comparison configurations ``dxmxp_B_hxl`` on 4 nodes x 8 V100 16GB: LiBai's
# GPT-2 benchmark family (hidden 1024, 16 heads, sequence 1024, GPT-2's vocabulary 50257,
# 24 layers, 48 when the pipeline has 4 or more stages; 16 sequences per GPU and
# micro-batch; fp16), with and without full recompute
SEED = ["32x1x1_512_1024x24", "8x4x1_512_1024x24", "4x8x1_512_1024x24",
        "4x1x8_512_1024x48", "2x8x2_512_1024x24", "1x8x4_512_1024x48"]


def args_for(heads, hidden, layers, tp, pp, gpus, batch, micro_batches, extra) -> list:
    dp = gpus // (tp * pp)
    return [str(x) for x in ("--dp", dp, "--tp", tp, "--pp", pp, "--layers", layers,
                             "--hidden", hidden, "--heads", heads, "--seq-len", SEQ,
                             "--vocab", VOCAB, "--global-batch", batch, "--micro-batches",
                             micro_batches, "--precision", "fp16", "--device", "a100-80gb",
                             "--gpus-per-node", 8)] + extra


def rows(quick: bool) -> list:
    out = []
    for size, heads, h, l, tp, pp, gpus, batch, measured in NARAYANAN[:1 if quick else None]:
        dp = gpus // (tp * pp)
        a = plan.parse_args(args_for(heads, h, l, tp, pp, gpus, batch, batch // dp,
                                     ["--recompute", "full"]))
        out.append((f"{size}B (SC'21)", a, "TFLOP/s", measured, gpus, batch, l, h))
    for name, heads, h, l, tp, pp, gpus, batch, m, mfu in ([] if quick else KORTHIKANTI):
        a = plan.parse_args(args_for(heads, h, l, tp, pp, gpus, batch, m,
                                     ["--recompute", "selective", "--sequence-parallel"]))
        out.append((f"{name} (2022)", a, "MFU %", mfu, gpus, batch, l, h))
    return out


def seed_configs() -> None:
    """Plan the seed's ``dxmxp_B_hxl`` configurations on V100 16GB and say which fit."""
    print("\nthe seed's configurations on 4 nodes x 8 v100-16gb (LiBai's GPT-2 family, "
          "16 sequences per GPU per micro-batch, fp16)")
    print(f"{'config':<22} {'recompute':>9} {'peak GiB':>9}  fits  {'step s':>7}  "
          f"{'samples/s':>9}")
    for name in SEED:
        mesh, batch, shape = name.split("_")
        dp, tp, pp = (int(v) for v in mesh.split("x"))
        hidden, layers = (int(v) for v in shape.split("x"))
        batch = int(batch)
        for recompute in ([], ["--recompute", "full"]):
            args = plan.parse_args([str(x) for x in (
                "--dp", dp, "--tp", tp, "--pp", pp, "--layers", layers, "--hidden", hidden,
                "--heads", 16, "--seq-len", 1024, "--vocab", 50257, "--global-batch", batch,
                "--micro-batches", batch // (16 * dp), "--precision", "fp16", "--device",
                "v100-16gb", "--gpus-per-node", 8)] + recompute)
            report = plan.plan(args)
            print(f"{name:<22} {'full' if recompute else 'none':>9} "
                  f"{report.worst['total'] / 2 ** 30:>9.1f}  "
                  f"{'yes' if report.fits else 'NO ':<4}  {report.step_seconds:>7.3f}  "
                  f"{batch / report.step_seconds:>9.1f}", flush=True)


def main(argv=None) -> list:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the first row only")
    a = p.parse_args(argv)
    print(f"ct.plan.EFFICIENCY = {ct.plan.EFFICIENCY} (one constant, every row)")
    print(f"{'model':<16} {'dp x tp x pp':>13} {'metric':>8} {'predicted':>10} "
          f"{'published':>10} {'ratio':>6} {'peak GiB':>9}  fits  planned in")
    results = []
    for name, args, metric, published, gpus, batch, l, h in rows(a.quick):
        t0 = time.perf_counter()
        report = plan.plan(args)
        s, V = SEQ, VOCAB
        if metric == "TFLOP/s":
            flops = 96.0 * batch * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
            predicted = flops / (report.step_seconds * gpus) / 1e12
        else:
            flops = 72.0 * batch * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))
            predicted = 100 * flops / (report.step_seconds * gpus * report.device.peak_flops)
        ratio = predicted / published
        cfg = f"{args.dp}x{args.tp}x{args.pp}"
        print(f"{name:<16} {cfg:>13} {metric:>8} {predicted:>10.1f} {published:>10.1f} "
              f"{ratio:>6.2f} {report.worst['total'] / 2 ** 30:>9.1f}  "
              f"{'yes' if report.fits else 'NO ':<4}  {time.perf_counter() - t0:.1f} s",
              flush=True)
        results.append((name, cfg, metric, predicted, published, ratio, report.fits))
    if not a.quick:
        seed_configs()
    return results


if __name__ == "__main__":
    main()
