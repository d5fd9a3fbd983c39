"""Kernels that do in one call what several did, with the same bits: ``ct.linear`` with a
bias is one op (ctensor/ops/linalg.py), the product and the add it replaces, forward and
backward, in every layout of a linear layer; ``pow`` by 2 is a product, by 1 a copy."""
import numpy as np
import pytest

import ctensor as ct
from ctensor import dispatch
from ctensor.ops.linalg import matmul_t

B, P = ct.sbp.broadcast, ct.sbp.partial_sum
S = ct.sbp.split

# (x, weight, bias) per mesh axis: data parallel, column parallel, row parallel, sequence
LAYOUTS = {"dp": (S(0), B, B), "column": (B, S(0), S(0)), "row": (S(2), S(1), B),
           "sequence": (S(1), B, B)}


def _inputs(mesh, layout, dtype, rng):
    xs, ws, bs = ((s,) * mesh.ndim for s in LAYOUTS[layout])
    # (even splits on every mesh: an uneven one reshapes differently in the unfused
    # backward; test_ops.py's samples check the fused values and gradients on those)
    x = ct.tensor(rng.standard_normal((12, 12, 12)).astype(dtype), placement=mesh, sbp=xs,
                  requires_grad=True)
    w = ct.tensor(rng.standard_normal((12, 12)).astype(dtype), placement=mesh, sbp=ws,
                  requires_grad=True)
    b = ct.tensor(rng.standard_normal(12).astype(dtype), placement=mesh, sbp=bs,
                  requires_grad=True)
    return x, w, b


def _run(mesh, layout, dtype, fn):
    x, w, b = _inputs(mesh, layout, dtype, np.random.default_rng(3))
    with ct.debug.comm_log() as log:
        y = fn(x, w, b)
        weight = ct.tensor(np.random.default_rng(4).standard_normal(y.shape).astype(dtype),
                           placement=mesh)
        (y * weight).sum().backward()
    return [t.numpy() for t in (y, x.grad, w.grad, b.grad)], \
        [t.grad.sbp for t in (x, w, b)], len(log.collectives())


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_biased_linear_is_the_product_and_the_add_bit_for_bit(mesh, layout, dtype):
    want, grad_sbps, collectives = _run(mesh, layout, dtype,
                                        lambda x, w, b: matmul_t(x, w, transpose_b=True) + b)
    got, fused_grad_sbps, fused_collectives = _run(mesh, layout, dtype, ct.linear)
    summed = mesh.size > 1 and layout == "row"
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype
        # the unfused weight gradient of a split inner dim was a batch of products, then
        # their sum; the unfused bias of a row-parallel layer got a partial gradient, then
        # an all-reduce (the fused one sums the replicated output gradient: one collective
        # fewer)
        if layout == "sequence" and i == 2 or summed and i == 3:
            tol = {np.float16: 1e-2, np.float32: 1e-5, np.float64: 1e-12}[dtype]
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol * np.abs(w).max())
        else:
            np.testing.assert_array_equal(g, w)
    assert fused_grad_sbps == grad_sbps  # each gradient where the parameter lives
    assert fused_collectives == collectives - summed


def test_biased_linear_is_one_op_and_two_in_the_backward(monkeypatch):
    names = []
    apply = dispatch.apply
    monkeypatch.setattr(dispatch, "apply", lambda opdef, *a, **k: (
        names.append(opdef.name), apply(opdef, *a, **k))[1])
    rng = np.random.default_rng(0)
    x = ct.tensor(rng.standard_normal((2, 5, 6)))
    w = ct.tensor(rng.standard_normal((4, 6)), requires_grad=True)
    b = ct.tensor(rng.standard_normal(4), requires_grad=True)
    y = ct.linear(x, w, b)
    assert names == ["linear"]
    names.clear()
    y.backward(ct.tensor(np.ones((2, 5, 4))))
    assert names == ["linear.grad_params"]  # x needs no gradient: no product for it
    np.testing.assert_allclose(w.grad.numpy(), np.einsum("btn,btk->nk", np.ones((2, 5, 4)),
                                                          x.numpy()))
    np.testing.assert_allclose(b.grad.numpy(), np.full(4, 10.0))


def test_linear_falls_back_to_the_product_and_the_add():
    # a vector input, a bias of another dtype or shape: matmul and add (PyTorch's values)
    rng = np.random.default_rng(1)
    w = rng.standard_normal((3, 4))
    x1 = rng.standard_normal(4)
    np.testing.assert_allclose(ct.linear(ct.tensor(x1), ct.tensor(w), ct.tensor(np.ones(3)))
                               .numpy(), w @ x1 + 1)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    y = ct.linear(ct.tensor(x), ct.tensor(w.astype(np.float32)), ct.tensor(np.ones(3)))
    assert y.dtype == np.float64  # promoted by the add, as before
    y = ct.linear(ct.tensor(x), ct.tensor(w.astype(np.float32)), 0.5)
    np.testing.assert_allclose(y.numpy(), x @ w.T.astype(np.float32) + 0.5, rtol=1e-6)
    with pytest.raises(ValueError, match="linear"):
        ct.linear(ct.tensor(x), ct.tensor(w.astype(np.float32)),
                  ct.tensor(np.ones(5, np.float32)))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_pow_of_two_and_one_are_numpys_power_bit_for_bit(dtype):
    # the kernel squares by a product and copies for the power 1: NumPy's power's bits
    rng = np.random.default_rng(5)
    with np.errstate(all="ignore"):
        a = np.concatenate([rng.standard_normal(4096) * s for s in (1e-30, 1e-4, 1, 1e4, 1e30)]
                           + [np.array([0.0, -0.0, np.inf, -np.inf, np.nan])]).astype(dtype)
        for e in (2.0, 1.0, 3.0, 0.5):
            got = (ct.tensor(a) ** e).numpy()
            want = np.power(a, np.asarray(e, dtype))
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
