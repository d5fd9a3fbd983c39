"""Pipeline schedules: the order is valid, and a pipelined step gives the loss and grads of
the plain computation (GPipe and 1F1B, stages on sub-meshes, data parallel inside stages)."""
import numpy as np
import pytest

import ctensor as ct
from ctensor.nn.pipeline import Stage, pipeline_step, schedule

S0, B = ct.sbp.split(0), ct.sbp.broadcast


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,micro", [(1, 1), (2, 4), (3, 5), (4, 2)])
def test_schedule_is_a_valid_order(kind, stages, micro):
    order = schedule(stages, micro, kind)
    assert len(order) == len(set(order)) == 2 * stages * micro
    seen = set()
    for ev in order:
        k, s, m = ev
        if k == "F":
            assert s == 0 or ("F", s - 1, m) in seen
        else:
            assert ("F", s, m) in seen and (s == stages - 1 or ("B", s + 1, m) in seen)
        seen.add(ev)


def test_1f1b_bounds_live_activations():
    order = schedule(4, 8, "1f1b")
    live, peak = {s: 0 for s in range(4)}, {s: 0 for s in range(4)}
    for k, s, _ in order:
        live[s] += 1 if k == "F" else -1
        peak[s] = max(peak[s], live[s])
    assert all(peak[s] <= 4 - s for s in range(4)), peak


def _reference(xv, yv, ws):
    """Loss and grads of mean over micro-batches of mean((tanh(...tanh(x W0)...) - y)^2)."""
    import numpy as np
    h, acts = xv, []
    for w in ws:
        acts.append(h)
        h = np.tanh(h @ w)
    loss = np.mean((h - yv) ** 2)
    g = 2 * (h - yv) / h.size
    grads = []
    for w, a in zip(reversed(ws), reversed(acts)):
        out = np.tanh(a @ w)
        gz = g * (1 - out ** 2)
        grads.append(a.T @ gz)
        g = gz @ w.T
    return loss, grads[::-1]


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("layout", ["1x1x1", "1x1x2", "2x1x2", "1x1x4"])
def test_pipeline_matches_plain_step(world4, kind, layout):
    stage_ranks = {"1x1x1": [[0]], "1x1x2": [[0], [1]], "2x1x2": [[0, 1], [2, 3]],
                   "1x1x4": [[0], [1], [2], [3]]}[layout]
    rng = np.random.default_rng(3)
    n_stages, micro, rows, width = len(stage_ranks), 3, 12, 5
    ws = [rng.standard_normal((width, width)) / 2 for _ in range(n_stages)]
    xv = rng.standard_normal((rows, width))
    yv = rng.standard_normal((rows, width))

    placements = [ct.placement("cpu", r) for r in stage_ranks]
    params = [ct.tensor(w, placement=p, sbp=B, requires_grad=True)
              for w, p in zip(ws, placements)]
    stages = [Stage((lambda w: lambda h: (h @ w).tanh())(w), p) for w, p in zip(params, placements)]
    per = rows // micro
    xs = [ct.tensor(xv[i * per:(i + 1) * per], placement=placements[0], sbp=S0)
          for i in range(micro)]
    ys = [ct.tensor(yv[i * per:(i + 1) * per], placement=placements[-1], sbp=S0)
          for i in range(micro)]
    loss = pipeline_step(stages, xs, lambda out, y: ((out - y) ** 2).mean(), ys, kind=kind)

    ref_loss, ref_grads = _reference(xv, yv, ws)
    # mean over micro-batches of per-micro-batch means == the global mean (equal sizes)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-10)
    for p, g in zip(params, ref_grads):
        assert p.grad.sbp == p.sbp and p.grad.placement == p.placement
        np.testing.assert_allclose(p.grad.numpy(), g, rtol=1e-9, atol=1e-12)


def test_bad_arguments():
    with pytest.raises(ValueError, match="kind"):
        schedule(2, 2, "zigzag")
    with pytest.raises(ValueError, match="micro-batches"):
        pipeline_step([Stage(lambda x: x, ct.placement("cpu", [0]))], [], None, [])
