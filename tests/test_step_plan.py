"""The step plan (ctensor/stepplan.py, ctensor/stepsolve.py): a training step's op sequence
learned once, every op's layouts chosen jointly, the choice replayed on the steps that
repeat it.

The models are the PyTorch-style Llama and nanoGPT of tests/test_pytorch_programs.py (not
ctensor's own GPT, Block or fused LayerNorm), laid out by SBP rules alone. After warm-up
steps (a window that repeats the one before it is solved at its end; the next replays
it), one forward + backward issues at most ``4L + 6`` collectives and at most 1.2x the
bytes per rank of the hand (Megatron) placement, and the values equal one process in
float64.
"""
from __future__ import annotations

import numpy as np
import pytest

import ctensor
from conftest import MPI_MODE, world
import test_pytorch_programs as programs
from test_pytorch_programs import CT, LLAMA_TP, NANOGPT_TP, B, S, float64, llama, nanogpt

LAYERS = 2  # both models' n_layers
WARMUP = 2  # recorded, then recorded again and solved (the loop repeats)
_LOCAL = ("slice", "pad_partial", "local", "relabel")


@pytest.fixture(autouse=True)
def fresh_plan():
    # (always: these tests are about what the plan does; on cpu placements the default
    # does not follow a plan whose saving is below its replay's cost, see the last tests)
    ctensor.step_plan(True, always=True)
    yield
    ctensor.step_plan(ctensor.stepplan.DEFAULT_ON)


def _needs_two_ranks():
    if MPI_MODE and ctensor.world_size() != 2:
        pytest.skip("a two-rank world (under mpiexec: -n 2)")


def _collectives(log):
    return [e for e in log if e.collective not in _LOCAL]


def _hand_bytes(batch=4, seq=8, dim=16, vocab=32, layers=LAYERS, data=1, shards=0):
    """Bytes per rank of one forward + backward with Megatron's placement (the comm log's
    convention: an all-reduce counts its buffer): the embedding's reduction, one all-reduce
    after each row-parallel linear (2L) forward, one into each norm's input (2L + 1) and the
    head input's gradient backward, the vocabulary-parallel loss's 3 row statistics, and
    the bucket of the replicated (norm) weights' gradients. With ``data`` > 1 (a (data,
    tensor) mesh) each rank holds 1/data of the batch and the bucket every parameter's
    shard (``shards`` bytes per rank)."""
    activation = batch * seq * dim * 8 // data
    reductions = 1 + 2 * layers + (2 * layers + 1) + 1
    bucket = shards if data > 1 else (2 * layers + 1) * dim * 8
    return reductions * activation + 3 * batch * seq * 8 // data + bucket


def _steps(build, rules, mesh_shape, batch_dim, n, sizes=None):
    """``n`` forward + backward steps of ``build`` on a mesh; per step the loss, the
    gradients and the comm log (``sizes``: a dict given the parameters' bytes per rank)."""
    arrays = programs.llama_batch()
    ctensor.manual_seed(0)
    model = build(*CT)
    ranks = np.arange(int(np.prod(mesh_shape))).reshape(mesh_shape).tolist()
    mesh = ctensor.placement("cpu", ranks)
    model.to_global(mesh, rules if rules is not None else (B,) * mesh.ndim)
    sbp = [B] * mesh.ndim
    if batch_dim is not None:
        sbp[0] = S(batch_dim)
    inputs = [ctensor.tensor(a).to_global(mesh, tuple(sbp)) for a in arrays]
    if sizes is not None:
        sizes["shards"] = sum(p._layout.local_nbytes(0) for p in model.parameters())
    out = []
    for _ in range(n):
        with ctensor.debug.comm_log() as log:
            loss = programs._loss(model, inputs)
            loss.backward()
        grads = {name: p.grad.numpy() for name, p in model.named_parameters()}
        for p in model.parameters():
            p.grad = None
        out.append((float(loss.item()), grads, log))
    return out


def _reference(build):
    """One process (every tensor broadcast on the default placement), per-op choice."""
    with float64():
        ctensor.step_plan(False)
        return programs.run_ctensor(build, programs.llama_batch(), None)


def _check(build, rules, mesh_shape, batch_dim, most=4 * LAYERS + 6):
    if MPI_MODE and ctensor.world_size() != int(np.prod(mesh_shape)):
        pytest.skip(f"needs {int(np.prod(mesh_shape))} ranks")
    ref = _reference(build)
    with float64(), world(int(np.prod(mesh_shape))):
        ctensor.step_plan(True, always=True)
        sizes = {}
        runs = _steps(build, rules, mesh_shape, batch_dim, WARMUP + 2, sizes)
        report = ctensor.debug.step_plan()
    *_, (loss, grads, log), (loss2, _, log2) = runs
    assert report.replayed >= 2, report.summary()
    assert len(_collectives(log)) <= most, log.summary()
    hand = _hand_bytes() if len(mesh_shape) == 1 else _hand_bytes(data=mesh_shape[0],
                                                                   shards=sizes["shards"])
    assert log.total_bytes <= 1.2 * hand, (hand, log.summary())
    # every replayed step issues the same collectives
    assert [(e.op, e.collective, e.shape) for e in _collectives(log)] == \
        [(e.op, e.collective, e.shape) for e in _collectives(log2)]
    if ref is not None:
        _, ref_loss, ref_grads, _ = ref
        assert abs(loss - ref_loss) <= 1e-10 * abs(ref_loss)
        for name, g in ref_grads.items():
            np.testing.assert_allclose(grads[name], g, rtol=1e-10, atol=1e-12, err_msg=name)
    return runs, report


# ----------------------------------------------------------------------------- acceptance
def test_llama_tensor_parallel_by_sbp_rules_alone():
    runs, report = _check(llama, LLAMA_TP, (2,), None)
    per_op = runs[0][2]
    # the per-op choice reduces the partial residual stream at pow, mul and matmul
    assert len(_collectives(per_op)) > 4 * LAYERS + 6
    assert report.changed, report.summary()
    assert report.estimated[0] < report.estimated[1]


def test_llama_data_parallel():
    runs, _ = _check(llama, None, (2,), 0)
    log = runs[-1][2]
    big = [e for e in _collectives(log) if e.nbytes >= 1024]
    assert [e.op for e in big] == ["grad_sync"], log.summary()  # one gradient bucket


def test_llama_on_a_data_and_tensor_parallel_mesh():
    runs, _ = _check(llama, {k: (B, v) for k, v in LLAMA_TP.items()}, (2, 2), 0)
    log = runs[-1][2]
    # every gradient joins one bucket (the norm weights' too: their partial sums over the
    # tensor axis are not left for a bucket of their own)
    assert [e.op for e in _collectives(log)].count("grad_sync") == 1, log.summary()


def test_nanogpt_tensor_parallel_by_sbp_rules_alone():
    _check(nanogpt, NANOGPT_TP, (2,), None)


def test_nanogpt_on_a_data_and_tensor_parallel_mesh():
    _check(nanogpt, {k: (B, v) for k, v in NANOGPT_TP.items()}, (2, 2), 0)


# ----------------------------------------------------------------------------- behaviour
def test_off_switch_gives_the_per_op_choice():
    _needs_two_ranks()
    with float64(), world(2):
        ctensor.step_plan(False)
        runs = _steps(llama, LLAMA_TP, (2,), None, 3)
        assert ctensor.debug.step_plan().learned == 0
    counts = {len(_collectives(log)) for _, _, log in runs}
    assert len(counts) == 1 and counts.pop() > 4 * LAYERS + 6
    with pytest.raises(TypeError, match="step_plan"):
        ctensor.step_plan("no")


def test_a_failed_guard_is_silent_correct_and_counted():
    """A step that runs another sequence (here: another batch size, then a branch the plan
    never saw) falls back to the per-op choice, gives the values the per-op choice gives,
    and is counted; the next step follows the plan again (no solve for a one-off), and a
    lasting change (the smaller batch three times) is learned anew."""
    arrays = programs.llama_batch()
    _needs_two_ranks()
    with float64(), world(2):
        ctensor.step_plan(False)
        ctensor.manual_seed(0)
        model = llama(*CT)
        mesh = ctensor.placement("cpu", [0, 1])
        model.to_global(mesh, LLAMA_TP)
        small = [ctensor.tensor(a[:2]).to_global(mesh, (B,)) for a in arrays]
        full = [ctensor.tensor(a).to_global(mesh, (B,)) for a in arrays]

        def step(inputs, extra=False):
            loss = programs._loss(model, inputs)
            if extra:  # a data-dependent branch: one more op in the middle of the step
                loss = loss * 1.0
            loss.backward()
            grads = {n: p.grad.numpy() for n, p in model.named_parameters()}
            for p in model.parameters():
                p.grad = None
            return float(loss.item()), grads

        # replayed, another batch size (a deviation), twice the same again (replayed), a
        # branch the plan never saw (a deviation), the other batch size for good (two
        # deviations, the second repeats the first: learned; then replayed)
        sequence = [(full, False), (small, False), (full, False), (full, False),
                    (full, True), (small, False), (small, False), (small, False)]
        expected = [step(*args) for args in sequence]
        ctensor.step_plan(True, always=True)
        for _ in range(WARMUP):
            step(full)
        before = ctensor.debug.step_plan()
        got = [step(*args) for args in sequence]
        after = ctensor.debug.step_plan()
    assert before.learned == 1 and before.deviations == 0
    assert after.deviations == 4 and after.learned == 2, after.summary()
    assert after.replayed == before.replayed + 4, after.summary()
    assert after.last_deviation is not None and "input layouts" in after.last_deviation[2]
    for (loss, grads), (ref_loss, ref_grads) in zip(got, expected):
        assert abs(loss - ref_loss) <= 1e-12 * abs(ref_loss)
        for name, g in ref_grads.items():
            np.testing.assert_allclose(grads[name], g, rtol=1e-10, atol=1e-13, err_msg=name)


def test_report_names_what_the_plan_changed():
    _needs_two_ranks()
    with float64(), world(2):
        _steps(llama, LLAMA_TP, (2,), None, WARMUP)
        report = ctensor.debug.step_plan()
    text = report.summary()
    assert "per-op choice" in text and "plan" in text
    assert report.calls > 0 and report.learned >= 1
    row = report.changed[0]
    assert row[2] != row[3] and isinstance(row[1], str)
    assert len(report.summary(all_calls=True).splitlines()) > len(text.splitlines())


def test_solver_is_fast_and_deterministic():
    _needs_two_ranks()
    with float64(), world(2):
        _steps(llama, LLAMA_TP, (2,), None, WARMUP)
        from ctensor import stepplan, stepsolve
        plan = stepplan._state.plan
        calls = [stepplan._SolverCall(c) for c in plan.calls]
        first = stepsolve.solve(calls, plan.values, plan.deposits)
        second = stepsolve.solve(calls, plan.values, plan.deposits)
    assert [o.picks for o in first[0]] == [o.picks for o in second[0]]
    assert first[2] == second[2]


def test_by_default_a_plan_is_followed_only_where_it_pays():
    """By default a plan whose estimated saving per step is below its replay's cost (here:
    cpu placements, where a collective costs a few microseconds) is learned and reported
    but not followed, and recording stops: the steps keep the per-op choice's collectives
    and values. Data parallel: the per-op choice is (nearly) the plan; recording stops too."""
    _needs_two_ranks()
    with float64(), world(2):
        ctensor.step_plan(True)
        runs = _steps(llama, LLAMA_TP, (2,), None, WARMUP + 2)
        report = ctensor.debug.step_plan()
        assert report.idle == "small" and report.learned == 1, report.summary()
        assert report.estimated[0] < report.estimated[1]  # cheaper, not cheap enough
        saving = report.estimated[1] - report.estimated[0]
        assert saving <= report.calls * ctensor.stepplan.REPLAY_SECONDS_PER_CALL
        assert "always=True" in report.summary()
        counts = [len(_collectives(log)) for _, _, log in runs]
        assert len(set(counts)) == 1 and counts[0] > 4 * LAYERS + 6, counts
        ctensor.step_plan(True)
        runs = _steps(llama, None, (2,), 0, WARMUP + 2)
        report = ctensor.debug.step_plan()
        # (the plan moves the loss's division after its reduction: a few microseconds)
        assert report.idle in ("same", "small"), report.summary()
    for (loss, grads, _), (ref_loss, ref_grads, _) in zip(runs[1:], runs[:-1]):
        assert np.isfinite(loss) and grads.keys() == ref_grads.keys()
    with pytest.raises(TypeError, match="always"):
        ctensor.step_plan(True, always=1)


def test_a_mesh_axis_of_one_rank_does_not_end_the_replay():
    """ctensor's own GPT laid out by ``hybrid_parallel`` on a (1, 2) mesh (data parallel of
    one): on the axis of one rank split, broadcast and partial hold the same data, and the
    per-op choice may label it otherwise than the plan; the replay goes on, with no more
    collectives than the per-op choice and the same values."""
    _needs_two_ranks()
    with float64(), world(2):
        ctensor.manual_seed(0)
        model = ctensor.nn.GPT(32, 8, 2, 2, 16, dropout=0.0, tie_weights=False,
                               dtype=np.float64)
        mesh = ctensor.placement("cpu", [[0, 1]])
        ctensor.nn.parallel.hybrid_parallel(model, mesh)
        rng = np.random.default_rng(1)
        ids, target = [ctensor.tensor(rng.integers(0, 32, (4, 8)), placement=mesh,
                                      sbp=(S(0), B)) for _ in range(2)]
        runs = []
        for _ in range(WARMUP + 2):
            with ctensor.debug.comm_log() as log:
                _, loss = model(ids, target)
                loss.backward()
            grads = {name: p.grad.numpy() for name, p in model.named_parameters()}
            for p in model.parameters():
                p.grad = None
            runs.append((float(loss.item()), grads, len(_collectives(log))))
        report = ctensor.debug.step_plan()
    assert report.replayed == 2 and report.deviations == 0, report.summary()
    (ref_loss, ref_grads, per_op), *_ = runs
    for loss, grads, count in runs[WARMUP:]:
        assert count <= per_op
        assert abs(loss - ref_loss) <= 1e-12 * abs(ref_loss)
        for name, g in ref_grads.items():
            np.testing.assert_allclose(grads[name], g, rtol=1e-10, atol=1e-13, err_msg=name)


def test_a_program_that_never_repeats_stops_being_recorded():
    """Steps of changing shapes (the batch grows every step) never repeat the window before
    them: after ``stepplan._NO_REPEAT`` such windows the process stops recording (a
    recorded op costs about twice an unrecorded one), says so, and the values are the
    per-op choice's; ``ct.step_plan(True)`` records again."""
    from ctensor import stepplan
    with float64(), world(2):
        ctensor.step_plan(True)  # (the default)
        ctensor.manual_seed(0)
        layer = ctensor.nn.Linear(8, 4, dtype=np.float64)
        mesh = ctensor.placement("cpu", [0, 1])
        layer.to_global(mesh, {"weight": S(0), "bias": S(0)})
        rng = np.random.default_rng(0)
        for n in range(1, stepplan._NO_REPEAT + 3):
            x = rng.standard_normal((n, 8))
            out = layer(ctensor.tensor(x).to_global(mesh, (B,)))
            (out * out).sum().backward()
            w, b = (np.asarray(layer.weight.numpy()), np.asarray(layer.bias.numpy()))
            np.testing.assert_allclose(layer.weight.grad.numpy(),
                                       2 * (x @ w.T + b).T @ x, rtol=1e-12)
            layer.weight.grad = layer.bias.grad = None
            if n == stepplan._NO_REPEAT:
                report = ctensor.debug.step_plan()
                assert report.gave_up and report.learned == 0, report.summary()
            if n > stepplan._NO_REPEAT:
                assert stepplan._state.calls == []  # not recorded
        ctensor.step_plan(True)
        (layer(ctensor.tensor(rng.standard_normal((2, 8))).to_global(mesh, (B,)))
         .sum().backward())
        assert not ctensor.debug.step_plan().gave_up
        assert ctensor.stepplan._state.started


def _llama_tp(planned: bool):
    """The Llama laid out by LLAMA_TP on ranks 0 and 1, the step plan on (followed) or off."""
    ctensor.step_plan(planned, always=True)
    ctensor.manual_seed(0)
    model = llama(*CT)
    mesh = ctensor.placement("cpu", [0, 1])
    model.to_global(mesh, LLAMA_TP)
    return model, mesh


def _updates(model, mesh, opt, updates: int, micro: int, schedule=None):
    """``updates`` optimizer steps of ``micro`` backward passes each over the Llama batch:
    the losses and the step plan's report."""
    inputs = [ctensor.tensor(a).to_global(mesh, (B,)) for a in programs.llama_batch()]
    losses = []
    for _ in range(updates):
        for _ in range(micro):
            loss = programs._loss(model, inputs)
            loss.backward()
            losses.append(float(loss.item()))
        opt.step()
        opt.zero_grad()
        if schedule is not None:
            schedule.step()
    return losses, ctensor.debug.step_plan()


@pytest.mark.parametrize("micro", [2, 4])
def test_gradient_accumulation_keeps_its_plan(micro):
    """``micro`` backward passes per update: the first window after an update (gradients
    start afresh) differs from those that accumulate. Four: the accumulating windows repeat
    one another and are planned; the first fails the plan each time, which is kept, so
    nothing is solved again. Two: the windows alternate, a loop of period 2, planned at
    its first repeat; the other kind fails the plan. The losses are the per-op choice's."""
    _needs_two_ranks()

    def run(planned):
        model, mesh = _llama_tp(planned)
        opt = ctensor.optim.SGD(list(model.parameters()), lr=0.1)
        return _updates(model, mesh, opt, 4, micro)

    with float64(), world(2):
        expected, _ = run(False)
        got, report = run(True)
    assert report.learned == 1 and not report.gave_up, report.summary()
    # four: learned at the third window; of the 13 after it, 10 replayed and 3 failed the
    # guard (so did the last update, which begins a window). Two: learned at the fourth
    # (it repeats the second); of the 4 after it, 2 replayed, 2 failed, and the last update
    assert (report.deviations, report.replayed) == ((4, 10) if micro == 4 else (3, 2)), \
        report.summary()
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_a_loop_that_alternates_solves_each_kind_of_step_once():
    """Blocks of steps of two batch sizes, in turn: each size's window is solved the first
    time it repeats; when its block comes back, its first window fails the other plan and
    the next ones replay its own (no solve). The values are the per-op choice's."""
    _needs_two_ranks()
    arrays = programs.llama_batch()

    def run(planned):
        model, mesh = _llama_tp(planned)
        batches = [[ctensor.tensor(a[:n]).to_global(mesh, (B,)) for a in arrays]
                   for n in (4, 2)]
        losses = []
        for block in range(4):
            for _ in range(3):
                loss = programs._loss(model, batches[block % 2])
                loss.backward()
                losses.append(float(loss.item()))
                for p in model.parameters():
                    p.grad = None
        return losses, ctensor.debug.step_plan()

    with float64(), world(2):
        expected, _ = run(False)
        got, report = run(True)
    # (4 blocks of 3: learned at the 2nd and 5th windows, reused at the 7th and 10th; the
    # 4th, 5th, 7th and 10th fail the plan they start with; the other 6 after the 2nd replay)
    assert report.learned == 2 and report.reused == 2, report.summary()
    assert report.deviations == 4 and report.replayed == 6, report.summary()
    assert "reused 2" in report.summary()
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_an_optimizer_whose_learning_rate_changes_every_step_keeps_the_loop_repeating():
    """AdamW one parameter at a time (``foreach=False``: one ``fused_adam`` call each) under
    a schedule: every step's calls differ in the learning rate and the step count, which
    only the kernel reads (``value_attrs``), so the loop still repeats: learned once and
    replayed (it used to never repeat and be given up after four windows). The values are
    the per-op choice's."""
    _needs_two_ranks()

    def run(planned):
        model, mesh = _llama_tp(planned)
        opt = ctensor.optim.AdamW(list(model.parameters()), lr=1e-2, foreach=False)
        schedule = ctensor.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
        return _updates(model, mesh, opt, 6, 1, schedule)

    with float64(), world(2):
        expected, _ = run(False)
        got, report = run(True)
    assert report.learned == 1 and not report.gave_up, report.summary()
    assert report.replayed >= 2 and report.deviations == 0, report.summary()
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_a_second_loop_after_an_idle_one_is_learned():
    """A data-parallel MLP's loop is learned and idle (its plan is the per-op choice, so
    nothing is recorded); then the program trains the tensor-parallel Llama. Its windows
    run another number of calls: after ``stepplan._NO_REPEAT`` of them the step plan
    records again, learns the Llama's loop and replays it (it used to stay idle for the
    rest of the process). The losses are the per-op choice's."""
    _needs_two_ranks()
    from ctensor import stepplan

    def run(planned):
        ctensor.step_plan(planned, always=True)
        mesh = ctensor.placement("cpu", [0, 1])
        ctensor.manual_seed(0)
        mlp = ctensor.nn.Sequential(ctensor.nn.Linear(8, 8, dtype=np.float64),
                                    ctensor.nn.Linear(8, 2, dtype=np.float64))
        mlp.to_global(mesh, (B,))
        x = ctensor.tensor(np.random.default_rng(0).standard_normal((4, 8))).to_global(
            mesh, (S(0),))
        for _ in range(2 * stepplan._NO_REPEAT):  # (learned, then idle windows to compare)
            (mlp(x) ** 2).mean().backward()
            for p in mlp.parameters():
                p.grad = None
        first = ctensor.debug.step_plan()
        model = llama(*CT)
        model.to_global(mesh, LLAMA_TP)
        opt = ctensor.optim.SGD(list(model.parameters()), lr=0.1)
        losses, report = _updates(model, mesh, opt, stepplan._NO_REPEAT + 5, 1)
        return first, losses, report

    with float64(), world(2):
        _, expected, _ = run(False)
        first, got, report = run(True)
    assert first.learned == 1 and first.idle == "same", first.summary()
    assert report.learned == 2 and not report.idle and not report.gave_up, report.summary()
    assert report.replayed >= 2, report.summary()
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_an_idle_loop_with_gradient_accumulation_stays_idle():
    """Five backward passes per update: the first window after an update differs from the
    four that accumulate, so an idle loop sees two counts of calls, in turn; neither is
    another loop, so nothing is recorded again (no second solve, not given up)."""
    from ctensor import stepplan
    with float64(), world(2):
        ctensor.step_plan(True)
        mesh = ctensor.placement("cpu", [0, 1])
        ctensor.manual_seed(0)
        mlp = ctensor.nn.Linear(8, 2, dtype=np.float64)
        mlp.to_global(mesh, (B,))
        opt = ctensor.optim.SGD(list(mlp.parameters()), lr=0.1)
        x = ctensor.tensor(np.ones((4, 8))).to_global(mesh, (S(0),))
        for _ in range(6):
            for _ in range(5):
                (mlp(x) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
        report = ctensor.debug.step_plan()
        assert report.learned + report.reused == 1 and report.idle == "same", report.summary()
        assert not report.gave_up and stepplan._state.calls == [], report.summary()
        ctensor.step_plan(stepplan.DEFAULT_ON)
