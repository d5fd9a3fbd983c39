"""Strict device mode (``tests/strict_device.py``): ``cuda`` placements on CPU, on an array
module that refuses every implicit device->host transfer, so the CuPy path of ctensor runs in
CI without a GPU.

What runs here, sized for CI (22 s, up to ~50 s on two loaded cores): the module's own rules; a
host read planted in an op fails; deferred device checks; ``ct.debug``'s sync debug mode;
every op sample on one layout (a split one) with its gradient; a sample of the
boxing and autograd tests; the GPT example's data, tensor, pipeline and combined layouts at
tiny size, counting host synchronisations in training steps (0 besides the printed loss).
"""
from __future__ import annotations

import importlib.util
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest

import ctensor as ct
import ctensor.nn.functional as F
from ctensor import _device
from conftest import MPI_MODE, numeric_grad
import strict_device as sd
from samples import collect

pytestmark = pytest.mark.skipif(MPI_MODE, reason="strict device mode runs in simulation")
S0, S1, B = ct.sbp.split(0), ct.sbp.split(1), ct.sbp.broadcast


@pytest.fixture
def strict(monkeypatch):
    xp = sd.install(monkeypatch)
    monkeypatch.setattr(_device, "_checks", {})
    for name in ("assert_allclose", "assert_array_equal", "assert_equal"):  # shards: explicit
        orig = getattr(np.testing, name)
        monkeypatch.setattr(np.testing, name, lambda a, b, *args, _o=orig, **kw:
                            _o(_host(a), _host(b), *args, **kw))
    return xp


def _host(a):
    return a.get() if isinstance(a, sd.StrictArray) else a


# ============================================================================ the module
def test_implicit_transfers_are_refused(strict):
    a = strict.arange(6.0).reshape(2, 3)
    for read in (bool, int, float, lambda v: v.item(), lambda v: v.tolist(), np.asarray,
                 lambda v: np.exp(v), lambda v: np.sum(v), lambda v: v[v > 2],
                 lambda v: strict.nonzero(v), lambda v: strict.unique(v),
                 lambda v: list(range(10))[v[0, 0]]):
        with pytest.raises(sd.HostSyncError):
            read(a.sum() if read in (bool, int, float) else a)
    assert sd.COUNTS["refused"] == 12 and sd.COUNTS["d2h"] == 0


def test_cupy_semantics(strict):
    a = strict.arange(6.0).reshape(2, 3)
    total = a.sum()
    assert isinstance(total, sd.StrictArray) and total.ndim == 0  # 0-d, not a scalar
    assert isinstance(strict.max(a, axis=0), sd.StrictArray)
    with pytest.raises(TypeError, match="host numpy"):
        strict.add(a, np.ones(3))                                   # no host arrays mixed in
    with pytest.raises(TypeError):
        a + np.ones(3)
    assert (a * 2.0 + np.float32(1)).shape == (2, 3)                # host scalars are fine
    np.testing.assert_array_equal(strict.asnumpy(a[:, 1]), [1.0, 4.0])
    assert sd.COUNTS["d2h"] == 1 and sd.COUNTS["h2d"] == 0


def test_a_read_before_its_event_is_an_ordering_error(strict):
    cuda = strict.cuda
    side = cuda.Stream(non_blocking=True)
    with side:
        b = strict.zeros(4) + 1.0                                   # written on the side stream
    with pytest.raises(sd.OrderingError):
        b * 2.0                                                     # read on the null stream
    done = cuda.Event()
    done.record(side)
    cuda.get_current_stream().wait_event(done)
    assert (b * 2.0).shape == (4,)
    ran = []
    sd.enqueue(side, lambda: ran.append(1))                         # work completes later ...
    assert not ran
    later = cuda.Event()
    later.record(side)
    cuda.get_current_stream().wait_event(later)                     # ... when waited on
    assert ran == [1]


def test_a_host_read_planted_in_an_op_fails_strict_mode(strict, monkeypatch):
    from ctensor.ops import embedding as emb
    with ct.simulate(2):
        p = ct.placement("cuda", [0, 1])
        ids = ct.tensor(np.array([[0, 3], [2, 1]]), placement=p)
        w = ct.tensor(np.arange(8.0).reshape(4, 2), placement=p, sbp=S0)
        np.testing.assert_array_equal(ct.embedding(ids, w).numpy()[0, 1], [6.0, 7.0])
        original = emb._local_ids

        def planted(xp, opname, ids_, lo, hi, size):
            int(ids_.max())                                         # the planted host read
            return original(xp, opname, ids_, lo, hi, size)

        monkeypatch.setattr(emb, "_local_ids", planted)
        with pytest.raises(sd.HostSyncError, match="int"):
            ct.embedding(ids, w)


# ============================================================================ checks, debug
def test_device_checks_raise_at_the_next_explicit_transfer(strict):
    with ct.simulate(2):
        p = ct.placement("cuda", [0, 1])
        w = ct.tensor(np.ones((4, 2)), placement=p, sbp=S0)
        bad = ct.tensor(np.array([1, 7, 2]), placement=p)
        out = ct.embedding(bad, w)                                  # no host read here
        logits = ct.tensor(np.zeros((3, 4)), placement=p)
        F.cross_entropy(logits, ct.tensor(np.array([0, 1, 2]), placement=p))
        before = sd.COUNTS["d2h"]
        with pytest.raises(ValueError, match=r"embedding: ids must lie in \[0, 4\), got "
                                             r"values in \[1, 7\]"):
            out.numpy()
        assert sd.COUNTS["d2h"] - before == 1                       # the data and checks, one copy
        ok = ct.embedding(ct.tensor(np.array([0, 3]), placement=p), w)
        np.testing.assert_array_equal(ok.numpy(), np.ones((2, 2)))  # checks were cleared
        target = ct.tensor(np.array([0, 9, -100]), placement=p)
        loss = F.cross_entropy(logits, target)
        with pytest.raises(ValueError, match="target ids must lie in .0, 4. or equal "
                                             "ignore_index -100, got 9"):
            loss.item()


def test_sync_debug_mode_warns_or_raises_on_implicit_copies(strict):
    assert ct.debug.get_sync_debug_mode() == "default"
    with pytest.raises(ValueError, match="mode must be one of"):
        ct.debug.set_sync_debug_mode("loud")
    with ct.simulate(2):
        gpu, cpu = ct.placement("cuda", [0, 1]), ct.placement("cpu", [0, 1])
        x = ct.tensor(np.arange(4.0), placement=gpu, sbp=S0)
        try:
            ct.debug.set_sync_debug_mode("error")
            assert x.sum().item() == 6.0                            # explicit: allowed
            with pytest.raises(RuntimeError, match="synchronises the host"):
                x.to_global(cpu, S0)                                # a staged copy: implicit
            ct.debug.set_sync_debug_mode("warn")
            with pytest.warns(RuntimeWarning, match="synchronises the host"):
                x.to_global(cpu, S0)
        finally:
            ct.debug.set_sync_debug_mode("default")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            x.to_global(cpu, S0)
        p = ct.tensor(np.full(4, 0.5), placement=gpu)
        try:  # an op's own .item() (bernoulli's check of p) is implicit, not the user's
            ct.debug.set_sync_debug_mode("warn")
            with pytest.warns(RuntimeWarning, match="synchronises the host"):
                ct.bernoulli(p)
        finally:
            ct.debug.set_sync_debug_mode("default")


def test_a_checkpoint_save_is_an_explicit_transfer(strict, tmp_path):
    with ct.simulate(2):
        gpu = ct.placement("cuda", [0, 1])
        x = ct.tensor(np.arange(6.0).reshape(2, 3), placement=gpu, sbp=S1)
        try:
            ct.debug.set_sync_debug_mode("error")
            before = sd.COUNTS["d2h"]
            ct.save({"x": x}, tmp_path / "x.ct")
            assert sd.COUNTS["d2h"] > before and sd.COUNTS["refused"] == 0
        finally:
            ct.debug.set_sync_debug_mode("default")
        back = ct.load(tmp_path / "x.ct", placement=ct.placement("cpu", [0, 1]))["x"]
        np.testing.assert_array_equal(back.numpy(), np.arange(6.0).reshape(2, 3))


# ============================================================================ shared tests
SAMPLES, _ = collect()
#: samples whose op reads the device on the host by design: a data-dependent output shape
#: (nonzero, masked_select, x[mask]: the count, documented in ops/selection.py). Strict mode
#: must refuse them.
HOST_SYNCING = {"getitem_mask", "getitem_mask_leading", "getitem_mask_inner", "nonzero",
                "nonzero_as_tuple", "argwhere", "masked_select", "masked_select_broadcast"}


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: s.name)
def test_op_sample_in_strict_mode(strict, sample):
    """Every op sample on a ``cuda`` 1-D mesh of 2, one layout (test_ops' last, a split one
    where the sample has any) with its gradient, as test_ops.test_op checks them."""
    if sample.name in HOST_SYNCING:
        with pytest.raises(sd.HostSyncError):
            _run_sample(sample)
        return
    _run_sample(sample)
    assert sd.COUNTS["refused"] == 0


def _run_sample(sample):
    import test_ops
    rng = np.random.default_rng(zlib.crc32(sample.name.encode()))
    arrays = sample.inputs(rng, False)
    expected = np.asarray(sample.ref(*arrays))
    weight = rng.standard_normal(expected.shape)
    with ct.simulate(2):
        mesh = ct.placement("cuda", [0, 1])
        combos = test_ops._combos(sample, arrays, mesh, rng)
        for combo in combos[-1:]:  # one layout, a split one where the sample has any
            grad = expected.dtype.kind == "f" and len(sample.grad) > 0
            xs = [ct.tensor(a, placement=mesh, sbp=s, requires_grad=grad and i in sample.grad)
                  for i, (a, s) in enumerate(zip(arrays, combo))]
            out = sample.fn(*xs)
            got = out.numpy()
            if expected.dtype.kind in "biu":
                np.testing.assert_array_equal(got, expected, err_msg=f"sbp {combo}")
                continue
            np.testing.assert_allclose(got, expected, rtol=sample.rtol, atol=sample.atol,
                                       err_msg=f"sbp {combo}")
            if grad:
                (out * ct.tensor(weight, placement=mesh)).sum().backward()
                for i in sample.grad:
                    np.testing.assert_allclose(xs[i].grad.numpy(),
                                               numeric_grad(sample.ref, arrays, i, weight),
                                               rtol=1e-5, atol=1e-6)


@pytest.fixture
def mesh(strict):
    """A ``cuda`` 2x2 mesh in strict mode, for the shared boxing/autograd tests below."""
    with ct.simulate(4):
        yield ct.placement("cuda", [[0, 1], [2, 3]])


def test_boxing_and_autograd_in_strict_mode(mesh):
    import test_autograd
    import test_boxing
    test_boxing.test_scalar_and_3d(mesh)
    test_boxing.test_integer_and_bool_dtypes(mesh)
    test_autograd.test_data_parallel_grad_is_allreduced(mesh)
    test_autograd.test_partial_semantics(mesh)
    test_autograd.test_shared_input_and_diamond(mesh)
    assert sd.COUNTS["refused"] == 0


# ============================================================================ GPT
TRAIN = Path(__file__).resolve().parent.parent / "examples" / "gpt" / "train.py"
TINY = ["--layers", "2", "--hidden", "16", "--heads", "2", "--seq-len", "8",
        "--global-batch", "4", "--micro-batches", "2", "--steps", "2", "--dtype", "float64",
        "--dropout", "0.1", "--no-progress", "--lr", "1e-2"]


@pytest.fixture(scope="module")
def gpt():
    spec = importlib.util.spec_from_file_location("gpt_train_strict", TRAIN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, mod.run(TINY + ["--simulate", "1"])


@pytest.mark.parametrize("config", ["1x1x1", "2x1x1", "1x2x1", "2x2x1", "1x1x2", "2x1x2"])
def test_gpt_steps_have_no_host_sync_but_the_loss(strict, gpt, config):
    """GPT training steps (forward, backward, clip, AdamW) on ``cuda`` in strict mode: the
    CPU loss curve, and one device->host copy per step, the loss the script prints."""
    train, reference = gpt
    dp, tp, pp = map(int, config.split("x"))
    curve = train.run(TINY + ["--device", "cuda", "--simulate", str(dp * tp * pp), "--dp",
                              str(dp), "--tp", str(tp), "--pp", str(pp)])
    np.testing.assert_allclose(curve, reference, rtol=1e-9, atol=0)
    assert sd.COUNTS["refused"] == 0
    assert sd.COUNTS["d2h"] == len(reference), sd.COUNTS            # the loss of each step


# ============================================================================ async NCCL
def _async_world(size):
    from fake_nccl import FakeNccl, nccl_world
    lib = FakeNccl(asynchronous=True)
    return lib, nccl_world(size, lib, xp=sd.module)


def _on_ranks(group, fn):
    from fake_nccl import run_ranks
    return run_ranks(group, fn)


def test_async_nccl_collectives_match_the_simulator(strict):
    from ctensor.comm.simulated import SimulatedCommunicator
    from ctensor.sbp import ReduceOp
    group, rng = (2, 0, 3), np.random.default_rng(0)
    even = {r: rng.standard_normal((3, 4)) for r in group}
    uneven = {r: rng.standard_normal((n, 4)) for r, n in zip(group, (2, 1, 3))}
    wide = {r: rng.standard_normal((6, 4)) for r in group}
    calls = [("all_reduce", even, (ReduceOp.SUM,)), ("all_gather", even, (1, [4, 4, 4])),
             ("all_gather", uneven, (0, [2, 1, 3])),
             ("reduce_scatter", wide, (ReduceOp.MAX, 0, [2, 1, 3])),
             ("all_to_all", even, (1, [1, 1, 2], 0, [3, 3, 3]))]
    _, comms = _async_world(4)
    sim = SimulatedCommunicator(4)
    for name, data, args in calls:
        got = _on_ranks(group, lambda r: getattr(comms[r], name)(
            group, {r: sd.module.asarray(data[r])}, *args)[r].get())
        want = getattr(sim, name)(group, data, *args)
        for r in group:
            np.testing.assert_array_equal(got[r], want[r], err_msg=f"{name} rank {r}")
    assert sd.COUNTS["refused"] == 0


def test_transfers_and_collectives_of_one_group_run_concurrently(strict):
    """A started exchange (the group's transfers communicator) and a started all-reduce
    (its collectives communicator) in flight at once, a blocking all-gather between them:
    all on each rank's one communication stream in program order, so the two communicators
    meet in the same order on every rank (no deadlock) and nothing completes before it is
    waited for."""
    from ctensor.comm.base import Message
    from ctensor.sbp import ReduceOp
    f = np.dtype(np.float64)
    msgs = [Message(0, 1, 0, (3,), f), Message(1, 0, 0, (2,), f)]
    payload = {m: np.arange(m.shape[0], dtype=f) + 10 * m.src for m in msgs}
    _, comms = _async_world(2)
    xp = sd.module

    def run(r):
        comm = comms[r]
        x = xp.asarray(np.full(4, r + 1.0))
        moving = comm.exchange_start(msgs, {m: xp.asarray(a) for m, a in payload.items()
                                            if m.src == r})
        reducing = comm.all_reduce_start((0, 1), {r: x}, ReduceOp.SUM)
        pending_before = (moving.test(), reducing.test())
        gathered = comm.all_gather((0, 1), {r: x * 2.0}, 0, [4, 4])[r].get()
        moved = {m: a.get() for m, a in moving.wait().items()}
        reduced = reducing.wait()[r].get()
        streams = {comm._side_stream.ptr}
        return pending_before, gathered, moved, reduced, streams, set(comm._comms)

    out = _on_ranks((0, 1), run)
    for r in (0, 1):
        pending_before, gathered, moved, reduced, _, comms_made = out[r]
        assert pending_before == (False, False)          # asynchronous until waited on
        np.testing.assert_array_equal(gathered, [2.0] * 4 + [4.0] * 4)
        np.testing.assert_array_equal(reduced, [3.0] * 4)
        for m, a in moved.items():
            np.testing.assert_array_equal(a, payload[m])
        assert comms_made == {(0, 1), ("transfers", (0, 1))}
    assert out[0][4] != out[1][4]                         # one stream per rank, its own


def test_a_buffer_not_ordered_before_a_collective_is_an_ordering_error(strict):
    from ctensor.sbp import ReduceOp
    _, comms = _async_world(2)
    xp = sd.module

    def run(r):
        side = xp.cuda.Stream(non_blocking=True)
        with side:
            x = xp.zeros(4) + 1.0                         # made on a stream nobody waits for
        with pytest.raises(sd.OrderingError, match="before it waited for an event"):
            comms[r].all_reduce((0, 1), {r: x}, ReduceOp.SUM)
        return True

    assert all(_on_ranks((0, 1), run).values())
