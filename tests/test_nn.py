"""nn: module mechanics, state dicts, in-place resharding, layers against NumPy,
layout-independent initialisation and the parallel rule helpers."""
import math

import numpy as np
import pytest

import ctensor as ct
import ctensor.nn as nn
import ctensor.optim as optim
from conftest import assert_layout

S, B, P = ct.sbp.split, ct.sbp.broadcast, ct.sbp.partial_sum
RNG = np.random.default_rng(11)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(8, 4, bias=False)
        self.register_buffer("scale", ct.tensor(np.float32(2.0)))

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x))) * self.scale


def split_all(mesh, dim=0):
    return (S(dim),) * mesh.ndim


# ----------------------------------------------------------------------------- mechanics
def test_registration_and_traversal():
    net = Net()
    assert [n for n, _ in net.named_parameters()] == ["fc1.weight", "fc1.bias", "fc2.weight"]
    assert [n for n, _ in net.named_modules()] == ["", "fc1", "act", "fc2"]
    assert list(net.children()) == [net.fc1, net.act, net.fc2]
    assert net.fc2.bias is None and [n for n, _ in net.named_buffers()] == ["scale"]
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in net.parameters())
    assert list(net.state_dict()) == ["fc1.weight", "fc1.bias", "fc2.weight", "scale"]
    net.extra = nn.Linear(2, 2)
    del net.extra
    assert "extra" not in dict(net.named_modules())
    net.fc1 = 3          # replacing a module with a plain value unregisters it
    assert "fc1" not in dict(net.named_modules()) and net.fc1 == 3
    assert "Linear(in_features=8, out_features=4, bias=False)" in repr(net)

    class NoInit(nn.Module):
        def __init__(self):
            self.w = 1

    with pytest.raises(TypeError, match="super\\(\\).__init__"):
        NoInit()


def test_tied_parameters_appear_once():
    a, b = nn.Linear(4, 4), nn.Linear(4, 4)
    b.weight = a.weight
    seq = nn.Sequential(a, b)
    assert [n for n, _ in seq.named_parameters()] == ["0.weight", "0.bias", "1.bias"]
    assert len(list(seq.parameters())) == 3


def test_parameter_wraps_without_copy_and_repr():
    t = ct.tensor(np.arange(3.0))
    p = nn.Parameter(t)
    assert p.requires_grad and p.is_leaf and isinstance(p, ct.Tensor)
    assert repr(p).startswith("Parameter(shape=(3,)")
    with pytest.raises(TypeError, match="ct.Tensor"):
        nn.Parameter(np.zeros(3))
    with pytest.raises(ValueError, match="floating"):
        nn.Parameter(ct.tensor(np.arange(3)))
    q = nn.Parameter(ct.tensor(np.arange(3)), requires_grad=False)
    assert not q.requires_grad


def test_train_eval_and_zero_grad():
    net = Net()
    assert net.training and net.fc1.training
    net.eval()
    assert not net.training and not net.fc1.training
    net.train()
    assert net.fc2.training
    x = ct.tensor(RNG.standard_normal((3, 6)).astype(np.float32))
    net(x).sum().backward()
    assert net.fc1.weight.grad is not None
    net.zero_grad(set_to_none=False)
    assert float(net.fc1.weight.grad.abs().sum()) == 0.0
    net.zero_grad()
    assert net.fc1.weight.grad is None


def test_to_dtype_in_place():
    net = Net()
    w = net.fc1.weight
    net.double()
    assert net.fc1.weight is w and w.dtype == np.float64 and net.scale.dtype == np.float64


# ----------------------------------------------------------------------------- to_global
def test_to_global_with_rules_reshards_in_place(mesh):
    ct.manual_seed(0)
    net = Net()
    before = {k: v.numpy().copy() for k, v in net.state_dict().items()}
    params = list(net.parameters())
    opt = optim.SGD(net.parameters(), lr=0.1)
    out = net.to_global(mesh, {"fc1.*": split_all(mesh), "fc2.weight": split_all(mesh, 1)})
    assert out is net and all(a is b for a, b in zip(net.parameters(), params))
    assert net.fc1.weight.sbp == split_all(mesh) and net.fc1.bias.sbp == split_all(mesh)
    assert net.fc2.weight.sbp == split_all(mesh, 1)
    assert net.scale.placement == mesh and net.scale.sbp == (B,) * mesh.ndim
    for k, v in net.state_dict().items():
        assert_layout(v, before[k])
    # one SBP for everything, and the optimizer keeps working on the same objects
    net.to_global(mesh, (B,) * mesh.ndim)
    assert all(p.sbp == (B,) * mesh.ndim for p in net.parameters())
    x = ct.tensor(RNG.standard_normal((5, 6)).astype(np.float32), placement=mesh)
    net(x).sum().backward()
    opt.step()
    assert all(p.placement == mesh for p in opt.param_groups[0]["params"])


def test_to_global_moves_gradients_and_validates_first(mesh):
    net = Net().to_global(mesh)
    x = ct.tensor(RNG.standard_normal((4, 6)).astype(np.float32), placement=mesh)
    net(x).sum().backward()
    g = net.fc1.weight.grad.numpy()
    net.to_global(mesh, {"fc1.weight": split_all(mesh, 1)})
    assert net.fc1.weight.grad.sbp == split_all(mesh, 1)
    np.testing.assert_allclose(net.fc1.weight.grad.numpy(), g)
    with pytest.raises(ValueError, match="match no parameter"):
        net.to_global(mesh, {"fc3.*": S(0)})
    with pytest.raises(ValueError, match="fc1.bias"):   # a 1-D bias has no dim 1
        net.to_global(mesh, {"fc2.weight": split_all(mesh), "fc1.bias": split_all(mesh, 1)})
    assert net.fc2.weight.sbp == (B,) * mesh.ndim        # nothing moved
    with pytest.raises(TypeError, match="placement"):
        net.to_global("cpu", S(0))


# ----------------------------------------------------------------------------- state dicts
def test_state_dict_round_trip_keeps_identity_and_layout(mesh):
    ct.manual_seed(1)
    src = Net()
    ct.manual_seed(2)
    dst = Net().to_global(mesh, {"fc1.weight": split_all(mesh, 1)})
    w = dst.fc1.weight
    state = src.state_dict()
    state["fc2.weight"] = state["fc2.weight"].numpy()          # NumPy arrays are accepted
    result = dst.load_state_dict(state)
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert dst.fc1.weight is w and w.sbp == split_all(mesh, 1) and w.placement == mesh
    for k, v in dst.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), src.state_dict()[k].numpy())


def test_load_state_dict_errors_change_nothing():
    net = Net()
    before = net.fc1.weight.numpy().copy()
    good = {k: v.numpy() + 1 for k, v in net.state_dict().items()}
    bad = dict(good, **{"fc1.bias": np.zeros(3)})
    with pytest.raises(ValueError, match="'fc1.bias' has shape"):
        net.load_state_dict(bad)
    np.testing.assert_array_equal(net.fc1.weight.numpy(), before)
    with pytest.raises(ValueError, match="missing keys \\['scale'\\]"):
        net.load_state_dict({k: v for k, v in good.items() if k != "scale"})
    with pytest.raises(ValueError, match="unexpected keys \\['extra'\\]"):
        net.load_state_dict(dict(good, extra=np.zeros(1)))
    with pytest.raises(TypeError, match="'fc1.weight'"):
        net.load_state_dict(dict(good, **{"fc1.weight": "zeros"}))
    np.testing.assert_array_equal(net.fc1.weight.numpy(), before)
    res = net.load_state_dict({"fc1.weight": good["fc1.weight"], "x": 1.0}, strict=False)
    assert res.unexpected_keys == ["x"] and "fc1.bias" in res.missing_keys
    np.testing.assert_array_equal(net.fc1.weight.numpy(), before + 1)


# ----------------------------------------------------------------------------- layers
def test_linear_matches_numpy_and_init_is_layout_independent(mesh):
    ct.manual_seed(5)
    fc = nn.Linear(7, 5, dtype=np.float64)
    with ct.simulate(1):                 # the same seed on one rank: the same weights
        ct.manual_seed(5)
        ref = nn.Linear(7, 5, dtype=np.float64)
        w_ref, b_ref = ref.weight.numpy(), ref.bias.numpy()
    assert fc.weight.shape == (5, 7) and fc.bias.shape == (5,)
    np.testing.assert_array_equal(fc.weight.numpy(), w_ref)
    np.testing.assert_array_equal(fc.bias.numpy(), b_ref)
    bound = 1 / math.sqrt(7)
    assert np.abs(w_ref).max() <= bound and np.abs(w_ref).max() > 0.5 * bound
    x = RNG.standard_normal((4, 7))
    fc.to_global(mesh, {"weight": split_all(mesh), "bias": split_all(mesh)})
    y = fc(ct.tensor(x, placement=mesh))
    np.testing.assert_allclose(y.numpy(), x @ w_ref.T + b_ref, rtol=1e-12)
    assert y.sbp[-1] == S(1)             # column parallel: the output features stay split


def test_embedding_layernorm_activations():
    ct.manual_seed(0)
    emb = nn.Embedding(10, 4, dtype=np.float64)
    ids = np.array([[1, 2], [9, 1]])
    np.testing.assert_array_equal(emb(ct.tensor(ids)).numpy(), emb.weight.numpy()[ids])
    assert abs(emb.weight.numpy().std() - 1.0) < 0.5
    ln = nn.LayerNorm(4, dtype=np.float64)
    x = RNG.standard_normal((3, 4))
    want = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(ln(ct.tensor(x)).numpy(), want, rtol=1e-10)
    np.testing.assert_allclose(nn.ReLU()(ct.tensor(x)).numpy(), np.maximum(x, 0))
    assert nn.GELU(approximate="tanh")(ct.tensor(x)).shape == (3, 4)
    with pytest.raises(ValueError, match="approximate"):
        nn.GELU("fast")
    with pytest.raises(ValueError, match="in_features"):
        nn.Linear(0, 3)
    with pytest.raises(ValueError, match="'p'"):
        nn.Dropout(1.5)


def test_dropout_mask_is_layout_independent(mesh):
    x = RNG.standard_normal((6, 10))
    drop = nn.Dropout(0.5)
    with ct.simulate(1):
        ct.manual_seed(3)
        ref = drop(ct.tensor(x)).numpy()
    ct.manual_seed(3)
    got = drop(ct.tensor(x, placement=mesh, sbp=split_all(mesh, 1)))
    np.testing.assert_array_equal(got.numpy(), ref)
    kept = ref != 0
    assert 0.2 < kept.mean() < 0.8
    np.testing.assert_allclose(ref[kept], 2 * x[kept])
    drop.eval()
    assert drop(got) is got


def test_containers():
    seq = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    assert len(seq) == 3 and isinstance(seq[2], nn.Linear) and seq[-1] is seq[2]
    assert seq(ct.randn(5, 3)).shape == (5, 2)
    ml = nn.ModuleList([nn.Linear(2, 2)]).append(nn.Linear(2, 3))
    assert [n for n, _ in ml.named_parameters()][-1] == "1.bias" and len(ml) == 2
    md = nn.ModuleDict({"a": nn.Linear(2, 2)})
    md["b"] = nn.ReLU()
    assert list(md) == ["a", "b"] and "a" in md
    with pytest.raises(TypeError, match="nn.Module"):
        nn.Sequential(3)
    with pytest.raises(TypeError, match="no forward"):
        ml(1)


# ----------------------------------------------------------------------------- GPT
def tiny_gpt(**kw):
    cfg = dict(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=16)
    cfg.update(kw)
    return nn.GPT(**cfg, dtype=np.float64)


def test_gpt_forward_shapes_tying_and_errors():
    ct.manual_seed(0)
    model = tiny_gpt()
    assert model.lm_head.weight is model.wte.weight
    names = [n for n, _ in model.named_parameters()]
    assert "lm_head.weight" not in names and "blocks.1.mlp.fc.weight" in names
    idx = ct.tensor(RNG.integers(0, 16, (2, 8)))
    logits, loss = model(idx, idx)
    assert logits.shape == (2, 8, 16) and loss.shape == ()
    assert abs(float(loss) - math.log(16)) < 0.3        # small init: near-uniform guesses
    assert model(idx)[1] is None
    untied = tiny_gpt(tie_weights=False)
    assert "lm_head.weight" in dict(untied.named_parameters())
    with pytest.raises(ValueError, match="block_size"):
        model(ct.tensor(np.zeros((1, 9), dtype=np.int64)))
    with pytest.raises(TypeError, match="idx"):
        model(ct.tensor(np.zeros((1, 4))))
    with pytest.raises(ValueError, match="multiple"):
        nn.CausalSelfAttention(10, 3)


def test_attention_is_causal():
    ct.manual_seed(0)
    attn = nn.CausalSelfAttention(8, 2, dtype=np.float64)
    x = RNG.standard_normal((1, 5, 8))
    y1 = attn(ct.tensor(x)).numpy()
    x2 = x.copy()
    x2[:, 3:] += 1.0                                     # change only the future
    y2 = attn(ct.tensor(x2)).numpy()
    np.testing.assert_allclose(y1[:, :3], y2[:, :3], rtol=1e-12)
    assert not np.allclose(y1[:, 3:], y2[:, 3:])


# ----------------------------------------------------------------------------- parallel
def test_tensor_parallel_rules():
    assert nn.parallel.tensor_parallel_rules(nn.MLP(8)) == {
        "fc.weight": S(0), "fc.bias": S(0), "proj.weight": S(1)}
    seq = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4), nn.Linear(4, 4))
    assert nn.parallel.tensor_parallel_rules(seq) == {
        "0.weight": S(0), "0.bias": S(0), "2.weight": S(1), "3.weight": S(0), "3.bias": S(0)}
    rules = nn.parallel.tensor_parallel_rules(tiny_gpt())
    assert rules["wte.weight"] == S(0) and "lm_head.weight" not in rules
    assert rules["blocks.0.attn.query.weight"] == S(0)
    assert rules["blocks.1.attn.proj.weight"] == S(1)
    assert "blocks.1.attn.proj.bias" not in rules and "wpe.weight" not in rules
    assert nn.parallel.tensor_parallel_rules(tiny_gpt(tie_weights=False))[
        "lm_head.weight"] == S(0)
    hybrid = nn.parallel.hybrid_parallel_rules(tiny_gpt())
    assert hybrid["blocks.0.mlp.fc.weight"] == (B, S(0)) and hybrid["ln_f.weight"] == (B, B)
    assert nn.parallel.hybrid_parallel_rules(nn.MLP(4), tp_axis=0)["proj.weight"] == (S(1), B)
    with pytest.raises(ValueError, match="tp_axis"):
        nn.parallel.hybrid_parallel_rules(nn.MLP(4), 2, tp_axis=2)
    with pytest.raises(TypeError, match="nn.Module"):
        nn.parallel.tensor_parallel_rules("model")


def test_parallel_helpers_apply_layouts(world4):
    mesh2d = ct.placement("cpu", [[0, 1], [2, 3]])
    line = ct.placement("cpu", [0, 1])
    model = nn.parallel.hybrid_parallel(nn.MLP(4), mesh2d)
    assert model.fc.weight.sbp == (B, S(0)) and model.proj.bias.sbp == (B, B)
    assert nn.parallel.batch_sbp(mesh2d) == (S(0), B)
    assert nn.parallel.batch_sbp(line, dim=1) == (S(1),)
    model = nn.parallel.tensor_parallel(nn.MLP(4), line)
    assert model.proj.weight.sbp == (S(1),) and model.fc.weight.placement == line
    model = nn.parallel.data_parallel(nn.MLP(4), line)
    assert all(p.sbp == (B,) for p in model.parameters())
    with pytest.raises(ValueError, match="1-D"):
        nn.parallel.tensor_parallel(nn.MLP(4), mesh2d)
    with pytest.raises(ValueError, match="dp_axis"):
        nn.parallel.batch_sbp(line, dp_axis=1)
