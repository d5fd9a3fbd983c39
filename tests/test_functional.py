"""ctensor.nn.functional against NumPy references, over every mesh of the ``mesh`` fixture
and several input SBPs (vocabulary-split logits, split heads, split normalised dims ...);
gradients in float64 against finite differences or hand-derived formulas; communication
claims (no gather of split logits, communication-free matmuls) checked with
``ct.debug.comm_log``; tensor- and data-parallel MLPs against one rank."""
import math

import numpy as np
import pytest

import ctensor as ct
import ctensor.nn.functional as F
from conftest import numeric_grad

S, B, P = ct.sbp.split, ct.sbp.broadcast, ct.sbp.partial_sum


# ----------------------------------------------------------------------------- helpers
def _sbps(mesh, *kinds):
    """One SBP tuple per kind: the kind on every mesh axis, plus (kind, B) on a 2-D mesh."""
    if mesh.ndim == 1:
        return [(k,) for k in kinds]
    out = [(k, k) for k in kinds] + [(k, B) for k in kinds if k != B]
    return list(dict.fromkeys(out))


def _t(arr, mesh, sbp, grad=False):
    return ct.tensor(arr, placement=mesh, sbp=sbp, requires_grad=grad)


def _check(out, ref, xs, arrays, fn, rng, rtol=1e-6, atol=1e-8):
    """``out`` equals ``ref``; grads of the tensors in ``xs`` (None: no grad) equal finite
    differences of ``fn`` and come back in each input's own SBP."""
    np.testing.assert_allclose(out.numpy(), ref, rtol=rtol, atol=atol)
    weight = rng.standard_normal(ref.shape)
    (out * ct.tensor(weight, placement=out.placement)).sum().backward()
    for i, x in enumerate(xs):
        if x is None or not x.requires_grad:
            continue
        assert x.grad.sbp == x.sbp and x.grad.placement == x.placement
        np.testing.assert_allclose(x.grad.numpy(), numeric_grad(fn, arrays, i, weight),
                                   rtol=1e-5, atol=1e-7, err_msg=f"grad {i}, sbp {x.sbp}")


def _softmax_np(x, dim):
    e = np.exp(x - x.max(dim, keepdims=True))
    return e / e.sum(dim, keepdims=True)


def _log_softmax_np(x, dim):
    z = x - x.max(dim, keepdims=True)
    return z - np.log(np.exp(z).sum(dim, keepdims=True))


def _layer_norm_np(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _cross_entropy_np(logits, target, ignore_index=-100, reduction="mean"):
    logp = _log_softmax_np(logits, -1)
    valid = target != ignore_index
    picked = np.take_along_axis(logp, np.where(valid, target, 0)[..., None], -1)[..., 0]
    loss = np.where(valid, -picked, 0.0)
    if reduction == "none":
        return loss
    return loss.sum() if reduction == "sum" else loss.sum() / valid.sum()


def _sdpa_np(q, k, v, mask=None, causal=False, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    return _softmax_np(s, -1) @ v


# ----------------------------------------------------------------------------- layers
def test_linear(mesh):
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((5, 3)), rng.standard_normal((4, 3)), rng.standard_normal(4)
    ref = lambda x, w, b: x @ w.T + b  # noqa: E731
    for sx, sw, sb in [(S(0), B, B), (B, S(0), S(0)), (S(1), S(1), B), (P, B, P)]:
        xs = [_t(x, mesh, (sx,) * mesh.ndim, True), _t(w, mesh, (sw,) * mesh.ndim, True),
              _t(b, mesh, (sb,) * mesh.ndim, True)]
        _check(F.linear(*xs), ref(x, w, b), xs, [x, w, b], ref, rng)
    y = F.linear(_t(x, mesh, (B,) * mesh.ndim), _t(w, mesh, (B,) * mesh.ndim))
    np.testing.assert_allclose(y.numpy(), x @ w.T)


def test_relu_gelu(mesh):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 5))
    for sbp in _sbps(mesh, S(0), S(1), P):
        xt = _t(x, mesh, sbp)
        np.testing.assert_allclose(F.relu(xt).numpy(), np.maximum(x, 0))
        tanh = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
        np.testing.assert_allclose(F.gelu(xt, approximate="tanh").numpy(), tanh, rtol=1e-7)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_softmax(mesh, log):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 7)) * 3
    fn, ref = (F.log_softmax, _log_softmax_np) if log else (F.softmax, _softmax_np)
    for sbp in _sbps(mesh, S(0), S(1), B, P):
        for dim in (1, 0):
            xt = _t(x, mesh, sbp, True)
            _check(fn(xt, dim), ref(x, dim), [xt], [x], lambda a: ref(a, dim), rng)


def test_softmax_large_values_are_stable(mesh):
    x = np.array([[1000.0, 1001.0, 999.0, -1000.0, 1002.0]])
    for sbp in _sbps(mesh, S(1), B):
        got = F.softmax(_t(x, mesh, sbp), -1).numpy()
        np.testing.assert_allclose(got, _softmax_np(x, -1))
        got = F.log_softmax(_t(x, mesh, sbp), -1).numpy()
        np.testing.assert_allclose(got, _log_softmax_np(x, -1))


def test_layer_norm(mesh):
    rng = np.random.default_rng(3)
    x, w, b = rng.standard_normal((5, 6)), rng.standard_normal(6), rng.standard_normal(6)
    ref = _layer_norm_np
    for sx, sw in [(S(0), B), (S(1), S(0)), (B, B), (P, B)]:
        xs = [_t(x, mesh, (sx,) * mesh.ndim, True), _t(w, mesh, (sw,) * mesh.ndim, True),
              _t(b, mesh, (sw,) * mesh.ndim, True)]
        out = F.layer_norm(xs[0], (6,), xs[1], xs[2])
        # a split of the batch dim stays local; a split of the normalised dim of a tensor this
        # small is gathered (cheaper than two reductions; see the test below for large ones)
        assert out.sbp == (sx,) * mesh.ndim or sx in (P, S(1))
        _check(out, ref(x, w, b), xs, [x, w, b], ref, rng)
    # several normalised dims, no affine
    x3 = rng.standard_normal((2, 3, 4))
    ref3 = (x3 - x3.mean((1, 2), keepdims=True)) / np.sqrt(x3.var((1, 2), keepdims=True) + 1e-5)
    got = F.layer_norm(_t(x3, mesh, (S(2),) * mesh.ndim), (3, 4))
    np.testing.assert_allclose(got.numpy(), ref3, rtol=1e-6, atol=1e-8)


def test_layer_norm_split_hidden_keeps_split(mesh):
    # wide enough that reducing two row statistics costs less than gathering the rows
    x = np.random.default_rng(4).standard_normal((4, 32768))
    sbp = (S(1),) * mesh.ndim
    with ct.debug.comm_log() as log:
        out = F.layer_norm(_t(x, mesh, sbp), 32768)
    # (on a mesh of one rank the fused kernel runs: the whole rows are there, labelled B)
    assert out.sbp == (sbp if mesh.size > 1 else (B,))
    assert set(log.collectives()) <= {"all_reduce"}
    assert all(e.nbytes <= 4 * 8 for e in log)  # row statistics only (bytes per rank)


def test_embedding(mesh):
    rng = np.random.default_rng(5)
    ids, w = rng.integers(0, 7, (3, 4)), rng.standard_normal((7, 5))
    for si, sw in [(B, S(0)), (S(0), B), (S(1), B), (B, S(1)), (B, B)]:
        wt = _t(w, mesh, (sw,) * mesh.ndim, True)
        out = F.embedding(_t(ids, mesh, (si,) * mesh.ndim), wt)
        np.testing.assert_allclose(out.numpy(), w[ids])
        g = rng.standard_normal(out.shape)
        (out * ct.tensor(g, placement=mesh)).sum().backward()
        expected = np.zeros_like(w)
        np.add.at(expected, ids, g)
        assert wt.grad.sbp == wt.sbp
        np.testing.assert_allclose(wt.grad.numpy(), expected)


@pytest.mark.parametrize("chunk", [None, 7])
def test_embedding_gradient_rows_added_in_order(chunk, monkeypatch):
    """The weight's gradient adds each token's row with 1-D add.at on flat positions (the
    fast path, in chunks of at most ``_ROWS_CHUNK`` positions): the bits of the row form
    ``np.add.at(out, ids, rows)``, repeated ids included; other forms fall back."""
    from ctensor.ops import embedding as emb
    if chunk is not None:
        monkeypatch.setattr(emb, "_ROWS_CHUNK", chunk)
    rng = np.random.default_rng(4)
    for shape, vocab, width, dtype in [((4, 16), 9, 5, np.float32), ((300,), 3, 2, np.float64)]:
        ids = rng.integers(0, vocab, shape)
        rows = rng.standard_normal(shape + (width,)).astype(dtype)
        want = np.zeros((vocab, width), dtype)
        np.add.at(want, ids, rows)
        got = np.zeros((vocab, width), dtype)
        assert emb.index_add(np, got, ids, rows) is got
        np.testing.assert_array_equal(got, want)
    assert not emb._rows_add(np.zeros((3, 2)), np.array([-1, 0]), np.ones((2, 2)))
    assert not emb._rows_add(np.zeros((3, 2)), np.array([0, 1]), np.ones(2))  # (broadcast)
    w = ct.tensor(rng.standard_normal((6, 4)), requires_grad=True)
    ids = np.array([[1, 5, 1], [0, 1, 5]])
    (F.embedding(ct.tensor(ids), w) * 2.0).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), 2.0 * np.bincount(ids.ravel(), minlength=6)
                                  [:, None] * np.ones((1, 4)))


def test_embedding_vocab_split_no_gather_of_weight(mesh):
    rng = np.random.default_rng(6)
    ids, w = rng.integers(0, 9, (2, 3)), rng.standard_normal((9, 4))
    sbp = (S(0),) * mesh.ndim
    wt = _t(w, mesh, sbp, True)
    with ct.debug.comm_log() as log:
        out = F.embedding(_t(ids, mesh, (B,) * mesh.ndim), wt)
        out.sum().backward()
    assert all(s == P for s in out.sbp)
    assert log.collectives() == [] and wt.grad.sbp == sbp


# ----------------------------------------------------------------------------- losses
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy(mesh, reduction):
    rng = np.random.default_rng(7)
    logits = rng.standard_normal((6, 5)) * 2
    target = rng.integers(0, 5, 6)
    target[2] = -100
    ref = lambda z: _cross_entropy_np(z, target, reduction=reduction)  # noqa: E731
    for sbp in _sbps(mesh, S(1), S(0), B, P):
        lt = _t(logits, mesh, sbp, True)
        tt = _t(target, mesh, (B,) * mesh.ndim)
        out = F.cross_entropy(lt, tt, reduction=reduction)
        _check(out, np.asarray(ref(logits)), [lt], [logits], ref, rng)


def test_cross_entropy_3d_and_grad_formula(mesh):
    # PyTorch's (N, C, d1) layout: the class dim is 1
    rng = np.random.default_rng(8)
    logits = rng.standard_normal((2, 7, 3))
    last = np.moveaxis(logits, 1, -1)
    target = rng.integers(0, 7, (2, 3))
    target[1, 0] = 4
    for sbp in _sbps(mesh, S(2), S(1), S(0)):
        lt = _t(logits, mesh, sbp, True)
        loss = F.cross_entropy(lt, _t(target, mesh, (B,) * mesh.ndim))
        np.testing.assert_allclose(loss.numpy(), _cross_entropy_np(last, target))
        loss.backward()
        onehot = np.eye(7)[target]
        expected = np.moveaxis((_softmax_np(last, -1) - onehot) / 6, -1, 1)
        np.testing.assert_allclose(lt.grad.numpy(), expected, atol=1e-12)
        assert lt.grad.sbp == lt.sbp
    # every target ignored: nan like PyTorch
    t = np.full((2, 3), -100)
    with np.errstate(invalid="ignore"):
        loss = F.cross_entropy(_t(logits, mesh, (S(1),) * mesh.ndim),
                               _t(t, mesh, (B,) * mesh.ndim))
        assert np.isnan(loss.numpy())
    # class-last logits with (B, T) targets: the error says how to write it
    with pytest.raises(ValueError, match=r"class dim is dim 1.*flatten\(0, -2\)"):
        F.cross_entropy(_t(last, mesh, (B,) * mesh.ndim), _t(target, mesh, (B,) * mesh.ndim))


def test_cross_entropy_vocab_split_never_gathers_logits(mesh):
    rng = np.random.default_rng(9)
    n, c = 4, 32768  # a vocabulary large enough that reducing row statistics beats gathering
    logits = rng.standard_normal((n, c))
    target = rng.integers(0, c, n)
    sbp = (S(1),) * mesh.ndim
    lt = _t(logits, mesh, sbp, True)
    tt = _t(target, mesh, (B,) * mesh.ndim)
    with ct.debug.comm_log() as log:
        loss = F.cross_entropy(lt, tt)
        loss.backward()
    logits_bytes = min(lt._layout.local_nbytes(r) for r in mesh.rank_list)
    assert "all_gather" not in log.collectives() and "all_to_all" not in log.collectives()
    assert all(e.nbytes < logits_bytes for e in log if e.collective in log.collectives()), log
    assert lt.grad.sbp == sbp
    np.testing.assert_allclose(loss.numpy(), _cross_entropy_np(logits, target))
    onehot = np.zeros((n, c))
    onehot[np.arange(n), target] = 1.0
    expected = (_softmax_np(logits, -1) - onehot) / n
    np.testing.assert_allclose(lt.grad.numpy(), expected, atol=1e-12)


# ----------------------------------------------------------------------------- matmul comm
@pytest.mark.parametrize("sa,sb,so", [(S(0), B, S(0)), (B, S(1), S(1)), (S(1), S(0), P)],
                         ids=["S0@B", "B@S1", "S1@S0"])
def test_matmul_canonical_cases_need_no_communication(mesh, sa, sb, so):
    if mesh.ndim != 1:
        pytest.skip("1-D rule")
    rng = np.random.default_rng(10)
    a, b = rng.standard_normal((6, 5)), rng.standard_normal((5, 7))
    at, bt = _t(a, mesh, sa), _t(b, mesh, sb)
    with ct.debug.comm_log() as log:
        c = at @ bt
    assert log.collectives() == [] and c.sbp == (so,)
    np.testing.assert_allclose(c.numpy(), a @ b)


def test_matmul_2x2_needs_no_communication(world4):
    mesh = ct.placement("cpu", [[0, 1], [2, 3]])
    rng = np.random.default_rng(11)
    a, b = rng.standard_normal((6, 5)), rng.standard_normal((5, 7))
    at, bt = _t(a, mesh, (S(0), B)), _t(b, mesh, (B, S(1)))
    with ct.debug.comm_log() as log:
        c = at @ bt
    assert log.collectives() == [] and c.sbp == (S(0), S(1))
    np.testing.assert_allclose(c.numpy(), a @ b)


# ----------------------------------------------------------------------------- dropout
def test_dropout_mask_is_layout_independent_and_scaled(mesh):
    x = np.random.default_rng(16).standard_normal((6, 40)) + 3.0
    outs, grads = [], []
    for sbp in _sbps(mesh, S(0), S(1), B, P):
        ct.manual_seed(7)
        xt = _t(x, mesh, sbp, True)
        with ct.debug.comm_log() as log:
            y = F.dropout(xt, 0.25)
        assert log.collectives() == []
        outs.append(y.numpy())
        y.sum().backward()
        grads.append(xt.grad.numpy())
    for y, g in zip(outs, grads):
        np.testing.assert_array_equal(y, outs[0])
        np.testing.assert_array_equal(g, grads[0])
    kept = outs[0] != 0
    np.testing.assert_allclose(outs[0][kept], x[kept] / 0.75)
    np.testing.assert_allclose(grads[0], kept / 0.75)
    assert 0.6 < kept.mean() < 0.9
    xt = _t(x, mesh, (S(0),) * mesh.ndim)
    assert F.dropout(xt, 0.5, training=False) is xt and F.dropout(xt, 0.0) is xt
    assert not F.dropout(xt, 1.0).numpy().any()


# ----------------------------------------------------------------------------- attention
@pytest.mark.parametrize("mode", ["plain", "causal", "bool_mask", "float_mask"])
def test_scaled_dot_product_attention(mesh, mode):
    rng = np.random.default_rng(12)
    q, k, v = (rng.standard_normal((2, 3, 4, 2)) for _ in range(3))
    mask = None
    if mode == "bool_mask":
        mask = rng.random((4, 4)) > 0.3
        mask[:, 0] = True
    elif mode == "float_mask":
        mask = rng.standard_normal((4, 4))
    causal = mode == "causal"

    def ref(q, k, v):
        return _sdpa_np(q, k, v, mask, causal)
    for sbp in _sbps(mesh, S(1), S(0), S(2), B)[:4]:
        xs = [_t(a, mesh, sbp, True) for a in (q, k, v)]
        m = None if mask is None else _t(mask, mesh, (B,) * mesh.ndim)
        out = F.scaled_dot_product_attention(*xs, attn_mask=m, is_causal=causal)
        _check(out, ref(q, k, v), xs, [q, k, v], ref, rng)


def test_attention_split_heads_is_local(mesh):
    rng = np.random.default_rng(13)
    q, k, v = (rng.standard_normal((2, 4, 5, 3)) for _ in range(3))
    sbp = (S(1),) * mesh.ndim
    xs = [_t(a, mesh, sbp, True) for a in (q, k, v)]
    with ct.debug.comm_log() as log:
        out = F.scaled_dot_product_attention(*xs, is_causal=True, scale=0.5)
        grad_out = ct.ones(*out.shape, placement=mesh, sbp=sbp, dtype=np.float64)
        out.backward(grad_out)
    assert log.collectives() == [] and out.sbp == sbp
    assert all(x.grad.sbp == sbp for x in xs)
    np.testing.assert_allclose(out.numpy(), _sdpa_np(q, k, v, causal=True, scale=0.5))


def test_attention_dropout_is_layout_independent(mesh):
    rng = np.random.default_rng(17)
    q, k, v = (rng.standard_normal((2, 4, 5, 3)) for _ in range(3))
    outs = []
    for sbp in _sbps(mesh, S(1), B)[:2]:
        ct.manual_seed(3)
        xs = [_t(a, mesh, sbp) for a in (q, k, v)]
        outs.append(F.scaled_dot_product_attention(*xs, dropout_p=0.5).numpy())
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-12)
    assert not np.allclose(outs[0], _sdpa_np(q, k, v))


# ----------------------------------------------------------------------------- parallel MLP
def _mlp_np(x, w1, b1, w2, b2):
    h = x @ w1.T + b1
    return np.maximum(h, 0) @ w2.T + b2


def _mlp_run(mesh, arrays, sbps):
    x, *params = [_t(a, mesh, s, grad=i > 0) for i, (a, s) in enumerate(zip(arrays, sbps))]
    w1, b1, w2, b2 = params
    y = F.linear(F.relu(F.linear(x, w1, b1)), w2, b2)
    loss = (y * y).mean()
    loss.backward()
    return y.numpy(), loss.numpy(), [p.grad.numpy() for p in params], [p.grad.sbp
                                                                    for p in params]


def test_tensor_and_data_parallel_mlp_match_one_rank(mesh):
    rng = np.random.default_rng(14)
    x = rng.standard_normal((6, 4))
    w1, b1 = rng.standard_normal((8, 4)), rng.standard_normal(8)
    w2, b2 = rng.standard_normal((3, 8)), rng.standard_normal(3)
    arrays = [x, w1, b1, w2, b2]
    one = ct.placement("cpu", [0])
    y1, loss1, grads1, _ = _mlp_run(one, arrays, [(B,)] * 5)
    np.testing.assert_allclose(y1, _mlp_np(*arrays))
    n = mesh.ndim
    layouts = {
        "data": [(S(0),) * n] + [(B,) * n] * 4,
        # Megatron: column-parallel fc1 (w1, b1 S(0)), row-parallel fc2 (w2 S(1)), b2 B
        "tensor": [(B,) * n, (S(0),) * n, (S(0),) * n, (S(1),) * n, (B,) * n],
    }
    if n == 2:  # data parallel over mesh axis 0, tensor parallel over axis 1
        layouts["hybrid"] = [(S(0), B), (B, S(0)), (B, S(0)), (B, S(1)), (B, B)]
    for name, sbps in layouts.items():
        y, loss, grads, grad_sbps = _mlp_run(mesh, arrays, sbps)
        np.testing.assert_allclose(y, y1, rtol=1e-10, err_msg=name)
        np.testing.assert_allclose(loss, loss1, rtol=1e-10, err_msg=name)
        assert grad_sbps == sbps[1:], name
        for g, g1 in zip(grads, grads1):
            np.testing.assert_allclose(g, g1, rtol=1e-9, atol=1e-12, err_msg=name)


def test_tensor_parallel_mlp_forward_has_one_all_reduce(mesh):
    if mesh.ndim != 1 or mesh.size == 1:
        pytest.skip("1-D tensor parallel")
    rng = np.random.default_rng(15)
    x = _t(rng.standard_normal((4, 6)), mesh, B)
    w1 = _t(rng.standard_normal((8, 6)), mesh, S(0))
    w2 = _t(rng.standard_normal((6, 8)), mesh, S(1))
    with ct.debug.comm_log() as log:
        h = F.gelu(F.linear(x, w1))
        y = F.linear(h, w2)
        assert h.sbp == (S(1),) and y.sbp == (P,)
        y = y.to_global(sbp=B)
    assert log.collectives() == ["all_reduce"]


# ----------------------------------------------------------------------------- errors
def test_errors_name_op_and_argument(mesh):
    x = ct.zeros(4, 3, placement=mesh)
    with pytest.raises(ValueError, match="linear.*weight"):
        F.linear(x, ct.zeros(2, 5, placement=mesh))
    with pytest.raises(ValueError, match="layer_norm.*normalized_shape"):
        F.layer_norm(x, (4,))
    with pytest.raises(ValueError, match="cross_entropy.*probability target"):
        F.cross_entropy(x, ct.zeros(4, placement=mesh))
    with pytest.raises(TypeError, match="cross_entropy.*target.*bool"):
        F.cross_entropy(x, ct.zeros(4, placement=mesh, dtype=bool))
    with pytest.raises(ValueError, match="cross_entropy.*target"):
        F.cross_entropy(x, ct.zeros(3, placement=mesh, dtype=np.int64))
    with pytest.raises(ValueError, match="cross_entropy.*reduction"):
        F.cross_entropy(x, ct.zeros(4, placement=mesh, dtype=np.int64), reduction="avg")
    with pytest.raises(TypeError, match="embedding.*input"):
        F.embedding(x, ct.zeros(5, 2, placement=mesh))
    with pytest.raises(ValueError, match="matmul"):
        x @ ct.zeros(4, 2, placement=mesh)
    with pytest.raises(ValueError, match="dropout.*p"):
        F.dropout(x, 1.5)
    with pytest.raises(ValueError, match="scaled_dot_product_attention"):
        F.scaled_dot_product_attention(x, ct.zeros(4, 2, placement=mesh), x)


# ----------------------------------------------------------------------------- PyTorch's names
# Each case: (id, NumPy inputs, indices of the inputs that take a gradient, call(F, *ts)).
# The first input is laid out in every SBP of the mesh; the others broadcast. Values and
# gradients are compared with torch's (float64, 1e-9) when torch is importable.
_R = np.random.default_rng(21)
_X3 = _R.standard_normal((4, 5, 3))          # (N, C, d) logits / a generic 3-D input
_T3 = _R.integers(0, 5, (4, 3))
_T3[0, 0] = -100
_W5 = _R.random(5) + 0.5
_Y3 = _R.standard_normal((4, 5, 3))
_B3 = (_R.random((4, 5, 3)) > 0.5) * 1.0
_P3 = _R.random((4, 5, 3))
_P3 /= _P3.sum(1, keepdims=True)
_T2 = _R.integers(0, 5, 4)
TORCH_CASES = [
    ("cross_entropy_2d_smooth_weight", [_X3[:, :, 0], _T2, _W5], [0],
     lambda F, x, t, w: F.cross_entropy(x, t, weight=w, label_smoothing=0.2)),
    ("cross_entropy_ncd_smooth", [_X3, _T3], [0],
     lambda F, x, t: F.cross_entropy(x, t, label_smoothing=0.1)),
    ("cross_entropy_ncd_weight_sum", [_X3, _T3, _W5], [0],
     lambda F, x, t, w: F.cross_entropy(x, t, weight=w, reduction="sum")),
    ("cross_entropy_ncd_none_ignore_1", [_X3, np.where(_T3 < 0, 1, _T3)], [0],
     lambda F, x, t: F.cross_entropy(x, t, ignore_index=1, reduction="none",
                                     label_smoothing=0.3)),
    ("cross_entropy_probabilities", [_X3, _P3, _W5], [0],
     lambda F, x, p, w: F.cross_entropy(x, p, weight=w, label_smoothing=0.1)),
    ("cross_entropy_unbatched", [_X3[0, :, 0], _T2[0]], [0],
     lambda F, x, t: F.cross_entropy(x, t)),
    ("nll_loss_weight", [_X3, _T3, _W5], [0], lambda F, x, t, w: F.nll_loss(x, t, weight=w)),
    ("mse_loss", [_X3, _Y3], [0, 1], lambda F, x, y: F.mse_loss(x, y)),
    ("l1_loss_sum", [_X3, _Y3], [0, 1], lambda F, x, y: F.l1_loss(x, y, reduction="sum")),
    ("mse_loss_weight", [_X3, _Y3, _R.random((4, 5, 3))], [0],
     lambda F, x, y, w: F.mse_loss(x, y, weight=w)),
    ("l1_loss_weight_none", [_X3, _Y3, _R.random((4, 5, 3))], [0],
     lambda F, x, y, w: F.l1_loss(x, y, weight=w, reduction="none")),
    ("huber_loss_weight", [_X3, _Y3, _R.random((4, 5, 3))], [0],
     lambda F, x, y, w: F.huber_loss(x, y, weight=w)),
    ("sdpa_gqa", [_R.standard_normal((2, 4, 3, 2)), _R.standard_normal((2, 2, 5, 2)),
                  _R.standard_normal((2, 2, 5, 2))], [0, 1, 2],
     lambda F, q, k, v: F.scaled_dot_product_attention(q, k, v, None, 0.0, False, scale=0.7,
                                                       enable_gqa=True)),
    ("smooth_l1_loss", [_X3, _Y3], [0], lambda F, x, y: F.smooth_l1_loss(x, y, beta=0.5)),
    ("huber_loss", [_X3, _Y3], [0], lambda F, x, y: F.huber_loss(x, y, delta=0.7)),
    ("bce_with_logits", [_X3 * 4, _B3, _R.random(3) + 0.5, _R.random((5, 3))], [0],
     lambda F, x, y, pw, w: F.binary_cross_entropy_with_logits(x, y, weight=w,
                                                               pos_weight=pw)),
    ("bce", [_X3, _B3], [0],
     lambda F, x, y: F.binary_cross_entropy((x * 3).sigmoid(), y, reduction="none")),
    ("silu", [_X3 * 5], [0], lambda F, x: F.silu(x)),
    ("elu", [_X3 * 5], [0], lambda F, x: F.elu(x, 0.7)),
    ("selu", [_X3 * 5], [0], lambda F, x: F.selu(x)),
    ("logsigmoid", [_X3 * 10], [0], lambda F, x: F.logsigmoid(x)),
    ("mish", [_X3 * 5], [0], lambda F, x: F.mish(x)),
    ("hardtanh", [_X3 * 2], [0], lambda F, x: F.hardtanh(x, -0.5, 1.5)),
    ("relu6", [_X3 * 8], [0], lambda F, x: F.relu6(x)),
    ("hardswish", [_X3 * 5], [0], lambda F, x: F.hardswish(x)),
    ("glu", [_R.standard_normal((4, 6, 3))], [0], lambda F, x: F.glu(x, 1)),
    ("cosine_similarity", [_X3, _Y3[:1]], [0, 1],
     lambda F, a, b: F.cosine_similarity(a, b, dim=1)),
    ("kl_div", [_X3, _P3], [0, 1], lambda F, x, p: F.kl_div(x, p)),
    ("kl_div_batchmean_log_target", [_X3, np.log(_P3)], [0, 1],
     lambda F, x, p: F.kl_div(x, p, reduction="batchmean", log_target=True)),
    ("softplus", [_X3 * 10], [0], lambda F, x: F.softplus(x, beta=2.0, threshold=5.0)),
    ("leaky_relu", [_X3], [0], lambda F, x: F.leaky_relu(x, 0.2)),
    ("normalize", [_X3], [0], lambda F, x: F.normalize(x)),
    ("normalize_p1_last", [_X3], [0], lambda F, x: F.normalize(x, p=1.0, dim=-1)),
    ("rms_norm", [_X3, _R.random(3)], [0, 1], lambda F, x, w: F.rms_norm(x, (3,), w)),
    ("rms_norm_2d_eps", [_X3], [0], lambda F, x: F.rms_norm(x, (5, 3), eps=1e-3)),
    ("pad_constant", [_X3], [0], lambda F, x: F.pad(x, (1, 2, -1, 1), value=0.5)),
    ("pad_reflect", [_X3], [0], lambda F, x: F.pad(x, (2, 1), mode="reflect")),
    ("pad_replicate", [_X3], [0], lambda F, x: F.pad(x, (1, 2, 2, 0), mode="replicate")),
    ("pad_circular", [_X3], [0], lambda F, x: F.pad(x, (1, 2), mode="circular")),
]


@pytest.mark.parametrize("name, arrays, wrt, call", TORCH_CASES,
                         ids=[c[0] for c in TORCH_CASES])
def test_functional_matches_torch(mesh, name, arrays, wrt, call):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as TF
    tt = [torch.tensor(a, requires_grad=i in wrt) for i, a in enumerate(arrays)]
    expected = call(TF, *tt)
    expected.sum().backward()
    first = arrays[0]
    for sbp in _sbps(mesh, *(S(d) for d in range(first.ndim)), B):
        xs = [_t(a, mesh, sbp if i == 0 else (B,) * mesh.ndim, i in wrt)
              for i, a in enumerate(arrays)]
        got = call(F, *xs)
        np.testing.assert_allclose(got.numpy(), expected.detach().numpy(), rtol=1e-10,
                                   atol=1e-12, err_msg=f"{name} {sbp}")
        got.sum().backward()
        for i in wrt:
            assert xs[i].grad.sbp == xs[i].sbp
            np.testing.assert_allclose(xs[i].grad.numpy(), tt[i].grad.numpy(), rtol=1e-9,
                                       atol=1e-12, err_msg=f"{name} grad {i} {sbp}")


def test_label_smoothing_against_numpy(mesh):
    # (1 - e) * w[t] * nll + e / C * sum_c -w_c log p_c, mean over the summed w[t]
    rng = np.random.default_rng(22)
    x, t, w, e = rng.standard_normal((6, 4)), rng.integers(0, 4, 6), rng.random(4) + 0.5, 0.2
    t[3] = -100
    logp = _log_softmax_np(x, -1)
    valid = t != -100
    tw = np.where(valid, w[np.where(valid, t, 0)], 0.0)
    nll = -np.take_along_axis(logp, np.where(valid, t, 0)[:, None], -1)[:, 0] * tw
    smooth = np.where(valid, -(logp * w).sum(-1), 0.0)
    expected = ((1 - e) * nll + e / 4 * smooth).sum() / tw.sum()
    for sbp in _sbps(mesh, S(1), S(0), B):
        got = F.cross_entropy(_t(x, mesh, sbp), _t(t, mesh, (B,) * mesh.ndim),
                              weight=_t(w, mesh, (B,) * mesh.ndim), label_smoothing=e)
        np.testing.assert_allclose(got.item(), expected, rtol=1e-12)


def test_label_smoothing_on_split_classes_never_gathers(mesh):
    rng = np.random.default_rng(23)
    n, c = 4, 32768
    lt = _t(rng.standard_normal((n, c)), mesh, (S(1),) * mesh.ndim, True)
    tt = _t(rng.integers(0, c, n), mesh, (B,) * mesh.ndim)
    with ct.debug.comm_log() as log:
        F.cross_entropy(lt, tt, label_smoothing=0.1).backward()
    logits_bytes = min(lt._layout.local_nbytes(r) for r in mesh.rank_list)
    assert "all_gather" not in log.collectives() and "all_to_all" not in log.collectives()
    assert all(e.nbytes < logits_bytes for e in log if e.collective in log.collectives())
    assert lt.grad.sbp == lt.sbp


def test_one_hot_pad_and_activations_against_numpy(mesh):
    ids = np.array([[0, 3], [2, 2], [1, 0]])
    for sbp in _sbps(mesh, S(0), S(1), B):
        out = F.one_hot(_t(ids, mesh, sbp), 4)
        assert out.dtype == np.int64 and out.sbp == sbp
        np.testing.assert_array_equal(out.numpy(), np.eye(4, dtype=np.int64)[ids])
    np.testing.assert_array_equal(F.one_hot(_t(ids, mesh, (B,) * mesh.ndim)).numpy(),
                                  np.eye(4)[ids])
    x = np.arange(6.0).reshape(2, 3)
    for sbp in _sbps(mesh, S(0), S(1), B):
        xt = _t(x, mesh, sbp)
        np.testing.assert_array_equal(F.pad(xt, (1, 2), value=-1.0).numpy(),
                                      np.pad(x, ((0, 0), (1, 2)), constant_values=-1.0))
        np.testing.assert_array_equal(F.pad(xt, (2, 1, 1, 0), mode="reflect").numpy(),
                                      np.pad(x, ((1, 0), (2, 1)), mode="reflect"))
        np.testing.assert_array_equal(F.pad(xt, (1, 1), mode="replicate").numpy(),
                                      np.pad(x, ((0, 0), (1, 1)), mode="edge"))
        np.testing.assert_array_equal(F.pad(xt, (1, 2), mode="circular").numpy(),
                                      np.pad(x, ((0, 0), (1, 2)), mode="wrap"))
        np.testing.assert_allclose(F.silu(xt).numpy(), x / (1 + np.exp(-x)), rtol=1e-14)
        np.testing.assert_allclose(F.normalize(xt, dim=1).numpy(),
                                   x / np.linalg.norm(x, axis=1, keepdims=True), rtol=1e-14)


def test_new_functional_errors():
    x = ct.zeros(4, 3)
    with pytest.raises(ValueError, match="pad: argument 'pad' must hold an even number"):
        F.pad(x, (1, 2, 3))
    with pytest.raises(ValueError, match="pad: argument 'mode' is 'wrap'"):
        F.pad(x, (1, 1), mode="wrap")
    with pytest.raises(ValueError, match="pad: mode 'reflect' pads dim 1 of size 3"):
        F.pad(x, (3, 0), mode="reflect")
    with pytest.raises(TypeError, match="one_hot: argument 'tensor' must be an integer"):
        F.one_hot(x)
    with pytest.raises(ValueError, match="one_hot: argument 'num_classes' is 2"):
        F.one_hot(ct.tensor(np.array([0, 2])), 2)
    with pytest.raises(ValueError, match="cross_entropy: argument 'label_smoothing'"):
        F.cross_entropy(x, ct.zeros(4, dtype=np.int64), label_smoothing=1.5)
    with pytest.raises(ValueError, match=r"cross_entropy: argument 'weight' has shape \(4,\)"):
        F.cross_entropy(x, ct.zeros(4, dtype=np.int64), weight=ct.ones(4))
    with pytest.raises(ValueError, match="rms_norm: argument 'normalized_shape'"):
        F.rms_norm(x, (4,))
    with pytest.warns(UserWarning, match="mse_loss: using a target size"):
        F.mse_loss(x, ct.zeros(3))
    # PyTorch's deprecated size_average / reduce still map onto reduction
    assert F.l1_loss(ct.ones(2, 2), ct.zeros(2, 2), reduce=False).shape == (2, 2)
    assert F.l1_loss(ct.ones(2, 2), ct.zeros(2, 2), size_average=False).item() == 4.0


def test_inplace_follows_pytorch_where_autograd_allows(mesh):
    x = _t(np.array([[-1.0, 2.0], [3.0, -4.0]]), mesh, (S(0),) * mesh.ndim)
    assert F.relu(x, inplace=True) is x and x.numpy().tolist() == [[0, 2], [3, 0]]
    assert F.leaky_relu(x, 0.5, True) is x and F.silu(x, True) is x
    w = _t(np.array([[-1.0, 2.0]]), mesh, (B,) * mesh.ndim, True)
    h = w * 2.0
    y = F.relu(h, inplace=True)       # recorded by autograd: the result, h left alone
    assert y is not h and y.numpy().tolist() == [[0, 4]] and h.numpy().tolist() == [[-2, 4]]
    y.sum().backward()
    assert w.grad.numpy().tolist() == [[0, 2]]
