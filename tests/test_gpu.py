"""GPU backend: ``ct.cuda``, clear errors without CuPy/GPU, NCCL planning and algorithms, the
host-staged path; and, on a machine with CuPy and a GPU, the op/boxing/autograd tests again on
``cuda`` placements in simulation (every virtual rank's shard on one GPU).

Runs everywhere: the tests that need CuPy and a GPU skip cleanly without them. The NCCL
communicator's algorithms (uneven all-gather / reduce-scatter / all-to-all, exchange,
dtype staging) run here on CPU against a fake ``cupy.cuda.nccl`` in which threads play the
ranks and pointers are host addresses, and are compared with the simulated backend.
``benchmarks/gpu_check.py`` runs this file on a GPU, plus real NCCL and mpiexec checks.
"""
from __future__ import annotations

import math
import sys
import types

import numpy as np
import pytest

import ctensor as ct
from ctensor import _device as ct_cuda
from ctensor.comm import nccl as nccl_module
from ctensor.comm.base import Message
from ctensor.comm.nccl import (NCCLCommunicator, Staging, all_to_all_plan, exchange_plan,
                               gather_plan, nccl_refusal, pad_plan, reduction_plan)
from ctensor.comm.simulated import SimulatedCommunicator
from ctensor.comm.staged import StagedCommunicator
from ctensor.sbp import ReduceOp
from conftest import MPI_MODE, mesh_ranks
from fake_nccl import FakeNccl, Host, nccl_world, run_ranks

import test_autograd
import test_boxing
import test_ops

S0, S1, B, P = ct.sbp.split(0), ct.sbp.split(1), ct.sbp.broadcast, ct.sbp.partial_sum
CUDA_MESHES = [(1,), (2,), (3,), (2, 2)]


def _gpu() -> bool:
    return ct.cuda.is_available()


# ============================================================================ without a GPU
@pytest.mark.skipif(_gpu(), reason="a GPU is visible here")
def test_is_available_false_without_gpu():
    assert ct.cuda.is_available() is False
    assert ct.cuda.device_count() == 0
    with pytest.raises(RuntimeError, match="cuda"):
        ct.cuda.current_device()


@pytest.fixture
def fresh_cuda(monkeypatch):
    """ct.cuda with no cached CuPy, so a faked import decides."""
    monkeypatch.setattr(ct_cuda, "_cupy", None)
    monkeypatch.setattr(ct_cuda, "_device", None)
    return monkeypatch


def test_cuda_placement_without_cupy_says_what_to_install(fresh_cuda):
    fresh_cuda.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    assert not ct.cuda.is_available() and ct.cuda.device_count() == 0
    assert not ct.cuda.nccl_available()
    p = ct.placement("cuda", [0])  # a placement is metadata: fine to build
    assert p.device == "cuda"
    for make in (lambda: ct.ones(3, placement=p), lambda: ct.tensor([1.0, 2.0], placement=p),
                 lambda: ct.ones(3).to_global(placement=p)):
        with pytest.raises(RuntimeError) as info:
            make()
        msg = str(info.value)
        assert "ct.placement('cuda'" in msg and "needs CuPy" in msg
        assert "pip install -e '.[gpu-cu13]'" in msg and "'.[gpu-cu12]'" in msg


def test_cuda_placement_without_gpu_says_no_gpu_is_visible(fresh_cuda):
    fake = types.ModuleType("cupy")
    fake.is_available = lambda: False
    fresh_cuda.setitem(sys.modules, "cupy", fake)
    assert not ct.cuda.is_available()
    with pytest.raises(RuntimeError, match="no CUDA GPU is visible"):
        ct.zeros(2, 2, placement=ct.placement("cuda", [0]))


def test_comm_for_in_one_process_is_the_simulated_communicator():
    with ct.simulate(3) as world:
        assert world.comm_for("cuda") is world.comm
        assert world.comm_for("cpu", "cuda") is world.comm
        assert ct.cuda.backend() == "simulated"


# ============================================================================ install
#: what the H200 machine this project may be lent has (.library/device/KINDS.md: CUDA 13,
#: driver 580, cupy-cuda13x 14.2.0, nvidia-nccl-cu13, numpy 2.5.2, mpi4py, xxhash; no
#: network), plus the mpich wheel a device call carries (README "GPU")
H200_WHEELS = {"numpy": "2.5.2", "mpi4py": "4.1.2", "xxhash": "3.5.0",
               "cupy-cuda13x": "14.2.0", "nvidia-nccl-cu13": "2.28.9", "mpich": "5.0.2"}


def _standin_wheel(folder, name: str, version: str, requires=(), extras=()) -> None:
    """An empty wheel of ``name`` ``version`` with these requirements: what pip's resolver
    reads of a package (the real wheels are hundreds of MB and cannot be fetched here)."""
    import base64
    import hashlib
    import zipfile
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Provides-Extra: {e}\n" for e in extras)
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {f"{info}/METADATA": meta,
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: stand-in\nRoot-Is-Purelib: "
                              "true\nTag: py3-none-any\n"}
    with zipfile.ZipFile(folder / f"{dist}-{version}-py3-none-any.whl", "w") as z:
        record = []
        for path, text in files.items():
            z.writestr(path, text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest())
            record.append(f"{path},sha256={digest.rstrip(b'=').decode()},{len(text)}")
        z.writestr(f"{info}/RECORD", "\n".join(record + [f"{info}/RECORD,,"]) + "\n")


def _dry_run(tmp_path, target: str):
    """``pip install --no-index --dry-run`` of ``target`` (``ctensor[...]``: a stand-in
    wheel with pyproject.toml's dependencies and extras, so no build backend is needed)
    against stand-ins of the H200's packages: ``(returncode, output)``."""
    import subprocess
    from pathlib import Path
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml")
                            .read_text())["project"]
    wheels = tmp_path / "wheels"
    wheels.mkdir(parents=True)
    for name, version in H200_WHEELS.items():
        _standin_wheel(wheels, name, version)
    extras = project["optional-dependencies"]
    requires = list(project["dependencies"]) + [
        f"{r} ; extra == '{e}'" for e, reqs in extras.items() for r in reqs]
    _standin_wheel(wheels, project["name"], project["version"], requires, list(extras))
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--dry-run",
                           "--ignore-installed", "--find-links", str(wheels), target],
                          cwd=tmp_path, capture_output=True, text=True, timeout=240)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.skipif(MPI_MODE, reason="a pip check: once, in simulation")
def test_cuda13_install_line_resolves_offline_on_the_h200_packages(tmp_path):
    code, out = _dry_run(tmp_path, "ctensor[gpu-cu13]")
    assert code == 0, out
    line = next(ln for ln in out.splitlines() if ln.startswith("Would install"))
    assert "cupy-cuda13x-14.2.0" in line and "nvidia-nccl-cu13" in line
    assert "cuda12" not in line and "cu12" not in line  # no second CuPy over the first
    code, out = _dry_run(tmp_path / "plain", "ctensor")  # a machine with CuPy: untouched
    assert code == 0, out
    assert "cupy" not in next(ln for ln in out.splitlines() if ln.startswith("Would install"))
    code, out = _dry_run(tmp_path / "cu12", "ctensor[gpu]")  # gpu = gpu-cu12: not its CUDA
    assert code != 0 and "cupy-cuda12x" in out


# ============================================================================ planning
def test_gather_and_pad_plans():
    assert gather_plan([3, 0, 2], 8) == [(0, 24), (24, 0), (24, 16)]
    width, starts = pad_plan([3, 0, 2])
    assert width == 3 and starts == [0, 3, 3]
    assert pad_plan([]) == (0, [])


def test_all_to_all_plan_matches_the_shards():
    # a (5, 7) shard of member 1 going from S(1) to S(0) over 3 members
    send, recv = all_to_all_plan((5, 7), 0, [2, 2, 1], 1, [3, 2, 2], me=1)
    assert send == [(2, 7), (2, 7), (1, 7)]
    assert recv == [(2, 3), (2, 2), (2, 2)]


def test_exchange_plan_orders_transfers_like_the_messages():
    f = np.dtype(np.float32)
    msgs = [Message(0, 1, 0, (2,), f), Message(1, 1, 0, (3,), f), Message(0, 1, 1, (1,), f),
            Message(2, 0, 0, (4,), f)]
    members, transfers = exchange_plan(msgs, 0)
    assert members == (0, 1, 2)
    assert transfers == [("send", msgs[0]), ("send", msgs[2]), ("recv", msgs[3])]
    assert exchange_plan(msgs, 3)[1] == []
    assert exchange_plan([msgs[1]], 1) == ((), [])


def test_reduction_plan_stages_what_nccl_lacks():
    assert reduction_plan(np.float32, ReduceOp.SUM).staging is Staging.NATIVE
    plan = reduction_plan(np.bool_, ReduceOp.SUM)  # logical or, like MPI's LOR
    assert (plan.staging, plan.work, plan.op) == (Staging.VIEW, np.uint8, ReduceOp.MAX)
    assert reduction_plan(np.bool_, ReduceOp.MIN).op is ReduceOp.MIN
    assert reduction_plan(np.int16, ReduceOp.MAX).work == np.int32
    assert reduction_plan(np.complex128, ReduceOp.SUM).work == np.float64
    with pytest.raises(TypeError, match="complex128"):
        reduction_plan(np.complex128, ReduceOp.MAX)


def test_nccl_refusal_reasons():
    assert nccl_refusal([("n0", "0:1", True), ("n0", "0:2", True), ("n1", "0:1", True)]) is None
    assert "share one GPU" in nccl_refusal([("n0", "0:1", True), ("n0", "0:1", True)])
    assert "nvidia-nccl-cu13" in nccl_refusal([("n0", "0:1", True), ("n0", "0:2", False)])


# ============================================================================ fake NCCL
def _same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for r in want:
        assert got[r].dtype == want[r].dtype and got[r].shape == want[r].shape, r
        np.testing.assert_array_equal(got[r], want[r], err_msg=f"rank {r}")


def _compare(size, group, inputs, call):
    """Run ``call(comm, bufs)`` on the fake-NCCL ranks of ``group`` (one buffer each) and on
    the simulator (all buffers); the results must be identical. Returns the fake's log."""
    lib = FakeNccl()
    comms = nccl_world(size, lib)
    got = {}
    for res in run_ranks(group, lambda r: call(comms[r], {r: inputs[r]})).values():
        got.update(res)
    _same(got, call(SimulatedCommunicator(size), inputs))
    return lib.log


def _data(group, shape_of, dtype, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for i, r in enumerate(group):
        a = rng.standard_normal(shape_of(i)) * 10
        out[r] = (a > 0) if np.dtype(dtype) == np.bool_ else a.astype(dtype)
    return out


GROUPS = [(0, 1), (2, 0, 3), (3, 1, 0, 2)]
DTYPES = [np.float32, np.float64, np.int16, np.bool_, np.complex64, np.int64]


@pytest.mark.parametrize("group", GROUPS, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_fake_nccl_all_reduce(group, dtype):
    for op in ReduceOp:
        if np.dtype(dtype).kind == "c" and op is not ReduceOp.SUM:
            continue
        inputs = _data(group, lambda i: (3, 4), dtype, seed=len(group))
        _compare(4, group, inputs, lambda c, b: c.all_reduce(group, b, op))


@pytest.mark.parametrize("group", GROUPS, ids=str)
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("uneven", [False, True], ids=["even", "uneven"])
def test_fake_nccl_all_gather_and_reduce_scatter(group, dim, uneven):
    k = len(group)
    sizes = [2] * k if not uneven else [(7 // k) + (i < 7 % k) for i in range(k)]
    if uneven and k == 4:
        sizes = [3, 0, 2, 2]  # an empty part too

    def shape(i, n):
        return (n, 5) if dim == 0 else (5, n)

    for dtype in (np.float32, np.bool_, np.int16):
        inputs = _data(group, lambda i: shape(i, sizes[i]), dtype, seed=k)
        log = _compare(4, group, inputs, lambda c, b: c.all_gather(group, b, dim, sizes))
        assert ("allGather" in log) == (not uneven)
        full = _data(group, lambda i: shape(i, sum(sizes)), dtype, seed=k + 1)
        for op in ReduceOp:
            log = _compare(4, group, full,
                           lambda c, b: c.reduce_scatter(group, b, op, dim, sizes))
            assert "reduceScatter" in log


@pytest.mark.parametrize("group", GROUPS, ids=str)
@pytest.mark.parametrize("split_dim,concat_dim", [(0, 1), (1, 0), (2, 0)])
def test_fake_nccl_all_to_all(group, split_dim, concat_dim):
    k = len(group)
    split_total = 7
    split_sizes = [split_total // k + (i < split_total % k) for i in range(k)]
    concat_sizes = [3, 0, 2, 1][:k]

    def shape(i):
        s = [4, 4, 4]
        s[split_dim] = split_total
        s[concat_dim] = concat_sizes[i]
        return tuple(s)

    for dtype in (np.float64, np.bool_):
        inputs = _data(group, shape, dtype, seed=k)
        _compare(4, group, inputs, lambda c, b: c.all_to_all(
            group, b, split_dim, split_sizes, concat_dim, concat_sizes))


def test_fake_nccl_exchange_matches_pairs_in_message_order():
    f = np.dtype(np.float32)
    msgs = [Message(0, 2, 0, (2, 3), f), Message(0, 2, 1, (1, 3), f), Message(2, 0, 0, (4,), f),
            Message(1, 1, 0, (2,), f), Message(3, 1, 0, (0, 3), f), Message(2, 3, 0, (5,), f)]
    rng = np.random.default_rng(0)
    payload = {m: rng.standard_normal(m.shape).astype(f) for m in msgs}
    lib = FakeNccl()
    comms = nccl_world(4, lib)

    def run(r):
        return comms[r].exchange(msgs, {m: a for m, a in payload.items() if m.src == r})

    got = run_ranks(range(4), run)
    for m in msgs:
        np.testing.assert_array_equal(got[m.dst][m], payload[m])
        assert all(m not in got[r] for r in range(4) if r != m.dst)


def test_fake_nccl_exchange_start_matches_exchange():
    """The nonblocking exchange (a side stream on a GPU; on the CPU fake, in order) gives
    the blocking one's result, on communicators of its own."""
    f = np.dtype(np.float64)
    msgs = [Message(0, 1, 0, (3, 2), f), Message(1, 0, 0, (5,), f), Message(2, 2, 0, (2,), f),
            Message(1, 0, 1, (0,), f), Message(3, 1, 0, (4, 4), f)]
    rng = np.random.default_rng(1)
    payload = {m: rng.standard_normal(m.shape) for m in msgs}
    lib = FakeNccl()
    comms = nccl_world(4, lib)

    def run(r):
        pending = comms[r].exchange_start(msgs, {m: a for m, a in payload.items() if m.src == r})
        return pending.wait()

    got = run_ranks(range(4), run)
    for m in msgs:
        np.testing.assert_array_equal(got[m.dst][m], payload[m])
    assert ("transfers", (0, 1, 3)) in comms[1]._comms  # not the collectives' communicator


def test_fake_nccl_caches_one_communicator_per_group():
    lib = FakeNccl()
    comms = nccl_world(2, lib)
    inputs = _data((0, 1), lambda i: (4,), np.float32)
    for _ in range(3):
        run_ranks((0, 1), lambda r: comms[r].all_reduce((0, 1), {r: inputs[r]}, ReduceOp.SUM))
    assert len(lib._cliques) == 1 and list(comms[0]._comms) == [(0, 1)]
    comms[0].close()
    assert comms[0]._comms == {}


def test_fake_nccl_single_rank_groups_through_nccl():
    lib = FakeNccl()
    comm = NCCLCommunicator(Host(0, 1), nccl=lib, xp=np, stream=lambda: 0,
                            share_id=lambda g, make, purpose: make(), single_rank_copies=False)
    x = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(comm.all_reduce((0,), {0: x}, ReduceOp.SUM)[0], x)
    np.testing.assert_array_equal(comm.all_gather((0,), {0: x}, 1, [3])[0], x)
    np.testing.assert_array_equal(comm.reduce_scatter((0,), {0: x}, ReduceOp.MAX, 0, [2])[0], x)
    assert lib.log == ["allReduce", "allGather", "reduceScatter"]


# ============================================================================ host-staged
class _Device(np.ndarray):
    """A stand-in for a device array: a NumPy subclass the staged path must convert."""


class _FakeDeviceModule:
    staged = 0

    def asarray(self, a):
        return np.asarray(a).view(_Device)

    def asnumpy(self, a):
        self.staged += 1
        return np.array(a).view(np.ndarray)


def test_staged_communicator_round_trips_through_the_host():
    xp = _FakeDeviceModule()
    comm = StagedCommunicator(SimulatedCommunicator(3), xp=xp)
    assert comm.backend_name == "host-staged" and comm.device_arrays
    sim = SimulatedCommunicator(3)
    group = (2, 0, 1)
    data = {r: np.arange(12.0).reshape(3, 4) * (r + 1) for r in group}
    dev = {r: xp.asarray(a) for r, a in data.items()}
    for name, args in [("all_reduce", (ReduceOp.SUM,)), ("all_gather", (0, [3, 3, 3])),
                       ("reduce_scatter", (ReduceOp.MAX, 1, [2, 1, 1])),
                       ("all_to_all", (1, [2, 1, 1], 0, [3, 3, 3]))]:
        got = getattr(comm, name)(group, dev, *args)
        want = getattr(sim, name)(group, data, *args)
        for r in group:
            assert isinstance(got[r], _Device)
            np.testing.assert_array_equal(np.asarray(got[r]), want[r])
    assert xp.staged > 0
    m = Message(0, 1, 0, (3, 4), np.dtype(np.float64))
    out = comm.exchange([m], {m: dev[0]})
    assert isinstance(out[m], _Device)
    started = comm.exchange_start([m], {m: dev[0]}).wait()  # host copies, up at wait()
    assert isinstance(started[m], _Device)
    np.testing.assert_array_equal(np.asarray(started[m]), data[0])
    assert comm.all_gather_object(group, {r: r for r in group})[0] == [2, 0, 1]


# ============================================================================ MPI choice
def _fake_gpu_module(bus: str):
    """A CuPy stand-in whose arrays are NumPy's: enough for the MPI-mode choice and wiring."""
    fake = types.ModuleType("cupy")
    fake.__getattr__ = lambda name: getattr(np, name)
    fake.is_available = lambda: True
    fake.asnumpy = np.asarray
    device = types.SimpleNamespace(id=0, pci_bus_id=bus, use=lambda: None)
    fake.cuda = types.SimpleNamespace(Device=lambda i=0: device,
                                      runtime=types.SimpleNamespace(getDeviceCount=lambda: 1))
    return fake


@pytest.mark.skipif(not MPI_MODE or _gpu(), reason="under mpiexec, on a machine without a GPU")
def test_mpi_cuda_choice_is_collective_and_reported_once(monkeypatch):
    from ctensor import runtime
    from ctensor.comm import nccl as nccl_mod
    world = runtime.world()
    if world.size < 2:
        pytest.skip("needs 2 ranks")
    monkeypatch.setattr(world, "_cuda_comm", None)
    monkeypatch.setattr(ct_cuda, "_cupy", _fake_gpu_module("0000:01:00.0"))  # one shared GPU
    monkeypatch.setattr(ct_cuda, "_device", 0)
    with pytest.warns(RuntimeWarning, match="host-staged") if ct.rank() == 0 \
            else _no_warning():
        comm = world.comm_for("cuda")
    assert isinstance(comm, StagedCommunicator) and ct.cuda.backend() == "host-staged"
    # the staged path under real MPI, through boxing: cuda->cuda and cpu<->cuda
    value = np.arange(35.0).reshape(5, 7)
    gpu = ct.placement("cuda", list(range(world.size)))
    x = ct.tensor(value, placement=gpu, sbp=S0)
    for sbp in (B, S1, P):
        np.testing.assert_array_equal(x.to_global(sbp=sbp).numpy(), value)
    cpu = ct.placement("cpu", list(range(world.size))[::-1])
    np.testing.assert_array_equal(x.to_global(cpu, S1).to_global(gpu, B).numpy(), value)
    # every rank with a GPU of its own and NCCL loadable: NCCL is chosen, silently
    monkeypatch.setattr(world, "_cuda_comm", None)
    monkeypatch.setattr(ct_cuda, "_cupy", _fake_gpu_module(f"0000:0{ct.rank()}:00.0"))
    monkeypatch.setattr(nccl_module, "loadable", lambda: True)
    with _no_warning():
        assert isinstance(world.comm_for("cuda"), nccl_mod.NCCLCommunicator)


class _no_warning:
    def __enter__(self):
        import warnings
        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("error")

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


# ============================================================================ on a GPU
def _need_gpu():
    if not _gpu():
        pytest.skip("needs CuPy and a CUDA GPU (pip install -e '.[gpu-cu13]')")
    if MPI_MODE:
        pytest.skip("cuda tests run in simulation; the MPI paths run in benchmarks/gpu_check.py")


def _host(a):
    return a.get() if type(a).__module__.startswith("cupy") else a


def _host_asserts(monkeypatch):
    """np.testing asserts that accept CuPy arrays (the shared tests compare local shards)."""
    for name in ("assert_allclose", "assert_array_equal", "assert_equal"):
        orig = getattr(np.testing, name)
        monkeypatch.setattr(np.testing, name,
                            lambda a, b, *args, _o=orig, **kw: _o(_host(a), _host(b), *args, **kw))


@pytest.fixture(params=CUDA_MESHES, ids=lambda s: "cuda-" + "x".join(map(str, s)))
def mesh(request, monkeypatch):
    """Overrides conftest's ``mesh`` for this file: a ``cuda`` placement in simulation."""
    _need_gpu()
    _host_asserts(monkeypatch)
    shape = request.param
    with ct.simulate(math.prod(shape)):
        yield ct.placement("cuda", mesh_ranks(shape))


@pytest.fixture
def gpu_world4(monkeypatch):
    _need_gpu()
    _host_asserts(monkeypatch)
    with ct.simulate(4):
        yield 4


# the shared table-driven tests, collected here again with the cuda ``mesh`` above (only
# where they can run: without a GPU they would be ~1500 skips)
SHARED = {
    "test_op_cuda": test_ops.test_op,
    "test_pairs_1d_cuda": test_boxing.test_pairs_1d,
    "test_pairs_2x2_cuda": test_boxing.test_pairs_2x2,
    "test_round_trips_cuda": test_boxing.test_round_trips,
    "test_uneven_rule_exact_cuda": test_boxing.test_uneven_rule_exact,
    "test_integer_and_bool_dtypes_cuda": test_boxing.test_integer_and_bool_dtypes,
    "test_scalar_and_3d_cuda": test_boxing.test_scalar_and_3d,
    "test_to_global_backward_cuda": test_autograd.test_to_global_backward_uses_dual_sbp,
    "test_data_parallel_grad_cuda": test_autograd.test_data_parallel_grad_is_allreduced,
    "test_no_sync_cuda": test_autograd.test_no_sync_accumulates_without_communication,
    "test_shared_input_and_diamond_cuda": test_autograd.test_shared_input_and_diamond,
    "test_partial_semantics_cuda": test_autograd.test_partial_semantics,
}
if _gpu() and not MPI_MODE:
    globals().update(SHARED)


def test_shared_tests_on_cuda():
    """Stands for the shared op/boxing/autograd tests that run on cuda where a GPU is."""
    _need_gpu()
    assert all(name in globals() for name in SHARED)


def test_cuda_shards_are_cupy_arrays_on_one_gpu(mesh):
    import cupy
    x = ct.randn(6, 5, placement=mesh, sbp=(S0,) * mesh.ndim) if hasattr(ct, "randn") else \
        ct.ones(6, 5, placement=mesh, sbp=(S0,) * mesh.ndim)
    for a in x.local_shards().values():
        assert isinstance(a, cupy.ndarray) and a.device.id == ct.cuda.current_device()
    assert isinstance(x.numpy(), np.ndarray)


@pytest.mark.parametrize("src_ranks,dst_ranks", [([0, 1, 2, 3], [1, 0]), ([0, 1], [2, 3]),
                                                  ([[0, 1], [2, 3]], [0]), ([0], [0, 1, 2])])
@pytest.mark.parametrize("devices", [("cpu", "cuda"), ("cuda", "cpu"), ("cuda", "cuda")],
                         ids="->".join)
def test_moves_between_cpu_and_cuda(gpu_world4, src_ranks, dst_ranks, devices):
    import cupy
    src_p, dst_p = ct.placement(devices[0], src_ranks), ct.placement(devices[1], dst_ranks)
    value = np.random.default_rng(3).standard_normal((7, 5))
    kinds = [S0, S1, B, P]
    for src in [(s,) * src_p.ndim for s in kinds]:
        x = ct.tensor(value, placement=src_p, sbp=src)
        for dst in [(s,) * dst_p.ndim for s in kinds]:
            y = x.to_global(dst_p, dst)
            assert y.placement == dst_p and y.sbp == dst
            np.testing.assert_allclose(y.numpy(), value, rtol=1e-12, atol=1e-12)
            want = cupy.ndarray if devices[1] == "cuda" else np.ndarray
            assert all(isinstance(a, want) for a in y.local_shards().values())


def test_cpu_cuda_move_is_differentiable(gpu_world4):
    cpu, gpu = ct.placement("cpu", [0, 1]), ct.placement("cuda", [2, 3])
    value = np.arange(12.0).reshape(4, 3)
    x = ct.tensor(value, placement=cpu, sbp=S0, requires_grad=True)
    (x.to_global(gpu, S1) ** 2).sum().backward()
    assert x.grad.placement == cpu and x.grad.sbp == (S0,)
    np.testing.assert_allclose(x.grad.numpy(), 2 * value)


@pytest.mark.skipif(not hasattr(ct, "randn"), reason="ct.randn not present")
def test_random_bits_equal_on_cpu_and_cuda(gpu_world4):
    out = {}
    for device in ("cpu", "cuda"):
        p = ct.placement(device, [[0, 1], [2, 3]])
        ct.manual_seed(1234)
        out[device] = [ct.randn(9, 7, placement=p, sbp=(S0, S1)).numpy(),
                       ct.rand(5, 3, placement=p, sbp=(B, S0), dtype=np.float64).numpy()]
    for a, b in zip(out["cpu"], out["cuda"]):
        np.testing.assert_array_equal(a, b)


def test_nccl_world_of_one_on_a_gpu():
    _need_gpu()
    if not ct.cuda.nccl_available():
        pytest.skip("NCCL not loadable (pip install nvidia-nccl-cu12)")
    import cupy
    comm = NCCLCommunicator(Host(0, 1), share_id=lambda g, make, purpose: make(),
                            single_rank_copies=False)
    try:
        x = cupy.arange(12, dtype=cupy.float32).reshape(3, 4)
        flags = x > 5
        for buf in (x, flags):
            for op in ReduceOp:
                cupy.testing.assert_array_equal(comm.all_reduce((0,), {0: buf}, op)[0], buf)
        cupy.testing.assert_array_equal(comm.all_gather((0,), {0: x}, 1, [4])[0], x)
        cupy.testing.assert_array_equal(
            comm.reduce_scatter((0,), {0: x}, ReduceOp.SUM, 0, [3])[0], x)
        m = Message(0, 0, 0, (3, 4), np.dtype(np.float32))
        assert comm.exchange([m], {m: x})[m] is x
    finally:
        comm.close()


def test_staged_communicator_with_cupy(gpu_world4):
    import cupy
    comm = StagedCommunicator(SimulatedCommunicator(2))
    bufs = {0: cupy.ones((2, 3)), 1: cupy.full((2, 3), 2.0)}
    out = comm.all_reduce((0, 1), bufs, ReduceOp.SUM)
    assert isinstance(out[0], cupy.ndarray)
    cupy.testing.assert_array_equal(out[1], cupy.full((2, 3), 3.0))
