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
