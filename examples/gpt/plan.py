"""Plan a GPT training step on a cluster you do not have: memory per rank, every collective,
predicted step time — from a shape-only run of the same model on this machine.

    python examples/gpt/plan.py --dp 6 --tp 8 --pp 64 --layers 128 --hidden 25600 \\
        --heads 160 --seq-len 2048 --global-batch 3072 --micro-batches 512 \\
        --recompute --precision fp16 --device a100-80gb          # the 1T GPT on 3072 A100s
    python examples/gpt/plan.py --quick         # a small one, in a second
    python examples/gpt/plan.py --quick --tp 4  # the small one at another size (yours win)

The script builds the model exactly as ``train.py`` lays it out (``train.stage_modules``:
pipeline device ``d`` owns ranks ``[d*dp*tp, (d+1)*dp*tp)`` as a ``(dp, tp)`` mesh, virtual
stage ``j`` on device ``j % pp``, Megatron tensor parallel on mesh axis 1,
vocabulary-parallel embedding and head; ``train.py``'s options, one definition for both)
inside ``ct.simulate(dp*tp*pp, meta=True)``: no data exists, kernels are skipped, boxing
only records its steps. One micro-batch runs forward and backward stage by stage as
``nn.pipeline`` runs it, and the optimizer steps once; ``ct.plan.step_report`` prices what
was recorded on the device (see ``ctensor/plan.py`` for the model) and replays the pipeline
schedule (``nn.pipeline.schedule``) for all micro-batches. Prints the report, ending with
"fits" or "does not fit" with the rank and the reason; ``--timeline PATH`` draws the
predicted schedule.
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
from train import (PRECISIONS, _at_least, add_memory_options, add_model_options,  # noqa: E402
                   apply_memory_options, check_pipeline_options, data_sbp, moe_options,
                   stage_modules)

QUICK = ["--dp", "2", "--tp", "2", "--pp", "2", "--layers", "4", "--hidden", "256",
         "--heads", "8", "--seq-len", "128", "--global-batch", "16", "--micro-batches", "4",
         "--vocab", "1024"]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dp", type=_at_least(1), default=1, help="data-parallel size")
    add_model_options(p, layers=24, hidden=1024, heads=16, seq_len=1024)
    p.add_argument("--vocab", type=_at_least(1), default=51200)
    add_memory_options(p, precision="fp16",
                       precision_help="compute dtype (fp16/bf16: half-precision compute over "
                                      "float32 master weights; bf16 is planned with "
                                      "float16's sizes)")
    p.add_argument("--device", default="a100-80gb",
                   help=f"one of {sorted(ct.plan.devices())} or a device of --device-file")
    p.add_argument("--device-file", help="a TOML file of device descriptions "
                                         "(see ctensor/devices.toml)")
    p.add_argument("--gpus-per-node", type=_at_least(1), default=8)
    p.add_argument("--clip", type=float, default=1.0,
                   help="max grad norm, clipped before the optimizer step as train.py does "
                        "(0: off)")
    p.add_argument("--unfused", action="store_true",
                   help="charge memory-bound kernels (elementwise, softmax, LayerNorm) at "
                        "memory bandwidth instead of taking them as fused into the matmuls")
    p.add_argument("--timeline", help="draw the predicted pipeline schedule (one row per "
                                      "stage: forward, backward, idle) to this file: .svg "
                                      "needs nothing, .png needs matplotlib")
    p.add_argument("--quick", action="store_true",
                   help=f"a small configuration (CI): {' '.join(QUICK)}; options you give "
                        f"as well take precedence")
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--quick" in argv:  # QUICK first: argparse keeps the last value, so yours win
        argv = QUICK + argv
    a = p.parse_args(argv)
    if a.device_file:
        ct.plan.load_devices(a.device_file)
    if a.device not in ct.plan.devices():
        p.error(f"--device {a.device!r}: unknown; known: {sorted(ct.plan.devices())}")
    problems = []
    if a.hidden % a.heads or a.heads % a.tp:
        problems.append(f"--hidden {a.hidden} must be a multiple of --heads {a.heads}, and "
                        f"--heads of --tp {a.tp} (whole heads per rank)")
    if a.cp > 1 and a.seq_len < a.cp:
        problems.append(f"--cp {a.cp} splits the sequence on its own mesh axis: it needs "
                        f"--seq-len >= --cp (got {a.seq_len})")
    if a.global_batch % (a.micro_batches * a.dp):
        problems.append(f"--global-batch {a.global_batch} must be a multiple of "
                        f"--micro-batches {a.micro_batches} x --dp {a.dp}")
    if a.timeline and not a.timeline.lower().endswith(".svg"):
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            problems.append(f"--timeline {a.timeline} needs matplotlib, which is not "
                            f"installed: pip install -e '.[examples]', or give a .svg path "
                            f"(needs nothing)")
    if problems:
        p.error("; ".join(problems))
    try:
        check_pipeline_options(a, "plan.py")
    except SystemExit as exc:
        p.error(str(exc).removeprefix("plan.py: "))
    return a


def model_flops(a) -> float:
    """Model FLOPs of one step (no recompute): ``72 B s l h^2 (1 + s/(6h) + V/(12 l h))``
    (Korthikanti et al. 2022, eq. for MFU; forward 1/3, backward 2/3)."""
    B, s, l, h, V = a.global_batch, a.seq_len, a.layers, a.hidden, a.vocab
    return 72.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))


def placement_kind(a) -> str:
    """The placements' device kind: ``cpu`` for a CPU table (``--device cpu``: the plan of
    ``train.py`` on this machine), else ``cuda``. The signature choice prices that kind with
    ``--device``'s table (``ct.cost.set_machine``, in :func:`plan`), the one the step is
    priced on: the plan chooses by the cost it predicts."""
    return "cpu" if a.device == "cpu" else "cuda"


def build(a) -> list:
    """The stages laid out as ``train.py`` lays them out (see the module docstring); on GPUs
    each stage's input sequence-split over the tensor axis (Megatron-LM's scattered
    transfers), on a CPU as ``train.py`` sends it."""
    ct.manual_seed(0)
    gpt = nn.GPT(a.vocab, a.seq_len, a.layers, a.heads, a.hidden, dropout=a.dropout,
                 tie_weights=False, dtype=np.float32, **moe_options(a))
    kind = placement_kind(a)
    stages = stage_modules(gpt, a, kind, scatter_transfers=kind == "cuda")
    half = PRECISIONS[a.precision] and "float16"  # (bf16: float16's sizes)
    apply_memory_options(gpt, stages, a.recompute, a.fsdp, half)
    return stages


def gpt_loss(out, y):
    """The GPT's loss of logits ``out`` against ids ``y`` (as ``train.py``)."""
    return F.cross_entropy(out.flatten(0, -2), y.flatten())


def cp_loss(out, y):
    """:func:`gpt_loss` with --cp (as ``train.py``): the class dim moved, so the sequence
    split stays (flattening it with the batch would gather the logits)."""
    return F.cross_entropy(out.transpose(1, 2), y)


def one_micro_batch(stages, x, y, loss_fn=gpt_loss) -> tuple:
    """One micro-batch forward and backward stage by stage, as ``nn.pipeline`` runs it:
    each stage's input a leaf, its output sent on and then kept as a graph handle, its
    input's gradient sent back. Returns per stage the forward and backward traces and the
    activation bytes (per rank) it keeps until its backward: what its ranks gained during
    its forward, and the input it received (made on its ranks during the previous one)."""
    n, world = len(stages), ct.world_size()
    ranks = [np.isin(np.arange(world), st.placement.rank_list) for st in stages]
    forward, backward, ins, outs = [], [], [], []
    saved = [np.zeros(world, dtype=np.int64) for _ in stages]
    h = x
    for j, st in enumerate(stages):
        before = meta_peaks(world)["current_activations"]
        with ct.plan.record() as trace:
            if j:
                h.requires_grad_()
            ins.append(h)
            out = st.module(h)
            if j == n - 1:
                out = loss_fn(out, y)
            else:
                h = out.detach().to_global(stages[j + 1].placement, stages[j + 1].input_sbp)
                out = ct.autograd.graph_handle(out)
        outs.append(out)
        forward.append(trace)
        gained = meta_peaks(world)["current_activations"] - before
        saved[j] += np.where(ranks[j], gained, 0)
        if j + 1 < n and stages[j + 1].placement != st.placement:
            saved[j + 1] += np.where(ranks[j + 1], gained, 0)
    del h, out
    grad = None
    for j in reversed(range(n)):
        with ct.plan.record() as trace:
            outs[j].backward(grad)
            if j:
                grad = ins[j].grad.detach().to_global(outs[j - 1].placement, outs[j - 1].sbp)
        backward.append(trace)
        ins[j] = outs[j] = None
    return forward, backward[::-1], saved


def plan(a) -> ct.plan.StepReport:
    """Run one micro-batch and an optimizer step shape-only and price the whole step."""
    world = a.dp * a.cp * a.tp * a.pp
    with ct.cost.using(placement_kind(a), a.device):
        return _plan(a, world)


def _plan(a, world: int) -> ct.plan.StepReport:
    with ct.simulate(world, meta=True), ct.debug.track_memory():
        stages = build(a)
        params = list({id(p): p for st in stages for p in st.module.parameters()}.values())
        optimizer = optim.AdamW(params, lr=1e-4, weight_decay=0.1)
        micro = a.global_batch // a.micro_batches
        batch_sbp = data_sbp(a)
        x = ct.zeros(micro, a.seq_len, dtype=ct.int64, placement=stages[0].placement,
                     sbp=batch_sbp)
        y = ct.zeros(micro, a.seq_len, dtype=ct.int64, placement=stages[-1].placement,
                     sbp=batch_sbp)
        ct.debug.reset_peak_memory()
        total_before = meta_peaks(world)["current_total"]
        forward, backward, saved = one_micro_batch(stages, x, y,
                                                   cp_loss if a.cp > 1 else gpt_loss)
        figures = meta_peaks(world)
        # the peak above the start, less the gradients (made during the backward and
        # counted with the parameters' state below)
        transient = np.maximum(figures["total"] - total_before
                               - figures["current_gradients"], sum(saved))
        with ct.plan.record() as update:
            if a.clip:
                nn.utils.clip_grad_norm_(params, a.clip)
            optimizer.step()
        figures = meta_peaks(world)
        memory = dict(parameters=figures["current_parameters"],
                      gradients=figures["current_gradients"],
                      optimizer=figures["current_optimizer"], saved=saved,
                      transient=transient, boxing=figures["boxing"])
        order = schedule(a.pp, a.micro_batches, a.schedule, a.virtual_stages)
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
          f"{a.precision}{', sequence parallel' if a.sp else ''}"
          f"{f', context parallel {a.cp}' if a.cp > 1 else ''}"
          f"{f', fsdp {a.fsdp}' if a.fsdp else ''}, {a.schedule}"
          f"{f' x {a.virtual_stages} chunks' if a.virtual_stages > 1 else ''}); planned "
          f"shape-only for {n} ranks in {time.perf_counter() - t0:.1f} s")
    print(report)
    if a.timeline:
        tl = nn.pipeline.Timeline.replayed_schedule(report)
        tl.save(a.timeline, title=f"predicted: {tl.describe()}".replace(" (replayed)", ""))
        print(f"predicted pipeline schedule written to {a.timeline}")
    return report


if __name__ == "__main__":
    run()
