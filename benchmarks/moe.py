"""Expert-parallel MoE layer step: ctensor's ``nn.MoE`` vs the same step by hand (NumPy +
mpi4py, two all-to-alls each way).

    mpiexec -n 2 python benchmarks/moe.py [--groups 16] [--seq 64] [--hidden 128] [--quick]

The step is a top-2 ``nn.MoE`` (``E`` experts, ReLU, capacity factor 1.25, groups = the
sequences of the batch) on ``x`` of shape ``(groups, seq, hidden)``, loss ``(y * y).mean()``
plus the load-balancing loss times 0.01, forward and backward. The tokens' batch and the
experts are split ``S(0)`` over the ranks (expert parallel), the router is replicated. It
runs, interleaved in one job so a busy machine slows both alike:

* **ctensor**: ``nn.MoE`` laid out by ``nn.parallel.expert_parallel_rules``, nothing else;
* **by hand**: the routing (softmax, top-k, the capacity cumsum) on the rank's own groups,
  the dispatch into a ``(groups, E, C, hidden)`` buffer, one ``Alltoall`` to the experts'
  ranks, the experts' matmuls, one ``Alltoall`` back, the combine; the backward mirrors it
  (two ``Alltoall``) with hand-derived gradients, and one ``Allreduce`` of the router's
  gradient (plus one of the scalar loss, for the report).

Before timing, the two are checked against each other: the loss, the gradients of the
router, of this rank's experts and of this rank's tokens (float64: 1e-10). It prints the
median step time of the slowest rank, the ratio (target for ctensor: <= 1.2x), and the
collectives of one ctensor step. One BLAS thread per rank.
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Optional

import harness

harness.one_blas_thread()  # before NumPy starts its BLAS threads

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import ctensor as ct  # noqa: E402
from ctensor import nn  # noqa: E402
from harness import add_quick, positive_int, settle  # noqa: E402

TARGET = 1.2  # ctensor's step time / the hand-written one's
TOP_K, CAPACITY_FACTOR, AUX_COEF = 2, 1.25, 0.01


class ByHand:
    """The step on this rank's groups ``x`` (Gl, S, d), the replicated router ``wr`` (E, d)
    and this rank's experts ``w1`` (El, d, f), ``w2`` (El, f, d)."""

    def __init__(self, x, wr, w1, w2, n_groups: int, comm):
        self.x, self.wr, self.w1, self.w2, self.comm = x, wr, w1, w2, comm
        self.n_groups = n_groups
        self.cap = math.ceil(CAPACITY_FACTOR * x.shape[1] * TOP_K / wr.shape[0])

    def _exchange(self, blocks):
        """``blocks`` (n, ...) block j to rank j; returns the (n, ...) blocks received."""
        send = np.ascontiguousarray(blocks)
        recv = np.empty_like(send)
        self.comm.Alltoall(send, recv)
        return recv

    def step(self):
        x, wr, w1, w2 = self.x, self.wr, self.w1, self.w2
        gl, s, d = x.shape
        e, k, c, n = wr.shape[0], TOP_K, self.cap, self.comm.size
        el = e // n
        # routing (local: each group is whole on its rank)
        logits = x @ wr.T
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        top = np.argsort(-p, axis=-1, kind="stable")[..., :k]          # (Gl, S, k)
        top_p = np.take_along_axis(p, top, -1)
        z = top_p.sum(-1, keepdims=True)
        gates = top_p / z
        choice = top.transpose(0, 2, 1).reshape(gl, k * s)              # first choices first
        routed = choice[..., None] == np.arange(e)                       # (Gl, kS, E)
        position = (np.cumsum(routed, axis=1) - 1)[routed].reshape(gl, k * s)
        keep = position < c
        slot = np.where(keep, choice * c + position, e * c)              # e*c: the trash slot
        rows = np.arange(gl)[:, None]
        token = np.tile(np.arange(s), k)
        buf = np.zeros((gl, e * c + 1, d))
        buf[rows, slot] = x[rows, token]
        # dispatch: (Gl, n, El, C, d) -> rank j gets its experts' slots of every group
        disp = buf[:, :e * c].reshape(gl, n, el, c, d).transpose(1, 0, 2, 3, 4)
        tokens = self._exchange(disp).reshape(n * gl, el, c, d)
        h = tokens @ w1                                                  # (G, El, C, f)
        a = np.maximum(h, 0)
        out = a @ w2
        back = self._exchange(out.reshape(n, gl, el, c, d))             # (n, Gl, El, C, d)
        y_slots = np.zeros((gl, e * c + 1, d))
        y_slots[:, :e * c] = back.transpose(1, 0, 2, 3, 4).reshape(gl, e * c, d)
        slot_k = slot.reshape(gl, k, s).transpose(0, 2, 1)              # (Gl, S, k)
        keep_k = keep.reshape(gl, k, s).transpose(0, 2, 1)
        weights = gates * keep_k
        picked = y_slots[rows[..., None], slot_k]                        # (Gl, S, k, d)
        y = (picked * weights[..., None]).sum(2)
        count = self.n_groups * s * d
        fraction = routed.sum(1) / (k * s)                               # (Gl, E)
        aux_local = float((e * (fraction * p.mean(1)).sum(-1)).sum()) / self.n_groups
        loss, aux = self.comm.allreduce(np.array([float((y * y).sum()) / count, aux_local]))
        # backward
        dy = y * (2.0 / count)
        d_weights = (picked * dy[:, :, None, :]).sum(-1) * keep_k
        d_slots = np.zeros((gl, e * c + 1, d))
        d_slots[rows[..., None], slot_k] = weights[..., None] * dy[:, :, None, :]
        d_disp = d_slots[:, :e * c].reshape(gl, n, el, c, d).transpose(1, 0, 2, 3, 4)
        d_out = self._exchange(d_disp).reshape(n * gl, el, c, d)
        g_all = n * gl
        dw2 = a.transpose(1, 3, 0, 2).reshape(el, -1, g_all * c) @ \
            d_out.transpose(1, 0, 2, 3).reshape(el, g_all * c, d)
        d_h = (d_out @ w2.transpose(0, 2, 1)) * (h > 0)
        dw1 = tokens.transpose(1, 3, 0, 2).reshape(el, d, g_all * c) @ \
            d_h.transpose(1, 0, 2, 3).reshape(el, g_all * c, -1)
        d_tokens = d_h @ w1.transpose(0, 2, 1)
        d_back = self._exchange(d_tokens.reshape(n, gl, el, c, d))
        d_buf = np.zeros((gl, e * c + 1, d))
        d_buf[:, :e * c] = d_back.transpose(1, 0, 2, 3, 4).reshape(gl, e * c, d)
        dx = np.zeros_like(x)
        for j in range(k):  # each token's j-th choice (a dropped one reads the zero slot)
            dx += d_buf[rows, slot[:, j * s:(j + 1) * s]]
        # the gates: renormalised top-k of the softmax, and the aux loss's mean probability
        d_top = (d_weights - (d_weights * gates).sum(-1, keepdims=True)) / z
        d_p = np.zeros_like(p)
        np.put_along_axis(d_p, top, d_top, -1)
        d_p += AUX_COEF * e * fraction[:, None, :] / (self.n_groups * s)
        d_logits = p * (d_p - (d_p * p).sum(-1, keepdims=True))
        dwr = d_logits.reshape(-1, e).T @ x.reshape(-1, d)
        self.comm.Allreduce(MPI.IN_PLACE, dwr)
        dx += d_logits @ wr
        return loss, aux, dwr, dw1, dw2, dx


class Ctensor:
    def __init__(self, x, wr, w1, w2):
        mesh = ct.placement.all()
        self.moe = nn.MoE(x.shape[-1], wr.shape[0], top_k=TOP_K,
                          capacity_factor=CAPACITY_FACTOR, hidden=w1.shape[-1],
                          activation="relu", aux_loss_coef=AUX_COEF, dtype=x.dtype)
        with ct.no_grad():
            for param, value in ((self.moe.router.weight, wr), (self.moe.w1, w1),
                                 (self.moe.w2, w2)):
                param.copy_(ct.tensor(value))
        self.moe.to_global(mesh, nn.parallel.expert_parallel_rules(self.moe))
        self.x = ct.tensor(x, placement=mesh, sbp=ct.sbp.split(0), requires_grad=True)

    def step(self):
        self.x.grad = None
        for p in self.moe.parameters():
            p.grad = None
        y = self.moe(self.x)
        loss = (y * y).mean()
        loss.backward()
        return loss

    def result(self):
        loss = self.step()
        m = self.moe
        return (loss.item(), float(m.aux_loss.item()), m.router.weight.grad.to_local(),
                m.w1.grad.to_local(), m.w2.grad.to_local(), self.x.grad.to_local())


def check(got, want, comm, rtol: float) -> float:
    """Largest relative difference of every result; ``SystemExit`` past ``rtol``."""
    diffs = []
    for a, b in zip(got, want):
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        scale = max(float(np.abs(b).max()), 1e-300)
        diffs.append(float(np.abs(a - b).max()) / scale)
    diffs = np.array(diffs)
    comm.Allreduce(MPI.IN_PLACE, diffs, op=MPI.MAX)
    worst = float(diffs.max())
    if not worst <= rtol:
        names = ("loss", "aux loss", "router grad", "w1 grad", "w2 grad", "x grad")
        shown = ", ".join(f"{n} {v:.1e}" for n, v in zip(names, diffs))
        raise SystemExit(f"moe: ctensor and the hand-written step differ ({shown}; max "
                         f"relative difference {worst:.2e} > {rtol:.0e}); the timing would "
                         f"be meaningless")
    return worst


def timed(steps: dict, repeats: int, comm) -> dict:
    """Median seconds per step (slowest rank), interleaved rounds."""
    times: dict = {name: [] for name in steps}
    for fn in steps.values():
        fn()
        fn()
    for _ in range(repeats):
        for name, fn in steps.items():
            comm.Barrier()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: comm.allreduce(statistics.median(t), op=MPI.MAX) for name, t in times.items()}


def main(argv: Optional[list] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=positive_int, help="sequences (default 16)")
    parser.add_argument("--seq", type=positive_int, help="tokens per sequence (default 64)")
    parser.add_argument("--hidden", type=positive_int, help="d (default 128; experts 4d)")
    parser.add_argument("--experts", type=positive_int, help="E (default 8)")
    parser.add_argument("--repeats", type=positive_int, help="timed steps each (default 20)")
    add_quick(parser)
    args = settle(parser.parse_args(argv),
                  dict(groups=16, seq=64, hidden=128, experts=8, repeats=20),
                  dict(groups=4, seq=8, hidden=16, experts=4, repeats=2))
    comm = MPI.COMM_WORLD
    n = comm.size
    if ct.world_size() != n:
        raise SystemExit("moe: ctensor's world is not MPI's; run it under mpiexec")
    if args.groups % n or args.experts % n:
        raise SystemExit(f"moe: --groups ({args.groups}) and --experts ({args.experts}) must "
                         f"be multiples of the {n} ranks (the hand-written step splits evenly)")
    g, s, d, e = args.groups, args.seq, args.hidden, args.experts
    f = 4 * d
    rng = np.random.default_rng(0)
    x = rng.standard_normal((g, s, d))
    wr = rng.standard_normal((e, d)) / np.sqrt(d)
    w1 = rng.standard_normal((e, d, f)) / np.sqrt(d)
    w2 = rng.standard_normal((e, f, d)) / np.sqrt(f)
    gl, el = g // n, e // n
    mine_g = slice(comm.rank * gl, (comm.rank + 1) * gl)
    mine_e = slice(comm.rank * el, (comm.rank + 1) * el)
    hand = ByHand(np.ascontiguousarray(x[mine_g]), wr, np.ascontiguousarray(w1[mine_e]),
                  np.ascontiguousarray(w2[mine_e]), g, comm)
    ours = Ctensor(x, wr, w1, w2)
    worst = check(ours.result(), hand.step(), comm, 1e-10)
    stats = ours.moe.stats
    with ct.debug.comm_log() as log:
        ours.step()
    times = timed({"by hand": hand.step, "ctensor": ours.step}, args.repeats, comm)
    if comm.rank == 0:
        ratio = times["ctensor"] / times["by hand"]
        print(f"MoE layer step, EP {n}: {g} sequences x {s} tokens, d={d}, {e} experts of "
              f"4d, top-{TOP_K}, capacity factor {CAPACITY_FACTOR} ({hand.cap} slots per "
              f"sequence and expert), float64, forward + backward (median of "
              f"{args.repeats}, slowest rank, one BLAS thread per rank)")
        print(f"{'implementation':<26}{'ms':>9}{'vs by hand':>12}")
        for name, seconds in times.items():
            print(f"{name:<26}{seconds * 1e3:>9.2f}{seconds / times['by hand']:>11.2f}x")
        print(f"ctensor / by hand = {ratio:.2f}x (target <= {TARGET}x"
              f"{'' if ratio <= TARGET else ': not met'})")
        print(f"drop rate {stats['drop_rate']:.3f}, tokens per expert "
              f"{stats['tokens_per_expert'].tolist()}")
        print("by hand: 4 all_to_all, 2 all_reduce (router gradient, loss); ctensor:")
        print(log.summary())
        print(f"checked: loss, aux loss and the gradients of router, experts and tokens agree "
              f"(max relative difference {worst:.1e})")


if __name__ == "__main__":
    main()
