"""No hangs and no garbage: timed waits, the guard, fingerprints, leaving, aborting.

* Under ``mpiexec -n 2`` / ``-n 3`` (subprocesses, each bounded by a 60 s timeout): a rank
  that skips a ``to_global`` gives ``DivergenceError`` on both ranks, with or without debug
  mode; ranks in collectives of different groups time out with advice; a rank that raises
  aborts the job in seconds; a rank that leaves early (``sys.exit(0)``, ``sys.exit(3)``, a
  return from ``main``) fails the ranks waiting for it within seconds, while ranks that all
  finish leave cleanly; a pytest run where one rank's assertion fails ends. These spawn
  mpiexec themselves, so they are skipped when the suite already runs under mpiexec.
* Under the mpiexec runs of the whole suite (``tests/test_mpi.py``): ranks that disagree on
  shapes or on the kind of collective, and ``ct.tensor`` data that differ between ranks,
  raise on every rank without debug mode (skipped in simulation, where nothing can differ).
* The watchdog's logic (fingerprint comparison, timeouts, "what are you doing?" answers,
  leaving) on a fake in-memory network of two ranks in threads, so it runs in every mode.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import ctensor as ct
from ctensor import datacheck, runtime
from ctensor.comm import watchdog as wd
from conftest import MPI_MODE

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "mpi_scripts"
needs_launcher = pytest.mark.skipif(MPI_MODE, reason="spawns mpiexec itself")
S0, S1, B, P = ct.sbp.split(0), ct.sbp.split(1), ct.sbp.broadcast, ct.sbp.partial_sum


def multi_process() -> bool:
    """Whether ranks live in different processes (mpiexec with more than one rank)."""
    return runtime.world().mode is runtime.Mode.MPI


def _mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else (shutil.which("mpiexec") or "mpiexec")


def run_mpi(args: list, nprocs: int = 2, **env) -> tuple[subprocess.CompletedProcess, float]:
    """``mpiexec -n nprocs python args...`` with a clean ctensor environment plus ``env``;
    returns the finished process (stdout and stderr merged) and its wall time."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CTENSOR_")}
    environ.update(PYTHONUNBUFFERED="1", **env)
    start = time.monotonic()
    proc = subprocess.run([_mpiexec(), "-n", str(nprocs), sys.executable, *map(str, args)],
                          cwd=ROOT, env=environ, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=60)
    return proc, time.monotonic() - start


def run_mpi_timed(args: list, nprocs: int = 2, **env) -> tuple[int, list]:
    """:func:`run_mpi`, reading the output as it comes: ``(exit code, [(seconds since the
    start, line)])``, so a test can tell when each rank said what."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CTENSOR_")}
    environ.update(PYTHONUNBUFFERED="1", **env)
    start = time.monotonic()
    proc = subprocess.Popen([_mpiexec(), "-n", str(nprocs), sys.executable, *map(str, args)],
                            cwd=ROOT, env=environ, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list = []

    def read():
        for line in proc.stdout:
            lines.append((time.monotonic() - start, line.rstrip("\n")))
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    reader.join(timeout=5)
    return code, lines


def _when(lines: list, text: str) -> float:
    """When the first line holding ``text`` came (seconds), or infinity."""
    return next((t for t, line in lines if text in line), float("inf"))


# ----------------------------------------------------------------------------- under mpiexec
@needs_launcher
def test_skipped_to_global_is_a_divergence_error_on_both_ranks_in_debug_mode():
    proc, elapsed = run_mpi([SCRIPTS / "skip_to_global.py"], CTENSOR_DEBUG="1")
    out = f"exit code {proc.returncode}, {elapsed:.1f} s:\n{proc.stdout}"
    assert proc.returncode != 0, out
    assert elapsed < 30, out
    for rank in (0, 1):
        assert f"[rank {rank}] ctensor.errors.DivergenceError" in out, out
    # each rank names what both were doing: rank 0 the all-gather, rank 1 the sends
    assert "all_gather" in out and "send_recv" in out, out
    assert "finished without an error" not in out


@needs_launcher
def test_skipped_to_global_is_a_divergence_error_on_both_ranks_without_debug_mode():
    """The guard: rank 0's all-gather meets rank 1's sends on the same group; both ranks
    raise at once (not at CTENSOR_TIMEOUT), each saying what both were doing."""
    proc, elapsed = run_mpi([SCRIPTS / "skip_to_global.py"], CTENSOR_TIMEOUT="30")
    out = f"exit code {proc.returncode}, {elapsed:.1f} s:\n{proc.stdout}"
    assert proc.returncode != 0, out
    assert elapsed < 20, out
    for rank in (0, 1):
        assert out.count(f"[rank {rank}] ctensor.errors.DivergenceError") == 1, out
    assert "rank 0: collective #2 on ranks [0, 1]: all_gather" in out, out
    assert "rank 1: collective #2 on ranks [0, 1]: send_recv" in out, out
    assert "finished without an error" not in out


@needs_launcher
def test_collectives_of_different_groups_time_out_saying_what_to_do():
    proc, elapsed = run_mpi([SCRIPTS / "other_group.py"], CTENSOR_TIMEOUT="3")
    out = f"exit code {proc.returncode}, {elapsed:.1f} s:\n{proc.stdout}"
    assert proc.returncode != 0, out
    assert elapsed < 30, out
    assert "[rank 0] ctensor.errors.CommTimeoutError" in out, out
    # rank 0's message names the op, the rank it waited for, and that rank's answer
    assert "all_gather" in out and "the ranks [1] did not complete it" in out, out
    assert "rank 1: collective #1 on ranks [1, 0]: all_gather" in out, out
    # and says how to see more, and how to give slow ranks more time
    assert "CTENSOR_DEBUG=1 mpiexec -n 2 python script.py" in out, out
    assert "CTENSOR_TIMEOUT=600" in out, out
    assert "finished without an error" not in out


@needs_launcher
def test_collectives_of_different_groups_time_out_on_every_rank_within_the_limit():
    """other_group.py (the README's example): rank 0 waits in the guard of the world's
    communicator, rank 1 in the agreement on creating the one of [1, 0]. Both raise
    CommTimeoutError within CTENSOR_TIMEOUT + 5 s of starting it, each naming the other's
    answer (rank 1's says it waits to create a communicator)."""
    code, lines = run_mpi_timed([SCRIPTS / "other_group.py"], CTENSOR_TIMEOUT="3")
    out = f"exit code {code}:\n" + "\n".join(f"{t:6.2f} {line}" for t, line in lines)
    assert code != 0, out
    started = max(_when(lines, f"rank {r} starts") for r in (0, 1))
    for rank in (0, 1):
        assert _when(lines, f"[rank {rank}] ctensor.errors.CommTimeoutError") < started + 8, out
    assert ("rank 1: collective #1 on ranks [1, 0]: all_gather" in out and
            "waiting for its members to create the MPI communicator of ranks [1, 0] first"
            in out), out
    assert ("[rank 1] ctensor.errors.CommTimeoutError: rank 1 waited 3 s (CTENSOR_TIMEOUT) in "
            "collective #1 on ranks [1, 0]") in out, out
    assert "(creating the MPI communicator of ranks [1, 0] first)" in out, out
    assert "rank 0: collective #2 on ranks [0, 1]: all_gather" in out, out


@needs_launcher
@pytest.mark.parametrize("debug_mode", [False, True])
@pytest.mark.parametrize("how", ["ones", "from_local"])
def test_permuted_group_at_the_first_collective_raises_on_every_rank(how, debug_mode):
    """The first collective of the job on [0, 1] on rank 0 and [1, 0] on rank 1: no
    communicator exists yet, so both ranks would block in creating one (rank 0 in Dup of
    the world, rank 1 in Create_group) and hang forever. The agreement before the creation
    sees different groups: DivergenceError on both ranks, well within CTENSOR_TIMEOUT + 5
    s, naming both sides; in debug mode the fingerprints already differ (DivergenceError
    too). ``from_local`` first makes the world's communicator (its shape exchange): then,
    as in other_group.py, rank 0 waits in that one's guard while rank 1 waits to create
    another, and both raise CommTimeoutError within CTENSOR_TIMEOUT + 5 s."""
    env = {"CTENSOR_TIMEOUT": "3", **({"CTENSOR_DEBUG": "1"} if debug_mode else {})}
    code, lines = run_mpi_timed([SCRIPTS / "permuted_first.py", how], **env)
    out = f"exit code {code}:\n" + "\n".join(f"{t:6.2f} {line}" for t, line in lines)
    assert code != 0, out
    started = max(_when(lines, f"rank {r} starts") for r in (0, 1))
    assert started < float("inf"), out
    error = "CommTimeoutError" if how == "from_local" and not debug_mode else "DivergenceError"
    for rank in (0, 1):
        assert _when(lines, f"[rank {rank}] ctensor.errors.{error}") < started + 8, out
        assert out.count(f"[rank {rank}] ctensor.errors.{error}") == 1, out
    assert "placement('cpu', [0, 1])" in out and "placement('cpu', [1, 0])" in out, out
    if not debug_mode and how == "ones":
        for rank in (0, 1):
            assert (f"[rank {rank}]   rank 0 creates the MPI communicator of ranks [0, 1], "
                    f"before collective #1") in out, out
            assert (f"[rank {rank}]   rank 1 creates the MPI communicator of ranks [1, 0], "
                    f"before collective #1") in out, out
        assert "A placement's rank list is ordered" in out, out
    assert "finished without an error" not in out, out


@needs_launcher
@pytest.mark.parametrize("how", ["permuted", "purpose"])
def test_nccl_id_exchange_agrees_on_group_order_and_purpose(how):
    """The NCCL unique-id exchange by the same discipline: a group listed in another order,
    or the other communicator of the same group, is a DivergenceError on both ranks
    (instead of two roots making two ids and both hanging in ncclCommInitRank)."""
    proc, elapsed = run_mpi([SCRIPTS / "nccl_ids.py", how], CTENSOR_TIMEOUT="3")
    out = f"exit code {proc.returncode}, {elapsed:.1f} s:\n{proc.stdout}"
    assert proc.returncode != 0 and elapsed < 30, out
    for rank in (0, 1):
        assert out.count(f"[rank {rank}] ctensor.errors.DivergenceError: ranks") == 1, out
    if how == "permuted":
        assert "rank 1 creates the NCCL communicator of ranks [1, 0] for collectives" in out
    else:
        assert "rank 1 creates the NCCL communicator of ranks [0, 1] for transfers" in out
    assert "rank 0 creates the NCCL communicator of ranks [0, 1] for collectives" in out, out
    assert "finished without an error" not in out, out


@needs_launcher
def test_nccl_id_exchange_that_agrees_gives_the_roots_id_per_communicator():
    proc, elapsed = run_mpi([SCRIPTS / "nccl_ids.py", "same"])
    out = f"exit code {proc.returncode}, {elapsed:.1f} s:\n{proc.stdout}"
    assert proc.returncode == 0 and elapsed < 30, out
    for rank in (0, 1):
        assert f"rank {rank} got ['id 0 of rank 0', 'id 1 of rank 0']" in out, out


@needs_launcher
def test_broadcast_data_that_differ_raise_on_every_rank_under_mpiexec():
    """The issue's two cases as a user runs them: a rank-dependent broadcast shard in
    from_local, and ct.manual_seed(rank) before Module.to_global / data_parallel, raise
    ValueError on both ranks; check_tensor_data(False) and one seed are accepted."""
    proc, elapsed = run_mpi([SCRIPTS / "divergent_broadcast.py"])
    out = f"exit code {proc.returncode}, {elapsed:.1f} s:\n{proc.stdout}"
    assert proc.returncode == 0 and elapsed < 30, out
    for rank in (0, 1):
        assert (f"rank {rank} from_local: ValueError: from_local: the shards passed as "
                f"argument 'local' differ") in out, out
        for case in ("module", "data_parallel"):
            assert (f"rank {rank} {case}: ValueError: Module.to_global: 2 parameters "
                    f"differ") in out, out
        assert f"rank {rank} off: accepted" in out and f"rank {rank} seeded: accepted" in out
    assert "parameter 'weight' is (B) on placement('cpu', [0, 1])" in out, out
    assert "ranks [1] hold other values than rank 0" in out, out


@needs_launcher
def test_exception_on_one_rank_aborts_the_job():
    proc, elapsed = run_mpi([SCRIPTS / "raise_on_rank0.py"])
    out = f"exit code {proc.returncode}, {elapsed:.1f} s:\n{proc.stdout}"
    assert proc.returncode != 0, out
    assert elapsed < 30, out
    assert "[rank 0] ValueError: rank 0 fails on purpose" in out, out
    assert out.count("Traceback (most recent call last)") == 1, out
    assert "rank 1 was not aborted" not in out


@needs_launcher
def test_failing_assertion_on_one_rank_ends_the_pytest_run(tmp_path):
    (tmp_path / "test_one_rank_fails.py").write_text(
        "import ctensor as ct\n\n"
        "def test_fails_on_rank_1():\n"
        "    x = ct.ones(4, 3, sbp=ct.sbp.split(0))\n"
        "    assert ct.rank() != 1, 'rank 1 fails on purpose'\n"
        "    x.to_global(sbp=ct.sbp.split(1))  # rank 0 waits here for rank 1\n\n"
        "def test_after():\n"
        "    pass\n")
    # tests/conftest.py (with its abort-on-failure hook) loaded as a plugin: a conftest is
    # not picked up from a directory outside tests/
    proc, elapsed = run_mpi(["-m", "pytest", tmp_path / "test_one_rank_fails.py", "-q",
                             "-p", "conftest", "-p", "no:cacheprovider",
                             "--rootdir", tmp_path],
                            PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]))
    out = f"exit code {proc.returncode}, {elapsed:.1f} s:\n{proc.stdout}"
    assert proc.returncode != 0, out
    assert elapsed < 30, out
    assert "[rank 1] FAILED" in out and "rank 1 fails on purpose" in out, out


@needs_launcher
@pytest.mark.parametrize("how, nprocs", [("exit0", 2), ("exit3", 3), ("return", 3)])
def test_rank_that_leaves_early_fails_the_ranks_waiting_for_it(how, nprocs):
    """The last rank leaves (sys.exit(0), sys.exit(3), a return from main) after a first
    collective; each other rank raises RankExitedError within seconds (CTENSOR_TIMEOUT is
    30 s), printed once, naming the rank that left, where it left and what it waits in."""
    proc, elapsed = run_mpi([SCRIPTS / "leave_early.py", how], nprocs, CTENSOR_TIMEOUT="30")
    out = f"exit code {proc.returncode}, {elapsed:.1f} s:\n{proc.stdout}"
    assert proc.returncode != 0, out
    assert elapsed < 20, out
    last = nprocs - 1
    for rank in range(last):
        assert out.count(f"[rank {rank}] ctensor.errors.RankExitedError: rank {rank} waits in "
                         f"collective #3 on ranks {list(range(nprocs))}: all_to_all") == 1, out
        assert out.count(f"[rank {rank}] uncaught exception") == 1, out
    assert f"but rank {last} left and will never join it" in out, out
    assert (f"rank {last} finished its script (reached its end, returned or called sys.exit) "
            f"after collective #2 on ranks {list(range(nprocs))}: all_gather") in out, out
    assert f"[rank {last}]" not in out and "finished with" not in out, out


@needs_launcher
@pytest.mark.parametrize("nprocs", [2, 3])
def test_ranks_that_all_finish_leave_cleanly(nprocs):
    proc, elapsed = run_mpi([SCRIPTS / "leave_early.py", "normal"], nprocs)
    out = f"exit code {proc.returncode}, {elapsed:.1f} s:\n{proc.stdout}"
    assert proc.returncode == 0, out
    assert elapsed < 20, out
    # every rank's line and nothing else: no warning, no MPI noise at finalize
    assert sorted(proc.stdout.splitlines()) == [f"rank {r} finished with 66"
                                                for r in range(nprocs)], out


# ----------------------------------------------------------------------------- real ranks
def require_ranks() -> None:
    if not multi_process():
        pytest.skip("needs ranks in different processes: runs in the mpiexec runs of the suite")


def test_ranks_with_different_shapes_raise_on_every_rank_instead_of_exchanging_garbage():
    """Without debug mode: odd ranks think the tensor has 5 rows, even ranks 4, so they
    compute different all-gather counts; the guard raises on every rank before data moves
    (no uninitialised memory in .numpy()), and the world stays usable."""
    require_ranks()
    assert not ct.debug.consistency_checks_enabled()
    p = ct.placement.all()
    x = ct.zeros(4 + ct.rank() % 2, 3, placement=p, sbp=S0)
    with pytest.raises(ct.DivergenceError, match="reached different collectives") as info:
        x.to_global(sbp=B)
    text = str(info.value)
    assert "(4, 3)" in text and "(5, 3)" in text and "all_gather" in text, text
    value = np.arange(12.0).reshape(4, 3)
    np.testing.assert_array_equal(ct.tensor(value, sbp=S0).to_global(sbp=B).numpy(), value)


def test_all_gather_meeting_all_reduce_raises_on_every_rank_instead_of_mixing_data():
    require_ranks()
    value = np.arange(24.0).reshape(4, 6)
    split, partial = ct.tensor(value, sbp=S0), ct.tensor(value, sbp=P)
    with pytest.raises(ct.DivergenceError) as info:
        (split if ct.rank() == 0 else partial).to_global(sbp=B)
    text = str(info.value)
    assert "rank 0: collective" in text and "all_gather" in text and "all_reduce" in text, text
    np.testing.assert_array_equal(partial.to_global(sbp=B).numpy(), value)


def test_guard_falls_back_to_iallreduce_without_persistent_collectives():
    """An MPI library before MPI-4 has no Allreduce_init: the guard then posts an
    Iallreduce per collective, with the same answer on every rank."""
    require_ranks()
    from mpi4py import MPI
    from ctensor.comm import mpi as cm

    class WithoutPersistent:
        def __init__(self, comm):
            self.comm = comm

        def Dup(self):
            return WithoutPersistent(self.comm.Dup())

        def Allreduce_init(self, *args, **kwargs):
            raise NotImplementedError("MPI-4")

        def Iallreduce(self, *args, **kwargs):
            return self.comm.Iallreduce(*args, **kwargs)

    channel = cm._Channel(MPI, WithoutPersistent(MPI.COMM_WORLD), [])
    try:
        agreed = []
        for digest in (5, 5 + ct.rank()):  # the same on every rank, then not
            channel.start_guard(digest).Wait()
            agreed.append(channel.agreed())
        assert agreed == [True, False]
    finally:
        channel.guard.comm.Free()


def test_tensor_with_different_data_on_the_ranks_raises_on_every_rank():
    """ct.tensor checks by default (no debug mode) that every rank passed the same data."""
    require_ranks()
    p = ct.placement.all()
    others = list(range(1, ct.world_size()))
    drawn = np.random.default_rng(ct.rank()).standard_normal(6)   # as if unseeded
    with pytest.raises(ValueError) as info:
        ct.tensor(drawn, placement=p)
    text = str(info.value)
    assert text.startswith("tensor: argument 'data' must be the same full logical value")
    assert f"ranks {others} passed data different from rank 0's" in text, text
    assert "unseeded np.random" in text and "ct.from_local" in text, text
    # one value differing on rank 1 only names rank 1; another shape is caught too
    one = np.arange(6.0)
    one[3] += ct.rank() == 1
    with pytest.raises(ValueError, match=r"ranks \[1\] passed data different"):
        ct.tensor(one, placement=p)
    with pytest.raises(ValueError, match=r"shape \(7,\)"):
        ct.tensor(np.zeros(6 + (ct.rank() == 1)), placement=p)
    assert ct.tensor(np.arange(6.0), placement=p, sbp=S0).numpy().tolist() == list(range(6))
    with ct.debug.check_tensor_data(False):   # the documented switch
        ct.tensor(drawn, placement=p)


def test_data_digest_is_two_sums_over_uint64_lanes(monkeypatch):
    """The digest against its definition (Python integers), chunked in lanes of 4 here; it
    tells apart a changed value, a swap and a changed tail byte."""
    monkeypatch.setattr(datacheck, "_DIGEST_LANES", 4)
    monkeypatch.setattr(datacheck, "_digest_buffers", [])

    def reference(arr):
        raw = np.ascontiguousarray(arr).tobytes()
        raw += b"\0" * (-len(raw) % 8)
        lanes = [int.from_bytes(raw[i:i + 8], "little") for i in range(0, len(raw), 8)]
        return (sum(lanes) % 2**64, sum((2 * i + 1) * v for i, v in enumerate(lanes)) % 2**64)

    data = np.random.default_rng(0).standard_normal(11).astype(np.float32)  # 5.5 lanes
    assert datacheck._data_digest(data) == reference(data)
    swapped = data.copy()
    swapped[[0, 9]] = swapped[[9, 0]]
    changed = data.copy()
    changed[10] = 0.5
    digests = {datacheck._data_digest(a) for a in (data, swapped, changed, data[:10])}
    assert len(digests) == 4


# ----------------------------------------------------------------------------- broadcast data
def _local(placement, make):
    """``from_local``'s argument: this rank's ``make(rank)`` under mpiexec (None outside the
    placement), ``{rank: make(rank)}`` for every rank of it in a simulation."""
    if multi_process():
        return make(ct.rank()) if ct.rank() in placement else None
    return {r: make(r) for r in placement.rank_list}


def test_from_local_broadcast_shards_that_differ_raise_on_every_rank(mesh):
    """Along a broadcast mesh axis every rank must pass equal shards; the check compares
    within each broadcast axis' group (split and partial axes may differ)."""
    if mesh.size == 1:
        pytest.skip("one rank: nothing can differ")
    if mesh.ndim == 1:
        x = ct.from_local(_local(mesh, lambda r: np.arange(3.0)), mesh, B)
        assert x.sum().item() == 3.0
        with pytest.raises(ValueError) as info:
            ct.from_local(_local(mesh, lambda r: np.full(3, float(r))), mesh, B)
        text = str(info.value)
        assert text.startswith("from_local: the shards passed as argument 'local' differ")
        others = list(range(1, mesh.size))
        assert f"along mesh axis 0 (B) ranks {others} hold other values than rank 0" in text
        assert "ct.manual_seed(0)" in text and "check_tensor_data(False)" in text, text
        # one rank off is named alone
        with pytest.raises(ValueError, match=r"ranks \[1\] hold other values than rank 0"):
            ct.from_local(_local(mesh, lambda r: np.full(3, float(r == 1))), mesh, B)
        # partial sums and splits differ by definition
        assert ct.from_local(_local(mesh, lambda r: np.full(3, float(r))), mesh,
                             P).numpy().tolist() == [sum(range(mesh.size))] * 3
        with ct.debug.check_tensor_data(False):  # the documented switch
            ct.from_local(_local(mesh, lambda r: np.full(3, float(r))), mesh, B)
    else:  # (2, 2): rows split (S(0)), columns broadcast (B): ranks 0, 1 and 2, 3 agree
        sbp = (S0, B)
        x = ct.from_local(_local(mesh, lambda r: np.full((1, 2), float(r // 2))), mesh, sbp)
        np.testing.assert_array_equal(x.numpy(), [[0.0, 0.0], [1.0, 1.0]])
        with pytest.raises(ValueError) as info:
            ct.from_local(_local(mesh, lambda r: np.full((1, 2), float(r == 3))), mesh, sbp)
        text = str(info.value)
        assert "along mesh axis 1 (B) ranks [3] hold other values than rank 2" in text, text
        assert "rank 1" not in text.split("(digests")[0], text
        # (B, S(0)): the groups are the columns, ranks 0, 2 and 1, 3
        with pytest.raises(ValueError, match=r"along mesh axis 0 \(B\) ranks \[2\]"):
            ct.from_local(_local(mesh, lambda r: np.full((1, 2), float(r == 2))), mesh,
                          (B, S0))


def _rank_dependent(module):
    """Make every broadcast parameter's shards differ between ranks, as ct.manual_seed(rank)
    does under mpiexec (in a simulation, by writing each rank's shard)."""
    if multi_process():
        return
    for p in module.parameters():
        for r, arr in p.local_shards().items():
            arr += r


def test_module_to_global_with_parameters_that_differ_raises_on_every_rank(mesh, monkeypatch):
    """ct.manual_seed(rank) then nn.Linear(4, 4).to_global(..., B) gave every rank other
    weights; now one digest exchange for the whole module finds them and raises, naming
    the parameters and the ranks, and nothing moved. The same through nn.parallel."""
    from ctensor import nn
    if mesh.size == 1:
        pytest.skip("one rank: nothing can differ")
    ct.manual_seed(ct.rank() if multi_process() else 0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    _rank_dependent(model)
    exchanges = []
    w = runtime.world()
    real = w.exchange
    monkeypatch.setattr(w, "exchange", lambda *a, **k: exchanges.append(1) or real(*a, **k))
    before = {n: p.sbp for n, p in model.named_parameters()}
    with pytest.raises(ValueError) as info:
        model.to_global(mesh, B)
    assert len(exchanges) == 1  # one exchange for the whole module
    text = str(info.value)
    assert text.startswith("Module.to_global: 4 parameters differ between ranks"), text
    for name in ("0.weight", "0.bias", "2.weight", "2.bias"):
        assert f"parameter {name!r} is " in text, text
    assert "hold other values than rank 0" in text and "check_tensor_data(False)" in text
    assert {n: p.sbp for n, p in model.named_parameters()} == before  # nothing moved
    with pytest.raises(ValueError, match="parameters differ between ranks"):
        nn.parallel.data_parallel(model, mesh)
    if mesh.ndim == 1:
        with pytest.raises(ValueError, match="parameters differ between ranks"):
            nn.parallel.tensor_parallel(model, mesh)
        with pytest.raises(ValueError, match="^fully_shard: 4 parameters differ"):
            nn.fully_shard(model, mesh)
    with ct.debug.check_tensor_data(False):
        model.to_global(mesh, B)
    ct.manual_seed(0)
    same = nn.Linear(4, 4)
    value = same.weight.numpy()
    same.to_global(mesh, (S0,) + (B,) * (mesh.ndim - 1))  # equal values: accepted, split
    assert same.weight.sbp[0] == S0
    np.testing.assert_array_equal(same.weight.numpy(), value)


# ----------------------------------------------------------------------------- fake network
class _Request:
    def __init__(self, test=lambda: True):
        self._test, self._done = test, False

    def Test(self) -> bool:
        self._done = self._done or self._test()
        return self._done

    def Cancel(self) -> None:  # a cancelled request completes (receiving nothing)
        self._test, self._done = (lambda: False), True

    def Wait(self) -> None:
        while not self.Test():
            time.sleep(1e-4)


class _Status:
    source = -1

    def Get_source(self) -> int:
        return self.source


class _FakeMPI:
    """The few names of ``mpi4py.MPI`` that the watchdog uses."""

    ANY_SOURCE, BYTE, INT64_T = -1, "byte", "int64"
    Status, Exception = _Status, RuntimeError

    class Request:
        @staticmethod
        def Testall(requests) -> bool:
            return all([r.Test() for r in requests])


class _Net:
    """In-memory point-to-point messages between ranks (thread-safe)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.queues: dict = {}

    def world(self, rank: int) -> "_World":
        return _World(self, rank)


class _World:
    def __init__(self, net: _Net, rank: int):
        self.net, self.rank = net, rank

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return 2

    def Isend(self, spec, dest, tag):
        with self.net.lock:
            self.net.queues.setdefault((self.rank, dest, tag), []).append(np.array(spec[0]))
        return _Request()

    def _take(self, buf, source, tag) -> bool:
        with self.net.lock:
            queue = self.net.queues.get((source, self.rank, tag))
            if not queue:
                return False
            data = queue.pop(0)
        buf.reshape(-1).view(np.uint8)[:data.nbytes] = data.reshape(-1).view(np.uint8)
        return True

    def Irecv(self, spec, source, tag):
        return _Request(lambda: self._take(spec[0], source, tag))

    def Recv(self, spec, source, tag):
        while not self._take(spec[0], source, tag):
            time.sleep(1e-4)

    def Iprobe(self, source, tag, status) -> bool:
        with self.net.lock:
            for (src, dst, t), queue in self.net.queues.items():
                if dst == self.rank and t == tag and queue and source in (src, -1):
                    status.source = src
                    return True
        return False


def _watchdog(net: _Net, rank: int, **kw) -> wd.Watchdog:
    kw.setdefault("timeout", 5.0)
    kw.setdefault("check", True)
    return wd.Watchdog(_FakeMPI, net.world(rank), **kw)


def _call(seq=1, collective="all_gather", op="to_global", shape=(2, 3), args=("dim 0",)):
    return wd.Call(seq, collective, (0, 1), op, None, shape, "float32", args)


def _in_threads(*bodies) -> list:
    """Run one body per rank in threads; each result is its return value or exception."""
    results = [None] * len(bodies)

    def run(i):
        try:
            results[i] = bodies[i]()
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            results[i] = exc
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    return results


@pytest.fixture
def fast(monkeypatch):
    """Short phases so that the fake-network tests take milliseconds."""
    monkeypatch.setattr(wd, "YIELD_SECONDS", 0.01)
    monkeypatch.setattr(wd, "ANSWER_SECONDS", 0.5)


def test_matching_fingerprints_pass(fast):
    net = _Net()
    results = _in_threads(lambda: _watchdog(net, 0).verify(_call(shape=(2, 3)), (0, 1)),
                          lambda: _watchdog(net, 1).verify(_call(shape=(1, 3)), (0, 1)))
    assert results == [None, None]  # local shapes may differ in an all-gather


def test_different_fingerprints_raise_on_every_rank(fast):
    net = _Net()
    results = _in_threads(
        lambda: _watchdog(net, 0).verify(_call(collective="all_gather"), (0, 1)),
        lambda: _watchdog(net, 1).verify(_call(collective="all_to_all"), (0, 1)))
    for rank, exc in enumerate(results):
        assert isinstance(exc, ct.DivergenceError), exc
        text = str(exc)
        assert f"seen from rank {rank}" in text
        assert "rank 0: collective #1" in text and "all_gather" in text
        assert "rank 1: collective #1" in text and "all_to_all" in text


def test_sequence_numbers_and_reduction_shapes_are_compared(fast):
    net = _Net()
    results = _in_threads(lambda: _watchdog(net, 0).verify(_call(seq=3), (0, 1)),
                          lambda: _watchdog(net, 1).verify(_call(seq=4), (0, 1)))
    assert all(isinstance(r, ct.DivergenceError) for r in results)
    a = wd.Call(1, "all_reduce", (0, 1), "add", None, (2, 3), "float32", ("sum",), True)
    b = wd.Call(1, "all_reduce", (0, 1), "add", None, (3, 3), "float32", ("sum",), True)
    assert a.key() != b.key()


def test_missing_rank_that_answers_is_a_divergence(fast):
    """Rank 1 is inside another collective (answering queries); rank 0's fingerprint
    exchange times out and names what rank 1 says it is doing."""
    net = _Net()
    stop = threading.Event()
    other = _watchdog(net, 1)
    other.doing = _call(seq=7, collective="all_reduce", op="matmul")

    def rank1():  # waits in a collective that never completes until rank 0 is done
        other._poll([_Request(stop.is_set)], 10.0)

    def rank0():
        try:
            _watchdog(net, 0, check_timeout=0.2).verify(_call(), (0, 1))
        finally:
            stop.set()
    exc, _ = _in_threads(rank0, rank1)
    assert isinstance(exc, ct.DivergenceError), exc
    assert "did not reach it" in str(exc)
    assert "rank 1: collective #7" in str(exc) and "matmul" in str(exc)


def test_missing_rank_that_never_answers_is_a_timeout(fast):
    net = _Net()
    with pytest.raises(ct.CommTimeoutError, match=r"ranks \[1\] did not reach it"):
        _watchdog(net, 0, check_timeout=0.1).verify(_call(), (0, 1))


def test_wait_times_out_naming_op_and_ranks(fast):
    net = _Net()
    start = time.monotonic()
    with pytest.raises(ct.CommTimeoutError) as info:
        _watchdog(net, 0, timeout=0.1).wait([_Request(lambda: False)], _call(op="softmax"),
                                            [1])
    assert time.monotonic() - start < 5
    text = str(info.value)
    assert "waited 0.1 s" in text and "softmax" in text and "ranks [1]" in text
    assert "rank 1: no answer" in text
    # the first error a user sees says how to see more and how to wait longer
    assert "rerun with CTENSOR_DEBUG=1" in text and "CTENSOR_TIMEOUT=600" in text


def test_rank_that_left_fails_a_wait_for_it_within_a_second(fast):
    """Rank 1 leaves (its exit handler); rank 0, waiting for it in a collective that never
    completes, raises RankExitedError naming rank 1 and where it left, long before its
    timeout; rank 1 keeps waiting for rank 0's notice and gives up at its own timeout."""
    net = _Net()
    leaving = _watchdog(net, 1, timeout=1.0)
    leaving.last = _call(seq=4, op="matmul")
    start = time.monotonic()
    exc, left_in_time = _in_threads(
        lambda: _watchdog(net, 0, timeout=20).wait([_Request(lambda: False)],
                                                   _call(seq=5, op="softmax"), [1]),
        lambda: leaving.leave(2))
    assert time.monotonic() - start < 5
    assert isinstance(exc, ct.RankExitedError), exc
    text = str(exc)
    assert "rank 0 waits in collective #5" in text and "softmax" in text, text
    assert "rank 1 left" in text and "after collective #4" in text and "matmul" in text, text
    assert left_in_time is False


def test_ranks_that_all_leave_wait_for_each_other(fast):
    net = _Net()
    assert _in_threads(lambda: _watchdog(net, 0).leave(2),
                       lambda: _watchdog(net, 1).leave(2)) == [True, True]


def test_creation_agreement_passes_when_the_ranks_create_the_same(fast):
    net = _Net()
    assert _in_threads(
        lambda: _watchdog(net, 0).agree((0, 1), "the MPI communicator of ranks [0, 1]", _call()),
        lambda: _watchdog(net, 1).agree((0, 1), "the MPI communicator of ranks [0, 1]",
                                        _call())) == [None, None]


def test_creation_agreement_on_other_groups_raises_on_every_rank(fast):
    net = _Net()
    results = _in_threads(
        lambda: _watchdog(net, 0).agree((0, 1), "the MPI communicator of ranks [0, 1]", _call()),
        lambda: _watchdog(net, 1).agree((1, 0), "the MPI communicator of ranks [1, 0]",
                                        _call()))
    for rank, exc in enumerate(results):
        assert isinstance(exc, ct.DivergenceError), exc
        text = str(exc)
        assert f"seen from rank {rank}" in text, text
        assert "rank 0 creates the MPI communicator of ranks [0, 1], before collective" in text
        assert "rank 1 creates the MPI communicator of ranks [1, 0], before collective" in text


def test_creation_agreement_with_a_rank_elsewhere_times_out_naming_its_answer(fast):
    """Rank 1 waits in a collective of another group (answering queries); rank 0's
    agreement times out and names rank 1's answer; rank 1, while it agrees on a creation,
    answers that it does."""
    net = _Net()
    stop = threading.Event()
    other = _watchdog(net, 1)
    other.doing = _call(seq=7, collective="all_reduce", op="matmul")
    other.creating = "the MPI communicator of ranks [1, 0]"

    def rank1():
        other._poll([_Request(stop.is_set)], 10.0)

    def rank0():
        try:
            _watchdog(net, 0, timeout=0.2).agree((0, 1), "the MPI communicator of ranks "
                                                          "[0, 1]", _call())
        finally:
            stop.set()
    exc, _ = _in_threads(rank0, rank1)
    assert isinstance(exc, ct.CommTimeoutError), exc
    text = str(exc)
    assert "(creating the MPI communicator of ranks [0, 1] first)" in text, text
    assert "rank 1: collective #7" in text and "matmul" in text, text
    assert "waiting for its members to create the MPI communicator of ranks [1, 0]" in text


def test_wait_returns_when_requests_complete(fast):
    net = _Net()
    ticks = iter(range(1000))
    _watchdog(net, 0, timeout=5).wait([_Request(lambda: next(ticks) > 50)], _call(), [1])


def test_records_have_a_fixed_size_and_round_trip():
    call = _call(args=("x" * 2000,))
    record = call.record()
    assert record.shape == (wd.RECORD_BYTES,) and record.dtype == np.uint8
    digest, text = wd._unpack(record)
    assert len(digest) == 16 and text.startswith("collective #1 on ranks [0, 1]: all_gather")
    assert call.describe().startswith(text[:100])


def test_environment_settings(monkeypatch):
    monkeypatch.delenv("CTENSOR_TIMEOUT", raising=False)
    assert wd.env_timeout() == wd.DEFAULT_TIMEOUT == 60.0
    monkeypatch.setenv("CTENSOR_TIMEOUT", "2.5")
    assert wd.env_timeout() == 2.5
    for bad in ("0", "-1", "soon"):
        monkeypatch.setenv("CTENSOR_TIMEOUT", bad)
        with pytest.raises(ValueError, match="CTENSOR_TIMEOUT"):
            wd.env_timeout()
    for value, expected in (("1", True), ("0", False), ("", False), ("yes", True)):
        monkeypatch.setenv("CTENSOR_DEBUG", value)
        assert wd.env_debug() is expected


# ----------------------------------------------------------------------------- nonblocking
@needs_launcher
def test_async_transfer_with_other_shapes_is_a_divergence_error_naming_both_sides():
    """The header of a nonblocking transfer (its guard) disagrees: the receiver raises at
    once, saying what it expected and what the sender sent, and the job ends."""
    proc, elapsed = run_mpi([SCRIPTS / "async_transfer.py", "shapes"], CTENSOR_TIMEOUT="30")
    out = f"exit code {proc.returncode}, {elapsed:.1f} s:\n{proc.stdout}"
    assert proc.returncode != 0 and elapsed < 20, out
    assert out.count("[rank 1] ctensor.errors.DivergenceError: rank 1 expected collective "
                     "#1 on ranks [0, 1]: send_recv") == 1, out
    assert "local buffer (5, 3) float32" in out and "rank 0 sent collective #1" in out, out
    assert "local buffer (4, 3) float32" in out, out
    assert "rank 1 finished" not in out, out  # (the sender goes on: it never waits)


@needs_launcher
@pytest.mark.parametrize("how, waiting, left", [("sender-leaves", 1, 0),
                                                ("receiver-leaves", 0, 1)])
def test_async_transfer_with_a_rank_that_left_fails_within_seconds(how, waiting, left):
    """A receiver waiting for a sender that left, and a sender whose receiver left (its
    exit completes its sends first), both fail with RankExitedError instead of hanging."""
    proc, elapsed = run_mpi([SCRIPTS / "async_transfer.py", how], CTENSOR_TIMEOUT="30")
    out = f"exit code {proc.returncode}, {elapsed:.1f} s:\n{proc.stdout}"
    assert proc.returncode != 0 and elapsed < 20, out
    assert f"[rank {waiting}] ctensor.errors.RankExitedError: rank {waiting} waits in " \
           f"collective #1 on ranks [0, 1]: send_recv" in out, out
    assert f"but rank {left} left and will never join it" in out, out


@needs_launcher
def test_async_transfer_that_agrees_finishes_cleanly():
    proc, elapsed = run_mpi([SCRIPTS / "async_transfer.py", "normal"])
    out = f"exit code {proc.returncode}, {elapsed:.1f} s:\n{proc.stdout}"
    assert proc.returncode == 0 and elapsed < 20, out
    assert sorted(proc.stdout.splitlines()) == ["rank 0 finished with 0.0",
                                                "rank 1 finished with 0.0"], out
