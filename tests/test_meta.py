"""Shape-only worlds (``ct.simulate(n, meta=True)``) and plans (``ct.plan``): a meta run
makes the layouts, communication and memory of a real run; a plan prices them.

Simulation only: a shape-only world is a simulation (under mpiexec these tests skip).
"""
from __future__ import annotations

import collections
import gc
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import ctensor as ct
import ctensor.nn as nn
import ctensor.nn.functional as F
import ctensor.optim as optim
from ctensor import runtime

pytestmark = pytest.mark.skipif(runtime.launched_by_mpi(),
                                reason="shape-only worlds are simulations")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples", "gpt"))


def _step(meta: bool, variant: str = "plain"):
    """One training step of a small tensor x data parallel GPT (``variant``: plain,
    recompute, selective-sp — selective recompute and sequence parallelism — or fsdp): its
    comm log, parameter layouts and count, output layout and per-rank peak bytes (with the
    cycle collector paused, so that when it runs does not move a peak)."""
    gc.collect()
    gc.disable()
    try:
        return _measured_step(meta, variant)
    finally:
        gc.enable()


def _measured_step(meta: bool, variant: str):
    recompute = {"recompute": True, "selective-sp": "selective"}.get(variant, False)
    with ct.simulate(4, meta=meta), ct.debug.track_memory():
        ct.manual_seed(0)
        mesh = ct.placement("cpu", [[0, 1], [2, 3]])
        gpt = nn.GPT(64, 16, 2, 4, 32, dropout=0.1, tie_weights=False, recompute=recompute)
        gpt.to_global(mesh, nn.parallel.hybrid_parallel_rules(gpt, 2, tp_axis=1))
        if variant == "selective-sp":  # (and the backward's re-gathers)
            nn.parallel.sequence_parallel(gpt, tp_axis=1)
        if variant == "fsdp":  # parameters gathered per module, freed after its forward
            nn.fully_shard(gpt, mesh)
        opt = optim.AdamW(gpt.parameters(), lr=1e-3)
        x = ct.zeros(4, 16, dtype=ct.int64, placement=mesh,
                     sbp=(ct.sbp.split(0), ct.sbp.broadcast))
        ct.debug.reset_peak_memory()
        with ct.debug.comm_log() as log:
            logits, loss = gpt(x, x)
            loss.backward()
            opt.step()
        events = [(e.op, e.collective, e.nbytes, e.mesh_axis, e.shape, e.src, e.dst)
                  for e in log]
        layouts = {n: (p.shape, p.sbp, p.placement) for n, p in gpt.named_parameters()}
        count = sum(p.numel() for p in gpt.parameters())
        peaks = [ct.debug.memory(r).peak_total for r in range(4)]
        kinds = [ct.debug.memory(r).peak for r in range(4)]
        return events, layouts, count, (logits.shape, logits.sbp), peaks, kinds


@pytest.mark.parametrize("variant", ["plain", "recompute", "selective-sp", "fsdp"])
def test_meta_run_makes_the_real_runs_choices(variant):
    real, meta = _step(False, variant), _step(True, variant)
    assert meta[0] == real[0]  # every collective: op, kind, bytes, mesh axis, shape, SBPs
    assert meta[1] == real[1] and meta[2] == real[2] and meta[3] == real[3]
    for r in range(4):
        for kind in ("parameters", "gradients", "optimizer"):
            assert meta[5][r][kind] == real[5][r][kind]


def test_meta_memory_matches_the_real_runs_shard_bytes():
    # in a fresh process: a long-lived one's accounting of real shards can be a few per
    # cent off (buffers are told apart by address, and addresses are reused)
    code = ("import json, sys; sys.path.insert(0, 'tests'); import test_meta as t; "
            "print(json.dumps([[t._step(m, v)[4] for m in (False, True)] "
            "for v in ('plain', 'recompute', 'fsdp')]))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for real, meta in json.loads(proc.stdout.splitlines()[-1]):
        for r in range(4):  # peak bytes of shards per rank, activations included
            assert abs(meta[r] - real[r]) <= 0.03 * real[r], (r, meta, real)


def test_meta_tensor_is_its_layout():
    with ct.simulate(3072, meta=True):
        mesh = ct.placement("cpu", np.arange(3072).reshape(6, 8, 64).tolist())
        w = ct.zeros(25600, 25600, placement=mesh,
                     sbp=(ct.sbp.broadcast, ct.sbp.split(0), ct.sbp.broadcast))
        assert w.is_meta and type(w._shards) is ct.meta.MetaBuffer
        assert w._shards.nbytes == 25600 * 3200 * 4  # one figure for every rank
        y = (w * 2).sum(dim=0)
        assert y.shape == (25600,) and y.is_meta
        for fn in (lambda: w.numpy(), lambda: y.sum().item(), lambda: w.to_local(0)):
            with pytest.raises(ct.MetaModeError, match="shape-only"):
                fn()
        assert "meta" in repr(w)


def test_uneven_shards_are_classes_of_ranks():
    with ct.simulate(3, meta=True):
        x = ct.zeros(10, placement=ct.placement("cpu", [0, 1, 2]), sbp=ct.sbp.split(0))
        assert ct.meta.shape_classes(x._layout) == [((4,), 1, 0), ((3,), 2, 1)]
        assert list(ct.meta.rank_bytes(x._layout)) == [16, 12, 12]


def test_code_that_reads_values_says_what_it_does_without_them():
    # ct.meta's seam (nn/ and optim/ use it instead of asking the mode): in a shape-only
    # world a reader is not called (its default), a guard raises, for_world picks the other
    calls = []

    @ct.meta.reads_values(default=-1.0)
    def value(t):
        calls.append(t)
        return float(t.item())

    for meta, expected in ((False, 6.0), (True, -1.0)):
        with ct.simulate(2, meta=meta):
            x = ct.full((2,), 3.0, placement=ct.placement("cpu", [0, 1]),
                        sbp=ct.sbp.split(0))
            assert value(x.sum()) == expected
            assert ct.meta.for_world(lambda: "values", lambda: "shapes")() == \
                ("shapes" if meta else "values")
            assert (ct.meta.local_arrays(x) is None) == meta
            if meta:
                with pytest.raises(ValueError, match="needs values"):
                    ct.meta.needs_values(lambda: ValueError("needs values"))
            else:
                ct.meta.needs_values(ValueError("never raised"))
    assert len(calls) == 1


def test_simulate_meta_rejects_a_non_bool():
    with pytest.raises(TypeError, match="meta"):
        ct.simulate(2, meta="yes")


def test_replay_bubbles_and_in_flight():
    from ctensor.nn.pipeline import schedule
    for kind, alive in (("1f1b", [4, 3, 2, 1]), ("gpipe", [8, 8, 8, 8])):
        seconds, in_flight = ct.plan.replay(schedule(4, 8, kind), [1.0] * 4, [2.0] * 4)
        assert seconds == pytest.approx((8 + 3) * 3.0)  # (m + p - 1)(t_f + t_b)
        assert in_flight == alive


def test_devices_are_data(tmp_path):
    assert {"a100-80gb", "h100", "h200"} <= set(ct.plan.devices())
    assert ct.plan.device("a100-80gb").peak_flops == 312e12
    path = tmp_path / "mine.toml"
    path.write_text('["my-gpu"]\npeak_flops = 1e15\npeak_flops_fp32 = 5e14\n'
                    'memory_bytes = 1e11\nmemory_bandwidth = 5e12\nintra_bandwidth = 9e11\n'
                    'inter_bandwidth = 1e11\nintra_latency = 1e-6\ninter_latency = 2e-6\n')
    assert ct.plan.load_devices(str(path))["my-gpu"].memory_bytes == 1e11
    path.write_text('["bad"]\npeak_flops = 1\n')
    with pytest.raises(ValueError, match="missing keys"):
        ct.plan.load_devices(str(path))
    with pytest.raises(ValueError, match="unknown device"):
        ct.plan.device("tpu-v9")


def _plan(args):
    import plan
    return plan.plan(plan.parse_args(args))


def test_plan_schedule_recompute_and_nodes():
    base = ("--dp 2 --tp 2 --pp 2 --layers 4 --hidden 256 --heads 8 --seq-len 128 "
            "--vocab 1024 --global-batch 32 --micro-batches 8").split()
    one, gpipe = _plan(base), _plan(base + ["--schedule", "gpipe"])
    full = _plan(base + ["--recompute"])
    act = lambda r: max(c["activations"] for c in r.classes)  # noqa: E731
    assert act(gpipe) > act(one) > act(full)
    assert one.in_flight == [2, 1] and gpipe.in_flight == [8, 8]
    # tensor-parallel groups are 2 consecutive ranks: inside a node of 2, not of 1
    tp = [c for c in one.collectives if c["group_size"] == 2 and c["collective"] != "send_recv"]
    assert tp and all(c["intra"] for c in tp)
    split = _plan(base + ["--gpus-per-node", "1"])
    assert not any(c["intra"] for c in split.collectives if c["collective"] != "send_recv")
    assert split.step_seconds > one.step_seconds
    assert one.fits and "fits" in one.verdict()
    tiny = _plan(base + ["--device", "v100-16gb", "--hidden", "4096", "--heads", "32"])
    assert tiny.fits == (tiny.worst["total"] <= 16 * 2 ** 30)


def test_plan_interleaved_and_fully_sharded():
    base = ("--dp 2 --tp 2 --pp 2 --layers 8 --hidden 256 --heads 8 --seq-len 128 "
            "--vocab 1024 --global-batch 32 --micro-batches 8").split()
    one = _plan(base)
    inter = _plan(base + ["--schedule", "interleaved", "--virtual-stages", "2"])
    assert len(inter.stage_forward) == 4 and inter.devices == 2
    # two chunks per device: half the bubble of 1F1B (about (p-1)/(v m + p-1)), and more
    # micro-batch chunks in flight on the first device
    assert inter.bubble_fraction < 0.75 * one.bubble_fraction
    assert inter.in_flight_on(0) > one.in_flight_on(0)
    assert sum(c["ranks"] for c in inter.classes) == 8
    for zero in ("zero3", "zero2"):  # parameters, gradients, states sharded over dp = 2
        sharded = _plan(base + ["--fsdp", zero])
        for kind in ("parameters", "gradients", "optimizer"):
            assert sharded.worst[kind] < 0.6 * one.worst[kind], (zero, kind)
    import plan
    with pytest.raises(SystemExit):
        plan.parse_args(base + ["--virtual-stages", "2"])  # needs --schedule interleaved


def test_plan_draws_the_predicted_schedule(tmp_path):
    import plan
    path = tmp_path / "predicted.svg"
    report = plan.run("--dp 1 --tp 2 --pp 2 --layers 4 --hidden 256 --heads 8 --seq-len 128 "
                      "--vocab 1024 --global-batch 8 --micro-batches 4 --schedule interleaved "
                      f"--virtual-stages 2 --timeline {path}".split())
    assert len(report.events) == 2 * 4 * 2 * 2  # F and B of 4 micro-batches on 4 stages
    assert max(end for *_, end in report.events) == pytest.approx(report.pipeline_seconds)
    svg = path.read_text()
    assert svg.startswith("<svg") and "predicted: interleaved, p=2, m=4, v=2" in svg
    assert "rank 0" in svg and "rank 2" in svg  # one row per device (its first rank)


def test_plan_of_the_1t_model_on_3072_ranks():
    report = _plan("--dp 6 --tp 8 --pp 64 --layers 128 --hidden 25600 --heads 160 --seq-len "
                   "2048 --global-batch 3072 --micro-batches 512 --recompute "
                   "--precision fp16".split())
    assert sum(c["ranks"] for c in report.classes) == 3072
    assert len(report.classes) < 100  # classes of identical ranks, not 3072 rows
    per_gpu = report.classes[1]["parameters"] / 4  # float32 master weights
    assert 1.6e9 < per_gpu < 2.2e9  # ~1T / (8 * 64) parameters per rank
    assert report.step_seconds > 0 and report.tflops_per_gpu > 0


def test_plan_of_korthikanti_1t_fits_in_80_gb():
    # the 1T GPT of Korthikanti et al. 2022 (1 x 8 x 64, sequence parallel, selective
    # recompute, 1F1B with 64 micro-batches in flight on the first stage) fits on A100 80GB
    # as it did for them: each block keeps sequence shards only (its gathered linear inputs
    # are gathered again in the backward)
    report = _plan("--dp 1 --tp 8 --pp 64 --layers 128 --hidden 25600 --heads 160 --seq-len "
                   "2048 --vocab 51200 --global-batch 512 --micro-batches 512 --recompute "
                   "selective --sequence-parallel --precision fp16".split())
    assert report.fits, report.verdict()
    assert report.in_flight[0] == 64 and report.worst["stage"] == 0
    # Korthikanti et al.'s estimate: 34 s b h / t bytes per layer and micro-batch; stage 0
    # holds 64 micro-batches of 2 layers. ctensor keeps about that (and the embedding's
    # output, each stage's received input): within 1.15x, far under the gathered copies' 2x
    # or a LayerNorm keeping its normalised output (1.18x)
    megatron = 34 * 2048 * 25600 / 8 * 2 * 64
    assert megatron < report.worst["activations"] < 1.15 * megatron


def _pipeline_step(meta: bool):
    """One 1F1B step of a 2-stage, tensor-parallel GPT through ``nn.pipeline.pipeline_step``
    (with loss scaling and gradient clipping, as train.py runs it): the loss, the comm log
    and the gradients' layouts."""
    from train import StageModule
    with ct.simulate(4, meta=meta):
        ct.manual_seed(0)
        gpt = nn.GPT(64, 16, 2, 4, 32, dropout=0.1, tie_weights=False)
        stages = []
        for s in range(2):
            mesh = ct.placement("cpu", [[2 * s, 2 * s + 1]])
            module = StageModule(gpt, s, s + 1, s == 0, s == 1)
            module.to_global(mesh, nn.parallel.hybrid_parallel_rules(module, 2, tp_axis=1))
            stages.append(nn.pipeline.Stage(module, mesh))
        scaler = optim.GradScaler()
        params = [p for st in stages for p in st.module.parameters()]
        opt = optim.AdamW(params, lr=1e-3)
        sbp = (ct.sbp.split(0), ct.sbp.broadcast)
        xs = [ct.zeros(2, 16, dtype=ct.int64, placement=stages[0].placement, sbp=sbp)
              for _ in range(4)]
        ys = [ct.zeros(2, 16, dtype=ct.int64, placement=stages[1].placement, sbp=sbp)
              for _ in range(4)]
        with ct.debug.comm_log() as log:
            loss = nn.pipeline.pipeline_step(
                stages, xs,
                lambda out, y: scaler.scale(F.cross_entropy(out.flatten(0, -2), y.flatten())), ys)
            scaler.unscale_(opt)
            nn.utils.clip_grad_norm_(params, 1.0, error_if_nonfinite=True)
            scaler.step(opt)
        events = [(e.op, e.collective, e.nbytes, e.mesh_axis, e.shape, e.src, e.dst)
                  for e in log]
        return loss, events, [(p.grad.shape, p.grad.sbp) for p in params]


def test_pipeline_step_runs_shape_only():
    real_loss, real_events, real_grads = _pipeline_step(False)
    meta_loss, meta_events, meta_grads = _pipeline_step(True)
    assert np.isfinite(real_loss) and np.isnan(meta_loss)  # no values: nan, not an error
    # the same collectives (a real run logs an asynchronous move when it completes, so the
    # order differs), less the real run's value reads: .item() of the loss, the gradient
    # norm and the scaler's inf check, each a scalar sent to the whole world
    reads = [e for e in real_events if e[4] == () and e[6] == (ct.sbp.broadcast,)]
    assert len(reads) == 3
    assert collections.Counter(meta_events) == \
        collections.Counter(e for e in real_events if e not in reads)
    assert meta_grads == real_grads
    with ct.simulate(2, meta=True):
        p = ct.placement("cpu", [0])
        st = [nn.pipeline.Stage(nn.Linear(4, 4), p),
              nn.pipeline.Stage(nn.Linear(4, 4), ct.placement("cpu", [1]))]
        with pytest.raises(ValueError, match="no times to record"):
            nn.pipeline.pipeline_step(st, [ct.zeros(2, 4, placement=p)], lambda o, y: o.sum(),
                                      [None], timeline=nn.pipeline.Timeline())


def test_the_multi_tensor_clip_moves_the_same_shape_only():
    """``clip_grad_norm_``'s multi-tensor path (the default) in a tensor-parallel pipeline
    stage pair, shape-only: the same collectives as the real run (one all-reduce of the
    split gradients' squared sums per placement, the stage's sum and scale moved once), not
    the per-gradient path's one per gradient, so a plan counts what a step sends."""
    def run(meta):
        with ct.simulate(4, meta=meta):
            ct.manual_seed(0)
            stages = [ct.placement("cpu", [[0, 1]]), ct.placement("cpu", [[2, 3]])]
            params = []
            for mesh in stages:
                layer = nn.Sequential(nn.Linear(8, 12), nn.GELU(), nn.Linear(12, 8))
                B, S = ct.sbp.broadcast, ct.sbp.split
                layer.to_global(mesh, {"0.weight": (B, S(0)), "0.bias": (B, S(0)),
                                       "2.weight": (B, S(1))})
                x = ct.ones(4, 8, placement=mesh, sbp=(B, B))
                layer(x).sum().backward()
                params += list(layer.parameters())
            with ct.debug.comm_log() as log:
                nn.utils.clip_grad_norm_(params, 1e-3)
            return [(e.op, e.collective, e.nbytes, e.mesh_axis, e.src, e.dst) for e in log]

    real, meta = run(False), run(True)
    # (the real run reads no value here: the norm stays a tensor)
    assert collections.Counter(meta) == collections.Counter(real)
    assert sum(e[1] == "all_reduce" for e in real) == 2  # one per placement, not per gradient
