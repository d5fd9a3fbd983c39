"""Activation recompute (``nn.utils.checkpoint``, ``GPT(recompute=True)``): values and
gradients bit-identical to no recompute, with dropout on, on 1 rank, TP, DP, 2-D and a
2-stage pipeline; under no_sync; clear errors; less activation memory. Gathering again in
the backward (``ct.autograd.regather_saved``): the same values, one gather more, the
shard kept instead of the copy."""
import contextlib
import importlib.util
from pathlib import Path

import numpy as np
import pytest

import ctensor as ct
import ctensor.nn as nn
from conftest import MPI_MODE, world

S0, S1, B = ct.sbp.split(0), ct.sbp.split(1), ct.sbp.broadcast
TRAIN = Path(__file__).resolve().parent.parent / "examples" / "gpt" / "train.py"
TINY = ["--layers", "2", "--hidden", "16", "--heads", "2", "--seq-len", "8", "--global-batch",
        "4", "--micro-batches", "2", "--steps", "3", "--dtype", "float64", "--dropout", "0.1",
        "--no-progress", "--lr", "1e-2"]


def gpt_step(dp: int, tp: int, recompute: bool, dropout: float = 0.1, sync_steps: int = 1):
    """Loss, every gradient and the random state after one step of a tiny float64 GPT laid
    out (dp, tp); ``sync_steps > 1``: micro-batches accumulated under no_sync first."""
    ct.manual_seed(0)
    model = nn.GPT(32, 8, 2, 2, 16, dropout=dropout, tie_weights=False, dtype=np.float64,
                   recompute=recompute)
    mesh = ct.placement("cpu", np.arange(dp * tp).reshape(dp, tp).tolist())
    model.to_global(mesh, nn.parallel.hybrid_parallel_rules(model))
    rng = np.random.default_rng(0)
    losses = []
    for i in range(sync_steps):
        idx = ct.tensor(rng.integers(0, 32, (4, 8)), placement=mesh, sbp=(S0, B))
        tgt = ct.tensor(rng.integers(0, 32, (4, 8)), placement=mesh, sbp=(S0, B))
        _, loss = model(idx, tgt)
        if i < sync_steps - 1:
            with ct.autograd.no_sync():
                loss.backward()
        else:
            loss.backward()
        losses.append(loss.item())
    grads = {n: (p.grad.sbp, p.grad.numpy()) for n, p in model.named_parameters()}
    return losses, grads, ct.random.get_state()


@pytest.mark.parametrize("dp, tp", [(1, 1), (1, 2), (2, 1), (2, 2)],
                         ids=["1rank", "tp2", "dp2", "2x2"])
def test_gpt_recompute_is_bit_identical(dp, tp):
    with world(dp * tp):
        plain = gpt_step(dp, tp, False)
        again = gpt_step(dp, tp, True)
        no_dropout = gpt_step(dp, tp, False, dropout=0.0)
    assert plain[0] == again[0]
    assert plain[0] != no_dropout[0]  # dropout is on: the masks matter
    for name, (sbp, g) in plain[1].items():
        assert again[1][name][0] == sbp, name
        np.testing.assert_array_equal(again[1][name][1], g, err_msg=name)
    assert plain[2] == again[2]  # the re-run did not shift later random draws


def test_recompute_under_no_sync_is_bit_identical():
    with world(2):
        plain = gpt_step(2, 1, False, sync_steps=2)
        again = gpt_step(2, 1, True, sync_steps=2)
    assert plain[0] == again[0]
    for name, (_, g) in plain[1].items():
        np.testing.assert_array_equal(again[1][name][1], g, err_msg=name)


def test_without_the_random_state_the_gradients_differ(monkeypatch):
    """The check above can fail: a re-run that does not restore the generator draws other
    dropout masks, and the gradients differ."""
    with world(1):
        plain = gpt_step(1, 1, False)
        real = ct.random.set_state
        calls = []

        def forgetful(state):
            calls.append(state)
            if len(calls) % 2:  # the restore before each re-run is skipped
                return
            real(state)

        monkeypatch.setattr(ct.random, "set_state", forgetful)
        again = gpt_step(1, 1, True)
    assert calls, "checkpoint did not touch the random state"
    assert any(not np.array_equal(again[1][n][1], g) for n, (_, g) in plain[1].items())


def _train():
    spec = importlib.util.spec_from_file_location("gpt_train_recompute", TRAIN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_pipeline_recompute_same_loss_curve():
    train = _train()
    if MPI_MODE:
        if ct.world_size() not in (2, 4):
            pytest.skip("needs 2 or 4 ranks")
        size = ["--dp", str(ct.world_size() // 2)]
    else:
        size = ["--simulate", "2"]
    args = TINY + size + ["--pp", "2"]
    plain = train.run(args)
    np.testing.assert_array_equal(train.run(args + ["--recompute"]), plain)
    np.testing.assert_array_equal(train.run(args + ["--recompute", "selective"]), plain)


def test_checkpoint_function_of_several_tensors():
    with world(2):
        mesh = ct.placement("cpu", [0, 1])
        xv, wv = np.arange(12.0).reshape(4, 3) / 7, np.linspace(-1, 1, 6).reshape(3, 2)

        def fn(x, w, scale):
            h = (x @ w).tanh() * scale
            return h, h.exp()

        results = []
        for recompute in (False, True):
            x = ct.tensor(xv, placement=mesh, sbp=S0, requires_grad=True)
            w = ct.tensor(wv, placement=mesh, requires_grad=True)
            h, e = nn.utils.checkpoint(fn, x, w, 0.5) if recompute else fn(x, w, 0.5)
            (h.sum() + e.sum()).backward()
            results.append((h.numpy(), x.grad.numpy(), w.grad.numpy(), x.grad.sbp))
        for a, b in zip(*results):
            np.testing.assert_array_equal(a, b)


def test_checkpoint_errors_name_the_fix():
    x = ct.ones(3, requires_grad=True)
    with pytest.raises(TypeError, match=r"checkpoint: the function must return a ct.Tensor.*"
                                        r"got float"):
        nn.utils.checkpoint(lambda t: 1.0, x)
    with pytest.raises(TypeError, match=r"checkpoint: .*tuple holding int.*return the tensors"):
        nn.utils.checkpoint(lambda t: (t * 2, 3), x)
    with pytest.raises(TypeError, match="checkpoint: argument 'function' must be callable"):
        nn.utils.checkpoint(x, x)
    with pytest.raises(TypeError, match="pass tensors that need a gradient positionally"):
        nn.utils.checkpoint(lambda t, y=None: t * y, x, y=x)


def test_checkpoint_under_no_grad_just_calls():
    x = ct.ones(3, requires_grad=True)
    with ct.no_grad():
        y = nn.utils.checkpoint(lambda t: t * 2, x)
    assert not y.requires_grad and y.numpy().tolist() == [2.0, 2.0, 2.0]


@pytest.mark.skipif(MPI_MODE, reason="measures one process's memory")
def test_recompute_keeps_less_activation_memory():
    peaks = {}
    for recompute in (False, True):
        with ct.simulate(1), ct.debug.track_memory():
            ct.manual_seed(0)
            model = nn.GPT(32, 64, 4, 2, 32, dropout=0.1, recompute=recompute)
            idx = ct.tensor(np.random.default_rng(0).integers(0, 32, (4, 64)))
            ct.debug.reset_peak_memory()
            _, loss = model(idx, idx)
            loss.backward()
            peaks[recompute] = ct.debug.memory().peak["activations"]
    assert peaks[True] < 0.6 * peaks[False], peaks


# ----------------------------------------------------------------------- regather_saved
def _gathers(log):
    return [(e.op, tuple(e.shape)) for e in log if e.collective == "all_gather"]


@pytest.mark.parametrize("regather", [False, True], ids=["keep-copy", "regather"])
def test_regather_saved_gathers_again_in_the_backward(mesh, regather):
    # x is split by rows and w by columns: the matmuls gather x (once, for both); inside
    # regather_saved their backward gathers x again instead of keeping the copy
    rng = np.random.default_rng(0)
    xv, wv = rng.standard_normal((6, 4)), rng.standard_normal((4, 5))
    x = ct.tensor(xv, placement=mesh, sbp=(S0,) * mesh.ndim, requires_grad=True)
    w = ct.tensor(wv, placement=mesh, sbp=(S1,) * mesh.ndim, requires_grad=True)
    with ct.debug.comm_log() as log:
        h = x * 2.0
        with ct.autograd.regather_saved() if regather else contextlib.nullcontext():
            y, y2 = h @ w, h @ w
        if regather:  # leaving the block dropped the copy both matmuls shared
            assert not h._boxed
        forward = _gathers(log)
        loss = (y * y2).sum()
        loss.backward()
    assert len(forward) == (mesh.size > 1) * mesh.ndim
    again = _gathers(log)[len(forward):]
    assert again == (forward if regather else [])
    hv = 2 * xv
    np.testing.assert_allclose(loss.numpy(), ((hv @ wv) ** 2).sum(), rtol=1e-12)
    np.testing.assert_allclose(w.grad.numpy(), 2 * hv.T @ (hv @ wv), rtol=1e-10)
    np.testing.assert_allclose(x.grad.numpy(), 4 * (hv @ wv) @ wv.T, rtol=1e-10)


def test_regather_saved_watches_the_source_for_in_place_writes(mesh):
    x = ct.tensor(np.arange(12.0).reshape(6, 2), placement=mesh, sbp=(S0,) * mesh.ndim,
                  requires_grad=True)
    w = ct.tensor(np.ones((2, 3)), placement=mesh, sbp=(S1,) * mesh.ndim, requires_grad=True)
    h = x * 1.0
    with ct.autograd.regather_saved():
        y = h @ w
    with ct.no_grad():
        h.add_(1.0)  # what the backward would gather again
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        y.sum().backward()


def test_regather_saved_with_saved_tensors_hooks(mesh):
    packed = []
    rng = np.random.default_rng(1)
    xv, wv = rng.standard_normal((6, 4)), rng.standard_normal((4, 5))
    x = ct.tensor(xv, placement=mesh, sbp=(S0,) * mesh.ndim, requires_grad=True)
    w = ct.tensor(wv, placement=mesh, sbp=(S1,) * mesh.ndim, requires_grad=True)
    pack = lambda t: packed.append((t.shape, t.sbp)) or t  # noqa: E731
    with ct.autograd.saved_tensors_hooks(pack, lambda t: t), ct.autograd.regather_saved():
        y = (x * 1.0) @ w
    y.sum().backward()  # the gathered input is not packed: it is gathered again
    assert (4, 5) in [shape for shape, _ in packed]  # (w)
    assert mesh.size == 1 or ((6, 4), (B,) * mesh.ndim) not in packed
    np.testing.assert_allclose(w.grad.numpy(), xv.T @ np.ones((6, 5)), rtol=1e-12)
    np.testing.assert_allclose(x.grad.numpy(), np.ones((6, 5)) @ wv.T, rtol=1e-12)
