"""ct.debug: the layout picture, the communication log, debug mode (fingerprints before
collectives, the same-data check of ct.tensor). Runs in simulation and under mpiexec; the
divergence and same-data checks only bite where ranks live in different processes."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import ctensor as ct
from ctensor import runtime
from conftest import MPI_MODE, assert_layout

S0, S1, B = ct.sbp.split(0), ct.sbp.split(1), ct.sbp.broadcast
P, PMAX = ct.sbp.partial_sum, ct.sbp.partial_max


def multi_process() -> bool:
    """Whether ranks live in different processes (mpiexec with more than one rank)."""
    return runtime.world().mode is runtime.Mode.MPI


# ----------------------------------------------------------------------------- visualize
def test_visualize_2d_mesh_grid():
    with ct.simulate(4):
        x = ct.zeros(8, 17, placement=ct.placement("cpu", [[0, 1], [2, 3]]), sbp=(S0, B))
        picture = ct.debug.visualize(x)
    assert picture == "\n".join([
        "Tensor shape (8, 17) float32, sbp (S(0), B)",
        "placement('cpu', [[0, 1], [2, 3]]): mesh 2 x 2",
        "  mesh axis 0 (rows, size 2): S(0) - dim 0 is split into 2 consecutive parts",
        "  mesh axis 1 (cols, size 2): B - replicated: these ranks hold the same values",
        "+-------------+-------------+",
        "| rank 0      | rank 1      |",
        "| [0:4, 0:17] | [0:4, 0:17] |",
        "| B           | B           |",
        "+-------------+-------------+",
        "| rank 2      | rank 3      |",
        "| [4:8, 0:17] | [4:8, 0:17] |",
        "| B           | B           |",
        "+-------------+-------------+"])
    assert repr(picture) == str(picture)  # shows as a picture at a REPL, not a quoted string


def test_visualize_1d_uneven_and_empty_parts():
    with ct.simulate(4):
        x = ct.ones(3, 2, placement=ct.placement("cpu", [3, 1, 0, 2]), sbp=S0)
        lines = x.visualize().splitlines()
    # one row of cells in mesh order; the last part is empty under the uneven rule
    assert lines[1:] == [
        "placement('cpu', [3, 1, 0, 2]): mesh 4",
        "  mesh axis 0 (size 4): S(0) - dim 0 is split into 4 consecutive parts",
        "+------------------+------------------+------------------+------------------+",
        "| rank 3           | rank 1           | rank 0           | rank 2           |",
        "| [0:1, 0:2]       | [1:2, 0:2]       | [2:3, 0:2]       | [3:3, 0:2] empty |",
        "+------------------+------------------+------------------+------------------+"]


def test_visualize_marks_partial_and_broadcast():
    with ct.simulate(4):
        mesh = ct.placement("cpu", [[0, 1], [2, 3]])
        x = ct.ones(3, 4, placement=mesh, sbp=(PMAX, S1))
        y = ct.ones(3, 4, placement=mesh, sbp=(P, B))
        text_x, text_y = x.visualize(), ct.debug.visualize(y)
    assert "partial max" in text_x and "| P(max)     |" in text_x
    assert "[0:3, 2:4]" in text_x
    assert "P(sum) B" in text_y and "partial sum" in text_y and "replicated" in text_y


def test_visualize_scalar_and_3d_mesh():
    with ct.simulate(8):
        mesh = ct.placement("cpu", np.arange(8).reshape(2, 2, 2).tolist())
        x = ct.zeros(4, 4, placement=mesh, sbp=(S0, S1, P))
        s = ct.tensor(3.0, placement=ct.placement("cpu", [0, 1]))
        text, scalar = x.visualize(), s.visualize()
    assert "mesh[0, :, :]" in text and "mesh[1, :, :]" in text
    assert "| rank 6     | rank 7     |" in text and "| [2:4, 2:4] | [2:4, 2:4] |" in text
    assert "scalar" in scalar


def test_visualize_in_the_current_world_is_metadata_only(mesh):
    value = np.arange(13 * 5.0).reshape(13, 5)
    x = ct.tensor(value, placement=mesh, sbp=(S0,) * mesh.ndim)
    with ct.debug.comm_log() as log:
        text = x.visualize()
    assert log == []
    for r in mesh.rank_list:
        box = x._layout.region(r)
        cell = "[" + ", ".join(f"{a}:{b}" for a, b in box) + "]"
        assert f"rank {r}" in text and cell in text
    assert ("* = this process" in text) == multi_process()
    with pytest.raises(TypeError, match="visualize"):
        ct.debug.visualize(value)


# ----------------------------------------------------------------------------- comm log
def test_comm_log_summary_table():
    with ct.simulate(2):
        p = ct.placement("cpu", [0, 1])
        x = ct.ones(4, 8, placement=p, sbp=S0)          # 4 float32 per row
        y = ct.ones(4, 8, placement=p, sbp=P)
        with ct.debug.comm_log() as log:
            x.to_global(sbp=B)                          # all-gather
            x.to_global(sbp=B)
            y.to_global(sbp=B)                          # all-reduce
            x.to_global(sbp=S1)                         # all-to-all
            y.to_global(sbp=S0)                         # reduce-scatter
            y.to_global(sbp=(PMAX,))                    # all-reduce, then local
    assert log.collectives() == ["all_gather", "all_gather", "all_reduce", "all_to_all",
                                 "reduce_scatter", "all_reduce"]
    lines = log.summary().splitlines()
    assert lines[0].split() == ["op", "collective", "count", "bytes/rank"]
    rows = {tuple(line.split()[:3]) for line in lines[1:-1]}
    assert rows == {("to_global", "all_gather", "2"), ("to_global", "all_reduce", "2"),
                    ("to_global", "all_to_all", "1"), ("to_global", "reduce_scatter", "1")}
    # bytes per rank, what one rank feeds in (as each process logs under mpiexec): its
    # (2, 8) float32 part of the all-gathers and the all-to-all, its whole (4, 8) buffer of
    # the all-reduces and the reduce-scatter
    assert log.total_bytes == 2 * 64 + 2 * 128 + 64 + 128
    assert [e.nbytes for e in log if e.collective != "local"] == [64, 64, 128, 64, 128, 128]
    assert lines[-1].split() == ["total", "6", "576", "B"]
    assert str(log) == log.summary()


def test_comm_log_summary_without_communication():
    with ct.simulate(2):
        x = ct.ones(4, placement=ct.placement("cpu", [0, 1]), sbp=B)
        with ct.debug.comm_log() as log:
            x.to_global(sbp=S0)                         # a local slice
    assert log.collectives() == []
    assert log.summary().endswith("(no communication)")


def test_comm_log_bytes_are_per_rank_in_every_mode(mesh):
    """The same script logs the same bytes in a simulation and under mpiexec (where each
    process logs its own rank's): one rank's part of an all-gather, its whole buffer of an
    all-reduce, the messages it sends plus those it receives in a send_recv. (A simulation
    used to log the sum over every rank it holds: twice as much on 2 ranks.)"""
    n = mesh.size
    if n == 1:
        pytest.skip("one rank: no communication")
    full = (S0,) * mesh.ndim
    x = ct.ones(4 * n, 3, placement=mesh, sbp=full)            # (4, 3) float32 per rank
    y = ct.ones(5, 3, placement=mesh, sbp=(P,) * mesh.ndim)    # (5, 3) float32 on each rank
    with ct.debug.comm_log() as log:
        x.to_global(sbp=(B,) * mesh.ndim)
        y.to_global(sbp=(B,) * mesh.ndim)
    gathers = [e.nbytes for e in log if e.collective == "all_gather"]
    reduces = [e.nbytes for e in log if e.collective == "all_reduce"]
    if multi_process() and ct.rank() not in mesh:  # a rank outside feeds nothing
        assert log.total_bytes == 0, log
        return
    if mesh.ndim == 1:
        assert gathers == [4 * 3 * 4] and reduces == [5 * 3 * 4], log
        assert log.total_bytes == 4 * 3 * 4 + 5 * 3 * 4
        if n % 2 == 0:  # every rank sends its block to the mirror rank and gets its block
            mirror = ct.placement("cpu", list(reversed(mesh.rank_list)))
            with ct.debug.comm_log() as moved:
                x.to_global(mirror, (S0,))
            assert [e.nbytes for e in moved if e.collective == "send_recv"] == \
                [2 * 4 * 3 * 4], moved
    else:  # (2, 2): the mesh axes one by one, each rank's buffer at that point
        assert gathers == [4 * 3 * 4, 2 * 4 * 3 * 4] and reduces == [5 * 3 * 4] * 2, log


def test_comm_log_names_the_op(mesh):
    x = ct.ones(4, 6, placement=mesh, sbp=(S0,) * mesh.ndim)
    w = ct.ones(6, 3, placement=mesh, sbp=(S0,) * mesh.ndim)
    with ct.debug.comm_log() as log:
        (x @ w).numpy()
    if mesh.size > 1:
        assert any(e.op == "matmul" for e in log) and "matmul" in log.summary()


# ----------------------------------------------------------------------------- debug mode
def test_check_consistency_call_and_context():
    before = ct.debug.consistency_checks_enabled()
    with ct.debug.check_consistency():
        assert ct.debug.consistency_checks_enabled()
        with ct.debug.check_consistency(False):
            assert not ct.debug.consistency_checks_enabled()
        assert ct.debug.consistency_checks_enabled()
    assert ct.debug.consistency_checks_enabled() == before
    state = ct.debug.check_consistency(True)             # as a plain call
    try:
        assert ct.debug.consistency_checks_enabled() and "enabled=True" in repr(state)
    finally:
        ct.debug.check_consistency(before)
    with pytest.raises(TypeError, match="check_consistency"):
        ct.debug.check_consistency("yes")
    with pytest.raises(ValueError, match="timeout"):
        ct.debug.check_consistency(timeout=-1)


def test_boxing_works_in_debug_mode(mesh):
    value = np.random.default_rng(3).standard_normal((13, 7))
    with ct.debug.check_consistency(timeout=60):
        x = ct.tensor(value, placement=mesh, sbp=(S0,) * mesh.ndim)
        for sbp in [(S1,), (B,), (P,), (S0,)]:
            y = x.to_global(sbp=sbp * mesh.ndim)
            assert_layout(y, value)
        assert_layout((x + 1.0).sum(dim=0).to_global(sbp=(B,) * mesh.ndim),
                      (value + 1.0).sum(axis=0))
        moved = x.to_global(placement=ct.placement("cpu", list(reversed(mesh.rank_list))),
                            sbp=S1)
        assert_layout(moved, value)
        held = [r for r in runtime.world().held_ranks if r in mesh]
        local = ({r: np.ones((1, 2)) for r in held} if len(runtime.world().held_ranks) > 1
                 else np.ones((1, 2)) if held else None)
        assert ct.from_local(local, mesh, (S0,) * mesh.ndim).shape == (mesh.size, 2)


def test_divergent_ranks_raise_on_every_rank():
    """Under mpiexec rank 0 all-gathers while the others all-to-all: in debug mode every
    rank raises DivergenceError before any data moves, and the world stays usable."""
    p = ct.placement.all()
    value = np.arange(24.0).reshape(4, 6)
    x = ct.tensor(value, placement=p, sbp=S0)
    with ct.debug.check_consistency(timeout=60):
        if multi_process():
            with pytest.raises(ct.DivergenceError, match="reached different collectives") as e:
                x.to_global(sbp=B if ct.rank() == 0 else S1)
            assert "all_gather" in str(e.value) and "all_to_all" in str(e.value)
        else:  # one process holds every rank: nothing can diverge, the check is a no-op
            assert_layout(x.to_global(sbp=B), value)
    np.testing.assert_array_equal(x.to_global(sbp=S1).numpy(), value)


def test_tensor_checks_every_rank_passed_the_same_data():
    p = ct.placement.all()
    with ct.debug.check_consistency(timeout=60):
        same = ct.tensor(np.arange(6.0), placement=p, sbp=S0)
        np.testing.assert_array_equal(same.numpy(), np.arange(6.0))
        data = np.full(3, float(ct.rank()))               # differs across processes
        if multi_process():
            with pytest.raises(ValueError, match=r"tensor: argument 'data'.*ranks \[1"):
                ct.tensor(data, placement=p)
        else:
            ct.tensor(data, placement=p)
    with ct.debug.check_tensor_data(False):              # checked unless switched off
        ct.tensor(data, placement=p)


@pytest.mark.skipif(not sys.platform.startswith("linux") or MPI_MODE,
                    reason="VmHWM is Linux's; no fork from an MPI rank")
def test_peak_rss_is_the_process_own_not_its_parent():
    """``ru_maxrss`` of a process started by fork and exec keeps its parent's maximum;
    ``ct.debug.peak_rss()`` is the process's own (train.py's 'peak memory per rank')."""
    held = np.ones(256 * 2**20 // 8)  # the parent holds 256 MiB that the child never has
    out = subprocess.run([sys.executable, "-c", "import ctensor as ct; print(ct.debug.peak_rss())"],
                         capture_output=True, text=True, check=True, timeout=120)
    child, parent = int(out.stdout), ct.debug.peak_rss()
    assert parent >= held.nbytes
    assert 0 < child < parent - held.nbytes // 2, (child, parent)
    assert ct.debug.per_rank(1) == [1] * ct.world_size()
