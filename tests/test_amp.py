"""Mixed precision: float16 ops keep float32 statistics, float16 GPT training follows the
float32 loss curve, GradScaler skips a step on overflow and recovers, bf16 is refused
clearly; and ct.debug.memory counts shards by kind."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

import ctensor as ct
import ctensor.nn as nn
import ctensor.nn.functional as F
import ctensor.optim as optim
from conftest import MPI_MODE

S = ct.sbp.split
TRAIN = Path(__file__).resolve().parent.parent / "examples" / "gpt" / "train.py"


def _all(mesh, entry):
    return (entry,) * mesh.ndim


def test_float16_statistics_do_not_overflow(mesh):
    rng = np.random.default_rng(0)
    # a float16 sum of 70000 exponentials (each 1) overflows (max 65504); x * x of ~300 too
    logits = np.zeros((2, 70000), dtype=np.float16)
    target = np.array([3, 5])
    for sbp in (_all(mesh, ct.sbp.broadcast), _all(mesh, S(1))):
        lg = ct.tensor(logits, placement=mesh, sbp=sbp)
        loss = F.cross_entropy(lg, ct.tensor(target, placement=mesh))
        assert loss.dtype == np.float32
        np.testing.assert_allclose(loss.item(), np.log(70000.0), rtol=1e-3)
        p = ct.softmax(lg, -1).numpy()
        assert p.dtype == np.float16 and np.isfinite(p).all()
        np.testing.assert_allclose(p.astype(np.float64).sum(-1), 1.0, rtol=1e-2)
    xv = (300 + rng.standard_normal((4, 64))).astype(np.float16)
    for sbp in (_all(mesh, ct.sbp.broadcast), _all(mesh, S(1))):
        y = ct.layer_norm(ct.tensor(xv, placement=mesh, sbp=sbp), (64,)).numpy()
        x64 = xv.astype(np.float64)
        ref = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
        assert y.dtype == np.float16
        np.testing.assert_allclose(y, ref, atol=2e-2)


def test_float16_matmul_accumulates_in_float32():
    a = np.full((1, 4096), 0.1, dtype=np.float16)
    b = np.ones((4096, 1), dtype=np.float16)
    got = (ct.tensor(a) @ ct.tensor(b)).numpy()
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=2e-3)


def _train():
    spec = importlib.util.spec_from_file_location("gpt_train_amp", TRAIN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(MPI_MODE, reason="30 steps: run once, in simulation")
def test_float16_training_follows_the_float32_curve():
    train = _train()
    args = ["--layers", "2", "--hidden", "32", "--heads", "2", "--seq-len", "16",
            "--global-batch", "8", "--steps", "30", "--no-progress", "--simulate", "2",
            "--tp", "2", "--dropout", "0.0"]
    fp32 = np.array(train.run(args))
    fp16 = np.array(train.run(args + ["--precision", "fp16"]))
    rel = np.abs(fp16 - fp32) / fp32
    assert rel.max() < 0.03, rel
    assert fp16[-1] < fp16[0] - 0.5  # it learns


def test_mixed_precision_gradients_are_float32_and_reduced_in_float32():
    world = ct.world_size() if MPI_MODE else 2
    ctx = ct.simulate(2) if not MPI_MODE else None
    with (ctx if ctx is not None else _null()):
        mesh = ct.placement("cpu", list(range(min(world, 2))))
        ct.manual_seed(0)
        model = nn.mixed_precision(nn.parallel.data_parallel(nn.MLP(8), mesh), ct.float16)
        x = ct.randn(4, 8, placement=mesh, sbp=S(0))
        with ct.debug.comm_log() as log:
            y = model(x)
            assert y.dtype == np.float16
            (y.float() ** 2).mean().backward()
        for p in model.parameters():
            assert p.dtype == np.float32 and p.grad.dtype == np.float32
        syncs = [e for e in log if e.op == "grad_sync"]
        assert syncs and all(e.dtype == "float32" for e in syncs)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def test_grad_scaler_skips_an_overflow_and_recovers():
    w = nn.Parameter(ct.tensor(np.array([1.0, 2.0], dtype=np.float32)))
    opt = optim.SGD([w], lr=0.1)
    scaler = optim.GradScaler(init_scale=1024.0, growth_interval=2)
    scaler.scale((w * w).sum()).backward()
    w.grad.copy_(ct.tensor(np.array([np.inf, 1.0], dtype=np.float32)))  # injected overflow
    assert scaler.step(opt) is None and scaler.found_inf
    scaler.update()
    np.testing.assert_array_equal(w.numpy(), [1.0, 2.0])  # the step was skipped
    assert scaler.get_scale() == 512.0
    for _ in range(2):
        opt.zero_grad()
        scaler.scale((w * w).sum()).backward()
        scaler.step(opt)
        scaler.update()
    np.testing.assert_allclose(w.numpy(), np.array([1.0, 2.0]) * 0.8 ** 2, rtol=1e-6)
    assert scaler.get_scale() == 1024.0  # grown again after growth_interval clean steps
    assert scaler.state_dict()["scale"] == 1024.0
    with pytest.raises(RuntimeError, match="unscale_: already called"):
        scaler.unscale_(opt)
        scaler.unscale_(opt)


def test_bf16_is_refused_with_the_fix():
    with pytest.raises(TypeError, match=r"mixed_precision: bfloat16 is not available.*use "
                                        r"float16"):
        nn.compute_dtype("bf16")
    with pytest.raises(TypeError, match="bfloat16 is not available"):
        nn.mixed_precision(nn.Linear(2, 2), "bfloat16")
    with pytest.raises(SystemExit):
        _train().parse_args(["--precision", "bf16"])


# ----------------------------------------------------------------------------- memory
def test_memory_needs_tracking():
    with ct.debug.track_memory(False):
        with pytest.raises(RuntimeError, match=r"memory: memory tracking is off.*track_memory"):
            ct.debug.memory()


def test_memory_counts_shards_by_kind(mesh):
    with ct.debug.track_memory():
        n = mesh.shape[0]
        w = nn.Parameter(ct.zeros(8 * n, 4, placement=mesh, sbp=(S(0),) + (ct.sbp.broadcast,) *
                                  (mesh.ndim - 1)))
        inside = bool(w.local_shards())  # under mpiexec a rank may lie outside the mesh
        one = 8 * 4 * 4 if inside else 0  # one rank's shard of float32
        m = ct.debug.memory()
        assert m.current["parameters"] == one
        x = ct.ones(2, 8 * n, placement=mesh)
        loss = (x @ w).sum()
        loss.backward()
        m = ct.debug.memory()
        assert m.current["gradients"] == one
        opt = optim.Adam([w])
        opt.step()
        assert ct.debug.memory().current["optimizer"] == 2 * one
        w.grad = None
        after = ct.debug.memory()
        assert after.current["gradients"] == 0 and after.peak["gradients"] == one
        ct.debug.reset_peak_memory()
        assert ct.debug.memory().peak == ct.debug.memory().current
        assert "parameters" in ct.debug.memory().summary()
    from ctensor import memory
    assert not memory.tracking and not memory._buffers  # off: nothing is kept
