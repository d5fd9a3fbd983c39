"""Placement, SBP values, constructors, from_local, metadata, repr and bad input."""
import numpy as np
import pytest

import ctensor as ct
from ctensor import nn
from conftest import MPI_MODE, assert_layout

S0, S1, B, P = ct.sbp.split(0), ct.sbp.split(1), ct.sbp.broadcast, ct.sbp.partial_sum


def test_sbp_values():
    assert ct.sbp.split(0) == ct.sbp.split(0) and ct.sbp.split(0) != ct.sbp.split(1)
    assert repr(S0) == "S(0)" and repr(B) == "B" and repr(P) == "P"
    assert repr(ct.sbp.partial_max) == "P(max)" and repr(ct.sbp.partial_min) == "P(min)"
    assert hash(ct.sbp.split(1)) == hash(S1)
    assert ct.sbp.broadcast() is B
    with pytest.raises(TypeError, match="split"):
        ct.sbp.split("0")


def test_placement_values():
    p = ct.placement("cpu", [[0, 1], [2, 3]])
    assert p.shape == (2, 2) and p.ndim == 2 and p.device == "cpu"
    assert p == ct.placement("cpu", [[0, 1], [2, 3]]) and p != ct.placement("cpu", [0, 1, 2, 3])
    assert hash(p) == hash(ct.placement("cpu", np.array([[0, 1], [2, 3]])))
    assert p.ranks.tolist() == [[0, 1], [2, 3]]
    assert isinstance(p, ct.placement)
    assert p.axis_group(3, 0) == (1, 3) and p.axis_group(3, 1) == (2, 3)
    with pytest.raises(ValueError, match="duplicate"):
        ct.placement("cpu", [0, 0])
    with pytest.raises(ValueError, match="device"):
        ct.placement("tpu", [0])
    with pytest.raises(ValueError, match="rectangular|non-empty"):
        ct.placement("cpu", [[0, 1], [2]])
    with pytest.raises(TypeError):
        ct.placement("cpu", ["a"])


def test_constructors(mesh):
    sbp = (S0,) * mesh.ndim
    assert_layout(ct.zeros(5, 3, placement=mesh, sbp=sbp), np.zeros((5, 3), np.float32))
    assert_layout(ct.ones((5, 3), placement=mesh, sbp=sbp), np.ones((5, 3), np.float32))
    assert_layout(ct.full((2, 7), 2.5, placement=mesh, sbp=(S1,) * mesh.ndim),
                  np.full((2, 7), 2.5, np.float32))
    assert_layout(ct.arange(11, placement=mesh, sbp=sbp), np.arange(11))
    assert_layout(ct.arange(1.0, 3.0, 0.25, placement=mesh, sbp=sbp),
                  np.arange(1.0, 3.0, 0.25, dtype=np.float32))
    # partial constructors give the stated logical value, not N times it
    for p in [P, ct.sbp.partial_max, ct.sbp.partial_min]:
        x = ct.ones(3, 2, placement=mesh, sbp=(p,) * mesh.ndim)
        np.testing.assert_array_equal(x.numpy(), np.ones((3, 2)))
        y = ct.tensor(np.arange(6.0).reshape(3, 2), placement=mesh, sbp=(p,) * mesh.ndim)
        np.testing.assert_array_equal(y.numpy(), np.arange(6.0).reshape(3, 2))
    assert ct.zeros(2, 2, placement=mesh).sbp == (B,) * mesh.ndim


def test_defaults_and_dtypes(mesh):
    x = ct.tensor([[1, 2], [3, 4]], placement=mesh)
    assert x.dtype == np.int64 and x.sbp == (B,) * mesh.ndim
    assert ct.tensor([1.0, 2.0], placement=mesh).dtype == np.float32
    assert ct.tensor(np.ones(2, np.float64), placement=mesh).dtype == np.float64
    assert ct.tensor([1.0], placement=mesh, dtype=np.float16).dtype == np.float16
    ct.set_default_dtype(np.float64)
    try:
        assert ct.ones(2, placement=mesh).dtype == np.float64
    finally:
        ct.set_default_dtype(np.float32)
    d = ct.zeros(3)
    assert d.placement == ct.placement.all() and d.sbp == (B,)


def test_metadata_and_repr(mesh):
    x = ct.tensor(np.arange(12.0).reshape(3, 4), placement=mesh, sbp=(S1,) * mesh.ndim,
                  requires_grad=True)
    assert x.shape == (3, 4) and x.ndim == 2 and x.dtype == np.float64  # arrays keep dtype
    assert x.placement == mesh and x.sbp == (S1,) * mesh.ndim
    assert x.is_leaf and x.requires_grad and x.grad is None
    text = repr(x)
    assert "shape=(3, 4)" in text and "S(1)" in text and "placement" in text
    assert x.numel() == 12 and len(x) == 3 and x.size(1) == 4


def test_local_shards_and_to_local(mesh):
    x = ct.arange(10, placement=mesh, sbp=(S0,) * mesh.ndim)
    shards = x.local_shards()
    if MPI_MODE:
        me = ct.rank()
        assert list(shards) == ([me] if me in mesh else [])
        if me in mesh:
            np.testing.assert_array_equal(x.to_local(), shards[me])
    else:
        assert sorted(shards) == sorted(mesh.rank_list)
        if mesh.size > 1:
            with pytest.raises(ValueError, match="rank"):
                x.to_local()
        for r in mesh.rank_list:
            np.testing.assert_array_equal(x.to_local(r), shards[r])


def test_from_local_infers_shape(mesh):
    value = np.arange(13 * 5, dtype=np.float64).reshape(13, 5)
    for sbp in [(S0,) * mesh.ndim, (S1,) * mesh.ndim, (B,) * mesh.ndim]:
        ref = ct.tensor(value, placement=mesh, sbp=sbp)
        shards = ref.local_shards()
        local = shards if len(shards) != 1 or not MPI_MODE else next(iter(shards.values()))
        if MPI_MODE and not shards:
            local = None
        y = ct.from_local(local, mesh, sbp)
        assert y.shape == (13, 5)
        assert_layout(y, value)
        z = ct.from_local(local, mesh, sbp, shape=(13, 5))
        assert_layout(z, value)


def test_from_local_rejects_bad_shards(mesh):
    if mesh.size < 2:
        pytest.skip("needs several ranks")
    # every rank passes 3 rows: for shape (6, 2) on 4 ranks the rule wants 2,2,1,1
    local = {r: np.zeros((3, 2)) for r in mesh.rank_list}
    if MPI_MODE:
        local = local.get(ct.rank())
    with pytest.raises(ValueError, match="uneven-split rule"):
        ct.from_local(local, mesh, (S0,) * mesh.ndim, shape=(3 * mesh.size - 1, 2))
    # the world stays usable
    x = ct.ones(4, 4, placement=mesh, sbp=(S0,) * mesh.ndim)
    assert x.to_global(sbp=(B,) * mesh.ndim).numpy().sum() == 16


@pytest.mark.parametrize("call,exc,words", [
    (lambda m: ct.ones(4, 4, placement=m, sbp=(ct.sbp.split(2),) * m.ndim), ValueError,
     ["ones", "S(2)", "dims"]),
    (lambda m: ct.ones(4, placement=m, sbp=(S0,) * (m.ndim + 1)), ValueError, ["mesh", "axes"]),
    (lambda m: ct.ones(4, placement=m, sbp="S0"), TypeError, ["sbp"]),
    (lambda m: ct.ones(4, placement=m, sbp=(0,) * m.ndim), TypeError, ["sbp"]),
    (lambda m: ct.ones(4, placement=ct.placement("cpu", [0, 99])), ValueError, ["outside"]),
    (lambda m: ct.ones(4, placement="cpu"), TypeError, ["placement"]),
    (lambda m: ct.ones(-1, placement=m), ValueError, ["shape"]),
    (lambda m: ct.tensor(["a"], placement=m), TypeError, ["numeric"]),
    (lambda m: ct.ones(2, placement=m).to_global(sbp=(ct.sbp.split(3),) * m.ndim), ValueError,
     ["to_global", "S(3)"]),
    (lambda m: ct.ones(2, placement=m).to_global(placement=[0]), TypeError, ["placement"]),
    (lambda m: ct.ones(2, placement=m, dtype=np.int64, requires_grad=True), ValueError,
     ["floating"]),
])
def test_bad_input_is_clear_and_harmless(mesh, call, exc, words):
    with pytest.raises(exc) as info:
        call(mesh)
    for w in words:
        assert w in str(info.value), str(info.value)
    x = ct.ones(6, placement=mesh, sbp=(S0,) * mesh.ndim)
    assert x.to_global(sbp=(B,) * mesh.ndim).numpy().sum() == 6


def test_copy_(mesh):
    x = ct.zeros(5, 3, placement=mesh, sbp=(S0,) * mesh.ndim, dtype=np.float64)
    value = np.arange(15.0).reshape(5, 3)
    shards_before = x.local_shards()
    x.copy_(ct.tensor(value, placement=mesh, sbp=(S1,) * mesh.ndim))
    assert_layout(x, value)
    for r, a in x.local_shards().items():
        assert a is shards_before[r]
    x.copy_(2.0)
    assert_layout(x, np.full((5, 3), 2.0))


def test_simulate_as_plain_call_and_nesting():
    if MPI_MODE:
        pytest.skip("simulation-only behaviour")
    sim = ct.simulate(3)
    try:
        assert ct.world_size() == 3
        with ct.simulate(2):
            assert ct.world_size() == 2
        assert ct.world_size() == 3
    finally:
        sim.close()
    assert ct.world_size() == 1
    with pytest.raises(ValueError):
        ct.simulate(0)


# ----------------------------------------------------------------------------- PyTorch basics
def test_tensor_basics_as_pytorch(mesh):
    x = ct.tensor(np.arange(24.0).reshape(2, 3, 4), placement=mesh, sbp=(S1,) * mesh.ndim)
    assert f"{x.sum():.2f}" == "276.00" and f"{x.sum()}" == "276.0"
    assert f"{x[0, 0, 1]:>6.1f}" == "   1.0"
    assert f"{x}" == str(x)
    if not MPI_MODE:
        with ct.simulate(2, meta=True):
            m = ct.zeros(())
            assert f"{m}" == str(m)
            with pytest.raises(ct.MetaModeError, match="format: this tensor is shape-only"):
                f"{m:.2f}"
    with pytest.raises(TypeError, match=r"unsupported format string '\.2f' for a tensor of "
                                        r"shape \(2, 3, 4\)"):
        f"{x:.2f}"
    assert x.is_floating_point() and not x.long().is_floating_point()
    assert ct.is_floating_point(x.half()) and not ct.is_floating_point(x.bool())
    assert ct.is_tensor(x) and not ct.is_tensor(np.ones(2)) and not ct.is_tensor(1.0)
    assert ct.is_tensor(nn.Parameter(ct.ones(2)))
    assert x.numel() == x.nelement() == ct.numel(x) == 24
    assert x.element_size() == 8 and x.float().element_size() == 4
    assert x.half().element_size() == 2 and x.bool().element_size() == 1
    assert x.dim() == 3 and x.size(0) == 2 and x.size(-1) == 4 and x.size() == (2, 3, 4)
    with pytest.raises(IndexError, match="size: dim 3 is out of range for a tensor of 3 dims"):
        x.size(3)
    with pytest.raises(TypeError, match="size: argument 'dim' must be an int"):
        x.size(1.0)
    np.testing.assert_array_equal(x.mT.numpy(), np.swapaxes(np.arange(24.0).reshape(2, 3, 4),
                                                            -1, -2))
    assert x.mT.sbp == (ct.sbp.split(2),) * mesh.ndim     # a view: the split follows the dim
    np.testing.assert_array_equal(x[0].T.numpy(), np.arange(12.0).reshape(3, 4).T)
    with pytest.raises(ValueError, match="mT: the tensor has 1 dims"):
        x[0, 0].mT
    assert x.tolist() == np.arange(24.0).reshape(2, 3, 4).tolist()
    assert x.cpu() is x                              # a cpu placement: itself
    with pytest.raises(TypeError, match="numel: argument 'input' must be a ct.Tensor"):
        ct.numel([1, 2])


def test_inference_mode_is_no_grad_everywhere():
    w = ct.ones(3, requires_grad=True)
    with ct.inference_mode():
        assert not (w * 2).requires_grad and not ct.is_grad_enabled()
    assert ct.is_grad_enabled()
    with ct.inference_mode(False):
        assert (w * 2).requires_grad

    @ct.inference_mode
    def bare(a):
        return a * 2

    @ct.inference_mode()
    def called(a):
        return a * 2
    assert bare.__name__ == "bare" and not bare(w).requires_grad
    assert not called(w).requires_grad and (w * 2).requires_grad
    with pytest.raises(TypeError, match="inference_mode: argument 'mode' must be True or False"):
        ct.inference_mode(1)


# ----------------------------------------------------------------------------- register_hook
def test_register_hook_on_leaves_and_non_leaves(mesh):
    a = np.arange(6.0).reshape(2, 3)
    x = ct.tensor(a, placement=mesh, sbp=(S0,) * mesh.ndim, requires_grad=True)
    w = ct.tensor(a + 1, placement=mesh, requires_grad=True)     # broadcast: a DP parameter
    seen = []
    hx = x.register_hook(lambda g: seen.append(("x", g.numpy())))   # observes, keeps
    w.register_hook(lambda g: g * 0.5)                              # replaces
    y = x * w
    y.register_hook(lambda g: g + 1.0)                              # a non-leaf, replaces
    y.retain_grad()
    z = y * 3.0
    del y                                    # the hook lives on the node, not the tensor
    z.sum().backward()
    np.testing.assert_array_equal(seen[0][1], 4.0 * (a + 1))          # (3 + 1) * w
    np.testing.assert_array_equal(x.grad.numpy(), 4.0 * (a + 1))
    np.testing.assert_array_equal(w.grad.numpy(), 0.5 * 4.0 * a)
    assert w.grad.sbp == w.sbp and x.grad.sbp == x.sbp
    hx.remove()
    (x * 2.0).sum().backward()
    assert len(seen) == 1                                             # removed: not called
    np.testing.assert_array_equal(x.grad.numpy(), 4.0 * (a + 1) + 2.0)


def test_register_hook_matches_torch_and_checks():
    torch = pytest.importorskip("torch")
    a = np.linspace(-1, 1, 6).reshape(2, 3)
    grads = {}
    for lib, make in ((ct, lambda v: ct.tensor(v, requires_grad=True)),
                      (torch, lambda v: torch.tensor(v, requires_grad=True))):
        x = make(a)
        x.register_hook(lambda g: g * 3)
        h = (x * x).tanh()
        h.register_hook(lambda g: g * -2)
        (h.sum() * 1.5).backward()
        (gx,) = (ct.autograd.grad if lib is ct else torch.autograd.grad)((x * 2).sum(), [x])
        grads[lib.__name__] = (np.asarray(x.grad.numpy() if lib is ct else x.grad.numpy()),
                               np.asarray(gx.numpy()))
    np.testing.assert_allclose(grads["ctensor"][0], grads["torch"][0], rtol=1e-12)
    np.testing.assert_allclose(grads["ctensor"][1], grads["torch"][1], rtol=1e-12)  # 6s
    x = ct.ones(2)
    with pytest.raises(ValueError, match="register_hook: cannot register a hook on a tensor "
                                         "that does not require grad"):
        x.register_hook(lambda g: g)
    y = ct.ones(2, requires_grad=True)
    with pytest.raises(TypeError, match="argument 'hook' must be callable"):
        y.register_hook(3)
    y.register_hook(lambda g: ct.ones(3))
    with pytest.raises(ValueError, match=r"returned a gradient of shape \(3,\) for a gradient "
                                         r"of shape \(2,\)"):
        (y * 2).sum().backward()


# ----------------------------------------------------------------------------- creation
def _layouts(mesh):
    one_d = [S0, B] if mesh.ndim == 1 else [S0, B]
    return [(s,) * mesh.ndim for s in one_d] + ([(S0, B), (B, S0)] if mesh.ndim == 2 else [])


def test_new_constructors_follow_the_source(mesh):
    x = ct.tensor(np.ones((5, 3), np.float64), placement=mesh, sbp=(S1,) * mesh.ndim)
    z = x.new_zeros(2, 7)
    assert z.shape == (2, 7) and z.dtype == np.float64 and z.placement == mesh
    assert z.sbp == (B,) * mesh.ndim and not z.requires_grad
    assert x.new_zeros((2, 7)).shape == (2, 7) and x.new_ones([3]).numpy().tolist() == [1] * 3
    assert x.new_zeros(4, dtype=ct.long).dtype == np.int64
    assert x.new_ones(4, requires_grad=True).requires_grad
    f = x.new_full((7,), 2, sbp=(S0,) * mesh.ndim)
    assert f.dtype == np.float64 and f.sbp == (S0,) * mesh.ndim and f.numpy().tolist() == [2] * 7
    assert x.long().new_full((2,), 2.7).numpy().tolist() == [2, 2]         # truncated, int64
    t = x.new_tensor([1, 2])
    assert t.dtype == np.float64 and t.numpy().tolist() == [1.0, 2.0]
    assert x.long().new_tensor([1.9]).numpy().tolist() == [1]
    w = ct.ones(2, requires_grad=True, placement=mesh)
    c = w.new_tensor(w)
    assert c.is_leaf and not c.requires_grad and c.numpy().tolist() == [1.0, 1.0]
    assert x.new_empty(2, 2).shape == (2, 2)
    with pytest.raises(TypeError, match="new_full: argument 'size' must be a tuple or list"):
        x.new_full(3, 1.0)
    torch = pytest.importorskip("torch")
    tx = torch.ones(5, 3, dtype=torch.float64)
    for call in (lambda a: a.new_zeros(2, 3), lambda a: a.new_ones((4,)),
                 lambda a: a.new_full((2, 2), 7), lambda a: a.new_tensor([[1, 2]]),
                 lambda a: a.long().new_full((3,), 2.5), lambda a: a.long().new_tensor([1.5])):
        ours, theirs = call(x), call(tx)
        assert ours.shape == tuple(theirs.shape)
        assert ours.dtype.name == str(theirs.dtype).removeprefix("torch.")
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_eye_linspace_logspace_in_every_layout(mesh):
    for sbp in _layouts(mesh):
        assert_layout(ct.eye(7, 5, placement=mesh, sbp=sbp), np.eye(7, 5, dtype=np.float32))
        assert_layout(ct.eye(5, placement=mesh, sbp=sbp, dtype=ct.long), np.eye(5, dtype=int))
        sbp1 = tuple(s if s != S1 else B for s in sbp)
        assert_layout(ct.linspace(-1, 2, 7, placement=mesh, sbp=sbp1, dtype=ct.float64),
                      np.linspace(-1, 2, 7), rtol=1e-15, atol=1e-15)
        assert_layout(ct.logspace(0, 3, 9, base=2.0, placement=mesh, sbp=sbp1,
                                  dtype=ct.float64), np.logspace(0, 3, 9, base=2.0),
                      rtol=1e-14, atol=0)
    assert ct.linspace(0, 1, 0).shape == (0,) and ct.linspace(2, 5, 1).numpy().tolist() == [2.0]
    assert ct.linspace(0, 1, 3).dtype == np.float32 and ct.eye(2).dtype == np.float32


def test_creation_matches_torch():
    torch = pytest.importorskip("torch")
    cases = [(0, 1, 5), (-3, 7, 11), (0.1, 0.9, 1000), (3, -2.5, 7), (2, 2, 4), (1, 9, 2)]
    for a, b, n in cases:
        for ours, theirs in ((None, None), (ct.float64, torch.float64),
                             (ct.long, torch.long), (ct.int, torch.int32)):
            kw, tkw = ({"dtype": ours}, {"dtype": theirs}) if ours is not None else ({}, {})
            got, want = ct.linspace(a, b, n, **kw).numpy(), torch.linspace(a, b, n, **tkw).numpy()
            assert got.dtype == want.dtype
            if got.dtype.kind == "f":   # torch's vectorised path may differ in the last bit
                np.testing.assert_allclose(got, want, rtol=2 * np.finfo(got.dtype).eps,
                                           atol=4 * np.finfo(got.dtype).eps)
            else:
                np.testing.assert_array_equal(got, want)
        got, want = ct.logspace(a, b, n).numpy(), torch.logspace(a, b, n).numpy()
        np.testing.assert_allclose(got, want, rtol=2e-7)
        got = ct.logspace(a, b, n, base=3.0, dtype=ct.float64).numpy()
        np.testing.assert_allclose(got, torch.logspace(a, b, n, base=3.0,
                                                       dtype=torch.float64).numpy(), rtol=1e-15)
    np.testing.assert_array_equal(ct.eye(3, 5).numpy(), torch.eye(3, 5).numpy())
    arr = np.arange(6, dtype=np.int32).reshape(2, 3)
    for make, tmake in ((ct.from_numpy, torch.from_numpy), (ct.as_tensor, torch.as_tensor)):
        ours, theirs = make(arr), tmake(arr)
        assert ours.dtype == arr.dtype and str(theirs.dtype) == "torch.int32"
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    assert ct.as_tensor([1.0, 2.0]).dtype == np.float32 == torch.as_tensor([1.0]).numpy().dtype
    x = ct.ones(2, 2)
    assert ct.as_tensor(x) is x and ct.as_tensor(x, dtype=ct.float64).dtype == np.float64
    e = ct.empty_like(ct.ones(3, 2, dtype=ct.int, sbp=ct.sbp.split(0)))
    assert e.shape == (3, 2) and e.dtype == np.int32 and e.sbp == (ct.sbp.split(0),)


@pytest.mark.parametrize("call, exc, words", [
    (lambda: ct.eye(-1), ValueError, "eye: argument 'n' must be an int >= 0"),
    (lambda: ct.eye(2, 2.5), ValueError, "eye: argument 'm'"),
    (lambda: ct.linspace(0, 1, -2), ValueError, "linspace: argument 'steps' must be an int"),
    (lambda: ct.linspace(0, "1", 3), TypeError, "linspace: argument 'end' must be a real"),
    (lambda: ct.logspace(0, 1, 3, base=None), TypeError, "logspace: argument 'base'"),
    (lambda: ct.linspace(0, 1, 3, dtype=ct.long, requires_grad=True), ValueError,
     "needs a floating dtype"),
    (lambda: ct.from_numpy([1, 2]), TypeError, "from_numpy: expected np.ndarray (got list)"),
    (lambda: ct.empty_like([1]), TypeError, "empty_like: argument 'input' must be a ct"),
])
def test_creation_errors(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    assert words in str(info.value)


def test_a_leaf_hook_sees_the_whole_gradient_in_data_parallel(mesh):
    rng = np.random.default_rng(3)
    a, xs = rng.standard_normal((3, 2)), rng.standard_normal((8, 3))
    w = ct.tensor(a, placement=mesh, requires_grad=True)               # replicated
    x = ct.tensor(xs, placement=mesh, sbp=(S0,) * mesh.ndim)           # a split batch
    seen = []

    def hook(g):
        seen.append(g.numpy())
        return g.clamp(-1.0, 1.0)       # not linear: needs the reduced gradient's values
    w.register_hook(hook)
    ((x @ w) ** 2).sum().backward()
    full = 2.0 * xs.T @ (xs @ a)
    np.testing.assert_allclose(seen[0], full, rtol=1e-12)
    np.testing.assert_allclose(w.grad.numpy(), np.clip(full, -1, 1), rtol=1e-12)
    assert w.grad.sbp == (B,) * mesh.ndim
