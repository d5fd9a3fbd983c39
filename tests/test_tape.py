"""The tape (ctensor/tape.py) and the public saved-tensor hooks (ct.autograd.graph)."""
from __future__ import annotations

import numpy as np

import ctensor as ct
from ctensor import tape

S0, S1, B = ct.sbp.split(0), ct.sbp.split(1), ct.sbp.broadcast


def test_graph_namespace_is_pytorchs():
    graph = ct.autograd.graph
    assert graph.saved_tensors_hooks is ct.autograd.saved_tensors_hooks
    assert graph.regather_saved is ct.autograd.regather_saved
    assert graph.saved_hooks is ct.autograd.saved_hooks


def test_the_tape_keeps_what_saves_names(mesh):
    x = ct.tensor(np.arange(4.0), placement=mesh, sbp=(B,) * mesh.ndim, requires_grad=True)
    y = x * x
    keep, keep_out, needs, watch = tape.what_to_keep(
        ct.planner.plan_for(ct.mul.op, {}, (x._layout, x._layout), None, 3, 3, (0, 0)),
        ct.mul.op, 3)
    assert needs == (True, True) and not keep_out
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.arange(4.0))


class _Kept(ct.autograd.graph.SelfUnpacking):
    """A packed value that rebuilds its tensor itself (counting how often)."""

    __slots__ = ("value", "calls", "placement", "sbp")

    def __init__(self, value):
        self.value, self.calls = value, []

    def unpack(self, outer_unpack):
        self.calls.append(outer_unpack)
        return ct.tensor(self.value, placement=self.placement, sbp=self.sbp)


def test_self_unpacking_values_rebuild_inside_regather_saved(mesh):
    # an outer pair packs w as a SelfUnpacking; regather_saved (inner) chains to it and the
    # value is unpacked by itself
    made = []
    wv = np.arange(8.0).reshape(4, 2)

    def pack(t):
        if t.shape == (4, 2):
            kept = _Kept(wv)
            kept.placement, kept.sbp = t.placement, t.sbp
            made.append(kept)
            return kept
        return t

    x = ct.tensor(np.ones((6, 4)), placement=mesh, sbp=(S0,) * mesh.ndim, requires_grad=True)
    w = ct.tensor(wv, placement=mesh, sbp=(B,) * mesh.ndim, requires_grad=True)
    with ct.autograd.graph.saved_tensors_hooks(pack, lambda v: v.unpack(None)
                                               if isinstance(v, _Kept) else v):
        with ct.autograd.graph.regather_saved():
            y = (x * 1.0) @ w
    y.sum().backward()
    assert made and all(k.calls for k in made)
    np.testing.assert_allclose(x.grad.numpy(), np.ones((6, 2)) @ wv.T)
