"""Pipeline schedules and the pipelined step.

* The schedules are valid orders and are the literature's: GPipe, 1F1B (PipeDream-flush)
  and interleaved 1F1B (Megatron-LM's rules, checked against orders derived by hand and
  Megatron's own schedule table).
* A pipelined step gives the loss and gradients of the plain computation for every
  schedule and layout (stages on sub-meshes, data parallel inside stages, virtual stages),
  with dropout on: random numbers do not depend on the schedule or the layout.
* The timeline: GPipe keeps every micro-batch alive, 1F1B at most ``p - d``; idle shares,
  the picture.
* Bad arguments are ValueErrors naming the function and the argument.
"""
import numpy as np
import pytest

import ctensor as ct
import ctensor.nn as nn
from conftest import MPI_MODE
from ctensor.nn.pipeline import (Stage, Timeline, bubble_fraction, device_orders,
                                 pipeline_step, schedule)

S0, B = ct.sbp.split(0), ct.sbp.broadcast


# ----------------------------------------------------------------------------- schedules
CASES = [("gpipe", 1, 1, 1), ("gpipe", 3, 5, 1), ("1f1b", 1, 1, 1), ("1f1b", 2, 4, 1),
         ("1f1b", 3, 5, 1), ("1f1b", 4, 2, 1), ("1f1b", 4, 8, 1), ("interleaved", 2, 4, 2),
         ("interleaved", 2, 5, 2), ("interleaved", 3, 7, 2), ("interleaved", 4, 8, 3),
         ("interleaved", 4, 6, 2), ("interleaved", 3, 3, 1)]


@pytest.mark.parametrize("kind,p,m,v", CASES)
def test_schedule_is_a_valid_order(kind, p, m, v):
    order = schedule(p, m, kind, v)
    J = p * v
    assert len(order) == len(set(order)) == 2 * J * m
    seen = set()
    for ev in order:
        k, j, i = ev
        if k == "F":
            assert j == 0 or ("F", j - 1, i) in seen
        else:
            assert ("F", j, i) in seen and (j == J - 1 or ("B", j + 1, i) in seen)
        seen.add(ev)
    # each device's events appear in its own order
    for d, seq in enumerate(device_orders(p, m, kind, v)):
        assert [ev for ev in order if ev[1] % p == d] == seq


def _order(text):
    """``"F0.0 B2.1"`` -> ``[("F", 0, 0), ("B", 2, 1)]`` (kind, virtual stage . micro-batch)."""
    out = []
    for word in text.split():
        j, i = word[1:].split(".")
        out.append((word[0], int(j), int(i)))
    return out


def test_1f1b_is_pipedream_flush():
    # Narayanan et al. 2021, figure 4 (top): p = 4, m = 8; device d warms up with p - d - 1
    # forwards, alternates, then drains
    orders = device_orders(4, 8, "1f1b")
    assert orders[0] == _order("F0.0 F0.1 F0.2 F0.3 B0.0 F0.4 B0.1 F0.5 B0.2 F0.6 B0.3 F0.7 "
                               "B0.4 B0.5 B0.6 B0.7")
    assert orders[3] == _order(" ".join(f"F3.{i} B3.{i}" for i in range(8)))
    assert device_orders(2, 3, "gpipe")[1] == _order("F1.0 F1.1 F1.2 B1.0 B1.1 B1.2")


def test_interleaved_follows_megatron():
    # p = 2, v = 2, m = 4 by Megatron-LM's rules: device d runs 2 (p - d - 1) + (v - 1) p
    # warm-up forwards; the k-th forward is micro-batch (k // (p v)) p + k % p of chunk
    # (k % (p v)) // p (virtual stage chunk * p + d); backwards take the chunks in reverse
    orders = device_orders(2, 4, "interleaved", 2)
    assert orders[0] == _order("F0.0 F0.1 F2.0 F2.1 F0.2 B2.0 F0.3 B2.1 F2.2 B0.0 F2.3 B0.1 "
                               "B2.2 B2.3 B0.2 B0.3")
    assert orders[1] == _order("F1.0 F1.1 F3.0 B3.0 F3.1 B3.1 F1.2 B1.0 F1.3 B1.1 F3.2 B3.2 "
                               "F3.3 B3.3 B1.2 B1.3")
    # Megatron-LM's schedule table for PP2, M=5, VP2 (groups of N=3 micro-batches):
    # micro-batch 0 1 2 0 1 2 3 4 3 4, chunk 0 0 0 1 1 1 0 0 1 1
    forwards = [ev for ev in device_orders(2, 5, "interleaved", 2)[1] if ev[0] == "F"]
    assert [i for _, _, i in forwards] == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert [j // 2 for _, j, _ in forwards] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]
    # one chunk is 1F1B
    assert device_orders(3, 5, "interleaved", 1) == device_orders(3, 5, "1f1b")


def _live_peaks(p, m, kind, v=1):
    peak = {}
    for d, seq in enumerate(device_orders(p, m, kind, v)):
        live = best = 0
        for k, _, _ in seq:
            live += 1 if k == "F" else -1
            best = max(best, live)
        peak[d] = best
    return peak


def test_activations_gpipe_keeps_m_1f1b_at_most_p():
    assert _live_peaks(4, 8, "gpipe") == {d: 8 for d in range(4)}
    assert _live_peaks(4, 8, "1f1b") == {d: 4 - d for d in range(4)}
    # interleaved: the warm-up forwards plus one, at most
    assert _live_peaks(4, 8, "interleaved", 2) == {d: 2 * (4 - d - 1) + 4 + 1 for d in range(4)}


def test_bubble_fraction():
    assert bubble_fraction(1, 8) == 0
    assert bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert bubble_fraction(4, 8, 2) == pytest.approx(3 / 19)


# ----------------------------------------------------------------------------- the step
def _blocks(n, width, rng):
    return [(rng.standard_normal((width, width)) / 2, rng.standard_normal(width) / 4)
            for _ in range(n)]


def _reference(xv, yv, blocks, rate, masks):
    """Loss and grads of mean((f_n(...f_1(x)) - y)^2), f(h) = dropout(tanh(h W + b)),
    with the given dropout masks (NumPy)."""
    h, saved = xv, []
    for (w, b), mask in zip(blocks, masks):
        t = np.tanh(h @ w + b)
        saved.append((h, t, mask))
        h = t * mask / (1 - rate) if rate else t
    loss = np.mean((h - yv) ** 2)
    g = 2 * (h - yv) / h.size
    grads = []
    for (w, b), (a, t, mask) in zip(reversed(blocks), reversed(saved)):
        if rate:
            g = g * mask / (1 - rate)
        gz = g * (1 - t ** 2)
        grads.append((a.T @ gz, gz.sum(0)))
        g = gz @ w.T
    return loss, grads[::-1]


class _Block(nn.Module):
    def __init__(self, w, b, rate):
        super().__init__()
        self.w, self.b = nn.Parameter(ct.tensor(w)), nn.Parameter(ct.tensor(b))
        self.drop = nn.Dropout(rate)

    def forward(self, h):
        return self.drop((h @ self.w + self.b).tanh())


LAYOUTS = {  # name: (stage ranks per device, virtual stages per device)
    "1x1x1": ([[0]], 1), "1x1x2": ([[0], [1]], 1), "2x1x2": ([[0, 1], [2, 3]], 1),
    "1x1x4": ([[0], [1], [2], [3]], 1), "1x1x2 v2": ([[0], [1]], 2),
    "2x1x2 v2": ([[0, 1], [2, 3]], 2), "1x1x1 v4": ([[0]], 4)}


def _run(layout, kind, blocks, xv, yv, micro, rate, seed=11):
    """One pipelined step of ``blocks`` (one block per virtual stage) in ``layout``."""
    ranks, v = LAYOUTS[layout]
    p = len(ranks)
    placements = [ct.placement("cpu", r) for r in ranks]
    stages, params = [], []
    ct.manual_seed(seed)
    for j, (w, b) in enumerate(blocks):
        pl = placements[j % p]
        module = _Block(w, b, rate)
        module.to_global(pl, B)
        stages.append(Stage(module, pl))
        params.append(module)
    per = len(xv) // micro
    sbp = S0 if len(ranks[0]) > 1 else B
    xs = [ct.tensor(xv[i * per:(i + 1) * per], placement=placements[0], sbp=sbp)
          for i in range(micro)]
    ys = [ct.tensor(yv[i * per:(i + 1) * per], placement=placements[(len(blocks) - 1) % p],
                    sbp=sbp) for i in range(micro)]
    kind = "1f1b" if kind == "interleaved" and v == 1 else kind
    loss = pipeline_step(stages, xs, lambda out, y: ((out - y) ** 2).mean(), ys, kind=kind,
                         num_model_chunks=v)
    return loss, [(m.w.grad, m.b.grad, m.w, m.b) for m in params], ct.random.get_state()


@pytest.mark.parametrize("kind", ["gpipe", "1f1b", "interleaved"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_pipeline_matches_plain_step(world4, kind, layout):
    ranks, v = LAYOUTS[layout]
    if (v > 1) != (kind == "interleaved"):
        pytest.skip("virtual stages go with the interleaved schedule")
    rng = np.random.default_rng(3)
    micro, rows, width = 4, 16, 5
    blocks = _blocks(len(ranks) * v, width, rng)
    xv, yv = rng.standard_normal((rows, width)), rng.standard_normal((rows, width))
    loss, grads, _ = _run(layout, kind, blocks, xv, yv, micro, rate=0.0)
    ref_loss, ref_grads = _reference(xv, yv, blocks, 0.0, [1.0] * len(blocks))
    # mean over micro-batches of per-micro-batch means == the global mean (equal sizes)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-10)
    for (gw, gb, w, b), (rw, rb) in zip(grads, ref_grads):
        assert gw.sbp == w.sbp and gw.placement == w.placement
        np.testing.assert_allclose(gw.numpy(), rw, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(gb.numpy(), rb, rtol=1e-9, atol=1e-12)


def test_dropout_does_not_depend_on_schedule_or_layout(world4):
    """Four blocks with dropout: one device running them all (one stage), 1F1B and GPipe
    on 2 and 4 devices and interleaved on 2 devices x 2 chunks give the same loss, the
    same gradients and the same generator state afterwards."""
    rng = np.random.default_rng(5)
    micro, rows, width = 4, 16, 6
    blocks = _blocks(4, width, rng)
    xv, yv = rng.standard_normal((rows, width)), rng.standard_normal((rows, width))
    runs = {(layout, kind): _run(layout, kind, blocks, xv, yv, micro, rate=0.3)
            for layout, kind in [("1x1x1 v4", "interleaved"), ("1x1x4", "1f1b"),
                                 ("1x1x4", "gpipe"), ("1x1x2 v2", "interleaved"),
                                 ("2x1x2 v2", "interleaved")]}
    (ref_loss, ref_grads, ref_state) = runs[("1x1x1 v4", "interleaved")]
    assert ref_state["counter"] == micro * 2 ** 32  # micro-batch m draws from m * 2**32 on
    for key, (loss, grads, state) in runs.items():
        np.testing.assert_allclose(loss, ref_loss, rtol=1e-12, err_msg=str(key))
        assert state == ref_state, key
        for (gw, gb, _, _), (rw, rb, _, _) in zip(grads, ref_grads):
            np.testing.assert_allclose(gw.numpy(), rw.numpy(), rtol=1e-12, err_msg=str(key))
            np.testing.assert_allclose(gb.numpy(), rb.numpy(), rtol=1e-12, err_msg=str(key))
    # and dropout did act: without it the loss differs
    no_drop, _, _ = _run("1x1x4", "1f1b", blocks, xv, yv, micro, rate=0.0)
    assert abs(no_drop - ref_loss) > 1e-3


# ----------------------------------------------------------------------------- timeline
def _linear_stages(placements, width, n):
    ct.manual_seed(0)
    stages = []
    for j in range(n):
        pl = placements[j % len(placements)]
        module = nn.Sequential(nn.Linear(width, 4 * width, dtype=np.float64), nn.ReLU(),
                               nn.Linear(4 * width, width, dtype=np.float64))
        module.to_global(pl, B)
        stages.append(Stage(module, pl))
    return stages


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_timeline_shows_live_micro_batches_and_idle(world4, kind, tmp_path):
    p, micro, width = 4, 8, 8
    placements = [ct.placement("cpu", [d]) for d in range(p)]
    stages = _linear_stages(placements, width, p)
    rng = np.random.default_rng(0)
    xs = [ct.tensor(rng.standard_normal((4, width)), placement=placements[0], sbp=B)
          for _ in range(micro)]
    ys = [ct.tensor(rng.standard_normal((4, width)), placement=placements[-1], sbp=B)
          for _ in range(micro)]
    tl = Timeline()
    loss = pipeline_step(stages, xs, lambda o, y: ((o - y) ** 2).mean(), ys, kind=kind,
                         timeline=tl)
    assert np.isfinite(loss)
    assert tl.ranks() == list(range(p)) and tl.replayed == (not MPI_MODE)
    for r in range(p):
        kinds = [e[0] for e in tl.events[r]]
        assert kinds.count("F") == kinds.count("B") == micro
        for k, j, i, begin, ready, end, _ in tl.events[r]:
            assert j == r and 0 <= begin <= ready <= end <= tl.span() + 1e-9
    live, mem = tl.peak_live_micro_batches(), tl.peak_activation_bytes()
    if kind == "gpipe":
        assert live == {r: micro for r in range(p)}
    else:
        assert live == {r: p - r for r in range(p)}
    # each micro-batch saves the same activations on a stage: bytes follow the count
    per = {r: mem[r] / live[r] for r in range(p)}
    assert all(v > 0 for v in per.values())
    assert max(per[r] for r in range(p - 1)) == pytest.approx(min(per[r] for r in range(p - 1)))
    assert all(0.0 <= v < 1.0 for v in tl.idle_fraction().values())
    # the last device waits for the pipeline to fill: its first forward starts late
    assert tl.events[p - 1][0][4] > tl.events[0][0][4]
    assert tl.theoretical_bubble() == pytest.approx(3 / 11)
    text = tl.summary()
    assert f"{kind} schedule, 4 devices" in text and "live mb" in text
    if ct.rank() == 0:
        path = tmp_path / "timeline.svg"
        tl.save(str(path))
        svg = path.read_text()
        assert svg.startswith("<svg") and svg.count("<rect") >= 4 * 2 * micro
        for name in ("forward", "backward", "idle", "rank 3"):
            assert name in svg
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            with pytest.raises(ImportError, match="needs matplotlib"):
                tl.save(str(tmp_path / "timeline.png"))
        else:
            tl.save(str(tmp_path / "timeline.png"))
            assert (tmp_path / "timeline.png").stat().st_size > 0


# ----------------------------------------------------------------------------- bad input
def test_bad_arguments():
    p0, p1 = ct.placement("cpu", [0]), ct.placement("cpu", [0])
    one = [Stage(lambda x: x, p0)]
    with pytest.raises(ValueError, match="schedule: argument 'kind' must be one of"):
        schedule(2, 2, "zigzag")
    with pytest.raises(ValueError, match="argument 'num_stages' must be an int >= 1, got 0"):
        schedule(0, 2)
    with pytest.raises(ValueError, match="pipeline_step: got 0 input"):
        pipeline_step(one, [], None, [])
    x = [ct.zeros(2, placement=p0)]
    with pytest.raises(ValueError, match="pipeline_step: argument 'kind' must be one of "
                                         "'gpipe', '1f1b', 'interleaved', got 'zigzag'"):
        pipeline_step(one, x, None, x, kind="zigzag")
    with pytest.raises(ValueError, match="'num_model_chunks' is 2, but only "
                                         "kind='interleaved'"):
        pipeline_step(one * 2, x, None, x, kind="1f1b", num_model_chunks=2)
    with pytest.raises(ValueError, match="'stages' has 3 stages, which num_model_chunks=2 "
                                         "does not divide"):
        pipeline_step(one * 3, x, None, x, kind="interleaved", num_model_chunks=2)
    with pytest.raises(ValueError, match="interleaved' needs at least as many micro-batches "
                                         "as pipeline stages.*got 1 micro-batches for 2"):
        schedule(2, 1, "interleaved", 2)
    with pytest.raises(TypeError, match="stages\\[1\\] must be an nn.pipeline.Stage"):
        pipeline_step([one[0], lambda x: x], x, None, x)
    with pytest.raises(TypeError, match="'timeline' must be an nn.pipeline.Timeline"):
        pipeline_step(one, x, None, x, timeline=[])
    with pytest.raises(ValueError, match="num_model_chunks' must be an int >= 1, got 0"):
        pipeline_step(one, x, None, x, num_model_chunks=0)
    if ct.world_size() >= 2:
        q = ct.placement("cpu", [1])
        with pytest.raises(ValueError, match="stages\\[2\\] \\(chunk 1 of device 0\\) must "
                                             "have the placement of stages\\[0\\]"):
            pipeline_step([Stage(None, p0), Stage(None, q), Stage(None, q), Stage(None, p0)],
                          x * 2, None, x * 2, kind="interleaved", num_model_chunks=2)
    with pytest.raises(ValueError, match="must have different placements"):
        pipeline_step([Stage(None, p0), Stage(None, p1)] * 2, x * 2, None, x * 2,
                      kind="interleaved", num_model_chunks=2)
