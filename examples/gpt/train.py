"""Train a byte-level GPT on Python's own documentation with data, tensor and pipeline
parallelism — and no hand-written communication.

    python examples/gpt/train.py                                   # one process
    mpiexec -n 4 python examples/gpt/train.py --dp 2 --tp 2        # 2-D data x tensor
    mpiexec -n 4 python examples/gpt/train.py --tp 2 --pp 2        # tensor x pipeline
    python examples/gpt/train.py --simulate 4 --dp 2 --pp 2        # the same in one process

The world is ``dp * cp * tp * pp`` ranks (``--cp``: context parallel, the sequence split on
a mesh axis of its own between the data and tensor axes). Pipeline stage ``s`` owns ranks
``[s*dp*tp, (s+1)*dp*tp)`` as a ``(dp, tp)`` mesh; the stage's blocks are laid out with
``nn.parallel`` rules (data parallel on mesh axis 0, Megatron tensor parallel on axis 1),
activations move between stages with ``to_global`` and ``nn.pipeline`` runs the micro-batches
(GPipe, 1F1B or interleaved 1F1B with ``--virtual-stages``; ``--timeline`` draws the last
step's schedule). Config names follow ``dxmxp_B_hxl``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ctensor as ct  # noqa: E402
import ctensor.nn as nn  # noqa: E402
import ctensor.nn.functional as F  # noqa: E402
import ctensor.optim as optim  # noqa: E402
from ctensor.nn.pipeline import SCHEDULES, Stage, Timeline, pipeline_step  # noqa: E402
from data import VOCAB_SIZE, Corpus  # noqa: E402


def _at_least(low: int):
    """``type=`` for argparse: an int >= ``low``, else a usage error that says so."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value
    return parse


def _non_negative(text: str) -> float:
    """``type=`` for argparse: a number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def add_model_options(p: argparse.ArgumentParser, **defaults) -> None:
    """The model and its layout: ``--tp --sp --pp --micro-batches --schedule
    --virtual-stages --layers --hidden --heads --seq-len --global-batch --dropout`` (the
    options ``plan.py`` shares; ``defaults`` overrides the defaults by option name)."""
    d = dict(layers=2, hidden=64, heads=4, seq_len=32, global_batch=8, dropout=0.1)
    d.update(defaults)
    p.add_argument("--tp", type=_at_least(1), default=1, help="tensor-parallel size")
    p.add_argument("--cp", type=_at_least(1), default=1,
                   help="context-parallel size: a mesh axis splitting the sequence "
                        "(attention runs as a ring, Ulysses or a gather, as ct.attention's "
                        "cost model picks; parameters broadcast on it)")
    p.add_argument("--sp", "--sequence-parallel", dest="sp", action="store_true",
                   help="sequence parallel on the tensor-parallel axis (Megatron-SP: the "
                        "residual stream split along the sequence; needs --tp > 1)")
    p.add_argument("--pp", type=_at_least(1), default=1, help="pipeline stages")
    p.add_argument("--micro-batches", type=_at_least(1), default=1,
                   help="micro-batches per step (each of global-batch / micro-batches "
                        "sequences, split over the data-parallel ranks)")
    p.add_argument("--schedule", choices=list(SCHEDULES), default="1f1b",
                   help="pipeline schedule: gpipe, 1f1b, or interleaved 1F1B (Megatron-LM)")
    p.add_argument("--virtual-stages", type=_at_least(1), default=1,
                   help="model chunks per pipeline device for --schedule interleaved (the "
                        "layers are split into pp x virtual-stages stages)")
    p.add_argument("--layers", type=_at_least(1), default=d["layers"])
    p.add_argument("--hidden", type=_at_least(1), default=d["hidden"])
    p.add_argument("--heads", type=_at_least(1), default=d["heads"])
    p.add_argument("--seq-len", type=_at_least(1), default=d["seq_len"])
    p.add_argument("--global-batch", type=_at_least(1), default=d["global_batch"])
    p.add_argument("--dropout", type=float, default=d["dropout"])
    p.add_argument("--moe-experts", type=_at_least(0), default=0,
                   help="experts of each block's MLP (nn.MoE; 0: dense MLPs)")
    p.add_argument("--moe-top-k", type=_at_least(1), default=2, help="experts per token")
    p.add_argument("--moe-capacity-factor", type=_non_negative, default=1.25,
                   help="slots per expert and sequence: ceil(factor * seq_len * top_k / E)")
    p.add_argument("--ep", type=_at_least(1), default=1,
                   help="expert-parallel size, carved out of data parallel (a divisor of "
                        "--dp): the experts split S(0) over it, the batch split on it too")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dp", type=_at_least(1), default=None,
                   help="data-parallel size (default: the world size / (tp * pp))")
    add_model_options(p)
    p.add_argument("--timeline", help="write a picture of the last step's pipeline schedule "
                                      "(one row per rank: forward, backward, idle) to this "
                                      "file: .svg needs nothing, .png needs matplotlib")
    p.add_argument("--steps", type=_at_least(1), default=50)
    p.add_argument("--lr", type=_non_negative, default=3e-3)
    p.add_argument("--warmup", type=_at_least(0), default=5,
                   help="warm-up steps of the cosine schedule")
    p.add_argument("--clip", type=_non_negative, default=1.0, help="max grad norm (0: off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--simulate", type=_at_least(0), default=0,
                   help="simulate this many ranks in one process (instead of mpiexec)")
    p.add_argument("--log-json", help="write one JSON object per step to this file")
    add_checkpoint_options(p)
    p.add_argument("--plot", help="write the loss curve to this PNG (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--profile", metavar="TRACE.json",
                   help="profile the steps after the first three (ct.debug.profile): print "
                        "where their time goes per rank and write a Chrome trace here")
    add_memory_options(p)
    p.add_argument("--track-memory", action="store_true",
                   help="count bytes of shards per rank (ct.debug.memory) and report peaks")
    a = p.parse_args(argv)
    check_memory_options(p, a)
    check_checkpoint_options(p, a)
    check_picture_options(p, a)
    return a


def check_picture_options(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """--plot (and a --timeline that is not .svg) need matplotlib: say so before training,
    not after it (a usage error, exit 2)."""
    wanted = [f"--plot {a.plot}"] if a.plot else []
    if a.timeline and not a.timeline.lower().endswith(".svg"):
        wanted.append(f"--timeline {a.timeline}")
    if not wanted:
        return
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        p.error(f"{' and '.join(wanted)} need{'s' if len(wanted) == 1 else ''} matplotlib, "
                f"which is not installed: pip install -e '.[examples]' (or pip install "
                f"matplotlib){'; a .svg --timeline needs nothing' if a.timeline else ''}")


def config_name(a) -> str:
    """``dp x tp x pp _ batch _ hidden x layers``, then ``_cp N`` / ``_moe E`` (``_ep N``)."""
    extra = (f"_cp{a.cp}" if a.cp > 1 else "") + \
        (f"_moe{a.moe_experts}" + (f"ep{a.ep}" if a.ep > 1 else "") if a.moe_experts else "")
    return f"{a.dp}x{a.tp}x{a.pp}_{a.global_batch}_{a.hidden}x{a.layers}{extra}"


def parameter_count(h: int, l: int, vocab: int, seq: int) -> int:
    """P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)): blocks plus token and position
    embeddings (head tied to the token embedding, final LayerNorm not counted)."""
    return round(12 * l * h * h * (1 + 13 / (12 * h) + (vocab + seq) / (12 * l * h)))


class StageModule(nn.Module):
    """The part of a GPT one pipeline stage runs: embeddings on the first stage, the final
    LayerNorm and the head on the last, and a run of blocks."""

    def __init__(self, gpt: nn.GPT, first: int, last: int, is_first: bool, is_last: bool):
        super().__init__()
        self.is_first, self.is_last = is_first, is_last
        if is_first:
            self.wte, self.wpe, self.drop = gpt.wte, gpt.wpe, gpt.drop
        self.blocks = nn.ModuleList(list(gpt.blocks)[first:last])
        if is_last:
            self.ln_f, self.lm_head = gpt.ln_f, gpt.lm_head

    #: with full activation recompute the embeddings are recomputed too (their output, its
    #: dropout mask and the reduced vocabulary-parallel lookup are not kept: only the ids)
    recompute_embeddings = False

    def _embed(self, x):
        pos = ct.arange(x.shape[1], placement=x.placement)
        return self.drop(self.wte(x) + self.wpe(pos))

    def forward(self, x):
        if self.is_first:
            x = nn.utils.checkpoint(self._embed, x) if self.recompute_embeddings and \
                ct.is_grad_enabled() else self._embed(x)
        for block in self.blocks:
            x = block(x)
        if self.is_last:
            x = self.lm_head(self.ln_f(x))
        return x


def build(a):
    """The model split into pipeline stages, each laid out on its own (dp, tp) mesh."""
    if a.dp is None:  # every rank the tensor and pipeline sizes leave over does data parallel
        if ct.world_size() % (a.tp * a.cp * a.pp):
            raise SystemExit(f"train.py: the world of {ct.world_size()} ranks is not a multiple "
                             f"of --cp {a.cp} x --tp {a.tp} x --pp {a.pp}")
        a.dp = ct.world_size() // (a.tp * a.cp * a.pp)
    world = a.dp * a.cp * a.tp * a.pp
    if ct.world_size() != world:
        raise SystemExit(f"train.py: --dp {a.dp} x --cp {a.cp} x --tp {a.tp} x --pp {a.pp} = "
                         f"{world} ranks, "
                         f"but the world has {ct.world_size()}")
    check_pipeline_options(a)
    ct.manual_seed(a.seed)
    gpt = nn.GPT(VOCAB_SIZE, a.seq_len, a.layers, a.heads, a.hidden, dropout=a.dropout,
                 tie_weights=False, dtype=np.dtype(a.dtype),  # untied: the head may sit on
                 **moe_options(a))
    return gpt, stage_modules(gpt, a, a.device)              # another stage


def moe_options(a) -> dict:
    """``nn.GPT``'s mixture-of-experts arguments from --moe-experts/--moe-top-k/..."""
    return dict(moe_experts=a.moe_experts, moe_top_k=a.moe_top_k,
                moe_capacity_factor=a.moe_capacity_factor)


def stage_mesh_shape(a) -> tuple:
    """A stage's mesh: ``(dp, tp)``, or ``(dp / ep, ep, tp)`` with 1 < --ep < --dp (the
    expert axis carved out of data parallel; the batch split over both data axes). With
    --ep = --dp the data axis is the expert axis (no axis of size 1). With --cp > 1 a
    context-parallel axis of that size comes before the tensor axis."""
    data = (a.dp // a.ep, a.ep) if 1 < a.ep < a.dp else (a.dp,)
    return data + ((a.cp,) if a.cp > 1 else ()) + (a.tp,)


def data_sbp(a, sequence_split: bool = False) -> tuple:
    """The batch's layout on a stage mesh: split on every data axis, and on the tensor
    axis broadcast (or split along the sequence); on the context-parallel axis split along
    the sequence."""
    cp = (ct.sbp.split(1),) if a.cp > 1 else ()
    data = (ct.sbp.split(0),) * (len(stage_mesh_shape(a)) - 1 - len(cp))
    return data + cp + (ct.sbp.split(1) if sequence_split else ct.sbp.broadcast,)


def stage_modules(gpt: nn.GPT, a, device: str, scatter_transfers: bool = False) -> list:
    """``gpt`` split into ``pp x virtual-stages`` pipeline stages, virtual stage ``s`` on
    device ``s % pp``: the ``(dp, tp)`` mesh of ranks ``[d*dp*tp, (d+1)*dp*tp)``, with
    Megatron tensor parallel on mesh axis 1, the vocabulary-parallel embedding and head,
    and with ``a.sp`` sequence parallel. A stage receives its input sequence-split over
    the tensor axis with ``a.sp`` or ``scatter_transfers`` (1/tp of it crosses between
    nodes and is gathered inside: Megatron-LM's scatter/gather of pipeline transfers)."""
    n_stages = a.pp * a.virtual_stages  # virtual stage s runs on device s % pp
    bounds = np.linspace(0, a.layers, n_stages + 1).round().astype(int)
    stages = []
    for s in range(n_stages):
        d = s % a.pp
        shape = stage_mesh_shape(a)
        size = a.dp * a.cp * a.tp  # the ranks of one pipeline device
        ranks = np.arange(d * size, (d + 1) * size).reshape(shape)
        mesh = ct.placement(device, ranks.tolist())
        module = StageModule(gpt, bounds[s], bounds[s + 1], s == 0, s == n_stages - 1)
        tp_axis = len(shape) - 1
        rules = nn.parallel.hybrid_parallel_rules(module, len(shape), tp_axis=tp_axis)
        for name in ("wte.weight", "lm_head.weight"):  # vocabulary parallel
            if name in rules:
                rules[name] = (ct.sbp.broadcast,) * tp_axis + (ct.sbp.split(0),)
        if a.ep > 1:  # experts S(0) on the expert axis (and ETP on the tensor axis)
            rules.update(nn.parallel.expert_parallel_rules(
                module, len(shape), ep_axis=len(shape) - 2 - (a.cp > 1),
                tp_axis=tp_axis if a.tp > 1 else None))
        module.to_global(mesh, rules)
        # (after the first stage the residual stream arrives sequence-split)
        input_sbp = data_sbp(a, (a.sp or scatter_transfers) and s > 0)
        stages.append(Stage(module, mesh, input_sbp=input_sbp))
    if a.sp and a.tp > 1:  # the residual stream split along the sequence on the tp axis
        nn.parallel.sequence_parallel(gpt, tp_axis=len(stage_mesh_shape(a)) - 1)
    return stages


def main(a) -> list:
    memory = MemoryOptions(a)  # --recompute --fsdp --precision --track-memory
    gpt, stages = build(a)
    memory.setup(gpt, stages)
    params = [p for st in stages for p in st.module.parameters()]
    n_params = sum(p.numel() for p in params)
    formula = parameter_count(a.hidden, a.layers, VOCAB_SIZE, a.seq_len)
    untied_extra = 0 if gpt.tie_weights else VOCAB_SIZE * a.hidden
    h, experts = a.hidden, a.moe_experts  # an MoE block: E experts (8h^2) and a router (Eh)
    moe_extra = len(gpt.moe_layers()) * ((experts - 1) * 8 * h * h + experts * h - 5 * h)
    optimizer = optim.AdamW(params, lr=a.lr, weight_decay=0.1)
    # total > warm-up: a run shorter than the warm-up never leaves it (so a resumed run
    # and one straight run see the same learning rates)
    scheduler = optim.lr_scheduler.cosine_with_warmup(
        optimizer, a.warmup, total_steps=max(a.steps, a.warmup + 1))
    corpus = Corpus()
    rng = np.random.default_rng(a.seed)
    checkpoints = Checkpoints(a)  # --save --save-every --keep --load --resume
    start_step = checkpoints.restore(gpt, optimizer, scheduler, memory, rng, corpus)
    if a.global_batch % a.micro_batches:
        raise SystemExit("train.py: --global-batch must be a multiple of --micro-batches")
    micro = a.global_batch // a.micro_batches
    first, last = stages[0].placement, stages[-1].placement
    batch_sbp = data_sbp(a)
    rank0 = ct.rank() == 0
    if rank0:
        print(f"config {config_name(a)}: {n_params:,} parameters; formula 12lh^2(1+13/(12h)+"
              f"(V+s)/(12lh)) = {formula:,}; difference {n_params - formula:,} = final "
              f"LayerNorm 2h = {2 * a.hidden}"
              + (f" + untied head Vh = {untied_extra}" if untied_extra else "")
              + (f" + experts (E-1)8h^2+Eh-5h per MoE block = {moe_extra:,}" if moe_extra
                 else ""))
        print(f"corpus: {len(corpus):,} bytes of Python documentation; world {ct.world_size()} "
              f"({'simulated' if a.simulate else ct.runtime.world().mode.value})")
    bar = None
    if rank0 and not a.no_progress:
        try:
            from tqdm import tqdm
            bar = tqdm(total=a.steps - start_step, desc=config_name(a), unit="step")
        except ImportError:
            bar = None
    log_file = open(a.log_json, "w") if (a.log_json and rank0) else None
    history = []
    loss_fn = memory.loss_fn(  # (--cp: the class dim moved, not (batch, seq) flattened,
        (lambda logits, y: F.cross_entropy(logits.transpose(1, 2), y)) if a.cp > 1 else
        (lambda logits, y: F.cross_entropy(logits.flatten(0, -2), y.flatten())))  # so the
    # sequence split stays: flattening it with the batch would gather the logits)
    t_start = time.perf_counter()
    prof = ct.debug.profile() if a.profile else None
    for step in range(start_step, a.steps):
        if prof is not None and step == min(start_step + 3, a.steps - 1):
            prof.__enter__()  # (after the warm-up: the step plan learns at the end of the
            # third step at the latest; signature caches, connections)
        t0 = time.perf_counter()
        xb, yb = corpus.batch(rng, a.global_batch, a.seq_len)
        # every rank draws the same batch from the same seeded generator: ct.tensor checks
        # that on the first step only (the check is a collective, and ranks wait at it)
        with ct.debug.check_tensor_data(step == start_step):
            xs = [ct.tensor(xb[m * micro:(m + 1) * micro], placement=first, sbp=batch_sbp)
                  for m in range(a.micro_batches)]
            ys = [ct.tensor(yb[m * micro:(m + 1) * micro], placement=last, sbp=batch_sbp)
                  for m in range(a.micro_batches)]
        timeline = step_timeline(a, step)
        loss = pipeline_step(stages, xs, loss_fn, ys, kind=a.schedule,
                             num_model_chunks=a.virtual_stages,
                             timeline=timeline) / memory.loss_scale()
        with ct.debug.profile.phase("optimizer"):  # (the clip is the optimizer's too)
            memory.step(optimizer, params, a.clip)  # clip, then step (skipped on fp16 overflow)
            optimizer.zero_grad()
        scheduler.step()
        dt = time.perf_counter() - t0
        if prof is not None and prof.is_open:
            prof.step()
        tokens_per_s = a.global_batch * a.seq_len / dt
        history.append(loss)
        if log_file:
            log_file.write(json.dumps({"step": step, "loss": loss, "tokens_per_s": tokens_per_s,
                                       "lr": optimizer.param_groups[0]["lr"]}) + "\n")
            log_file.flush()
        if bar is not None:
            bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tokens_per_s:,.0f}")
            bar.update(1)
        checkpoints.periodic(step + 1, lambda: training_state(
            gpt, optimizer, scheduler, memory, rng, step + 1))
    elapsed = time.perf_counter() - t_start
    if prof is not None and prof.is_open:
        prof.__exit__(None, None, None)
        table = prof.table()  # (collective: every rank)
        prof.export_chrome_trace(a.profile)
        if rank0:
            print(table)
            print(f"Chrome trace written to {a.profile} (chrome://tracing or ui.perfetto.dev)")
    if bar is not None:
        bar.close()
    peak_mib = peak_memory_per_rank()
    memory.gather()  # collective: every rank's ct.debug.memory() figures
    if log_file:
        summary = {"summary": True, "steps": len(history),
                   "tokens_per_s": len(history) * a.global_batch * a.seq_len
                   / max(elapsed, 1e-9), "peak_mib_per_rank": peak_mib, **memory.summary()}
        if getattr(a, "recorded_timeline", None) is not None:
            summary["timeline"] = a.recorded_timeline.as_dict()
        log_file.write(json.dumps(summary) + "\n")
        log_file.close()
    checkpoints.final(a.steps, lambda: training_state(
        gpt, optimizer, scheduler, memory, rng, a.steps))
    memory.print_report(rank0)
    if a.moe_experts and a.pp == 1:  # (reading the counts is a collective of the stage)
        for i, moe in enumerate(gpt.moe_layers()):
            st = moe.stats
            if rank0:
                print(f"MoE block {i}, last step: drop rate {st['drop_rate']:.3f}, tokens "
                      f"per expert {st['tokens_per_expert'].tolist()}")
    if rank0 and history:
        steps_run = len(history)
        print(f"done {config_name(a)}: {steps_run} steps, loss {history[0]:.4f} -> "
              f"{history[-1]:.4f}, {steps_run * a.global_batch * a.seq_len / elapsed:,.0f} "
              f"tokens/s, peak memory per rank {peak_mib} MiB")
    write_timeline(a, rank0)
    if a.plot and rank0 and history:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("train.py: --plot needs matplotlib (pip install -e '.[examples]')")
        else:
            fig, ax = plt.subplots(figsize=(6, 4))
            ax.plot(range(start_step, start_step + len(history)), history)
            ax.set_xlabel("step")
            ax.set_ylabel("cross entropy (nats/byte)")
            ax.set_title(f"GPT {config_name(a)}")
            fig.tight_layout()
            fig.savefig(a.plot, dpi=100)
    return history


# ----------------------------------------------------------------------------- pipeline options
# --schedule and --virtual-stages (add_model_options) and --timeline: the pipeline schedule
# and the picture of it.


def check_pipeline_options(a, prog: str = "train.py") -> None:
    """Usage errors of the pipeline (and sequence-parallel) options and of the model's
    shape, before any collective (``SystemExit`` with the message, which begins with
    ``prog``)."""
    if a.hidden % a.heads:
        raise SystemExit(f"{prog}: --hidden {a.hidden} must be a multiple of --heads "
                         f"{a.heads} (each head gets hidden / heads features); for example "
                         f"--heads {_divisor_near(a.hidden, a.heads)}")
    if a.schedule == "interleaved" and a.micro_batches < a.pp:
        raise SystemExit(f"{prog}: --schedule interleaved needs --micro-batches >= --pp "
                         f"(got {a.micro_batches} < {a.pp})")
    if a.sp and a.tp < 2:
        raise SystemExit(f"{prog}: --sp splits the sequence over the tensor-parallel ranks "
                         f"and needs --tp > 1 (got --tp {a.tp})")
    if a.cp > 1 and a.seq_len < a.cp:
        raise SystemExit(f"{prog}: --cp {a.cp} splits the sequence over its own mesh axis: "
                         f"it needs --seq-len >= --cp (got {a.seq_len})")
    if a.moe_experts and a.moe_top_k > a.moe_experts:
        raise SystemExit(f"{prog}: --moe-top-k {a.moe_top_k} > --moe-experts "
                         f"{a.moe_experts}: a token picks among the experts there are")
    if a.ep > 1 and (not a.moe_experts or a.moe_experts % a.ep or a.dp % a.ep):
        raise SystemExit(f"{prog}: --ep {a.ep} splits the experts over part of the "
                         f"data-parallel ranks: it needs --moe-experts a multiple of it (got "
                         f"{a.moe_experts}) and a --dp it divides (got {a.dp})")
    v = a.virtual_stages
    if v > 1 and a.schedule != "interleaved":
        raise SystemExit(f"{prog}: --virtual-stages {v} needs --schedule interleaved "
                         f"(got --schedule {a.schedule})")
    if a.layers % (a.pp * v) and v > 1:
        raise SystemExit(f"{prog}: --virtual-stages {v} does not divide the layers: --layers "
                         f"{a.layers} must be a multiple of --pp x --virtual-stages = "
                         f"{a.pp * v}")
    if a.layers < a.pp * v:
        raise SystemExit(f"{prog}: --layers {a.layers} < --pp {a.pp} x --virtual-stages {v}: "
                         f"every stage needs a block")


def _divisor_near(n: int, k: int) -> int:
    """The divisor of ``n`` closest to ``k`` (the larger one on a tie)."""
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: (abs(d - k), -d))


def step_timeline(a, step: int):
    """A Timeline to record ``step`` into (kept as ``a.recorded_timeline``): the last step,
    when --timeline is given."""
    if not a.timeline or step != a.steps - 1:
        return None
    a.recorded_timeline = Timeline()
    return a.recorded_timeline


def write_timeline(a, rank0: bool) -> None:
    recorded = getattr(a, "recorded_timeline", None)
    if not (a.timeline and rank0 and recorded is not None):
        return
    print(recorded.summary())
    try:
        recorded.save(a.timeline, title=f"GPT {config_name(a)}: {recorded.describe()}")
    except ImportError:
        print(f"train.py: --timeline {a.timeline} needs matplotlib (pip install -e "
              f"'.[examples]'); a .svg path needs nothing")
    else:
        print(f"pipeline timeline written to {a.timeline}")


def peak_memory_per_rank() -> list:
    """Each rank's peak resident memory in MiB, on every rank."""
    return [round(float(v), 1) for v in ct.debug.per_rank(ct.debug.peak_rss() / 2**20)]


# ----------------------------------------------------------------------------- memory options
PRECISIONS = {"fp32": None, "fp16": "float16", "bf16": "bfloat16"}


def add_memory_options(p: argparse.ArgumentParser, precision: str = "fp32",
                       precision_help: str = "compute dtype: fp32 (--dtype throughout), fp16 "
                       "(float16 compute, --dtype master weights, dynamic loss scaling); bf16 "
                       "is refused: NumPy has no bfloat16") -> None:
    """--recompute, --fsdp, --precision (see MemoryOptions; ``plan.py`` shares them, with
    its own default and meaning of ``--precision``)."""
    g = p.add_argument_group("memory", "activation recompute, fully sharded data parallel, "
                                       "mixed precision")
    g.add_argument("--recompute", nargs="?", const="full", choices=["full", "selective"],
                   help="activation recompute: full (alone: every block keeps only its "
                        "input, the rest is recomputed) or selective (only the attention "
                        "core: Korthikanti et al. 2022)")
    g.add_argument("--fsdp", nargs="?", const="zero3", choices=["zero3", "zero2"],
                   help="fully shard parameters, gradients and optimizer states along the "
                        "data-parallel mesh axis (zero3: free gathered parameters after each "
                        "module's forward; zero2: keep them until its backward)")
    g.add_argument("--precision", choices=sorted(PRECISIONS), default=precision,
                   help=precision_help)


def check_memory_options(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Usage errors before anything runs: bf16 where no bfloat16 dtype exists."""
    if PRECISIONS[a.precision] is not None:
        try:
            nn.compute_dtype(PRECISIONS[a.precision])
        except TypeError as exc:
            p.error(f"--precision {a.precision}: {exc}".replace("mixed_precision: ", ""))


def apply_memory_options(gpt, stages, recompute, fsdp, dtype) -> None:
    """Recompute (``"full"``, ``"selective"`` or None), fully shard (``"zero3"``,
    ``"zero2"`` or None) and compute in ``dtype`` (None: the parameters' own) each stage."""
    if recompute:
        gpt.recompute = True if recompute == "full" else "selective"
    for st in stages:
        st.module.recompute_embeddings = recompute == "full"
        if fsdp:
            nn.fully_shard(st.module, st.placement, dp_axis=0,
                           reshard_after_forward=fsdp == "zero3")
        if dtype is not None:
            nn.mixed_precision(st.module, dtype)


class MemoryOptions:
    """What --recompute, --fsdp, --precision and --track-memory do to the training step."""

    def __init__(self, a):
        self.a = a
        self.scaler = None
        self.figures: dict = {}
        if a.track_memory:
            ct.debug.track_memory()

    def setup(self, gpt, stages) -> None:
        a = self.a
        apply_memory_options(gpt, stages, a.recompute, a.fsdp, PRECISIONS[a.precision])
        if a.precision == "fp16":
            self.scaler = optim.GradScaler(init_scale=2.0 ** 12, growth_interval=100)
        if a.track_memory:
            ct.debug.reset_peak_memory()

    def loss_fn(self, fn):
        if self.scaler is None:
            return fn
        return lambda logits, y: self.scaler.scale(fn(logits, y))

    def loss_scale(self) -> float:
        return 1.0 if self.scaler is None else self.scaler.get_scale()

    def step(self, optimizer, params, clip: float) -> None:
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
        if clip:
            nn.utils.clip_grad_norm_(params, clip)
        if self.scaler is not None:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()

    def gather(self) -> None:
        """Every rank's peak bytes by kind (collective; nothing without --track-memory)."""
        if not self.a.track_memory:
            return
        from ctensor.memory import KINDS
        w = ct.runtime.world()
        rows = {}
        for r in w.held_ranks:
            m = ct.debug.memory(r)
            rows[r] = np.array([m.peak[k] for k in KINDS] + [m.peak_total], dtype=np.float64)
        local = rows if len(w.held_ranks) > 1 else rows[w.held_ranks[0]]
        table = ct.from_local(local, ct.placement.all(), ct.sbp.split(0)).numpy()
        table = table.reshape(ct.world_size(), len(KINDS) + 1)
        self.figures = {"memory_peak_bytes_per_rank": {
            k: table[:, i].astype(int).tolist() for i, k in enumerate(list(KINDS) + ["total"])}}

    def summary(self) -> dict:
        return dict(self.figures)

    def print_report(self, rank0: bool) -> None:
        if not (rank0 and self.figures):
            return
        peaks = self.figures["memory_peak_bytes_per_rank"]
        print("peak bytes of shards per rank (ct.debug.memory): " + ", ".join(
            f"{k} {max(v):,}" for k, v in peaks.items()))


# ----------------------------------------------------------------------------- checkpoints
# --save, --save-every, --keep, --load, --resume: what a long run needs to survive a crash.

STEP_DIR = re.compile(r"step-(\d+)")


def add_checkpoint_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("checkpoints", "the state saved is everything the next step "
                             "depends on: model, optimizer, learning-rate schedule, loss "
                             "scaler, dropout RNG and data position, so a resumed run "
                             "continues the straight run's loss curve bit for bit")
    g.add_argument("--save", help="checkpoint directory: the checkpoint written at the end; "
                                  "with --save-every, the directory of step-<n> checkpoints")
    g.add_argument("--save-every", type=_at_least(1), default=None, metavar="N",
                   help="with --save: checkpoint every N steps (and at the end) to "
                        "<save>/step-<n>, asynchronously (training goes on while it is "
                        "written)")
    g.add_argument("--keep", type=_at_least(1), default=2, metavar="K",
                   help="with --save-every: keep the last K complete checkpoints (default 2)")
    g.add_argument("--load", help="checkpoint directory to start from")
    g.add_argument("--resume", action="store_true",
                   help="with --save-every: start from the newest complete checkpoint in "
                        "--save (one that does not load is skipped for the one before); "
                        "none there: start from step 0. On any layout.")


def check_checkpoint_options(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Usage errors of the checkpoint options, before anything runs."""
    if a.save_every is not None and not a.save:
        p.error("--save-every needs --save DIR (the directory of its checkpoints)")
    if a.resume and a.save_every is None:
        p.error("--resume needs --save DIR --save-every N (it resumes from the newest "
                "checkpoint those write); to start from one checkpoint use --load DIR")
    if a.resume and a.load:
        p.error("--resume and --load both choose where to start: give one")
    if a.save_every is not None and os.path.isfile(os.path.join(a.save, "COMPLETE")):
        p.error(f"--save {a.save} is a checkpoint; with --save-every it names the directory "
                f"that holds step-<n> checkpoints: choose another")


def training_state(gpt, optimizer, scheduler, memory, rng, step: int) -> dict:
    """Everything the next step depends on (see add_checkpoint_options). The model under
    the whole GPT's names (a stage's own names repeat across stages: ``blocks.0``), so a
    checkpoint loads into any number of pipeline stages."""
    state = {"model": gpt.state_dict(), "optim": optimizer.state_dict(),
             "scheduler": scheduler.state_dict(), "step": step,
             "rng": ct.random.get_state(), "data": {"rng": rng.bit_generator.state}}
    if memory.scaler is not None:
        state["scaler"] = memory.scaler.state_dict()
    return state


class Checkpoints:
    """Periodic asynchronous checkpoints ``<save>/step-<n>`` (the last ``--keep`` kept), the
    final one, and the start from ``--load`` or the newest one (``--resume``)."""

    def __init__(self, a):
        self.a = a
        self.pending = None  # the SaveHandle of the save in flight
        self.removing: list = []  # threads deleting checkpoints past --keep

    def path(self, step: int) -> str:
        return os.path.join(self.a.save, f"step-{step:06d}")

    def complete(self) -> list:
        """``[(step, path)]`` of the complete checkpoints in --save, oldest first."""
        found = []
        if self.a.save and os.path.isdir(self.a.save):
            for name in os.listdir(self.a.save):
                m = STEP_DIR.fullmatch(name)
                path = os.path.join(self.a.save, name)
                if m and os.path.isfile(os.path.join(path, "COMPLETE")):
                    found.append((int(m.group(1)), path))
        return sorted(found)

    def restore(self, gpt, optimizer, scheduler, memory, rng, corpus) -> int:
        """Load --load or the newest complete checkpoint (--resume); the step to start at."""
        state = None
        if self.a.load:
            state = ct.load(self.a.load)
        elif self.a.resume:
            for step, path in reversed(self.complete()):
                try:
                    state = ct.load(path)  # verified: a damaged one raises on every rank
                except ValueError as exc:
                    if ct.rank() == 0:
                        print(f"train.py: skipping checkpoint {path}: {exc}")
                    continue
                if ct.rank() == 0:
                    print(f"train.py: resuming from {path} (step {step})")
                break
        if state is None:
            return 0
        gpt.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])
        start = int(state["step"])
        ct.random.set_state({k: int(v) for k, v in state["rng"].items()})  # dropout masks
        if "scheduler" in state:
            scheduler.load_state_dict(state["scheduler"])
        else:  # a checkpoint from before the schedule was saved: replay it
            for _ in range(start):
                scheduler.step()
        if "data" in state:
            rng.bit_generator.state = state["data"]["rng"]
        else:  # the data stream continues where the checkpoint left it
            for _ in range(start):
                corpus.batch(rng, self.a.global_batch, self.a.seq_len)
        if memory.scaler is not None and state.get("scaler"):
            memory.scaler.load_state_dict(state["scaler"])
        return start

    def _finish(self) -> None:
        """Commit the save in flight (collective), then drop all but the last --keep."""
        if self.pending is None:
            return
        self.pending.wait()
        self.pending = None
        if ct.rank() != 0:
            return
        done = self.complete()
        for step, path in done[:-self.a.keep]:
            self._remove(path)
        newest = done[-1][0] if done else -1
        for name in os.listdir(self.a.save):  # what a killed run left behind
            m = STEP_DIR.fullmatch(name.split(".")[0])
            if m and (name.endswith(".ctensor-trash") or
                      name.endswith(".ctensor-tmp") and int(m.group(1)) <= newest):
                shutil.rmtree(os.path.join(self.a.save, name), ignore_errors=True)

    def _remove(self, path: str) -> None:
        """Drop a checkpoint past --keep without the training loop waiting for the disk:
        renamed aside at once (``complete()`` no longer sees it), deleted by a thread (the
        deletion of a GB takes ~0.1 s of wall time here and little CPU)."""
        trash = path + ".ctensor-trash"
        try:
            os.rename(path, trash)
        except OSError:
            return
        self.removing = [t for t in self.removing if t.is_alive()]
        thread = threading.Thread(target=shutil.rmtree, args=(trash,),
                                  kwargs={"ignore_errors": True}, name="ctensor-keep")
        thread.start()
        self.removing.append(thread)

    def periodic(self, step: int, state) -> None:
        """After ``step`` steps: commit the save in flight once every rank has written it
        (``poll``: no wait for the disk), and every --save-every steps start the next
        (``state()`` builds it: shards copied now, written in the background)."""
        if self.pending is not None and self.pending.poll():
            self._finish()
        if self.a.save_every is None or step % self.a.save_every or step == self.a.steps:
            return
        self._finish()  # a save still writing when the next is due: wait for it
        self.pending = ct.save(state(), self.path(step), async_op=True)

    def final(self, steps: int, state) -> None:
        if self.a.save_every is None:
            if self.a.save:
                ct.save(state(), self.a.save)
            return
        self._finish()
        if not any(step == steps for step, _ in self.complete()):
            self.pending = ct.save(state(), self.path(steps), async_op=True)
            self._finish()
        for thread in self.removing:  # (the run ends with only --keep checkpoints)
            thread.join()


def run(argv=None) -> list:
    a = parse_args(argv)
    with (ct.simulate(a.simulate) if a.simulate else contextlib.nullcontext()):
        return main(a)


if __name__ == "__main__":
    run()
