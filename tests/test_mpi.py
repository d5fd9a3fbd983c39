"""Run the whole test suite again under ``mpiexec -n 2`` and ``mpiexec -n 4``.

Each rank runs the same test files; a failing rank aborts the job (see conftest.py), and a
hard timeout bounds the run so a hang can never stall CI. Under -n 4 the `mesh` fixture runs
only the meshes of 4 ranks (`--meshes`): -n 2 has run the smaller ones; the op table tries
fewer layouts per sample under mpiexec than in simulation (tests/test_ops.py).
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import MPI_MODE

ROOT = Path(__file__).resolve().parent.parent


def _mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else (shutil.which("mpiexec") or "mpiexec")


@pytest.mark.skipif(MPI_MODE, reason="already running under mpiexec")
@pytest.mark.timeout(900)
@pytest.mark.parametrize("nprocs", [2, 4])
def test_suite_under_mpiexec(nprocs):
    # one BLAS thread per rank: several ranks share the cores, and oversubscribed BLAS
    # threads slow everything down
    env = dict(os.environ, PYTHONUNBUFFERED="1", CTENSOR_TIMEOUT="120", OPENBLAS_NUM_THREADS="1",
               OMP_NUM_THREADS="1")
    cmd = [_mpiexec(), "-n", str(nprocs), sys.executable, "-m", "pytest", str(ROOT / "tests"),
           "-x", "--timeout=180", "-W", "ignore"]
    if nprocs == 4:
        # the meshes of 1 and 2 ranks ran under -n 2 already (ranks outside a placement too:
        # rank 1 of the 1-rank mesh), and the 3-rank mesh's uneven parts in simulation: -n 4
        # runs the meshes of all four ranks only
        cmd.append("--meshes=4,2x2")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=840)
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"mpiexec -n {nprocs} failed ({proc.returncode}):\n{tail}"
    assert " passed" in proc.stdout, tail
