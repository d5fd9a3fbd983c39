"""The planner (ctensor/planner.py): one plan per OpCall, cached by the call's value, and the
advisor seam a whole-step plan plugs into."""
from __future__ import annotations

import numpy as np
import pytest

import ctensor as ct
from ctensor import planner
from ctensor.sbp import Split

S0, S1, B = ct.sbp.split(0), ct.sbp.split(1), ct.sbp.broadcast


@pytest.fixture
def advisor_off():
    previous = planner.set_advisor(None)
    yield
    planner.set_advisor(previous)


def _matmul_inputs(mesh):
    a = ct.tensor(np.arange(16.0).reshape(4, 4), placement=mesh, sbp=(B,) * mesh.ndim)
    b = ct.tensor(np.eye(4), placement=mesh, sbp=(B,) * mesh.ndim)
    return a, b


def test_one_plan_per_call_value(mesh, advisor_off):
    a, b = _matmul_inputs(mesh)
    op = ct.matmul.op
    args = (op, {}, (a._layout, b._layout), None, 0, 0, (0, 1))
    first = planner.plan_for(*args)
    assert planner.plan_for(*args) is first
    assert first.call.key == (op, ct.get_default_dtype(), (), (a._layout, b._layout), None, 0,
                              0, (0, 1))
    # another bit of the call (input 0 needs a gradient): another plan
    assert planner.plan_for(op, {}, (a._layout, b._layout), None, 1, 0, (0, 1)) is not first


def test_advisor_sees_each_axis_and_can_take_another_candidate(mesh, advisor_off):
    a, b = _matmul_inputs(mesh)
    seen = []

    def split_rows(call, choice):
        seen.append((call.op.name, choice.axis))
        assert choice.picked in choice.candidates
        assert len(choice.costs) == len(choice.candidates)
        for cand in choice.candidates:
            if cand.outputs[0] == S0 and cand.inputs == (S0, B):
                return cand
        return None

    expected = np.arange(16.0).reshape(4, 4)
    planner.set_advisor(split_rows)
    try:
        y = a @ b
        y2 = a @ b  # asked again on a cached call
    finally:
        planner.set_advisor(None)
    assert [name for name, _ in seen] == ["matmul"] * (2 * mesh.ndim)
    assert all(isinstance(e, Split) for e in y.sbp) and y2.sbp == y.sbp
    np.testing.assert_allclose(y.numpy(), expected)
    # without the advisor the cost model's choice comes back (nothing moves for B @ B)
    assert (a @ b).sbp == (B,) * mesh.ndim


def test_advisor_must_return_a_candidate(mesh, advisor_off):
    a, b = _matmul_inputs(mesh)
    planner.set_advisor(lambda call, choice: ct.dispatch.sig([S1, S1], S1))
    try:
        with pytest.raises(ValueError, match="not one of the candidates"):
            a @ b
    finally:
        planner.set_advisor(None)
    with pytest.raises(TypeError, match="callable"):
        planner.set_advisor(3)


def test_a_call_differing_only_in_value_attributes_takes_the_cached_plan():
    """``fused_adam``'s learning rate and step are ``value_attrs``: the per-parameter AdamW
    under a schedule plans each parameter's update once, not once a step (each miss priced
    every candidate again), and updates as the unfused rule does."""
    import ctensor.optim as optim
    import ctensor.nn as nn
    import ctensor.optim as optim
    calls = []
    original = planner.plan
    planner.plan = lambda call: calls.append(call.op.name) or original(call)
    planner.clear()
    rng = np.random.default_rng(0)
    start = rng.standard_normal((6, 4))
    grads = [rng.standard_normal((6, 4)) for _ in range(4)]
    try:
        with ct.simulate(2):
            pl = ct.placement("cpu", [0, 1])
            w = nn.Parameter(ct.tensor(start, placement=pl, sbp=ct.sbp.split(0)))
            opt = optim.AdamW([w], lr=0.1, foreach=False)
            schedule = optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
            seen = []
            for g in grads:
                w.grad = ct.tensor(g, placement=pl, sbp=ct.sbp.split(0))
                opt.step()
                seen.append(calls.count("fused_adam"))
                schedule.step()
            got = w.numpy()
    finally:
        planner.plan = original
    assert seen == [1, 1, 1, 1], seen
    p, m, v = start.copy(), np.zeros_like(start), np.zeros_like(start)  # PyTorch's AdamW
    for t, g in enumerate(grads, 1):
        lr = 0.1 / t
        p *= 1 - lr * 1e-2
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        p -= lr / (1 - 0.9 ** t) * m / (np.sqrt(v) / np.sqrt(1 - 0.999 ** t) + 1e-8)
    np.testing.assert_allclose(got, p, rtol=1e-6, atol=1e-7)
