"""Context parallelism: ``ct.attention`` with q, k, v split on the sequence (the ring, its
reversed backward, the zig-zag load balance, Ulysses and the gather as the cost model's
other choices) equals one rank, forward and backward, in simulation and under mpiexec.

Values against a NumPy reference (float64, 1e-10). Inputs are leaves that require grad,
so the choice keeps them where they are laid out (the ring) unless a test says otherwise.
"""
from __future__ import annotations

import numpy as np
import pytest

import ctensor as ct
from conftest import MPI_MODE, mesh_ranks, world
from ctensor.ops.attention import zigzag_index  # (ct.zigzag_index)

TOL = dict(rtol=1e-10, atol=1e-10)


def _reference(q, k, v, g, causal, pos=None):
    """NumPy attention and its gradients for the output gradient ``g``."""
    scale = 1.0 / np.sqrt(q.shape[-1])
    s = q @ k.swapaxes(-1, -2) * scale
    if causal:
        pq = np.arange(q.shape[-2]) if pos is None else pos
        s = np.where(pq[None, :] > pq[:, None], -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = p @ v
    dv = p.swapaxes(-1, -2) @ g
    dp = g @ v.swapaxes(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    return out, ds @ k * scale, ds.swapaxes(-1, -2) @ q * scale, dv


def _arrays(shape, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) for _ in range(4)]


def _run(placement, sbp, arrays, causal, zigzag=0, scheme=None):
    q, k, v, g = [ct.tensor(a, placement=placement, sbp=sbp) for a in arrays]
    for t in (q, k, v):
        t.requires_grad_()
    with ct.debug.comm_log() as fwd:
        y = ct.attention(q, k, v, causal=causal, zigzag=zigzag, cp_scheme=scheme)
    with ct.debug.comm_log() as bwd:
        (y * g).sum().backward()
    return y, (q.grad, k.grad, v.grad), fwd, bwd


def _ops(log, collective="send_recv"):
    return [e.op for e in log if e.collective == collective]


def _check_sequence_split(y, grads, ref) -> None:
    """The output and q, k, v's gradients split on the sequence, with one rank's values."""
    assert y.sbp == (ct.sbp.split(2),)
    np.testing.assert_allclose(y.numpy(), ref[0], **TOL)
    for got, want in zip(grads, ref[1:]):
        assert got.sbp == (ct.sbp.split(2),)
        np.testing.assert_allclose(got.numpy(), want, **TOL)


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_ring_equals_one_rank(cp, causal):
    """An uneven sequence split (13 over 2 and 4 ranks): the ring's cp - 1 key/value
    transfers forward; backward cp - 1 back round, each the block with its gradient
    accumulators in one message (the last one home); values and gradients those of one
    rank."""
    arrays = _arrays((2, 3, 13, 4))
    ref = _reference(*arrays, causal)
    with world(cp):
        p = ct.placement("cpu", list(range(cp)))
        y, grads, fwd, bwd = _run(p, ct.sbp.split(2), arrays, causal, scheme="ring")
        _check_sequence_split(y, grads, ref)
    assert fwd.collectives() == ["send_recv"] * (cp - 1)
    assert _ops(fwd) == ["attention"] * (cp - 1)
    assert bwd.collectives() == ["send_recv"] * (cp - 1)
    assert _ops(bwd) == ["attention.grad"] * (cp - 1)


@pytest.mark.parametrize("cp", [2, 4])
def test_zigzag_balances_causal_work(cp):
    """The sequence stored in zig-zag order (``ct.zigzag_index``) with ``zigzag=cp``: the
    same attention as the natural order, permuted; every rank computes the same number
    of (query, key) pairs."""
    t = 8 * cp
    arrays = _arrays((1, 2, t, 4), seed=1)
    idx = zigzag_index(t, cp)
    ref = _reference(*[a[:, :, idx] for a in arrays], True, pos=idx)
    natural = _reference(*arrays, True)
    np.testing.assert_allclose(ref[0], natural[0][:, :, idx], **TOL)
    with world(cp):
        p = ct.placement("cpu", list(range(cp)))
        y, grads, _, _ = _run(p, ct.sbp.split(2), [a[:, :, idx] for a in arrays], True,
                              zigzag=cp, scheme="ring")
        np.testing.assert_allclose(y.numpy(), ref[0], **TOL)
        for got, want in zip(grads, ref[1:]):
            np.testing.assert_allclose(got.numpy(), want, **TOL)
    # the work per rank: visible (query, key) pairs of its queries against every block
    part = t // cp
    work = [int(np.sum(idx[None, :] <= idx[r * part:(r + 1) * part, None]))
            for r in range(cp)]
    assert len(set(work)) == 1, work


@pytest.mark.parametrize("sbp", [(ct.sbp.split(0), ct.sbp.split(2)),
                                 (ct.sbp.split(2), ct.sbp.split(1)),
                                 (ct.sbp.split(2), ct.sbp.split(2))])
def test_ring_on_one_axis_of_a_2x2_mesh(sbp):
    """cp on one axis of a 2 x 2 mesh, batch or heads (or the sequence again) on the
    other."""
    arrays = _arrays((2, 2, 11, 3), seed=2)
    ref = _reference(*arrays, True)
    with world(4):
        p = ct.placement("cpu", mesh_ranks((2, 2)))
        y, grads, fwd, bwd = _run(p, sbp, arrays, True, scheme="ring")
        np.testing.assert_allclose(y.numpy(), ref[0], **TOL)
        for got, want in zip(grads, ref[1:]):
            np.testing.assert_allclose(got.numpy(), want, **TOL)
    ring_axis = next(a for a, e in enumerate(sbp) if e == ct.sbp.split(2))
    for log in (fwd, bwd):  # cp - 1 hops each way, on the ring's axis
        assert all(e.mesh_axis == ring_axis for e in log if e.collective == "send_recv")
        assert log.collectives().count("send_recv") == 1


def _dropout_run(placement, sbp, scheme):
    """Causal attention with dropout 0.3 (seed 7) forward and backward: the fused op under
    ``scheme`` (``cp_scheme``), or with ``scheme=None`` the composite (a mask keeps it:
    softmax, ``F.dropout`` of the probabilities, matmul). ``(output and q, k, v's
    gradients, the backward's comm log)``."""
    from ctensor.nn import functional as F
    arrays = _arrays((2, 2, 11, 3), seed=5)
    q, k, v, g = [ct.tensor(a, placement=placement, sbp=sbp) for a in arrays]
    for t in (q, k, v):
        t.requires_grad_()
    ct.manual_seed(7)
    if scheme is not None:
        y = ct.attention(q, k, v, causal=True, dropout=0.3, cp_scheme=scheme)
    else:
        mask = ct.tril(ct.ones(11, 11, dtype=ct.bool, placement=placement))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.3)
    with ct.debug.comm_log() as log:
        (y * g).sum().backward()
    return [y.numpy()] + [t.grad.numpy() for t in (q, k, v)], log


@pytest.mark.parametrize("cp", [2, 4])
def test_dropout_in_the_ring_draws_the_composites_bits(cp):
    """``ct.attention(..., dropout=p)`` (what F.scaled_dot_product_attention calls) under
    the ring equals the composite on one rank — softmax, ``F.dropout`` (``ct.rand_like`` of
    the probabilities), matmul — with the same seed, forward and backward: the mask is
    drawn by logical position, block by block."""
    with world(cp):
        want, _ = _dropout_run(ct.placement("cpu", [0]), ct.sbp.broadcast, None)
        got, log = _dropout_run(ct.placement("cpu", list(range(cp))), ct.sbp.split(2), "ring")
    assert log.collectives().count("send_recv") == cp - 1
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, **TOL)


def test_cost_model_picks_ring_ulysses_or_gather():
    """Activations (not pinned) split on the sequence: short sequences gather; long ones on
    a CPU run as a ring where every rank does the same work (not causal, or causal in the
    zig-zag order: the block's compute hides the transfer) and as Ulysses' two all-to-alls
    when causal in the natural order (there the ring's last rank sees every earlier block
    whole, Ulysses' ranks the causal average); many heads on a GPU go Ulysses (it moves
    less than the ring for cp > 2)."""
    def picked(t, heads, device, cp=4, causal=True, zigzag=0):
        with ct.simulate(cp, meta=True):
            p = ct.placement(device, list(range(cp)))
            q, k, v = [ct.randn(1, heads, t, 64, placement=p, sbp=ct.sbp.split(2),
                                requires_grad=True) * 1.0 for _ in range(3)]
            with ct.debug.comm_log() as log:
                ct.attention(q, k, v, causal=causal, zigzag=zigzag)
        return log

    assert set(picked(64, 2, "cpu").collectives()) == {"all_gather"}
    assert picked(4096, 32, "cpu", zigzag=4).collectives() == ["send_recv"] * 3
    assert picked(4096, 32, "cpu", causal=False).collectives() == ["send_recv"] * 3
    assert picked(4096, 32, "cpu").collectives() == ["all_to_all"] * 2
    assert picked(4096, 2, "cpu", cp=2).collectives() == ["all_to_all"] * 2
    log = picked(4096, 32, "cuda")
    assert log.collectives() == ["all_to_all"] * 2
    block = 32 * 1024 * 64 * 4  # one rank's q (float32)
    assert [e.nbytes for e in log] == [3 * block, block * 65 // 64]  # q, k, v; out, lse


def test_ring_memory_at_cp4():
    """Shape-only, seq 1024: the attention core's activations per rank at CP 4 under the
    ring (forward and backward: output, log-sum-exp, gradients) are at most 0.3x the ring's
    on one rank; the composite that materialises the scores holds far more. (Ulysses, which the
    cost model takes for causal attention in the natural order, holds ~0.54x: its packed
    q, k, v and output.)"""
    def peak(cp, fused=True, scheme=None):
        with ct.simulate(cp, meta=True):
            p = ct.placement("cpu", list(range(cp)))
            q, k, v = [ct.randn(1, 4, 1024, 16, placement=p, sbp=ct.sbp.split(2),
                                requires_grad=True) for _ in range(3)]
            with ct.debug.track_memory():
                ct.debug.reset_peak_memory()
                base = ct.debug.memory(0).current_total
                if fused:
                    y = ct.attention(q, k, v, causal=True, cp_scheme=scheme)
                else:
                    s = ct.softmax(ct.causal_fill(ct.linear(q, k) * 0.25, float("-inf")), -1)
                    y = s @ v
                y.sum().backward()
                return ct.debug.memory(0).peak["activations"] - base
    one, ring, composite = peak(1, scheme="ring"), peak(4, scheme="ring"), peak(1, fused=False)
    print(f"activations per rank: one rank {one} B, CP 4 {ring} B ({ring / one:.3f}x), "
          f"the composite on one rank {composite} B")
    assert ring <= 0.3 * one, (ring, one)
    assert peak(4, scheme="ulysses") <= 0.6 * one  # (0.54x: its packed copies)
    assert one < composite / 4, (one, composite)
    # on one rank the choice runs the fused kernel, not the ring (a composite brings nothing
    # on an axis of one rank), and it holds less (0.84x: no kept block)
    assert peak(1) < one


def test_bad_input_is_refused_before_communicating():
    with world(2):
        p = ct.placement("cpu", [0, 1])
        q = ct.randn(1, 2, 8, 4, placement=p, sbp=ct.sbp.split(2))
        with pytest.raises(ValueError, match="attention: shapes query"):
            ct.attention(q, ct.randn(1, 2, 8, 3, placement=p), q)
        with pytest.raises(ValueError, match="attention: shapes query"):
            ct.attention(q, q, ct.randn(1, 2, 7, 4, placement=p))
        with pytest.raises(TypeError, match="one dtype"):
            ct.attention(q, q, q.to(ct.float64))
        with pytest.raises(ValueError, match="zigzag=2 needs"):
            ct.attention(q[:, :, :6], q[:, :, :6], q[:, :, :6], zigzag=2)
        with pytest.raises(ValueError, match="different placements"):
            ct.attention(q, ct.randn(1, 2, 8, 4, placement=ct.placement("cpu", [0])), q)
        with pytest.raises(TypeError, match="causal"):
            ct.attention(q, q, q, causal="yes")
        with pytest.raises(ValueError, match="'cp_scheme' must be None"):
            ct.attention(q, q, q, cp_scheme="p2p")
        with ct.debug.comm_log() as log:  # (cross-attention: queries and keys differ)
            with pytest.raises(ValueError, match="cp_scheme='ulysses' needs"):
                kv = ct.randn(1, 2, 6, 4, placement=p, sbp=ct.sbp.split(2))
                ct.attention(q, kv, kv, cp_scheme="ulysses")
        assert log.collectives() == []


@pytest.mark.skipif(MPI_MODE, reason="one process: torch as the peer")
def test_sdpa_routes_to_the_fused_core():
    """F.scaled_dot_product_attention without mask or dropout is ct.attention (GQA's
    repeated heads too); with dropout it keeps the composite."""
    from ctensor.nn import functional as F
    arrays = _arrays((1, 4, 9, 4), seed=3)
    ref = _reference(*arrays, True)
    with ct.simulate(2):
        p = ct.placement("cpu", [0, 1])
        q, k, v = [ct.tensor(a, placement=p, sbp=ct.sbp.split(2)) for a in arrays[:3]]
        with ct.debug.comm_log() as log:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        np.testing.assert_allclose(y.numpy(), ref[0], **TOL)
        assert {e.op for e in log} <= {"attention"}
        kv = ct.tensor(arrays[1][:, :2], placement=p, sbp=ct.sbp.split(2))
        y = F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
        rep = np.repeat(arrays[1][:, :2], 2, axis=1)
        want = _reference(arrays[0], rep, rep, arrays[3], True)[0]
        np.testing.assert_allclose(y.numpy(), want, **TOL)


# ----------------------------------------------------------------------------- GPT --cp
_TINY = ["--layers", "2", "--hidden", "16", "--heads", "2", "--seq-len", "8",
         "--global-batch", "4", "--micro-batches", "2", "--steps", "3", "--dtype", "float64",
         "--no-progress", "--lr", "1e-2"]


@pytest.fixture(scope="module")
def gpt_train():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "examples" / "gpt" / "train.py"
    spec = importlib.util.spec_from_file_location("gpt_train_cp", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_SELECTIVE_FSDP = ("--recompute", "selective", "--fsdp")
_REFERENCE: dict = {}


@pytest.mark.parametrize("layout, dropout", [
    (("--cp", "2"), "0"), (("--cp", "2"), "0.1"), (("--dp", "2", "--cp", "2"), "0.1"),
    (("--cp", "2", "--tp", "2"), "0"), (("--dp", "2", "--cp", "2") + _SELECTIVE_FSDP, "0"),
    (("--cp", "2", "--pp", "2"), "0.1"), (("--cp", "2", "--tp", "2", "--sp"), "0.1")],
    ids=["cp2", "cp2-dropout", "dp2xcp2-dropout", "cp2xtp2", "dp2xcp2-recompute-fsdp",
         "cp2xpp2-dropout", "cp2xtp2-sp-dropout"])
def test_gpt_cp_gives_the_loss_curve_of_one_process(gpt_train, layout, dropout):
    """examples/gpt/train.py --cp: the sequence split on a mesh axis of its own, the
    parameters broadcast on it (their gradients reduced over it and the data axis): the
    loss curve of one process (float64; the attention's dropout draws one process's mask
    inside the ring); with selective recompute and FSDP on the data axis too, with
    pipeline stages (the sequence-split activations sent between them), and with sequence
    parallel on the tensor axis (the residual stream's sequence split on both axes)."""
    sizes = [int(layout[i + 1]) for i, w in enumerate(layout)
             if w in ("--dp", "--cp", "--tp", "--pp")]
    size = int(np.prod(sizes))
    args = _TINY + ["--dropout", dropout] + list(layout)
    if dropout not in _REFERENCE:  # (one process's curve, once per dropout)
        _REFERENCE[dropout] = gpt_train.run(_TINY + ["--dropout", dropout, "--simulate", "1"])
    reference = _REFERENCE[dropout]
    if MPI_MODE:
        if ct.world_size() != size:
            pytest.skip(f"needs exactly {size} ranks")
        history = gpt_train.run(args)
    else:
        history = gpt_train.run(args + ["--simulate", str(size)])
    np.testing.assert_allclose(history, reference, rtol=1e-9, atol=0)


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_ulysses_equals_one_rank(cp, causal):
    """Ulysses: q, k, v packed go S(2) -> S(1) in one all-to-all, the output (with its
    log-sum-exp) comes back in one more; the backward has the duals, the output's gradient
    in and dq, dk, dv packed back: two all-to-alls each way. Uneven splits (10 positions
    and 3 heads over 4 ranks)."""
    arrays = _arrays((2, 3, 10, 3), seed=4)
    ref = _reference(*arrays, causal)
    with world(cp):
        p = ct.placement("cpu", list(range(cp)))
        y, grads, fwd, bwd = _run(p, ct.sbp.split(2), arrays, causal, scheme="ulysses")
        _check_sequence_split(y, grads, ref)
    assert fwd.collectives() == ["all_to_all"] * 2
    assert _ops(fwd, "all_to_all") == ["attention"] * 2
    assert bwd.collectives() == ["all_to_all"] * 2
    assert _ops(bwd, "all_to_all") == ["attention.grad"] * 2


@pytest.mark.parametrize("sbp", [(ct.sbp.split(2), ct.sbp.split(0)),
                                 (ct.sbp.split(0), ct.sbp.split(2))])
def test_ulysses_on_one_axis_of_a_2x2_mesh(sbp):
    """Ulysses on one axis of a 2 x 2 mesh, the batch split on the other; zig-zag order
    too (the head split leaves every rank the whole sequence, masked by true
    positions)."""
    t = 12
    idx = zigzag_index(t, 2)
    arrays = [a[:, :, idx] for a in _arrays((2, 2, t, 3), seed=6)]
    ref = _reference(*arrays, True, pos=idx)
    with world(4):
        p = ct.placement("cpu", mesh_ranks((2, 2)))
        y, grads, fwd, bwd = _run(p, sbp, arrays, True, zigzag=2, scheme="ulysses")
        np.testing.assert_allclose(y.numpy(), ref[0], **TOL)
        for got, want in zip(grads, ref[1:]):
            np.testing.assert_allclose(got.numpy(), want, **TOL)
    cp_axis = sbp.index(ct.sbp.split(2))
    for log in (fwd, bwd):
        assert log.collectives() == ["all_to_all"] * 2
        assert all(e.mesh_axis == cp_axis for e in log)


@pytest.mark.parametrize("layout", [("--cp", "2"), ("--dp", "2", "--cp", "2")],
                         ids=["cp2", "dp2xcp2"])
def test_gpt_cp_by_ulysses_gives_the_loss_curve_of_one_process(gpt_train, monkeypatch,
                                                               layout):
    """train.py --cp with Ulysses serving every attention (``ct.attention`` called with
    ``cp_scheme="ulysses"``; the mesh's size-1 tensor axis splitting the heads is no
    obstacle): one process's loss curve, dropout on, and two all-to-alls each way per
    attention."""
    import functools
    size = int(np.prod([int(layout[i + 1]) for i in range(0, len(layout), 2)]))
    if "0.1" not in _REFERENCE:
        _REFERENCE["0.1"] = gpt_train.run(_TINY + ["--dropout", "0.1", "--simulate", "1"])
    monkeypatch.setattr(ct, "attention", functools.partial(ct.attention, cp_scheme="ulysses"))
    args = _TINY + ["--dropout", "0.1"] + list(layout)
    if MPI_MODE and ct.world_size() != size:
        pytest.skip(f"needs exactly {size} ranks")
    with ct.debug.comm_log() as log:
        history = gpt_train.run(args if MPI_MODE else args + ["--simulate", str(size)])
    np.testing.assert_allclose(history, _REFERENCE["0.1"], rtol=1e-9, atol=0)
    moved = [e.collective for e in log if e.op.startswith("attention")]
    # 2 layers x 2 micro-batches x 3 steps, two all-to-alls each way
    assert moved == ["all_to_all"] * (2 * 2 * 3 * 4)


def test_ulysses_dropout_draws_the_composites_bits():
    """Dropout under Ulysses: the mask drawn by logical position on the head-split
    kernel, the composite's on one rank, forward and backward."""
    with world(2):
        want, _ = _dropout_run(ct.placement("cpu", [0]), ct.sbp.broadcast, None)
        got, log = _dropout_run(ct.placement("cpu", [0, 1]), ct.sbp.split(2), "ulysses")
    assert log.collectives() == ["all_to_all"] * 2
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, **TOL)
