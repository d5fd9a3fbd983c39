"""Gradient reduction overlapped with the backward: the data-parallel step with each
bucket's all-reduce started during the backward (ctensor's default) against the same
buckets reduced after the backward (``ct.autograd.set_bucket_overlap(False)``).

    mpiexec -n 2 python benchmarks/overlap.py [--width 512] [--depth 8] [--rounds 9]

An MLP stack (``--depth`` blocks of ``Linear(width, width)`` + ``Tanh``, float64, data
parallel over every rank, global batch ``--batch`` split by rows) with the bucket size set
to one weight, so a bucket fills as each layer's backward ends and ``depth`` all-reduces
are in flight or waiting while the earlier layers' backward runs. One step is forward +
backward (the gradients reduced before ``backward()`` returns). Three ways, interleaved
round by round so a busy machine slows all alike:

* **during**: buckets start as they fill; the autograd engine tests the posted MPI
  requests between backward functions (MPICH progresses a nonblocking collective only
  inside MPI calls, so without those tests the data would move at the final wait);
* **after**: the same buckets, the same order, started once the backward is done;
* **no reduction**: the same step under ``ct.autograd.no_sync()``, the compute floor;
* **by hand during** / **by hand after** (under mpiexec): the same step written in NumPy +
  mpi4py, one ``Iallreduce`` per weight started as its gradient is ready and
  ``Testall`` after each layer's backward, or all started after the backward: how much
  overlap this machine allows code with no library around it.

Prints per way the median step time (the slowest rank's, per round), the median of the
per-round ratios after / during (ctensor's and by hand), the share of the reduction's time the
overlap hid ``(after - during) / (after - no reduction)``, and checks bit for bit that both
reducing ways give the same loss and gradients on every rank (exit 1 if not). One BLAS
thread per rank. With ``--quick`` (or without mpiexec) it runs simulated on 2 ranks:
nothing overlaps there, only the bits are checked.
"""
from __future__ import annotations

import argparse
import statistics
import time

import harness

harness.one_blas_thread()  # before NumPy starts its BLAS threads

import numpy as np  # noqa: E402

import ctensor as ct  # noqa: E402
import ctensor.nn as nn  # noqa: E402
from harness import add_quick, positive_int, settle  # noqa: E402

WAYS = ("during", "after", "no reduction")
HAND = ("by hand during", "by hand after")
DEFAULT = dict(width=512, depth=8, batch=64, rounds=9, steps=5)
QUICK = dict(width=16, depth=3, batch=8, rounds=1, steps=1)


def build(a, mesh):
    ct.manual_seed(0)
    layers = []
    for _ in range(a.depth):
        layers += [nn.Linear(a.width, a.width), nn.Tanh()]
    model = nn.parallel.data_parallel(nn.Sequential(*layers).double(), mesh)
    rng = np.random.default_rng(0)
    x = ct.tensor(rng.standard_normal((a.batch, a.width))).to_global(
        mesh, nn.parallel.batch_sbp(mesh))
    return model, x


def step(model, x, way: str):
    """One forward + backward; the loss and this process's gradient shards."""
    for p in model.parameters():
        p.grad = None
    ct.autograd.set_bucket_overlap(way != "after")
    loss = (model(x) ** 2).mean()
    if way == "no reduction":
        with ct.autograd.no_sync():
            loss.backward()
    else:
        loss.backward()
    return loss


def shards(model, loss) -> list:
    """The loss and every gradient shard this process holds, as NumPy arrays."""
    out = []
    for t in [loss] + [p.grad for p in model.parameters()]:
        local = t.local_shards()
        out += [np.asarray(local[r]) for r in sorted(local)]
    return out


def same_bits(model, x, comm) -> bool:
    """Both reducing ways: the same loss and gradients, bit for bit, on every rank."""
    got = {way: shards(model, step(model, x, way)) for way in ("during", "after")}
    same = all(a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
               for a, b in zip(got["during"], got["after"]))
    same = same and len(got["during"]) == len(got["after"])
    if comm is not None:
        from mpi4py import MPI
        same = bool(comm.allreduce(int(same), op=MPI.MIN))
    return same


class Hand:
    """The same MLP step in NumPy + mpi4py: this rank's rows of the batch, the weights'
    gradients all-reduced (summed; ctensor's mean loss over the global batch alike)."""

    def __init__(self, model, x, comm):
        self.comm = comm
        self.weights = [np.asarray(p.to_local()) for p in model.parameters()]
        self.x = np.asarray(x.to_local())
        self.count = x.shape[0] * x.shape[1]

    def step(self, overlap: bool) -> None:
        from mpi4py import MPI
        pairs = list(zip(self.weights[0::2], self.weights[1::2]))  # (weight, bias)
        hs = [self.x]
        for w, b in pairs:
            hs.append(np.tanh(hs[-1] @ w.T + b))
        g = 2 * hs[-1] / self.count
        requests, grads = [], []
        for i in reversed(range(len(pairs))):
            g = g * (1 - hs[i + 1] ** 2)
            grads += [g.sum(0), g.T @ hs[i]]
            g = g @ pairs[i][0]
            if overlap:
                for grad in grads[-2:]:
                    requests.append(self.comm.Iallreduce(MPI.IN_PLACE, grad))
                MPI.Request.Testall(requests)
        if not overlap:
            requests = [self.comm.Iallreduce(MPI.IN_PLACE, grad) for grad in grads]
        MPI.Request.Waitall(requests)


def measure(model, x, a, comm) -> dict:
    """Per way, the slowest rank's mean step seconds of each round."""
    hand = Hand(model, x, comm) if comm is not None else None
    ways = WAYS + (HAND if hand is not None else ())

    def run(way):
        if way in HAND:
            hand.step(way == HAND[0])
        else:
            step(model, x, way)

    for way in ways:  # warm-up: buffers, plans
        for _ in range(2):
            run(way)
    times: dict = {w: [] for w in ways}
    for _ in range(a.rounds):
        for way in ways:
            if comm is not None:
                comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(a.steps):
                run(way)
            seconds = (time.perf_counter() - t0) / a.steps
            if comm is not None:
                from mpi4py import MPI
                seconds = comm.allreduce(seconds, op=MPI.MAX)
            times[way].append(seconds)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in DEFAULT:
        p.add_argument("--" + name.replace("_", "-"), type=positive_int, default=None)
    add_quick(p)
    a = settle(p.parse_args(), DEFAULT, QUICK)
    mpi = ct.launched_by_mpi()
    comm = None
    if mpi:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
    context = None if mpi else ct.simulate(2)
    if context is not None:
        context.__enter__()
    size, overlap = ct.autograd.bucket_size(), ct.autograd.bucket_overlap()
    try:
        mesh = ct.placement("cpu", list(range(ct.world_size() if mpi else 2)))
        model, x = build(a, mesh)
        ct.autograd.set_bucket_size(a.width * a.width * 8 / 2**20)  # one weight a bucket
        with ct.debug.comm_log() as log:
            step(model, x, "during")
        buckets = [e for e in log if e.op == "grad_sync"]
        same = same_bits(model, x, comm)
        times = measure(model, x, a, comm)
    finally:
        ct.autograd.set_bucket_size(size / 2**20)
        ct.autograd.set_bucket_overlap(overlap)
        if context is not None:
            context.__exit__(None, None, None)
    if ct.rank() != 0:
        if not same:
            raise SystemExit(1)
        return
    mib = sum(e.nbytes for e in buckets) / 2**20
    print(f"MLP {a.depth} x Linear({a.width}, {a.width}) + Tanh, float64, batch {a.batch}, "
          f"data parallel on {mesh.size} ranks ({'mpiexec' if mpi else 'simulated'}); "
          f"{len(buckets)} buckets, {mib:.1f} MiB per rank reduced; {a.rounds} rounds x "
          f"{a.steps} steps, slowest rank")
    median = {w: statistics.median(times[w]) for w in times}
    for way in times:
        print(f"{way:<16}{median[way] * 1e3:>10.2f} ms/step   "
              f"{' '.join(f'{t * 1e3:.1f}' for t in times[way])}")
    ratios = [after / during for after, during in zip(times["after"], times["during"])]
    hidden = [(af - du) / (af - no) if af > no else float("nan")
              for af, du, no in zip(times["after"], times["during"], times["no reduction"])]
    print(f"after / during: {statistics.median(ratios):.3f}x (median of per-round ratios: "
          f"{' '.join(f'{r:.2f}' for r in ratios)})")
    if HAND[0] in times:
        by_hand = [af / du for af, du in zip(times[HAND[1]], times[HAND[0]])]
        print(f"by hand after / during: {statistics.median(by_hand):.3f}x (per round: "
              f"{' '.join(f'{r:.2f}' for r in by_hand)})")
    print(f"reduction time hidden by the overlap: {statistics.median(hidden):.0%} "
          f"(median over rounds of (after - during) / (after - no reduction))")
    print(f"same loss and gradients, bit for bit, during vs after: {'yes' if same else 'NO'}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
