"""Expert-parallel MoE layer and MoE GPT steps: ctensor vs the same steps by hand (NumPy +
mpi4py, two all-to-alls each way per MoE layer).

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

Then the same for a GPT step (``nn.GPT(..., moe_experts=E)``, ``--layers`` blocks, every
MLP an MoE, no dropout): by hand it is ``benchmarks/gpt_reference.py``'s blocks with the MLP
replaced by the hand-written MoE above (GELU tanh), and one ``Allreduce`` of every replicated
parameter's gradient in one flat buffer (data parallel over the same ranks); ctensor lays
the model out with ``nn.parallel.expert_parallel_rules`` alone (the rest broadcast) and
splits the batch ``S(0)``.

Before timing, each pair is checked against each other: the loss and the gradients (the
layer's: router, this rank's experts and tokens; the GPT's: every parameter's), float64,
1e-10. It prints the median step time of the slowest rank, the ratio (target for ctensor:
<= 1.2x), and the collectives of one ctensor step. One BLAS thread per rank.
"""
from __future__ import annotations

import argparse
import math
from typing import Optional

import harness

harness.one_blas_thread()  # before NumPy starts its BLAS threads

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import ctensor as ct  # noqa: E402
from ctensor import nn  # noqa: E402
from gpt_reference import (_gelu, _gelu_back, _linear, _ln, _ln_back,  # noqa: E402
                           attention_back)
from harness import add_quick, positive_int, settle  # noqa: E402

TARGET = 1.2  # ctensor's step time / the hand-written one's
TOP_K, CAPACITY_FACTOR, AUX_COEF = 2, 1.25, 0.01


class ByHand:
    """The MoE layer by hand on this rank's groups ``x`` (Gl, S, d), the replicated router
    ``wr`` (E, d) and this rank's experts ``w1`` (El, d, f), ``w2`` (El, f, d)."""

    def __init__(self, wr, w1, w2, n_groups: int, comm, act: str = "relu"):
        self.wr, self.w1, self.w2, self.comm, self.act = wr, w1, w2, comm, act
        self.n_groups = n_groups

    def _exchange(self, blocks):
        """``blocks`` (n, ...) block j to rank j; returns the (n, ...) blocks received."""
        send = np.ascontiguousarray(blocks)
        recv = np.empty_like(send)
        self.comm.Alltoall(send, recv)
        return recv

    def forward(self, x):
        """``(y, this rank's share of the aux loss, cache)``."""
        wr, w1, w2 = self.wr, self.w1, self.w2
        gl, s, d = x.shape
        e, k, n = wr.shape[0], TOP_K, self.comm.size
        c, el = math.ceil(CAPACITY_FACTOR * s * k / e), e // n
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
        buf = np.zeros((gl, e * c + 1, d))
        buf[rows, slot] = x[rows, np.tile(np.arange(s), k)]
        # dispatch: (Gl, n, El, C, d) -> rank j gets its experts' slots of every group
        disp = buf[:, :e * c].reshape(gl, n, el, c, d).transpose(1, 0, 2, 3, 4)
        tokens = self._exchange(disp).reshape(n * gl, el, c, d)
        h = tokens @ w1                                                  # (G, El, C, f)
        a, t = (np.maximum(h, 0), None) if self.act == "relu" else _gelu(np, h)
        out = a @ w2
        back = self._exchange(out.reshape(n, gl, el, c, d))             # (n, Gl, El, C, d)
        y_slots = np.zeros((gl, e * c + 1, d))
        y_slots[:, :e * c] = back.transpose(1, 0, 2, 3, 4).reshape(gl, e * c, d)
        slot_k = slot.reshape(gl, k, s).transpose(0, 2, 1)              # (Gl, S, k)
        keep_k = keep.reshape(gl, k, s).transpose(0, 2, 1)
        weights = gates * keep_k
        picked = y_slots[rows[..., None], slot_k]                        # (Gl, S, k, d)
        y = (picked * weights[..., None]).sum(2)
        fraction = routed.sum(1) / (k * s)                               # (Gl, E)
        aux = float((e * (fraction * p.mean(1)).sum(-1)).sum()) / self.n_groups
        cache = (x, p, top, z, gates, slot, slot_k, keep_k, weights, picked, fraction,
                 tokens, h, a, t, c)
        return y, aux, cache

    def backward(self, cache, dy):
        """``(dx, d router, d w1, d w2)``; the router's is this rank's part (unreduced)."""
        x, p, top, z, gates, slot, slot_k, keep_k, weights, picked, fraction, tokens, h, \
            a, t, c = cache
        wr, w1, w2 = self.wr, self.w1, self.w2
        gl, s, d = x.shape
        e, k, n = wr.shape[0], TOP_K, self.comm.size
        el, rows = e // n, np.arange(gl)[:, None]
        d_weights = (picked * dy[:, :, None, :]).sum(-1) * keep_k
        d_slots = np.zeros((gl, e * c + 1, d))
        d_slots[rows[..., None], slot_k] = weights[..., None] * dy[:, :, None, :]
        d_disp = d_slots[:, :e * c].reshape(gl, n, el, c, d).transpose(1, 0, 2, 3, 4)
        d_out = self._exchange(d_disp).reshape(n * gl, el, c, d)
        g_all = n * gl
        dw2 = a.transpose(1, 3, 0, 2).reshape(el, -1, g_all * c) @ \
            d_out.transpose(1, 0, 2, 3).reshape(el, g_all * c, d)
        d_a = d_out @ w2.transpose(0, 2, 1)
        d_h = d_a * (h > 0) if self.act == "relu" else _gelu_back(np, h, t, d_a)
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
        dx += d_logits @ wr
        return dx, dwr, dw1, dw2


class LayerByHand:
    """The layer step: ``loss = mean(y * y)`` (+ the aux loss times AUX_COEF)."""

    def __init__(self, x, wr, w1, w2, n_groups: int, comm):
        self.x, self.moe, self.comm = x, ByHand(wr, w1, w2, n_groups, comm), comm
        self.cap = math.ceil(CAPACITY_FACTOR * x.shape[1] * TOP_K / wr.shape[0])

    def step(self):
        y, aux_local, cache = self.moe.forward(self.x)
        count = self.moe.n_groups * y.shape[1] * y.shape[2]
        loss, aux = self.comm.allreduce(np.array([float((y * y).sum()) / count, aux_local]))
        dx, dwr, dw1, dw2 = self.moe.backward(cache, y * (2.0 / count))
        self.comm.Allreduce(MPI.IN_PLACE, dwr)
        return loss, aux, dwr, dw1, dw2, dx


class GPTByHand:
    """The MoE GPT step (``nn.GPT(..., moe_experts=E)``, no dropout) by hand on this rank's
    sequences: ``gpt_reference``'s blocks with the MLP replaced by :class:`ByHand` (GELU
    tanh), the aux losses times AUX_COEF in the loss, then one ``Allreduce`` of every
    replicated parameter's gradient in one flat buffer (data parallel; the experts' own are
    complete after the all-to-alls)."""

    def __init__(self, params: dict, experts: dict, idx, targets, n_layer, n_head,
                 n_groups: int, comm):
        self.params, self.idx, self.targets = params, idx, targets
        self.n_layer, self.n_head, self.comm, self.n_groups = n_layer, n_head, comm, n_groups
        self.moes = [ByHand(params[f"blocks.{i}.mlp.router.weight"], *experts[i], n_groups,
                            comm, act="gelu_tanh") for i in range(n_layer)]
        self.shared = [k for k in params if k.split(".")[-1] not in ("w1", "w2")]

    def step(self):
        p_, idx, targets, xp = self.params, self.idx, self.targets, np
        wte, wpe = p_["wte.weight"], p_["wpe.weight"]
        b, t = idx.shape
        c = wte.shape[1]
        nh = self.n_head
        hd = c // nh
        scale = 1.0 / math.sqrt(hd)
        mask = np.triu(np.ones((t, t), dtype=bool), 1)
        x = wte[idx] + wpe[:t]
        caches, aux = [], 0.0
        for i in range(self.n_layer):
            p = lambda name: p_[f"blocks.{i}.{name}"]  # noqa: E731
            h, ln1 = _ln(xp, x, p("ln_1.weight"), p("ln_1.bias"))
            q, k, v = [_linear(xp, h, p(f"attn.{n}.weight"), p(f"attn.{n}.bias"))
                       .reshape(b, t, nh, hd).transpose(0, 2, 1, 3)
                       for n in ("query", "key", "value")]
            sc = np.where(mask, -np.inf, (q @ k.transpose(0, 1, 3, 2)) * scale)
            ex = np.exp(sc - sc.max(-1, keepdims=True))
            att = ex / ex.sum(-1, keepdims=True)
            y = (att @ v).transpose(0, 2, 1, 3).reshape(b, t, c)
            x1 = x + _linear(xp, y, p("attn.proj.weight"), p("attn.proj.bias"))
            h2, ln2 = _ln(xp, x1, p("ln_2.weight"), p("ln_2.bias"))
            m, aux_i, moe_cache = self.moes[i].forward(h2)
            aux += aux_i
            caches.append((h, ln1, q, k, v, att, y, ln2, moe_cache))
            x = x1 + m
        head = p_["lm_head.weight"]
        hf, lnf = _ln(xp, x, p_["ln_f.weight"], p_["ln_f.bias"])
        logits = _linear(xp, hf, head, None)
        z = logits - logits.max(-1, keepdims=True)
        ez = np.exp(z)
        n = b * t
        count = self.n_groups * t  # every rank's tokens
        flat_t = targets.reshape(-1)
        logp = z.reshape(n, -1) - np.log(ez.sum(-1)).reshape(n, 1)
        loss = self.comm.allreduce(float(-logp[np.arange(n), flat_t].sum()) / count
                                   + AUX_COEF * aux)
        grads = {}
        dlogits = (ez / ez.sum(-1, keepdims=True)).reshape(n, -1)
        dlogits[np.arange(n), flat_t] -= 1.0
        dlogits = (dlogits / count).reshape(logits.shape)
        grads["lm_head.weight"] = dlogits.reshape(n, -1).T @ hf.reshape(n, -1)
        dhf = (dlogits.reshape(n, -1) @ head).reshape(hf.shape)
        dx, grads["ln_f.weight"], grads["ln_f.bias"] = _ln_back(xp, lnf, dhf)
        for i in reversed(range(self.n_layer)):
            p = lambda name: p_[f"blocks.{i}.{name}"]  # noqa: E731
            h, ln1, q, k, v, att, y, ln2, moe_cache = caches[i]
            pre = f"blocks.{i}."
            dh2, grads[pre + "mlp.router.weight"], grads[pre + "mlp.w1"], \
                grads[pre + "mlp.w2"] = self.moes[i].backward(moe_cache, dx)
            dx1_ln, grads[pre + "ln_2.weight"], grads[pre + "ln_2.bias"] = \
                _ln_back(xp, ln2, dh2)
            dx = attention_back(xp, p, pre, grads, (h, ln1, q, k, v, att, y), dx + dx1_ln,
                                nh)
        dwte = np.zeros_like(wte)
        np.add.at(dwte, idx.reshape(-1), dx.reshape(n, c))
        grads["wte.weight"] = dwte
        dwpe = np.zeros_like(wpe)
        dwpe[:t] = dx.sum(0)
        grads["wpe.weight"] = dwpe
        flat = np.concatenate([grads[k].reshape(-1) for k in self.shared])
        self.comm.Allreduce(MPI.IN_PLACE, flat)  # data parallel: one flat bucket
        offset = 0
        for k in self.shared:
            size = grads[k].size
            grads[k] = flat[offset:offset + size].reshape(grads[k].shape)
            offset += size
        return loss, grads


class GPTCtensor:
    def __init__(self, model, idx, targets):
        self.model = model
        mesh = ct.placement.all()
        model.to_global(mesh, nn.parallel.expert_parallel_rules(model))
        self.idx = ct.tensor(idx, placement=mesh, sbp=ct.sbp.split(0))
        self.targets = ct.tensor(targets, placement=mesh, sbp=ct.sbp.split(0))

    def step(self):
        for p in self.model.parameters():
            p.grad = None
        _, loss = self.model(self.idx, self.targets)
        loss.backward()
        return loss

    def result(self):
        loss = self.step()
        return loss.item(), {k: p.grad.to_local() for k, p in self.model.named_parameters()}


def gpt_compare(args, comm) -> tuple:
    """Both GPT steps built from the same weights and batch, checked equal: ``(hand,
    ours, worst difference, cap)``."""
    n, g, s = comm.size, args.groups, args.seq
    ct.manual_seed(0)
    model = nn.GPT(256, s, args.layers, 4, args.hidden, dropout=0.0, tie_weights=False,
                   dtype=np.float64, moe_experts=args.experts, moe_top_k=TOP_K,
                   moe_capacity_factor=CAPACITY_FACTOR, moe_aux_loss_coef=AUX_COEF)
    params = {k: p.numpy() for k, p in model.named_parameters()}
    tokens = np.random.default_rng(1).integers(0, 256, (g, s + 1))
    gl, el = g // n, args.experts // n
    mine_g = slice(comm.rank * gl, (comm.rank + 1) * gl)
    mine_e = slice(comm.rank * el, (comm.rank + 1) * el)
    experts = {i: tuple(np.ascontiguousarray(params[f"blocks.{i}.mlp.{w}"][mine_e])
                        for w in ("w1", "w2")) for i in range(args.layers)}
    hand = GPTByHand(params, experts, tokens[mine_g, :-1], tokens[mine_g, 1:], args.layers,
                     4, g, comm)
    ours = GPTCtensor(model, tokens[:, :-1], tokens[:, 1:])
    loss, grads = ours.result()
    hand_loss, hand_grads = hand.step()
    names = list(grads)
    worst = check([loss] + [grads[k] for k in names], [hand_loss] + [hand_grads[k]
                                                                     for k in names], comm,
                  1e-10, names=["loss"] + names)
    return hand, ours, worst


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


def check(got, want, comm, rtol: float, names=("loss", "aux loss", "router grad",
                                              "w1 grad", "w2 grad", "x grad")) -> float:
    """Largest relative difference of every result; ``SystemExit`` past ``rtol``."""
    diffs = []
    for a, b in zip(got, want):
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        # (attention's key bias has a zero gradient: softmax ignores a per-row shift)
        scale = max(float(np.abs(b).max()), 1e-6)
        diffs.append(float(np.abs(a - b).max()) / scale)
    diffs = np.array(diffs)
    comm.Allreduce(MPI.IN_PLACE, diffs, op=MPI.MAX)
    worst = float(diffs.max())
    if not worst <= rtol:
        shown = ", ".join(f"{n} {v:.1e}" for n, v in zip(names, diffs) if not v <= rtol)
        raise SystemExit(f"moe: ctensor and the hand-written step differ ({shown}; max "
                         f"relative difference {worst:.2e} > {rtol:.0e}); the timing would "
                         f"be meaningless")
    return worst




def main(argv: Optional[list] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=positive_int, help="sequences (default 16)")
    parser.add_argument("--seq", type=positive_int, help="tokens per sequence (default 64)")
    parser.add_argument("--hidden", type=positive_int, help="d (default 128; experts 4d)")
    parser.add_argument("--experts", type=positive_int, help="E (default 8)")
    parser.add_argument("--layers", type=positive_int, help="GPT blocks (default 2)")
    parser.add_argument("--repeats", type=positive_int, help="timed steps each (default 20)")
    add_quick(parser)
    args = settle(parser.parse_args(argv),
                  dict(groups=16, seq=64, hidden=128, experts=8, layers=2, repeats=20),
                  dict(groups=4, seq=8, hidden=16, experts=4, layers=1, repeats=2))
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
    hand = LayerByHand(np.ascontiguousarray(x[mine_g]), wr, np.ascontiguousarray(w1[mine_e]),
                       np.ascontiguousarray(w2[mine_e]), g, comm)
    ours = Ctensor(x, wr, w1, w2)
    worst = check(ours.result(), hand.step(), comm, 1e-10)
    stats = ours.moe.stats
    with ct.debug.comm_log() as log:
        ours.step()
    times = harness.interleaved({"by hand": hand.step, "ctensor": ours.step}, args.repeats,
                                comm, warmup=2)
    gpt_hand, gpt_ours, gpt_worst = gpt_compare(args, comm)
    with ct.debug.comm_log() as gpt_log:
        gpt_ours.step()
    gpt_times = harness.interleaved({"by hand": gpt_hand.step, "ctensor": gpt_ours.step},
                                    args.repeats, comm, warmup=2)
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
        ratio = gpt_times["ctensor"] / gpt_times["by hand"]
        print(f"\nMoE GPT step, EP {n} (data parallel for the rest): {args.layers} blocks, "
              f"d={d}, 4 heads, every MLP {e} experts top-{TOP_K}, {g} sequences x {s} bytes, "
              f"no dropout, float64, forward + backward + gradient sync")
        print(f"{'implementation':<26}{'ms':>9}{'vs by hand':>12}")
        for name, seconds in gpt_times.items():
            print(f"{name:<26}{seconds * 1e3:>9.2f}{seconds / gpt_times['by hand']:>11.2f}x")
        print(f"ctensor / by hand = {ratio:.2f}x (target <= {TARGET}x"
              f"{'' if ratio <= TARGET else ': not met'})")
        print(f"by hand: {4 * args.layers} all_to_all, 1 all_reduce of the replicated "
              f"gradients, 1 of the loss; ctensor:")
        print(gpt_log.summary())
        print(f"checked: the loss and every gradient agree (max relative difference "
              f"{gpt_worst:.1e})")


if __name__ == "__main__":
    main()
