"""The GPT step of ``nn.GPT`` written by hand against an array module (NumPy or CuPy).

Forward and backward of the same model as :class:`ctensor.nn.GPT` without dropout: token +
position embeddings, pre-LayerNorm blocks (separate query/key/value linears, causal
softmax attention, output projection; MLP ``proj(gelu_tanh(fc(x)))``), final LayerNorm, LM
head (tied to the token embedding unless ``params`` has an ``lm_head.weight``), mean cross
entropy. ``benchmarks/gpu_check.py`` times it
in CuPy as the baseline of the ctensor GPT step; :func:`check_against_ctensor` shows on CPU
(float64) that it computes the same loss and gradients as ctensor.

Parameters are a dict named like ``GPT.named_parameters()``; weights are ``(out, in)``.
"""
from __future__ import annotations

import math

GELU_C = math.sqrt(2.0 / math.pi)
EPS = 1e-5


# matmuls on 2-D views: a (b, t, c) @ (c, d) product is a batch of small GEMMs in NumPy,
# one (b*t, c) @ (c, d) is one large GEMM (~25% faster here)
def _linear(xp, x, w, b):
    y = (x.reshape(-1, x.shape[-1]) @ w.T).reshape(*x.shape[:-1], w.shape[0])
    return y + b if b is not None else y


def _linear_back(xp, x, w, dy):
    """``(dx, dw, db)`` of ``y = x @ w.T + b``."""
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    return (dy2 @ w).reshape(x.shape), dy2.T @ x2, dy2.sum(0)


def _ln(xp, x, w, b):
    mu = x.mean(-1, keepdims=True)
    xc = x - mu
    rstd = 1.0 / xp.sqrt((xc * xc).mean(-1, keepdims=True) + EPS)
    xhat = xc * rstd
    return xhat * w + b, (xhat, rstd, w)


def _ln_back(xp, cache, dy):
    xhat, rstd, w = cache
    dxhat = dy * w
    dx = rstd * (dxhat - dxhat.mean(-1, keepdims=True)
                 - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    dy2, xh2 = dy.reshape(-1, dy.shape[-1]), xhat.reshape(-1, xhat.shape[-1])
    return dx, (dy2 * xh2).sum(0), dy2.sum(0)


def _gelu(xp, x):
    # x * x * x, not x ** 3: NumPy's float power is a slow generic pow per element (it was
    # half of the whole step's time)
    t = xp.tanh(GELU_C * (x + 0.044715 * (x * x * x)))
    return 0.5 * x * (1.0 + t), t


def _gelu_back(xp, x, t, dy):
    return dy * (0.5 * (1.0 + t)
                 + 0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3 * 0.044715 * x * x))


def attention_back(xp, p, pre: str, grads: dict, cache: tuple, dx1, n_head: int):
    """The backward of a block's attention half, ``x + proj(attn(ln_1(x)))``, given the
    gradient ``dx1`` of its output: the gradient of ``x``; the parameters' gradients go into
    ``grads`` under ``pre`` (``p(name)`` reads a parameter of the block). ``cache``:
    ``(h, ln1, q, k, v, att, y)`` of the forward."""
    h, ln1, q, k, v, att, y = cache
    b, t, c = h.shape
    hd = c // n_head
    scale = 1.0 / math.sqrt(hd)
    dy, grads[pre + "attn.proj.weight"], grads[pre + "attn.proj.bias"] = \
        _linear_back(xp, y, p("attn.proj.weight"), dx1)
    dy = dy.reshape(b, t, n_head, hd).transpose(0, 2, 1, 3)
    datt = dy @ v.transpose(0, 1, 3, 2)
    dv = att.transpose(0, 1, 3, 2) @ dy
    ds = att * (datt - (datt * att).sum(-1, keepdims=True)) * scale
    dq, dk = ds @ k, ds.transpose(0, 1, 3, 2) @ q
    dh = 0
    for name, dpart in (("query", dq), ("key", dk), ("value", dv)):
        dpart = dpart.transpose(0, 2, 1, 3).reshape(b, t, c)
        dhp, grads[pre + f"attn.{name}.weight"], grads[pre + f"attn.{name}.bias"] = \
            _linear_back(xp, h, p(f"attn.{name}.weight"), dpart)
        dh = dh + dhp
    dx0, grads[pre + "ln_1.weight"], grads[pre + "ln_1.bias"] = _ln_back(xp, ln1, dh)
    return dx1 + dx0


def step(xp, params: dict, idx, targets, n_layer: int, n_head: int):
    """Loss and gradients (same keys as ``params``) of one forward + backward."""
    wte, wpe = params["wte.weight"], params["wpe.weight"]
    b, t = idx.shape
    c = wte.shape[1]
    hd = c // n_head
    scale = 1.0 / math.sqrt(hd)
    mask = xp.triu(xp.ones((t, t), dtype=bool), 1)
    x = wte[idx] + wpe[:t]
    caches = []
    for i in range(n_layer):
        p = lambda name: params[f"blocks.{i}.{name}"]  # noqa: E731
        h, ln1 = _ln(xp, x, p("ln_1.weight"), p("ln_1.bias"))
        qkv = [_linear(xp, h, p(f"attn.{n}.weight"), p(f"attn.{n}.bias"))
               .reshape(b, t, n_head, hd).transpose(0, 2, 1, 3) for n in ("query", "key", "value")]
        q, k, v = qkv
        s = (q @ k.transpose(0, 1, 3, 2)) * scale
        s = xp.where(mask, -xp.inf, s)
        s = s - s.max(-1, keepdims=True)
        e = xp.exp(s)
        att = e / e.sum(-1, keepdims=True)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(b, t, c)
        x1 = x + _linear(xp, y, p("attn.proj.weight"), p("attn.proj.bias"))
        h2, ln2 = _ln(xp, x1, p("ln_2.weight"), p("ln_2.bias"))
        f = _linear(xp, h2, p("mlp.fc.weight"), p("mlp.fc.bias"))
        g, gt = _gelu(xp, f)
        x2 = x1 + _linear(xp, g, p("mlp.proj.weight"), p("mlp.proj.bias"))
        caches.append((h, ln1, q, k, v, att, y, h2, ln2, f, g, gt))
        x = x2
    head = params.get("lm_head.weight", wte)  # untied when the model has its own head
    hf, lnf = _ln(xp, x, params["ln_f.weight"], params["ln_f.bias"])
    logits = _linear(xp, hf, head, None)
    z = logits - logits.max(-1, keepdims=True)
    ez = xp.exp(z)
    sm = ez / ez.sum(-1, keepdims=True)
    n = b * t
    flat_t = targets.reshape(-1)
    logp = z.reshape(n, -1) - xp.log(ez.sum(-1)).reshape(n, 1)
    loss = -logp[xp.arange(n), flat_t].mean()

    grads = {}
    dlogits = sm.reshape(n, -1).copy()
    dlogits[xp.arange(n), flat_t] -= 1.0
    dlogits = (dlogits / n).reshape(logits.shape)
    dhead = dlogits.reshape(n, -1).T @ hf.reshape(n, -1)
    dhf = (dlogits.reshape(n, -1) @ head).reshape(hf.shape)
    dx, grads["ln_f.weight"], grads["ln_f.bias"] = _ln_back(xp, lnf, dhf)
    for i in reversed(range(n_layer)):
        p = lambda name: params[f"blocks.{i}.{name}"]  # noqa: E731
        h, ln1, q, k, v, att, y, h2, ln2, f, g, gt = caches[i]
        pre = f"blocks.{i}."
        dg, grads[pre + "mlp.proj.weight"], grads[pre + "mlp.proj.bias"] = \
            _linear_back(xp, g, p("mlp.proj.weight"), dx)
        df = _gelu_back(xp, f, gt, dg)
        dh2, grads[pre + "mlp.fc.weight"], grads[pre + "mlp.fc.bias"] = \
            _linear_back(xp, h2, p("mlp.fc.weight"), df)
        dx1_ln, grads[pre + "ln_2.weight"], grads[pre + "ln_2.bias"] = _ln_back(xp, ln2, dh2)
        dx = attention_back(xp, p, pre, grads, (h, ln1, q, k, v, att, y), dx + dx1_ln,
                            n_head)
    if head is wte:
        dwte = dhead
    else:
        grads["lm_head.weight"] = dhead
        dwte = xp.zeros_like(wte)
    xp.add.at(dwte, idx.reshape(-1), dx.reshape(n, c))
    grads["wte.weight"] = dwte
    dwpe = xp.zeros_like(wpe)
    dwpe[:t] = dx.sum(0)
    grads["wpe.weight"] = dwpe
    return loss, grads


def check_against_ctensor(n_layer: int = 2, n_head: int = 2, n_embd: int = 16, vocab: int = 32,
                          block: int = 8, batch: int = 3, seed: int = 0,
                          device: str = "cpu", tie_weights: bool = True) -> float:
    """Largest relative difference (float64) between this step, run with the array module of
    ``device`` (NumPy or CuPy), and ctensor's GPT on a ``device`` placement: loss and every
    gradient."""
    import numpy as np
    import ctensor as ct
    import ctensor.nn as nn
    from ctensor.arrays import array_module
    from ctensor.runtime import default_device
    xp = array_module(device)
    host = (lambda a: a.get()) if xp is not np else np.asarray
    previous = default_device()
    with ct.simulate(1):
        ct.set_default_device(device)
        try:
            ct.manual_seed(seed)
            model = nn.GPT(vocab_size=vocab, block_size=block, n_layer=n_layer, n_head=n_head,
                           n_embd=n_embd, tie_weights=tie_weights, dtype=np.float64)
            rng = np.random.default_rng(seed)
            tokens = rng.integers(0, vocab, (batch, block + 1))
            _, loss = model(ct.tensor(tokens[:, :-1]), ct.tensor(tokens[:, 1:]))
            loss.backward()
            loss_value = float(loss)
            params = {k: xp.asarray(v.numpy()) for k, v in model.named_parameters()}
            want = {k: v.grad.numpy() for k, v in model.named_parameters()}
        finally:
            ct.set_default_device(previous)
    toks = xp.asarray(tokens)
    ref_loss, got = step(xp, params, toks[:, :-1], toks[:, 1:], n_layer, n_head)
    worst = abs(float(ref_loss) - loss_value) / abs(loss_value)
    for k, g in want.items():
        # (the key bias's gradient is exactly zero: softmax ignores a per-row shift)
        worst = max(worst, float(np.abs(host(got[k]) - g).max() / max(np.abs(g).max(), 1e-6)))
    return worst
