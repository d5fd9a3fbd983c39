"""GPT training throughput: ctensor (one process; DP, TP, TP + sequence parallel and PP on 2
ranks) vs the hand-written data-parallel floor and PyTorch DDP, in one run (CPU).

    python benchmarks/gpt.py [--steps 8] [--hidden 128] [--layers 4] [--quick]

Every run trains the same model (``nn.GPT``, untied head, no dropout) from the same initial
weights on the same batches of the same corpus, with the same global-norm clip, AdamW and
learning-rate schedule:

* **ctensor**: ``examples/gpt/train.py`` once per configuration (``mpiexec -n 2`` for the
  parallel ones, each in its own job so peak memory is per configuration);
* **the floor**: ``mpiexec -n 2`` of this file's floor worker, plain NumPy + mpi4py: the GPT
  step of ``gpt_reference.py`` on this rank's half of the batch, one flat ``Allreduce`` of
  all gradients (the loss rides along), then the clip and AdamW on one flat array (ctensor
  only draws the initial weights, before the first step);
* **the one-process floor**: the same worker on one rank (the whole batch), against
  ctensor's one process;
* **PyTorch DDP** (only when ``torch`` is importable; never a dependency): the same model in
  ``torch.nn`` under ``DistributedDataParallel`` on gloo, ``mpiexec -n 2``.

Before timing, the floor's step and the DDP model are checked to compute ctensor's loss
and gradients (a tiny model, float64); after, every run's loss curve is checked against
ctensor's one process. Each run's speed is its median tokens/s after two warm-up steps; all
runs are repeated ``--rounds`` times, in a rotated order (these machines drift by tens of
percent within minutes), and the median round is reported: tokens/s, step time against the
floor and DDP, speed-up over one process, peak memory per rank. One BLAS (and torch) thread
per rank. ``--quick``: a tiny model, 3 steps, one round.
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

import numpy as np

from harness import add_quick, mpiexec, positive_int, settle, torch_init_method

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "gpt" / "train.py"
sys.path.insert(0, str(TRAIN.parent))  # examples/gpt/data.py: the corpus every run reads

# training settings every run shares (train.py's defaults, dropout off: the floor has none)
SEED, LR, WARMUP, CLIP, WEIGHT_DECAY, DROPOUT = 0, 3e-3, 5, 1.0, 0.1, 0.0
WARMUP_STEPS = 2  # not timed: plans, signature caches, connections
CTENSOR = [("ctensor one process", 1, 1, 1), ("ctensor DP 2", 2, 1, 1),
           ("ctensor TP 2", 1, 2, 1), ("ctensor TP 2 + SP", 1, 2, 1, True),
           ("ctensor PP 2", 1, 1, 2)]
PEERS = [("hand-written DP 2 (floor)", "floor", 2), ("PyTorch DDP 2 (gloo)", "ddp", 2),
         ("hand-written one process", "floor", 1)]


# ----------------------------------------------------------------------------- parent
def child_env() -> dict:
    return dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
                MKL_NUM_THREADS="1")


def read_log(path: Path) -> dict:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    steps = [r for r in records if "step" in r]
    summary = next(r for r in records if r.get("summary"))
    return {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in steps[WARMUP_STEPS:]),
            "losses": [r["loss"] for r in steps], "peak_mib": summary["peak_mib_per_rank"]}


def model_args(a) -> list:
    return ["--steps", str(a.steps), "--hidden", str(a.hidden), "--layers", str(a.layers),
            "--heads", str(a.heads), "--seq-len", str(a.seq_len), "--global-batch",
            str(a.global_batch)]


def run_ctensor(dp: int, tp: int, pp: int, a, log: Path, sp: bool = False) -> None:
    cmd = [sys.executable, str(TRAIN), "--dp", str(dp), "--tp", str(tp), "--pp", str(pp),
           "--micro-batches", str(2 if pp > 1 else 1), "--device", a.device,
           "--seed", str(SEED), "--lr", str(LR), "--warmup", str(WARMUP), "--clip", str(CLIP),
           "--dropout", str(DROPOUT), "--no-progress", "--log-json", str(log)] + model_args(a)
    if sp:
        cmd.append("--sp")
    if dp * tp * pp > 1:
        cmd = [mpiexec(), "-n", str(dp * tp * pp)] + cmd
    subprocess.run(cmd, check=True, env=child_env(), stdout=subprocess.DEVNULL, timeout=1800)


def run_peer(worker: str, a, log: Path, ranks: int = 2) -> None:
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, str(Path(__file__).resolve()), "--worker",
           worker, "--log-json", str(log)] + model_args(a)
    done = subprocess.run(cmd, env=child_env(), stdout=subprocess.DEVNULL, timeout=1800)
    if done.returncode and _complete(log):
        # (torch's gloo threads now and then abort the process at its exit, "terminate
        # called without an active exception", after every step ran and was logged)
        print(f"note: the {worker} run exited with status {done.returncode} after writing "
              f"its whole log; its steps are used", file=sys.stderr)
    elif done.returncode:
        raise subprocess.CalledProcessError(done.returncode, cmd)


def _complete(log: Path) -> bool:
    """Whether :func:`read_log` reads a run's whole log (its steps and closing summary)."""
    try:
        read_log(log)
        return True
    except (OSError, ValueError, KeyError, StopIteration, statistics.StatisticsError):
        return False


def torch_available() -> bool:
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        return False
    return True


def check_losses(results: dict, first_rtol: float, rtol: float) -> float:
    """Every run's loss curve equals ctensor's one process: the first loss (the same weights
    and batch: only the forward) to ``first_rtol``, the rest to ``rtol``; else stop."""
    ref = np.array(results["ctensor one process"]["losses"])
    worst = 0.0
    for name, r in results.items():
        diff = np.abs(np.array(r["losses"]) - ref) / np.abs(ref)
        if not (diff[0] <= first_rtol and diff.max() <= rtol):
            raise SystemExit(f"gpt.py: the loss curve of {name} differs from ctensor's one "
                             f"process (relative {diff.max():.1e}, first step {diff[0]:.1e}): "
                             f"{r['losses']} vs {ref.tolist()}; they do not train the same "
                             f"model, so their speeds cannot be compared")
        worst = max(worst, float(diff.max()))
    return worst


def report(a, results: dict, worst: float) -> None:
    floor = results["hand-written DP 2 (floor)"]["tokens_per_s"]
    ddp = results.get("PyTorch DDP 2 (gloo)", {}).get("tokens_per_s")
    one = results["ctensor one process"]
    print(f"GPT h={a.hidden} l={a.layers} heads={a.heads} seq={a.seq_len} batch={a.global_batch} "
          f"on {a.device}, no dropout (median tokens/s of steps {WARMUP_STEPS + 1}-{a.steps}, "
          f"median of {a.rounds} round(s); one BLAS thread per rank)")
    print(f"{'run':<27}{'tokens/s':>9}{'time vs floor':>15}{'vs DDP':>8}{'vs one':>8}"
          f"{'peak MiB per rank':>20}")
    for name, r in results.items():
        tps = r["tokens_per_s"]
        vs_ddp = f"{ddp / tps:>7.2f}x" if ddp else f"{'-':>8}"
        print(f"{name:<27}{tps:>9.0f}{floor / tps:>14.2f}x{vs_ddp}"
              f"{tps / one['tokens_per_s']:>7.2f}x{str(r['peak_mib']):>20}")
    if not ddp:
        print(f"{'PyTorch DDP 2 (gloo)':<27}  (torch not importable: skipped)")
    print(f"(time vs floor / DDP: step time over theirs; vs one: tokens/s over ctensor's one "
          f"process.) Loss curves agree with ctensor's one process to {worst:.1e}.")
    alone = results.get("hand-written one process")
    if alone:
        print(f"One process (with the optimizer): ctensor's step takes "
              f"{alone['tokens_per_s'] / one['tokens_per_s']:.2f}x the hand-written one's.")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=positive_int, help="training steps per run (default 8)")
    p.add_argument("--hidden", type=positive_int, help="default 128")
    p.add_argument("--layers", type=positive_int, help="default 4 (at least 2: PP 2)")
    p.add_argument("--heads", type=positive_int, help="default 4")
    p.add_argument("--seq-len", type=positive_int, help="default 64")
    p.add_argument("--global-batch", type=positive_int, help="default 16 (even: DP 2)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="ctensor's device (the floor and DDP run on the CPU)")
    p.add_argument("--rounds", type=positive_int, help="repeats of every run (default 3)")
    add_quick(p)
    p.add_argument("--worker", choices=["floor", "ddp"], help=argparse.SUPPRESS)
    p.add_argument("--log-json", help=argparse.SUPPRESS)
    a = settle(p.parse_args(), dict(steps=8, hidden=128, layers=4, heads=4, seq_len=64,
                                    global_batch=16, rounds=3),
               dict(steps=3, hidden=16, layers=2, heads=2, seq_len=8, global_batch=4,
                    rounds=1))
    if a.steps <= WARMUP_STEPS:
        p.error(f"--steps must be > {WARMUP_STEPS} (the first {WARMUP_STEPS} are warm-up)")
    if a.global_batch % 2 or a.layers < 2 or a.hidden % a.heads or a.heads % 2:
        p.error("--global-batch must be even (DP 2, PP with 2 micro-batches), --layers >= 2 "
                "(PP 2), --heads even (TP 2) and a divisor of --hidden")
    if a.worker:
        (floor_worker if a.worker == "floor" else ddp_worker)(a)
        return
    with_torch = torch_available()
    check_steps(with_torch)
    runs = [(name, lambda log, c=c: run_ctensor(*c[:3], a, log, *c[3:]))
            for name, *c in CTENSOR]
    runs += [(name, lambda log, w=w, n=n: run_peer(w, a, log, n)) for name, w, n in PEERS
             if w == "floor" or with_torch]
    rounds: dict = {name: [] for name, _ in runs}
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for name, run in runs[r % len(runs):] + runs[:r % len(runs)]:
                log = Path(tmp) / f"{len(rounds[name])}-{name.replace(' ', '_')}.jsonl"
                run(log)
                rounds[name].append(read_log(log))
            # float32, other summation orders (seen: ~1e-6 after 8 steps); a wrong forward
            # or gradient moves a curve far more
            worst = max(worst, check_losses({k: v[-1] for k, v in rounds.items()}, 1e-5,
                                            2e-3))
    results = {name: sorted(rs, key=lambda x: x["tokens_per_s"])[len(rs) // 2]
               for name, rs in rounds.items()}
    report(a, results, worst)


# ----------------------------------------------------------------------------- workers
def initial_weights(a) -> dict:
    """train.py's initial model as NumPy arrays (ctensor draws them: same seed, same
    layout-independent random numbers, so every run starts from the same weights)."""
    import ctensor as ct
    import ctensor.nn as nn
    from data import VOCAB_SIZE
    ct.manual_seed(SEED)
    gpt = nn.GPT(VOCAB_SIZE, a.seq_len, a.layers, a.heads, a.hidden, dropout=DROPOUT,
                 tie_weights=False, dtype=np.float32)
    return {name: np.ascontiguousarray(p.numpy()) for name, p in gpt.named_parameters()}


def lr_at(step: int, total: int) -> float:
    """``optim.lr_scheduler.cosine_with_warmup`` as train.py sets it up."""
    import math
    total = max(total, WARMUP + 1)
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    progress = min(1.0, (step - WARMUP) / (total - WARMUP))
    return LR * 0.5 * (1.0 + math.cos(math.pi * progress))


def _half(n: int, comm) -> slice:
    size = n // comm.size
    return slice(comm.rank * size, (comm.rank + 1) * size)


def _finish(a, comm, records: list) -> None:
    import ctensor as ct
    peak = comm.gather(round(ct.debug.peak_rss() / 2**20, 1))
    if comm.rank == 0:
        with open(a.log_json, "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
            f.write(json.dumps({"summary": True, "peak_mib_per_rank": peak}) + "\n")


def floor_worker(a) -> None:
    """Data parallel by hand: local step, one flat all-reduce, clip, AdamW on flat arrays."""
    from mpi4py import MPI

    import gpt_reference
    from data import Corpus
    comm = MPI.COMM_WORLD
    start = initial_weights(a)
    names = list(start)
    bounds = np.cumsum([0] + [start[k].size for k in names])
    params = np.concatenate([start[k].ravel() for k in names])       # one flat array
    grads = np.empty(params.size + 1, dtype=params.dtype)             # + the loss, last
    p_view = {k: params[lo:hi].reshape(start[k].shape)
              for k, lo, hi in zip(names, bounds[:-1], bounds[1:])}
    g_view = {k: grads[lo:hi].reshape(start[k].shape)
              for k, lo, hi in zip(names, bounds[:-1], bounds[1:])}
    m, v = np.zeros_like(params), np.zeros_like(params)
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    corpus, rng = Corpus(), np.random.default_rng(SEED)
    mine = _half(a.global_batch, comm)
    records = []
    for step in range(a.steps):
        t0 = time.perf_counter()
        xb, yb = corpus.batch(rng, a.global_batch, a.seq_len)
        loss, local = gpt_reference.step(np, p_view, xb[mine], yb[mine], a.layers, a.heads)
        for k in names:
            g_view[k][...] = local[k]
        grads[-1] = loss
        comm.Allreduce(MPI.IN_PLACE, grads)      # the only collective of the step
        grads /= comm.size                       # equal halves: the mean is the global mean
        g = grads[:-1]
        g *= min(1.0, CLIP / (float(np.sqrt(np.dot(g, g))) + 1e-6))
        lr, t = lr_at(step, a.steps), step + 1
        params *= 1.0 - lr * WEIGHT_DECAY          # AdamW: decoupled weight decay
        m *= beta1
        m += (1 - beta1) * g
        v *= beta2
        v += (1 - beta2) * g * g
        params -= (lr / (1 - beta1 ** t)) * m / (np.sqrt(v) / np.sqrt(1 - beta2 ** t) + eps)
        dt = time.perf_counter() - t0
        records.append({"step": step, "loss": float(grads[-1]),
                        "tokens_per_s": a.global_batch * a.seq_len / dt})
    _finish(a, comm, records)


def torch_gpt(params: dict, n_head: int):
    """``nn.GPT`` (untied head) in ``torch.nn``, with the given weights."""
    import torch
    import torch.nn as tnn
    import torch.nn.functional as F

    class Attention(tnn.Module):
        def __init__(self, c: int):
            super().__init__()
            self.query, self.key, self.value, self.proj = (tnn.Linear(c, c) for _ in range(4))

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = (f(x).view(b, t, n_head, c // n_head).transpose(1, 2)
                       for f in (self.query, self.key, self.value))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).reshape(b, t, c))

    class MLP(tnn.Module):
        def __init__(self, c: int):
            super().__init__()
            self.fc, self.proj = tnn.Linear(c, 4 * c), tnn.Linear(4 * c, c)

        def forward(self, x):
            return self.proj(F.gelu(self.fc(x), approximate="tanh"))

    class Block(tnn.Module):
        def __init__(self, c: int):
            super().__init__()
            self.ln_1, self.attn, self.ln_2, self.mlp = (
                tnn.LayerNorm(c), Attention(c), tnn.LayerNorm(c), MLP(c))

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(tnn.Module):
        def __init__(self, vocab: int, block: int, n_layer: int, c: int):
            super().__init__()
            self.wte, self.wpe = tnn.Embedding(vocab, c), tnn.Embedding(block, c)
            self.blocks = tnn.ModuleList(Block(c) for _ in range(n_layer))
            self.ln_f, self.lm_head = tnn.LayerNorm(c), tnn.Linear(c, vocab, bias=False)

        def forward(self, idx):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for block in self.blocks:
                x = block(x)
            return self.lm_head(self.ln_f(x))

    vocab, c = params["wte.weight"].shape
    n_layer = len({k.split(".")[1] for k in params if k.startswith("blocks.")})
    model = GPT(vocab, params["wpe.weight"].shape[0], n_layer, c)
    model.to(torch.from_numpy(params["wte.weight"]).dtype)
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in params.items()})
    return model


def check_steps(with_torch: bool) -> float:
    """Before timing anything: the floor's step (``gpt_reference.step``) and, with torch, the
    DDP model compute ctensor's loss and gradients (a tiny model in float64); else stop.
    The loss curves alone would miss a wrong gradient over a few small warm-up steps."""
    import gpt_reference
    worst = gpt_reference.check_against_ctensor(tie_weights=False)
    if with_torch:
        import torch
        import torch.nn.functional as F
        tiny = argparse.Namespace(seq_len=8, layers=2, heads=2, hidden=16)
        params = {k: v.astype(np.float64) for k, v in initial_weights(tiny).items()}
        tokens = np.random.default_rng(0).integers(0, params["wte.weight"].shape[0], (3, 9))
        loss, grads = gpt_reference.step(np, params, tokens[:, :-1], tokens[:, 1:], 2, 2)
        model = torch_gpt(params, 2)
        logits = model(torch.from_numpy(tokens[:, :-1]))
        got = F.cross_entropy(logits.flatten(0, 1), torch.from_numpy(tokens[:, 1:]).flatten())
        got.backward()
        worst = max(worst, abs(got.item() - float(loss)) / abs(float(loss)))
        for name, prm in model.named_parameters():
            want = grads[name]
            worst = max(worst, float(np.abs(prm.grad.numpy() - want).max()
                                     / max(np.abs(want).max(), 1e-6)))
    if not worst < 1e-9:
        raise SystemExit(f"gpt.py: the floor's step or the DDP model does not compute "
                         f"ctensor's loss and gradients (max relative difference "
                         f"{worst:.1e}); their timings would be meaningless")
    return worst


def ddp_worker(a) -> None:
    """The same training in PyTorch DDP (gloo over localhost, one process per MPI rank)."""
    from mpi4py import MPI

    from data import Corpus
    # the corpus first: importing torch replaces inspect.getfile, whose docstring would
    # then be missing from the text and every batch would differ from the other runs'
    corpus, rng = Corpus(), np.random.default_rng(SEED)
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    dist.init_process_group("gloo", init_method=torch_init_method(comm),
                            rank=comm.rank, world_size=comm.size)
    model = torch_gpt(initial_weights(a), a.heads)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(s, a.steps) / LR)
    mine = _half(a.global_batch, comm)
    records = []
    for step in range(a.steps):
        t0 = time.perf_counter()
        xb, yb = corpus.batch(rng, a.global_batch, a.seq_len)
        logits = ddp(torch.from_numpy(xb[mine]))
        loss = F.cross_entropy(logits.flatten(0, 1), torch.from_numpy(yb[mine]).flatten())
        loss.backward()                          # DDP all-reduces the gradients here
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        dt = time.perf_counter() - t0
        logged = loss.detach().clone()           # the global loss, for the log only (untimed)
        dist.all_reduce(logged)
        records.append({"step": step, "loss": float(logged) / comm.size,
                        "tokens_per_s": a.global_batch * a.seq_len / dt})
    _finish(a, comm, records)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
