"""Measure this machine for the cost model: ``python benchmarks/calibrate.py``.

Writes the ``cpu`` table of ``ctensor/devices.toml`` (or of ``--output PATH``), the one the
signature choice prices ``"cpu"`` placements with and ``ct.plan`` prices a CPU step with
(:mod:`ctensor.cost`). It measures in a fresh process with one BLAS thread per rank, as
the benchmarks run. It measures, each as
the median of repeats:

* ``peak_flops_fp32`` / ``peak_flops``: a float32 / float16 NumPy GEMM (``--gemm`` sizes);
* ``memory_bandwidth``: bytes read plus written per second of NumPy's elementwise add over
  operands of ``--stream-bytes`` (the cost model's byte count: inputs plus outputs);
* ``op_overhead``: seconds per dispatched op of a training step (forward, backward, gradient
  clip, AdamW) of a GPT so small (d = 8) that its kernels cost nothing: the step's measured
  time, less its kernels' roofline, over the ops a shape-only trace of it counts;
* ``efficiency``: the fraction of those GEMM and streaming rates the kernels of a GPT step
  reach (NumPy's several passes per LayerNorm or softmax, strided batched matmuls, the
  embedding's scatter-add): the roofline of a d = 96 GPT step's kernels over its measured
  time less its dispatch;
* under ``mpiexec -n 2`` (started by this command; skipped without mpi4py or ``--no-mpi``):
  ``intra_latency`` — half an MPI ping-pong of 8 bytes; ``call_overhead`` — a ctensor
  all-reduce of one element less its two latency steps and one op's dispatch;
  ``intra_bandwidth`` — the bytes one rank sends per second in a ctensor all-reduce of
  ``--mpi-bytes`` (its time less the small one's). One node: the ``inter_*`` figures repeat
  the ``intra_*`` ones.

``--quick``: smaller sizes and fewer repeats (about half a minute). Rerun it on a quiet
machine: a loaded one measures the other processes too.
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

__all__ = ["measure", "write_table", "main"]


def _median_seconds(fn, repeats: int, inner: int = 1) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times)


def gemm_rate(n: int, dtype, repeats: int) -> float:
    """FLOP/s of an ``n x n`` by ``n x n`` NumPy matmul (``2 n^3`` FLOPs)."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(dtype) for _ in range(2))
    out = np.empty((n, n), dtype)
    return 2.0 * n ** 3 / _median_seconds(lambda: np.matmul(a, b, out=out), repeats)


def stream_rate(nbytes: int, repeats: int) -> float:
    """Bytes/s (two read, one written) of ``np.add`` over float32 operands of ``nbytes``."""
    a = np.ones(max(1, nbytes // 4), np.float32)
    b, c = a.copy(), np.empty_like(a)
    inner = max(1, (64 << 20) // max(nbytes, 1))
    return 3.0 * a.nbytes / _median_seconds(lambda: np.add(a, b, out=c), repeats, inner)


#: the GPTs the per-op cost and the kernels' efficiency are measured on: (vocabulary,
#: sequence, layers, heads, width, batch). The first is so small its kernels cost nothing;
#: the second's kernels cost about as much as its dispatch (neither is a size of
#: ``benchmarks/predict.py``)
TINY_GPT = (16, 8, 2, 2, 8, 2)
MEDIUM_GPT = (256, 48, 2, 4, 96, 12)


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


def _gpt_figures(size: tuple, repeats: int, dev) -> tuple:
    """``(measured seconds, ops, kernels' roofline seconds on dev)`` of one step."""
    import ctensor as ct
    with ct.simulate(1, meta=True), ct.plan.record() as trace:
        _gpt_step(*size)()
    ops = sum(w.count for w in trace.ops.values())
    kernels = sum(ct.plan.op_seconds(trace, replace(dev, op_overhead=0.0, efficiency=1.0),
                                     fused=False).values())
    with ct.simulate(1):
        step = _gpt_step(*size)
        for _ in range(3):  # plans, caches
            step()
        seconds = _median_seconds(step, repeats)
    return seconds, ops, kernels


def op_overhead(repeats: int, dev) -> tuple:
    """``(seconds per dispatched op, kernel efficiency)``: the tiny GPT's step less its
    kernels' roofline, over its ops; then the fraction of the roofline (GEMM and streaming
    rates) the medium GPT's kernels reach, its step less its dispatch (see the module
    docstring). ``dev``: the measured rates."""
    seconds, ops, kernels = _gpt_figures(TINY_GPT, repeats, dev)
    per_op = max(seconds - kernels, 0.0) / ops
    seconds, ops, kernels = _gpt_figures(MEDIUM_GPT, max(3, repeats // 2), dev)
    efficiency = kernels / max(seconds - per_op * ops, kernels)
    return per_op, max(efficiency, 0.01)


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
    latency = _median_seconds(ping, repeats, 200) / 2
    p = ct.placement("cpu", [0, 1])
    P, B = ct.sbp.partial_sum, ct.sbp.broadcast

    def all_reduce(n):
        x = ct.ones(n, dtype=ct.float32, placement=p, sbp=P)
        return lambda: x.to_global(sbp=B)
    comm.Barrier()
    t_small = _median_seconds(all_reduce(1), repeats, 50)
    comm.Barrier()
    t_big = _median_seconds(all_reduce(max(1, nbytes // 4)), repeats)
    t_small, t_big = (comm.allreduce(t, op=MPI.MAX) for t in (t_small, t_big))
    if comm.rank == 0:
        print(json.dumps({"latency": latency, "all_reduce_small": t_small,
                          "all_reduce_big": t_big, "nbytes": (nbytes // 4) * 4}))


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


def measure(quick: bool = False, mpi: bool = True, repeats: int = 0) -> dict:
    """This machine's ``cpu`` table (a dict of :class:`ctensor.cost.Device` fields)."""
    from ctensor import cost
    r = repeats or (5 if quick else 15)
    gemm = 256 if quick else 512
    table = {"peak_flops_fp32": gemm_rate(gemm, np.float32, r),
             "peak_flops": gemm_rate(64 if quick else 128, np.float16, max(3, r // 3)),
             "memory_bandwidth": stream_rate(4 << 20, r)}
    table["memory_bytes"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    base = cost.machine("cpu")
    guess = replace(base, **table, efficiency=1.0)
    table["op_overhead"], table["efficiency"] = op_overhead(r, guess)
    table.update(intra_latency=base.intra_latency, intra_bandwidth=base.intra_bandwidth,
                 call_overhead=base.call_overhead)
    if mpi:
        m = _mpi((8 << 20) if quick else (32 << 20), r)
        table["intra_latency"] = m["latency"]
        table["call_overhead"] = max(0.0, m["all_reduce_small"] - 2 * m["latency"]
                                     - table["op_overhead"])
        # a ring all-reduce on 2 ranks sends its whole buffer once
        table["intra_bandwidth"] = m["nbytes"] / max(m["all_reduce_big"] -
                                                     m["all_reduce_small"], 1e-9)
    table["inter_latency"], table["inter_bandwidth"] = (table["intra_latency"],
                                                        table["intra_bandwidth"])
    return table


_ORDER = ["peak_flops", "peak_flops_fp32", "memory_bytes", "memory_bandwidth",
          "intra_bandwidth", "inter_bandwidth", "intra_latency", "inter_latency",
          "call_overhead", "op_overhead", "efficiency"]


def write_table(path: str, name: str, table: dict, note: str = "") -> None:
    """Replace (or append) the ``[name]`` table of the TOML file ``path``, keeping the rest
    of the file (comments included) as it is."""
    def value(k):
        return str(int(table[k])) if k == "memory_bytes" else repr(float(table[k]))
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
    table = measure(a.quick, mpi, a.repeats)
    for k in _ORDER:
        if k in table:
            print(f"{k:>18} = {table[k]:.4g}")
    load = os.getloadavg()[0]
    note = (f"measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by python -m "
            f"benchmarks/calibrate.py{' --quick' if a.quick else ''} in "
            f"{time.perf_counter() - t0:.0f} s, load {load:.1f}")
    if not a.dry_run:
        write_table(a.output, a.name, table, note)
        print(f"[{a.name}] written to {a.output} ({note})")
    return table


if __name__ == "__main__":
    main()
