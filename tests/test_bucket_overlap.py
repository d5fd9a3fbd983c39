"""Gradient buckets started during the backward (the default) or after it
(``ct.autograd.set_bucket_overlap(False)``): the same buckets, the same collectives in the
same order, the same bits (benchmarks/overlap.py measures the time)."""
from __future__ import annotations

import numpy as np
import pytest

import ctensor as ct
import ctensor.nn as nn


@pytest.fixture
def restore():
    size, overlap = ct.autograd.bucket_size(), ct.autograd.bucket_overlap()
    yield
    ct.autograd.set_bucket_size(size / 2**20)
    ct.autograd.set_bucket_overlap(overlap)


def _step(mesh, overlap: bool):
    ct.autograd.set_bucket_overlap(overlap)
    ct.autograd.set_bucket_size(8 * 8 * 8 / 2**20)  # one bucket per weight
    ct.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(),
                          nn.Linear(8, 8)).double()
    nn.parallel.data_parallel(model, mesh)
    x = ct.randn(4 * mesh.size, 8, dtype=ct.float64).to_global(mesh, nn.parallel.batch_sbp(mesh))
    with ct.debug.comm_log() as log:
        loss = (model(x) ** 2).mean()
        loss.backward()
    events = [(e.op, e.collective, e.shape) for e in log if e.op == "grad_sync"]
    return [p.grad.numpy() for p in model.parameters()], events, loss.item()


def test_same_buckets_and_bits_after_backward(mesh, restore):
    grads, events, loss = _step(mesh, True)
    later_grads, later_events, later_loss = _step(mesh, False)
    assert later_events == events
    if mesh.size > 1:
        assert len(events) >= 3, events  # several buckets: each weight fills one
    assert later_loss == loss
    for a, b in zip(grads, later_grads):
        assert np.array_equal(a, b)


def test_bad_argument():
    with pytest.raises(TypeError, match="set_bucket_overlap: argument 'overlap' must be a bool"):
        ct.autograd.set_bucket_overlap(1)
