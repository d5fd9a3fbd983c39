"""What a user coming from PyTorch reaches for: the names, their PyTorch semantics where
NumPy's differ, PyTorch's gradient rules (max(dim) ties, prod with zeros), errors that say
the PyTorch spelling of a NumPy keyword, and empty reductions refused before any
communication. Values and gradients of every op on every layout are in tests/test_ops.py."""
import numpy as np
import pytest

import ctensor as ct

S, B, P = ct.sbp.split, ct.sbp.broadcast, ct.sbp.partial_sum


def _t(arr, mesh, sbp=None, grad=False):
    sbp = (B,) * mesh.ndim if sbp is None else sbp
    return ct.tensor(np.asarray(arr, dtype=np.float64), placement=mesh, sbp=sbp,
                     requires_grad=grad)


# ----------------------------------------------------------------------------- max(dim) ties
@pytest.mark.parametrize("split", [0, 1], ids=["rows_split", "reduced_dim_split"])
def test_max_dim_sends_the_gradient_to_the_returned_index(mesh, split):
    arr = [[0.0, 0.5, 0.5, 0.1], [2.0, 2.0, 2.0, 1.0]]
    x = _t(arr, mesh, (S(split),) * mesh.ndim, grad=True)
    values, indices = x.max(1)
    assert indices.numpy().tolist() == [1, 0]
    np.testing.assert_array_equal(values.numpy(), [0.5, 2.0])
    values.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[0, 1, 0, 0], [1, 0, 0, 0]])
    assert x.grad.sbp == x.sbp


def test_min_dim_keepdim_and_amax_share_ties(mesh):
    arr = [[0.5, 0.0, 0.0], [1.0, 3.0, 1.0]]
    x = _t(arr, mesh, (S(0),) * mesh.ndim, grad=True)
    out = x.min(1, keepdim=True)
    assert out.values.shape == (2, 1) and out.indices.numpy().tolist() == [[1], [0]]
    out.values.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[0, 1, 0], [1, 0, 0]])
    y = _t(arr, mesh, (S(1),) * mesh.ndim, grad=True)
    ct.amin(y, 1).sum().backward()                      # amax/amin: ties share evenly
    np.testing.assert_array_equal(y.grad.numpy(), [[0, 0.5, 0.5], [0.5, 0, 0.5]])
    z = _t(arr, mesh, grad=True)
    z.max().backward()                                  # max() of everything: like amax
    np.testing.assert_array_equal(z.grad.numpy(), [[0, 0, 0], [0, 1, 0]])


# ----------------------------------------------------------------------------- empty
EMPTY_REFUSED = [
    ("max", lambda x: x.max()), ("min", lambda x: x.min(0)), ("amax", lambda x: ct.amax(x)),
    ("amin", lambda x: x.amin(0)), ("argmax", lambda x: x.argmax()),
    ("argmin", lambda x: x.argmin(0)),
]


@pytest.mark.parametrize("name, fn", EMPTY_REFUSED, ids=[n for n, _ in EMPTY_REFUSED])
def test_empty_reductions_raise_before_communicating(mesh, name, fn):
    x = ct.zeros(0, 5, placement=mesh, sbp=(S(1),) * mesh.ndim)
    with ct.debug.comm_log() as log:
        with pytest.raises(ValueError, match=rf"^{name}: cannot reduce dim 0 of size 0 "
                                             rf"\(input shape \(0, 5\)\).*accepted"):
            fn(x)
    assert log.collectives() == []


def test_empty_reductions_with_a_value_stay_valid(mesh):
    x = ct.zeros(0, 5, placement=mesh, sbp=(S(1),) * mesh.ndim)
    assert x.sum().item() == 0.0 and x.prod().item() == 1.0
    assert np.isnan(x.mean().item())
    assert x.max(1).values.shape == (0,) and x.argmax(1).shape == (0,)  # a non-empty dim
    assert ct.amax(x, 1).shape == (0,)


def test_topk_k_out_of_range(mesh):
    x = _t(np.arange(10.0).reshape(2, 5), mesh)
    with pytest.raises(ValueError, match=r"topk: argument 'k' is 6 .* accepted: 0\.\.5"):
        x.topk(6)
    with pytest.raises(ValueError, match="topk: argument 'k' is -1"):
        x.topk(-1, dim=1)
    with pytest.raises(TypeError, match="topk: argument 'k' must be an int"):
        x.topk(2.0)
    assert x.topk(0).values.shape == (2, 0)


# ----------------------------------------------------------------------------- keywords
NUMPY_KEYWORDS = [
    (lambda x: x.mean(axis=1), "mean", "axis", "use dim="),
    (lambda x: x.sum(axis=(0, 1)), "sum", "axis", "use dim="),
    (lambda x: x.sum(0, keepdims=True), "sum", "keepdims", "use keepdim="),
    (lambda x: x.max(axis=0), "max", "axis", "use dim="),
    (lambda x: x.argmax(axis=0), "argmax", "axis", "use dim="),
    (lambda x: x.reshape(newshape=(3, 2)), "reshape", "newshape",
     "pass shape positionally"),
    (lambda x: x.var(ddof=0), "var", "ddof", "use correction="),
    (lambda x: x.norm(ord=1), "norm", "ord", "use p="),
    (lambda x: x.transpose(axis1=0, axis2=1), "transpose", "axis1", "use dim0="),
    (lambda x: ct.cat([x, x], axis=1), "cat", "axis", "use dim="),
    (lambda x: ct.softmax(x, axis=1), "softmax", "axis", "use dim="),
    (lambda x: x.cumsum(axis=0), "cumsum", "axis", "use dim="),
    (lambda x: x.sort(axis=0), "sort", "axis", "use dim="),
    (lambda x: x.flip(axis=0), "flip", "axis", "accepted keywords: x, dims"),
    (lambda x: x.sum(dims=0), "sum", "dims", "accepted keywords: x, dim, keepdim"),
]


@pytest.mark.parametrize("fn, op, keyword, hint", NUMPY_KEYWORDS,
                         ids=[f"{op}-{kw}" for _, op, kw, _ in NUMPY_KEYWORDS])
def test_numpy_keywords_name_the_pytorch_spelling(fn, op, keyword, hint):
    x = ct.ones(2, 3)
    with pytest.raises(TypeError) as info:
        fn(x)
    message = str(info.value)
    assert message.startswith(f"{op}: got an unexpected keyword argument '{keyword}'; ")
    assert hint in message
    if hint.startswith("use"):
        assert "ctensor follows PyTorch" in message


# ----------------------------------------------------------------------------- semantics
def test_names_with_pytorch_semantics(mesh):
    a = np.arange(6.0).reshape(2, 3)
    x = _t(a, mesh, (S(0),) * mesh.ndim)
    np.testing.assert_array_equal(x.repeat(2, 1).numpy(), np.tile(a, (2, 1)))  # not np.repeat
    assert x.repeat(1, 1) is x
    assert x.t().shape == (3, 2) and x.t().sbp == (S(1),) * mesh.ndim
    v = _t([1.0, 2.0], mesh)
    assert v.t() is v and _t(3.0, mesh).t().shape == ()
    with pytest.raises(ValueError, match="t: the input has 3 dims"):
        _t(np.zeros((2, 2, 2)), mesh).t()
    out = x.sort(1, descending=True)
    assert out.values.numpy().tolist() == [[2, 1, 0], [5, 4, 3]]
    assert out.indices.dtype == np.int64 and out.indices.numpy().tolist() == [[2, 1, 0]] * 2
    values, indices = x.topk(2, largest=False)
    assert values.numpy().tolist() == [[0, 1], [3, 4]]
    assert x.var(1).numpy().tolist() == [1.0, 1.0]                # unbiased by default
    np.testing.assert_allclose(x.std(unbiased=False).item(), a.std())
    np.testing.assert_allclose(x.norm().item(), np.linalg.norm(a))  # Frobenius
    assert x.half().dtype == np.float16 and x.long().dtype == np.int64
    assert x.int().dtype == np.int32 and x.bool().numpy().tolist() == [[False, True, True],
                                                                        [True] * 3]
    assert x.long().type_as(x).dtype == np.float64


def test_prod_gradient_with_zeros(mesh):
    arr = [[1.0, 0.0, 3.0], [0.0, 0.0, 2.0], [1.0, 2.0, 3.0]]
    x = _t(arr, mesh, (S(0),) * mesh.ndim, grad=True)
    x.prod(1).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[0, 3, 0], [0, 0, 0], [6, 3, 2]])
    y = _t(arr[0], mesh, grad=True)
    y.prod().backward()
    np.testing.assert_array_equal(y.grad.numpy(), [0, 3, 0])


def test_gather_gradient_accumulates_repeated_indices(mesh):
    x = _t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], mesh, (S(1),) * mesh.ndim, grad=True)
    index = ct.tensor(np.array([[0, 0, 2, 0], [1, 1, 1, 2]]), placement=mesh)
    out = x.gather(1, index)
    np.testing.assert_array_equal(out.numpy(), [[1, 1, 3, 1], [5, 5, 5, 6]])
    out.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[3, 0, 1], [0, 3, 1]])
    with pytest.raises(TypeError, match="gather: argument 'index' must be an integer"):
        x.gather(1, x)
    with pytest.raises(ValueError, match="gather: argument 'index' has 1 dims"):
        x.gather(1, ct.tensor(np.array([0, 1]), placement=mesh))


def test_einsum_split_contracted_label_is_partial_without_communication(mesh):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((4, 6)), rng.standard_normal((6, 2))
    x = _t(a, mesh, (S(1),) * mesh.ndim)
    y = _t(b, mesh, (S(0),) * mesh.ndim)
    rows, whole = _t(a, mesh, (S(0),) * mesh.ndim), _t(b, mesh)
    with ct.debug.comm_log() as log:
        out = ct.einsum("ij,jk->ik", x, y)
        kept = ct.einsum("ij,jk->ki", rows, whole)
    assert log.collectives() == []
    assert out.sbp == (P,) * mesh.ndim
    assert kept.sbp == (S(1),) * mesh.ndim
    np.testing.assert_allclose(out.numpy(), a @ b)
    np.testing.assert_allclose(kept.numpy(), (a @ b).T)
    with pytest.raises(ValueError, match="einsum: equation 'ij,jk' names 2 operands but 1"):
        ct.einsum("ij,jk", x)


def test_cumsum_along_a_split_dim(mesh):
    a = np.arange(1.0, 8.0)
    x = _t(a, mesh, (S(0),) * mesh.ndim, grad=True)
    c = x.cumsum(0)
    np.testing.assert_array_equal(c.numpy(), np.cumsum(a))
    (c * _t(np.arange(7.0), mesh)).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.cumsum(np.arange(7.0)[::-1])[::-1])
    assert x.grad.sbp == x.sbp


# ============================================================================= issue 25:
# elementwise, reductions, scans, shape and linear-algebra names, and PyTorch's behaviour
# (values and gradients on every layout are the samples' job in tests/test_ops.py; here each
# name is checked against torch itself when it is importable)
import warnings  # noqa: E402


def _torch():
    return pytest.importorskip("torch")


def test_floating_point_exceptions_give_inf_and_nan_without_a_warning(mesh):
    x = _t([0.0, -1.0, 4.0], mesh, (S(0),) * mesh.ndim)
    big = ct.tensor(np.array([60000.0, 1.0], dtype=np.float16), placement=mesh)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                 # a RuntimeWarning would fail here
        logs, roots = x.log().numpy(), x.sqrt().numpy()
        squares = (big * big).numpy()
        ratios = (x / 0.0).numpy()
    assert logs[0] == -np.inf and np.isnan(logs[1]) and logs[2] == np.log(4.0)
    assert np.isnan(roots[1]) and roots[2] == 2.0
    assert squares[0] == np.inf and squares[1] == 1.0
    assert np.isnan(ratios[0]) and ratios[1] == -np.inf and ratios[2] == np.inf
    if len(mesh.rank_list) > 1:                      # a float16 sum of partials that overflows
        local = {r: np.array([40000.0], dtype=np.float16) for r in mesh.rank_list}
        partial = ct.from_local(local if not ct.launched_by_mpi() else
                                local.get(ct.rank()), placement=mesh,
                                sbp=(ct.sbp.partial_sum,) * mesh.ndim, shape=(1,))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert partial.to_global(sbp=(B,) * mesh.ndim).numpy()[0] == np.inf
    with warnings.catch_warnings():                  # NumPy itself is left as it was
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning):
            np.log(np.zeros(1))


def test_exp_backward_keeps_its_output_only(mesh):
    a = np.array([0.5, -1.0, 2.0])
    x = _t(a, mesh, grad=True)
    y = x * 1.0
    z = y.exp()
    y.add_(1.0)                                      # exp reads its output, not y
    z.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.exp(a))
    w = x * 1.0
    v = w * w
    w.add_(1.0)                                      # mul reads its operands: an error
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        v.sum().backward()


def test_matmul_of_two_dtypes_raises_as_in_pytorch(mesh):
    import ctensor.nn as nn
    x32 = ct.ones(2, 3, placement=mesh)
    w64 = ct.ones(3, 4, placement=mesh, dtype=ct.float64)
    with pytest.raises(TypeError, match=r"^matmul: expected both operands to have the same "
                                        r"dtype, got float32 and float64 .*cast one"):
        x32 @ w64
    with ct.debug.comm_log() as log:
        with pytest.raises(TypeError, match="matmul: expected both operands"):
            ct.linear(x32, w64.t())
    assert log.collectives() == []
    layer = nn.Linear(3, 2)                          # float32 parameters
    with pytest.raises(TypeError, match="got float64 and float32"):
        layer(ct.ones(4, 3, dtype=ct.float64))
    assert layer(ct.ones(4, 3)).dtype == np.float32
    assert (ct.ones(2, 3, dtype=ct.int64) @ ct.ones(3, 2, dtype=ct.int64)).dtype == np.int64


# ----------------------------------------------------------------------------- issue 25: creation, RNG, dtypes, tensor basics, optim
TORCH_NAMES_25 = {
    "ct": ["float", "double", "half", "short", "int", "long", "bool", "is_tensor", "numel",
           "is_floating_point", "inference_mode", "empty_like", "eye", "linspace", "logspace",
           "from_numpy", "as_tensor", "randperm", "randint_like", "multinomial", "bernoulli",
           "initial_seed",
           "seed", "manual_seed", "Generator", "default_generator"],
    "Tensor": ["new_zeros", "new_ones", "new_full", "new_empty", "new_tensor", "uniform_",
               "normal_", "exponential_", "bernoulli_", "bernoulli", "multinomial", "exp_",
               "register_hook", "is_floating_point", "element_size", "nelement", "numel",
               "dim", "size", "tolist", "cpu", "mT", "T", "__format__"],
    "optim": ["ExponentialLR", "LinearLR", "OneCycleLR", "SequentialLR"],
    "Generator": ["manual_seed", "seed", "initial_seed", "get_state", "set_state"],
}


def test_issue_25_names_exist_as_in_torch():
    import ctensor.nn as nn
    import ctensor.optim as optim
    homes = {"ct": ct, "Tensor": ct.Tensor, "optim": optim.lr_scheduler,
             "Generator": ct.Generator}
    for home, names in TORCH_NAMES_25.items():
        missing = [n for n in names if not hasattr(homes[home], n)]
        assert not missing, (home, missing)
    assert callable(nn.utils.clip_grad_value_)
    torch = pytest.importorskip("torch")
    theirs = {"ct": torch, "Tensor": torch.Tensor, "optim": torch.optim.lr_scheduler,
              "Generator": torch.Generator}
    for home, names in TORCH_NAMES_25.items():        # the same names exist in PyTorch
        assert [n for n in names if n != "default_generator" and not hasattr(theirs[home], n)
                and not (home == "ct" and n == "bool")] == [], home
    for name in ("float", "double", "half", "short", "int", "long", "bool"):
        ours, their = getattr(ct, name), getattr(torch, name)
        assert torch.zeros(1, dtype=their).numpy().dtype == ours, name


def test_issue_25_sampling_matches_torch_in_kind(mesh):
    """Shapes, dtypes, supports and argument forms as torch's (the values come from another
    generator, so they differ; the distributions are checked in tests/test_random.py)."""
    torch = pytest.importorskip("torch")
    g, tg = ct.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    w = np.array([[0.2, 0.0, 0.5, 0.3], [1.0, 1.0, 0.0, 2.0]])
    x = _t(w, mesh, (S(0),) * mesh.ndim)
    for args in [(2,), (3, True), (1, False)]:
        ours = ct.multinomial(x, *args, generator=g)
        theirs = torch.multinomial(torch.tensor(w), *args, generator=tg)
        assert ours.shape == tuple(theirs.shape) and ours.dtype == np.int64
        assert (w[np.arange(2)[:, None], ours.numpy()] > 0).all()
    perm = ct.randperm(9, generator=g, placement=mesh, sbp=(S(0),) * mesh.ndim)
    tperm = torch.randperm(9, generator=tg)
    assert perm.dtype == np.int64 and str(tperm.dtype) == "torch.int64"
    assert sorted(perm.numpy().tolist()) == sorted(tperm.tolist())
    z = _t(np.zeros((5, 4)), mesh, (S(1),) * mesh.ndim)
    tz = torch.zeros(5, 4, dtype=torch.float64)
    for name, args in [("uniform_", (-1.0, 2.0)), ("normal_", (0.0, 3.0)),
                       ("exponential_", (1.5,)), ("bernoulli_", (0.4,))]:
        ours = getattr(z, name)(*args, generator=g).numpy()
        theirs = getattr(tz, name)(*args, generator=tg).numpy()
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
        if name == "uniform_":
            assert ours.min() >= -1 and ours.max() < 2
        if name in ("exponential_", "bernoulli_"):
            assert ours.min() >= 0
        if name == "bernoulli_":
            assert set(np.unique(ours)) <= {0, 1}
    b = ct.bernoulli(_t(np.full((3, 2), 0.5), mesh), generator=g)
    tb = torch.bernoulli(torch.full((3, 2), 0.5, dtype=torch.float64), generator=tg)
    assert b.dtype == tb.numpy().dtype and b.shape == tuple(tb.shape)
    assert g.get_state()["counter"] == 9 and tg.initial_seed() == g.initial_seed() == 0


# ----------------------------------------------------------------------------- issue 25 vs torch
def _mixed(shape, seed=0):
    """Normals with exact halves, zeros and ties (where rounding and extremes differ)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * 2.0
    flat = x.reshape(-1)
    flat[::4] = np.round(flat[::4] * 2.0) / 2.0
    return x


def _positive(shape, seed=1):
    return np.random.default_rng(seed).uniform(0.5, 2.0, shape)


INF, NAN = float("inf"), float("nan")
# (name, ctensor function, torch function, inputs, differentiable inputs)
AGAINST_TORCH = [
    ("erf", lambda c, x: x.erf(), lambda t, x: x.erf(), [(5, 3)], (0,)),
    ("floor", lambda c, x: c.floor(x), lambda t, x: t.floor(x), [(5, 3)], (0,)),
    ("ceil", lambda c, x: x.ceil(), lambda t, x: x.ceil(), [(5, 3)], (0,)),
    ("trunc", lambda c, x: x.trunc(), lambda t, x: x.trunc(), [(5, 3)], (0,)),
    ("round", lambda c, x: x.round(), lambda t, x: x.round(), [(5, 3)], (0,)),
    ("round_decimals", lambda c, x: c.round(x * 7, decimals=1),
     lambda t, x: t.round(x * 7, decimals=1), [(5, 3)], (0,)),
    ("round_negative_decimals", lambda c, x: c.round(x * 300, decimals=-2),
     lambda t, x: t.round(x * 300, decimals=-2), [(5, 3)], ()),
    ("remainder", lambda c, x, y: x % y, lambda t, x, y: x % y, [(5, 3), (3,)], (0, 1)),
    ("fmod", lambda c, x, y: c.fmod(x, y), lambda t, x, y: t.fmod(x, y), [(5, 3), (5, 3)],
     (0, 1)),
    ("floor_divide", lambda c, x, y: x // y, lambda t, x, y: x // y, [(5, 3), (5, 3)], ()),
    ("rfloordiv", lambda c, x: 3.0 // x, lambda t, x: 3.0 // x, [(5, 3)], ()),
    ("isnan", lambda c, x: (x / x).isnan(), lambda t, x: (x / x).isnan(), [(5, 3)], ()),
    ("isinf", lambda c, x: c.isinf(1 / (x - x)), lambda t, x: t.isinf(1 / (x - x)), [(5, 3)],
     ()),
    ("isfinite", lambda c, x: (x.log()).isfinite(), lambda t, x: x.log().isfinite(), [(5, 3)],
     ()),
    ("nan_to_num", lambda c, x: c.nan_to_num(x.log(), posinf=5.0),
     lambda t, x: t.nan_to_num(x.log(), posinf=5.0), [(5, 3)], ()),
    ("clip", lambda c, x: x.clip(-0.5, 0.7), lambda t, x: x.clip(-0.5, 0.7), [(5, 3)], (0,)),
    ("max_elementwise", lambda c, x, y: c.max(x, y), lambda t, x, y: t.max(x, y),
     [(5, 3), (3,)], (0, 1)),
    ("min_elementwise", lambda c, x, y: x.min(y), lambda t, x, y: x.min(y), [(5, 3), (5, 3)],
     (0, 1)),
    ("any", lambda c, x: (x > 1.5).any(), lambda t, x: (x > 1.5).any(), [(5, 3)], ()),
    ("any_dim", lambda c, x: c.any(x > 1.0, 1, keepdim=True),
     lambda t, x: t.any(x > 1.0, 1, keepdim=True), [(5, 3)], ()),
    ("all_dim", lambda c, x: (x > -1.0).all(0), lambda t, x: (x > -1.0).all(0), [(5, 3)], ()),
    ("logsumexp", lambda c, x: x.logsumexp(1), lambda t, x: x.logsumexp(1), [(5, 3)], (0,)),
    ("logsumexp_dims", lambda c, x: c.logsumexp(x * 40, (0, 1), keepdim=True),
     lambda t, x: t.logsumexp(x * 40, (0, 1), keepdim=True), [(5, 3)], (0,)),
    ("cumprod", lambda c, x: x.cumprod(0), lambda t, x: x.cumprod(0), [(5, 3)], (0,)),
    ("diff", lambda c, x: x.diff(dim=0), lambda t, x: x.diff(dim=0), [(5, 3)], (0,)),
    ("diff_append", lambda c, x, y: c.diff(x, n=2, append=y),
     lambda t, x, y: t.diff(x, n=2, append=y), [(5, 3), (5, 2)], (0, 1)),
    ("roll", lambda c, x: x.roll((2, -1), (0, 1)), lambda t, x: x.roll((2, -1), (0, 1)),
     [(5, 3)], (0,)),
    ("roll_flat", lambda c, x: c.roll(x, 4), lambda t, x: t.roll(x, 4), [(5, 3)], (0,)),
    ("repeat_interleave", lambda c, x: x.repeat_interleave(2, dim=0),
     lambda t, x: x.repeat_interleave(2, dim=0), [(5, 3)], (0,)),
    ("repeat_interleave_tensor",
     lambda c, x: c.repeat_interleave(x, c.tensor(np.array([0, 2, 1])), dim=1),
     lambda t, x: t.repeat_interleave(x, t.tensor([0, 2, 1]), dim=1), [(5, 3)], (0,)),
    ("unbind", lambda c, x: x.unbind(1)[2], lambda t, x: x.unbind(1)[2], [(5, 3)], (0,)),
    ("unflatten", lambda c, x: x.unflatten(1, (2, 3)), lambda t, x: x.unflatten(1, (2, 3)),
     [(5, 6)], (0,)),
    ("movedim", lambda c, x: c.movedim(x, 0, 2), lambda t, x: t.movedim(x, 0, 2),
     [(5, 3, 2)], (0,)),
    ("expand_as", lambda c, x, y: x.expand_as(y), lambda t, x, y: x.expand_as(y),
     [(1, 3), (5, 3)], (0,)),
    ("concat", lambda c, x, y: c.concat([x, y], 1), lambda t, x, y: t.concat([x, y], 1),
     [(5, 3), (5, 2)], (0, 1)),
    ("mm", lambda c, x, y: x.mm(y), lambda t, x, y: x.mm(y), [(5, 3), (3, 4)], (0, 1)),
    ("bmm", lambda c, x, y: c.bmm(x, y), lambda t, x, y: t.bmm(x, y), [(5, 2, 3), (5, 3, 2)],
     (0, 1)),
    ("addmm", lambda c, b, x, y: c.addmm(b, x, y, beta=0.5, alpha=3),
     lambda t, b, x, y: t.addmm(b, x, y, beta=0.5, alpha=3), [(4,), (5, 3), (3, 4)],
     (0, 1, 2)),
    ("baddbmm", lambda c, b, x, y: b.baddbmm(x, y, alpha=0.5),
     lambda t, b, x, y: b.baddbmm(x, y, alpha=0.5), [(5, 2, 2), (5, 2, 3), (5, 3, 2)],
     (0, 1, 2)),
    ("outer", lambda c, x, y: c.outer(x, y), lambda t, x, y: t.outer(x, y), [(5,), (3,)],
     (0, 1)),
    ("ger", lambda c, x, y: x.ger(y), lambda t, x, y: x.outer(y), [(5,), (3,)], (0, 1)),
    ("sum_dtype", lambda c, x: (x * 4).long().sum(0, dtype=c.float64),
     lambda t, x: (x * 4).long().sum(0, dtype=t.float64), [(5, 3)], ()),
    ("mean_dtype", lambda c, x: (x * 4).long().mean(dtype=c.float64),
     lambda t, x: (x * 4).long().mean(dtype=t.float64), [(5, 3)], ()),
    ("sum_int_dtype", lambda c, x: (x > 0).sum(1, dtype=c.int32),
     lambda t, x: (x > 0).sum(1, dtype=t.int32), [(5, 3)], ()),
    ("cumsum_dtype", lambda c, x: (x > 0).cumsum(0, dtype=c.int32),
     lambda t, x: (x > 0).cumsum(0, dtype=t.int32), [(5, 3)], ()),
    ("prod_dtype", lambda c, x: (x * 2).long().prod(0, dtype=c.int16),
     lambda t, x: (x * 2).long().prod(0, dtype=t.int16), [(5, 3)], ()),
    ("cumprod_dtype", lambda c, x: (x * 2).long().cumprod(1, dtype=c.float64),
     lambda t, x: (x * 2).long().cumprod(1, dtype=t.float64), [(5, 3)], ()),
    ("linalg.norm", lambda c, x: c.linalg.norm(x), lambda t, x: t.linalg.norm(x), [(5, 3)],
     (0,)),
    ("linalg.norm_dim", lambda c, x: c.linalg.norm(x, dim=0, keepdim=True),
     lambda t, x: t.linalg.norm(x, dim=0, keepdim=True), [(5, 3)], (0,)),
    ("linalg.norm_matrix", lambda c, x: c.linalg.norm(x, ord=INF),
     lambda t, x: t.linalg.norm(x, ord=INF), [(5, 3)], (0,)),
    ("linalg.vector_norm", lambda c, x: c.linalg.vector_norm(x, ord=-INF, dim=1),
     lambda t, x: t.linalg.vector_norm(x, ord=-INF, dim=1), [(5, 3)], (0,)),
    ("linalg.matrix_norm", lambda c, x: c.linalg.matrix_norm(x, ord=1),
     lambda t, x: t.linalg.matrix_norm(x, ord=1), [(2, 5, 3)], (0,)),
    ("isclose", lambda c, x, y: c.isclose(x, x + y * 1e-6, rtol=1e-6),
     lambda t, x, y: t.isclose(x, x + y * 1e-6, rtol=1e-6), [(5, 3), (5, 3)], ()),
]
NEEDS_POSITIVE = {"remainder", "fmod", "floor_divide", "rfloordiv", "isfinite"}


@pytest.mark.parametrize("name, ours, theirs, shapes, grads", AGAINST_TORCH,
                         ids=[entry[0] for entry in AGAINST_TORCH])
def test_issue25_names_match_torch(mesh, name, ours, theirs, shapes, grads):
    torch = _torch()
    arrays = [_mixed(s, i) for i, s in enumerate(shapes)]
    if name in NEEDS_POSITIVE:  # a divisor of both signs away from zero; a log of a zero
        arrays[-1] = _positive(shapes[-1]) * np.where(_mixed(shapes[-1], 5) > 0, 1.0, -1.0)
        if name == "isfinite":
            arrays[0].reshape(-1)[::3] = 0.0
    xs = [_t(a, mesh, (S(0),) * mesh.ndim, grad=i in grads) for i, a in enumerate(arrays)]
    ts = [torch.tensor(a, requires_grad=i in grads) for i, a in enumerate(arrays)]
    out, expected = ours(ct, *xs), theirs(torch, *ts)
    assert out.shape == tuple(expected.shape)
    assert out.dtype == expected.detach().numpy().dtype, (out.dtype, expected.dtype)
    np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=1e-12, atol=1e-12)
    if grads:
        weight = np.random.default_rng(9).standard_normal(out.shape)
        (out * _t(weight, mesh)).sum().backward()
        (expected * torch.tensor(weight)).sum().backward()
        for i in grads:
            np.testing.assert_allclose(xs[i].grad.numpy(), ts[i].grad.numpy(), rtol=1e-10,
                                       atol=1e-12, err_msg=f"gradient of input {i}")


def test_issue25_python_results_match_torch(mesh):
    torch = _torch()
    a = np.array([1.0, INF, NAN, 2.0])
    x, t = _t(a, mesh, (S(0),) * mesh.ndim), torch.tensor(a)
    for kwargs in ({}, {"equal_nan": True}):
        assert ct.allclose(x, x, **kwargs) == torch.allclose(t, t, **kwargs)
    assert ct.equal(x, x) is torch.equal(t, t) is False           # nan is never equal
    y, u = _t(a[:2], mesh), torch.tensor(a[:2])
    assert x[:2].equal(y) is torch.equal(t[:2], u) is True
    assert ct.equal(x, y) is False                                 # shapes differ
    assert ct.allclose(y, y + 1e-9) is torch.allclose(u, u + 1e-9) is True


def test_issue25_errors_name_the_op_and_the_fix(mesh):
    x = _t(np.ones((2, 3)), mesh, (S(0),) * mesh.ndim)
    with ct.debug.comm_log() as log:
        with pytest.raises(ValueError, match=r"mm: operand 1 has shape \(2, 3, 1\); accepted: "
                                             r"a matrix"):
            ct.mm(x, _t(np.ones((2, 3, 1)), mesh))
        with pytest.raises(ValueError, match="bmm: operand 0 has shape"):
            ct.bmm(x, x)
        with pytest.raises(ValueError, match="linalg.matrix_norm: argument 'ord' is 'nuc'"):
            ct.linalg.norm(x, ord="nuc")
        with pytest.raises(TypeError, match="linalg.norm: the input has dtype int64"):
            ct.linalg.norm(x.long())
        with pytest.raises(ValueError, match="roll: arguments 'shifts' \\(1, 2\\) and 'dims'"):
            x.roll((1, 2), 0)
        with pytest.raises(ValueError, match="repeat_interleave: argument 'repeats' has 2 "
                                             "entries but the dim has size 3"):
            x.repeat_interleave(ct.tensor(np.array([1, 2])), dim=1)
        with pytest.raises(ValueError, match=r"unflatten: sizes \(2, 2\) multiply to 4"):
            x.unflatten(1, (2, 2))
        with pytest.raises(ValueError, match="diff: argument 'n' is -1"):
            x.diff(n=-1)
        with pytest.raises(TypeError, match="round: argument 'decimals' must be an int"):
            x.round(decimals=1.5)
        with pytest.raises(TypeError, match="max: give either 'dim' or a tensor 'other'"):
            ct.max(x, 0, other=x)
    assert log.collectives() == []


# ----------------------------------------------------------------------------- issue 25: indexing
INDEXING_NAMES = {
    "ct": ["index_select", "index_add", "index_copy", "index_fill", "scatter", "scatter_add",
           "scatter_reduce",
           "take_along_dim", "nonzero", "argwhere", "masked_select", "index_put", "where",
           "gather", "masked_fill"],
    "Tensor": ["index_select", "index_add", "index_add_", "index_copy", "index_copy_",
               "index_fill", "index_fill_", "scatter", "scatter_", "scatter_add",
               "scatter_add_", "scatter_reduce", "scatter_reduce_", "take_along_dim", "nonzero", "argwhere", "masked_select",
               "masked_fill", "masked_fill_", "index_put", "index_put_", "__setitem__"],
}


def test_indexing_names_exist_as_in_torch():
    homes = {"ct": ct, "Tensor": ct.Tensor}
    for home, names in INDEXING_NAMES.items():
        assert [n for n in names if not hasattr(homes[home], n)] == [], home
    torch = pytest.importorskip("torch")
    theirs = {"ct": torch, "Tensor": torch.Tensor}
    for home, names in INDEXING_NAMES.items():
        assert [n for n in names if not hasattr(theirs[home], n)] == [], home


_I = np.array([3, 0, 3, 1])  # repeated entries: accumulating ops add, gradients add
_J = np.array([[2, 0], [1, 1], [0, 2], [2, 2], [1, 0]])  # along dim 1 of (5, 3)
# (name, ctensor function, torch function (the same code on the other module), differentiable)
INDEXING_AGAINST_TORCH = [
    ("index_select", lambda m, x, i: m.index_select(x, 0, i(_I)), True),
    ("index_select_method", lambda m, x, i: x.index_select(1, i(np.array([2, 0]))), True),
    ("index_add", lambda m, x, i: m.index_add(x, 0, i(_I), x[:4] * 3.0, alpha=0.5), True),
    ("index_add_", lambda m, x, i: x.clone().index_add_(0, i(_I), x[1:] * 1.0), True),
    ("index_copy", lambda m, x, i: x.index_copy(0, i(np.array([4, 1])), x[:2] * 2.0), True),
    ("index_copy_", lambda m, x, i: x.clone().index_copy_(1, i(np.array([2])), x[:, :1]),
     True),
    ("index_fill", lambda m, x, i: x.index_fill(1, i(np.array([0, 2])), -3.0), True),
    ("index_fill_", lambda m, x, i: x.clone().index_fill_(0, i(np.array([1])), 2.0), True),
    ("scatter_src", lambda m, x, i: m.scatter(x, 1, i(_J[:, :1]), x[:, :1] * 2.0), True),
    ("scatter_src_larger", lambda m, x, i: m.scatter(x.detach(), 1, i(_J[:, :1]), x * 2.0),
     False),  # (torch's backward refuses a src larger than index)
    ("scatter_value", lambda m, x, i: x.scatter(1, i(_J[:, :1]), 0.25), True),
    ("scatter_add", lambda m, x, i: m.scatter_add(x, 1, i(_J), x[:, :2] * 5.0), True),
    ("scatter_add_", lambda m, x, i: x.clone().scatter_add_(0, i(_J[:3]), x[:3, :2]), True),
    ("scatter_reduce_add", lambda m, x, i: x.scatter(1, i(_J), x, reduce="add"), False),
    ("scatter_reduce_sum", lambda m, x, i: m.scatter_reduce(x, 1, i(_J), x[:, :2] * 2.0,
                                                            "sum", include_self=False), True),
    ("scatter_reduce_mean", lambda m, x, i: x.scatter_reduce(
        0, i(np.repeat(_J[:4, :1], 3, axis=1)), x[:4] * 3.0, "mean"), True),
    ("scatter_reduce_amax_ties", lambda m, x, i: x.scatter_reduce(
        1, i(_J), m.cat([x[:, :1], x[:, :1]], 1), "amax"), True),
    ("scatter_reduce_amin_", lambda m, x, i: x.clone().scatter_reduce_(
        1, i(_J), -x[:, 1:], "amin", include_self=False), True),
    ("scatter_reduce_prod", lambda m, x, i: x.scatter_reduce(1, i(_J), x[:, :2], "prod"),
     False),
    ("take_along_dim", lambda m, x, i: m.take_along_dim(x, i(_J), 1), True),
    ("take_along_dim_flat", lambda m, x, i: m.take_along_dim(x, i(_I)), True),
    ("masked_select", lambda m, x, i: m.masked_select(x, x > 0.1), True),
    ("masked_fill_", lambda m, x, i: x.clone().masked_fill_(x < 0, 0.5), True),
    ("nonzero", lambda m, x, i: m.nonzero(x > 0), False),
    ("argwhere", lambda m, x, i: m.argwhere(x < 0), False),
    ("where_one_argument", lambda m, x, i: m.where(x > 0)[1], False),
    ("index_put", lambda m, x, i: x.index_put((i(_I), i(np.array([0, 1, 2, 0]))),
                                              x[0, :1] * 1.0, accumulate=True), True),
    ("index_put_", lambda m, x, i: x.clone().index_put_((i(np.array([4, 2])),), x[:2] * 3.0),
     True),
    ("getitem_mask", lambda m, x, i: x[x > 0], True),
    ("getitem_rows_cols", lambda m, x, i: x[i(_I), i(np.array([-1, 0, 2, 2]))], True),
    ("getitem_columns", lambda m, x, i: x[:, i(np.array([[2, 0]]))], True),
]


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")
@pytest.mark.parametrize("name, fn, differentiable", INDEXING_AGAINST_TORCH,
                         ids=[entry[0] for entry in INDEXING_AGAINST_TORCH])
def test_indexing_ops_match_torch(mesh, name, fn, differentiable):
    torch = pytest.importorskip("torch")
    a = np.random.default_rng(len(name)).standard_normal((5, 3))
    for sbp in [(S(0),) * mesh.ndim, (S(1),) * mesh.ndim, (B,) * mesh.ndim]:
        x = _t(a, mesh, sbp, grad=differentiable)
        t = torch.tensor(a, requires_grad=differentiable)
        out = fn(ct, x, lambda arr: ct.tensor(arr, placement=mesh))
        expected = fn(torch, t, torch.from_numpy)
        assert out.shape == tuple(expected.shape) and \
            out.dtype == expected.detach().numpy().dtype, (out.shape, out.dtype)
        np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=1e-12)
        if differentiable:
            weight = np.random.default_rng(1).standard_normal(out.shape)
            (out * _t(weight, mesh)).sum().backward()
            (expected * torch.tensor(weight)).sum().backward()
            np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-12,
                                       err_msg=f"gradient, {sbp}")


# ----------------------------------------------------------------------------- issue 25: nn
NN_NAMES = {
    "nn": ["Linear", "Embedding", "LayerNorm", "RMSNorm", "Dropout", "GELU", "ReLU", "SiLU",
           "Tanh", "Sigmoid", "Softmax", "LogSoftmax", "Softplus", "LeakyReLU", "Flatten",
           "Unflatten", "Identity", "Sequential", "ModuleList", "ModuleDict", "ParameterList",
           "ParameterDict", "MultiheadAttention", "CrossEntropyLoss", "NLLLoss", "MSELoss",
           "L1Loss", "SmoothL1Loss", "HuberLoss", "BCELoss", "BCEWithLogitsLoss",
           "KLDivLoss", "ELU", "SELU", "Mish", "ReLU6", "Hardswish", "Hardtanh",
           "LogSigmoid", "GLU", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d",
           "TransformerEncoderLayer", "TransformerEncoder"],
    "nn.functional": ["linear", "relu", "gelu", "silu", "sigmoid", "tanh", "softplus",
                      "leaky_relu", "softmax", "log_softmax", "layer_norm", "rms_norm",
                      "embedding", "one_hot", "pad", "normalize", "dropout",
                      "scaled_dot_product_attention", "cross_entropy", "nll_loss",
                      "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
                      "binary_cross_entropy", "binary_cross_entropy_with_logits",
                      "elu", "selu", "logsigmoid", "mish", "hardtanh", "relu6", "hardswish",
                      "glu", "cosine_similarity", "kl_div"],
    "nn.init": ["calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_",
                "zeros_", "ones_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
                "kaiming_normal_"],
    "nn.Module": ["apply", "half", "float", "double", "named_parameters", "state_dict",
                  "load_state_dict", "zero_grad", "train", "eval", "modules", "children"],
}


def _arguments(obj):
    """The parameter names of a function, or of a class's ``__init__`` (without self);
    None where the signature cannot be read (a builtin)."""
    import inspect
    target = obj.__init__ if isinstance(obj, type) else obj
    try:
        params = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return None
    if params and params[0].name == "self":
        params = params[1:]
    return [(p.name, p.kind) for p in params
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _lookup(root, path: str, name: str):
    for part in path.split(".")[1:]:
        root = getattr(root, part)
    return getattr(root, name)


@pytest.mark.parametrize("path", list(NN_NAMES))
def test_nn_names_take_torch_arguments(path):
    import ctensor.nn
    torch = pytest.importorskip("torch")
    import torch.nn  # noqa: F401
    for name in NN_NAMES[path]:
        ours = _lookup(ct, "ct." + path, name)
        theirs = _lookup(torch, "torch." + path, name)
        mine, torch_args = _arguments(ours), _arguments(theirs)
        if torch_args is None or mine is None:
            continue
        names = [n for n, _ in mine]
        missing = [n for n, _ in torch_args if n not in names]
        assert not missing, f"{path}.{name}: torch's arguments {missing} are not accepted"
        positional = [n for n, k in torch_args if k.name != "KEYWORD_ONLY"]
        assert names[:len(positional)] == positional, \
            f"{path}.{name}: positional arguments {names} differ from torch's {positional}"


def test_issue25_reductions_over_a_split_dim_move_only_row_statistics(mesh):
    a = _mixed((4, 6))
    x = _t(a, mesh, (S(1),) * mesh.ndim, grad=True)
    with ct.debug.comm_log() as log:
        lse = x.logsumexp(1)
        hits = (x > 0).any(1)
        every = (x > -9).all(1)
    assert "all_gather" not in log.collectives()         # the max and the sum, per row
    assert hits.sbp == (ct.sbp.partial_max,) * mesh.ndim    # the OR across ranks, pending
    assert every.sbp == (ct.sbp.partial_min,) * mesh.ndim
    np.testing.assert_allclose(lse.numpy(), np.log(np.exp(a).sum(1)), rtol=1e-12)
    np.testing.assert_array_equal(hits.numpy(), (a > 0).any(1))
    assert every.numpy().all()
    lse.sum().backward()                                 # the softmax, in x's layout
    np.testing.assert_allclose(x.grad.numpy(), np.exp(a) / np.exp(a).sum(1, keepdims=True))
    assert x.grad.sbp == x.sbp


IN_PLACE = [
    ("floor_", lambda x: x.floor_()), ("ceil_", lambda x: x.ceil_()),
    ("trunc_", lambda x: x.trunc_()), ("round_", lambda x: x.round_(decimals=1)),
    ("clip_", lambda x: x.clip_(-0.5, 0.5)), ("nan_to_num_", lambda x: x.log().nan_to_num_()),
    ("remainder_", lambda x: x.remainder_(0.7)), ("fmod_", lambda x: x.fmod_(-0.7)),
    ("floor_divide_", lambda x: x.floor_divide_(0.3)),
]


@pytest.mark.parametrize("name, fn", IN_PLACE, ids=[n for n, _ in IN_PLACE])
def test_issue25_in_place_forms_match_torch(mesh, name, fn):
    torch = _torch()
    a = _mixed((5, 3))
    x, t = _t(a, mesh, (S(0),) * mesh.ndim), torch.tensor(a)
    out, expected = fn(x), fn(t)
    np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-12, atol=1e-12)
    if name != "nan_to_num_":
        assert out is x and x.sbp == (S(0),) * mesh.ndim
    y = x.clone()
    y %= 0.5
    z = x.clone()
    z //= 0.5
    np.testing.assert_allclose(y.numpy(), np.remainder(x.numpy(), 0.5))
    np.testing.assert_allclose(z.numpy(), np.floor_divide(x.numpy(), 0.5))


ISSUE25_NAMES = ["erf", "floor", "ceil", "trunc", "round", "remainder", "fmod",
                 "floor_divide", "any", "all", "logsumexp", "cumprod", "diff", "isnan", "isinf",
                 "isfinite", "nan_to_num", "clip", "roll", "repeat_interleave", "unbind",
                 "unflatten", "movedim", "moveaxis", "expand_as", "bmm", "mm", "mv", "dot",
                 "addmm", "baddbmm", "allclose", "isclose", "equal", "max", "min", "concat",
                 "concatenate", "outer", "ger", "floor_", "ceil_", "trunc_", "round_", "clip_",
                 "nan_to_num_", "remainder_", "fmod_", "floor_divide_"]


def test_issue25_names_exist_where_torch_has_them():
    torch = _torch()
    for name in ISSUE25_NAMES:
        on_torch = hasattr(torch, name)
        assert hasattr(ct, name) or not on_torch, f"ct.{name} is missing"
        if hasattr(torch.Tensor, name):
            assert hasattr(ct.Tensor, name), f"Tensor.{name} is missing"
    for name in ("norm", "vector_norm", "matrix_norm"):
        assert callable(getattr(ct.linalg, name)) and hasattr(torch.linalg, name)
    for dunder in ("__mod__", "__rmod__", "__floordiv__", "__rfloordiv__", "__imod__",
                   "__ifloordiv__"):
        assert dunder in vars(ct.Tensor), dunder
