"""ct.debug.profile(): the step profile's columns, table and Chrome trace (ctensor/profile.py)."""
from __future__ import annotations

import json
import os
import tempfile

import numpy as np
import pytest

import ctensor as ct
import ctensor.nn as nn
import ctensor.optim as optim
from ctensor import profile as profile_module
from ctensor import timing
from conftest import MPI_MODE, world

COLUMNS = profile_module.COLUMNS


def _train(steps: int, prof=None, foreach=False):
    """A data-parallel MLP over every rank of the world: forward, backward (one bucket),
    clip inside the optimizer phase, AdamW."""
    pl = ct.placement("cpu", list(range(ct.world_size())))
    ct.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    model.to_global(pl, (ct.sbp.broadcast,))
    opt = optim.AdamW(model.parameters(), lr=1e-2, foreach=foreach)  # (False: one op each)
    x = ct.randn(8, 16, placement=pl, sbp=(ct.sbp.split(0),))
    losses = []
    for _ in range(steps):
        loss = (model(x) ** 2).mean()
        loss.backward()
        with ct.debug.profile.phase("optimizer"):
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        opt.zero_grad()
        losses.append(float(loss.item()))
        if prof is not None:
            prof.step()
    return losses


def test_columns_add_up_and_name_the_work():
    with world(2):
        with ct.debug.profile() as prof:
            _train(3, prof)
        assert not timing.on  # closed: the hooks are off again
        totals = dict(zip(COLUMNS, prof.totals))
        # every moment charged once: the columns sum to the wall time
        assert sum(prof.totals) == pytest.approx(prof.wall, rel=1e-6)
        for col in ("forward kernels", "backward kernels", "dispatch/tape", "optimizer",
                    "boxing copies"):
            assert totals[col] > 0, (col, totals)
        if MPI_MODE:  # real collectives: time inside MPI, and in the members' agreement
            assert totals["collectives"] > 0 and totals["waiting"] > 0
        names = {e[0] for e in prof.events}
        assert {"fused_adam", "backward", "optimizer"} <= names, sorted(names)
        kernels = {COLUMNS[e[1]] for e in prof.events if e[0] == "fused_adam"}
        assert "optimizer" in kernels  # an optimizer kernel is charged to the optimizer
        assert prof.steps == 3
        table = prof.table()
        lines = table.splitlines()
        assert "3 steps" in lines[0] and "fwd kernel" in lines[1]
        rows = lines[2:-1]
        assert len(rows) == (ct.world_size() if MPI_MODE else 1)
        assert lines[-1].startswith("share") and lines[-1].endswith("100%")


def test_the_step_plan_has_its_own_column():
    """Recording a step and the solve that learns its plan are charged to "step plan" (the
    solve, a one-off of tens of milliseconds, used to read as "rest": the loop's own
    code); the steps after the plan is learned record nothing there."""
    with world(2):
        ct.step_plan(True)  # (on afresh: an earlier test's loop may have made it give up)
        with ct.debug.profile() as prof:
            _train(4, prof, foreach=None)  # (one op per parameter: its step attribute
        report = ct.debug.step_plan()      # differs every step, so the loop never repeats)
        assert report.learned == 1 and report.idle  # (a data-parallel MLP: idle, "same")
        totals = dict(zip(COLUMNS, prof.totals))
        assert totals["step plan"] > 0
        solves = [e for e in prof.events if e[0] == "step plan solve"]
        assert len(solves) == 1 and COLUMNS[solves[0][1]] == "step plan"
        assert solves[0][3] == pytest.approx(report.solve_seconds, rel=0.5, abs=2e-3)
        assert "step plan" in prof.table().splitlines()[1]
        with ct.debug.profile() as later:  # learned and idle: nothing recorded any more
            _train(2, later, foreach=None)
        assert later.totals[COLUMNS.index("step plan")] == 0
        ct.step_plan(ct.stepplan.DEFAULT_ON)


def test_chrome_trace_one_row_per_rank():
    with world(2):
        with ct.debug.profile() as prof:
            _train(2, prof)
        d = os.environ.get("CTENSOR_TEST_TMP") or tempfile.mkdtemp()
        path = os.path.join(d, "profile_trace.json")
        prof.export_chrome_trace(path)
        if ct.rank() == 0:
            with open(path) as f:
                trace = json.load(f)
            events = trace["traceEvents"]
            rows = {e["args"]["name"] for e in events if e["name"] == "process_name"}
            assert len(rows) == (ct.world_size() if MPI_MODE else 1), rows
            spans = [e for e in events if e["ph"] == "X"]
            assert spans and all(e["dur"] >= 0 and e["cat"] in COLUMNS for e in spans)
            assert {e["pid"] for e in spans} == {e["pid"] for e in events
                                                  if e["name"] == "process_name"}


def test_same_numbers_with_and_without_profile():
    with world(2):
        plain = _train(3, foreach=None)
        with ct.debug.profile() as prof:
            profiled = _train(3, foreach=None)
        assert plain == profiled
        assert prof.totals[COLUMNS.index("optimizer")] > 0  # the multi-tensor update too


def test_max_events_bounds_the_trace_not_the_table():
    with world(2):
        with ct.debug.profile(max_events=5) as prof:
            _train(1, prof)
        assert len(prof.events) == 5 and prof.counted > 5
        assert sum(prof.totals) == pytest.approx(prof.wall, rel=1e-6)


def test_bad_input_and_nesting():
    with pytest.raises(ValueError, match="max_events"):
        ct.debug.profile(max_events=-1)
    with pytest.raises(ValueError, match="phase"):
        ct.debug.profile.phase("forward")
    with ct.debug.profile():
        with pytest.raises(RuntimeError, match="already open"):
            with ct.debug.profile():
                pass
    assert not timing.on
    with ct.debug.profile() as prof:
        pass
    with pytest.raises(ValueError, match="path"):
        prof.export_chrome_trace("")
    assert "closed" in repr(prof)


def test_phase_without_profile_is_a_no_op():
    with ct.debug.profile.phase("optimizer"):
        x = ct.tensor(np.ones(3)) * 2
    assert x.numpy().tolist() == [2.0, 2.0, 2.0]


def test_train_py_profile_prints_the_table_and_writes_the_trace(capsys):
    import importlib.util
    from pathlib import Path
    script = Path(__file__).resolve().parent.parent / "examples" / "gpt" / "train.py"
    spec = importlib.util.spec_from_file_location("gpt_train_profile", script)
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    d = os.environ.get("CTENSOR_TEST_TMP") or tempfile.mkdtemp()
    path = os.path.join(d, "train_profile.json")
    args = ["--layers", "2", "--hidden", "16", "--heads", "2", "--seq-len", "8",
            "--global-batch", "4", "--steps", "5", "--no-progress", "--profile", path]
    if MPI_MODE:
        if ct.world_size() != 2:
            pytest.skip("needs exactly 2 ranks")
        args += ["--dp", "2"]
    else:
        args += ["--dp", "2", "--simulate", "2"]
    plain = train.run([a for a in args if a not in ("--profile", path)])
    assert train.run(args) == plain  # the profile changes no number
    out = capsys.readouterr().out
    if ct.rank() == 0:
        assert "step profile (ms per step; 2 steps" in out and "optimizer" in out
        with open(path) as f:
            assert json.load(f)["traceEvents"]
