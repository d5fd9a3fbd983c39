"""nn.MoE: routing, capacity and dropped tokens against a one-process reference (NumPy for
the values, torch for the gradients when importable), the same bits in every layout
(expert parallel, expert x data parallel; expert x tensor parallel sums the hidden dim's
partials, so there within 1e-12), one all-to-all each way
per layer in the forward and in the backward, statistics and argument errors."""
from __future__ import annotations

import math

import numpy as np
import pytest

import ctensor as ct
from ctensor import nn

from conftest import MPI_MODE, world

S, B = ct.sbp.split, ct.sbp.broadcast
G, T, D, E, F_ = 4, 6, 8, 4, 16  # groups (batch), tokens per group, width, experts, hidden


# ------------------------------------------------------------------ the one-process reference
def _route(probs: np.ndarray, k: int, cap: int):
    """Top-k expert ids (ties: the lower id) and each choice's slot ``e * cap + c`` (-1:
    dropped), slots filled every first choice before any second, in token order."""
    g_, s_, e_ = probs.shape
    top = np.argsort(-probs, axis=-1, kind="stable")[..., :k]
    slots = np.full(top.shape, -1)
    for g in range(g_):
        fill = np.zeros(e_, dtype=int)
        for j in range(k):
            for s in range(s_):
                e = top[g, s, j]
                if fill[e] < cap:
                    slots[g, s, j] = e * cap + fill[e]
                    fill[e] += 1
    return top, slots


def _act_np(name, h):
    if name == "silu":
        return h / (1 + np.exp(-h))
    if name == "gelu_tanh":
        return 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))
    erf = np.vectorize(math.erf)
    return 0.5 * h * (1 + erf(h / math.sqrt(2)))


def reference(x, wr, w1, w2, k, cf, act):
    """``(y, aux, kept choices per expert)`` of the MoE written out in NumPy."""
    g_, s_, d = x.shape
    e_ = wr.shape[0]
    logits = x @ wr.T
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    cap = math.ceil(cf * s_ * k / e_)
    top, slots = _route(p, k, cap)
    gates = np.take_along_axis(p, top, -1)
    if k > 1:
        gates = gates / gates.sum(-1, keepdims=True)
    disp = np.zeros((g_, e_ * cap, d))
    for g, s, j in zip(*np.nonzero(slots >= 0)):
        disp[g, slots[g, s, j]] = x[g, s]
    h = _act_np(act, np.einsum("gecd,edf->gecf", disp.reshape(g_, e_, cap, d), w1))
    out = np.einsum("gecf,efd->gecd", h, w2).reshape(g_, e_ * cap, d)
    y = np.zeros_like(x)
    for g, s, j in zip(*np.nonzero(slots >= 0)):
        y[g, s] += gates[g, s, j] * out[g, slots[g, s, j]]
    f = (top[..., None] == np.arange(e_)).sum((1, 2)) / (s_ * k)
    aux = np.mean(e_ * (f * p.mean(1)).sum(-1))
    kept = np.bincount(slots[slots >= 0] // cap, minlength=e_)
    return y, aux, kept


def torch_grads(x, wr, w1, w2, k, cf, act, weight):
    """Gradients of ``sum(y * weight) + aux`` for x, router, w1, w2 (torch autograd through
    the same routing)."""
    torch = pytest.importorskip("torch")
    tf = torch.nn.functional
    ts = [torch.tensor(a, requires_grad=True) for a in (x, wr, w1, w2)]
    tx, twr, tw1, tw2 = ts
    g_, s_, d = x.shape
    e_ = wr.shape[0]
    p = torch.softmax(tx @ twr.T, -1)
    cap = math.ceil(cf * s_ * k / e_)
    top, slots = _route(p.detach().numpy(), k, cap)
    gates = torch.gather(p, -1, torch.tensor(top))
    if k > 1:
        gates = gates / gates.sum(-1, keepdim=True)
    kept = np.nonzero(slots >= 0)
    disp = torch.zeros(g_, e_ * cap, d, dtype=torch.float64)
    disp = disp.index_put((torch.tensor(kept[0]), torch.tensor(slots[kept])),
                          tx[kept[0], kept[1]])
    h = torch.einsum("gecd,edf->gecf", disp.reshape(g_, e_, cap, d), tw1)
    h = {"silu": tf.silu, "gelu": tf.gelu,
         "gelu_tanh": lambda t: tf.gelu(t, approximate="tanh")}[act](h)
    out = torch.einsum("gecf,efd->gecd", h, tw2).reshape(g_, e_ * cap, d)
    y = torch.zeros(g_, s_, d, dtype=torch.float64).index_put(
        (torch.tensor(kept[0]), torch.tensor(kept[1])),
        gates[kept] [:, None] * out[kept[0], slots[kept]], accumulate=True)
    f = torch.tensor((top[..., None] == np.arange(e_)).sum((1, 2)) / (s_ * k))
    aux = (e_ * (f * p.mean(1)).sum(-1)).mean()
    ((y * torch.tensor(weight)).sum() + aux).backward()
    return [t.grad.numpy() for t in ts]


# ------------------------------------------------------------------------------ helpers
def _model(k=2, cf=1.0, act="gelu_tanh", e=E):
    ct.manual_seed(0)
    return nn.MoE(D, e, top_k=k, capacity_factor=cf, hidden=F_, activation=act,
                  dtype=ct.float64)


def _inputs():
    rng = np.random.default_rng(1)
    return rng.standard_normal((G, T, D)), rng.standard_normal((G, T, D))


def _step(moe, x, weight, placement=None, x_sbp=None):
    """Forward and backward of ``sum(y * weight) + aux``; the comm logs of both passes."""
    xt = ct.tensor(x, placement=placement, sbp=x_sbp, requires_grad=True) \
        if placement is not None else ct.tensor(x, requires_grad=True)
    wt = ct.tensor(weight, placement=xt.placement, sbp=xt.sbp)
    with ct.debug.comm_log() as forward:
        y = moe(xt)
        loss = (y * wt).sum() + moe.aux_loss
    with ct.debug.comm_log() as backward:
        loss.backward()
    grads = [xt.grad.numpy()] + [p.grad.numpy() for p in
                                 (moe.router.weight, moe.w1, moe.w2)]
    return y.numpy(), float(moe.aux_loss.numpy()), grads, forward, backward


def _params(moe):
    return [p.numpy() for p in (moe.router.weight, moe.w1, moe.w2)]


# -------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("k,act", [(2, "gelu_tanh"), (1, "silu"), (3, "gelu")])
def test_matches_reference(k, act):
    x, weight = _inputs()
    with world(1):
        moe = _model(k=k, act=act)
        y, aux, grads, _, _ = _step(moe, x, weight)
        wr, w1, w2 = _params(moe)
        stats = moe.stats
    y_ref, aux_ref, kept = reference(x, wr, w1, w2, k, 1.0, act)
    np.testing.assert_allclose(y, y_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(aux, aux_ref, rtol=1e-10)
    np.testing.assert_array_equal(stats["tokens_per_expert"], kept)
    assert stats["dropped"] == G * T * k - kept.sum()
    assert stats["drop_rate"] == pytest.approx(stats["dropped"] / (G * T * k))
    assert stats["dropped"] > 0  # the capacity is exercised
    for got, want in zip(grads, torch_grads(x, wr, w1, w2, k, 1.0, act, weight)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def _one_process(x, weight, **kw):
    """The result every layout must give bit for bit: every rank computes everything."""
    moe = _model(**kw)
    return _step(moe, x, weight)[:3]


LAYOUTS = {  # name: (mesh shape, rules, the tokens' SBP, forward collectives besides a2a)
    "ep2": ((2,), dict(mesh_ndim=1, ep_axis=0), (S(0),), []),
    "ep2xtp2": ((2, 2), dict(mesh_ndim=2, ep_axis=0, tp_axis=1), (S(0), B), ["all_reduce"]),
    "dp2xep2": ((2, 2), dict(mesh_ndim=2, ep_axis=1), (S(0), S(0)), []),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layouts_same_bits_one_all_to_all_each_way(name):
    shape, rules, x_sbp, others = LAYOUTS[name]
    x, weight = _inputs()
    with world(math.prod(shape)):
        y0, aux0, grads0 = _one_process(x, weight)
        ranks = np.arange(math.prod(shape)).reshape(shape).tolist()
        mesh = ct.placement("cpu", ranks)
        moe = _model()
        moe.to_global(mesh, nn.parallel.expert_parallel_rules(moe, **rules))
        y, aux, grads, forward, backward = _step(moe, x, weight, mesh, x_sbp)
        stats = moe.stats
    if name == "ep2xtp2":  # the hidden dim's partial sums: reassociated, not the same bits
        np.testing.assert_allclose(y, y0, rtol=1e-12, atol=1e-15)
    else:
        np.testing.assert_array_equal(y, y0)
    assert aux == aux0  # the routing itself is never split
    for got, want in zip(grads, grads0):
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)
    # the dispatch and the combine: one all-to-all each (and their duals in the backward)
    assert forward.collectives().count("all_to_all") == 2, forward.summary()
    assert sorted(c for c in forward.collectives() if c != "all_to_all") == others, \
        forward.summary()
    a2a = [e for e in backward if e.collective == "all_to_all"]
    assert len(a2a) == 2, backward.summary()
    assert {e.mesh_axis for e in a2a} == {0 if name != "dp2xep2" else 1}
    assert stats["tokens_per_expert"].sum() + stats["dropped"] == G * T * 2


def test_fully_shard_keeps_the_experts_split_over_the_data_axis():
    """FSDP on the axis that is also the expert axis: the experts (already S(0) there) stay
    as they are and are never gathered; the router is stored sharded and gathered for its
    forward; values equal one process's, the two all-to-alls unchanged."""
    x, weight = _inputs()
    with world(2):
        y0, aux0, grads0 = _one_process(x, weight)
        mesh = ct.placement("cpu", [0, 1])
        moe = _model()
        moe.to_global(mesh, nn.parallel.expert_parallel_rules(moe, mesh_ndim=1, ep_axis=0))
        nn.fully_shard(moe, mesh, dp_axis=0)
        assert moe.w1.sbp == (S(0),) and moe.w2.sbp == (S(0),)
        assert moe.router.weight.sbp == (S(0),)  # stored sharded by FSDP
        y, aux, grads, forward, backward = _step(moe, x, weight, mesh, (S(0),))
    np.testing.assert_array_equal(y, y0)
    assert aux == aux0
    for got, want in zip(grads, grads0):
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)
    assert forward.collectives().count("all_to_all") == 2, forward.summary()
    gathered = [e for e in forward if e.collective == "all_gather"]
    assert gathered and all(e.shape == tuple(grads0[1].shape) for e in gathered), \
        forward.summary()  # the router's weight only, never an expert's
    assert [e.collective for e in backward].count("all_to_all") == 2, backward.summary()


def test_uneven_experts_over_the_expert_axis_raise():
    """3 experts over 2 ranks: a ValueError naming the fix, on every rank, before any op."""
    x, _ = _inputs()
    with world(2):
        mesh = ct.placement("cpu", [0, 1])
        moe = _model(e=3)
        moe.to_global(mesh, nn.parallel.expert_parallel_rules(moe))
        xt = ct.tensor(x, placement=mesh, sbp=(S(0),))
        with ct.debug.comm_log() as log:
            with pytest.raises(ValueError, match=r"n_experts \(3\) is not a multiple of the "
                                                 r"size \(2\) of mesh axis 0"):
                moe(xt)
    assert log.collectives() == []


def test_two_dim_input_is_one_group():
    x, _ = _inputs()
    with world(1):
        moe = _model()
        y2 = moe(ct.tensor(x[0])).numpy()
        y3 = moe(ct.tensor(x[:1])).numpy()
    np.testing.assert_array_equal(y2, y3[0])


@pytest.mark.skipif(MPI_MODE, reason="argument errors need no ranks")
def test_errors():
    with ct.simulate(1):
        with pytest.raises(ValueError, match="top_k.*only 2 experts"):
            nn.MoE(8, 2, top_k=3)
        with pytest.raises(ValueError, match="capacity_factor"):
            nn.MoE(8, 2, top_k=1, capacity_factor=0)
        with pytest.raises(ValueError, match="activation"):
            nn.MoE(8, 2, activation="tanh")
        moe = nn.MoE(8, 2, top_k=1)
        with pytest.raises(ValueError, match=r"\(batch, time, 8\).*got \(2, 3, 6\)"):
            moe(ct.zeros(2, 3, 6))
        with pytest.raises(TypeError, match="floating"):
            moe(ct.zeros(2, 3, 8, dtype=ct.int64))
        with pytest.raises(ValueError, match="stats are read after a forward"):
            nn.MoE(8, 2).stats


# ------------------------------------------------------------------------------- nn.GPT
def _gpt(**kw):
    ct.manual_seed(0)
    return nn.GPT(16, 8, 2, 2, 8, dropout=0.1, dtype=ct.float64, moe_experts=4,
                  moe_capacity_factor=1.0, **kw)


def _gpt_step(model, placement=None, sbp=None, extra_aux=False):
    ids = np.arange(32).reshape(4, 8) * 7 % 16
    idx = ct.tensor(ids, placement=placement, sbp=sbp) if placement is not None \
        else ct.tensor(ids)
    ct.manual_seed(1)  # the dropout masks
    _, loss = model(idx, idx)
    if extra_aux:  # the aux loss added to the loss by hand instead of attached
        loss = loss + sum(0.01 * m.aux_loss for m in model.moe_layers())
    loss.backward()
    return float(loss.numpy()), {n: p.grad.numpy() for n, p in model.named_parameters()}


def test_gpt_aux_loss_attached_recompute_and_expert_parallel():
    """The aux loss's gradient carried by the blocks' outputs equals adding it to the loss;
    recompute and EP 2 (dropout on) give the one-process loss and gradients."""
    with world(2):
        loss, grads = _gpt_step(_gpt())
        manual = _gpt_step(_gpt(moe_aux_loss_coef=0.0), extra_aux=True)
        recomputed = _gpt_step(_gpt(recompute=True))
        mesh = ct.placement("cpu", [0, 1])
        model = _gpt()
        model.to_global(mesh, nn.parallel.expert_parallel_rules(model))
        assert [m.w1.sbp for m in model.moe_layers()] == [(S(0),)] * 2
        parallel = _gpt_step(model, mesh, (S(0),))
    assert manual[0] == pytest.approx(loss, rel=1e-14)
    assert recomputed[0] == loss and parallel[0] == pytest.approx(loss, rel=1e-13)
    # (gradients: sums over the batch and of the aux term in another order, ~1e-16)
    for name, g in grads.items():
        np.testing.assert_allclose(manual[1][name], g, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(recomputed[1][name], g, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(parallel[1][name], g, rtol=1e-12, atol=1e-15)
    assert np.abs(grads["blocks.0.mlp.router.weight"]).max() > 0


def test_a_size_one_mesh_axis_changes_by_relabel():
    """(1, 2, 2) meshes (train.py's (dp / ep, ep, tp) with dp = ep): S(0) <-> B on the size-1
    axis under a split of dim 0 on the next one is a relabel, not an unwound split; an MoE
    layer's backward there runs only its two all-to-alls and the gradient reductions."""
    x_value, weight = _inputs()
    with world(4):
        mesh = ct.placement("cpu", [[[0, 1], [2, 3]]])
        x = ct.tensor(x_value, placement=mesh, sbp=(S(0), S(0), B))
        with ct.debug.comm_log() as log:
            y = x.to_global(sbp=(B, S(0), B))
        assert log.collectives() == []
        np.testing.assert_array_equal(y.numpy(), x_value)
        moe = _model()
        moe.to_global(mesh, nn.parallel.expert_parallel_rules(moe, 3, ep_axis=1, tp_axis=2))
        _, _, _, forward, backward = _step(moe, x_value, weight, mesh, (S(0), S(0), B))
    assert forward.collectives().count("all_to_all") == 2, forward.summary()
    assert sorted(backward.collectives()) == ["all_reduce"] * 2 + ["all_to_all"] * 2, \
        backward.summary()
