"""PyTorch programs run with only the module object changed.

Each program below is written once, exactly as a PyTorch user writes it, as a function of
the module objects ``build(torch, nn, F)``: it runs once with ``torch`` (when importable)
and once with ``ctensor``, ``ctensor.nn``, ``ctensor.nn.functional`` passed in their place.
Both start from the same weights (torch's ``state_dict`` loaded into the ctensor model, or
without torch the ctensor model's own), and the losses and every parameter's gradient must
agree in float64 to 1e-9. The ctensor run is then repeated laid out tensor-parallel and
data-parallel over every rank of the world by SBP rules alone (``module.to_global(mesh,
{pattern: sbp})`` and inputs ``to_global``), with no change to the program, and must agree
with the single-process run again; and on a (data, tensor) = (2, 2) mesh.

The 1-D layouts run over all ranks of the world (2 simulated, or every rank under
mpiexec), so the model dimensions are multiples of 4.
"""
from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest

import ctensor
import ctensor.nn
import ctensor.nn.functional
import ctensor.optim  # noqa: F401  (programs reach it as torch.optim)
from conftest import world

try:
    import torch
    import torch.nn
    import torch.nn.functional
except ImportError:  # the torch half of each test is skipped
    torch = None

S, B = ctensor.sbp.split, ctensor.sbp.broadcast
RTOL, ATOL = 1e-9, 1e-12
CT = (ctensor, ctensor.nn, ctensor.nn.functional)


# ----------------------------------------------------------------------------- programs
def llama(torch, nn, F):
    """A Llama block stack: RMSNorm written out, rotary embeddings with chunk/cat, SwiGLU
    with F.silu, masked_fill + softmax attention, view/transpose."""

    class RMSNorm(nn.Module):
        def __init__(self, dim, eps=1e-6):
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    def rotate_half(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    def rotary(head_dim, seq_len, theta=10000.0):
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2) / head_dim))
        freqs = torch.outer(torch.arange(seq_len), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    class Attention(nn.Module):
        def __init__(self, dim, n_heads):
            super().__init__()
            self.n_heads, self.head_dim = n_heads, dim // n_heads
            self.wq = nn.Linear(dim, dim, bias=False)
            self.wk = nn.Linear(dim, dim, bias=False)
            self.wv = nn.Linear(dim, dim, bias=False)
            self.wo = nn.Linear(dim, dim, bias=False)

        def forward(self, x, cos, sin, mask):
            bsz, seqlen, _ = x.shape
            q = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
            k = self.wk(x).view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
            v = self.wv(x).view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
            scores = scores.masked_fill(mask == 0, float("-inf"))
            att = F.softmax(scores, dim=-1)
            out = (att @ v).transpose(1, 2).contiguous().view(bsz, seqlen, -1)
            return self.wo(out)

    class FeedForward(nn.Module):
        def __init__(self, dim, hidden):
            super().__init__()
            self.w1 = nn.Linear(dim, hidden, bias=False)
            self.w2 = nn.Linear(hidden, dim, bias=False)
            self.w3 = nn.Linear(dim, hidden, bias=False)

        def forward(self, x):
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class TransformerBlock(nn.Module):
        def __init__(self, dim, n_heads):
            super().__init__()
            self.attention_norm = RMSNorm(dim)
            self.attention = Attention(dim, n_heads)
            self.ffn_norm = RMSNorm(dim)
            self.feed_forward = FeedForward(dim, 2 * dim)

        def forward(self, x, cos, sin, mask):
            h = x + self.attention(self.attention_norm(x), cos, sin, mask)
            return h + self.feed_forward(self.ffn_norm(h))

    class Transformer(nn.Module):
        def __init__(self, vocab_size=32, dim=16, n_layers=2, n_heads=4, max_seq_len=8):
            super().__init__()
            self.tok_embeddings = nn.Embedding(vocab_size, dim)
            self.layers = nn.ModuleList([TransformerBlock(dim, n_heads)
                                         for _ in range(n_layers)])
            self.norm = RMSNorm(dim)
            self.output = nn.Linear(dim, vocab_size, bias=False)
            self.head_dim = dim // n_heads

        def forward(self, tokens, targets):
            _, seqlen = tokens.shape
            h = self.tok_embeddings(tokens)
            cos, sin = rotary(self.head_dim, seqlen)
            mask = torch.tril(torch.ones(seqlen, seqlen))
            for layer in self.layers:
                h = layer(h, cos, sin, mask)
            logits = self.output(self.norm(h))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    return Transformer()


LLAMA_TP = {"tok_embeddings.weight": S(0), "layers.*.attention.w[qkv].weight": S(0),
            "layers.*.attention.wo.weight": S(1), "layers.*.feed_forward.w[13].weight": S(0),
            "layers.*.feed_forward.w2.weight": S(1), "output.weight": S(0)}


def nanogpt(torch, nn, F):
    """nanoGPT's model.py (Karpathy), as written there: LayerNorm with an optional bias,
    a fused c_attn split into q, k, v, F.scaled_dot_product_attention, tied embedding and
    head, ``self.apply(self._init_weights)`` and the scaled c_proj init."""

    class LayerNorm(nn.Module):
        def __init__(self, ndim, bias):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(ndim))
            self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

        def forward(self, input):
            return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)

    class CausalSelfAttention(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
            self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
            self.attn_dropout = nn.Dropout(config.dropout)
            self.resid_dropout = nn.Dropout(config.dropout)
            self.n_head = config.n_head
            self.n_embd = config.n_embd
            self.dropout = config.dropout

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
            k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
            q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
            v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0,
                is_causal=True)
            y = y.transpose(1, 2).contiguous().view(B, T, C)
            return self.resid_dropout(self.c_proj(y))

    class MLP(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
            self.gelu = nn.GELU()
            self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
            self.dropout = nn.Dropout(config.dropout)

        def forward(self, x):
            return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))

    class Block(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
            self.attn = CausalSelfAttention(config)
            self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
            self.mlp = MLP(config)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPTConfig:
        block_size, vocab_size, n_layer, n_head, n_embd = 8, 32, 2, 4, 16
        dropout, bias = 0.0, False

    class GPT(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=LayerNorm(config.n_embd, bias=config.bias),
            ))
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
            self.transformer.wte.weight = self.lm_head.weight  # weight tying
            self.apply(self._init_weights)
            for pn, p in self.named_parameters():
                if pn.endswith("c_proj.weight"):
                    nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

        def _init_weights(self, module):
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)

        def forward(self, idx, targets=None):
            b, t = idx.size()
            assert t <= self.config.block_size
            pos = torch.arange(0, t, dtype=torch.long)
            tok_emb = self.transformer.wte(idx)
            pos_emb = self.transformer.wpe(pos)
            x = self.transformer.drop(tok_emb + pos_emb)
            for block in self.transformer.h:
                x = block(x)
            x = self.transformer.ln_f(x)
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                   ignore_index=-1)
            return logits, loss

    model = GPT(GPTConfig())
    model.loss_of = lambda idx, targets: model(idx, targets)[1]
    return model


# c_attn packs q, k, v along its output: a plain S(0) would hand rank 0 all of q, so it
# stays broadcast and the MLP and the tied vocabulary (named by its first name, the
# embedding's) carry the tensor parallelism
NANOGPT_TP = {"transformer.wte.weight": S(0), "transformer.h.*.mlp.c_fc.weight": S(0),
              "transformer.h.*.mlp.c_proj.weight": S(1)}


def moe(torch, nn, F):
    """A mixture-of-experts layer with top-k routing: dense gates by ``scatter`` (for the
    load-balancing loss), tokens dispatched with ``torch.where`` and integer indexing, the
    expert outputs combined with ``index_add_``."""

    class Expert(nn.Module):
        def __init__(self, dim, hidden):
            super().__init__()
            self.fc1 = nn.Linear(dim, hidden)
            self.fc2 = nn.Linear(hidden, dim)

        def forward(self, x):
            return self.fc2(F.silu(self.fc1(x)))

    class MoE(nn.Module):
        def __init__(self, dim=8, hidden=16, num_experts=4, top_k=2):
            super().__init__()
            self.top_k, self.num_experts = top_k, num_experts
            self.gate = nn.Linear(dim, num_experts, bias=False)
            self.experts = nn.ModuleList([Expert(dim, hidden) for _ in range(num_experts)])

        def forward(self, x):
            batch, seq, dim = x.shape
            x = x.view(-1, dim)
            logits = self.gate(x)
            weights, selected = torch.topk(logits, self.top_k, dim=-1)
            weights = F.softmax(weights, dim=-1)
            gates = torch.zeros_like(logits).scatter(1, selected, weights)
            load = gates.mean(0)
            importance = F.softmax(logits, dim=-1).mean(0)
            aux_loss = self.num_experts * (load * importance).sum()
            out = torch.zeros_like(x)
            for e, expert in enumerate(self.experts):
                token_idx, slot = torch.where(selected == e)
                if token_idx.numel() == 0:
                    continue
                y = expert(x[token_idx]) * weights[token_idx, slot].unsqueeze(-1)
                out.index_add_(0, token_idx, y)
            return out.view(batch, seq, dim), aux_loss

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.moe = MoE()
            self.norm = nn.LayerNorm(8)

        def loss_of(self, x, y):
            out, aux = self.moe(self.norm(x))
            return F.mse_loss(out, y) + 0.01 * aux

    return Model()


MOE_TP = {"moe.experts.*.fc1.weight": S(0), "moe.experts.*.fc1.bias": S(0),
          "moe.experts.*.fc2.weight": S(1)}


def classifier(torch, nn, F):
    """A sequence classifier: padding masks (``~``, ``masked_fill``, a masked mean),
    ``nn.MultiheadAttention`` with ``key_padding_mask``, LayerNorm, Tanh, and
    ``F.cross_entropy(..., label_smoothing=0.1)`` with class weights."""

    class Classifier(nn.Module):
        def __init__(self, vocab=20, dim=16, heads=4, classes=4):
            super().__init__()
            self.embed = nn.Embedding(vocab, dim, padding_idx=0)
            self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
            self.norm = nn.LayerNorm(dim)
            self.head = nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, classes))
            self.register_buffer("class_weight", torch.tensor([1.0, 2.0, 0.5, 1.5]))

        def forward(self, tokens, mask):
            h = self.embed(tokens)
            a, _ = self.attn(h, h, h, key_padding_mask=~mask, need_weights=False)
            h = self.norm(h + a)
            h = h.masked_fill(~mask.unsqueeze(-1), 0.0)
            pooled = h.sum(dim=1) / mask.sum(dim=1, keepdim=True)
            return self.head(pooled)

        def loss_of(self, tokens, mask, labels):
            logits = self(tokens, mask)
            return F.cross_entropy(logits, labels, weight=self.class_weight,
                                   label_smoothing=0.1)

    return Classifier()


CLASSIFIER_TP = {"head.0.weight": S(0), "head.0.bias": S(0), "head.2.weight": S(1)}


def regressor(torch, nn, F):
    """The model of the training loop below."""
    return nn.Sequential(nn.Linear(8, 16), nn.SiLU(), nn.Linear(16, 8), nn.Tanh(),
                         nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 1))


def train(torch, nn, F, model, batches):
    """A training loop: AdamW with weight decay, OneCycleLR, clip_grad_norm_,
    zero_grad(set_to_none=True). Returns the loss of every step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2,
                                                    total_steps=len(batches))
    losses = []
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    return losses


TRAIN_TP = {"0.weight": S(0), "0.bias": S(0), "2.weight": S(1), "4.weight": S(0),
            "4.bias": S(0), "6.weight": S(1)}


# ----------------------------------------------------------------------------- data
def _rng(seed):
    return np.random.default_rng(seed)


def llama_batch():
    r = _rng(1)
    return [r.integers(0, 32, (4, 8)), r.integers(0, 32, (4, 8))]


def moe_batch():
    r = _rng(2)
    return [r.standard_normal((4, 3, 8)), r.standard_normal((4, 3, 8))]


def classifier_batch():
    r = _rng(3)
    tokens = r.integers(1, 20, (4, 6))
    mask = np.ones((4, 6), dtype=bool)
    mask[0, 4:] = mask[2, 2:] = False
    tokens[~mask] = 0
    return [tokens, mask, r.integers(0, 4, 4)]


PROGRAMS = {  # name: (build, batch, tensor-parallel rules)
    "llama": (llama, llama_batch, LLAMA_TP),
    "nanogpt": (nanogpt, llama_batch, NANOGPT_TP),
    "moe": (moe, moe_batch, MOE_TP),
    "classifier": (classifier, classifier_batch, CLASSIFIER_TP),
}


# ----------------------------------------------------------------------------- harness
@contextlib.contextmanager
def float64():
    """Both libraries' default dtype float64 for the test, restored afterwards."""
    before_ct = ctensor.get_default_dtype()
    before_torch = torch.get_default_dtype() if torch is not None else None
    ctensor.set_default_dtype(np.float64)
    if torch is not None:
        torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        ctensor.set_default_dtype(before_ct)
        if torch is not None:
            torch.set_default_dtype(before_torch)


def _loss(model, inputs):
    """The program's loss: its ``loss_of`` where the model's forward returns more."""
    return model.loss_of(*inputs) if "loss_of" in model.__dict__ or \
        hasattr(type(model), "loss_of") else model(*inputs)


def run_torch(build, arrays):
    torch.manual_seed(0)
    model = build(torch, torch.nn, torch.nn.functional)
    loss = _loss(model, [torch.from_numpy(a) for a in arrays])
    loss.backward()
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    grads = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
    return state, float(loss.item()), grads


def run_ctensor(build, arrays, state, mesh=None, rules=None, batch_dim=None):
    """The program with ctensor: weights from ``state`` (None: its own init), laid out by
    ``rules`` on ``mesh`` and the inputs split along ``batch_dim`` (data parallel)."""
    ctensor.manual_seed(0)
    model = build(*CT)
    if state is not None:
        model.load_state_dict(state)
    inputs = [ctensor.tensor(a) for a in arrays]
    if mesh is not None:
        model.to_global(mesh, rules or (B,) * mesh.ndim)
        sbp = [B] * mesh.ndim
        if batch_dim is not None:  # data parallel along mesh axis 0
            sbp[0] = S(batch_dim)
        inputs = [x.to_global(mesh, tuple(sbp)) for x in inputs]
    loss = _loss(model, inputs)
    loss.backward()
    own = {k: v.numpy() for k, v in model.state_dict().items()}
    grads = {n: p.grad.numpy() for n, p in model.named_parameters()}
    layouts = {n: p.sbp for n, p in model.named_parameters()}
    return own, float(loss.item()), grads, layouts


def assert_same(got, expected, what):
    (_, loss, grads), (_, ref_loss, ref_grads) = got, expected
    np.testing.assert_allclose(loss, ref_loss, rtol=RTOL, atol=ATOL, err_msg=what)
    assert sorted(grads) == sorted(ref_grads), what
    for name, g in ref_grads.items():
        np.testing.assert_allclose(grads[name], g, rtol=RTOL, atol=ATOL,
                                   err_msg=f"{what}: grad of {name}")


def _mesh():
    return ctensor.placement("cpu", list(range(ctensor.world_size())))


# ----------------------------------------------------------------------------- tests
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_program_matches_torch(name):
    if torch is None:
        pytest.skip("torch is not importable")
    build, batch, _ = PROGRAMS[name]
    arrays = batch()
    with float64():
        state, loss, grads = run_torch(build, arrays)
        own, ct_loss, ct_grads, _ = run_ctensor(build, arrays, state)
    # the same parameter and buffer names (torch's state_dict also lists a tied parameter
    # under its other names; the strict load_state_dict accepted them)
    assert set(own) <= set(state)
    assert_same((None, ct_loss, ct_grads), (None, loss, grads), f"{name}: ctensor vs torch")


@pytest.mark.parametrize("layout", ["tp", "dp"])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_program_parallel_by_sbp_rules_alone(name, layout):
    build, batch, tp_rules = PROGRAMS[name]
    arrays = batch()
    with float64(), world(2):
        one = run_ctensor(build, arrays, None)
        mesh = _mesh()
        if layout == "tp":
            got = run_ctensor(build, arrays, one[0], mesh, tp_rules)
            split = {n for n, sbp in got[3].items() if sbp[0] != B}
            assert split, f"{name}: no parameter is split"
        else:
            got = run_ctensor(build, arrays, one[0], mesh, None, batch_dim=0)
        assert_same(got[:3], one[:3], f"{name} {layout} over {mesh}")


# Llama and nanoGPT make tensors inside forward (the rotary tables and the causal mask,
# the positions) with no placement: they live broadcast on the 1-D placement of the whole
# world, and meet the (2, 2) mesh of the activations over the same ranks, where dispatch
# takes them as they are (no message)
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_program_on_a_data_and_tensor_parallel_mesh(name):
    # a (dp, tp) = (2, 2) mesh: the 1-D rules on the tensor-parallel axis, broadcast on the
    # data-parallel one, the batch split along it
    build, batch, tp_rules = PROGRAMS[name]
    arrays = batch()
    with float64(), world(4):
        one = run_ctensor(build, arrays, None)
        mesh = ctensor.placement("cpu", [[0, 1], [2, 3]])
        rules = {k: (B, v) for k, v in tp_rules.items()}
        got = run_ctensor(build, arrays, one[0], mesh, rules, batch_dim=0)
        assert any(sbp[1] != B for sbp in got[3].values())
        assert_same(got[:3], one[:3], f"{name} on {mesh}")


def _batches(n=6):
    r = _rng(4)
    return [(r.standard_normal((8, 8)), r.standard_normal((8, 1))) for _ in range(n)]


def _initial_state():
    ctensor.manual_seed(0)
    return {k: v.numpy() for k, v in regressor(*CT).state_dict().items()}


def _train_ctensor(batches, state, mesh=None, rules=None, batch_sbp=None):
    model = regressor(*CT)
    model.load_state_dict(state)
    if mesh is not None:
        model.to_global(mesh, rules or B)
    data = []
    for x, y in batches:
        x, y = ctensor.tensor(x), ctensor.tensor(y)
        if mesh is not None:
            x, y = x.to_global(mesh, batch_sbp or B), y.to_global(mesh, batch_sbp or B)
        data.append((x, y))
    return model, train(*CT, model, data)


def test_training_loop_matches_torch():
    if torch is None:
        pytest.skip("torch is not importable")
    batches = _batches()
    with float64():
        torch.manual_seed(0)
        tmodel = regressor(torch, torch.nn, torch.nn.functional)
        state = {k: v.detach().numpy().copy() for k, v in tmodel.state_dict().items()}
        tlosses = train(torch, torch.nn, torch.nn.functional, tmodel,
                        [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in batches])
        model, losses = _train_ctensor(batches, state)
    np.testing.assert_allclose(losses, tlosses, rtol=RTOL, atol=ATOL)
    after = dict(model.named_parameters())
    for name, p in tmodel.named_parameters():
        np.testing.assert_allclose(after[name].numpy(), p.detach().numpy(), rtol=RTOL,
                                   atol=ATOL, err_msg=name)


@pytest.mark.parametrize("layout", ["tp", "dp"])
def test_training_loop_parallel_by_sbp_rules_alone(layout):
    batches = _batches()
    with float64(), world(2):
        state = _initial_state()
        model, losses = _train_ctensor(batches, state)
        mesh = _mesh()
        if layout == "tp":
            pmodel, plosses = _train_ctensor(batches, state, mesh, TRAIN_TP)
            assert pmodel[0].weight.sbp == (S(0),) and pmodel[2].weight.sbp == (S(1),)
        else:
            pmodel, plosses = _train_ctensor(batches, state, mesh, None, S(0))
    np.testing.assert_allclose(plosses, losses, rtol=RTOL, atol=ATOL)
    after = dict(model.named_parameters())
    for name, p in pmodel.named_parameters():
        np.testing.assert_allclose(p.numpy(), after[name].numpy(), rtol=RTOL, atol=ATOL,
                                   err_msg=name)
