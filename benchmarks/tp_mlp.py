"""Megatron tensor-parallel MLP step: ctensor vs the hand-written floor vs PyTorch DTensor.

    mpiexec -n 2 python benchmarks/tp_mlp.py [--tokens 2048] [--hidden 256] [--quick]

The step is ``y = relu(x @ W1.T) @ W2.T`` with ``W1`` (4H, H) split ``S(0)``, ``W2`` (H, 4H)
split ``S(1)`` and ``x`` (T, H) broadcast, loss ``(y * y).mean()``, forward and backward.
It runs, interleaved in one job so a busy machine slows all alike:

* **ctensor**: the step written on global tensors, nothing else;
* **the floor**: the same step by hand in NumPy + mpi4py: local matmuls, exactly one
  ``Allreduce`` of the (T, H) partial output in the forward, no collective in the backward
  (``y`` is replicated, so every rank computes ``dy`` itself), the hand-derived gradients;
* **PyTorch DTensor** (only when ``torch`` is importable; it is never a dependency): the
  same step on ``distribute_tensor`` shards, ``torch.distributed`` on gloo over localhost,
  initialised from the MPI rank and size.

Before timing, the loss and weight gradients of all three are checked against a float64
NumPy computation of the unsplit step (the benchmark stops if one differs). It prints the
median step time of the slowest rank, the ratios against the floor (target for ctensor:
<= 1.15x) and the collectives and bytes each used in one forward + backward against the
hand-placed optimum: one all-reduce of T*H*itemsize bytes. One BLAS thread per rank.
"""
from __future__ import annotations

import argparse
from typing import Optional

import harness

harness.one_blas_thread()  # before NumPy starts its BLAS threads

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import ctensor as ct  # noqa: E402
from harness import add_quick, positive_int, settle, torch_init_method  # noqa: E402

TARGET = 1.15  # ctensor's step time / the floor's


def part(n: int, parts: int, i: int) -> slice:
    """Part ``i`` of ``n`` over ``parts`` ranks by ctensor's uneven-split rule (the first
    ``n % parts`` parts one longer)."""
    size = n // parts
    start = i * size + min(i, n % parts)
    return slice(start, start + size + (1 if i < n % parts else 0))


def reference(x, w1, w2):
    """Loss, dW1, dW2 of the unsplit step in float64 (the ground truth)."""
    x, w1, w2 = (a.astype(np.float64) for a in (x, w1, w2))
    h = x @ w1.T
    a = np.maximum(h, 0)
    y = a @ w2.T
    dy = 2 * y / y.size
    dh = (dy @ w2) * (h > 0)
    return float((y * y).mean()), dh.T @ x, dy.T @ a


# ----------------------------------------------------------------------------- the floor
class Floor:
    """The step by hand: each rank holds rows ``mine`` of W1 and the same columns of W2."""

    def __init__(self, x, w1, w2, comm):
        self.comm = comm
        self.x, self.w1, self.w2 = x, w1, w2
        self.y = np.empty((x.shape[0], w2.shape[0]), dtype=x.dtype)

    def step(self):
        h = self.x @ self.w1.T                     # (T, 4H/n): this rank's hidden units
        a = np.maximum(h, 0)
        partial = a @ self.w2.T                    # (T, H): this rank's share of y
        self.comm.Allreduce(partial, self.y)       # the only collective
        y = self.y
        loss = (y * y).mean()
        # backward: y is replicated, so dy and everything after it are local
        dy = y * (2.0 / y.size)
        dw2 = dy.T @ a                             # (H, 4H/n): W2's own columns
        dh = (dy @ self.w2) * (h > 0)
        dw1 = dh.T @ self.x                        # (4H/n, H): W1's own rows
        return loss, dw1, dw2


# ----------------------------------------------------------------------------- ctensor
class Ctensor:
    def __init__(self, x, w1, w2):
        mesh = ct.placement.all()
        self.x = ct.tensor(x, placement=mesh, sbp=ct.sbp.broadcast)
        self.w1 = ct.tensor(w1, placement=mesh, sbp=ct.sbp.split(0), requires_grad=True)
        self.w2 = ct.tensor(w2, placement=mesh, sbp=ct.sbp.split(1), requires_grad=True)

    def step(self):
        self.w1.grad = self.w2.grad = None
        y = (self.x @ self.w1.T).relu() @ self.w2.T
        loss = (y * y).mean()
        loss.backward()
        return loss

    def result(self):
        """Loss and this rank's gradient shards after :meth:`step`."""
        loss = self.step()
        return loss.item(), self.w1.grad.to_local(), self.w2.grad.to_local()

    def grad_layouts(self) -> str:
        return ", ".join(str(g.sbp[0]) for g in (self.w1.grad, self.w2.grad))


# ----------------------------------------------------------------------------- DTensor
class DTensor:
    """The step in PyTorch DTensor (gloo, one process per MPI rank, one host)."""

    def __init__(self, x, w1, w2, comm):
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor
        torch.set_num_threads(1)  # as NumPy's one BLAS thread per rank
        if not dist.is_initialized():
            dist.init_process_group("gloo", init_method=torch_init_method(comm),
                                    rank=comm.rank, world_size=comm.size)
        mesh = init_device_mesh("cpu", (comm.size,))
        self.torch = torch
        self.x = distribute_tensor(torch.from_numpy(x), mesh, [Replicate()])
        self.w1 = distribute_tensor(torch.from_numpy(w1), mesh, [Shard(0)]).requires_grad_()
        self.w2 = distribute_tensor(torch.from_numpy(w2), mesh, [Shard(1)]).requires_grad_()

    def step(self):
        self.w1.grad = self.w2.grad = None
        y = self.torch.relu(self.x @ self.w1.T) @ self.w2.T
        loss = (y * y).mean()
        loss.backward()
        return loss

    def result(self, mine: slice):
        """Loss and this rank's rows of dW1 and columns of dW2 (DTensor may leave a gradient
        in another layout than its parameter's, so the full gradients are sliced)."""
        loss = self.step()
        return (float(loss.detach().full_tensor()), self.w1.grad.full_tensor()[mine].numpy(),
                self.w2.grad.full_tensor()[:, mine].numpy())

    def grad_layouts(self) -> str:
        """The gradients' placements in ctensor's notation."""
        def short(p) -> str:
            return f"S({p.dim})" if p.is_shard() else "B" if p.is_replicate() else "P"
        return ", ".join(short(g.placements[0]) for g in (self.w1.grad, self.w2.grad))

    def collectives(self) -> dict:
        from torch.distributed.tensor.debug import CommDebugMode
        mode = CommDebugMode()
        with mode:
            self.step()
        return {str(k).split(".")[-1]: v for k, v in mode.get_comm_counts().items()}


def torch_available() -> bool:
    try:
        import torch.distributed.tensor  # noqa: F401
    except ImportError:
        return False
    return True


# ----------------------------------------------------------------------------- checks
def check(name: str, got, want, mine: slice, rtol: float, comm) -> float:
    """Largest relative difference of (loss, dW1 rows, dW2 columns) from the reference on
    every rank; raise if it exceeds ``rtol`` anywhere."""
    loss, dw1, dw2 = got
    ref_loss, ref_dw1, ref_dw2 = want
    worst = max(abs(float(loss) - ref_loss) / abs(ref_loss),
                float(np.abs(dw1 - ref_dw1[mine]).max() / np.abs(ref_dw1).max()),
                float(np.abs(dw2 - ref_dw2[:, mine]).max() / np.abs(ref_dw2).max()))
    worst = comm.allreduce(worst, op=MPI.MAX)
    if not worst <= rtol:
        raise SystemExit(f"tp_mlp: {name} differs from the float64 NumPy step: max relative "
                         f"difference {worst:.2e} > {rtol:.0e}; its timing would be meaningless")
    return worst




def main(argv: Optional[list] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=positive_int, help="T (default 2048)")
    parser.add_argument("--hidden", type=positive_int, help="H (default 256)")
    parser.add_argument("--repeats", type=positive_int, help="timed steps each (default 30)")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    add_quick(parser)
    args = settle(parser.parse_args(argv), dict(tokens=2048, hidden=256, repeats=30),
                  dict(tokens=64, hidden=16, repeats=2))
    comm = MPI.COMM_WORLD
    if ct.world_size() != comm.size:
        raise SystemExit("tp_mlp: ctensor's world is not MPI's; run it under mpiexec")
    t, h, n = args.tokens, args.hidden, comm.size
    dtype = np.dtype(args.dtype)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((t, h)).astype(dtype)
    w1 = (rng.standard_normal((4 * h, h)) / np.sqrt(h)).astype(dtype)
    w2 = (rng.standard_normal((h, 4 * h)) / np.sqrt(4 * h)).astype(dtype)
    mine = part(4 * h, n, comm.rank)
    want = reference(x, w1, w2)
    rtol = 1e-4 if dtype == np.float32 else 1e-10

    floor = Floor(x, np.ascontiguousarray(w1[mine]), np.ascontiguousarray(w2[:, mine]), comm)
    ours = Ctensor(x, w1, w2)
    steps: dict = {"floor": floor.step, "ctensor": ours.step}
    diffs = {"floor": check("the floor", floor.step(), want, mine, rtol, comm),
             "ctensor": check("ctensor", ours.result(), want, mine, rtol, comm)}
    with ct.debug.comm_log() as log:
        ours.step()
    counts = {"floor": {"all_reduce": 1}, "ctensor": _count(log.collectives())}
    layouts = {"floor": "S(0), S(1)", "ctensor": ours.grad_layouts()}
    if torch_available():
        peer = DTensor(x, w1, w2, comm)
        diffs["DTensor"] = check("DTensor", peer.result(mine), want, mine, rtol, comm)
        counts["DTensor"] = peer.collectives()
        layouts["DTensor"] = peer.grad_layouts()
        steps["DTensor"] = peer.step
    times = harness.interleaved(steps, args.repeats, comm)
    if comm.rank == 0:
        report(args, n, times, diffs, counts, layouts, log, t * h * dtype.itemsize)


def _count(names: list) -> dict:
    counts: dict = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return counts


def report(args, n: int, times: dict, diffs: dict, counts: dict, layouts: dict, log,
           optimum: int) -> None:
    labels = {"floor": "NumPy + mpi4py (floor)", "ctensor": "ctensor",
              "DTensor": "PyTorch DTensor (gloo)"}
    base = times["floor"]
    print(f"Megatron TP MLP step, T={args.tokens} H={args.hidden} {args.dtype}, forward + "
          f"backward on {n} rank(s) (median of {args.repeats}, slowest rank, one BLAS thread "
          f"per rank)")
    print(f"{'implementation':<24}{'ms':>9}{'vs floor':>10}  {'dW1, dW2':<12}"
          f"collectives in one step")
    for name, seconds in times.items():
        shown = ", ".join(f"{k} x{v}" for k, v in counts[name].items()) or "none"
        print(f"{labels[name]:<24}{seconds * 1e3:>9.2f}{seconds / base:>9.2f}x  "
              f"{layouts[name]:<12}{shown}")
    if "DTensor" not in times:
        print(f"{labels['DTensor']:<24}{'-':>9}{'-':>10}  (torch not importable: skipped)")
    ratio = times["ctensor"] / base
    print(f"ctensor / floor = {ratio:.2f}x (target <= {TARGET}x"
          f"{'' if ratio <= TARGET else ': not met'})"
          + (f"; ctensor / DTensor = {times['ctensor'] / times['DTensor']:.2f}x"
             if "DTensor" in times else ""))
    print(f"communication of one forward + backward: hand-placed optimum 1 all_reduce of "
          f"{optimum:,} B; ctensor {len(log.collectives())} collective(s), "
          f"{log.total_bytes:,} B:")
    for event in log:
        print(f"  {event}")
    print("checked: loss and weight gradients equal the float64 NumPy step (max relative "
          "difference " + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()) + ")")


if __name__ == "__main__":
    main()
