"""Optimizers, schedulers and gradient clipping against NumPy references, over layouts.

Gradients are set directly (``p.grad = ...`` in the parameter's layout), so these tests
check the update rules and state layouts alone; tests/test_training.py checks them inside
real training.
"""
import math

import numpy as np
import pytest

import ctensor as ct
import ctensor.nn as nn
import ctensor.optim as optim
from conftest import MPI_MODE

S, B = ct.sbp.split, ct.sbp.broadcast
RNG = np.random.default_rng(7)
W0 = RNG.standard_normal((5, 3))
B0 = RNG.standard_normal(5)
GRADS = [(RNG.standard_normal((5, 3)), RNG.standard_normal(5)) for _ in range(3)]


# ----------------------------------------------------------------------------- references
def ref_sgd(p, grads, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
    buf = None
    for g in grads:
        d = g + weight_decay * p if weight_decay else g
        if momentum:
            buf = d.copy() if buf is None else buf * momentum + d * (1 - dampening)
            d = d + buf * momentum if nesterov else buf
        p = p - d * lr
    return p


def ref_adam(p, grads, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False,
             decoupled=False):
    b1, b2 = betas
    m = v = 0.0
    vmax = None
    for t, g in enumerate(grads, 1):
        if weight_decay and decoupled:
            p = p * (1 - lr * weight_decay)
        elif weight_decay:
            g = g + p * weight_decay
        m = m * b1 + g * (1 - b1)
        v = v * b2 + g * g * (1 - b2)
        if amsgrad:
            vmax = v if vmax is None else np.maximum(vmax, v)
        vv = vmax if amsgrad else v
        p = p - m / (np.sqrt(vv) / math.sqrt(1 - b2 ** t) + eps) * (lr / (1 - b1 ** t))
    return p


CONFIGS = {
    "sgd": (optim.SGD, dict(lr=0.1), ref_sgd),
    "sgd-momentum-wd": (optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01),
                        ref_sgd),
    "sgd-nesterov": (optim.SGD, dict(lr=0.05, momentum=0.8, nesterov=True), ref_sgd),
    "adam-l2-amsgrad": (optim.Adam, dict(lr=0.01, weight_decay=0.1, amsgrad=True), ref_adam),
    "adam-l2": (optim.Adam, dict(lr=0.01, weight_decay=0.1), ref_adam),  # (fused)
    "adamw": (optim.AdamW, dict(lr=0.01, betas=(0.8, 0.99), weight_decay=0.1),
              lambda *a, **k: ref_adam(*a, decoupled=True, **k)),
}


def layouts(mesh):
    """(weight sbp, bias sbp) pairs for the mesh, incl. uneven splits."""
    if mesh.ndim == 1:
        return [((B,), (B,)), ((S(0),), (S(0),)), ((S(1),), (B,))]
    return [((S(0), S(1)), (B, S(0))), ((B, S(0)), (B, B)), ((S(1), B), (S(0), B))]


def make_params(mesh, sbp_w, sbp_b, dtype=np.float64):
    w = nn.Parameter(ct.tensor(W0, placement=mesh, sbp=sbp_w, dtype=dtype))
    b = nn.Parameter(ct.tensor(B0, placement=mesh, sbp=sbp_b, dtype=dtype))
    return w, b


def set_grads(params, grads):
    for p, g in zip(params, grads):
        p.grad = ct.tensor(g, placement=p.placement, sbp=p.sbp, dtype=p.dtype)


def run_steps(opt, params, grads):
    for gs in grads:
        set_grads(params, gs)
        opt.step()
        opt.zero_grad()


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("zero", [None, 0])
def test_update_matches_numpy_in_every_layout(mesh, name, zero):
    cls, kwargs, ref = CONFIGS[name]
    for sbp_w, sbp_b in layouts(mesh):
        params = make_params(mesh, sbp_w, sbp_b)
        opt = cls(params, shard_states_along=zero, **kwargs)
        run_steps(opt, params, GRADS)
        for p, p0, i in zip(params, (W0, B0), (0, 1)):
            want = ref(p0, [g[i] for g in GRADS], **kwargs)
            np.testing.assert_allclose(p.numpy(), want, rtol=1e-12, atol=1e-12)
        assert (params[0].sbp, params[1].sbp) == (sbp_w, sbp_b)


def test_states_follow_the_parameter_layout(mesh):
    for sbp_w, sbp_b in layouts(mesh):
        params = make_params(mesh, sbp_w, sbp_b)
        opt = optim.Adam(params, lr=0.1)
        run_steps(opt, params, GRADS[:1])
        for p in params:
            for key in ("exp_avg", "exp_avg_sq"):
                st = opt.state[id(p)][key]
                assert st.placement == p.placement and st.sbp == p.sbp


def test_shard_states_along_splits_broadcast_axes(mesh):
    for sbp_w, sbp_b in layouts(mesh):
        params = make_params(mesh, sbp_w, sbp_b)
        opt = optim.AdamW(params, lr=0.1, shard_states_along=0)
        run_steps(opt, params, GRADS[:1])
        for p in params:
            st = opt.state[id(p)]["exp_avg"].sbp
            placement, want = opt.state_layout(p)
            assert st == want
            taken = {s.dim for s in p.sbp if isinstance(s, ct.sbp.Split)}
            if p.sbp[0] == B and any(d not in taken for d in range(p.ndim)):
                assert isinstance(st[0], ct.sbp.Split)  # 5 rows / 3 cols fit every mesh here
                assert st[0].dim not in taken  # a free dim: the B -> S slice is local
            else:
                assert st[0] == p.sbp[0]
            assert all(a == b for a, b in zip(st[1:], p.sbp[1:]))


def test_shard_states_along_bad_axis():
    with ct.simulate(2):
        params = make_params(ct.placement("cpu", [0, 1]), (B,), (B,))
        opt = optim.Adam(params, lr=0.1, shard_states_along=1)
        set_grads(params, GRADS[0])
        with pytest.raises(ValueError, match="shard_states_along"):
            opt.step()
    with pytest.raises(ValueError, match="shard_states_along"):
        optim.Adam([nn.Parameter(ct.zeros(2))], shard_states_along=-1)


def test_float32_update(mesh):
    sbp_w, sbp_b = layouts(mesh)[1]
    params = make_params(mesh, sbp_w, sbp_b, dtype=np.float32)
    opt = optim.AdamW(params, lr=0.01, weight_decay=0.1)
    run_steps(opt, params, GRADS)
    want = ref_adam(W0, [g[0] for g in GRADS], lr=0.01, weight_decay=0.1, decoupled=True)
    assert params[0].dtype == np.float32
    np.testing.assert_allclose(params[0].numpy(), want, rtol=1e-5, atol=1e-6)


def test_fused_adam_is_the_unfused_arithmetic_bit_for_bit(mesh):
    # ct.fused_adam (what Adam and AdamW run without amsgrad) does the reference's float32
    # operations in the reference's order: the same bits, in every layout
    sbp_w, sbp_b = layouts(mesh)[1]
    params = make_params(mesh, sbp_w, sbp_b, dtype=np.float32)
    opt = optim.AdamW(params, lr=0.01, weight_decay=0.1)
    grads = [tuple(g.astype(np.float32) for g in gs) for gs in GRADS]
    run_steps(opt, params, grads)
    for p, p0, i in zip(params, (W0, B0), (0, 1)):
        want = ref_adam(p0.astype(np.float32), [g[i] for g in grads], lr=0.01,
                        weight_decay=0.1, decoupled=True)
        assert want.dtype == np.float32
        np.testing.assert_array_equal(p.numpy(), want)


def test_fused_adam_refuses_mismatched_states():
    with ct.simulate(1):
        p, g = ct.zeros(3, 2), ct.zeros(3, 2)
        with pytest.raises(ValueError, match="fused_adam: argument 'exp_avg'"):
            ct.fused_adam(p, g, ct.zeros(2, 3), ct.zeros(3, 2), lr=0.1, beta1=0.9,
                          beta2=0.99, eps=1e-8)


def test_optimizer_keeps_working_after_module_to_global(mesh):
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(ct.tensor(W0))
            self.b = nn.Parameter(ct.tensor(B0))

    model = Two()
    opt = optim.Adam(model.parameters(), lr=0.01, shard_states_along=0)
    params = [model.w, model.b]
    model.to_global(mesh, {"w": layouts(mesh)[1][0]})
    run_steps(opt, params, GRADS[:2])
    model.to_global(mesh, {"w": layouts(mesh)[2][0], "b": layouts(mesh)[2][1]})
    assert model.w is params[0]
    run_steps(opt, params, GRADS[2:])
    want = ref_adam(W0, [g[0] for g in GRADS], lr=0.01)
    np.testing.assert_allclose(model.w.numpy(), want, rtol=1e-12, atol=1e-12)
    assert model.w.sbp == layouts(mesh)[2][0]
    assert opt.state[id(model.w)]["exp_avg"].placement == mesh


@pytest.mark.parametrize("name", ["sgd-momentum-wd", "adam-l2-amsgrad", "adamw"])
def test_state_dict_round_trip_resumes_exactly(mesh, name):
    cls, kwargs, ref = CONFIGS[name]
    sbp_w, sbp_b = layouts(mesh)[-1]
    params = make_params(mesh, sbp_w, sbp_b)
    opt = cls(params, **kwargs)
    run_steps(opt, params, GRADS[:2])
    sd = opt.state_dict()
    assert sorted(sd) == ["param_groups", "state"] and sd["param_groups"][0]["params"] == [0, 1]
    # a fresh optimizer on parameters in another layout, states sharded: same continuation
    other = make_params(mesh, *layouts(mesh)[0])
    with ct.no_grad():  # parameters (leaves that require grad) change in place only so
        for p, q in zip(other, params):
            p.copy_(q)
    opt2 = cls(other, shard_states_along=0, **kwargs)
    opt2.load_state_dict(sd)
    run_steps(opt2, other, GRADS[2:])
    run_steps(opt, params, GRADS[2:])
    for p, q in zip(other, params):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-13, atol=1e-13)
    st = opt2.state[id(other[0])]
    assert st["step"] == 3
    if "exp_avg" in st:
        assert (st["exp_avg"].placement, st["exp_avg"].sbp) == opt2.state_layout(other[0])


def test_load_state_dict_validates_before_changing():
    params = make_params(ct.placement.all(), (B,), (B,))
    opt = optim.Adam(params, lr=0.1)
    run_steps(opt, params, GRADS[:1])
    before = opt.state[id(params[0])]["exp_avg"].numpy().copy()
    sd = opt.state_dict()
    bad = {"state": {0: {"step": 1, "exp_avg": np.zeros((2, 2))}}, "param_groups":
           sd["param_groups"]}
    with pytest.raises(ValueError, match="shape"):
        opt.load_state_dict(bad)
    with pytest.raises(ValueError, match="parameter groups"):
        opt.load_state_dict({"state": {}, "param_groups": []})
    with pytest.raises(ValueError, match="'state' and 'param_groups'"):
        opt.load_state_dict({"state": {}})
    np.testing.assert_array_equal(opt.state[id(params[0])]["exp_avg"].numpy(), before)
    assert opt.param_groups[0]["lr"] == 0.1


def test_param_groups_and_errors():
    w = nn.Parameter(ct.tensor(W0))
    b = nn.Parameter(ct.tensor(B0))
    opt = optim.SGD([{"params": [w]}, {"params": [b], "lr": 0.5}], lr=0.1, momentum=0.9)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.5]
    assert opt.param_groups[1]["momentum"] == 0.9
    with pytest.raises(ValueError, match="empty"):
        optim.SGD([], lr=0.1)
    with pytest.raises(TypeError, match="single ct.Tensor"):
        optim.SGD(w, lr=0.1)
    with pytest.raises(ValueError, match="'lr'"):
        optim.Adam([w], lr=-1.0)
    with pytest.raises(ValueError, match="'betas'"):
        optim.Adam([w], betas=(0.9, 1.5))
    with pytest.raises(ValueError, match="more than one"):
        optim.SGD([w, w], lr=0.1)
    with pytest.raises(ValueError, match="nesterov"):
        optim.SGD([w], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="leaf"):
        optim.SGD([w * 2], lr=0.1)
    # parameters without a gradient are skipped
    w.grad = None
    before = w.numpy().copy()
    opt.step()
    np.testing.assert_array_equal(w.numpy(), before)


def test_step_with_closure():
    w = nn.Parameter(ct.tensor(np.array([1.0, -2.0])))
    opt = optim.SGD([w], lr=0.25)

    def closure():
        opt.zero_grad()
        loss = (w * w).sum()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert float(loss) == pytest.approx(5.0)
    np.testing.assert_allclose(w.numpy(), [0.5, -1.0])


# ----------------------------------------------------------------------------- schedulers
def _opt(lr=1.0):
    return optim.SGD([nn.Parameter(ct.zeros(2))], lr=lr)


def test_step_lr():
    opt = _opt(1.0)
    sched = optim.StepLR(opt, step_size=2, gamma=0.5)
    lrs = []
    for _ in range(5):
        lrs.append(opt.param_groups[0]["lr"])
        sched.step()
    assert lrs == [1.0, 1.0, 0.5, 0.5, 0.25]
    assert sched.get_last_lr() == [0.25]


def test_cosine_annealing_lr():
    opt = _opt(2.0)
    sched = optim.CosineAnnealingLR(opt, T_max=4, eta_min=0.5)
    got = []
    for _ in range(5):
        got.append(opt.param_groups[0]["lr"])
        sched.step()
    want = [0.5 + 1.5 * (1 + math.cos(math.pi * t / 4)) / 2 for t in range(5)]
    np.testing.assert_allclose(got, want)


def test_cosine_with_warmup_and_state_dict():
    opt = _opt(1.0)
    sched = optim.cosine_with_warmup(opt, warmup_steps=2, total_steps=6, min_lr_ratio=0.1)
    got = []
    for _ in range(8):
        got.append(opt.param_groups[0]["lr"])
        sched.step()
    assert got[:2] == [0.5, 1.0]
    np.testing.assert_allclose(got[2:7], [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * k / 4))
                                          for k in range(5)])
    assert got[7] == pytest.approx(0.1)
    opt2 = _opt(1.0)
    sched2 = optim.cosine_with_warmup(opt2, warmup_steps=2, total_steps=6, min_lr_ratio=0.1)
    sched2.load_state_dict(sched.state_dict())
    assert opt2.param_groups[0]["lr"] == pytest.approx(opt.param_groups[0]["lr"])
    with pytest.raises(ValueError, match="total_steps"):
        optim.cosine_with_warmup(opt, warmup_steps=5, total_steps=5)
    with pytest.raises(ValueError, match="step_size"):
        optim.StepLR(opt, step_size=0)
    with pytest.raises(TypeError, match="optimizer"):
        optim.StepLR(object(), step_size=1)


# ----------------------------------------------------------------------------- clipping
@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
def test_clip_grad_norm_in_every_layout(mesh, norm_type):
    g_w, g_b = GRADS[0]
    flat = np.concatenate([g_w.ravel(), g_b.ravel()])
    total = (np.abs(flat).max() if math.isinf(norm_type)
             else (np.abs(flat) ** norm_type).sum() ** (1 / norm_type))
    for sbp_w, sbp_b in layouts(mesh):
        params = make_params(mesh, sbp_w, sbp_b)
        set_grads(params, GRADS[0])
        norm = nn.utils.clip_grad_norm_(params, max_norm=1.0, norm_type=norm_type)
        assert isinstance(norm, ct.Tensor) and norm.shape == ()
        np.testing.assert_allclose(float(norm), total, rtol=1e-12)
        scale = min(1.0, 1.0 / (total + 1e-6))
        np.testing.assert_allclose(params[0].grad.numpy(), g_w * scale, rtol=1e-12)
        np.testing.assert_allclose(params[1].grad.numpy(), g_b * scale, rtol=1e-12)
        assert params[0].grad.sbp == sbp_w


def test_clip_grad_norm_of_partial_grads_and_no_clip(mesh):
    w = nn.Parameter(ct.tensor(W0, placement=mesh, sbp=(B,) * mesh.ndim))
    w.grad = ct.tensor(GRADS[0][0] * 1e-3, placement=mesh,
                       sbp=(ct.sbp.partial_sum,) * mesh.ndim)
    norm = nn.utils.clip_grad_norm_([w], max_norm=100.0)
    np.testing.assert_allclose(float(norm), np.linalg.norm(GRADS[0][0] * 1e-3), rtol=1e-12)
    np.testing.assert_allclose(w.grad.numpy(), GRADS[0][0] * 1e-3, rtol=1e-12)


def test_clip_grad_norm_errors():
    w = nn.Parameter(ct.tensor(np.array([1.0, np.inf])))
    w.grad = ct.tensor(np.array([1.0, np.inf]))
    with pytest.raises(ValueError, match="non-finite"):
        nn.utils.clip_grad_norm_([w], 1.0, error_if_nonfinite=True)
    with pytest.raises(ValueError, match="max_norm"):
        nn.utils.clip_grad_norm_([w], -1.0)
    assert float(nn.utils.clip_grad_norm_([nn.Parameter(ct.zeros(2))], 1.0)) == 0.0


def test_clip_grad_norm_across_placements(world4):
    # pipeline stages: parameters on different sub-meshes, one global norm
    first = ct.placement("cpu", [0, 1])
    second = ct.placement("cpu", [[2], [3]])
    w = nn.Parameter(ct.tensor(W0, placement=first, sbp=S(0)))
    b = nn.Parameter(ct.tensor(B0, placement=second, sbp=(S(0), B)))
    set_grads([w, b], GRADS[0])
    total = np.sqrt((GRADS[0][0] ** 2).sum() + (GRADS[0][1] ** 2).sum())
    norm = nn.utils.clip_grad_norm_([w, b], max_norm=0.5)
    np.testing.assert_allclose(float(norm), total, rtol=1e-12)
    np.testing.assert_allclose(b.grad.numpy(), GRADS[0][1] * 0.5 / (total + 1e-6), rtol=1e-12)
    assert b.grad.placement == second and b.grad.sbp == (S(0), B)


def test_clip_grad_norm_foreach_of_split_gradients_reduces_once(world4):
    """Tensor-parallel gradients (S(0), S(1) on the tensor axis of a (2, 2) mesh, uneven),
    replicated ones, and a second placement (a pipeline stage): the multi-tensor clip
    equals the per-gradient one (float64, 1e-12) with one all-reduce of the split ones'
    squared sums per placement and the stage's sum and scale moved once each, not a
    collective per gradient."""
    mesh = ct.placement("cpu", [[0, 1], [2, 3]])
    stage = ct.placement("cpu", [[2], [3]])
    rng = np.random.default_rng(3)
    shapes = [((5, 3), mesh, (B, S(0))), ((3, 5), mesh, (B, S(1))), ((5,), mesh, (B, B)),
              ((7, 2), mesh, (B, S(0))), ((4,), stage, (S(0), B)), ((2, 3), stage, (B, B))]
    values = [rng.standard_normal(shape) for shape, _, _ in shapes]
    results = []
    for foreach in (False, None):
        params = []
        for v, (shape, placement, sbp) in zip(values, shapes):
            p = nn.Parameter(ct.zeros(*shape, dtype=ct.float64, placement=placement, sbp=sbp))
            p.grad = ct.tensor(v, placement=placement, sbp=sbp)
            params.append(p)
        with ct.debug.comm_log() as log:
            total = nn.utils.clip_grad_norm_(params, 0.5, foreach=foreach)
        results.append((float(total), [p.grad.numpy() for p in params], log.collectives()))
        assert all(p.grad.sbp == sbp for p, (_, _, sbp) in zip(params, shapes))
        assert total.placement == mesh and total.sbp == (B, B)
    (t0, g0, per_gradient), (t1, g1, multi) = results
    want = math.sqrt(sum((v ** 2).sum() for v in values))
    assert t0 == pytest.approx(want, rel=1e-12) and t1 == pytest.approx(want, rel=1e-12)
    for a, b in zip(g0, g1):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=0)
    assert multi.count("all_reduce") == 2 < per_gradient.count("all_reduce"), \
        (multi, per_gradient)
    assert len(multi) <= 4, multi  # the two all-reduces, the stage's sum in, its scale out


# ----------------------------------------------------------------------------- PyTorch's schedulers
def _two_group_opts(torch, kind):
    """A ctensor optimizer and a torch one with the same two parameter groups."""
    ours = [nn.Parameter(ct.zeros(2)), nn.Parameter(ct.zeros(3))]
    theirs = [torch.zeros(2, requires_grad=True), torch.zeros(3, requires_grad=True)]
    if kind == "sgd":
        make = lambda params, lib: lib.SGD([{"params": [params[0]]},  # noqa: E731
                                            {"params": [params[1]], "lr": 0.5}],
                                           lr=0.1, momentum=0.9)
    else:
        make = lambda params, lib: lib.AdamW([{"params": [params[0]]},  # noqa: E731
                                              {"params": [params[1]], "lr": 0.02}],
                                             lr=0.01, betas=(0.9, 0.99))
    return make(ours, optim), make(theirs, torch.optim)


def _trace(opt, sched, steps):
    rows = []
    for _ in range(steps):
        rows.append([(g["lr"], g.get("momentum"), g.get("betas")) for g in opt.param_groups])
        sched.step()
    return rows


SCHEDULES = {
    "exponential": lambda lib, opt: lib.ExponentialLR(opt, gamma=0.9),
    "linear": lambda lib, opt: lib.LinearLR(opt),
    "linear_down": lambda lib, opt: lib.LinearLR(opt, start_factor=1.0, end_factor=0.05,
                                                 total_iters=7),
    "onecycle": lambda lib, opt: lib.OneCycleLR(opt, max_lr=[0.3, 0.6], total_steps=20),
    "onecycle_linear_3": lambda lib, opt: lib.OneCycleLR(
        opt, max_lr=0.3, epochs=4, steps_per_epoch=5, pct_start=0.25, three_phase=True,
        anneal_strategy="linear", div_factor=10.0, final_div_factor=100.0),
    "onecycle_no_momentum": lambda lib, opt: lib.OneCycleLR(opt, 0.2, total_steps=24,
                                                            cycle_momentum=False),
    "sequential": lambda lib, opt: lib.SequentialLR(
        opt, [lib.LinearLR(opt, start_factor=0.1, total_iters=4),
              lib.ExponentialLR(opt, gamma=0.8), lib.StepLR(opt, step_size=3, gamma=0.5)],
        milestones=[4, 9]),
    "sequential_cosine": lambda lib, opt: lib.SequentialLR(
        opt, [lib.LinearLR(opt, start_factor=0.5, total_iters=3),
              lib.CosineAnnealingLR(opt, T_max=8, eta_min=0.001)], milestones=[3]),
}


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_schedulers_match_torch_step_by_step(name, kind):
    torch = pytest.importorskip("torch")
    import warnings
    ours, theirs = _two_group_opts(torch, kind)
    sched = SCHEDULES[name](optim, ours)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")        # torch's "step() before optimizer.step()"
        their_sched = SCHEDULES[name](torch.optim.lr_scheduler, theirs)
        want = _trace(theirs, their_sched, 20)
    got = _trace(ours, sched, 20)
    for step, (a, b) in enumerate(zip(got, want)):
        for (lr, m, betas), (tlr, tm, tbetas) in zip(a, b):
            assert lr == pytest.approx(tlr, rel=1e-12, abs=1e-15), (step, lr, tlr)
            assert (m is None) == (tm is None) and (m is None or m == pytest.approx(tm))
            if betas is not None:
                np.testing.assert_allclose(betas, tbetas, rtol=1e-12)
    assert sched.get_last_lr() == pytest.approx(their_sched.get_last_lr(), rel=1e-12)


@pytest.mark.parametrize("name", ["exponential", "linear", "onecycle", "sequential"])
def test_new_schedulers_resume_from_state_dict(name):
    def build():
        opt = optim.SGD([{"params": [nn.Parameter(ct.zeros(2))]},
                         {"params": [nn.Parameter(ct.zeros(2))], "lr": 0.5}],
                        lr=0.1, momentum=0.9)
        return opt, SCHEDULES[name](optim, opt)
    opt, sched = build()
    for _ in range(6):
        sched.step()
    state = sched.state_dict()
    rest = _trace(opt, sched, 8)
    opt2, sched2 = build()
    sched2.load_state_dict(state)
    assert [g["lr"] for g in opt2.param_groups] == [r[0] for r in rest[0]]
    assert _trace(opt2, sched2, 8)[1:] == rest[1:]


def test_new_scheduler_errors():
    opt = _opt(1.0)
    with pytest.raises(ValueError, match="ExponentialLR: argument 'gamma' must be a positive"):
        optim.ExponentialLR(opt, gamma=0)
    with pytest.raises(ValueError, match="LinearLR: argument 'start_factor' must be in"):
        optim.LinearLR(opt, start_factor=0.0)
    with pytest.raises(ValueError, match="LinearLR: argument 'end_factor' must be in"):
        optim.LinearLR(opt, end_factor=1.5)
    with pytest.raises(ValueError, match="LinearLR: argument 'total_iters' must be a positive"):
        optim.LinearLR(opt, total_iters=0)
    with pytest.raises(ValueError, match="OneCycleLR: give total_steps, or epochs and"):
        optim.OneCycleLR(opt, max_lr=0.1)
    with pytest.raises(ValueError, match="argument 'max_lr' must be a number or a list of 1"):
        optim.OneCycleLR(opt, max_lr=[0.1, 0.2], total_steps=5)
    with pytest.raises(ValueError, match="anneal_strategy' must be 'cos' or 'linear'"):
        optim.OneCycleLR(opt, 0.1, total_steps=5, anneal_strategy="exp")
    sched = optim.OneCycleLR(opt, 0.1, total_steps=3)
    for _ in range(3):
        sched.step()
    with pytest.raises(ValueError, match="OneCycleLR: step 4 is past total_steps=3"):
        sched.step()
    with pytest.raises(ValueError, match="SequentialLR: argument 'milestones' must be 1"):
        optim.SequentialLR(opt, [optim.ExponentialLR(opt, 0.5), optim.StepLR(opt, 2)], [])
    other = _opt(1.0)
    with pytest.raises(ValueError, match="scheduler 1 \\(StepLR\\) was made for another"):
        optim.SequentialLR(opt, [optim.ExponentialLR(opt, 0.5), optim.StepLR(other, 2)], [3])
    with pytest.raises(ValueError, match="StepLR.step: argument 'epoch' must be an int >= 0"):
        optim.StepLR(opt, 2).step(-1)


def test_clip_grad_value_in_every_layout(mesh):
    g_w, g_b = GRADS[0]
    w = nn.Parameter(ct.tensor(W0, placement=mesh, sbp=(S(0),) * mesh.ndim))
    b = nn.Parameter(ct.tensor(B0, placement=mesh))
    w.grad = ct.tensor(g_w, placement=mesh, sbp=(S(0),) * mesh.ndim)
    b.grad = ct.tensor(g_b, placement=mesh, sbp=(ct.sbp.partial_sum,) * mesh.ndim)
    assert nn.utils.clip_grad_value_([w, b], 0.5) is None
    np.testing.assert_array_equal(w.grad.numpy(), np.clip(g_w, -0.5, 0.5))
    np.testing.assert_array_equal(b.grad.numpy(), np.clip(g_b, -0.5, 0.5))
    assert w.grad.sbp == (S(0),) * mesh.ndim and b.grad.sbp == (ct.sbp.partial_sum,) * mesh.ndim
    nn.utils.clip_grad_value_(w, 0.1, foreach=True)
    assert np.abs(w.grad.numpy()).max() <= 0.1
    with pytest.raises(ValueError, match="clip_grad_value_: argument 'clip_value' must be"):
        nn.utils.clip_grad_value_([w], -1.0)
    torch = pytest.importorskip("torch")
    t = torch.zeros(5, 3, dtype=torch.float64, requires_grad=True)
    t.grad = torch.tensor(g_w)
    torch.nn.utils.clip_grad_value_([t], 0.5)
    np.testing.assert_array_equal(t.grad.numpy(), np.clip(g_w, -0.5, 0.5))


# ----------------------------------------------------------------------------- foreach
def _mlp_steps(mesh, foreach, steps=3, reload_at=None, **kwargs):
    """A data-parallel MLP (gradients reduced in one bucket) trained with AdamW."""
    ct.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.Linear(8, 3))
    model.to_global(mesh, (ct.sbp.broadcast,) * mesh.ndim)
    groups = [{"params": list(model[0].parameters())},
              {"params": list(model[2].parameters()), "lr": 0.02, "weight_decay": 0.0}]
    opt = optim.AdamW(groups, lr=0.01, weight_decay=0.1, foreach=foreach, **kwargs)
    sbp = (ct.sbp.split(0),) + (ct.sbp.broadcast,) * (mesh.ndim - 1)
    x = ct.tensor(np.linspace(-1, 1, 12 * 6, dtype=np.float32).reshape(12, 6),
                  placement=mesh, sbp=sbp)
    for i in range(steps):
        if i == reload_at:
            sd = opt.state_dict()
            opt = optim.AdamW(groups, lr=0.01, weight_decay=0.1, foreach=foreach, **kwargs)
            opt.load_state_dict(sd)
        (model(x) ** 2).mean().backward()
        opt.step()
        opt.zero_grad()
    return [p.numpy() for p in model.parameters()], opt, model


def test_foreach_adamw_is_the_per_parameter_update_bit_for_bit(mesh):
    want, _, _ = _mlp_steps(mesh, foreach=False)
    got, opt, model = _mlp_steps(mesh, foreach=None)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    # the multi-tensor path ran: a group's states are views of one flat buffer per rank
    w, b = model[0].weight, model[0].bias
    for r in w.local_shards():
        m_w = opt.state[id(w)]["exp_avg"]._shards[r]
        m_b = opt.state[id(b)]["exp_avg"]._shards[r]
        assert m_w.base is not None and m_w.base is m_b.base
    resumed, _, _ = _mlp_steps(mesh, foreach=None, steps=3, reload_at=2)
    for a, b in zip(resumed, want):
        np.testing.assert_array_equal(a, b)


def test_foreach_kernel_over_slices_is_the_whole_update_bit_for_bit(mesh, monkeypatch):
    from ctensor.optim import foreach
    want, _, _ = _mlp_steps(mesh, foreach=False)
    calls = []
    kernel = foreach.adam_kernel
    monkeypatch.setattr(foreach, "adam_kernel", lambda xp, p, *a, **k: (
        calls.append(p.size), kernel(xp, p, *a, **k)))
    monkeypatch.setattr(foreach, "SLICE", 7)  # slices cut across parameters, one left short
    got, _, _ = _mlp_steps(mesh, foreach=None)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    if not MPI_MODE or ct.rank() in mesh:  # (this process runs a rank of the mesh)
        assert max(calls) == 7 and min(calls) < 7


def test_foreach_updates_large_parameters_where_they_lie(mesh, monkeypatch):
    """A parameter of at least a quarter slice is updated in its own array when this process
    holds one rank (no copy in and out); in a simulation of several ranks, gathered."""
    from ctensor.optim import foreach
    written = []  # the arrays the kernel updated
    kernel = foreach.adam_kernel
    monkeypatch.setattr(foreach, "adam_kernel", lambda xp, p, *a, **k: (
        written.append(p), kernel(xp, p, *a, **k)))

    def steps(foreach):
        ct.manual_seed(0)
        layer = nn.Linear(160, 120)  # 19,200 weights: direct; 120 biases: gathered
        layer.to_global(mesh, (ct.sbp.broadcast,) * mesh.ndim)
        opt = optim.AdamW(layer.parameters(), lr=0.01, foreach=foreach)
        x = ct.ones(4, 160, placement=mesh, sbp=(ct.sbp.broadcast,) * mesh.ndim)
        arrays = dict(layer.weight._shards)
        for _ in range(2):
            (layer(x) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
        return layer, arrays
    want, _ = steps(False)
    got, arrays = steps(None)
    for a, b in zip(got.parameters(), want.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert all(got.weight._shards[r] is a for r, a in arrays.items())
    in_place = [any(np.shares_memory(p, a) for p in written) for a in arrays.values()]
    assert in_place == [len(arrays) == 1] * len(arrays)


def test_foreach_falls_back_for_sharded_states_and_amsgrad(mesh):
    want, _, _ = _mlp_steps(mesh, foreach=False, shard_states_along=0)
    got, _, _ = _mlp_steps(mesh, foreach=True, shard_states_along=0)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    want, _, _ = _mlp_steps(mesh, foreach=False, amsgrad=True)
    got, _, _ = _mlp_steps(mesh, foreach=True, amsgrad=True)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_foreach_argument_is_checked():
    with ct.simulate(1):
        p = nn.Parameter(ct.zeros(2))
        with pytest.raises(ValueError, match="argument 'foreach'"):
            optim.AdamW([p], foreach="yes")


@pytest.mark.parametrize("max_norm", [1e-3, 1e3])
def test_clip_grad_norm_foreach_is_the_per_gradient_clip_bit_for_bit(mesh, max_norm):
    results = []
    for foreach in (False, None):
        ct.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.Linear(8, 3))
        model.to_global(mesh, (ct.sbp.broadcast,) * mesh.ndim)
        sbp = (ct.sbp.split(0),) + (ct.sbp.broadcast,) * (mesh.ndim - 1)
        x = ct.tensor(np.linspace(-1, 1, 12 * 6, dtype=np.float32).reshape(12, 6),
                      placement=mesh, sbp=sbp)
        (model(x) ** 2).mean().backward()
        versions = [p.grad._version.value for p in model.parameters()]
        total = nn.utils.clip_grad_norm_(model.parameters(), max_norm, foreach=foreach)
        assert [p.grad._version.value for p in model.parameters()] != versions
        assert total.placement == mesh and total.dtype == np.float32 and total.shape == ()
        results.append((total.numpy(), [p.grad.numpy() for p in model.parameters()]))
    (t0, g0), (t1, g1) = results
    np.testing.assert_array_equal(t0, t1)
    for a, b in zip(g0, g1):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("n", [1, 2])
def test_clip_grad_norm_foreach_takes_splits_on_axes_of_one_rank(n, monkeypatch):
    """A (dp, tp) mesh with tp = 1, as one process (or data parallel alone) lays the GPT
    example out: a vocabulary-parallel weight's S(0) on the tensor axis is the whole
    tensor on every rank, so the multi-tensor clip takes it with the rest (no per-gradient
    ops), with the per-gradient clip's bits."""
    from conftest import world
    from ctensor.optim import foreach
    with world(n):
        mesh = ct.placement("cpu", [[r] for r in range(n)])
        results, taken = [], []
        monkeypatch.setattr(foreach, "clip_grad_norm", lambda *a, _f=foreach.clip_grad_norm:
                            taken.append(_f(*a)) or taken[-1])
        for use in (False, None):
            ct.manual_seed(0)
            w = ct.randn(7, 3, placement=mesh, sbp=(B, S(0)), requires_grad=True)
            b = ct.randn(3, placement=mesh, sbp=(B, B), requires_grad=True)
            ((w.sum(0) * b) ** 2).sum().backward()
            total = nn.utils.clip_grad_norm_([w, b], 1e-2, foreach=use)
            assert total.sbp == (B, B) and total.shape == ()
            results.append((total.numpy(), w.grad.numpy(), b.grad.numpy()))
        assert len(taken) == 1 and taken[0] is not None
        for got, want in zip(results[1], results[0]):
            np.testing.assert_array_equal(got, want)


def test_foreach_in_chunks_and_states_written_in_place(mesh, monkeypatch):
    from ctensor.optim import foreach
    want, _, _ = _mlp_steps(mesh, foreach=False)
    monkeypatch.setattr(foreach, "CHUNK", 50)  # one or two parameters per kernel call
    assert [len(c) for c in foreach.chunks([ct.zeros(40), ct.zeros(8), ct.zeros(60)])] == \
        [2, 1]
    got, opt, model = _mlp_steps(mesh, foreach=None)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    w = model[0].weight
    m = opt.state[id(w)]["exp_avg"]
    before, version = m.numpy().copy(), m._version.value
    (model(ct.ones(12, 6, placement=mesh, sbp=(ct.sbp.broadcast,) * mesh.ndim)) ** 2) \
        .mean().backward()
    opt.step()
    assert opt.state[id(w)]["exp_avg"] is m and m._version.value == version + 1
    assert not np.array_equal(m.numpy(), before)
