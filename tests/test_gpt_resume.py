"""examples/gpt/train.py --save-every / --keep / --resume: a run killed with SIGKILL at a
random step after a periodic (asynchronous) save, resumed from its newest complete
checkpoint on another layout, continues the loss curve of the run that was never killed.

What "bit for bit" can mean across layouts: data and tensor parallelism sum in another order
(the weights of a 2x1x1 run differ from a 1x1x1 run's in their last bits), so the resumed
half is compared exactly with the same resume from the uncut run's checkpoint of that step,
and that checkpoint must equal the killed run's in every bit; a resume on the same layout
must give the uncut run's curve exactly. Against the uncut curve the cross-layout one is
within 1e-12.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import ctensor as ct
from conftest import MPI_MODE

pytestmark = pytest.mark.skipif(MPI_MODE, reason="starts and kills processes of its own; "
                                                 "the layouts run simulated")

TRAIN = Path(__file__).resolve().parent.parent / "examples" / "gpt" / "train.py"
STEPS, EVERY = 8, 2
TINY = ["--layers", "2", "--hidden", "16", "--heads", "2", "--seq-len", "8",
        "--global-batch", "4", "--micro-batches", "2", "--steps", str(STEPS),
        "--dtype", "float64", "--dropout", "0.1", "--no-progress", "--lr", "1e-2"]


def child_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI", "OMPI", "PMIX"))}
    env["OPENBLAS_NUM_THREADS"] = "1"
    return env


@pytest.fixture(scope="module")
def child_corpus() -> str:
    """The corpus a fresh process builds. This process's may differ: the corpus is the
    docstrings of live stdlib objects, and importing torch (other test files do) replaces
    ``inspect.getfile``, which then drops out of it."""
    return subprocess.run([sys.executable, "-c", "import sys, data; "
                           "sys.stdout.write(data.corpus_text())"], cwd=TRAIN.parent,
                          env=child_env(), capture_output=True, text=True, check=True,
                          timeout=60).stdout


@pytest.fixture
def train(child_corpus, monkeypatch):
    """train.py as a module, its runs in this process on the corpus of the killed one."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("gpt_train_resume", TRAIN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import data
    monkeypatch.setattr(data, "corpus_text", lambda: child_corpus)
    return mod


def layout(config: str) -> list:
    dp, tp, pp = map(int, config.split("x"))
    return ["--dp", str(dp), "--tp", str(tp), "--pp", str(pp), "--simulate", str(dp * tp * pp)]


def complete(save: Path) -> list:
    return sorted(p.name for p in save.glob("step-*") if (p / "COMPLETE").exists())


def run_and_kill(config: str, save: Path, log: Path, kill_after: int) -> tuple:
    """train.py on ``config`` in a process of its own, SIGKILLed at the first step from
    ``kill_after`` on that a periodic checkpoint is complete by; the losses it logged by
    step, and the step it was killed after."""
    proc = subprocess.Popen([sys.executable, str(TRAIN), *TINY, *layout(config),
                             "--save", str(save), "--save-every", str(EVERY),
                             "--log-json", str(log)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=child_env())
    losses: dict = {}
    deadline = time.monotonic() + 120
    try:
        while not (losses and max(losses) >= kill_after and complete(save)):
            assert proc.poll() is None, f"train.py ended first: {proc.stderr.read().decode()}"
            assert time.monotonic() < deadline, "train.py never reached the step"
            if log.exists():
                for line in log.read_text().splitlines():
                    if line.endswith("}"):
                        row = json.loads(line)
                        if "step" in row:
                            losses[row["step"]] = row["loss"]
            time.sleep(0.002)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return losses, max(losses)


def only(save: Path, step: int, into: Path) -> Path:
    """A save directory holding just ``save``'s checkpoint of ``step``."""
    into.mkdir()
    name = f"step-{step:06d}"
    shutil.copytree(save / name, into / name)
    return into


def assert_same_state(a: dict, b: dict, where: str = "") -> None:
    assert type(a) is type(b), where
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same_state(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{where}.{i}")
    elif isinstance(a, ct.Tensor):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=where)
    else:
        assert a == b, where


@pytest.mark.parametrize("killed, resumed", [("1x1x1", "1x2x1"), ("2x1x1", "1x1x2")])
def test_killed_run_resumes_on_another_layout(train, tmp_path, killed, resumed):
    uncut_dir = tmp_path / "uncut"
    uncut = train.run(TINY + layout(killed) + ["--save", str(uncut_dir), "--save-every",
                                               str(EVERY), "--keep", str(STEPS)])
    kill_after = int(np.random.default_rng().integers(EVERY, STEPS - 2))  # after a save
    killed_dir = tmp_path / "killed"
    logged, kill_after = run_and_kill(killed, killed_dir, tmp_path / "log.jsonl", kill_after)
    why = f"killed after step {kill_after}"
    newest = complete(killed_dir)[-1]
    # its checkpoint is the uncut run's, every bit: model, optimizer, schedule, RNG, data
    assert_same_state(ct.load(str(killed_dir / newest)), ct.load(str(uncut_dir / newest)))
    resumed_part = train.run(TINY + layout(resumed) + ["--save", str(killed_dir),
                                                       "--save-every", str(EVERY), "--resume"])
    start = STEPS - len(resumed_part)
    assert f"step-{start:06d}" == newest, why
    curve = [logged[s] for s in range(start)] + resumed_part
    # the killed run, with its saves in flight, is the uncut run until it died
    assert [logged[s] for s in sorted(logged)] == uncut[:len(logged)], why
    # so resuming it on the other layout gives what resuming the uncut run's gives
    again = train.run(TINY + layout(resumed) + [
        "--save", str(only(uncut_dir, start, tmp_path / "copy")), "--save-every", str(EVERY),
        "--resume"])
    assert curve == uncut[:start] + again, why
    np.testing.assert_allclose(curve, uncut, rtol=1e-12, atol=0, err_msg=why)
    # and on the same layout, the uncut curve exactly
    same = train.run(TINY + layout(killed) + [
        "--save", str(only(uncut_dir, start, tmp_path / "same")), "--save-every", str(EVERY),
        "--resume"])
    assert uncut[:start] + same == uncut, why
    # the run keeps the last --keep (2) complete checkpoints, the final one among them
    kept = sorted(p.name for p in killed_dir.iterdir())
    assert kept == [f"step-{STEPS - EVERY:06d}", f"step-{STEPS:06d}"], kept


@pytest.mark.parametrize("options, message", [
    (["--save-every", "2"], "--save-every needs --save"),
    (["--save", "d", "--resume"], "--resume needs --save DIR --save-every N"),
    (["--save", "d", "--save-every", "2", "--resume", "--load", "e"], "--resume and --load"),
    (["--save", "d", "--save-every", "0"], "expected an integer >= 1"),
])
def test_checkpoint_options_are_checked_before_training(train, capsys, options, message):
    with pytest.raises(SystemExit) as info:
        train.parse_args(TINY + options)
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_resume_skips_a_damaged_checkpoint(train, tmp_path, capsys):
    """--resume verifies what it loads: a flipped bit in the newest checkpoint makes it
    resume from the one before, and the curve is still the uncut run's."""
    save = tmp_path / "ckpt"
    uncut = train.run(TINY + layout("1x1x1") + ["--save", str(save), "--save-every", str(EVERY),
                                                "--keep", "2"])
    newest = save / f"step-{STEPS:06d}"
    shard = newest / "t0_r0.npy"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    rest = train.run(TINY + layout("1x1x1") + ["--save", str(save), "--save-every", str(EVERY),
                                              "--resume"])
    out = capsys.readouterr().out
    assert f"skipping checkpoint {newest}" in out and "checksum" in out
    assert uncut[:STEPS - EVERY] + rest == uncut
