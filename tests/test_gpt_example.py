"""examples/gpt/train.py: every parallel configuration, every pipeline schedule (GPipe,
1F1B, interleaved 1F1B with virtual stages) and sequence parallelism give the loss curve of
one process, with
dropout on, in float64 (<= 1e-9 relative). In simulation every configuration runs; under
mpiexec the ones whose size equals the world run on real ranks."""
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


def _run_config(train, config: str, args: list) -> list:
    """train.py's loss curve for ``config`` (``dxmxp``) with ``args``: simulated, or under
    mpiexec when the world has exactly that many ranks (else the test is skipped)."""
    dp, tp, pp = map(int, config.split("x"))
    size = dp * tp * pp
    args = args + ["--dp", str(dp), "--tp", str(tp), "--pp", str(pp)]
    if MPI_MODE:
        if size != ct.world_size():
            pytest.skip(f"{config} needs exactly {size} ranks")
    else:
        args += ["--simulate", str(size)]
    return train.run(args)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("config", CONFIGS)
def test_same_loss_curve_as_one_process(train, reference, config, schedule):
    history = _run_config(train, config, TINY + ["--schedule", schedule])
    assert len(history) == len(reference)
    np.testing.assert_allclose(history, reference, rtol=1e-9, atol=0)
    assert history[-1] < history[0]


SEQUENCE_PARALLEL = ["1x2x1", "2x2x1", "1x2x2"]


@pytest.mark.parametrize("config", SEQUENCE_PARALLEL)
def test_sequence_parallel_gives_the_loss_curve_of_one_process(train, reference, config):
    """--sp: the residual stream split along the sequence on the tensor-parallel axis
    (and sent that way between pipeline stages)."""
    history = _run_config(train, config, TINY + ["--sp"])
    np.testing.assert_allclose(history, reference, rtol=1e-9, atol=0)


# interleaved 1F1B: 4 layers, 2 virtual stages per device (the one-process curve of 4 layers)
TINY4 = [a if a != "2" or TINY[i - 1] != "--layers" else "4" for i, a in enumerate(TINY)]
INTERLEAVED = ["1x1x2", "2x1x2", "1x2x2"]


@pytest.fixture(scope="module")
def reference4(train):
    return train.run(TINY4 + ["--simulate", "1"])


@pytest.mark.parametrize("config", INTERLEAVED)
def test_interleaved_gives_the_loss_curve_of_one_process(train, reference4, config):
    history = _run_config(train, config,
                          TINY4 + ["--schedule", "interleaved", "--virtual-stages", "2"])
    np.testing.assert_allclose(history, reference4, rtol=1e-9, atol=0)


@pytest.mark.parametrize("options, message", [
    (["--pp", "2", "--virtual-stages", "2"], "--virtual-stages 2 needs --schedule interleaved"),
    (["--pp", "2", "--schedule", "interleaved", "--virtual-stages", "2", "--layers", "6"],
     "--virtual-stages 2 does not divide the layers: --layers 6 must be a multiple of --pp x "
     "--virtual-stages = 4"),
    (["--pp", "2", "--schedule", "interleaved", "--virtual-stages", "2", "--layers", "4",
      "--micro-batches", "1"], "--schedule interleaved needs --micro-batches >= --pp"),
    (["--sp"], "--sp splits the sequence over the tensor-parallel ranks and needs --tp > 1"),
    # the README's rule holds with one chunk too (interleaved with v = 1 is 1F1B's order)
    (["--pp", "2", "--schedule", "interleaved", "--micro-batches", "1"],
     r"--schedule interleaved needs --micro-batches >= --pp \(got 1 < 2\)"),
    (["--heads", "3"], r"train.py: --hidden 16 must be a multiple of --heads 3 .*--heads 4"),
])
def test_pipeline_options_are_checked_before_training(train, options, message):
    with pytest.raises(SystemExit, match=message):
        train.run(TINY + options + ["--simulate", "2"])


def test_interleaved_schedule_needs_as_many_micro_batches_as_stages():
    from ctensor.nn.pipeline import device_orders
    with pytest.raises(ValueError, match="needs at least as many micro-batches as pipeline"):
        device_orders(2, 1, "interleaved", 1)
    assert device_orders(2, 2, "interleaved", 1) == device_orders(2, 2, "1f1b")


def _script(argv: list, **env):
    """``python examples/gpt/<argv>`` in a subprocess (stdout, stderr apart)."""
    import os
    import subprocess
    import sys
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("CTENSOR_", "OMPI_",
                                                                         "PMI_", "PMIX_"))}
    environ.update(OPENBLAS_NUM_THREADS="1", **env)
    return subprocess.run([sys.executable, str(TRAIN.parent / argv[0]), *argv[1:]],
                          env=environ, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(MPI_MODE, reason="starts processes of its own")
def test_bad_heads_is_a_message_not_a_traceback():
    proc = _script(["train.py", "--heads", "3", "--steps", "1", "--no-progress"])
    assert proc.returncode != 0, proc.stdout
    assert proc.stderr.startswith("train.py: --hidden 64 must be a multiple of --heads 3"), \
        proc.stderr
    assert "Traceback" not in proc.stderr and "corpus:" not in proc.stdout, proc.stderr


@pytest.mark.skipif(MPI_MODE, reason="starts processes of its own")
def test_plot_without_matplotlib_fails_before_training(tmp_path):
    """--plot used to train to the end, then print that matplotlib is missing and exit 0
    with no file; now it is a usage error first (a matplotlib that fails to import stands
    for a missing one, whether or not this machine has it)."""
    hidden = tmp_path / "site" / "matplotlib"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('no matplotlib (hidden by the test)')\n")
    proc = _script(["train.py", "--plot", str(tmp_path / "loss.png"), "--steps", "200",
                    "--no-progress"], PYTHONPATH=str(tmp_path / "site"))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "train.py: error: --plot" in proc.stderr and "needs matplotlib" in proc.stderr, \
        proc.stderr
    assert "corpus:" not in proc.stdout and not (tmp_path / "loss.png").exists()
    # a .svg timeline needs nothing, a .png one is refused the same way
    proc = _script(["train.py", "--timeline", str(tmp_path / "t.png"), "--steps", "1"],
                   PYTHONPATH=str(tmp_path / "site"))
    assert proc.returncode == 2 and "--timeline" in proc.stderr, proc.stderr


def test_plan_quick_lets_explicit_options_win():
    """plan.py --quick sets a small model, but options given with it are kept (it used to
    override --tp and --hidden silently)."""
    spec = importlib.util.spec_from_file_location("gpt_plan", TRAIN.parent / "plan.py")
    plan = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plan)
    quick = plan.parse_args(["--quick"])
    assert (quick.dp, quick.tp, quick.hidden, quick.heads) == (2, 2, 256, 8)
    mine = plan.parse_args(["--quick", "--tp", "4", "--hidden", "512"])
    assert (mine.dp, mine.tp, mine.hidden, mine.heads) == (2, 4, 512, 8)
    assert plan.parse_args(["--tp", "4", "--quick"]).tp == 4  # before or after --quick


def test_timeline_of_the_last_step(train, tmp_path):
    path = tmp_path / "timeline.svg"
    log = tmp_path / "log.jsonl"
    sim = [] if MPI_MODE else ["--simulate", "2"]
    if MPI_MODE and ct.world_size() != 2:
        pytest.skip("a 1x1x2 run needs exactly 2 ranks")
    train.run(TINY + ["--pp", "2", "--timeline", str(path), "--log-json", str(log)] + sim)
    if ct.rank() != 0:
        return
    assert path.read_text().startswith("<svg")
    import json
    summary = json.loads(log.read_text().splitlines()[-1])["timeline"]
    assert summary["kind"] == "1f1b" and summary["num_stages"] == 2
    assert summary["peak_live_micro_batches"] == {"0": 2, "1": 1}
    assert summary["theoretical_idle"] == pytest.approx(1 / 3)


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


# mixture of experts: the experts split over an expert axis carved out of data parallel
MOE = ["--moe-experts", "4", "--moe-capacity-factor", "1.0"]
EXPERT_PARALLEL = ["2x1x1", "4x1x1", "2x2x1", "2x1x2"]  # --ep 2 each: EP, EP x DP, ETP, x PP


@pytest.fixture(scope="module")
def moe_reference(train):
    return train.run(TINY + MOE + ["--simulate", "1"])


@pytest.mark.parametrize("config", EXPERT_PARALLEL)
def test_expert_parallel_gives_the_loss_curve_of_one_process(train, moe_reference, config):
    """--moe-experts 4 --ep 2 (tokens dropped at capacity factor 1): the routing groups are
    the sequences, so the dropped tokens, and the curve, are one process's."""
    history = _run_config(train, config, TINY + MOE + ["--ep", "2"])
    np.testing.assert_allclose(history, moe_reference, rtol=1e-9, atol=0)
    assert history[-1] < history[0]


@pytest.mark.parametrize("config, extra", [
    ("2x1x1", ["--fsdp"]), ("2x2x1", ["--fsdp", "zero2", "--recompute", "selective"]),
    ("2x2x1", ["--sp", "--recompute"]), ("4x1x1", ["--fsdp"])],
    ids=["ep2-fsdp", "ep2xtp2-zero2-selective", "ep2xtp2-sp-recompute", "ep2xdp2-fsdp"])
def test_expert_parallel_composes(train, moe_reference, config, extra):
    """EP 2 with FSDP (the experts, split over the data axis when --ep = --dp, are kept as
    laid out and never gathered; the rest fully sharded), sequence parallel and recompute:
    one process's loss curve (dropout on)."""
    history = _run_config(train, config, TINY + MOE + ["--ep", "2"] + extra)
    np.testing.assert_allclose(history, moe_reference, rtol=1e-9, atol=0)


FP16 = [a if a != "float64" else "float32" for a in TINY] + ["--precision", "fp16"]


@pytest.mark.parametrize("layout, size", [
    (MOE + ["--dp", "2", "--ep", "2"], 2), (["--cp", "2"], 2), (["--dp", "2", "--cp", "2"], 4)],
    ids=["ep2", "cp2", "dp2xcp2"])
def test_expert_and_context_parallel_in_mixed_precision(train, layout, size):
    """--precision fp16 (float16 compute, float32 master weights, loss scaling) with expert
    parallel and context parallel: the one-process fp16 curve within float16 rounding."""
    if MPI_MODE and ct.world_size() != size:
        pytest.skip(f"needs exactly {size} ranks")
    moe = layout[:len(MOE)] if layout[:len(MOE)] == MOE else []
    want = train.run(FP16 + moe + ["--simulate", "1"])
    got = train.run(FP16 + layout + ([] if MPI_MODE else ["--simulate", str(size)]))
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=0)
    assert got[-1] < got[0]
