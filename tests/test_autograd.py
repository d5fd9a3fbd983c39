"""The tape: grads are global tensors; leaf grads come back in the leaf's own SBP; no_sync
keeps them partial; retain_graph, accumulation, no_grad, detach and errors."""
import numpy as np
import pytest

import ctensor as ct
from conftest import MPI_MODE, assert_layout

S0, S1, B, P = ct.sbp.split(0), ct.sbp.split(1), ct.sbp.broadcast, ct.sbp.partial_sum


def _all(mesh, s):
    return (s,) * mesh.ndim


def test_to_global_backward_uses_dual_sbp(mesh):
    value = np.arange(12.0).reshape(4, 3)
    for src, dst in [(B, S0), (S0, B), (P, B), (S1, S0), (B, P)]:
        x = ct.tensor(value, placement=mesh, sbp=_all(mesh, src), requires_grad=True)
        y = x.to_global(sbp=_all(mesh, dst))
        (y * y).sum().backward()
        assert x.grad.sbp == x.sbp
        assert_layout(x.grad, 2 * value)


def test_data_parallel_grad_is_allreduced(mesh):
    rng = np.random.default_rng(0)
    xv, wv = rng.standard_normal((7, 3)), rng.standard_normal((3,))
    w = ct.tensor(wv, placement=mesh, sbp=_all(mesh, B), requires_grad=True)
    x = ct.tensor(xv, placement=mesh, sbp=_all(mesh, S0))
    loss = ((x * w).sum(1) ** 2).mean()
    with ct.debug.comm_log() as log:
        loss.backward()
    expected = 2 * ((xv * wv).sum(1)[:, None] * xv).sum(0) / 7
    assert w.grad.sbp == _all(mesh, B)
    assert_layout(w.grad, expected)
    if mesh.size > 1:
        assert "all_reduce" in log.collectives()


def test_gradient_differing_only_on_one_rank_axes_is_relabelled(mesh, monkeypatch):
    """A leaf's gradient whose layout differs from the leaf's only on mesh axes of one rank
    (partial there, the leaf broadcast or split) is the same shards: handed over without a
    ``to_global`` (a dispatched op per gradient, ~30 us each inside a step)."""
    ranks = np.asarray(mesh.rank_list).reshape(mesh.size, 1).tolist()
    grid = ct.placement("cpu", ranks)  # (n, 1): the second axis holds one rank
    rng = np.random.default_rng(0)
    xv, wv, bv = (rng.standard_normal(s) for s in ((5, 4), (6, 4), (6,)))
    w = ct.tensor(wv, placement=grid, sbp=(S0, B), requires_grad=True)  # split rows
    b = ct.tensor(bv, placement=grid, sbp=(S0, B), requires_grad=True)
    x = ct.tensor(xv, placement=grid, sbp=(B, B))
    loss = (ct.linear(x, w, b) ** 2).sum()
    moved = []
    original = ct.Tensor.to_global
    monkeypatch.setattr(ct.Tensor, "to_global",
                        lambda self, *a, **k: moved.append(self) or original(self, *a, **k))
    loss.backward()
    y = xv @ wv.T + bv
    assert_layout(w.grad, 2 * y.T @ xv)
    assert_layout(b.grad, 2 * y.sum(0))
    assert w.grad.sbp == (S0, B) and b.grad.sbp == (S0, B)
    assert moved == []


def test_no_sync_accumulates_without_communication(mesh):
    rng = np.random.default_rng(1)
    wv = rng.standard_normal((3,))
    xs = [rng.standard_normal((6, 3)) for _ in range(3)]
    w = ct.tensor(wv, placement=mesh, sbp=_all(mesh, B), requires_grad=True)

    def step(xv):
        x = ct.tensor(xv, placement=mesh, sbp=_all(mesh, S0))
        (x * w).sum().backward()

    with ct.debug.comm_log() as log:
        with ct.autograd.no_sync():
            step(xs[0])
            step(xs[1])
    assert log.collectives() == []
    assert w.grad.sbp != _all(mesh, B) or mesh.size == 1
    np.testing.assert_allclose(w.grad.numpy(), xs[0].sum(0) + xs[1].sum(0))
    step(xs[2])
    assert w.grad.sbp == _all(mesh, B)
    assert_layout(w.grad, sum(x.sum(0) for x in xs))


def test_accumulation_across_backwards_reduces_in_one_bucket(mesh):
    """Gradients accumulated over several backward() calls without no_sync (a replicated
    .grad from the first): each backward reduces its gradients in one bucket and adds them
    to .grad once reduced (DDP's way), not one all-reduce per parameter at the add."""
    rng = np.random.default_rng(2)
    values = [rng.standard_normal(shape) for shape in ((3, 4), (4,), (4, 2))]
    params = [ct.tensor(v, placement=mesh, sbp=_all(mesh, B), requires_grad=True)
              for v in values]
    xs = [rng.standard_normal((6, 3)) for _ in range(3)]
    logs = []
    for xv in xs:
        x = ct.tensor(xv, placement=mesh, sbp=_all(mesh, S0))
        with ct.debug.comm_log() as log:
            ((x @ params[0] + params[1]) @ params[2]).sum().backward()
        logs.append(log)
    for log in logs:
        assert log.collectives() == (["all_reduce"] if mesh.size > 1 else []), log.summary()
    ones = np.ones((6, 2))
    want = [sum(xv.T @ (ones @ values[2].T) for xv in xs),
            sum((ones @ values[2].T).sum(0) for _ in xs),
            sum((xv @ values[0] + values[1]).T @ ones for xv in xs)]
    for p, w in zip(params, want):
        assert p.grad.sbp == _all(mesh, B)
        assert_layout(p.grad, w, rtol=1e-12, atol=1e-12)


def test_retain_graph_and_accumulation(mesh):
    x = ct.tensor(np.array([1.0, 2.0, 3.0]), placement=mesh, sbp=_all(mesh, S0),
                  requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert_layout(x.grad, 4 * np.array([1.0, 2.0, 3.0]))
    with pytest.raises(RuntimeError, match="second time"):
        y.backward()


def test_explicit_grad_and_non_scalar_error(mesh):
    x = ct.tensor(np.ones((2, 3)), placement=mesh, sbp=_all(mesh, S1), requires_grad=True)
    y = x * 3.0
    with pytest.raises(ValueError, match="scalar"):
        y.backward()
    y.backward(ct.tensor(np.full((2, 3), 2.0), placement=mesh))
    assert_layout(x.grad, np.full((2, 3), 6.0))
    with pytest.raises(ValueError, match="shape"):
        (x * 2.0).backward(ct.ones(3, placement=mesh))


def test_no_grad_detach_requires_grad_(mesh):
    x = ct.ones(3, placement=mesh, requires_grad=True)
    with ct.no_grad():
        y = x * 2.0
    assert not y.requires_grad and y.is_leaf
    z = (x * 2.0).detach()
    assert not z.requires_grad
    w = ct.ones(3, placement=mesh)
    w.requires_grad_()
    (w * x).sum().backward()
    assert_layout(w.grad, np.ones(3))
    with pytest.raises(ValueError, match="require grad"):
        ct.ones(2, placement=mesh).sum().backward()


def test_shared_input_and_diamond(mesh):
    xv = np.array([0.5, -1.0, 2.0, 3.0, 0.1])
    x = ct.tensor(xv, placement=mesh, sbp=_all(mesh, S0), requires_grad=True)
    a = x.exp()
    b = x * x
    (a * b + a).sum().backward()
    expected = np.exp(xv) * xv ** 2 + np.exp(xv) * 2 * xv + np.exp(xv)
    assert_layout(x.grad, expected)


def test_mixed_placements_error_names_both(world4):
    a = ct.ones(4, placement=ct.placement("cpu", [0, 1]))
    b = ct.ones(4, placement=ct.placement("cpu", [2, 3]))
    with pytest.raises(ValueError, match="placement") as info:
        a + b
    assert "[0, 1]" in str(info.value) and "[2, 3]" in str(info.value)
    assert (a + 1.0).numpy().sum() == 8


def test_partial_semantics(mesh):
    x = ct.tensor(np.array([1.0, 2.0]), placement=mesh, sbp=_all(mesh, P))
    y = ct.tensor(np.array([10.0, 20.0]), placement=mesh, sbp=_all(mesh, B))
    np.testing.assert_allclose((x + y).numpy(), [11.0, 22.0])
    np.testing.assert_allclose((x + 1.0).numpy(), [2.0, 3.0])
    z = x * 3.0
    assert z.sbp == _all(mesh, P)
    np.testing.assert_allclose(z.numpy(), [3.0, 6.0])
    np.testing.assert_allclose(x.exp().numpy(), np.exp([1.0, 2.0]))


def test_graph_handle_keeps_the_graph_not_the_values(mesh):
    # what a pipeline keeps of a stage's output once it has been sent on
    xv = np.arange(1.0, 9.0)
    x = ct.tensor(xv, placement=mesh, sbp=(ct.sbp.split(0),) * mesh.ndim, requires_grad=True)
    y = (x * 3.0).exp()  # exp keeps its output for the backward: the handle needs none
    root = ct.autograd.graph_handle(y)
    del y
    with ct.debug.track_memory():
        z = (x * 3.0) * 1.0  # mul keeps no output: its values are z's alone
        held = ct.debug.memory().current["activations"]
        handle = ct.autograd.graph_handle(z)
        del z
        if not MPI_MODE or ct.rank() in mesh.rank_list:  # (a rank holding a shard of z)
            assert ct.debug.memory().current["activations"] < held  # z's values are gone
    assert root.shape == (8,) and root.sbp == x.sbp and root.requires_grad
    handle.backward(ct.ones(8, placement=mesh, sbp=x.sbp))
    root.backward(ct.ones(8, placement=mesh, sbp=x.sbp))
    np.testing.assert_allclose(x.grad.numpy(), 3.0 + 3.0 * np.exp(3.0 * xv), rtol=1e-12)
    with pytest.raises(ValueError, match="graph_handle"):
        ct.autograd.graph_handle(x)  # a leaf: nothing to stand in for
