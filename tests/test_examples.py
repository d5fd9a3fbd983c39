"""Everything the README tells a user to run runs, as written (with small sizes).

The commands are read from ``README.md`` itself, so a command added there is run here and
one this file cannot run fails it:

* every fenced block must name its language: ``bash`` blocks hold commands (one per line,
  ``#`` comments dropped), ``python`` blocks are run as scripts, ``text`` blocks (pictures)
  are not run;
* an inline code span that starts with ``python `` or ``mpiexec `` is a command too;
* a command is ``[mpiexec -n N] python <script under examples/ or benchmarks/> [options]``
  and runs from the repository root exactly so, under ``mpiexec -n N`` where the README says
  so (simulation cannot catch a collective that only one rank calls), with one BLAS thread
  per rank and ``CTENSOR_TIMEOUT`` so a hang fails in seconds. The exceptions, each explicit:
  the install-and-test block (exactly ``pip install -e ".[test]"`` and ``pytest``: this is
  that run) and ``GENERIC`` (the README's ``script.py`` pattern, not a file).

How a command is made small (``adapt``): a benchmark gets ``--quick``; ``train.py`` gets
``TINY_GPT``, a tiny model and 2 steps (appended: argparse takes the last value); the output
options in ``OUTPUTS`` are pointed into a temporary directory, so no README command
overwrites a file of the repository (``--plot docs/gpt_loss_2x2x1.png``); a command that
sets ``--layers`` (virtual stages need enough of them) keeps its own. ``--plot`` and a
``--timeline`` PNG need matplotlib, which CI does not install: with it the PNG must be
written, without it train.py (plan.py) must refuse the option before training (planning):
exit 2, saying that it needs matplotlib; a ``--timeline`` SVG is always written. ``plan.py`` gets ``--quick`` with
the command's size options left out (explicit ones would win over ``--quick``'s). ``benchmarks/gpu_check.py`` without a usable GPU must say
so and exit with status 2 (nothing was checked): that is a skip; with a GPU it must pass.

These tests start processes of their own, so they are skipped when the suite itself runs
under mpiexec (``tests/test_mpi.py``).
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import MPI_MODE

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SCRIPT_DIRS = ["benchmarks", "examples"]
# what the scripts import besides the standard library: a file of that name would shadow it
IMPORTED = {"numpy", "mpi4py", "ctensor", "torch", "cupy", "matplotlib", "tqdm"}
SETUP = ['pip install -e ".[test]"', "pytest"]  # the README's install-and-test block
GENERIC = {"python script.py", "mpiexec -n 4 python script.py"}  # "Running": the pattern
TINY_GPT = ["--steps", "2", "--layers", "2", "--hidden", "16", "--heads", "2", "--seq-len", "8",
            "--global-batch", "8", "--no-progress"]
OUTPUTS = {"--plot", "--save", "--log-json", "--timeline", "--output"}  # options naming a file
#: the options plan.py --quick sets (plan.QUICK): a README command's own would win over them
PLAN_SIZES = {"--dp", "--tp", "--pp", "--layers", "--hidden", "--heads", "--seq-len",
              "--global-batch", "--micro-batches", "--vocab"}
TIMEOUT_S = 180  # per command; a hang fails sooner, through CTENSOR_TIMEOUT
SLOW = {"benchmarks/gpu_check.py": 420}  # with a GPU its --quick run takes up to ~5 min
NO_GPU_EXIT = 2  # gpu_check.py: "no usable GPU here; nothing was checked"
LAUNCHER_VARS = ("PMI_", "OMPI_", "PMIX_", "MPI_LOCALRANKID", "HYDRA_")


@dataclass(frozen=True)
class Command:
    text: str  # as the README writes it
    line: int  # where

    def __str__(self) -> str:
        return self.text


def _commands_of(text: str, first_line: int) -> list:
    """The commands of a bash block: one a line (``\\`` continues it), comments dropped."""
    out, pending, start = [], "", 0
    for i, raw in enumerate(text.splitlines()):
        code = "" if raw.lstrip().startswith("#") else raw.split(" #")[0].strip()
        start = i if not pending else start
        line = pending + code
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if line:
            out.append(Command(" ".join(line.split()), first_line + start))
    return out


def readme() -> tuple:
    """``(commands, python_blocks, problems)`` of the README: every command (bash lines and
    command spans, first occurrence each), every python block, and what cannot be read."""
    text = README.read_text()
    commands, blocks, problems = [], [], []
    prose = []
    fence = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
    last = 0
    for m in fence.finditer(text):
        prose.append((text[last:m.start()], text.count("\n", 0, last)))
        last = m.end()
        lang, body = m.group(1).strip(), m.group(2)
        line = text.count("\n", 0, m.start()) + 2
        if lang == "bash":
            commands += _commands_of(body, line)
        elif lang == "python":
            blocks.append((line, body))
        elif lang != "text":
            problems.append(f"README.md:{line - 1}: a fenced block must say bash, python or "
                            f"text (got {lang!r}) so that this test knows whether to run it")
    prose.append((text[last:], text.count("\n", 0, last)))
    for chunk, offset in prose:
        for m in re.finditer(r"`([^`]+)`", chunk):
            span = " ".join(m.group(1).split())
            if span.startswith(("python ", "mpiexec ")):
                commands.append(Command(span, offset + chunk.count("\n", 0, m.start()) + 1))
    seen, unique = set(), []
    for c in commands:
        if c.text not in seen:
            seen.add(c.text)
            unique.append(c)
    return unique, blocks, problems


COMMANDS, PYTHON_BLOCKS, PROBLEMS = readme()
RUNNABLE = [c for c in COMMANDS if c.text not in GENERIC and c.text not in SETUP]


def split(command: Command) -> tuple | None:
    """``(nprocs or None, script path, options)``, or None for a command of another form."""
    words = shlex.split(command.text)
    nprocs = None
    if words[:2] == ["mpiexec", "-n"] and len(words) > 2 and words[2].isdigit():
        nprocs, words = int(words[2]), words[3:]
    if len(words) < 2 or words[0] != "python" or not words[1].endswith(".py"):
        return None
    return nprocs, ROOT / words[1], words[2:]


def parse(command: Command) -> tuple:
    """:func:`split`, failing the test for a command it cannot run."""
    parts = split(command)
    if parts is None:
        pytest.fail(f"README.md:{command.line}: `{command}` is not `[mpiexec -n N] python "
                    f"<script>.py [options]`: this test cannot run it; write it so, or add it "
                    f"with a reason to the exceptions in tests/test_examples.py")
    script = parts[1]
    if not script.is_file() or script.parent.relative_to(ROOT).parts[0] not in SCRIPT_DIRS:
        pytest.fail(f"README.md:{command.line}: `{command}` names "
                    f"{script.relative_to(ROOT)}, which is not a script under "
                    f"{' or '.join(SCRIPT_DIRS)}/")
    return parts


def adapt(script: Path, options: list, tmp_path: Path) -> tuple:
    """The options made small, outputs moved into ``tmp_path``; and the files expected."""
    options, outputs = list(options), {}
    for i, word in enumerate(options[:-1]):
        if word in OUTPUTS:
            outputs[word] = options[i + 1] = str(tmp_path / Path(options[i + 1]).name)
    rel = script.relative_to(ROOT).as_posix()
    if rel == "examples/gpt/plan.py":  # explicit sizes win over --quick's: drop them
        keep, skip = [], False
        for word in options:
            if skip:
                skip = False
            elif word in PLAN_SIZES:
                skip = True
            else:
                keep.append(word)
        options = keep + ["--quick"]
    elif rel.startswith("benchmarks/"):
        options.append("--quick")
    elif rel == "examples/gpt/train.py":
        tiny = list(TINY_GPT)
        if "--layers" in options:  # a command with virtual stages needs its layers
            del tiny[tiny.index("--layers"):tiny.index("--layers") + 2]
        options += tiny
    return options, outputs


def mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else "mpiexec"


def run(argv: list, stdin: str | None = None,
        timeout: int = TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run ``argv`` from the repository root; on a timeout kill its whole process group
    (mpiexec and every rank) and fail."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_VARS)}
    env.update(PYTHONUNBUFFERED="1", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1", CTENSOR_TIMEOUT="30")
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, text=True, start_new_session=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(argv)} ran past {timeout} s (a hang?):\n{out[-2000:]}"
                    f"\n{err[-2000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


# ----------------------------------------------------------------------------- the README
def test_readme_is_readable():
    assert not PROBLEMS, "\n".join(PROBLEMS)
    texts = {c.text for c in COMMANDS}
    assert GENERIC <= texts, f"no longer in the README, drop from GENERIC: {GENERIC - texts}"
    assert RUNNABLE, "no command found in README.md"


def test_install_and_test_is_two_commands():
    section = README.read_text().split("## Install and test", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    assert [c.text for c in _commands_of(block, 0)] == SETUP


def test_every_script_is_in_the_readme():
    named = {parts[1] for parts in map(split, RUNNABLE) if parts}
    scripts = {p for folder in SCRIPT_DIRS for p in (ROOT / folder).rglob("*.py")
               if 'if __name__ == "__main__":' in p.read_text()}
    missing = sorted(str(p.relative_to(ROOT)) for p in scripts - named)
    assert not missing, f"scripts the README never tells how to run (so CI never runs): {missing}"


def test_no_script_shadows_a_module():
    # ``python benchmarks/x.py`` puts benchmarks/ first on sys.path, so a benchmarks/random.py
    # is what ``import random`` (inside numpy, via secrets) finds
    taken = set(sys.stdlib_module_names) | IMPORTED
    clashes = [str(path.relative_to(ROOT)) for folder in SCRIPT_DIRS
               for path in (ROOT / folder).rglob("*")
               if "__pycache__" not in path.parts
               and (path.suffix == ".py" or path.is_dir()) and path.stem in taken]
    assert not clashes, f"rename these: they shadow a module the scripts import: {clashes}"


@pytest.mark.skipif(MPI_MODE, reason="starts processes of its own")
@pytest.mark.timeout(max(TIMEOUT_S, *SLOW.values()) + 30)
@pytest.mark.parametrize("command", RUNNABLE, ids=str)
def test_readme_command_runs(command, tmp_path):
    nprocs, script, options = parse(command)
    options, outputs = adapt(script, options, tmp_path)
    argv = [sys.executable, str(script)] + options
    if nprocs is not None:
        argv = [mpiexec(), "-n", str(nprocs)] + argv
    proc = run(argv, timeout=SLOW.get(script.relative_to(ROOT).as_posix(), TIMEOUT_S))
    log = f"{' '.join(argv)}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    pictures = [f"{o} {p}" for o, p in outputs.items() if o == "--plot" or
                (o == "--timeline" and not p.endswith(".svg"))]
    if pictures and not _has_matplotlib():  # train.py or plan.py
        # a picture it cannot draw is a usage error before training, not a surprise after
        assert proc.returncode == 2, f"README.md:{command.line}: exit {proc.returncode}\n{log}"
        assert all(w in proc.stderr for w in pictures) and "needs matplotlib" in \
            proc.stderr.replace("need matplotlib", "needs matplotlib"), log
        assert "done " not in proc.stdout and "corpus:" not in proc.stdout, log
        return
    if script.name == "gpu_check.py" and proc.returncode == NO_GPU_EXIT:
        import ctensor as ct
        assert not ct.cuda.is_available(), f"a GPU is usable, yet gpu_check checked nothing\n{log}"
        assert "no usable GPU" in proc.stdout, log
        pytest.skip("no usable GPU here: gpu_check.py says so and checks nothing (exit 2)")
    assert proc.returncode == 0, f"README.md:{command.line}: `{command}` failed\n{log}"
    assert proc.stdout.strip(), f"`{command}` printed nothing\n{log}"
    for option, path in outputs.items():
        assert Path(path).exists(), f"`{command}`: {option} wrote no {path}\n{log}"


@pytest.mark.skipif(MPI_MODE, reason="starts processes of its own")
@pytest.mark.parametrize("script", sorted({parts[1] for parts in map(split, RUNNABLE) if parts}),
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_script_rejects_a_bad_option(script):
    # a mistyped option is a usage error naming it, never silently ignored or a traceback
    proc = run([sys.executable, str(script), "--no-such-option"])
    assert proc.returncode == 2 and "unrecognized arguments: --no-such-option" in proc.stderr, \
        proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]


@pytest.mark.skipif(MPI_MODE, reason="starts processes of its own")
@pytest.mark.parametrize("line, block", PYTHON_BLOCKS, ids=lambda v: str(v)[:12])
def test_readme_python_block_runs(line, block):
    proc = run([sys.executable, "-"], stdin=block)
    assert proc.returncode == 0, f"README.md:{line}: the python block failed:\n{proc.stderr}"


def _has_matplotlib() -> bool:
    import importlib.util
    return importlib.util.find_spec("matplotlib") is not None


# ----------------------------------------------------------------------------- details
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


@pytest.mark.parametrize("tie_weights", [True, False])
def test_gpt_floor_computes_ctensors_step(tie_weights):
    """benchmarks/gpt.py's floor runs gpt_reference.step: it must be ctensor's GPT step
    (loss and every gradient, float64), or the floor times another computation."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpt_reference
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert gpt_reference.check_against_ctensor(tie_weights=tie_weights) < 1e-9
