"""Plan a GPT training step on a cluster you do not have: memory per rank, every collective,
predicted step time — from a shape-only run of the same model on this machine.

    python examples/gpt/plan.py --dp 6 --tp 8 --pp 64 --layers 128 --hidden 25600 \\
        --heads 160 --seq-len 2048 --global-batch 3072 --micro-batches 512 \\
        --recompute --precision fp16 --device a100-80gb          # the 1T GPT on 3072 A100s
    python examples/gpt/plan.py --quick         # a small one, in a second (overrides sizes)

The script builds the model exactly as ``train.py`` lays it out (pipeline stage ``s`` owns
ranks ``[s*dp*tp, (s+1)*dp*tp)`` as a ``(dp, tp)`` mesh, Megatron tensor parallel on mesh
axis 1, vocabulary-parallel embedding and head) inside ``ct.simulate(dp*tp*pp, meta=True)``:
no data exists, kernels are skipped, boxing only records its steps. One micro-batch runs
forward and backward and the optimizer steps once; ``ct.plan.step_report`` prices what was
recorded on the device (see ``ctensor/plan.py`` for the model) and replays the pipeline
schedule (``nn.pipeline.schedule``) for all micro-batches. Prints the report, ending with
"fits" or "does not fit" with the rank and the reason.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ctensor as ct  # noqa: E402
import ctensor.nn as nn  # noqa: E402
import ctensor.nn.functional as F  # noqa: E402
import ctensor.optim as optim  # noqa: E402
from ctensor.nn.pipeline import schedule  # noqa: E402
from ctensor.memory import meta_peaks  # noqa: E402
from train import StageModule, _at_least  # noqa: E402

QUICK = ["--dp", "2", "--tp", "2", "--pp", "2", "--layers", "4", "--hidden", "256",
         "--heads", "8", "--seq-len", "128", "--global-batch", "16", "--micro-batches", "4",
         "--vocab", "1024"]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dp", type=_at_least(1), default=1, help="data-parallel size")
    p.add_argument("--tp", type=_at_least(1), default=1, help="tensor-parallel size")
    p.add_argument("--pp", type=_at_least(1), default=1, help="pipeline stages")
    p.add_argument("--micro-batches", type=_at_least(1), default=1,
                   help="micro-batches per step (each of global-batch / micro-batches "
                        "sequences, split over the data-parallel ranks)")
    p.add_argument("--schedule", choices=["1f1b", "gpipe"], default="1f1b")
    p.add_argument("--layers", type=_at_least(1), default=24)
    p.add_argument("--hidden", type=_at_least(1), default=1024)
    p.add_argument("--heads", type=_at_least(1), default=16)
    p.add_argument("--seq-len", type=_at_least(1), default=1024)
    p.add_argument("--global-batch", type=_at_least(1), default=8)
    p.add_argument("--vocab", type=_at_least(1), default=51200)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--recompute", nargs="?", const="full", choices=["full", "selective"],
                   help="activation recompute: full (every block keeps only its input) or "
                        "selective (only the attention core is recomputed)")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="split the residual stream along the sequence on the tensor axis")
    p.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="fp16",
                   help="compute dtype (fp16/bf16: half-precision compute over float32 "
                        "master weights; bf16 is planned with float16's sizes)")
    p.add_argument("--device", default="a100-80gb",
                   help=f"one of {sorted(ct.plan.devices())} or a device of --device-file")
    p.add_argument("--device-file", help="a TOML file of device descriptions "
                                         "(see ctensor/devices.toml)")
    p.add_argument("--gpus-per-node", type=_at_least(1), default=8)
    p.add_argument("--unfused", action="store_true",
                   help="charge memory-bound kernels (elementwise, softmax, LayerNorm) at "
                        "memory bandwidth instead of taking them as fused into the matmuls")
    p.add_argument("--quick", action="store_true", help="a small configuration (CI)")
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--quick" in argv:  # (last wins: --quick makes any command small)
        argv = argv + QUICK
    a = p.parse_args(argv)
    if a.device_file:
        ct.plan.load_devices(a.device_file)
    if a.device not in ct.plan.devices():
        p.error(f"--device {a.device!r}: unknown; known: {sorted(ct.plan.devices())}")
    problems = []
    if a.layers < a.pp:
        problems.append(f"--layers {a.layers} < --pp {a.pp}: every stage needs a block")
    if a.hidden % a.heads or a.heads % a.tp:
        problems.append(f"--hidden {a.hidden} must be a multiple of --heads {a.heads}, and "
                        f"--heads of --tp {a.tp} (whole heads per rank)")
    if a.global_batch % (a.micro_batches * a.dp):
        problems.append(f"--global-batch {a.global_batch} must be a multiple of "
                        f"--micro-batches {a.micro_batches} x --dp {a.dp}")
    if problems:
        p.error("; ".join(problems))
    return a


def model_flops(a) -> float:
    """Model FLOPs of one step (no recompute): ``72 B s l h^2 (1 + s/(6h) + V/(12 l h))``
    (Korthikanti et al. 2022, eq. for MFU; forward 1/3, backward 2/3)."""
    B, s, l, h, V = a.global_batch, a.seq_len, a.layers, a.hidden, a.vocab
    return 72.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))


def build(a) -> list:
    """The stages laid out as ``train.py`` lays them out (see the module docstring)."""
    ct.manual_seed(0)
    gpt = nn.GPT(a.vocab, a.seq_len, a.layers, a.heads, a.hidden, dropout=a.dropout,
                 tie_weights=False, dtype=np.float32)
    if a.recompute:
        gpt.recompute = True if a.recompute == "full" else "selective"
    bounds = np.linspace(0, a.layers, a.pp + 1).round().astype(int)
    stages = []
    for s in range(a.pp):
        ranks = np.arange(s * a.dp * a.tp, (s + 1) * a.dp * a.tp).reshape(a.dp, a.tp)
        mesh = ct.placement("cuda", ranks.tolist())
        module = StageModule(gpt, bounds[s], bounds[s + 1], s == 0, s == a.pp - 1)
        module.recompute_embeddings = a.recompute == "full"
        rules = nn.parallel.hybrid_parallel_rules(module, 2, tp_axis=1)
        for name in ("wte.weight", "lm_head.weight"):  # vocabulary parallel
            if name in rules:
                rules[name] = (ct.sbp.broadcast, ct.sbp.split(0))
        module.to_global(mesh, rules)
        if a.precision != "fp32":
            nn.mixed_precision(module, "float16")
        # a stage's input travels split along the sequence over the tensor axis and is
        # gathered inside the node (Megatron's scatter/gather of pipeline transfers)
        stages.append(nn.pipeline.Stage(module, mesh,
                                        input_sbp=(ct.sbp.split(0), ct.sbp.split(1))))
    if a.sequence_parallel and a.tp > 1:  # the whole GPT at once (its embedding dropout too)
        nn.parallel.sequence_parallel(gpt, tp_axis=1)
    return stages


def plan(a) -> ct.plan.StepReport:
    """Run one micro-batch and an optimizer step shape-only and price the whole step."""
    world = a.dp * a.tp * a.pp
    with ct.simulate(world, meta=True), ct.debug.track_memory():
        stages = build(a)
        params = [p for st in stages for p in st.module.parameters()]
        optimizer = optim.AdamW(params, lr=1e-4, weight_decay=0.1)
        micro = a.global_batch // a.micro_batches
        batch_sbp = (ct.sbp.split(0), ct.sbp.broadcast)
        x = ct.zeros(micro, a.seq_len, dtype=ct.int64, placement=stages[0].placement,
                     sbp=batch_sbp)
        y = ct.zeros(micro, a.seq_len, dtype=ct.int64, placement=stages[-1].placement,
                     sbp=batch_sbp)
        ct.debug.reset_peak_memory()
        start = meta_peaks()
        before, total_before = start["current_activations"], start["current_total"]
        with ct.plan.record() as forward:
            h = x
            for i, st in enumerate(stages):
                if i:
                    h = h.to_global(st.placement, st.input_sbp or h.sbp)
                h = st.module(h)
            loss = F.cross_entropy(h, y)
        saved = meta_peaks()["current_activations"] - before
        with ct.plan.record() as backward:
            loss.backward()
        figures = meta_peaks()
        # the peak above the start, less the gradients (made during the backward and
        # counted with the parameters' state below)
        transient = np.maximum(figures["total"] - total_before
                               - figures["current_gradients"], saved)
        del h, loss
        with ct.plan.record() as update:
            optimizer.step()
        figures = meta_peaks()
        memory = dict(parameters=figures["current_parameters"],
                      gradients=figures["current_gradients"],
                      optimizer=figures["current_optimizer"], saved=saved,
                      transient=transient, boxing=figures["boxing"])
        order = schedule(a.pp, a.micro_batches, a.schedule)
        return ct.plan.step_report(stages=[st.placement for st in stages], forward=forward,
                                   backward=backward, update=update, memory=memory,
                                   order=order, micro_batches=a.micro_batches,
                                   schedule=a.schedule, dev=ct.plan.device(a.device),
                                   gpus_per_node=a.gpus_per_node, world_size=world,
                                   model_flops=model_flops(a), fused=not a.unfused)


def run(argv=None) -> ct.plan.StepReport:
    a = parse_args(argv)
    t0 = time.perf_counter()
    report = plan(a)
    n = sum(c["ranks"] for c in report.classes)
    print(f"GPT {a.dp}x{a.tp}x{a.pp}_{a.global_batch}_{a.hidden}x{a.layers} (heads {a.heads}, "
          f"seq {a.seq_len}, vocab {a.vocab}, recompute {a.recompute or 'none'}, "
          f"{a.precision}{', sequence parallel' if a.sequence_parallel else ''}); planned "
          f"shape-only for {n} ranks in {time.perf_counter() - t0:.1f} s")
    print(report)
    return report


if __name__ == "__main__":
    run()
