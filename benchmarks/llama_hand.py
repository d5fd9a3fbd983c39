"""The user-written Llama of tests/test_pytorch_programs.py, one forward + backward written
by hand in NumPy + mpi4py with Megatron-LM's tensor-parallel placement (the floor that
``benchmarks/llama_tp.py`` times ctensor against).

Each rank holds its shards of the parameters ``LLAMA_TP`` lays out: ``wq``/``wk``/``wv``,
``w1``/``w3`` column-parallel (output features split: whole heads, half the SwiGLU
hidden), ``wo``/``w2`` row-parallel (input features split), the token embedding and the
output head vocabulary-parallel, the RMSNorm weights replicated. The collectives are
Megatron's, one ``Allreduce`` each:

* forward: the embedding's partial lookups (rows outside this rank's vocabulary are 0),
  one after each row-parallel linear, and the vocabulary-parallel cross entropy's three
  row statistics (max, sum of exponentials, target logit);
* backward: one into each RMSNorm's output gradient (the column-parallel linears' input
  gradients are partial: q, k and v share one, w1 and w3 another, the head a third);
  nothing else: the row-parallel linears' output gradients are replicated, and so are the
  RMSNorm weights' gradients (computed alike on every rank from replicated values).

:class:`Counted` counts the calls and the bytes each rank feeds in (the same convention as
``ct.debug.comm_log()``: an all-reduce's whole buffer) and the seconds spent in them. No
ctensor here: the parameters come in as this rank's NumPy shards.
"""
from __future__ import annotations

import time

import numpy as np

EPS = 1e-6  # the program's RMSNorm eps
THETA = 10000.0


class Counted:
    """``Allreduce`` in place on a communicator, counting calls and bytes fed in."""

    def __init__(self, comm):
        from mpi4py import MPI
        self.comm, self.MPI = comm, MPI
        self.calls = 0
        self.nbytes = 0
        self.seconds = 0.0  # inside Allreduce (waiting for the other rank included)

    def all_reduce(self, buf: np.ndarray, op: str = "sum") -> np.ndarray:
        self.calls += 1
        self.nbytes += buf.nbytes
        start = time.perf_counter()
        self.comm.Allreduce(self.MPI.IN_PLACE, buf,
                            op=self.MPI.MAX if op == "max" else self.MPI.SUM)
        self.seconds += time.perf_counter() - start
        return buf


def rotary(head_dim: int, seq_len: int):
    """``cos, sin`` of shape ``(seq_len, head_dim)``, as the program builds them."""
    inv_freq = 1.0 / (THETA ** (np.arange(0, head_dim, 2) / head_dim))
    freqs = np.outer(np.arange(seq_len), inv_freq)
    emb = np.concatenate((freqs, freqs), axis=-1)
    return np.cos(emb), np.sin(emb)


def rotate_half(x):
    x1, x2 = np.split(x, 2, axis=-1)
    return np.concatenate((-x2, x1), axis=-1)


def rotate_half_t(g):
    """The transpose of :func:`rotate_half` (its backward)."""
    g1, g2 = np.split(g, 2, axis=-1)
    return np.concatenate((g2, -g1), axis=-1)


def rms_norm(x, w):
    r = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + EPS)
    return x * r * w, r


def rms_norm_backward(x, r, w, dy):
    """``dx, dw`` of ``y = x * r * w`` with ``r = (mean(x^2) + eps)^-1/2``."""
    dw = (dy * x * r).reshape(-1, x.shape[-1]).sum(0)
    dn = dy * w
    dx = r * dn - x * r ** 3 * (dn * x).mean(-1, keepdims=True)
    return dx, dw


def sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


class Step:
    """One rank's forward + backward. ``params``: name -> this rank's shard (the names of
    the program's ``named_parameters()``); ``vocab``: the whole vocabulary size."""

    def __init__(self, params: dict, n_layers: int, n_heads: int, vocab: int, rank: int,
                 world: int, comm: Counted):
        self.p, self.layers, self.comm = params, n_layers, comm
        self.local_heads = n_heads // world
        self.vocab_lo = rank * (vocab // world)  # (vocab divides evenly: checked by caller)
        self.vocab_local = vocab // world

    # ------------------------------------------------------------------ forward
    def attention(self, x, pre: str, cos, sin, mask):
        p, (b, t, _) = self.p, x.shape
        h = self.local_heads

        def heads(w):
            return (x @ w.T).reshape(b, t, h, -1).transpose(0, 2, 1, 3)

        q0, k0, v = heads(p[pre + "wq.weight"]), heads(p[pre + "wk.weight"]), \
            heads(p[pre + "wv.weight"])
        q = q0 * cos + rotate_half(q0) * sin
        k = k0 * cos + rotate_half(k0) * sin
        scale = 1.0 / np.sqrt(q.shape[-1])
        scores = np.where(mask, q @ k.transpose(0, 1, 3, 2) * scale, -np.inf)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        att = scores / scores.sum(-1, keepdims=True)
        o = (att @ v).transpose(0, 2, 1, 3).reshape(b, t, -1)
        out = self.comm.all_reduce(o @ p[pre + "wo.weight"].T)  # row-parallel: partial
        return out, (x, q, k, v, att, o, scale)

    def feed_forward(self, x, pre: str):
        p = self.p
        a, c = x @ p[pre + "w1.weight"].T, x @ p[pre + "w3.weight"].T
        s = sigmoid(a)
        m = a * s * c
        return self.comm.all_reduce(m @ p[pre + "w2.weight"].T), (x, a, c, s, m)

    def embed(self, tokens):
        w = self.p["tok_embeddings.weight"]
        local = tokens - self.vocab_lo
        inside = (local >= 0) & (local < self.vocab_local)
        out = w[np.where(inside, local, 0)] * inside[..., None]
        return self.comm.all_reduce(out), (local, inside)

    def loss(self, logits, targets):
        """Vocabulary-parallel cross entropy (mean over tokens): Megatron's three
        all-reduces of one value per token."""
        n = logits.shape[0]
        top = self.comm.all_reduce(logits.max(-1), "max")
        e = np.exp(logits - top[:, None])
        total = self.comm.all_reduce(e.sum(-1))
        local = targets - self.vocab_lo
        inside = (local >= 0) & (local < self.vocab_local)
        picked = logits[np.arange(n), np.where(inside, local, 0)] * inside
        target = self.comm.all_reduce(picked)
        loss = float(np.mean(np.log(total) + top - target))
        dlogits = e / total[:, None]
        dlogits[np.arange(n)[inside], local[inside]] -= 1.0
        return loss, dlogits / n

    # ------------------------------------------------------------------ step
    def __call__(self, tokens, targets):
        """``(loss, {name: gradient shard})``."""
        p, comm = self.p, self.comm
        b, t = tokens.shape
        head_dim = p["layers.0.attention.wq.weight"].shape[0] // self.local_heads
        cos, sin = rotary(head_dim, t)
        mask = np.tril(np.ones((t, t), dtype=bool))
        x, emb_saved = self.embed(tokens)
        saved = []
        for i in range(self.layers):
            pre = f"layers.{i}."
            y, r1 = rms_norm(x, p[pre + "attention_norm.weight"])
            attn, a_saved = self.attention(y, pre + "attention.", cos, sin, mask)
            h = x + attn
            z, r2 = rms_norm(h, p[pre + "ffn_norm.weight"])
            ffn, f_saved = self.feed_forward(z, pre + "feed_forward.")
            saved.append((x, r1, a_saved, h, r2, f_saved))
            x = h + ffn
        y, r = rms_norm(x, p["norm.weight"])
        flat = y.reshape(b * t, -1)
        loss, dlogits = self.loss(flat @ p["output.weight"].T, targets.reshape(-1))

        grads = {"output.weight": dlogits.T @ flat}
        dy = comm.all_reduce(dlogits @ p["output.weight"]).reshape(y.shape)  # head input
        dx, grads["norm.weight"] = rms_norm_backward(x, r, p["norm.weight"], dy)
        for i in reversed(range(self.layers)):
            pre = f"layers.{i}."
            x_in, r1, a_saved, h, r2, f_saved = saved[i]
            dz = self.feed_forward_backward(dx, pre + "feed_forward.", f_saved, grads)
            dh, grads[pre + "ffn_norm.weight"] = rms_norm_backward(
                h, r2, p[pre + "ffn_norm.weight"], dz)
            dh += dx
            dy = self.attention_backward(dh, pre + "attention.", a_saved, cos, sin, grads)
            dx, grads[pre + "attention_norm.weight"] = rms_norm_backward(
                x_in, r1, p[pre + "attention_norm.weight"], dy)
            dx += dh
        local, inside = emb_saved
        dw = np.zeros_like(p["tok_embeddings.weight"])
        np.add.at(dw, local[inside], dx[inside])
        grads["tok_embeddings.weight"] = dw
        return loss, grads

    def feed_forward_backward(self, dout, pre: str, saved, grads):
        """Row-parallel w2 (its output gradient replicated: no collective), then w1/w3
        column-parallel: their input gradients summed, then all-reduced once."""
        p = self.p
        x, a, c, s, m = saved
        flat = dout.reshape(-1, dout.shape[-1])
        grads[pre + "w2.weight"] = flat.T @ m.reshape(-1, m.shape[-1])
        dm = dout @ p[pre + "w2.weight"]
        da = dm * c * s * (1.0 + a * (1.0 - s))
        dc = dm * a * s
        xf = x.reshape(-1, x.shape[-1])
        grads[pre + "w1.weight"] = da.reshape(-1, da.shape[-1]).T @ xf
        grads[pre + "w3.weight"] = dc.reshape(-1, dc.shape[-1]).T @ xf
        return self.comm.all_reduce(da @ p[pre + "w1.weight"] + dc @ p[pre + "w3.weight"])

    def attention_backward(self, dout, pre: str, saved, cos, sin, grads):
        p = self.p
        x, q, k, v, att, o, scale = saved
        b, t, _ = dout.shape
        flat = dout.reshape(b * t, -1)
        grads[pre + "wo.weight"] = flat.T @ o.reshape(b * t, -1)
        do = (dout @ p[pre + "wo.weight"]).reshape(b, t, self.local_heads, -1) \
            .transpose(0, 2, 1, 3)
        datt = do @ v.transpose(0, 1, 3, 2)
        dv = att.transpose(0, 1, 3, 2) @ do
        ds = att * (datt - (datt * att).sum(-1, keepdims=True)) * scale
        dq = ds @ k
        dk = ds.transpose(0, 1, 3, 2) @ q
        xf = x.reshape(b * t, -1)
        dx = 0
        for name, g in (("wq", dq), ("wk", dk), ("wv", dv)):
            if name != "wv":  # through the rotary embedding
                g = g * cos + rotate_half_t(g * sin)
            g = g.transpose(0, 2, 1, 3).reshape(b * t, -1)
            grads[pre + name + ".weight"] = g.T @ xf
            dx = dx + g @ p[pre + name + ".weight"]
        return self.comm.all_reduce(dx).reshape(b, t, -1)
