"""Communication plans as good as hand-placed ones, counted with ``ct.debug.comm_log()`` over
one forward + backward and checked against the published formulas:

* the Megatron MLP (Shoeybi et al. 2019): one all-reduce of (T, H) forward, none backward
  (two when the input needs a gradient), weight gradients local;
* GPT tensor parallel: ``4L + 2`` all-reduces of (b, s, h) — two per layer forward, two
  backward, and the embedding's and the head's — plus the vocabulary-parallel cross
  entropy's small ones, plus one small bucket (LayerNorm and bias gradients);
* GPT data parallel: one bucketed all-reduce of every gradient, nothing per parameter;
* 2-D: both together;
* sequence parallel (Korthikanti et al. 2022): ``6L + 3`` all-gathers and ``4L + 2``
  reduce-scatters of (b, s, h) — per layer two of each forward and their duals backward,
  the embedding's reduce-scatter and the head's all-gather with their backwards, and the
  backward's re-gather of each gathered linear input (``2L + 1``: what a block keeps is
  the sequence shard) — and no large all-reduce; ``4L + 2`` of each when the gathered
  copies are kept instead (``regather=False``), which keeps exactly those copies' bytes
  more between forward and backward.

Values and gradients equal one rank in float64. Sizes are small, yet chosen so that no two
different tensors share a shape (a gradient's shape is how the engine tells it apart).
"""
from __future__ import annotations

import numpy as np
import pytest

import ctensor as ct
import ctensor.nn as nn
import ctensor.nn.functional as F
from conftest import MPI_MODE

S0, S1, B = ct.sbp.split(0), ct.sbp.split(1), ct.sbp.broadcast
LAYERS, HIDDEN, HEADS, SEQ, BATCH, VOCAB = 2, 32, 2, 16, 4, 4096
ACTIVATION = (BATCH, SEQ, HIDDEN)


def _world(n):
    if MPI_MODE:
        if ct.world_size() != n:
            pytest.skip(f"needs exactly {n} ranks")
        import contextlib
        return contextlib.nullcontext()
    return ct.simulate(n)


def _collectives(log, kind=None, shape=None):
    return [e for e in log if e.collective not in ("slice", "pad_partial", "relabel")
            and (kind is None or e.collective == kind)
            and (shape is None or tuple(e.shape) == shape)]


# ----------------------------------------------------------------------------- MLP
@pytest.mark.parametrize("input_grad", [False, True], ids=["x-const", "x-grad"])
def test_megatron_mlp_needs_one_all_reduce(input_grad):
    T, H = 64, 32
    rng = np.random.default_rng(0)
    xv, w1v, w2v = (rng.standard_normal((T, H)), rng.standard_normal((4 * H, H)),
                    rng.standard_normal((H, 4 * H)))
    with _world(2):
        p = ct.placement("cpu", [0, 1])
        x = ct.tensor(xv, placement=p, sbp=B, requires_grad=input_grad)
        w1 = ct.tensor(w1v, placement=p, sbp=S0, requires_grad=True)
        w2 = ct.tensor(w2v, placement=p, sbp=S1, requires_grad=True)
        with ct.debug.comm_log() as log:
            y = F.linear(F.relu(F.linear(x, w1)), w2)
            loss = (y * y).mean()
            loss.backward()
        assert [e.collective for e in _collectives(log)] == ["all_reduce"] * (1 + input_grad)
        # the forward's (T, H); x's gradient, a leaf's, is reduced in its bucket (flat)
        assert [tuple(e.shape) for e in _collectives(log)] == [(T, H), (T * H,)][:1 + input_grad]
        assert w1.grad.sbp == (S0,) and w2.grad.sbp == (S1,)
        h = np.maximum(xv @ w1v.T, 0)
        yv = h @ w2v.T
        gy = 2 * yv / yv.size
        np.testing.assert_allclose(loss.numpy(), np.mean(yv * yv), rtol=1e-12)
        np.testing.assert_allclose(w2.grad.numpy(), gy.T @ h, rtol=1e-10)
        np.testing.assert_allclose(w1.grad.numpy(), ((gy @ w2v) * (h > 0)).T @ xv, rtol=1e-10)


# ----------------------------------------------------------------------------- GPT
def _gpt_step(dp, tp, sequence_parallel=False, dropout=0.0, regather=True, memory=None):
    """One forward + backward of the GPT, laid out (dp, tp); returns the loss, every
    gradient as NumPy and the communication log (``memory``, a dict: gets the activation
    bytes rank 0 holds between the forward and the backward)."""
    n = dp * tp
    with _world(n), ct.debug.track_memory():
        ct.manual_seed(0)
        model = nn.GPT(VOCAB, SEQ, LAYERS, HEADS, HIDDEN, dropout=dropout, tie_weights=False,
                       dtype=np.float64)
        mesh = ct.placement("cpu", np.arange(n).reshape(dp, tp).tolist())
        nn.parallel.hybrid_parallel(model, mesh)
        if sequence_parallel:
            nn.parallel.sequence_parallel(model, 1, regather=regather)
        rng = np.random.default_rng(1)
        ids = ct.tensor(rng.integers(0, VOCAB, (BATCH, SEQ)), placement=mesh, sbp=(S0, B))
        target = ct.tensor(rng.integers(0, VOCAB, (BATCH, SEQ)), placement=mesh, sbp=(S0, B))
        with ct.debug.comm_log() as log:
            _, loss = model(ids, target)
            if memory is not None and ct.rank() == 0:
                memory["activations"] = ct.debug.memory(0).current["activations"]
            loss.backward()
        grads = {name: p.grad.numpy() for name, p in model.named_parameters()}
        return float(loss.item()), grads, log


@pytest.fixture(scope="module")
def one_rank():
    if MPI_MODE:
        pytest.skip("the one-rank reference runs in simulation")
    return _gpt_step(1, 1)


def _same_as_one_rank(result, reference):
    loss, grads, _ = result
    ref_loss, ref_grads, _ = reference
    assert abs(loss - ref_loss) <= 1e-10 * abs(ref_loss)
    for name, g in grads.items():
        np.testing.assert_allclose(g, ref_grads[name], rtol=1e-10, atol=1e-12, err_msg=name)


def _small(e) -> bool:
    """The cross entropy's row statistics and the like: far below one activation."""
    return np.prod(e.shape) <= BATCH * SEQ


def test_gpt_tensor_parallel_is_megatron(one_rank):
    result = _gpt_step(1, 2)
    log = result[2]
    activations = _collectives(log, "all_reduce", ACTIVATION)
    assert len(activations) == 4 * LAYERS + 2, log.summary()
    buckets = [e for e in _collectives(log) if e.op == "grad_sync"]
    assert len(buckets) == 1  # LayerNorm and row-parallel bias gradients, in one bucket
    rest = [e for e in _collectives(log) if e not in activations and e not in buckets]
    assert rest and all(_small(e) for e in rest), log.summary()  # the cross entropy's
    _same_as_one_rank(result, one_rank)


def test_gpt_data_parallel_is_one_bucket(one_rank):
    result = _gpt_step(2, 1)
    log = result[2]
    buckets = [e for e in _collectives(log) if e.op == "grad_sync"]
    assert len(buckets) == 1, log.summary()
    n_params = sum(np.prod(g.shape) for g in result[1].values())
    assert buckets[0].shape == (n_params,)  # every gradient, flattened into one collective
    rest = [e for e in _collectives(log) if e not in buckets]
    # the loss's token count, no more: its division's backward computes no gradient for the
    # count (which needs none), so no second scalar all-reduce
    assert len(rest) == 1 and _small(rest[0]), log.summary()
    _same_as_one_rank(result, one_rank)


def test_gpt_two_d_is_both_together(one_rank):
    result = _gpt_step(2, 2)
    log = result[2]
    activations = _collectives(log, "all_reduce", ACTIVATION)
    assert len(activations) == 4 * LAYERS + 2, log.summary()
    assert all(e.mesh_axis == 1 for e in activations)  # on the tensor-parallel axis
    buckets = [e for e in _collectives(log) if e.op == "grad_sync"]
    assert 1 <= len(buckets) <= 2, log.summary()  # (tp-split and replicated parameters)
    rest = [e for e in _collectives(log) if e not in activations and e not in buckets]
    assert all(_small(e) for e in rest), log.summary()
    _same_as_one_rank(result, one_rank)


@pytest.mark.parametrize("dp", [1, 2], ids=["1x2", "2x2"])
def test_gpt_sequence_parallel_is_megatron_sp(one_rank, dp):
    _check_sequence_parallel(_gpt_step(dp, 2, sequence_parallel=True), one_rank)


def test_gpt_sequence_parallel_with_dropout_is_megatron_sp():
    # the residual dropouts run on sequence shards after the reduce-scatter (not on the
    # partial sums, which an all-reduce would make whole); masks do not depend on the
    # layout, so the values are one rank's with the same dropout
    if MPI_MODE:
        pytest.skip("the one-rank reference runs in simulation")
    _check_sequence_parallel(_gpt_step(1, 2, sequence_parallel=True, dropout=0.1),
                             _gpt_step(1, 1, dropout=0.1))


def test_sequence_parallel_regather_trades_one_gather_for_the_copy(one_rank):
    # keeping the gathered copies instead: two fewer all-gathers per layer (and the
    # head's), and exactly those copies' bytes more held from forward to backward
    kept, regathered = {}, {}
    result = _gpt_step(1, 2, sequence_parallel=True, regather=False, memory=kept)
    _check_sequence_parallel(result, one_rank, regather=False)
    _gpt_step(1, 2, sequence_parallel=True, memory=regathered)
    if ct.rank() == 0 or not MPI_MODE:
        copy = np.prod(ACTIVATION) * 8 // 2  # a gathered copy less the shard kept instead
        saved = kept["activations"] - regathered["activations"]  # (and a few scalars)
        assert saved == pytest.approx((2 * LAYERS + 1) * copy, rel=0.01)


def test_sequence_parallel_refuses_a_non_bool_regather_and_a_second_layout():
    with pytest.raises(TypeError, match="regather"):
        nn.parallel.sequence_parallel(nn.GPT(16, 8, 1, 2, 8), regather="yes")
    model = nn.GPT(16, 8, 1, 2, 8)
    nn.parallel.sequence_parallel(model)
    nn.parallel.sequence_parallel(model)  # the same again: nothing changes
    with pytest.raises(ValueError, match="already laid out.*lay the model out once"):
        nn.parallel.sequence_parallel(model, regather=False)


def _check_sequence_parallel(result, reference, regather=True):
    log = result[2]
    gathers = _collectives(log, "all_gather", ACTIVATION)
    scatters = _collectives(log, "reduce_scatter", ACTIVATION)
    assert len(scatters) == 4 * LAYERS + 2, log.summary()
    assert len(gathers) == (6 * LAYERS + 3 if regather else 4 * LAYERS + 2), log.summary()
    large = [e for e in _collectives(log, "all_reduce") if e.op != "grad_sync"
             and not _small(e)]
    assert not large, log.summary()
    buckets = [e for e in _collectives(log) if e.op == "grad_sync"]
    assert 1 <= len(buckets) <= 2
    _same_as_one_rank(result, reference)
