"""Context-parallel attention step: ctensor's ring (and Ulysses) vs one rank vs the ring by hand.

    mpiexec -n 2 python benchmarks/context_parallel.py [--seq 4096] [--quick]

The step is causal attention ``softmax(q k^T / sqrt(D)) v`` of q, k, v (B, H, T, D) and its
backward for an output gradient ``g``. It runs, interleaved in one job so a busy machine
slows all alike:

* **ctensor, CP n**: ``ct.attention`` on q, k, v split ``S(2)`` (the sequence) over the n
  ranks: the ring (``ctensor/ops/attention_ring.py``), backward the ring reversed;
* **ctensor, one rank**: the same op on a placement of rank 0 alone (the others idle);
* **ctensor, CP n, zig-zag order**: the sequence stored in ``ct.zigzag_index`` order and
  ``zigzag=n``, so every rank does the same causal work (the natural order leaves rank 0
  one block and rank n-1 n blocks);
* **ctensor, CP n, Ulysses**: the same split served by Ulysses instead
  (``ctensor/ops/attention_ulysses.py``, ``cp_scheme="ulysses"``; the ring rows pass
  ``cp_scheme="ring"``): two all-to-alls each way, each rank its heads' whole sequence;
* **the ring by hand**: the same algorithm in NumPy + mpi4py — each rank's query block,
  the key/value blocks passed to the next rank with ``Isend``/``Irecv`` (waited for
  without spinning, as ctensor's communicator waits) while the current
  one is folded into an online softmax (keys in chunks of 512, fully masked blocks
  skipped); the backward passes the blocks back round with their dk/dv accumulators, one
  message per hop, ``n - 1`` hops (as ctensor's: the forward's last block kept, a piece of
  the own block's backward computed while each hop travels, the accumulators home on
  the last).

All are checked against a float64 NumPy computation of the whole attention first.
It prints the median step time of the slowest rank, CP n's speed-up over one rank, the
ratio ctensor / hand-written (target <= 1.2x), and the peak bytes per rank a step holds
above its inputs (``ct.debug.track_memory``) of CP n against one rank, and the backward
alone (ctensor's ring and the hand-written one) with its transfer counts. One BLAS thread
per rank.
"""
from __future__ import annotations

import argparse
import os
import time
from typing import Optional

import harness

harness.one_blas_thread()  # before NumPy starts its BLAS threads

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import ctensor as ct  # noqa: E402
from ctensor.ops.attention import zigzag_index  # noqa: E402  (ct.zigzag_index)
from harness import add_quick, positive_int, settle  # noqa: E402

TARGET = 1.2  # ctensor's CP step / the hand-written ring's
CHUNK = 512


def part(n: int, parts: int, i: int) -> slice:
    """Part ``i`` of ``n`` over ``parts`` ranks by ctensor's uneven-split rule."""
    size = n // parts
    start = i * size + min(i, n % parts)
    return slice(start, start + size + (1 if i < n % parts else 0))


def wait(requests) -> None:
    """Wait for MPI ``requests`` as ctensor's communicator waits: test continuously (MPI
    progresses a large transfer only inside its calls) but yield the core between tests for
    up to a second, then sleep up to 1 ms: on a machine with fewer cores than ranks a
    spinning ``Waitall`` takes the core its peer computes on."""
    start = time.perf_counter()
    while not MPI.Request.Testall(requests):
        if time.perf_counter() - start < 1.0:
            os.sched_yield()
        else:
            time.sleep(1e-3)


def barrier(comm) -> None:
    wait([comm.Ibarrier()])


# ----------------------------------------------------------------------------- by hand
class ByHand:
    """The ring in NumPy + mpi4py: rank r holds rows ``part(T, n, r)`` of q, k, v, g."""

    def __init__(self, q, k, v, g, comm, total: int):
        self.q, self.k, self.v, self.g, self.comm = q, k, v, g, comm
        self.scale = float(1.0 / np.sqrt(q.shape[-1]))  # (a Python float: a NumPy float64
        # scalar would promote float32 arrays)
        self.rows = [part(total, comm.size, i) for i in range(comm.size)]
        self.backward_times: list = []  # seconds of each step's backward

    def _chunks(self, r: int, owner: int, first: int = 0, stop: Optional[int] = None):
        """(query block, key chunk, mask or None) of block ``owner`` seen by rank ``r``'s
        rows ``first:stop`` (default all), in blocks of 512 (causal, natural order: pairs
        above the diagonal skipped)."""
        q0, nq = self.rows[r].start, self.rows[r].stop - self.rows[r].start
        k0, nk = self.rows[owner].start, self.rows[owner].stop - self.rows[owner].start
        for qa in range(first, nq if stop is None else stop, CHUNK):
            qb = min(nq if stop is None else stop, qa + CHUNK)
            for a in range(0, nk, CHUNK):
                b = min(nk, a + CHUNK)
                if k0 + a > q0 + qb - 1:
                    continue
                mask = None
                if k0 + b - 1 > q0 + qa:
                    mask = (k0 + np.arange(a, b))[None, :] > (q0 + np.arange(qa, qb))[:, None]
                yield slice(qa, qb), slice(a, b), mask

    def forward(self):
        comm, n, r = self.comm, self.comm.size, self.comm.rank
        q, scale = self.q, self.scale
        e = self.k.shape[-1]
        kv = np.concatenate([self.k, self.v], axis=-1)
        m = np.full(q.shape[:-1], -np.inf, dtype=q.dtype)
        s_ = np.zeros(q.shape[:-1], dtype=q.dtype)
        acc = np.zeros(q.shape[:-1] + (self.v.shape[-1],), dtype=q.dtype)
        for s in range(n):
            owner = (r - s) % n
            reqs = []
            if s < n - 1:
                nxt = (owner - 1) % n
                recv = np.empty(kv.shape[:-2] + (self.rows[nxt].stop - self.rows[nxt].start,
                                                 kv.shape[-1]), kv.dtype)
                reqs = [comm.Isend(kv, dest=(r + 1) % n), comm.Irecv(recv, source=(r - 1) % n)]
            for qs, ks, mask in self._chunks(r, owner):
                sc = q[..., qs, :] @ kv[..., ks, :e].swapaxes(-1, -2) * scale
                if mask is not None:
                    sc = np.where(mask, -np.inf, sc)
                m_new = np.maximum(m[..., qs], sc.max(-1))
                safe = np.where(np.isneginf(m_new), 0.0, m_new)
                p = np.exp(sc - safe[..., None])
                alpha = np.exp(m[..., qs] - safe)
                s_[..., qs] = s_[..., qs] * alpha + p.sum(-1)
                acc[..., qs, :] = acc[..., qs, :] * alpha[..., None] + p @ kv[..., ks, e:]
                m[..., qs] = m_new
            if reqs:
                wait(reqs)
                kv = recv
        self.last = kv  # the block of rank r + 1, kept for the backward
        self.out = (acc / s_[..., None]).astype(q.dtype)
        self.lse = (m + np.log(s_)).astype(q.dtype)
        return self.out

    def _grad(self, r: int, owner: int, kv, dkv, dq, first: int = 0,
              stop: Optional[int] = None) -> None:
        """Add rank ``r``'s rows' contributions against ``owner``'s block ``kv`` to its
        accumulators ``dkv`` and to ``dq``."""
        q, g, scale, lse, delta = self.q, self.g, self.scale, self.lse, self.delta
        e = self.k.shape[-1]
        for qs, ks, mask in self._chunks(r, owner, first, stop):
            kk, vv, qq, gg = kv[..., ks, :e], kv[..., ks, e:], q[..., qs, :], g[..., qs, :]
            sc = qq @ kk.swapaxes(-1, -2) * scale
            if mask is not None:
                sc = np.where(mask, -np.inf, sc)
            p = np.exp(sc - lse[..., qs, None])
            dkv[..., ks, e:] += p.swapaxes(-1, -2) @ gg
            ds = p * (gg @ vv.swapaxes(-1, -2) - delta[..., qs, None])
            dq[..., qs, :] += ds @ kk * scale
            dkv[..., ks, :e] += ds.swapaxes(-1, -2) @ qq * scale

    def backward(self):
        """The ring reversed: at step s rank r holds rank r + 1 + s's block (step 0: the
        one the forward received last) with its accumulators, adds its part, passes both
        to rank r - 1 in one message (the last hop: the accumulators alone) and computes a
        piece of its own block's part while it travels: n - 1 transfers."""
        comm, n, r = self.comm, self.comm.size, self.comm.rank
        e = self.k.shape[-1]
        self.delta = (self.g * self.out).sum(-1)
        dq = np.zeros_like(self.q)
        own = np.concatenate([self.k, self.v], axis=-1)
        own_d = np.zeros_like(own)
        w = own.shape[-1]
        kv = self.last
        dkv = np.zeros_like(kv)
        rows = own.shape[-2]
        self.backward_transfers = 0
        for s in range(n - 1):
            owner = (r + 1 + s) % n
            self._grad(r, owner, kv, dkv, dq)
            last = s == n - 2
            packet = np.ascontiguousarray(dkv) if last else np.concatenate([kv, dkv], axis=-1)
            nxt = (owner + 1) % n
            recv = np.empty(kv.shape[:-2] + (self.rows[nxt].stop - self.rows[nxt].start,
                                             w if last else 2 * w), kv.dtype)
            reqs = [comm.Isend(packet, dest=(r - 1) % n), comm.Irecv(recv, source=(r + 1) % n)]
            self.backward_transfers += 1
            self._grad(r, r, own, own_d, dq, rows * s // (n - 1), rows * (s + 1) // (n - 1))
            wait(reqs)
            kv, dkv = (None, recv) if last else (recv[..., :w], recv[..., w:])
        if n == 1:
            self._grad(r, r, own, own_d, dq)
        else:
            own_d += dkv  # home: the accumulators have visited every other rank
        return dq, own_d[..., :e], own_d[..., e:]

    def step(self):
        self.forward()
        t0 = time.perf_counter()
        out = self.backward()
        self.backward_times.append(time.perf_counter() - t0)
        return out


# ----------------------------------------------------------------------------- ctensor
class Ctensor:
    """``ct.attention`` on q, k, v laid out ``sbp`` on ``placement`` (leaves: the layout
    stays, so the ring runs on a split one)."""

    def __init__(self, q, k, v, g, placement, sbp, zigzag: int = 0,
                 scheme: Optional[str] = None):
        self.zigzag, self.scheme = zigzag, scheme
        self.inputs = [ct.tensor(a, placement=placement, sbp=sbp, requires_grad=True)
                       for a in (q, k, v)]
        self.g = ct.tensor(g, placement=placement, sbp=sbp)
        self.backward_times: list = []  # seconds of each step's backward

    def step(self):
        for t in self.inputs:
            t.grad = None
        y = ct.attention(*self.inputs, causal=True, zigzag=self.zigzag,
                         cp_scheme=self.scheme)
        t0 = time.perf_counter()
        y.backward(self.g)
        self.backward_times.append(time.perf_counter() - t0)
        return y

    def peak_activations(self) -> int:
        """Peak bytes on this process's rank over one step above what it held before (the
        inputs): the output, the log-sum-exp, the gradients and everything in between."""
        for t in self.inputs:  # (the last step's gradients freed before the count starts)
            t.grad = None
        with ct.debug.track_memory():
            ct.debug.reset_peak_memory()
            me = ct.rank()
            base = ct.debug.memory(me).current_total
            self.step()
            return ct.debug.memory(me).peak_total - base


def reference(q, k, v, g):
    d = q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), g.astype(np.float64)
    q, k, v, g = d
    scale = 1.0 / np.sqrt(q.shape[-1])
    t = q.shape[-2]
    s = np.where(np.arange(t)[None, :] > np.arange(t)[:, None], -np.inf,
                 q @ k.swapaxes(-1, -2) * scale)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = g @ v.swapaxes(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    return p @ v, ds @ k * scale, ds.swapaxes(-1, -2) @ q * scale, p.swapaxes(-1, -2) @ g


def _close(name, got, want, rtol):
    err = float(np.max(np.abs(got - want)) / max(1e-30, np.max(np.abs(want))))
    if err > rtol:
        raise SystemExit(f"context_parallel: {name} differs from NumPy (relative {err:.1e})")
    return err




def main(argv: Optional[list] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=positive_int, help="T (default 4096)")
    parser.add_argument("--heads", type=positive_int, help="H (default 4)")
    parser.add_argument("--head-dim", type=positive_int, help="D (default 64)")
    parser.add_argument("--batch", type=positive_int, default=1, help="B (default 1)")
    parser.add_argument("--repeats", type=positive_int, help="timed steps each (default 3)")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    add_quick(parser)
    args = settle(parser.parse_args(argv), dict(seq=4096, heads=4, head_dim=64, repeats=3),
                  dict(seq=256, heads=2, head_dim=16, repeats=1))
    comm = MPI.COMM_WORLD
    if ct.world_size() != comm.size:
        raise SystemExit("context_parallel: ctensor's world is not MPI's; run it under mpiexec")
    n, r = comm.size, comm.rank
    dtype = np.dtype(args.dtype)
    shape = (args.batch, args.heads, args.seq, args.head_dim)
    rng = np.random.default_rng(0)
    q, k, v, g = [rng.standard_normal(shape).astype(dtype) for _ in range(4)]
    want = reference(q, k, v, g)
    rtol = 1e-4 if dtype == np.float32 else 1e-10
    mine = part(args.seq, n, r)

    world = ct.placement("cpu", list(range(n)))
    cp = Ctensor(q, k, v, g, world, ct.sbp.split(2), scheme="ring")
    uly = Ctensor(q, k, v, g, world, ct.sbp.split(2), scheme="ulysses")
    one = Ctensor(q, k, v, g, ct.placement("cpu", [0]), ct.sbp.broadcast)
    zz = None
    if args.seq % (2 * n) == 0:  # the sequence stored zig-zag: balanced causal work
        idx = zigzag_index(args.seq, n)
        zz = Ctensor(*(a[:, :, idx] for a in (q, k, v, g)), world, ct.sbp.split(2), zigzag=n,
                     scheme="ring")
    hand = ByHand(*(np.ascontiguousarray(a[:, :, mine]) for a in (q, k, v, g)), comm, args.seq)
    # (memory first, before any step: ct.debug.track_memory counts a step run afresh)
    mem_cp = comm.allreduce(cp.peak_activations(), op=MPI.MAX)
    mem_one = comm.bcast(one.peak_activations(), root=0)  # (rank 0 holds it)
    errors = {}
    y = cp.step()
    got = [y.numpy()] + [t.grad.numpy() for t in cp.inputs]
    errors["ctensor CP"] = max(_close("ctensor CP", a, b, rtol) for a, b in zip(got, want))
    if zz is not None:
        y = zz.step()
        got = [y.numpy()] + [t.grad.numpy() for t in zz.inputs]
        errors["ctensor CP zig-zag"] = max(_close("zig-zag", a, b[:, :, idx], rtol)
                                           for a, b in zip(got, want))
    y = uly.step()
    got = [y.numpy()] + [t.grad.numpy() for t in uly.inputs]
    errors["ctensor Ulysses"] = max(_close("Ulysses", a, b, rtol) for a, b in zip(got, want))
    y = one.step()
    if r == 0:
        got = [y.to_local()] + [t.grad.to_local() for t in one.inputs]
        errors["ctensor one rank"] = max(_close("one rank", a, b, rtol)
                                         for a, b in zip(got, want))
    out = hand.forward()
    dq, dk, dv = hand.backward()
    errors["by hand"] = comm.allreduce(max(
        _close("by hand", a, b[:, :, mine], rtol) for a, b in zip((out, dq, dk, dv), want)),
        op=MPI.MAX)
    with ct.debug.comm_log() as log:
        cp.step()
    with ct.debug.comm_log() as uly_log:
        uly.step()
    steps = {"cp": cp.step, "one": one.step, "hand": hand.step, "ulysses": uly.step}
    if zz is not None:
        steps["zigzag"] = zz.step
    for runner in (cp, hand):
        runner.backward_times.clear()
    times = harness.interleaved(steps, args.repeats, comm, barrier=barrier)
    for name, runner in (("cp backward", cp), ("hand backward", hand)):
        timed = runner.backward_times[-args.repeats:]  # (the warm-up round's left out)
        times[name] = comm.allreduce(float(np.median(timed)), op=MPI.MAX)
    if r == 0:
        report(args, n, times, errors, log, mem_cp, mem_one, hand.backward_transfers, uly_log)


def report(args, n, times, errors, log, mem_cp, mem_one, hand_transfers, uly_log) -> None:
    print(f"causal attention step (forward + backward), B={args.batch} H={args.heads} "
          f"T={args.seq} D={args.head_dim} {args.dtype}, {n} rank(s), median of "
          f"{args.repeats}, slowest rank, one BLAS thread per rank")
    rows = [("ctensor, CP %d (ring)" % n, times["cp"]), ("ctensor, one rank", times["one"]),
            ("ring by hand (NumPy + mpi4py)", times["hand"])]
    if "zigzag" in times:
        rows.append(("ctensor, CP %d, zig-zag order" % n, times["zigzag"]))
    rows.append(("ctensor, CP %d, Ulysses" % n, times["ulysses"]))
    for label, seconds in rows:
        print(f"  {label:<32}{seconds * 1e3:>10.1f} ms")
    ratio = times["cp"] / times["hand"]
    if "zigzag" in times:
        print(f"CP {n} zig-zag speed-up over one rank: {times['one'] / times['zigzag']:.2f}x "
              f"(every rank the same causal work)")
    print(f"CP {n} speed-up over one rank: {times['one'] / times['cp']:.2f}x; ctensor / by "
          f"hand = {ratio:.2f}x (target <= {TARGET}x{'' if ratio <= TARGET else ': not met'})")
    print(f"backward alone: ctensor {times['cp backward'] * 1e3:.1f} ms, by hand "
          f"{times['hand backward'] * 1e3:.1f} ms (ctensor / by hand = "
          f"{times['cp backward'] / times['hand backward']:.2f}x)")
    print(f"peak memory of the step per rank (above its inputs): CP {n} "
          f"{mem_cp / 2**20:.2f} MiB, one rank {mem_one / 2**20:.2f} MiB "
          f"({mem_cp / max(1, mem_one):.2f}x)")
    ops = [e.op for e in log]
    print(f"communication of one CP step: {len(log.collectives())} transfers "
          f"({ops.count('attention')} forward, {ops.count('attention.grad')} backward; the "
          f"ring by hand {hand_transfers} backward), {log.total_bytes:,} B per rank; "
          f"Ulysses {len(uly_log.collectives())} all-to-alls, {uly_log.total_bytes:,} B")
    print("checked against float64 NumPy (max relative difference "
          + ", ".join(f"{k} {v:.1e}" for k, v in errors.items()) + ")")


if __name__ == "__main__":
    main()
