"""Measure this machine for the cost model: ``python benchmarks/calibrate.py``.

Writes the ``cpu`` table of ``ctensor/devices.toml`` (or of ``--output PATH``), the one the
signature choice prices ``"cpu"`` placements with and ``ct.plan`` prices a CPU step with
(:mod:`ctensor.cost`). It measures in a fresh process with one BLAS thread per rank, as the
benchmarks run; a kernel's figure is the best of its repeats (the quiet machine's speed:
another process that takes the core for a moment slows some repeats, never speeds one up), a
training step's the median of its steps (as ``benchmarks/predict.py`` measures):

* ``gemm`` / ``gemm_fp64``: FLOP/s of float32 / float64 NumPy GEMMs shaped as a linear
  layer's (1024 tokens, a weight of 16 x 16 to 512 x 512; forward, input and weight
  gradient) less NumPy's per-call cost (a 1 x 1 matmul's, which ``op_overhead`` holds),
  keyed by their arithmetic intensity (FLOPs per byte touched); ``peak_flops_fp32`` is the
  largest rate, ``peak_flops`` a float16 square GEMM's;
* ``memory_bandwidth``: bytes read plus written per second of NumPy's elementwise add over
  float32 operands of :data:`STREAM_BYTES` (inputs plus outputs), past the last-level
  cache (4 MiB ones measured a 32 MiB L3 at 110-127 GB/s, memory 41-45);
* ``op_overhead``: seconds per dispatched op of a training step (forward, backward, gradient
  clip, AdamW) of a GPT so small (d = 8) that its kernels cost nothing: the step's measured
  time, less its kernels' price, over the ops a shape-only trace of it counts;
* ``kernels``: per op, the fraction of those curves its kernels reached in profiled
  training steps (``ct.debug.profile``, kernel regions by op name, ctensor's own work in
  each kernel call included) of a d = 160 GPT (float32) and of the Llama of
  ``tests/test_pytorch_programs.py`` at d = 128 (float64) — NumPy's
  several passes per LayerNorm or softmax, GELU's transcendentals, strided batched matmuls,
  an embedding's scatter-add; ``efficiency`` (for the ops not named, and for every op where
  the choice prices a kernel without its name): the same fraction over all those kernels
  together;
* under ``mpiexec -n 2`` (started by this command; skipped without mpi4py or ``--no-mpi``):
  ``intra_latency`` — half an MPI ping-pong of 8 bytes (the best block); ``call_overhead`` —
  a ctensor all-reduce of one element less its latency step and one op's dispatch (the
  median block, as a step pays it: the best one, where both ranks happened to arrive
  together, was 0.6-0.8x the median);
  ``intra_bandwidth`` — the bytes one rank sends per second in a ctensor all-reduce of
  ``--mpi-bytes`` (its time less the small one's); ``contention``: how much slower the
  d = 160 GPT's kernels run on both ranks at once than on rank 0 alone while rank 1 sleeps
  (the two taken in turn; shared caches and memory bandwidth). One node: the ``inter_*``
  figures repeat the ``intra_*`` ones.

``--quick``: smaller sizes and fewer repeats (about half a minute). Rerun it on a quiet
machine: a loaded one measures the other processes too (``--quiet S`` waits up to ``S``
seconds for an idle machine before each phase).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np

__all__ = ["measure", "write_table", "main", "wait_quiet", "busy_since", "cpu_times"]


def _best_seconds(fn, repeats: int, inner: int = 1) -> float:
    """The least mean seconds of ``fn()`` over ``repeats`` blocks of ``inner`` calls."""
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


def _median_seconds(fn, repeats: int, inner: int = 1) -> float:
    """The median mean seconds of ``fn()`` over ``repeats`` blocks of ``inner`` calls (what
    a step pays for a call whose time moves with two ranks' polling, not with other
    processes: the best block is the rare one where both ranks arrived together)."""
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times)


def _inner(seconds_guess: float) -> int:
    """Calls per timed block: about a millisecond's worth."""
    return max(1, min(2000, int(1e-3 / max(seconds_guess, 1e-7))))


# ----------------------------------------------------------------------------- a quiet machine
def cpu_times() -> tuple:
    """``(busy, total, ours)``: jiffies of all cores busy and in all (``/proc/stat``; niced
    processes count: their busy-polling slows ours too), and the seconds of CPU this
    process and its finished children used; None without ``/proc/stat``."""
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    t = os.times()
    return sum(values) - idle, sum(values), t.user + t.system + t.children_user + \
        t.children_system


def busy_since(start: tuple) -> float:
    """The fraction of all cores other processes kept busy since ``start``
    (:func:`cpu_times`): all busy time less ours and our children's."""
    now = cpu_times()
    if start is None or now is None or now[1] <= start[1]:
        return 0.0
    hz = os.sysconf("SC_CLK_TCK")
    others = (now[0] - start[0]) / hz - (now[2] - start[2])
    return max(0.0, others / ((now[1] - start[1]) / hz))


def wait_quiet(seconds: float, calm: float = 5.0, idle: float = 0.10) -> float:
    """Wait (at most ``seconds``) until the cores have been less than ``idle`` busy for
    ``calm`` seconds in a row; returns the seconds waited."""
    t0 = time.monotonic()
    since = time.monotonic()
    while time.monotonic() - t0 < seconds:
        start = cpu_times()
        if start is None:
            break
        time.sleep(1.0)
        if busy_since(start) >= idle:
            since = time.monotonic()
        elif time.monotonic() - since >= calm:
            break
    return time.monotonic() - t0


def gemm_seconds(n: int, dtype, repeats: int) -> float:
    """Seconds of an ``n x n`` by ``n x n`` NumPy matmul (``2 n^3`` FLOPs)."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(dtype) for _ in range(2))
    out = np.empty((n, n), dtype)
    inner = _inner(2.0 * n ** 3 / 5e10)
    return _best_seconds(lambda: np.matmul(a, b, out=out), repeats, inner)


def gemm_rate(n: int, dtype, repeats: int) -> float:
    """FLOP/s of an ``n x n`` by ``n x n`` NumPy matmul."""
    return 2.0 * n ** 3 / gemm_seconds(n, dtype, repeats)


GEMM_SIZES = (16, 32, 64, 128, 256, 512)
#: the rows of the curve's GEMMs: a batch of tokens through a linear layer
GEMM_ROWS = 1024


def linear_gemm_seconds(n: int, dtype, repeats: int, rows: int = GEMM_ROWS) -> float:
    """Mean seconds of the three GEMMs of a linear layer with an ``n x n`` weight over
    ``rows`` tokens (each ``2 rows n^2`` FLOPs), called as ctensor's matmul kernel calls
    them: the forward ``x @ W^T``, the input gradient ``g @ W``, the weight gradient
    ``g^T @ x`` (the transposes are views; BLAS reads them transposed)."""
    rng = np.random.default_rng(0)
    x, g = (rng.standard_normal((rows, n)).astype(dtype) for _ in range(2))
    w = rng.standard_normal((n, n)).astype(dtype)
    y, dx, dw = np.empty((rows, n), dtype), np.empty((rows, n), dtype), np.empty((n, n), dtype)

    def three():
        np.matmul(x, w.T, out=y)
        np.matmul(g, w, out=dx)
        np.matmul(g.T, x, out=dw)
    inner = _inner(6.0 * rows * n * n / 5e10)
    return _best_seconds(three, repeats, inner) / 3


def gemm_curve(dtype, repeats: int, sizes=GEMM_SIZES, rows: int = GEMM_ROWS) -> list:
    """``[[FLOPs per byte, FLOP/s], ...]`` of the GEMMs a training step runs: a linear
    layer's three (:func:`linear_gemm_seconds`: ``rows x n`` activations, an ``n x n``
    weight, one operand transposed in two of them; ``2 rows n^2`` FLOPs over ``2 rows n +
    n^2`` elements), each less the per-call cost of NumPy's matmul (a 1 x 1 one's time:
    part of ``op_overhead``, which every dispatched op is charged); a size whose time is
    not clearly above that cost is left out. Square GEMMs of the same intensity ran at
    0.8x-1.6x these (float32 1.1x-1.4x from 15 FLOPs per byte up): a square curve priced a
    step's GEMMs too fast, left the difference to matmul's own efficiency (0.54 where it
    is 0.87-0.90 with this curve), and so priced a large GEMM 1.3x too slow (the pipeline
    block of ``benchmarks/predict.py``)."""
    itemsize = np.dtype(dtype).itemsize
    call = gemm_seconds(1, dtype, repeats)
    out = []
    for n in sizes:
        t = linear_gemm_seconds(n, dtype, repeats, rows)
        if t > 1.5 * call:
            flops = 2.0 * rows * n * n
            out.append([flops / (itemsize * (2 * rows * n + n * n)), flops / (t - call)])
    out.sort()
    return out


#: the operand size of the memory-bandwidth measurement (three: 192 MiB, past the caches)
STREAM_BYTES = 64 << 20


def stream_rate(nbytes: int, repeats: int) -> float:
    """Bytes/s (two read, one written) of ``np.add`` over float32 operands of ``nbytes``."""
    a = np.ones(max(1, nbytes // 4), np.float32)
    b, c = a.copy(), np.empty_like(a)
    inner = max(1, (64 << 20) // max(nbytes, 1))
    return 3.0 * a.nbytes / _best_seconds(lambda: np.add(a, b, out=c), repeats, inner)


#: the GPTs the per-op cost and the kernels' efficiency are measured on: (vocabulary,
#: sequence, layers, heads, width, batch). The first is so small its kernels cost nothing;
#: the second's kernels cost about as much as its dispatch (neither is a size of
#: ``benchmarks/predict.py``)
TINY_GPT = (16, 8, 2, 2, 8, 2)
MEDIUM_GPT = (256, 48, 2, 4, 160, 16)
#: the Llama of tests/test_pytorch_programs.py the kernels of a PyTorch-style program are
#: measured on (float64): vocabulary, width, layers, heads, batch, sequence
MEDIUM_LLAMA = (512, 128, 2, 4, 4, 64)
#: the least priced seconds per kernel call for an op's own efficiency to be measured
MIN_KERNEL = 20e-6


def _gpt_step(vocab: int, seq: int, layers: int, heads: int, width: int, batch: int):
    """A closure running one training step (forward, backward, clip, AdamW) of a GPT."""
    import ctensor as ct
    import ctensor.nn as nn
    import ctensor.optim as optim
    ct.manual_seed(0)
    gpt = nn.GPT(vocab, seq, layers, heads, width, tie_weights=False, dtype=np.float32)
    params = list(gpt.parameters())
    opt = optim.AdamW(params, lr=1e-3)
    x = ct.zeros(batch, seq, dtype=ct.int64)
    y = ct.zeros(batch, seq, dtype=ct.int64)

    def step():
        _, loss = gpt(x, y)
        loss.backward()
        nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad()
    return step


def _llama_step(vocab: int, width: int, layers: int, heads: int, batch: int, seq: int):
    """A closure running one forward + backward of the PyTorch-style Llama (float64), or
    None where tests/test_pytorch_programs.py is not at hand."""
    import ctensor as ct
    tests = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
    if not os.path.exists(os.path.join(tests, "test_pytorch_programs.py")):
        return None
    sys.path.insert(0, tests)
    try:
        import test_pytorch_programs as programs
    except ImportError:
        return None
    finally:
        sys.path.remove(tests)
    import ctensor.nn as nn
    import ctensor.nn.functional as F
    ct.manual_seed(0)
    before = ct.get_default_dtype()
    ct.set_default_dtype(np.float64)
    try:
        model = type(programs.llama(ct, nn, F))(vocab_size=vocab, dim=width, n_layers=layers,
                                                n_heads=heads, max_seq_len=seq)
    finally:
        ct.set_default_dtype(before)
    rng = np.random.default_rng(0)
    x, y = (ct.tensor(rng.integers(0, vocab, (batch, seq))) for _ in range(2))

    def step():
        ct.set_default_dtype(np.float64)  # (as llama_tp.py runs it)
        try:
            model(x, y).backward()
        finally:
            ct.set_default_dtype(before)
        for p in model.parameters():
            p.grad = None
    return step


def _trace(make, size):
    import ctensor as ct
    with ct.simulate(1, meta=True), ct.plan.record() as trace:
        make(*size)()
    return trace


def _profiled(make, size, repeats: int, profiled: bool = True) -> tuple:
    """``(median seconds of a step, {op: kernel seconds per step}, {op: kernel calls per
    step})`` of a step run for real (``profiled=False``: the first only). Each step is
    profiled on its own and each op's kernels counted at their median over the steps
    (``benchmarks/predict.py`` compares with median steps; the kernel microbenchmarks
    above take the best of their repeats instead, a kernel's speed on a quiet core)."""
    import ctensor as ct
    with ct.simulate(1):
        step = make(*size)
        for _ in range(3):  # plans, caches
            step()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        if not profiled:
            return statistics.median(times), {}, {}
        per_step, calls = {}, {}
        for _ in range(repeats):
            with ct.debug.profile() as prof:
                step()
            mine, count = {}, {}
            for name, column, _, seconds in prof.events:
                if ct.profile.COLUMNS[column] in ("forward kernels", "backward kernels",
                                                  "optimizer"):
                    mine[name] = mine.get(name, 0.0) + seconds
                    count[name] = count.get(name, 0) + 1
            for name, seconds in mine.items():
                per_step.setdefault(name, []).append(seconds)
            calls = count
    kernels = {name: statistics.median(v + [0.0] * (repeats - len(v)))
               for name, v in per_step.items()}
    return statistics.median(times), kernels, calls


def _priced(trace, dev) -> dict:
    """Per op of ``trace``: its kernels' seconds on ``dev`` (every run at its own size)."""
    import ctensor as ct
    dev = replace(dev, op_overhead=0.0)
    out = {}
    for w in trace.ops.values():
        if not w.view:
            t = ct.plan.op_seconds(_one(trace, w), dev, fused=False)
            out[w.op] = out.get(w.op, 0.0) + sum(t.values())
    return out


def _one(trace, w):
    import ctensor as ct
    one = ct.plan.record()
    one.ops = {0: w}
    return one


def op_overhead(repeats: int, dev) -> float:
    """Seconds per dispatched op: the tiny GPT's step less its kernels' price, over its
    ops. ``dev``: the measured curves."""
    trace = _trace(_gpt_step, TINY_GPT)
    ops = sum(w.count for w in trace.ops.values())
    prices = _priced(trace, dev)
    seconds, _, _ = _profiled(_gpt_step, TINY_GPT, repeats, profiled=False)
    return max(seconds - sum(prices.values()), 0.0) / ops


def kernel_efficiencies(repeats: int, dev) -> tuple:
    """``([[op, efficiency], ...], efficiency of the others, (seconds, ops) of the medium
    GPT's step)``: per op, its kernels' price on the measured curves (efficiency 1) over
    their profiled time (the work around NumPy's in each kernel call included: taking a
    per-call cost out of it predicted the GPT example's steps 5-8% lower, further from
    their measured time), summed over the medium GPT's and the medium Llama's steps (an op
    is measured where the profile saw as many of its kernels as the trace counts and they
    are priced at least :data:`MIN_KERNEL` a call); the others' figure: the same over all
    measured kernels together."""
    priced: dict = {}
    measured: dict = {}
    alone = None
    for make, size in ((_gpt_step, MEDIUM_GPT), (_llama_step, MEDIUM_LLAMA)):
        if make(*size) is None:
            continue
        trace = _trace(make, size)
        prices = _priced(trace, dev)
        counts = {}
        for w in trace.ops.values():
            if not w.view:
                counts[w.op] = counts.get(w.op, 0) + w.count
        seconds, kernels, calls = _profiled(make, size, max(3, repeats // 2))
        if alone is None:  # the GPT's: (seconds, ops)
            alone = (seconds, sum(w.count for w in trace.ops.values()))
        for op, n in counts.items():
            # (an op whose kernels are priced under MIN_KERNEL seconds a call is measured
            # by its call's cost, not by its work: its figure would price a large kernel of
            # it tens of times too slow, as a 0.3 us mask compare did a block's ReLU backward)
            if op in kernels and abs(calls[op] - n) < 0.5 and \
                    prices.get(op, 0) >= MIN_KERNEL * n:
                took = max(kernels[op], prices[op])
                priced[op] = priced.get(op, 0.0) + prices[op]
                measured[op] = measured.get(op, 0.0) + took
    table = [[op, max(0.01, min(2.0, priced[op] / measured[op]))] for op in sorted(priced)]
    overall = sum(priced.values()) / max(sum(measured.values()), 1e-12)
    return table, max(0.01, min(1.0, overall)), alone


def mpi_worker(nbytes: int, repeats: int) -> None:
    """Run under ``mpiexec -n 2``: prints (rank 0) the MPI figures as JSON."""
    from mpi4py import MPI
    import ctensor as ct
    comm = MPI.COMM_WORLD
    peer = 1 - comm.rank
    small = np.zeros(1, np.float64)

    def ping():
        if comm.rank == 0:
            comm.Send(small, peer, tag=7)
            comm.Recv(small, peer, tag=7)
        else:
            comm.Recv(small, peer, tag=7)
            comm.Send(small, peer, tag=7)
    comm.Barrier()
    latency = _best_seconds(ping, repeats, 200) / 2
    p = ct.placement("cpu", [0, 1])
    P, B = ct.sbp.partial_sum, ct.sbp.broadcast

    def timed(fn, guess):  # (the median block: see _median_seconds)
        comm.Barrier()
        return comm.allreduce(_median_seconds(fn, max(repeats, 9), _inner(guess)),
                              op=MPI.MAX)

    one = ct.ones(1, dtype=ct.float32, placement=p, sbp=P)
    t_small = timed(lambda: one.to_global(sbp=B), 2e-5)
    x = ct.ones(max(1, nbytes // 4), dtype=ct.float32, placement=p, sbp=P)
    t_big = timed(lambda: x.to_global(sbp=B), nbytes / 4e9)
    alone, together = _alone_and_together(comm, max(3, repeats // 2))
    if comm.rank == 0:
        print(json.dumps({"latency": latency, "all_reduce_small": t_small,
                          "all_reduce_big": t_big, "nbytes": (nbytes // 4) * 4,
                          "alone": alone, "together": together}))


def _alone_and_together(comm, repeats: int) -> tuple:
    """Median seconds of the medium GPT's step (each rank its own, in ``ct.simulate(1)``)
    run by rank 0 alone while rank 1 sleeps, and by both ranks at once (the slower rank's),
    taken in turn so that both see the same machine."""
    import ctensor as ct
    from mpi4py import MPI
    with ct.simulate(1):
        step = _gpt_step(*MEDIUM_GPT)
        for _ in range(3):  # plans, caches
            step()
        t0 = time.perf_counter()
        step()
        guess = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        alone, together = [], []
        for _ in range(repeats):
            comm.Barrier()
            if comm.rank == 0:
                t0 = time.perf_counter()
                step()
                alone.append(time.perf_counter() - t0)
            else:
                time.sleep(3 * guess)  # (idle, not polling: rank 0 has the machine)
            comm.Barrier()
            t0 = time.perf_counter()
            step()
            together.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return (statistics.median(alone) if alone else 0.0), statistics.median(together)


def _mpi(nbytes: int, repeats: int) -> dict:
    here = os.path.dirname(sys.executable)
    mpiexec = os.path.join(here, "mpiexec")
    if not os.path.exists(mpiexec):
        mpiexec = "mpiexec"
    cmd = [mpiexec, "-n", "2", sys.executable, os.path.abspath(__file__), "--mpi-worker",
           "--mpi-bytes", str(nbytes), "--repeats", str(repeats)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise RuntimeError(f"calibrate: {' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(quick: bool = False, mpi: bool = True, repeats: int = 0,
            quiet: float = 0.0) -> dict:
    """This machine's ``cpu`` table (a dict of :class:`ctensor.cost.Device` fields).
    ``quiet``: wait up to that many seconds for an idle machine before each phase
    (:func:`wait_quiet`)."""
    from ctensor import cost
    if quiet:
        wait_quiet(quiet)
    r = repeats or (5 if quick else 15)
    sizes = GEMM_SIZES[:-1] if quick else GEMM_SIZES
    table = {"gemm": gemm_curve(np.float32, r, sizes),
             "gemm_fp64": gemm_curve(np.float64, r, sizes),
             "peak_flops": gemm_rate(64 if quick else 128, np.float16, max(3, r // 3)),
             "memory_bandwidth": stream_rate(STREAM_BYTES, max(3, r // 3))}
    table["peak_flops_fp32"] = max(rate for _, rate in table["gemm"])
    table["memory_bytes"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    base = cost.machine("cpu")
    curves = {k: tuple(map(tuple, v)) for k, v in table.items()
              if k in ("gemm", "gemm_fp64")}
    plain = replace(base, **{k: v for k, v in table.items() if k not in curves}, **curves,
                    kernels=(), efficiency=1.0)
    table["op_overhead"] = op_overhead(r, plain)
    table["kernels"], table["efficiency"], alone = kernel_efficiencies(r, plain)
    table.update(intra_latency=base.intra_latency, intra_bandwidth=base.intra_bandwidth,
                 call_overhead=base.call_overhead)
    if mpi:
        if quiet:
            wait_quiet(quiet)
        m = _mpi((8 << 20) if quick else (32 << 20), r)
        table["intra_latency"] = m["latency"]
        table["call_overhead"] = max(0.0, m["all_reduce_small"] - m["latency"]
                                     - table["op_overhead"])
        # a ring all-reduce on 2 ranks sends its whole buffer once
        table["intra_bandwidth"] = m["nbytes"] / max(m["all_reduce_big"] -
                                                     m["all_reduce_small"], 1e-9)
        # the medium GPT's step on both ranks at once against alone (taken in turn): its
        # kernels' share
        dispatch = alone[1] * table["op_overhead"]
        table["contention"] = max(1.0, (m["together"] - dispatch) /
                                  max(m["alone"] - dispatch, 1e-9))
    table["inter_latency"], table["inter_bandwidth"] = (table["intra_latency"],
                                                        table["intra_bandwidth"])
    return table


_ORDER = ["peak_flops", "peak_flops_fp32", "memory_bytes", "memory_bandwidth",
          "intra_bandwidth", "inter_bandwidth", "intra_latency", "inter_latency",
          "call_overhead", "op_overhead", "efficiency", "contention", "gemm", "gemm_fp64",
          "kernels"]


def write_table(path: str, name: str, table: dict, note: str = "") -> None:
    """Replace (or append) the ``[name]`` table of the TOML file ``path``, keeping the rest
    of the file (comments included) as it is."""
    def value(k):
        v = table[k]
        if k == "memory_bytes":
            return str(int(v))
        if isinstance(v, (list, tuple)):  # a curve, on one line
            return "[" + ", ".join("[" + ", ".join(f'"{e}"' if isinstance(e, str) else
                                                   f"{float(e):.6g}" for e in p) + "]"
                                   for p in v) + "]"
        return repr(float(v))
    body = [f'["{name}"]'] + [f"{k} = {value(k)}" for k in _ORDER if k in table]
    text = open(path).read() if os.path.exists(path) else ""
    header = re.compile(r'^\[\s*"?' + re.escape(name) + r'"?\s*\]\s*$', re.M)
    found = header.search(text)
    block = "\n".join(([f"# {note}"] if note else []) + body) + "\n"
    if found is None:
        text = text.rstrip("\n") + ("\n\n" if text else "") + block
    else:
        rest = re.compile(r"^\s*(#|\[)", re.M).search(text, found.end())
        end = rest.start() if rest else len(text)
        start = found.start()
        lines = text[:start].splitlines(keepends=True)
        while lines and lines[-1].startswith("# measured "):  # drop the previous note
            start -= len(lines.pop())
        text = text[:start] + block + ("\n" if rest else "") + text[end:].lstrip("\n")
    with open(path, "w") as f:
        f.write(text)


def main(argv=None) -> dict:
    from ctensor import cost
    p = argparse.ArgumentParser(prog="python benchmarks/calibrate.py",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--output", default=cost.DEVICE_FILE,
                   help="the TOML file whose [cpu] table is written (default: %(default)s)")
    p.add_argument("--name", default="cpu", help="the table's name (default: cpu)")
    p.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    p.add_argument("--no-mpi", action="store_true", help="skip the MPI figures")
    p.add_argument("--quiet", type=float, default=0.0, metavar="S",
                   help="wait up to S seconds for an idle machine (other processes under 10%% "
                        "of the cores for 5 s) before each phase")
    p.add_argument("--dry-run", action="store_true", help="print, write nothing")
    p.add_argument("--repeats", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--mpi-bytes", type=int, default=32 << 20, help=argparse.SUPPRESS)
    p.add_argument("--mpi-worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if not os.environ.get("CTENSOR_CALIBRATE_CHILD"):
        # NumPy (imported with ctensor, before this module) has started its BLAS threads
        # already: measure in a fresh process with one BLAS thread per rank
        env = dict(os.environ, CTENSOR_CALIBRATE_CHILD="1", OPENBLAS_NUM_THREADS="1",
                   OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        args = sys.argv[1:] if argv is None else list(argv)
        done = subprocess.run([sys.executable, os.path.abspath(__file__), *args], env=env)
        if done.returncode:
            raise SystemExit(done.returncode)
        if a.dry_run:
            return {}
        return cost.load_devices(a.output)[a.name]  # this process prices with it too
    if a.mpi_worker:
        mpi_worker(a.mpi_bytes, a.repeats or 15)
        return {}
    mpi = not a.no_mpi
    if mpi:
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            print("calibrate: mpi4py is not installed: the MPI figures keep their values")
            mpi = False
    t0 = time.perf_counter()
    table = measure(a.quick, mpi, a.repeats, a.quiet)
    for k in _ORDER:
        if k in table:
            v = table[k]
            shown = f"{v:.4g}" if not isinstance(v, list) else \
                ", ".join(f"{x}: {y:.3g}" if isinstance(x, str) else f"{x:.3g}: {y:.3g}"
                          for x, y in v)
            print(f"{k:>19} = {shown}")
    load = os.getloadavg()[0]
    note = (f"measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by python "
            f"benchmarks/calibrate.py{' --quick' if a.quick else ''} in "
            f"{time.perf_counter() - t0:.0f} s, load {load:.1f}")
    if not a.dry_run:
        write_table(a.output, a.name, table, note)
        print(f"[{a.name}] written to {a.output} ({note})")
    return table


if __name__ == "__main__":
    main()
