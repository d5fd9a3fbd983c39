"""Fully sharded data parallel (``nn.fully_shard``): the GPT example's loss curve equals
data parallelism's (float64, 1e-9) with and without tensor parallelism and in a pipeline;
checkpoints move between FSDP and DP; the communication log shows the gathers and the
bucketed reduce-scatter; memory per rank shrinks; bad input fails before communicating."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

import ctensor as ct
import ctensor.nn as nn
import ctensor.optim as optim
from conftest import MPI_MODE, world

S, B = ct.sbp.split, ct.sbp.broadcast
TRAIN = Path(__file__).resolve().parent.parent / "examples" / "gpt" / "train.py"
TINY = ["--layers", "2", "--hidden", "16", "--heads", "2", "--seq-len", "8", "--global-batch",
        "4", "--micro-batches", "2", "--steps", "4", "--dtype", "float64", "--dropout", "0.1",
        "--no-progress", "--lr", "1e-2"]


@pytest.fixture(scope="module")
def train():
    spec = importlib.util.spec_from_file_location("gpt_train_fsdp", TRAIN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def world_args(size: int) -> list:
    if MPI_MODE:
        if ct.world_size() != size:
            pytest.skip(f"needs exactly {size} ranks")
        return []
    return ["--simulate", str(size)]


@pytest.mark.parametrize("fsdp", ["zero3", "zero2"])
@pytest.mark.parametrize("config", ["2x1x1", "2x2x1", "2x1x2", "4x1x1", "2x2x1-sp"])
def test_fsdp_loss_curve_equals_data_parallel(train, config, fsdp):
    # (-sp: sequence parallel, whose backward gathers again inputs it had gathered, among
    # them a gathered parameter that ZeRO-3 freed after its module's forward)
    dp, tp, pp = map(int, config.split("-")[0].split("x"))
    args = TINY + world_args(dp * tp * pp) + ["--dp", str(dp), "--tp", str(tp), "--pp", str(pp)]
    args += ["--sp"] if config.endswith("-sp") else []
    reference = train.run(args)
    np.testing.assert_allclose(train.run(args + ["--fsdp", fsdp]), reference, rtol=1e-9, atol=0)


def test_checkpoint_moves_between_fsdp_and_dp(train, tmp_path_factory):
    if MPI_MODE:
        base = Path("/tmp") / f"ctensor-fsdp-ckpt-{ct.world_size()}"
        size = ["--dp", str(ct.world_size())]
    else:
        base = tmp_path_factory.mktemp("fsdp")
        size = ["--simulate", "2", "--dp", "2"]
    reference = train.run(TINY + size)
    half = [a if not (a == "4" and TINY[i - 1] == "--steps") else "2" for i, a in enumerate(TINY)]
    for first, second, name in ((["--fsdp"], [], "fsdp-to-dp"), ([], ["--fsdp"], "dp-to-fsdp")):
        path = str(base / name)
        head = train.run(half + size + first + ["--save", path])
        tail = train.run(TINY + size + second + ["--load", path])
        np.testing.assert_allclose(head + tail, reference, rtol=1e-9, err_msg=name)


def _model(mesh, reshard=True, tp=False):
    ct.manual_seed(0)
    model = nn.GPT(32, 8, 2, 2, 16, dropout=0.0, tie_weights=False, dtype=np.float64)
    if tp:
        model.to_global(mesh, nn.parallel.hybrid_parallel_rules(model))
    return nn.fully_shard(model, mesh, dp_axis=0, reshard_after_forward=reshard)


def _batch(mesh):
    rng = np.random.default_rng(0)
    sbp = nn.parallel.batch_sbp(mesh)
    return (ct.tensor(rng.integers(0, 32, (4, 8)), placement=mesh, sbp=sbp),
            ct.tensor(rng.integers(0, 32, (4, 8)), placement=mesh, sbp=sbp))


@pytest.mark.parametrize("reshard", [True, False], ids=["zero3", "zero2"])
def test_comm_log_gathers_and_bucketed_reduce_scatter(reshard):
    with world(4):
        mesh = ct.placement("cpu", [[0, 1], [2, 3]])
        model = _model(mesh, reshard, tp=True)
        sharded = [n for n, p in model.named_parameters() if isinstance(p.sbp[0], ct.sbp.Split)]
        kept = [n for n, p in model.named_parameters() if n not in sharded]
        # only the column-parallel biases stay broadcast: their one dim is split by TP
        assert sharded
        assert all(n.endswith(("query.bias", "key.bias", "value.bias", "fc.bias"))
                   for n in kept), kept
        for name, p in model.named_parameters():  # TP SBP kept on mesh axis 1
            assert p.sbp[1] == nn.parallel.hybrid_parallel_rules(model)[name][1], name
        idx, tgt = _batch(mesh)
        with ct.debug.comm_log() as forward:
            _, loss = model(idx, tgt)
        with ct.debug.comm_log() as backward:
            loss.backward()
    gathers = [e for e in forward if e.op == "to_global" and e.collective == "all_gather"]
    assert len(gathers) == len(sharded) and all(e.mesh_axis == 0 for e in gathers)
    regathers = [e for e in backward if e.op == "to_global" and e.collective == "all_gather"]
    if reshard:  # ZeRO-3 gathers again in the backward: the parameters a backward reads
        shapes = {tuple(p.shape) for n, p in model.named_parameters() if n in sharded}
        assert regathers and all(tuple(e.shape) in shapes for e in regathers)
        assert len(regathers) >= len([n for n in sharded if "mlp" in n and "weight" in n])
    else:
        assert not regathers
    scatters = [e for e in backward if e.op == "grad_sync" and e.collective == "reduce_scatter"]
    assert len(scatters) == 1  # every sharded gradient in one bucket, one collective
    reduces = [e for e in backward if e.op == "grad_sync" and e.collective == "all_reduce"]
    assert len(reduces) == (1 if kept else 0)  # the broadcast biases: one more bucket
    for p in model.parameters():
        assert p.grad.sbp == p.sbp


def test_optimizer_states_follow_the_shards_and_state_dict_is_logical():
    with world(2):
        mesh = ct.placement("cpu", [0, 1])
        model = _model(mesh)
        opt = optim.AdamW(model.parameters())
        idx, tgt = _batch(mesh)
        _, loss = model(idx, tgt)
        loss.backward()
        opt.step()
        for p in model.parameters():
            st = opt.state[id(p)]
            assert st["exp_avg"].sbp == p.sbp and isinstance(p.sbp[0], ct.sbp.Split)
        state = model.state_dict()
        assert tuple(state["wte.weight"].shape) == (32, 16)
        assert state["wte.weight"].numpy().shape == (32, 16)


@pytest.mark.skipif(MPI_MODE, reason="measures one process's shards")
def test_memory_per_rank_is_a_quarter_and_zero3_frees_gathered_copies():
    figures = {}
    for name, reshard in (("dp", None), ("zero3", True), ("zero2", False)):
        with ct.simulate(4), ct.debug.track_memory():
            mesh = ct.placement("cpu", [0, 1, 2, 3])
            ct.manual_seed(0)
            model = nn.GPT(32, 8, 2, 2, 16, tie_weights=False, dtype=np.float64)
            if reshard is None:
                nn.parallel.data_parallel(model, mesh)
            else:
                nn.fully_shard(model, mesh, reshard_after_forward=reshard)
            opt = optim.AdamW(model.parameters())
            idx, tgt = _batch(mesh)
            _, loss = model(idx, tgt)
            after_forward = ct.debug.memory().current["activations"]
            loss.backward()
            opt.step()
            m = ct.debug.memory()
            figures[name] = (m.current["parameters"] + m.current["gradients"] +
                             m.current["optimizer"], after_forward)
            del model, opt, loss
    assert figures["zero3"][0] <= 0.3 * figures["dp"][0], figures
    gathered = 0.75 * figures["dp"][0] / 4  # the parameters' other three quarters
    assert figures["zero2"][1] - figures["zero3"][1] >= 0.8 * gathered, figures


def test_bad_input_fails_before_any_collective():
    with world(4):
        mesh = ct.placement("cpu", [[0, 1], [2, 3]])
        model = nn.MLP(8)
        with ct.debug.comm_log() as log:
            with pytest.raises(ValueError, match=r"fully_shard: argument 'dp_axis' is 2.*2 mesh "
                                                 r"axis.*pass the data-parallel mesh axis"):
                nn.fully_shard(model, mesh, dp_axis=2)
            with pytest.raises(TypeError, match="fully_shard: argument 'placement'"):
                nn.fully_shard(model, [0, 1])
        assert not log.collectives()
        nn.fully_shard(model, mesh, dp_axis=0)
        nn.fully_shard(model, mesh, dp_axis=0)  # the same again: nothing to do
        other = nn.MLP(8).to_global(mesh, (S(0), B))
        with ct.debug.comm_log() as log:
            with pytest.raises(ValueError, match=r"fully_shard: module .* is already fully "
                                                 r"sharded as fully_shard\(.*dp_axis=0"):
                nn.fully_shard(model, mesh, dp_axis=1)
            with pytest.raises(ValueError, match=r"not broadcast along mesh axis 0"):
                nn.fully_shard(other, mesh, dp_axis=0)
        assert not log.collectives()


def test_forward_hooks_run_and_come_off():
    seen = []
    lin = nn.Linear(3, 2)
    pre = lin.register_forward_pre_hook(lambda m, args: seen.append("pre"))
    post = lin.register_forward_hook(lambda m, args, out: out * 0.0)
    y = lin(ct.ones(1, 3))
    assert seen == ["pre"] and float(y.abs().sum().item()) == 0.0
    pre.remove()
    post.remove()
    assert float(lin(ct.ones(1, 3)).abs().sum().item()) > 0 and seen == ["pre"]


def _steps(prefetch, reshard=True, tp=False, steps=3, precision=None):
    """Losses of ``steps`` AdamW steps of a small GPT on 2 ranks (FSDP), or (2, 2) with
    ``tp`` (tensor parallel along the second mesh axis), and, per step, how many
    collectives were issued when the second block's MLP began its forward."""
    with world(4 if tp else 2):
        mesh = ct.placement("cpu", [[0, 1], [2, 3]]) if tp else ct.placement("cpu", [0, 1])
        ct.manual_seed(0)
        model = nn.GPT(32, 8, 2, 2, 16, dropout=0.1, tie_weights=True, dtype=np.float64)
        if tp:
            model.to_global(mesh, nn.parallel.hybrid_parallel_rules(model))
        nn.fully_shard(model, mesh, reshard_after_forward=reshard, prefetch=prefetch)
        if precision:
            nn.mixed_precision(model, precision)
        opt = optim.AdamW(model.parameters(), lr=1e-2)
        rng = np.random.default_rng(0)
        at_fc, losses, gathers = [], [], []
        log = None
        model.blocks[1].mlp.fc.register_forward_pre_hook(
            lambda m, args: at_fc.append(len(log.collectives())))
        for _ in range(steps):
            idx = ct.tensor(rng.integers(0, 32, (4, 8)), placement=mesh,
                            sbp=nn.parallel.batch_sbp(mesh))
            with ct.debug.comm_log() as log:
                _, loss = model(idx, idx)
                loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(float(loss.item()))
            gathers.append(len([e for e in log if e.collective == "all_gather"]))
    # (the second step, the first that prefetches: later ones may take other plans)
    return losses, at_fc, gathers[1]


@pytest.mark.parametrize("case", ["zero3", "zero2", "zero3-tp", "zero3-fp16"])
def test_prefetch_starts_the_next_gathers_and_changes_no_value(case):
    reshard, tp = not case.startswith("zero2"), case.endswith("-tp")
    precision = np.float16 if case.endswith("fp16") else None
    reference, at_fc, gathers = _steps(0, reshard, tp, precision=precision)
    for prefetch in (1, 2):
        losses, ahead, prefetched_gathers = _steps(prefetch, reshard, tp,
                                                   precision=precision)
        assert losses == reference  # the same bits
        assert prefetched_gathers == gathers  # started earlier, none added
        # the first step learns the order; later, when fc begins, the gathers of the
        # next `prefetch` modules (fc's proj: weight and bias) are already issued
        assert ahead[0] == at_fc[0] and all(a > b for a, b in zip(ahead[1:], at_fc[1:]))
    with pytest.raises(ValueError, match="argument 'prefetch' must be an int >= 0"):
        nn.fully_shard(nn.MLP(8), ct.placement("cpu", [0]), prefetch=-1)


@pytest.mark.skipif(MPI_MODE, reason="measures one process's shards")
def test_prefetch_memory_is_bounded_by_prefetch_modules():
    # ct.debug.memory counts tensors, and a started gather's buffer becomes one only when
    # waited for: what is in flight as a module begins is counted from the comm log (the
    # bytes of the gathers issued, less those of the modules begun); the step's peak of
    # what ct.debug.memory sees grows by at most what prefetch holds
    in_flight, peaks = {}, {}
    for prefetch in (0, 1, 2):
        with ct.simulate(4), ct.debug.track_memory():
            mesh = ct.placement("cpu", [0, 1, 2, 3])
            ct.manual_seed(0)
            model = nn.GPT(32, 8, 2, 2, 32, tie_weights=False, dtype=np.float64)
            nn.fully_shard(model, mesh, prefetch=prefetch)
            owners = [m for m in model.modules() if list(m.parameters(False))]
            sizes = {id(m): sum(p.numel() * 8 for p in m.parameters(False)
                                if isinstance(p.sbp[0], ct.sbp.Split)) for m in owners}
            largest, begun, seen = max(sizes.values()), [0], in_flight.setdefault(prefetch, [])
            log = None

            def hook(m, args):
                if log is not None:
                    begun[0] += sizes[id(m)]
                    issued = sum(int(np.prod(e.shape)) * 8 for e in log
                                 if e.collective == "all_gather")
                    seen.append(issued - begun[0])
            for m in owners:
                m.register_forward_pre_hook(hook)
            idx, tgt = _batch(mesh)
            _, loss = model(idx, tgt)  # the first step learns the order
            loss.backward()
            model.zero_grad()
            ct.debug.reset_peak_memory()
            with ct.debug.comm_log() as log:
                _, loss = model(idx, tgt)
            log = None
            loss.backward()
            peaks[prefetch] = ct.debug.memory().peak_total
            del model, loss
    assert len(in_flight[0]) == len(owners) and set(in_flight[0]) == {0}
    assert 0 < max(in_flight[1]) <= largest < max(in_flight[2]) <= 2 * largest, in_flight
    assert min(in_flight[1]) >= 0 and min(in_flight[2]) >= 0
    assert peaks[0] <= peaks[1] <= peaks[0] + largest, (peaks, largest)
    assert peaks[1] <= peaks[2] <= peaks[0] + 2 * largest, (peaks, largest)
