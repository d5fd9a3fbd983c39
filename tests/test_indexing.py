"""Indexing as PyTorch programs write it: ``x[mask]``, ``x[idx]``, ``x[:, idx]``,
``x[rows, cols]``, negative steps, ``None``/``...`` mixed in, and ``x[index] = value``, on
every mesh and several layouts, values and gradients against torch (NumPy where torch is not
importable); the autograd rules of the in-place forms; which layouts stay local (no
collective); errors raised before any communication. Values of every indexing op on every
SBP are also in tests/test_ops.py (tests/samples/advanced_indexing.py)."""
import numpy as np
import pytest

import ctensor as ct
from conftest import MPI_MODE
from ctensor.ops.index_parse import IndexOutOfRangeError

try:
    import torch
except ImportError:  # the optional peer: NumPy is the reference then
    torch = None

S, B, P = ct.sbp.split, ct.sbp.broadcast, ct.sbp.partial_sum


class T:
    """An index entry passed as a tensor (ct.Tensor / torch.Tensor), not as a constant."""

    def __init__(self, arr):
        self.arr = np.asarray(arr)


def _layouts(mesh, ndim):
    out = [(B,) * mesh.ndim] + [(S(d),) * mesh.ndim for d in range(ndim)]
    if mesh.ndim == 2 and ndim >= 2:
        out.append((S(0), S(1)))
    return out


def _ct_index(index, mesh, sbp_of):
    def conv(it):
        if isinstance(it, T):
            return ct.tensor(it.arr, placement=mesh, sbp=sbp_of(it.arr))
        return it
    return tuple(conv(i) for i in index) if isinstance(index, tuple) else conv(index)


def _ref_index(index, lib):
    def conv(it):
        if isinstance(it, T):
            return torch.from_numpy(it.arr) if lib == "torch" else it.arr
        if lib == "torch" and isinstance(it, np.ndarray):
            return torch.from_numpy(it)
        return it
    return tuple(conv(i) for i in index) if isinstance(index, tuple) else conv(index)


def _negative_step(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, slice) and i.step is not None and i.step < 0 for i in items)


def _reference(a, index, w, torch_only=False):
    """``a[index]`` and the gradient of ``sum(a[index] * w)``: torch's, or NumPy's."""
    if torch is not None and not _negative_step(index):
        t = torch.tensor(a, requires_grad=True)
        out = t[_ref_index(index, "torch")]
        weight = np.broadcast_to(np.asarray(w, dtype=np.float64), tuple(out.shape)).copy()
        (out * torch.from_numpy(weight)).sum().backward()
        return out.detach().numpy(), t.grad.numpy()
    if torch_only:
        pytest.skip("PyTorch's semantics differ from NumPy's here; torch is not importable")
    idx = _ref_index(index, "numpy")
    out = a[idx]
    grad = np.zeros_like(a)
    np.add.at(grad, idx, np.broadcast_to(np.asarray(w, dtype=np.float64), out.shape))
    return out, grad


_RNG = np.random.default_rng(0)
_MASK = _RNG.random((5, 4)) > 0.5
_ROWS = np.array([4, 0, -1, 2, 2])
_COLS = np.array([1, -4, 3, 3, 0])

# (name, input shape, index, torch_only)
GETITEM = [
    ("mask", (5, 4), T(_MASK), False),
    ("mask_rows", (5, 4), T(np.array([True, False, True, True, False])), False),
    ("mask_cols", (5, 4), (slice(None), T(np.array([False, True, True, False]))), False),
    ("mask_3d_leading", (5, 4, 3), T(_MASK), False),
    ("mask_constant", (5, 4), _MASK, False),
    ("bool_list", (5, 4), [True, False, False, True, True], False),
    ("int_tensor", (5, 4), T(_ROWS), False),
    ("int_tensor_cols", (5, 4), (slice(None), T(np.array([3, 0, 0]))), False),
    ("int_list", (5, 4), [0, 2, -1], False),
    ("int_array_2d", (5, 4), np.array([[0, 1], [4, 4]]), False),
    ("int_0d_tensor", (5, 4), T(np.array(3)), False),
    ("rows_cols", (5, 4), (T(_ROWS), T(_COLS)), False),
    ("rows_cols_constant", (5, 4), (_ROWS, _COLS), False),
    ("rows_cols_mixed", (5, 4), (T(_ROWS), _COLS), False),
    ("broadcast", (5, 4), (T(np.array([[0], [3]])), T(np.array([1, 2, 3]))), False),
    ("separated", (5, 4, 3), (T(np.array([0, 4])), slice(None), [2, 0]), False),
    ("adjacent", (3, 5, 4), (slice(None), T(np.array([0, 4])), [2, 0]), False),
    ("ints_first", (3, 5, 4), (0, slice(None), T(np.array([2, 0]))), True),
    ("mask_and_int", (5, 4, 3), (T(_MASK), 1), False),
    ("slice_then_index", (5, 4), (slice(1, 4), T(np.array([0, 3]))), False),
    ("reverse_last", (5, 4), (Ellipsis, slice(None, None, -1)), False),
    ("negative_steps", (5, 4), (slice(4, 0, -2), slice(None, None, -3)), False),
    ("negative_step_and_index", (5, 4), (slice(None, None, -1), T(np.array([1, 1]))), False),
    ("none_ellipsis_index", (3, 5, 4), (None, Ellipsis, T(np.array([0, -1]))), False),
    ("true", (5, 4), True, False),
    ("false", (5, 4), (False,), False),
]


@pytest.mark.parametrize("name, shape, index, torch_only", GETITEM,
                         ids=[g[0] for g in GETITEM])
def test_getitem_matches_torch_on_every_layout(mesh, name, shape, index, torch_only):
    rng = np.random.default_rng(len(name))
    a = rng.standard_normal(shape)
    probe, _ = _reference(a, index, 0.0, torch_only)
    w = rng.standard_normal(probe.shape)
    expected, grad = _reference(a, index, w, torch_only)
    for sbp in _layouts(mesh, len(shape)):
        x = ct.tensor(a, placement=mesh, sbp=sbp, requires_grad=True)
        out = x[_ct_index(index, mesh, lambda arr: (S(0),) * mesh.ndim if arr.ndim
                          and arr.shape[0] > 1 else (B,) * mesh.ndim)]
        np.testing.assert_allclose(out.numpy(), expected, err_msg=f"{sbp}")
        (out * ct.tensor(w, placement=mesh)).sum().backward()
        assert x.grad.sbp == x.sbp
        np.testing.assert_allclose(x.grad.numpy(), grad, err_msg=f"grad, {sbp}")


def test_getitem_of_a_partial_tensor(mesh):
    a = np.arange(20.0).reshape(5, 4)
    x = ct.tensor(a, placement=mesh, sbp=(P,) * mesh.ndim)
    np.testing.assert_array_equal(x[a > 7].numpy(), a[a > 7])
    np.testing.assert_array_equal(x[[3, 1], ::-1].numpy(), a[[3, 1], ::-1])


# ----------------------------------------------------------------------------- setitem
def _np_setitem(a, index, value):
    out = a.copy()
    out[_ref_index(index, "numpy")] = value
    return out


# (name, input shape, index, value shape or a number)
SETITEM = [
    ("column_zero", (5, 4), (slice(None), 0), 0.0),
    ("row_slice", (5, 4), slice(1, 3), (4,)),
    ("strided", (5, 4), (slice(None, None, 2), slice(1, None)), (3, 3)),
    ("new_dim", (5, 4), (None, 2), (1, 4)),
    ("mask_scalar", (5, 4), T(_MASK), -1.0),
    ("mask_rows_value", (5, 4), T(np.array([True, False, True, True, False])), (4,)),
    ("mask_values", (5, 4), T(_MASK), (int(_MASK.sum()),)),
    ("mask_constant", (5, 4), _MASK, 2.0),
    ("int_tensor", (5, 4), T(np.array([4, 0, -2])), (3, 4)),
    ("int_tensor_broadcast", (5, 4), T(np.array([4, 0])), (4,)),
    ("columns", (5, 4), (slice(None), T(np.array([3, 1]))), (5, 2)),
    ("int_list", (5, 4), [1, 3], 7.0),
    ("rows_cols", (5, 4), (T(np.array([0, 4, 2])), T(np.array([3, 0, 1]))), (3,)),
    ("reversed", (5, 4), (Ellipsis, slice(None, None, -1)), (4,)),
    ("leading_one", (5, 4), 2, (1, 4)),
]


@pytest.mark.parametrize("name, shape, index, value", SETITEM, ids=[s[0] for s in SETITEM])
def test_setitem_matches_numpy_and_torch_on_every_layout(mesh, name, shape, index, value):
    rng = np.random.default_rng(len(name) + 100)
    a = rng.standard_normal(shape)
    v = value if isinstance(value, float) else rng.standard_normal(value)
    expected = _np_setitem(a, index, v)
    if torch is not None and not _negative_step(index):
        t = torch.tensor(a)
        t[_ref_index(index, "torch")] = v if isinstance(v, float) else torch.from_numpy(v)
        np.testing.assert_allclose(t.numpy(), expected)
    for sbp in _layouts(mesh, len(shape)):
        x = ct.tensor(a, placement=mesh, sbp=sbp)
        before = x
        x[_ct_index(index, mesh, lambda arr: (B,) * mesh.ndim)] = \
            v if isinstance(v, float) else ct.tensor(v, placement=mesh)
        assert x is before and x.sbp == sbp
        np.testing.assert_allclose(x.numpy(), expected, err_msg=f"{sbp}")


@pytest.mark.parametrize("name, shape, index, value",
                         [s for s in SETITEM if not isinstance(s[3], float)],
                         ids=[s[0] for s in SETITEM if not isinstance(s[3], float)])
def test_setitem_gradients_match_torch(mesh, name, shape, index, value):
    if torch is None:
        pytest.skip("torch is the gradient reference")
    rng = np.random.default_rng(len(name) + 200)
    a, v = rng.standard_normal(shape), rng.standard_normal(value)
    w = rng.standard_normal(shape)
    ta, tv = torch.tensor(a, requires_grad=True), torch.tensor(v, requires_grad=True)
    ref = ta.clone()
    if _negative_step(index):  # torch refuses negative steps: x[..., ::-1] = v is this
        ref[..., :] = tv.flip(-1)
    else:
        ref[_ref_index(index, "torch")] = tv
    (ref * torch.from_numpy(w)).sum().backward()
    for sbp in _layouts(mesh, len(shape))[:3]:
        x = ct.tensor(a, placement=mesh, sbp=sbp, requires_grad=True)
        val = ct.tensor(v, placement=mesh, requires_grad=True)
        y = x.clone()
        y[_ct_index(index, mesh, lambda arr: (B,) * mesh.ndim)] = val
        np.testing.assert_allclose(y.numpy(), ref.detach().numpy())
        (y * ct.tensor(w, placement=mesh)).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), ta.grad.numpy(), err_msg=f"{sbp}")
        np.testing.assert_allclose(val.grad.numpy(), tv.grad.numpy(), err_msg=f"{sbp}")


def test_augmented_assignment_through_an_index(mesh):
    a = np.arange(20.0).reshape(5, 4)
    x = ct.tensor(a, placement=mesh, sbp=(S(0),) * mesh.ndim)
    x[:, 1] += 10.0
    x[[0, 2]] *= 2.0
    x[x > 30] -= 100.0
    ref = a.copy()
    ref[:, 1] += 10.0
    ref[[0, 2]] *= 2.0
    ref[ref > 30] -= 100.0
    np.testing.assert_allclose(x.numpy(), ref)


def test_setitem_casts_the_value_like_torch(mesh):
    x = ct.tensor(np.arange(6).reshape(2, 3), placement=mesh, sbp=(S(1),) * mesh.ndim)
    x[0] = 2.7  # PyTorch truncates into the integer tensor
    x[1, [0, 2]] = ct.tensor(np.array([-1.9, 5.5]), placement=mesh)
    assert x.dtype == np.int64
    np.testing.assert_array_equal(x.numpy(), [[2, 2, 2], [-1, 4, 5]])


def test_setitem_autograd_rules(mesh):
    leaf = ct.tensor(np.ones((3, 2)), placement=mesh, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        leaf[0] = 0.0
    with ct.no_grad():
        leaf[0] = 0.0
    np.testing.assert_array_equal(leaf.numpy(), [[0, 0], [1, 1], [1, 1]])
    y = leaf.clone()
    z = y * y                  # saves y for its backward
    y[1] = 5.0                 # ... which an in-place write then changes
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        z.sum().backward()
    y = leaf.clone()
    y[y > 0.5] = 3.0           # the gradient of the overwritten entries is zero
    (y * 2.0).sum().backward()
    np.testing.assert_array_equal(leaf.grad.numpy(), [[2, 2], [0, 0], [0, 0]])


# ----------------------------------------------------------------------------- layouts
def _no_collectives(fn):
    with ct.debug.comm_log() as log:
        out = fn()
    assert log.collectives() == [], log.collectives()
    return out


def test_local_layouts(mesh):
    a = np.arange(48.0).reshape(8, 6)
    rows = ct.tensor(a, placement=mesh, sbp=(S(0),) * mesh.ndim)
    cols = ct.tensor(a, placement=mesh, sbp=(S(1),) * mesh.ndim)
    idx = ct.tensor(np.array([5, 0, 0]), placement=mesh)
    picked = _no_collectives(lambda: rows[:, idx])        # an unsplit dim indexed: local
    assert picked.sbp == rows.sbp
    picked = _no_collectives(lambda: rows[idx])            # the split dim: a partial lookup
    assert all(s == P for s in picked.sbp)
    np.testing.assert_array_equal(picked.numpy(), a[[5, 0, 0]])

    def writes():
        cols[:, 0] = 0.0                                   # masked local writes
        rows[ct.tensor(a > 20, placement=mesh)] = -1.0     # an elementwise where
        rows.index_add_(0, idx, ct.ones(3, 6, placement=mesh, dtype=np.float64))
        cols.index_fill_(1, [1, 5], 9.0)
    _no_collectives(writes)
    ref_rows = np.where(a > 20, -1.0, a)
    np.add.at(ref_rows, [5, 0, 0], 1.0)
    ref_cols = a.copy()
    ref_cols[:, 0] = 0.0
    ref_cols[:, [1, 5]] = 9.0
    np.testing.assert_array_equal(rows.numpy(), ref_rows)
    np.testing.assert_array_equal(cols.numpy(), ref_cols)
    assert rows.sbp == (S(0),) * mesh.ndim and cols.sbp == (S(1),) * mesh.ndim


def test_moe_combine_with_split_tokens(mesh):
    # top-1 routing: expert outputs of the tokens split over ranks, added back into a
    # replicated output: each rank adds its own rows (P), no gather of the tokens
    rng = np.random.default_rng(3)
    h = rng.standard_normal((7, 4))
    choice = rng.integers(0, 3, 7)
    order = np.argsort(choice, kind="stable")
    tokens = ct.tensor(h[order], placement=mesh, sbp=(S(0),) * mesh.ndim, requires_grad=True)
    where = ct.tensor(order, placement=mesh, sbp=(S(0),) * mesh.ndim)
    out = ct.zeros(7, 4, placement=mesh, dtype=np.float64).index_add(0, where, tokens * 2.0)
    np.testing.assert_allclose(out.numpy(), 2.0 * h)
    out.sum().backward()
    np.testing.assert_allclose(tokens.grad.numpy(), np.full((7, 4), 2.0))
    assert tokens.grad.sbp == tokens.sbp


# ----------------------------------------------------------------------------- nonzero & co
def test_nonzero_where_masked_select_match_torch(mesh):
    a = np.array([[0.0, 1.5, 0.0], [2.0, 0.0, -1.0], [0.0, 0.0, 3.0], [4.0, 0.0, 0.0]])
    for sbp in _layouts(mesh, 2):
        x = ct.tensor(a, placement=mesh, sbp=sbp)
        np.testing.assert_array_equal(ct.nonzero(x).numpy(), np.argwhere(a))
        rows, cols = ct.where(x > 0)
        np.testing.assert_array_equal(rows.numpy(), np.nonzero(a > 0)[0])
        np.testing.assert_array_equal(cols.numpy(), np.nonzero(a > 0)[1])
        np.testing.assert_array_equal(x.nonzero(as_tuple=True)[1].numpy(), np.nonzero(a)[1])
        np.testing.assert_array_equal(ct.masked_select(x, x < 0.5).numpy(), a[a < 0.5])
        np.testing.assert_array_equal(x.argwhere().numpy(), np.argwhere(a))
        assert ct.nonzero(x).dtype == np.int64
    empty = ct.nonzero(ct.zeros(3, 2, placement=mesh))
    assert empty.shape == (0, 2)
    if torch is not None:
        t = torch.from_numpy(a)
        np.testing.assert_array_equal(ct.nonzero(ct.tensor(a, placement=mesh)).numpy(),
                                      torch.nonzero(t).numpy())
        scalar = ct.nonzero(ct.tensor(np.array(5.0), placement=mesh), as_tuple=True)
        expected = torch.nonzero(torch.tensor(5.0), as_tuple=True)
        assert len(scalar) == len(expected)
        np.testing.assert_array_equal(scalar[0].numpy(), expected[0].numpy())


def test_scatter_forms_match_torch(mesh):
    if torch is None:
        pytest.skip("torch is the reference")
    labels = np.array([2, 0, 1, 2])
    one_hot = ct.zeros(4, 3, placement=mesh, sbp=(S(0),) * mesh.ndim, dtype=np.float64)
    one_hot.scatter_(1, ct.tensor(labels[:, None], placement=mesh), 1.0)
    ref = torch.zeros(4, 3, dtype=torch.float64).scatter_(1, torch.tensor(labels[:, None]), 1.0)
    np.testing.assert_array_equal(one_hot.numpy(), ref.numpy())
    counts = ct.zeros(3, placement=mesh, dtype=np.float64).scatter_add(
        0, ct.tensor(labels, placement=mesh, sbp=(S(0),) * mesh.ndim),
        ct.ones(4, placement=mesh, dtype=np.float64))
    np.testing.assert_array_equal(counts.numpy(), torch.bincount(torch.tensor(labels)).numpy())
    x = np.arange(12.0).reshape(3, 4)
    idx = np.array([[0, 3], [1, 1], [2, 0]])
    got = ct.tensor(x, placement=mesh, sbp=(S(1),) * mesh.ndim).scatter(
        1, ct.tensor(idx, placement=mesh), 2.0, reduce="multiply")
    want = torch.tensor(x).scatter(1, torch.tensor(idx), 2.0, reduce="multiply")
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    got = ct.take_along_dim(ct.tensor(x, placement=mesh), ct.tensor(idx, placement=mesh), 1)
    want = torch.take_along_dim(torch.tensor(x), torch.tensor(idx), 1)
    np.testing.assert_array_equal(got.numpy(), want.numpy())


# ----------------------------------------------------------------------------- errors
ERRORS = [
    ("out_of_range", lambda x: x[[0, 5]], IndexOutOfRangeError, r"out of range .* size 5"),
    ("out_of_range_negative", lambda x: x[:, [-5]], IndexError, r"accepted: -4\.\.3"),
    ("float_index", lambda x: x[ct.tensor(np.array([0.0]), placement=x.placement)],
     TypeError, r"integers or bools.*\.long\(\)"),
    ("float_list", lambda x: x[[0.5, 1.0]], TypeError, r"ints or bools"),
    ("mask_shape", lambda x: x[np.ones(4, dtype=bool)], IndexError,
     r"mask of shape \(4,\) indexes dims 0\.\.0 of shape \(5,\)"),
    ("too_many", lambda x: x[[0], [1], [2]], IndexError, r"covers 3 dims .* has 2"),
    ("bad_broadcast", lambda x: x[[0, 1], [0, 1, 2]], IndexError, r"cannot be broadcast"),
    ("tensor_list", lambda x: x[[ct.tensor(np.array([0]), placement=x.placement)]],
     TypeError, r"pass a tuple"),
    ("setitem_shape", lambda x: x.__setitem__((slice(None), 0), np.ones(3)), ValueError,
     r"setitem: a value of shape \(3,\) cannot be assigned to the \(5,\) elements"),
    ("setitem_type", lambda x: x.__setitem__(0, "a"), TypeError, r"cannot assign a str"),
    ("setitem_mask_shape", lambda x: x.__setitem__(np.ones(1, dtype=bool), 1.0), IndexError,
     r"setitem: a mask of shape \(1,\) indexes dims 0\.\.0 of shape \(5,\)"),
    ("scatter_reduce", lambda x: x.scatter(1, ct.zeros(5, 1, dtype=np.int64,
                                                       placement=x.placement), 1.0,
                                           reduce="max"),
     ValueError, r"'reduce' is 'max'"),
    ("index_select_2d", lambda x: x.index_select(0, np.zeros((2, 2), dtype=np.int64)),
     ValueError, r"must be 1-D"),
    ("index_add_source", lambda x: x.index_add(0, [0, 1], np.ones((3, 4))), ValueError,
     r"'source' has shape \(3, 4\); accepted: \(2, 4\)"),
]


@pytest.mark.parametrize("name, fn, kind, message", ERRORS, ids=[e[0] for e in ERRORS])
def test_errors_before_any_communication(mesh, name, fn, kind, message):
    x = ct.tensor(np.zeros((5, 4)), placement=mesh, sbp=(S(0),) * mesh.ndim)
    with ct.debug.comm_log() as log:
        with pytest.raises(kind, match=message):
            fn(x)
    assert log.collectives() == []


def test_moe_top_k_routing_as_pytorch_writes_it(mesh):
    """``where(idx == e)``, ``x[rows]``, ``vals[rows, kk, None]`` and ``index_add_``: the
    same code on torch and ctensor (tokens replicated or split, experts split), equal
    outputs and gradients."""
    if torch is None:
        pytest.skip("torch is the reference")
    rng = np.random.default_rng(0)
    tokens, hidden, experts, k = 12, 8, 4, 2
    xs, ls = rng.standard_normal((tokens, hidden)), rng.standard_normal((tokens, experts))
    ws = rng.standard_normal((experts, hidden, hidden))

    def moe(m, x, logits, w, out):
        vals, idx = logits.softmax(-1).topk(k, dim=-1)
        for e in range(experts):
            rows, kk = m.where(idx == e)
            out.index_add_(0, rows, (x[rows] @ w[e]) * vals[rows, kk, None])
        return out

    leaves = [torch.tensor(a, requires_grad=True) for a in (xs, ls, ws)]
    ref = moe(torch, *leaves, torch.zeros(tokens, hidden, dtype=torch.float64))
    (ref ** 2).sum().backward()
    for sbp in [(B,) * mesh.ndim, (S(0),) * mesh.ndim]:
        x, logits = (ct.tensor(a, placement=mesh, sbp=sbp, requires_grad=True)
                     for a in (xs, ls))
        w = ct.tensor(ws, placement=mesh, sbp=(S(0),) * mesh.ndim, requires_grad=True)
        out = moe(ct, x, logits, w, ct.zeros(tokens, hidden, placement=mesh, sbp=sbp,
                                             dtype=np.float64))
        (out ** 2).sum().backward()
        np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-12, atol=1e-12)
        for ours, theirs in zip((x, logits, w), leaves):
            np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-10,
                                       atol=1e-12)
            assert ours.grad.sbp == ours.sbp


@pytest.mark.skipif(MPI_MODE, reason="shape-only worlds are simulations")
def test_shape_only_runs_take_constant_indices_and_refuse_value_masks():
    with ct.simulate(4, meta=True):
        p = ct.placement("cpu", [0, 1, 2, 3])
        x = ct.zeros(8, 6, placement=p, sbp=S(0))
        with ct.debug.comm_log() as log:
            assert x[:, [0, 2]].sbp == (S(0),) and x[[1, 5]].sbp == (P,)
            x[:, 0] = 1.0
            x.index_add_(0, [1, 2], ct.ones(2, 6, placement=p))
            assert x[np.arange(8) > 3].shape == (4, 6)
        assert log.collectives() == []
        for fn in (lambda: x[x > 0], lambda: ct.nonzero(x), lambda: x.masked_select(x > 0)):
            with pytest.raises(ct.MetaModeError, match="number of selected elements depends"):
                fn()
