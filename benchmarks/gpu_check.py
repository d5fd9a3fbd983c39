"""GPU check: ctensor's CuPy/NCCL backend verified and measured in one prepared command that
fits a 10-minute device call on one GPU (``--budget``, default 540 s).

Run on a machine with an NVIDIA GPU::

    pip install -e ".[test,gpu-cu13]"         # or gpu-cu12; nothing on a machine with CuPy
    python benchmarks/gpu_check.py            # all parts; exit status 1 if a check fails
    python benchmarks/gpu_check.py --quick    # fewer meshes and smaller benchmarks
    python benchmarks/gpu_check.py --only warm,staged2

Each part is guarded (one failing part does not stop the others), has its own time limit
and prints its figure (tests passed, collectives checked, a ratio) as soon as it ends; a part
that would not fit in what is left of ``--budget`` is skipped, said so. The run ends with a
table ``part | status | seconds | detail``, exit status 1 on any FAIL (a part over its limit
is one). Without a GPU it says so and exits with status 2: nothing was checked. Multi-rank
parts need ``mpiexec`` (the ``mpich`` wheel brings one: the README's GPU section names the
wheels to carry); without it they are skipped with that reason.

Correctness parts (FAIL makes the exit status 1):

* ``env``     versions of CuPy / CUDA / NCCL, the GPUs seen.
* ``warm``    the op samples on a 1-rank ``cuda`` mesh, first: every op kernel is compiled
  once (NVRTC, into CuPy's on-disk kernel cache, which the later parts' processes read).
* ``tests-ops``, ``tests-other``: the rest of ``pytest tests/test_gpu.py``, split: the op
  samples on the 2-, 3- and 2x2 meshes; boxing and autograd on ``cuda`` placements in
  simulation, cpu<->cuda moves, CPU-vs-GPU random bits, an NCCL world of one.
* ``nccl1``   NCCL collectives in a world of one rank, forced through NCCL (all dtypes and
  reductions the backend maps).
* ``staged2`` ``mpiexec -n 2`` on one GPU: the host-staged MPI path is chosen and reported,
  and every boxing pair, cpu<->cuda moves and a backward give exact values.
* ``ncclN``   only with >= 2 GPUs: ``mpiexec -n <gpus>``: NCCL is chosen; boxing on even,
  uneven and empty shapes is exact; collective time via ctensor vs raw NCCL.
* ``random``  ``ct.randn / rand / randint`` give the same bits on CPU and GPU.
* ``train``   a tiny GPT (dropout on) trains 8 AdamW steps: the loss curves on CPU and GPU
  agree (float64), single rank, data parallel and tensor parallel.
* ``gptref``  the hand-written CuPy GPT step (``gpt_reference.py``) gives ctensor's loss
  and gradients on the GPU, so the benchmark compares the same computation.

Benchmarks (ratios; targets from issue 6, reported, never failing the run):

* ``bench-matmul`` ctensor ``x @ w`` vs ``cupy.matmul`` on the same arrays.
* ``bench-gpt``    GPT step (hidden 1024, forward + backward) in ctensor vs direct CuPy
  (target <= 1.2x).
* ``bench-nccl``   all-reduce / all-gather of 64 MiB through ctensor's NCCL communicator vs
  ``cupy.cuda.nccl`` called directly on the same buffers (target <= 1.05x).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
MARK = "GPU_CHECK_RESULT "
CORRECTNESS = ("env", "warm", "tests-ops", "tests-other", "nccl1", "staged2", "ncclN",
               "random", "train", "gptref")
BENCHMARKS = ("bench-matmul", "bench-gpt", "bench-nccl")


class Skip(Exception):
    """A part that cannot run here (not a failure)."""


# ----------------------------------------------------------------------------- helpers
def _sync():
    import cupy
    cupy.cuda.Device().synchronize()


def _time(fn, repeats: int, warmup: int = 2) -> float:
    """Median seconds of ``fn()`` (device synchronised around each call)."""
    for _ in range(warmup):
        fn()
    _sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _mpiexec() -> str:
    """The ``mpiexec`` beside this Python or on PATH; ``Skip`` when there is none."""
    here = Path(sys.executable).parent / "mpiexec"
    found = str(here) if here.exists() else shutil.which("mpiexec")
    if not found:
        raise Skip("no mpiexec here: install the mpich wheel (carried to an offline machine, "
                   "see the README's GPU section) for the multi-rank parts")
    return found


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


class _Host1:
    """A world of one rank for NCCLCommunicator (no MPI needed)."""

    size, held_ranks = 1, (0,)


def _nccl_one():
    from ctensor.comm.nccl import NCCLCommunicator
    return NCCLCommunicator(_Host1(), share_id=lambda group, make, purpose: make(),
                            single_rank_copies=False)


# ----------------------------------------------------------------------------- parts
def part_env(args):
    import cupy
    import ctensor as ct
    rt = cupy.cuda.runtime
    names = [rt.getDeviceProperties(i)["name"].decode() for i in range(rt.getDeviceCount())]
    nccl = "not loadable (pip install nvidia-nccl-cu13 or -cu12)"
    if ct.cuda.nccl_available():
        from cupy.cuda import nccl as lib
        nccl = str(lib.get_version())
    return "PASS", (f"CuPy {cupy.__version__}, CUDA runtime {rt.runtimeGetVersion()}, driver "
                    f"{rt.driverGetVersion()}, NCCL {nccl}, GPUs {names}")


#: the test parts: (pytest -k expression, time limit in seconds); --quick drops the 3-rank
#: and 2x2 meshes. Sized for one H200 with a warm kernel cache: ~1,900 cases in all.
TEST_PARTS = {"warm": ("test_op_cuda and cuda-1", 200),
              "tests-ops": ("test_op_cuda and not cuda-1", 200),
              "tests-other": ("not test_op_cuda", 100)}


def _pytest(args, name: str):
    expr, limit = TEST_PARTS[name]
    if args.quick and name == "tests-ops":
        expr += " and not cuda-3 and not cuda-2x2"
    cmd = [sys.executable, "-m", "pytest", str(ROOT / "tests" / "test_gpu.py"), "-q", "-x",
           "-o", "addopts=", "-p", "no:cacheprovider", "--timeout=120", "-W", "ignore",
           "-k", expr]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) \
            else (exc.stdout or "")
        return "FAIL", f"over its {limit} s limit (-k {expr!r})\n{out[-2000:]}"
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    summary = lines[-1] if lines else "(no output)"
    if proc.returncode not in (0, 5):  # 5: nothing collected (no such meshes)
        return "FAIL", summary + "\n" + (proc.stdout + proc.stderr)[-3000:]
    return "PASS", summary


def part_warm(args):
    return _pytest(args, "warm")


def part_tests_ops(args):
    return _pytest(args, "tests-ops")


def part_tests_other(args):
    return _pytest(args, "tests-other")


def part_nccl1(args):
    import cupy
    import ctensor as ct
    from ctensor.comm.base import Message
    from ctensor.sbp import ReduceOp
    if not ct.cuda.nccl_available():
        raise Skip("NCCL not loadable: pip install nvidia-nccl-cu13 or -cu12")
    ct.cuda.module()
    comm = _nccl_one()
    done = 0
    try:
        base = cupy.arange(24).reshape(4, 6) - 7
        for dtype in (np.float32, np.float64, np.float16, np.int32, np.int64, np.int16,
                      np.uint8, np.bool_, np.complex64):
            x = (base > 0) if dtype is np.bool_ else base.astype(dtype)
            for op in ReduceOp:
                if np.dtype(dtype).kind == "c" and op is not ReduceOp.SUM:
                    continue
                out = comm.all_reduce((0,), {0: x}, op)[0]
                assert out.dtype == x.dtype and bool((out == x).all()), (dtype, op)
                out = comm.reduce_scatter((0,), {0: x}, op, 1, [6])[0]
                assert bool((out == x).all()), ("reduce_scatter", dtype, op)
                done += 2
            for dim in (0, 1):
                out = comm.all_gather((0,), {0: x}, dim, [x.shape[dim]])[0]
                assert bool((out == x).all()), ("all_gather", dtype, dim)
                done += 1
            out = comm.all_to_all((0,), {0: x}, 0, [4], 1, [6])[0]
            assert bool((out == x).all()), ("all_to_all", dtype)
            m = Message(0, 0, 0, x.shape, x.dtype)
            assert comm.exchange([m], {m: x})[m] is x
            done += 2
        _sync()
    finally:
        comm.close()
    return "PASS", f"{done} collectives through a 1-rank NCCL communicator equal the input"


def _run_mpi(args, part: str, nprocs: int, env_extra: dict, timeout: int):
    env = dict(os.environ, PYTHONUNBUFFERED="1", CTENSOR_TIMEOUT="60", **env_extra)
    cmd = [_mpiexec(), "-n", str(nprocs), sys.executable, str(Path(__file__).resolve()),
           "--part", part] + (["--quick"] if args.quick else [])
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return "FAIL", f"mpiexec -n {nprocs} over its {timeout} s limit"
    out = proc.stdout + proc.stderr
    result = [ln[len(MARK):] for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not result:
        return "FAIL", f"mpiexec -n {nprocs} exited {proc.returncode}:\n{out[-3000:]}"
    data = json.loads(result[-1])
    return data["status"], data["detail"]


def part_staged2(args):
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    # both ranks on one GPU: NCCL refuses that, so the host-staged path must be chosen
    return _run_mpi(args, "staged2", 2, {"CUDA_VISIBLE_DEVICES": visible}, 150)


def part_ncclN(args):
    import ctensor as ct
    n = min(ct.cuda.device_count(), 4)
    if n < 2:
        raise Skip(f"needs >= 2 GPUs, {ct.cuda.device_count()} visible")
    if not ct.cuda.nccl_available():
        raise Skip("NCCL not loadable: pip install nvidia-nccl-cu13 or -cu12")
    return _run_mpi(args, "ncclN", n, {}, 200)


def part_random(args):
    import ctensor as ct
    if not hasattr(ct, "randn"):
        raise Skip("ct.randn is not part of this build")
    S0, S1, B = ct.sbp.split(0), ct.sbp.split(1), ct.sbp.broadcast
    checked = 0
    with ct.simulate(4):
        for sbp in [(S0, S1), (B, S0), (S1, B)]:
            values = {}
            for device in ("cpu", "cuda"):
                mesh = ct.placement(device, [[0, 1], [2, 3]])
                ct.manual_seed(2024)
                values[device] = [
                    ct.randn(33, 17, placement=mesh, sbp=sbp).numpy(),
                    ct.randn(9, 5, placement=mesh, sbp=sbp, dtype=np.float64).numpy(),
                    ct.rand(16, 31, placement=mesh, sbp=sbp).numpy(),
                    ct.randint(0, 1000, (7, 13), placement=mesh, sbp=sbp).numpy()]
            for a, b in zip(values["cpu"], values["cuda"]):
                if a.dtype != b.dtype or a.tobytes() != b.tobytes():
                    return "FAIL", f"bits differ for sbp {sbp}, dtype {a.dtype}"
                checked += a.size
    return "PASS", f"{checked} random values bit-identical on CPU and GPU"


def _train(device: str, layout: str, steps: int) -> list:
    import ctensor as ct
    import ctensor.nn as nn
    import ctensor.optim as optim
    tokens = np.random.default_rng(0).integers(0, 16, (4, 9))
    with ct.simulate(1 if layout == "single" else 2):
        ct.set_default_device(device)
        try:
            ct.manual_seed(0)
            model = nn.GPT(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=16,
                           dropout=0.1, dtype=np.float64)
            mesh = ct.placement(device, [0] if layout == "single" else [0, 1])
            batch = ct.sbp.broadcast
            if layout == "dp2":
                nn.parallel.data_parallel(model, mesh)
                batch = ct.sbp.split(0)
            elif layout == "tp2":
                nn.parallel.tensor_parallel(model, mesh)
            opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
            idx = ct.tensor(tokens[:, :-1], placement=mesh, sbp=batch)
            target = ct.tensor(tokens[:, 1:], placement=mesh, sbp=batch)
            losses = []
            for _ in range(steps):
                opt.zero_grad()
                _, loss = model(idx, target)
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
                opt.step()
                losses.append(float(loss))
            return losses
        finally:
            ct.set_default_device("cpu")


def part_train(args):
    ref = np.array(_train("cpu", "single", 8))
    worst, rows = 0.0, []
    for layout in ("single", "dp2", "tp2"):
        for device in ("cpu", "cuda"):
            losses = np.array(_train(device, layout, 8))
            worst = max(worst, float(np.max(np.abs(losses - ref) / np.abs(ref))))
            rows.append(f"{device}/{layout} {losses[-1]:.6f}")
    if not ref[-1] < ref[0]:
        return "FAIL", f"the model did not learn: {ref}"
    status = "PASS" if worst < 1e-9 else "FAIL"
    return status, (f"loss {ref[0]:.4f} -> {ref[-1]:.4f}; max rel. diff vs CPU single "
                    f"{worst:.1e}; final: {', '.join(rows)}")


def part_gptref(args):
    import gpt_reference
    worst = gpt_reference.check_against_ctensor(device="cuda")
    return ("PASS" if worst < 1e-9 else "FAIL"), f"max rel. diff (loss, grads) {worst:.1e}"


def part_bench_matmul(args):
    import cupy
    import ctensor as ct
    n = 2048 if args.quick else 4096
    with ct.simulate(1):
        p = ct.placement("cuda", [0])
        x, w = ct.ones(n, n, placement=p), ct.ones(n, n, placement=p) * 0.5
        a, b = x.to_local(), w.to_local()
        with ct.no_grad():
            t_ct = _time(lambda: x @ w, 10)
        t_cp = _time(lambda: cupy.matmul(a, b), 10)
    ratio = t_ct / t_cp
    return "INFO", f"{n}x{n} float32: ctensor {t_ct * 1e3:.2f} ms, CuPy {t_cp * 1e3:.2f} ms, " \
                   f"ratio {ratio:.3f}"


def part_bench_gpt(args):
    import cupy
    import ctensor as ct
    import ctensor.nn as nn
    import gpt_reference
    n_layer, batch, block, vocab = (1, 4, 128, 4096) if args.quick else (2, 8, 256, 8192)
    n_embd, n_head = 1024, 16
    tokens = np.random.default_rng(0).integers(0, vocab, (batch, block + 1))
    with ct.simulate(1):
        ct.set_default_device("cuda")
        try:
            ct.manual_seed(0)
            model = nn.GPT(vocab_size=vocab, block_size=block, n_layer=n_layer, n_head=n_head,
                           n_embd=n_embd, dtype=np.float32)
            idx, target = ct.tensor(tokens[:, :-1]), ct.tensor(tokens[:, 1:])
            params = dict(model.named_parameters())

            def ct_step():
                for prm in params.values():
                    prm.grad = None
                _, loss = model(idx, target)
                loss.backward()

            arrays = {k: v.to_local() for k, v in params.items()}  # the same buffers
            toks = cupy.asarray(tokens)
            t_ct = _time(ct_step, 5 if args.quick else 10)
        finally:
            ct.set_default_device("cpu")
    t_cp = _time(lambda: gpt_reference.step(cupy, arrays, toks[:, :-1], toks[:, 1:], n_layer,
                                            n_head), 5 if args.quick else 10)
    ratio = t_ct / t_cp
    return ("PASS" if ratio <= 1.2 else "SLOW"), (
        f"hidden {n_embd}, {n_layer} layer(s), batch {batch}x{block}, vocab {vocab}: ctensor "
        f"{t_ct * 1e3:.1f} ms, CuPy {t_cp * 1e3:.1f} ms, ratio {ratio:.3f} (target <= 1.2)")


def part_bench_nccl(args):
    import cupy
    import ctensor as ct
    from ctensor.sbp import ReduceOp
    if not ct.cuda.nccl_available():
        raise Skip("NCCL not loadable: pip install nvidia-nccl-cu12")
    ct.cuda.module()
    comm = _nccl_one()
    try:
        x = cupy.ones(16 * 2 ** 20, dtype=cupy.float32)  # 64 MiB
        out = cupy.empty_like(x)
        raw = comm._comm((0,))
        from cupy.cuda import nccl
        stream = cupy.cuda.get_current_stream().ptr
        t_ct = _time(lambda: comm.all_reduce((0,), {0: x}, ReduceOp.SUM), 20)
        t_raw = _time(lambda: raw.allReduce(x.data.ptr, out.data.ptr, x.size, nccl.NCCL_FLOAT32,
                                            nccl.NCCL_SUM, stream), 20)
        g_ct = _time(lambda: comm.all_gather((0,), {0: x}, 0, [x.size]), 20)
        g_raw = _time(lambda: raw.allGather(x.data.ptr, out.data.ptr, x.size,
                                            nccl.NCCL_FLOAT32, stream), 20)
    finally:
        comm.close()
    worst = max(t_ct / t_raw, g_ct / g_raw)
    return ("PASS" if worst <= 1.05 else "SLOW"), (
        f"world of 1, 64 MiB: all_reduce {t_ct * 1e3:.3f} vs {t_raw * 1e3:.3f} ms "
        f"(ratio {t_ct / t_raw:.3f}), all_gather {g_ct * 1e3:.3f} vs {g_raw * 1e3:.3f} ms "
        f"(ratio {g_ct / g_raw:.3f}); target <= 1.05 (multi-GPU numbers: part ncclN)")


PARTS = {"env": part_env, "warm": part_warm, "tests-ops": part_tests_ops,
         "tests-other": part_tests_other, "nccl1": part_nccl1,
         "staged2": part_staged2,
         "ncclN": part_ncclN, "random": part_random, "train": part_train,
         "gptref": part_gptref, "bench-matmul": part_bench_matmul,
         "bench-gpt": part_bench_gpt, "bench-nccl": part_bench_nccl}


# ----------------------------------------------------------------------------- MPI children
def _boxing_checks(mesh, shapes) -> int:
    """Every 1-D SBP pair on ``mesh`` for ``shapes``: values equal NumPy's."""
    import ctensor as ct
    sbps = [ct.sbp.split(0), ct.sbp.split(1), ct.sbp.broadcast, ct.sbp.partial_sum,
            ct.sbp.partial_max]
    n = 0
    for shape in shapes:
        value = np.random.default_rng(sum(shape)).standard_normal(shape)
        for src in sbps:
            x = ct.tensor(value, placement=mesh, sbp=src)
            for dst in sbps:
                got = x.to_global(sbp=dst).numpy()
                if not np.allclose(got, value, rtol=1e-12, atol=1e-12):
                    raise AssertionError(f"{src} -> {dst} on {shape}: wrong values")
                n += 1
    return n


def _moves_and_backward(size: int) -> int:
    import ctensor as ct
    value = np.arange(35.0).reshape(5, 7)
    cpu = ct.placement("cpu", list(range(size))[::-1])
    gpu = ct.placement("cuda", list(range(size)))
    x = ct.tensor(value, placement=cpu, sbp=ct.sbp.split(1), requires_grad=True)
    y = x.to_global(gpu, ct.sbp.split(0))
    back = y.to_global(ct.placement("cpu", [0]), ct.sbp.broadcast)
    assert np.array_equal(back.numpy(), value), "cpu -> cuda -> cpu"
    (y * y).sum().backward()
    assert x.grad.placement == cpu and np.allclose(x.grad.numpy(), 2 * value), "backward"
    return 3


def child(part: str, quick: bool) -> None:
    """Runs on every rank of ``mpiexec``; rank 0 prints the result line."""
    import warnings
    import ctensor as ct
    size = ct.world_size()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backend = ct.cuda.backend()
    reported = [str(w.message) for w in caught if "host-staged" in str(w.message)]
    detail = f"{size} ranks, backend {backend}"
    if part == "staged2":
        assert backend == "host-staged", f"expected the host-staged path, got {backend}"
        assert bool(reported) == (ct.rank() == 0), "the choice must be reported once, on rank 0"
    else:
        assert backend == "nccl", f"expected NCCL with one GPU per rank, got {backend}"
        assert ct.cuda.current_device() == ct.rank() % ct.cuda.device_count()
    gpu = ct.placement("cuda", list(range(size)))
    n = _boxing_checks(gpu, [(13, 17), (8, 12), (1, 5), (0, 3)])
    if size == 4:
        n += _boxing_checks(ct.placement("cuda", [[0, 1], [2, 3]]), [(13, 17)])
    n += _moves_and_backward(size)
    detail += f"; {n} boxing/move checks exact"
    if part == "ncclN":
        detail += "; " + _bench_collectives(size, quick)
    if ct.rank() == 0:
        print(MARK + json.dumps({"status": "PASS", "detail": detail}), flush=True)


def _bench_collectives(size: int, quick: bool) -> str:
    """All-reduce (P -> B) and all-gather (S(0) -> B) of 64 MiB through ctensor vs the same
    NCCL communicator called directly on the same buffers; the slowest rank decides."""
    import cupy
    from cupy.cuda import nccl
    from mpi4py import MPI
    import ctensor as ct
    from ctensor import runtime
    comm = runtime.world().comm_for("cuda")
    group = tuple(range(size))
    raw = comm._comm(group)
    gpu = ct.placement("cuda", list(range(size)))
    numel = (4 if quick else 16) * 2 ** 20
    p = ct.ones(numel, placement=gpu, sbp=ct.sbp.partial_sum)
    s = ct.ones(numel, placement=gpu, sbp=ct.sbp.split(0))
    x, gx = p.to_local(), s.to_local()
    out, gout = cupy.empty_like(x), cupy.empty(numel, dtype=cupy.float32)
    stream = cupy.cuda.get_current_stream().ptr

    def timed(fn):
        MPI.COMM_WORLD.Barrier()
        return MPI.COMM_WORLD.allreduce(_time(fn, 10), op=MPI.MAX)

    t_ct = timed(lambda: p.to_global(sbp=ct.sbp.broadcast))
    t_raw = timed(lambda: raw.allReduce(x.data.ptr, out.data.ptr, x.size, nccl.NCCL_FLOAT32,
                                        nccl.NCCL_SUM, stream))
    g_ct = timed(lambda: s.to_global(sbp=ct.sbp.broadcast))
    g_raw = timed(lambda: raw.allGather(gx.data.ptr, gout.data.ptr, gx.size, nccl.NCCL_FLOAT32,
                                        stream))
    return (f"{numel * 4 >> 20} MiB all_reduce ratio {t_ct / t_raw:.3f} "
            f"({t_ct * 1e3:.2f} vs {t_raw * 1e3:.2f} ms), all_gather ratio {g_ct / g_raw:.3f} "
            f"({g_ct * 1e3:.2f} vs {g_raw * 1e3:.2f} ms); target <= 1.05")


# ----------------------------------------------------------------------------- main
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer meshes, smaller sizes")
    parser.add_argument("--only", default="", help="comma-separated parts: " + ", ".join(PARTS))
    parser.add_argument("--budget", type=float, default=540.0,
                        help="seconds for the whole run (a part that would not fit is skipped)")
    parser.add_argument("--part", default="", help=argparse.SUPPRESS)  # MPI child
    args = parser.parse_args()
    if args.part:
        child(args.part, args.quick)
        return 0
    import ctensor as ct
    if not ct.cuda.is_available():
        print("gpu_check: no usable GPU here (ct.cuda.is_available() is False: CuPy missing "
              "or no CUDA GPU visible); nothing was checked. pip install -e '.[test,gpu-cu13]' "
              "(or gpu-cu12) on a machine with an NVIDIA GPU.")
        return 2
    chosen = [p for p in args.only.split(",") if p] or list(PARTS)
    unknown = [p for p in chosen if p not in PARTS]
    if unknown:
        parser.error(f"unknown parts {unknown}; accepted: {', '.join(PARTS)}")
    rows, start = [], time.perf_counter()
    for name in chosen:
        t0 = time.perf_counter()
        left = args.budget - (t0 - start)
        need = TEST_PARTS.get(name, (None, 30))[1]
        try:
            if left < need:
                raise Skip(f"out of time: {left:.0f} s left of --budget {args.budget:.0f}, "
                           f"the part may take {need} s")
            status, detail = PARTS[name](args)
        except Skip as why:
            status, detail = "SKIP", str(why)
        except Exception as exc:  # a failing part must not stop the others
            status = "FAIL"
            detail = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-2000:]}"
        rows.append((name, status, time.perf_counter() - t0, detail))
        print(f"[{name}] {status} ({rows[-1][2]:.1f} s) {detail.splitlines()[0] if detail else ''}",
              flush=True)
    print(f"\n{'part':<13} {'status':<6} {'seconds':>8}  detail")
    for name, status, seconds, detail in rows:
        lines = (detail or "").splitlines() or [""]
        print(f"{name:<13} {status:<6} {seconds:8.1f}  {lines[0]}")
        if status == "FAIL":
            for line in lines[1:]:
                print(f"{'':<30}{line}")
    failed = [n for n, s, _, _ in rows if s == "FAIL"]
    print(f"\ntotal {time.perf_counter() - start:.1f} s; "
          f"{'FAILED: ' + ', '.join(failed) if failed else 'all checks passed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
