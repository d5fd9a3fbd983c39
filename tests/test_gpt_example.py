"""examples/gpt/train.py: every parallel configuration gives the loss curve of one process,
with dropout on, in float64 (<= 1e-9 relative). In simulation every configuration runs;
under mpiexec the ones whose size equals the world run on real ranks."""
import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

import ctensor as ct
from conftest import MPI_MODE

TRAIN = Path(__file__).resolve().parent.parent / "examples" / "gpt" / "train.py"
TINY = ["--layers", "2", "--hidden", "16", "--heads", "2", "--seq-len", "8",
        "--global-batch", "4", "--micro-batches", "2", "--steps", "4", "--dtype", "float64",
        "--dropout", "0.1", "--no-progress", "--lr", "1e-2"]
CONFIGS = ["1x1x1", "2x1x1", "1x2x1", "1x1x2", "2x2x1", "1x2x2", "2x1x2"]


def _train_module():
    spec = importlib.util.spec_from_file_location("gpt_train", TRAIN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def train():
    return _train_module()


@pytest.fixture(scope="module")
def reference(train):
    return train.run(TINY + ["--simulate", "1"])


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("config", CONFIGS)
def test_same_loss_curve_as_one_process(train, reference, config, schedule):
    dp, tp, pp = map(int, config.split("x"))
    size = dp * tp * pp
    args = TINY + ["--dp", str(dp), "--tp", str(tp), "--pp", str(pp), "--schedule", schedule]
    if MPI_MODE:
        if size != ct.world_size():
            pytest.skip(f"{config} needs exactly {size} ranks")
    else:
        args += ["--simulate", str(size)]
    history = train.run(args)
    assert len(history) == len(reference)
    np.testing.assert_allclose(history, reference, rtol=1e-9, atol=0)
    assert history[-1] < history[0]


def test_parameter_count_formula(train):
    h, l, v, s = 16, 2, 256, 8
    blocks = l * (12 * h * h + 13 * h)
    assert train.parameter_count(h, l, v, s) == blocks + (v + s) * h
    assert math.isclose(train.parameter_count(64, 4, 256, 32),
                        12 * 4 * 64 ** 2 * (1 + 13 / (12 * 64) + (256 + 32) / (12 * 4 * 64)))


def test_checkpoint_resume_continues_the_curve(train, tmp_path_factory, reference):
    if MPI_MODE:
        path = Path("/tmp") / f"ctensor-gpt-ckpt-{ct.world_size()}"
    else:
        path = tmp_path_factory.mktemp("gpt") / "ckpt"
    half = [a if a != "4" or TINY[i - 1] != "--steps" else "2" for i, a in enumerate(TINY)]
    sim = ["--dp", str(ct.world_size())] if MPI_MODE else ["--simulate", "1"]
    first = train.run(half + sim + ["--save", str(path)])
    rest = train.run(TINY + sim + ["--load", str(path)])
    np.testing.assert_allclose(first + rest, reference, rtol=1e-9)
