"""End-to-end: the same training run in every layout gives the same numbers.

A small MLP and a tiny GPT train for 20 steps with AdamW, dropout, gradient clipping and a
warm-up cosine schedule. Single rank (a one-rank simulation, also under mpiexec), data
parallel on 2 ranks (batch S(0)), tensor parallel on 2 ranks (Megatron rules), and 2-D on a
2x2 (dp, tp) mesh -- with and without ZeRO-1 state sharding -- must give the same loss at
every step (1e-9 relative in float64, 1e-5 in float32) and the same final weights. The
models contain no communication code: only the layouts differ.
"""
import contextlib

import numpy as np
import pytest

import ctensor as ct
import ctensor.nn as nn
import ctensor.optim as optim
from conftest import MPI_MODE

STEPS = 20
RNG = np.random.default_rng(2024)
MLP_X = RNG.standard_normal((8, 8))
MLP_Y = RNG.standard_normal((8, 4))
TOKENS = RNG.integers(0, 16, size=(4, 9))
TOL = {np.float64: dict(loss=1e-9, weight=1e-9, atol=1e-12),
       np.float32: dict(loss=1e-5, weight=1e-4, atol=1e-5)}


@contextlib.contextmanager
def world_of(n: int):
    """A world of ``n`` ranks: simulated, or the real one under mpiexec (skipped if smaller)."""
    if not MPI_MODE:
        with ct.simulate(n):
            yield
    elif ct.world_size() < n:
        pytest.skip(f"needs {n} ranks, the world has {ct.world_size()}")
    else:
        yield


def make_model(kind: str, dtype):
    if kind == "mlp":
        return nn.Sequential(nn.Linear(8, 32, dtype=dtype), nn.GELU(), nn.Dropout(0.1),
                             nn.Linear(32, 4, dtype=dtype))
    return nn.GPT(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=16, dropout=0.1,
                  dtype=dtype)


def lay_out(model, layout: str):
    """Apply ``layout``; return (placement, batch SBP)."""
    if layout == "single":
        mesh = ct.placement("cpu", [0])
        return mesh, (ct.sbp.broadcast,)
    if layout == "dp2":
        mesh = ct.placement("cpu", [0, 1])
        nn.parallel.data_parallel(model, mesh)
        return mesh, (ct.sbp.split(0),)
    if layout == "tp2":
        mesh = ct.placement("cpu", [0, 1])
        nn.parallel.tensor_parallel(model, mesh)
        return mesh, (ct.sbp.broadcast,)
    mesh = ct.placement("cpu", [[0, 1], [2, 3]])
    nn.parallel.hybrid_parallel(model, mesh)
    return mesh, nn.parallel.batch_sbp(mesh)


def train(kind: str, layout: str, dtype, zero: bool = False):
    ct.manual_seed(0)
    model = make_model(kind, dtype)
    mesh, batch = lay_out(model, layout)
    opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1,
                      shard_states_along=0 if zero else None)
    sched = optim.cosine_with_warmup(opt, warmup_steps=3, total_steps=STEPS)
    if kind == "mlp":
        inputs = ct.tensor(MLP_X, placement=mesh, sbp=batch, dtype=dtype)
        target = ct.tensor(MLP_Y, placement=mesh, sbp=batch, dtype=dtype)
    else:
        inputs = ct.tensor(TOKENS[:, :-1], placement=mesh, sbp=batch)
        target = ct.tensor(TOKENS[:, 1:], placement=mesh, sbp=batch)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        if kind == "mlp":
            loss = ((model(inputs) - target) ** 2).mean()
        else:
            _, loss = model(inputs, target)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        opt.step()
        sched.step()
        losses.append(float(loss))
    weights = {k: v.numpy() for k, v in model.state_dict().items()}
    return np.array(losses), weights, model


_REFERENCE: dict = {}


def reference(kind: str, dtype):
    """The single-rank run (a one-rank simulation, the same on every MPI process)."""
    key = (kind, np.dtype(dtype).name)
    if key not in _REFERENCE:
        with ct.simulate(1):
            _REFERENCE[key] = train(kind, "single", dtype)[:2]
    return _REFERENCE[key]


CASES = [("dp2", False), ("tp2", False), ("dp2xtp2", False), ("dp2", True), ("dp2xtp2", True)]


@pytest.mark.parametrize("layout,zero", CASES, ids=[f"{l}{'-zero' if z else ''}"
                                                    for l, z in CASES])
@pytest.mark.parametrize("kind", ["mlp", "gpt"])
def test_same_training_in_every_layout_float64(kind, layout, zero):
    ref_losses, ref_weights = reference(kind, np.float64)
    assert ref_losses[-1] < ref_losses[0]                 # it does learn
    with world_of(4 if layout == "dp2xtp2" else 2):
        losses, weights, model = train(kind, layout, np.float64, zero)
        if layout == "tp2" and kind == "gpt":             # the layout really is parallel
            assert model.blocks[0].attn.query.weight.sbp == (ct.sbp.split(0),)
            assert model.wte.weight.sbp == (ct.sbp.split(0),)
    tol = TOL[np.float64]
    np.testing.assert_allclose(losses, ref_losses, rtol=tol["loss"], atol=0)
    for name, w in ref_weights.items():
        np.testing.assert_allclose(weights[name], w, rtol=tol["weight"], atol=tol["atol"],
                                   err_msg=name)


@pytest.mark.parametrize("layout", ["tp2", "dp2xtp2"])
def test_same_training_in_float32(layout):
    ref_losses, ref_weights = reference("gpt", np.float32)
    with world_of(4 if layout == "dp2xtp2" else 2):
        losses, weights, model = train("gpt", layout, np.float32)
    assert all(p.dtype == np.float32 for p in model.parameters())
    tol = TOL[np.float32]
    np.testing.assert_allclose(losses, ref_losses, rtol=tol["loss"], atol=0)
    for name, w in ref_weights.items():
        if name.endswith("attn.key.bias"):
            # softmax is shift-invariant per query, so q.(k + b) has a zero gradient in b in
            # exact arithmetic: Adam (eps 1e-8) turns float32 rounding noise of any layout
            # into steps of its own. The bias stays tiny and never changes the loss.
            assert np.abs(weights[name]).max() < 1e-3 and np.abs(w).max() < 1e-3
            continue
        np.testing.assert_allclose(weights[name], w, rtol=tol["weight"], atol=tol["atol"],
                                   err_msg=name)
