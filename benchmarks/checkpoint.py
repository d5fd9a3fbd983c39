"""Checkpoints: ``python benchmarks/checkpoint.py`` (or under ``mpiexec -n 2``).

A ~512 MiB state (8 float32 tensors, split over the ranks) and a "training step": a
forward of 128 rows through each tensor as a weight, then every tensor updated in place
(``mul_``, as an optimizer step does), and the step's loss on every rank (one all-reduce).
Measured in one run, medians of ``--repeat``:

* **the stall of an asynchronous save**: a loop of steps (about twice a save's time) with
  ``ct.save(state, path, async_op=True)`` before its first step and ``handle.poll()`` after
  each, against the same loop without the save, run just before; the difference, against
  the time of a synchronous ``ct.save`` of the same state (target: <= 15%); and two parts
  of it that a loaded machine moves less: the calling thread's time blocked in the save's
  calls, and the extra CPU time of the process (copies, checksums, writes);
* **throughput** in MB/s: ``ct.save`` (XXH3-64 and fsync of every file, direct I/O, the
  commit) and ``ct.load`` (every file verified) against ``np.save`` / ``np.load`` of the
  same arrays, one file each (``np.save`` does not fsync: the row with fsync is given too;
  the loads read files written with fsync and dropped from the page cache, as ``ct.save``
  leaves its own).

It checks what it times: the asynchronous checkpoint, loaded, holds the values of the
moment of the save although the loop changed them meanwhile. ``--quick``: 8 MiB, one repeat.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

from harness import add_quick, one_blas_thread, positive_int, settle

one_blas_thread()

import numpy as np  # noqa: E402

import ctensor as ct  # noqa: E402

N_TENSORS = 8
COLUMNS = 1024


def make_state(mib: int) -> dict:
    rows = max(ct.world_size(), mib * 2 ** 20 // (4 * COLUMNS * N_TENSORS))
    return {f"layer{i}.weight": ct.randn(rows, COLUMNS, dtype=np.float32, sbp=ct.sbp.split(0))
            for i in range(N_TENSORS)}


def train_step(state: dict, x) -> float:
    """A linear layer's forward over ``x`` with each weight (compute), then the weight
    updated in place, as an optimizer step updates every parameter (memory); the step's
    "loss" (the forwards' sum) on every rank, one all-reduce: as the gradients' all-reduce
    of a data-parallel step, it makes every rank wait for the slowest each step (without
    it, the save's per-step exchange in ``poll()`` would be the loop's only one)."""
    loss = None
    for t in state.values():
        part = (x @ t.T).sum()
        loss = part if loss is None else loss + part
        t.mul_(0.9999)
    return float(loss)


def fingerprint(state: dict) -> list:
    """Exact per-tensor sums in float64 (equal arrays, equal sums)."""
    return [float(t.to(ct.float64).sum()) for t in state.values()]


def barrier() -> None:
    ct.ones(ct.world_size(), sbp=ct.sbp.split(0)).numpy()


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def async_stall(state: dict, x, path: str, repeat: int, n_steps: int) -> dict:
    """Medians over ``repeat`` rounds of ``n_steps`` steps: two plain loops, then one with an
    asynchronous save started before the first step (``poll()`` after each; ``wait()`` after
    the last, counted if it still waits). ``stall``: its excess over the faster plain loop;
    ``noise``: the plain loops' difference; ``blocked``: the calling thread's time inside
    ``ct.save``, ``poll()`` and ``wait()`` (``call``: ``ct.save`` alone); ``cpu``: the
    process's CPU time over the loop with the save less the plain loop's (the save's copies,
    checksums and writes: what it takes from training when the cores are busy, and a figure
    a loaded machine moves far less than wall times). Checks the loaded checkpoint against
    the values of the moment of the save."""
    rounds = {k: [] for k in ("call", "stall", "steps", "noise", "blocked", "cpu")}
    for r in range(repeat):
        plains, cpus = [], []
        for _ in range(2):  # two plain loops: their difference is the measurement's noise
            barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(n_steps):
                train_step(state, x)
            plains.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        plain = min(plains)
        expected = fingerprint(state)
        barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        handle = ct.save(state, path, async_op=True)
        call = blocked = time.perf_counter() - t0
        committed = None
        for i in range(n_steps):
            train_step(state, x)
            if committed is None:
                t1 = time.perf_counter()
                if handle.poll():
                    committed = i + 1
                blocked += time.perf_counter() - t1
        t1 = time.perf_counter()
        handle.wait()
        end = time.perf_counter()
        for key, value in [("call", call), ("stall", end - t0 - plain), ("noise",
                           abs(plains[1] - plains[0])), ("steps", committed or n_steps),
                           ("blocked", blocked + end - t1),
                           ("cpu", time.process_time() - c0 - min(cpus))]:
            rounds[key].append(value)
        if r == 0:
            got = fingerprint(ct.load(path, sbp=ct.sbp.split(0)))
            if got != expected:
                raise SystemExit(f"checkpoint.py: the asynchronous checkpoint holds "
                                 f"{got}, the state at the save was {expected}")
    return {k: statistics.median(v) for k, v in rounds.items()}


def numpy_side(state: dict, directory: str, repeat: int) -> tuple:
    """(np.save, np.save + fsync, np.load) seconds of this rank's shards, one file each."""
    shards = [arr for t in state.values() for arr in t.local_shards().values()]
    files = [os.path.join(directory, f"np{ct.rank()}_{i}.npy") for i in range(len(shards))]

    def save(sync: bool) -> None:
        for name in files:  # new files each time, as a checkpoint's are
            if os.path.exists(name):
                os.remove(name)
        for name, arr in zip(files, shards):
            with open(name, "wb") as f:
                np.save(f, arr)
                if sync:  # and out of the page cache, as ct.save leaves its files
                    f.flush()
                    os.fsync(f.fileno())
                    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)

    def load() -> None:
        for name in files:
            np.load(name)

    return (median_time(lambda: save(False), repeat), median_time(lambda: save(True), repeat),
            median_time(load, repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=positive_int, help="state size in MiB (default 512)")
    parser.add_argument("--repeat", type=positive_int, help="runs of each, median (default 3)")
    parser.add_argument("--dir", help="where to write (default: a temporary directory)")
    add_quick(parser)
    args = settle(parser.parse_args(), dict(mib=512, repeat=3), dict(mib=8, repeat=1))
    own = args.dir is None
    directory = tempfile.mkdtemp(prefix="ctensor-ckpt-bench-") if own else args.dir
    if ct.world_size() > 1:  # every rank writes into rank 0's directory
        mine, directory = directory, ct.runtime.world().exchange({ct.rank(): directory})[0]
        if own and mine != directory:
            os.rmdir(mine)  # (empty: made by this rank's mkdtemp)
    os.makedirs(directory, exist_ok=True)
    try:
        run(args, directory)
    finally:
        barrier()
        if own and ct.rank() == 0:
            shutil.rmtree(directory, ignore_errors=True)


def run(args, directory: str) -> None:
    state = make_state(args.mib)
    nbytes = sum(t.numel() * 4 for t in state.values())
    mb = nbytes / 1e6
    sync_path, async_path = os.path.join(directory, "sync"), os.path.join(directory, "async")
    t_save = median_time(lambda: ct.save(state, sync_path), args.repeat)
    t_load = median_time(lambda: ct.load(sync_path, sbp=ct.sbp.split(0)), args.repeat)
    t_np_save, t_np_fsync, t_np_load = numpy_side(state, directory, args.repeat)
    x = ct.randn(128, COLUMNS, dtype=np.float32)  # the step's input, on every rank
    t_step = median_time(lambda: train_step(state, x), 3)
    loop = max(3, int(np.ceil(2 * t_save / t_step)))  # steps: about twice a save's time,
    if ct.world_size() > 1:                            # the same count on every rank
        loop = max(ct.runtime.world().exchange({ct.rank(): loop}))
    a = async_stall(state, x, async_path, args.repeat, loop)
    if ct.rank() != 0:
        return
    print(f"state: {mb:,.0f} MB in {N_TENSORS} float32 tensors, split over {ct.world_size()} "
          f"rank(s); a training step (a forward of 128 rows through each, then mul_ of each "
          f"in place, the loss all-reduced) takes {t_step * 1e3:.0f} ms; medians of "
          f"{args.repeat}")
    print(f"{'':34s} {'seconds':>8s} {'MB/s':>8s} {'vs numpy':>9s}  (save: vs np.save + fsync)")
    rows = [("np.save (no fsync)", t_np_save, None), ("np.save + fsync", t_np_fsync, None),
            ("ct.save (XXH3, fsync, commit)", t_save, t_np_fsync),
            ("np.load", t_np_load, None), ("ct.load (every file verified)", t_load, t_np_load)]
    for name, seconds, ref in rows:
        ratio = f"{ref / seconds:8.2f}x" if ref else ""
        print(f"{name:34s} {seconds:8.3f} {mb / seconds:8.0f} {ratio:>9s}")
    print(f"async save: the call (host copies) {a['call']:.3f} s; committed after "
          f"{a['steps']:.0f} of {loop} steps; the loop stalled {a['stall']:.3f} s = "
          f"{a['stall'] / t_save:.0%} of the synchronous save's {t_save:.3f} s (target <= 15%); "
          f"two plain loops differed by {a['noise']:.3f} s = {a['noise'] / t_save:.0%} (the "
          f"measurement's noise)")
    print(f"async save, the parts: the calling thread blocked {a['blocked']:.3f} s = "
          f"{a['blocked'] / t_save:.0%} (in ct.save, poll() and wait()); the process's extra "
          f"CPU {a['cpu']:.3f} s = {a['cpu'] / t_save:.0%} (copies, checksums, writes)")

if __name__ == "__main__":
    main()
