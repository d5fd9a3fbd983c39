"""Shared fixtures: the same tests run in simulation and under mpiexec.

* In a plain ``pytest`` run every test that takes ``mesh`` runs once per mesh shape in
  ``MESHES`` inside ``ct.simulate(size)``; ``tests/test_mpi.py`` then re-runs the whole suite
  under ``mpiexec -n 2`` and ``-n 4`` (there ``--meshes=4,2x2``: the smaller meshes ran
  under -n 2).
* Under mpiexec the same test uses the real world (meshes larger than it are skipped — a
  decision every rank takes alike). A failing test aborts the whole MPI job at once, so no
  rank is left waiting in a collective.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import traceback

import numpy as np
import pytest

import ctensor as ct
from ctensor import runtime

MPI_MODE = runtime.launched_by_mpi()
MESHES = [(1,), (2,), (3,), (4,), (2, 2)]


def mesh_ranks(shape):
    return np.arange(math.prod(shape)).reshape(shape).tolist()


@pytest.fixture(params=MESHES, ids=lambda s: "x".join(map(str, s)))
def mesh(request):
    """A placement of the parametrised mesh shape, in the world of the current mode."""
    shape = request.param
    size = math.prod(shape)
    if MPI_MODE:
        if size > ct.world_size():
            pytest.skip(f"mesh {shape} needs {size} ranks, world has {ct.world_size()}")
        yield ct.placement("cpu", mesh_ranks(shape))
    else:
        with ct.simulate(size):
            yield ct.placement("cpu", mesh_ranks(shape))


def pytest_addoption(parser):
    parser.addoption(
        "--meshes", default=None,
        help="comma-separated mesh shapes the `mesh` fixture runs (e.g. 3,4,2x2); default all "
             "of MESHES. tests/test_mpi.py's -n 4 rerun leaves out the meshes -n 2 already ran.")


def _selected_meshes(config):
    value = config.getoption("--meshes")
    if not value:
        return None
    return {tuple(int(n) for n in part.split("x")) for part in value.split(",") if part}


def pytest_collection_modifyitems(config, items):
    selected = _selected_meshes(config)
    if selected is None:
        return
    keep, drop = [], []
    for item in items:
        shape = getattr(item, "callspec", None) and item.callspec.params.get("mesh")
        (drop if shape is not None and tuple(shape) not in selected else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def world(n: int):
    """A simulated world of ``n`` ranks, or the real one when it has enough ranks (else the
    test is skipped): a context manager."""
    if MPI_MODE:
        if ct.world_size() < n:
            pytest.skip(f"needs {n} ranks")
        return contextlib.nullcontext()
    return ct.simulate(n)


@pytest.fixture
def world4():
    """A world of at least 4 ranks (simulated unless under mpiexec -n 4)."""
    if MPI_MODE:
        if ct.world_size() < 4:
            pytest.skip("needs 4 ranks")
        yield ct.world_size()
    else:
        with ct.simulate(4):
            yield 4


def assert_layout(x: ct.Tensor, expected: np.ndarray, rtol=1e-6, atol=1e-6):
    """``x``'s logical value equals ``expected`` and every held shard is exactly its part."""
    full = x.numpy()
    np.testing.assert_allclose(full, expected, rtol=rtol, atol=atol)
    assert tuple(x.shape) == expected.shape
    if x._layout.has_partial:
        return
    for r, arr in x.local_shards().items():
        box = x._layout.region(r)
        assert arr.shape == tuple(b - a for a, b in box), (r, arr.shape, box)
        np.testing.assert_allclose(arr, expected[tuple(slice(a, b) for a, b in box)],
                                   rtol=rtol, atol=atol)


def numeric_grad(fn, arrays, i, weight, eps=1e-6):
    """d sum(fn(*arrays) * weight) / d arrays[i] by central differences (NumPy only)."""
    base = [a.copy() for a in arrays]
    grad = np.zeros_like(base[i])
    for idx in np.ndindex(base[i].shape):
        old = base[i][idx]
        base[i][idx] = old + eps
        hi = np.sum(fn(*base) * weight)
        base[i][idx] = old - eps
        lo = np.sum(fn(*base) * weight)
        base[i][idx] = old
        grad[idx] = (hi - lo) / (2 * eps)
    return grad


# ----------------------------------------------------------------------------- MPI abort
if MPI_MODE:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(item, call):
        outcome = yield
        report = outcome.get_result()
        if report.failed:
            from mpi4py import MPI
            rank = MPI.COMM_WORLD.Get_rank()
            sys.stderr.write(f"\n[rank {rank}] FAILED {item.nodeid}\n{report.longreprtext}\n")
            sys.stderr.flush()
            os.environ["CTENSOR_ABORTING"] = "1"
            MPI.COMM_WORLD.Abort(1)

    def pytest_internalerror(excrepr, excinfo):
        from mpi4py import MPI
        traceback.print_exception(excinfo.value)
        MPI.COMM_WORLD.Abort(1)
