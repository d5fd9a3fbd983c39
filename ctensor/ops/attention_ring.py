"""Ring attention: the composite of ``attention`` for q, k, v split on the sequence along
one mesh axis (context parallelism). Every rank keeps its query block; the key/value
blocks go round the ring of the axis's ranks.

* forward — step ``s`` of ``n``: rank ``i`` holds the key/value block of rank ``i - s``; it
  starts sending that block to rank ``i + 1`` (``exchange_start``), folds it into its online
  softmax state (:func:`ctensor.ops._flash.accumulate`, masked by true positions, fully
  masked pieces skipped), then waits for the block of rank ``i - s - 1``: ``n - 1``
  transfers, each overlapping a block's compute. It keeps q, k, v, its output, the
  log-sum-exp and the last block it received, rank ``i + 1``'s (O(T/n) per rank; never
  the scores).
* backward — the ring reversed (rank ``i`` sends to ``i - 1``): at step ``s`` rank ``i``
  holds rank ``i + 1 + s``'s block with its dk/dv accumulators (step 0: the kept block,
  zero accumulators), adds its contributions to them (and to its own ``dq``), then passes
  block and accumulators on in one message (the last hop the accumulators alone: their
  receiver holds its own block) and, while it travels, computes a ``1 / (n - 1)`` piece of
  its own block's contributions. After ``n - 1`` hops each rank holds its own block's
  accumulators, which have visited every other rank, and adds its own part: ``n - 1``
  transfers.

Uneven splits work as every layout does: each block has its rank's region, and the
positions the causal mask reads come from it. In a shape-only world no kernel runs and
every transfer is recorded as the real one would be (``ct.plan`` prices the ring).
"""
from __future__ import annotations

import numpy as np

from .. import autograd, debug, runtime
from .. import worktrace as _trace
from ..arrays import array_module, to_device, to_host
from ..comm import context
from ..comm.base import Message
from ..executor import new_tensor
from ..layout import Layout
from ..registry import OPS
from ..sbp import Broadcast, Partial, ReduceOp, Split
from ..tensor import Tensor
from ._flash import accumulate, dropper, finish, grad_block, new_state, positions
from ._rules import widen

__all__ = []  # (used by ops/attention.py)


class _Shift:
    """One hop of the ring, as a boxing step for the log and traces: every rank of the
    axis sends its block (laid out as ``layout``'s shard of the rank ``back`` hops behind it
    on the ring; ``back < 0``: ahead) to its neighbour, ``+1`` (forward) or ``-1``."""

    collective = "send_recv"
    local = False

    def __init__(self, layout: Layout, axis: int, back: int, direction: int):
        self.before = self.after = layout
        self.mesh_axis = axis
        p = layout.placement
        self.messages = []
        for r in p.rank_list:
            group = p.axis_group(r, axis)
            i, n = group.index(r), len(group)
            owner = group[(i - back) % n]
            shape = layout.local_shape(owner)
            self.messages.append((Message(r, group[(i + direction) % n], 0, shape,
                                          layout.dtype), None))

    def run(self, comm, blocks: dict):
        """Start the hop: returns the started exchange (``wait()``: ``{rank: block}``)."""
        sends = {}
        for m, _ in self.messages:
            if m.src in blocks:
                a = blocks[m.src]
                if m.dst not in comm.held_ranks and not getattr(comm, "device_arrays", False):
                    a = to_host(a)
                sends[m] = a
        with debug.boxing_step(self):
            pending = comm.exchange_start([m for m, _ in self.messages], sends)
        fed = sum(int(np.prod(m.shape, dtype=np.int64)) * self.before.dtype.itemsize
                  for m, _ in self.messages if m.src != m.dst
                  and (m.src in blocks or m.dst in comm.held_ranks))
        debug.record(self, fed)
        device = self.before.placement.device

        def wait() -> dict:
            got = pending.wait()
            return {m.dst: to_device(got[m], device) for m, _ in self.messages if m in got}
        return wait

    def record(self) -> None:
        """Shape-only: the hop, recorded, nothing moved."""
        with debug.boxing_step(self):
            debug.record(self, sum(int(np.prod(m.shape, dtype=np.int64))
                                   * self.before.dtype.itemsize
                                   for m, _ in self.messages if m.src != m.dst))


def _block_layout(k: Layout, last: int) -> Layout:
    """``k``'s layout with its last dim ``last`` long (k, v and gradients side by side), in
    the dtype the kernel computes in (float32 for float16)."""
    dtype = np.dtype(np.float32) if k.dtype == np.float16 else k.dtype
    return Layout(k.shape[:-1] + (last,), dtype, k.placement, k.sbp)


def _cast(arrays: dict, dtype) -> dict:
    return {r: a if a.dtype == dtype else a.astype(dtype) for r, a in arrays.items()}


def _whole_keys(layout: Layout, axis: int) -> Layout:
    sbp = list(layout.sbp)
    sbp[axis] = Broadcast()
    return layout.with_sbp(sbp)


def _positions(layout: Layout, rank: int, zigzag: int) -> np.ndarray:
    a, b = layout.region(rank)[-2]
    return positions(layout.shape[-2], zigzag)[a:b]


def _dropper(xp, key, dropout, ql: Layout, kl: Layout, rank: int, owner: int, dtype,
             row: int = 0):
    """Rank ``rank``'s dropout factors against ``owner``'s key block (None without), for
    its query rows from ``row`` on."""
    if not dropout:
        return None
    qr, kr = ql.region(rank), kl.region(owner)
    k = key._shards[rank]
    return dropper(xp, (int(k[0]), int(k[1])), dropout, ql.shape[:-1] + (kl.shape[-2],),
                   qr[:-2], qr[-2][0] + row, kr[-2][0], dtype)


def attention(opdef, q: Tensor, k: Tensor, v: Tensor, axis: int, causal: bool, scale: float,
              zigzag: int, dropout: float = 0.0, key=None):
    """``(output, lse)`` of the ring along mesh ``axis`` (q, k, v already laid out for it)."""
    ql, kl, vl = q._layout, k._layout, v._layout
    e, ev = k.shape[-1], v.shape[-1]
    out_l = Layout(q.shape[:-1] + (ev,), q.dtype, ql.placement, ql.sbp)
    lse_l = Layout(q.shape[:-1], q.dtype, ql.placement, ql.sbp)
    n = ql.placement.shape[axis]
    block_l = _block_layout(kl, e + ev)
    attrs = dict(causal=causal, scale=scale, zigzag=zigzag, dropout=dropout)
    if _trace.active:  # the work: every query block against every key block
        _trace.op(opdef, (ql, _whole_keys(kl, axis), _whole_keys(vl, axis)), (out_l, lse_l),
                  attrs, ("ring", ql, kl, vl, axis))
    held = {}

    def compute() -> tuple:
        comm = runtime.world().comm_for(ql.placement.device)
        xp = array_module(ql.placement.device)
        qs = {r: widen(xp, a) for r, a in q._shards.items()}
        blocks = {r: xp.concatenate(widen(xp, k._shards[r], v._shards[r]), axis=-1)
                  for r in k._shards}
        states = {r: new_state(xp, qs[r], blocks[r][..., e:], qs[r].dtype)
                  for r in qs}
        for s in range(n):
            wait = _Shift(block_l, axis, s, 1).run(comm, blocks) if s < n - 1 else None
            for r, state in states.items():
                group = ql.placement.axis_group(r, axis)
                owner = group[(group.index(r) - s) % n]
                b = blocks[r]
                accumulate(xp, state, qs[r], b[..., :e], b[..., e:],
                           _positions(ql, r, zigzag), _positions(kl, owner, zigzag),
                           causal, scale, _dropper(xp, key, dropout, ql, kl, r, owner, q.dtype))
            if wait is not None:
                blocks = wait()
        done = {r: finish(xp, st) for r, st in states.items()}
        held["out"] = _cast({r: o for r, (o, _) in done.items()}, q.dtype)
        held["lse"] = _cast({r: lse for r, (_, lse) in done.items()}, q.dtype)
        held["last"] = _cast(blocks, k.dtype)  # rank i's: the block of rank i + 1 (a
        # float16 block widened is float16 again without loss)
        return held["out"]

    context.op_stack.append(opdef.name)
    try:
        out = new_tensor(out_l, compute)
        if not held:  # shape-only: the hops, recorded
            for s in range(n - 1):
                _Shift(block_l, axis, s, 1).record()
        lse = new_tensor(lse_l, lambda: held["lse"])
        # the last block received, kept for the backward (in k's dtype, block_l's size;
        # each rank's shard is its next rank's block); none without a ring
        last_l = Layout(block_l.shape, kl.dtype, kl.placement, kl.sbp)
        last = new_tensor(last_l, lambda: held["last"]) if n > 1 else None
    finally:
        context.op_stack.pop()
    saved = tuple(t.detach() for t in (q, k, v, out, lse)) + (last,)
    autograd.record(opdef.name, [q, k, v], [out, lse],
                    lambda grads: _backward(opdef, grads[0], *saved, axis, attrs, key))
    return out, lse


def _rows(m: int, parts: int) -> list:
    """``m`` query rows in ``parts`` contiguous pieces (the own block's backward, one piece
    computed while each hop is in flight)."""
    return [(m * j // parts, m * (j + 1) // parts) for j in range(parts)]


def _home(xp, own_grads: dict, grads: dict, e: int, k_dtype, v_dtype) -> tuple:
    """``(dk, dv)`` shards once the accumulators are home: rank i holds its own block's,
    which have visited every other rank, and adds its own contributions (dk and dv arrays
    of their own, contiguous, so autograd keeps them as they are)."""
    total = {r: d + grads[r] if grads else d for r, d in own_grads.items()}
    return (_cast({r: xp.ascontiguousarray(d[..., :e]) for r, d in total.items()}, k_dtype),
            _cast({r: xp.ascontiguousarray(d[..., e:]) for r, d in total.items()}, v_dtype))


def _query_partial(ql, kl, axis: int) -> tuple:
    """The SBP of k's and v's gradients: ``kl``'s, with partial sums on an axis (other than
    the ring's) splitting q's sequence where k and v are whole (each rank there holds its
    queries' part of them)."""
    return tuple(Partial(ReduceOp.SUM) if isinstance(eq, Split) and eq.dim == ql.ndim - 2
                 and a != axis else ek for a, (eq, ek) in enumerate(zip(ql.sbp, kl.sbp)))


def _backward(opdef, g, q, k, v, out, lse, last, axis, attrs, key=None):
    if g is None:
        return None, None, None
    ql, kl, vl = q._layout, k._layout, v._layout
    if g._layout.sbp != out._layout.sbp:
        g = OPS.to_global(g, None, out._layout.sbp)
    causal, scale, zigzag, dropout = (attrs[a] for a in ("causal", "scale", "zigzag",
                                                        "dropout"))
    e, ev = kl.shape[-1], vl.shape[-1]
    n = ql.placement.shape[axis]
    w = e + ev
    # hop s carries the block and its dk/dv accumulators in one message; the last only
    # the accumulators (its receiver holds its own block)
    packet_l = [_block_layout(kl, w if s == n - 2 else 2 * w) for s in range(n - 1)]
    grad_name = opdef.grads["grad"]
    if _trace.active:
        gl = g._layout
        _trace.op(grad_name, (gl, ql, _whole_keys(kl, axis), _whole_keys(vl, axis),
                              out._layout, lse._layout), (ql, kl, vl), attrs,
                  ("ring.grad", ql, kl, vl, axis))
    result = {}

    def compute() -> dict:
        comm = runtime.world().comm_for(ql.placement.device)
        xp = array_module(ql.placement.device)
        gs, qs, os_, ls = ({r: widen(xp, a) for r, a in t._shards.items()}
                           for t in (g, q, out, lse))
        delta = {r: (gs[r] * os_[r]).sum(axis=-1) for r in qs}
        dq = {r: xp.zeros_like(a) for r, a in qs.items()}
        own = {r: xp.concatenate(widen(xp, k._shards[r], v._shards[r]), axis=-1)
               for r in k._shards}
        own_grads = {r: xp.zeros(b.shape, dtype=qs[r].dtype) for r, b in own.items()}
        blocks = {r: widen(xp, a) for r, a in last._shards.items()} if last is not None \
            else {}
        grads = {r: xp.zeros(b.shape, dtype=qs[r].dtype) for r, b in blocks.items()}
        pieces = {r: _rows(a.shape[-2], max(1, n - 1)) for r, a in qs.items()}

        def contribute(r, owner, b, d, rows=None):
            a, z = rows if rows is not None else (0, qs[r].shape[-2])
            grad_block(xp, qs[r][..., a:z, :], b[..., :e], b[..., e:], gs[r][..., a:z, :],
                       ls[r][..., a:z], delta[r][..., a:z],
                       _positions(ql, r, zigzag)[a:z], _positions(kl, owner, zigzag),
                       causal, scale, dq[r][..., a:z, :], d[..., :e], d[..., e:],
                       _dropper(xp, key, dropout, ql, kl, r, owner, ql.dtype, a))

        for s in range(n - 1):  # rank i holds rank i + 1 + s's block and accumulators
            packets = {}
            for r in qs:
                group = ql.placement.axis_group(r, axis)
                contribute(r, group[(group.index(r) + 1 + s) % n], blocks[r], grads[r])
                packets[r] = grads[r] if s == n - 2 else xp.concatenate(
                    (blocks[r], grads[r]), axis=-1)
            wait = _Shift(packet_l[s], axis, -1 - s, -1).run(comm, packets)
            for r in qs:  # while it travels: a piece of the own block's contributions
                contribute(r, r, own[r], own_grads[r], pieces[r][s])
            got = wait()
            blocks = {r: p[..., :w] for r, p in got.items()} if s < n - 2 else {}
            grads = {r: p[..., w:] for r, p in got.items()} if s < n - 2 else got
        if n == 1:
            for r in qs:
                contribute(r, r, own[r], own_grads[r])
        result["dk"], result["dv"] = _home(xp, own_grads, grads, e, kl.dtype, vl.dtype)
        return _cast(dq, ql.dtype)

    context.op_stack.append(grad_name.name)
    try:
        dq = new_tensor(ql, compute)
        if not result:
            for s in range(n - 1):
                _Shift(packet_l[s], axis, -1 - s, -1).record()
        part = _query_partial(ql, kl, axis)
        dk = new_tensor(kl.with_sbp(part), lambda: result["dk"])
        dv = new_tensor(vl.with_sbp(part), lambda: result["dv"])
    finally:
        context.op_stack.pop()
    return dq, dk, dv
