"""The example scripts run (in one process, simulating their ranks) and check themselves."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import MPI_MODE

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ["quickstart.py", "simulate.py", "mlp_tp.py"]
SCRIPT_DIRS = ["benchmarks", "examples"]
# what the scripts import besides the standard library: a file of that name would shadow it
IMPORTED = {"numpy", "mpi4py", "ctensor", "torch", "cupy", "matplotlib", "tqdm"}


def test_no_script_shadows_a_module():
    # ``python benchmarks/x.py`` puts benchmarks/ first on sys.path, so a benchmarks/random.py
    # is what ``import random`` (inside numpy, via secrets) finds
    taken = set(sys.stdlib_module_names) | IMPORTED
    clashes = [str(path.relative_to(ROOT)) for folder in SCRIPT_DIRS
               for path in (ROOT / folder).rglob("*")
               if "__pycache__" not in path.parts
               and (path.suffix == ".py" or path.is_dir()) and path.stem in taken]
    assert not clashes, f"rename these: they shadow a module the scripts import: {clashes}"


@pytest.mark.skipif(MPI_MODE, reason="runs each script in its own process")
@pytest.mark.parametrize("script", EXAMPLES)
def test_example_runs(script):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "PMIX_"))}
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / script)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip()


@pytest.mark.skipif(MPI_MODE, reason="runs the script in its own process")
def test_gpt_train_script_runs(tmp_path):
    log = tmp_path / "log.jsonl"
    cmd = [sys.executable, str(ROOT / "examples" / "gpt" / "train.py"), "--simulate", "2",
           "--tp", "2", "--steps", "3", "--layers", "1", "--hidden", "16", "--heads", "2",
           "--seq-len", "8", "--global-batch", "4", "--no-progress", "--log-json", str(log)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "parameters" in proc.stdout and "done 1x2x1_4_16x1" in proc.stdout
    lines = log.read_text().splitlines()
    assert len(lines) == 4  # three steps and the summary
