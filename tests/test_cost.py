"""The one cost model (``ctensor/cost.py``): its formulas, its device tables, and that the
signature choice, boxing and ``ct.plan`` all price with it (issue 22 item 4); the
calibration command's table writer; the predict-then-measure benchmark's predictions."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

import ctensor as ct
from ctensor import cost
from conftest import MPI_MODE

ROOT = Path(__file__).resolve().parent.parent
S0, B, P = ct.sbp.split(0), ct.sbp.broadcast, ct.sbp.partial_sum
sim_only = pytest.mark.skipif(MPI_MODE, reason="shape-only worlds run in one process")


def _layout(t):
    """A tensor's :class:`~ctensor.layout.Layout`."""
    return t.layout if hasattr(type(t), "layout") else t._layout

DEV = cost.Device("test", peak_flops=2e12, peak_flops_fp32=1e12, memory_bytes=2 ** 30,
                  memory_bandwidth=1e11, intra_bandwidth=1e10, inter_bandwidth=1e9,
                  intra_latency=1e-6, inter_latency=5e-6, call_overhead=3e-6,
                  op_overhead=2e-6, efficiency=0.5)


# ----------------------------------------------------------------------------- formulas
@pytest.mark.parametrize("kind, k, steps, sent", [
    ("all_reduce", 4, 2, 1.5), ("all_reduce", 2, 1, 1.0), ("all_gather", 8, 3, 7 / 8),
    ("reduce_scatter", 3, 2, 2 / 3), ("all_to_all", 4, 3, 0.75), ("broadcast", 5, 3, 1.0),
    ("send_recv", 2, 1, 1.0)])
def test_collective_is_alpha_beta_per_step(kind, k, steps, sent):
    assert cost.steps(kind, k) == steps and cost.sent(kind, k) == pytest.approx(sent)
    n = 1 << 20
    assert cost.collective(kind, k, n, DEV) == pytest.approx(3e-6 + steps * 1e-6 + sent * n / 1e10)
    # across nodes: the network's bandwidth per rank of the group on a node, at most NVLink's
    assert cost.collective(kind, k, n, DEV, intra=False, ranks_per_node=2) == \
        pytest.approx(3e-6 + steps * 5e-6 + sent * n / 2e9)
    assert cost.collective(kind, k, n, DEV, intra=False, ranks_per_node=64) == \
        pytest.approx(3e-6 + steps * 5e-6 + sent * n / 1e10)


def test_collective_edges_and_errors():
    assert cost.collective("all_reduce", 1, 1e9, DEV) == 0.0  # one rank: nothing moves
    with pytest.raises(ValueError, match="unknown collective"):
        cost.collective("all_sum", 2, 8, DEV)
    with pytest.raises(ValueError, match="unknown collective"):
        cost.collective("all_sum", 1, 8, DEV)


def test_compute_is_a_roofline_over_efficiency():
    assert cost.compute(DEV, 1e8) == pytest.approx(1e8 / 1e11 / 0.5)  # memory-bound
    assert cost.compute(DEV, 1e3, flops=1e12) == pytest.approx(1.0 / 0.5)  # float32 peak
    assert cost.compute(DEV, 1e3, flops=1e12, itemsize=2) == pytest.approx(0.5 / 0.5)
    assert cost.dispatch(DEV, 10) == pytest.approx(2e-5)


@sim_only
def test_kernel_seconds_of_a_matmul():
    from ctensor.registry import OPS
    with ct.simulate(2):
        p = ct.placement("cpu", [0, 1])
        x = ct.zeros(64, 32, placement=p, sbp=S0)
        w = ct.zeros(32, 16, placement=p, sbp=B)
        y = x @ w
        matmul = OPS.record("matmul").opdef
        ins, outs = (_layout(x), _layout(w)), (_layout(y),)
        flops, nbytes = cost.kernel_work(matmul, ins, outs, {})
    assert flops == 2 * 32 * 32 * 16  # the largest shard: 32 rows
    assert nbytes == 4 * (32 * 32 + 32 * 16 + 32 * 16)
    seconds = cost.kernel_seconds(matmul, ins, outs, {}, DEV)
    assert seconds == pytest.approx(2e-6 + cost.compute(DEV, nbytes, flops))


CURVED = cost.Device("curved", peak_flops=2e12, peak_flops_fp32=1e12, memory_bytes=2 ** 30,
                     memory_bandwidth=1e11, intra_bandwidth=1e10, inter_bandwidth=1e9,
                     intra_latency=1e-6, inter_latency=5e-6, efficiency=0.5, contention=1.5,
                     gemm=((1.0, 1e10), (100.0, 1e12)), gemm_fp64=((1.0, 5e9), (100.0, 5e11)),
                     kernels=(("matmul", 0.8), ("softmax", 0.1)))


def test_compute_with_measured_curves():
    # a GEMM's rate by its arithmetic intensity: linear in log(FLOPs per byte) between points
    assert cost.compute(CURVED, 1e6, flops=1e8) == pytest.approx(1e8 / 1e12 / 0.5)
    assert cost.compute(CURVED, 1e6, flops=1e7) == pytest.approx(1e7 / ((1e10 + 1e12) / 2) / 0.5)
    assert cost.compute(CURVED, 1e6, flops=1e9) == pytest.approx(1e9 / 1e12 / 0.5)  # the end's
    assert cost.compute(CURVED, 1e6, flops=1e5) == pytest.approx(1e6 / 1e11 / 0.5)  # bytes win
    assert cost.compute(CURVED, 1e6, flops=1e8, itemsize=8) == pytest.approx(1e8 / 5e11 / 0.5)
    assert cost.compute(CURVED, 1e6, flops=1e8, itemsize=2) == pytest.approx(1e8 / 2e12 / 0.5)
    # an op the table measured runs at its own efficiency, the others at the table's
    assert cost.compute(CURVED, 1e6, 1e8, op="matmul") == pytest.approx(1e8 / 1e12 / 0.8)
    assert cost.compute(CURVED, 1e6, op="softmax") == pytest.approx(1e6 / 1e11 / 0.1)
    assert cost.compute(CURVED, 1e6, op="gelu") == cost.compute(CURVED, 1e6)
    # every rank of the machine computing at once: slowed by the contention
    assert cost.compute(CURVED, 1e6, ranks=2) == pytest.approx(1.5 * cost.compute(CURVED, 1e6))
    assert cost.compute(DEV, 1e6, ranks=2) == cost.compute(DEV, 1e6)  # default 1


def _table(extra: str) -> str:
    return ('["mine"]\npeak_flops = 1e12\npeak_flops_fp32 = 5e11\nmemory_bytes = 1e10\n'
            'memory_bandwidth = 1e11\nintra_bandwidth = 1e10\ninter_bandwidth = 1e9\n'
            'intra_latency = 1e-6\ninter_latency = 2e-6\n' + extra)


@pytest.mark.parametrize("extra, key", [
    ("gemm = [[10, 1e9], [1, 2e9]]", "gemm"),             # x not increasing
    ("gemm_fp64 = [[1, -5.0]]", "gemm_fp64"),             # negative
    ("gemm = []", "gemm"),                                # empty
    ("gemm = [[1, 2, 3]]", "gemm"),                       # not pairs
    ("gemm = 5.0", "gemm"),                               # not a list
    ('kernels = [["matmul", 0]]', "kernels"),             # efficiency not > 0
    ('kernels = [[1, 0.5]]', "kernels"),                  # not an op name
    ("contention = 0", "contention")])
def test_a_bad_curve_is_a_value_error_naming_its_key(tmp_path, extra, key):
    path = tmp_path / "bad.toml"
    path.write_text(_table(extra + "\n"))
    with pytest.raises(ValueError, match=f"device 'mine' in .*: {key} must be"):
        ct.plan.load_devices(str(path))


def test_device_tables_take_measured_curves(tmp_path):
    path = tmp_path / "curves.toml"
    path.write_text(_table('contention = 1.25\ngemm = [[1, 1e10], [10, 4e11]]\n'
                           'kernels = [["matmul", 0.9], ["softmax", 0.2]]\n'))
    dev = ct.plan.load_devices(str(path))["mine"]
    assert dev.gemm == ((1.0, 1e10), (10.0, 4e11)) and dev.gemm_fp64 == ()
    assert dict(dev.kernels) == {"matmul": 0.9, "softmax": 0.2} and dev.contention == 1.25
    before = cost.machine("cpu")
    try:
        changed = cost.set_machine("cpu", gemm=[[1, 2e10]], kernels=[["add", 0.5]])
        assert changed.gemm == ((1.0, 2e10),) and changed.kernels == (("add", 0.5),)
        with pytest.raises(ValueError, match="cost.set_machine: gemm must be"):
            cost.set_machine("cpu", gemm=[[2, 1], [1, 1]])
    finally:
        cost.set_machine("cpu")
    assert cost.machine("cpu") == before


def test_the_cpu_table_is_measured_curves():
    dev = cost.machine("cpu")
    assert dev.gemm and dev.kernels and dict(dev.kernels).get("matmul", 0) > 0
    assert 0 < dev.efficiency <= 1 and dev.contention >= 1


# ----------------------------------------------------------------------------- device tables
def test_the_choice_prices_with_the_device_tables():
    assert cost.machine("cpu") == ct.plan.device("cpu")
    assert cost.machine("cuda") == ct.plan.device("cuda")
    with pytest.raises(ValueError, match="'kind' must be one of"):
        cost.machine("tpu")
    before = cost.machine("cpu")
    try:
        assert cost.set_machine("cpu", intra_bandwidth=1e12).intra_bandwidth == 1e12
        assert cost.machine("cpu").op_overhead == before.op_overhead
        with cost.using("cpu", "a100-80gb") as dev:
            assert dev.peak_flops == 312e12 and cost.machine("cpu") is dev
        assert cost.machine("cpu").intra_bandwidth == 1e12  # restored to what it was
        with pytest.raises(TypeError, match="unknown field"):
            cost.set_machine("cpu", link_speed=1.0)
        with pytest.raises(ValueError, match="positive number"):
            cost.set_machine("cpu", intra_latency=-1.0)
    finally:
        cost.set_machine("cpu")
    assert cost.machine("cpu") == before


@sim_only
def test_set_machine_drops_cached_plans_and_boxing_prices_with_it():
    with ct.simulate(2):
        p = ct.placement("cpu", [0, 1])
        x = ct.zeros(1024, placement=p, sbp=P)
        from ctensor import boxing
        src = _layout(x)
        dst = src.with_sbp((B,))
        base = boxing.cost(src, dst)
        assert base == pytest.approx(cost.collective("all_reduce", 2, 4096, "cpu"))
        old = cost.machine("cpu").call_overhead
        try:
            cost.set_machine("cpu", call_overhead=1.0)
            assert boxing.cost(src, dst) == pytest.approx(base - old + 1.0)
        finally:
            cost.set_machine("cpu")


def test_device_tables_take_the_optional_keys(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('["mine"]\npeak_flops = 1e12\npeak_flops_fp32 = 5e11\nmemory_bytes = 1e10\n'
                    'memory_bandwidth = 1e11\nintra_bandwidth = 1e10\ninter_bandwidth = 1e9\n'
                    'intra_latency = 1e-6\ninter_latency = 2e-6\nop_overhead = 3e-5\n')
    dev = ct.plan.load_devices(str(path))["mine"]
    assert dev.op_overhead == 3e-5 and dev.call_overhead == 0.0
    assert dev.efficiency == cost.EFFICIENCY
    path.write_text(path.read_text().replace("op_overhead = 3e-5", "efficiency = -1"))
    with pytest.raises(ValueError, match="efficiency must be a positive number"):
        ct.plan.load_devices(str(path))


def test_one_formula_one_sent_table():
    import ctensor.plan as plan
    assert not hasattr(plan, "_SENT")  # ct.plan prices with cost.py's


# ----------------------------------------------------------------------------- ct.plan
@sim_only
def test_plan_prices_collectives_and_views_through_the_cost_model():
    dev = ct.plan.device("cpu")
    with ct.simulate(4, meta=True), ct.plan.record() as trace:
        p = ct.placement("cpu", [0, 1, 2, 3])
        x = ct.zeros(256, 64, placement=p, sbp=P)
        y = x.to_global(sbp=B)
        y.reshape(64, 256)
    (c,) = trace.comms.values()
    assert c.collective == "all_reduce" and c.group_size == 4
    assert ct.plan.comm_seconds(c, dev, 8) == cost.collective("all_reduce", 4, c.nbytes, dev)
    # 4 ranks on nodes of 2: across nodes, 2 ranks of the group per node
    assert ct.plan.comm_seconds(c, dev, 2) == cost.collective(
        "all_reduce", 4, c.nbytes, dev, intra=False, ranks_per_node=2)
    views = [w for w in trace.ops.values() if w.view]
    assert views and all(w.flops == 0 and w.nbytes == 0 for w in views)
    unfused = ct.plan.op_seconds(trace, dev, fused=False)
    expected = sum(cost.dispatch(dev, w.count) + (0 if w.view else cost.compute(
        dev, w.nbytes, w.flops, w.dtype.itemsize, w.op)) for w in trace.ops.values())
    assert sum(unfused.values()) == pytest.approx(expected)
    # every rank of the machine computing at once: the kernels slowed by its contention
    both = ct.plan.op_seconds(trace, dev, fused=False, ranks=2)
    assert sum(both.values()) == pytest.approx(
        sum(cost.dispatch(dev, w.count) + (0 if w.view else dev.contention * cost.compute(
            dev, w.nbytes, w.flops, w.dtype.itemsize, w.op)) for w in trace.ops.values()))


@sim_only
def test_plan_prices_each_size_of_a_kernel_on_its_own():
    dev = CURVED
    with ct.simulate(1, meta=True), ct.plan.record() as trace:
        a, b = ct.zeros(4, 4), ct.zeros(256, 256)
        a @ a
        b @ b
    (w,) = [w for w in trace.ops.values() if w.op == "matmul"]
    assert w.count == 2 and len(w.sizes) == 2
    expected = sum(cost.compute(dev, n, f, 4, "matmul") for f, n in w.sizes)
    assert ct.plan.op_seconds(trace, dev, fused=False)[w.placement] == pytest.approx(expected)
    assert expected != pytest.approx(2 * cost.compute(dev, w.nbytes / 2, w.flops / 2, 4, "matmul"))


# ----------------------------------------------------------------------------- calibration
def _calibrate():
    """benchmarks/calibrate.py as a module (a command, not part of the package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("calibrate", ROOT / "benchmarks" / "calibrate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_write_table_replaces_one_table_and_keeps_the_rest(tmp_path):
    write_table = _calibrate().write_table
    path = tmp_path / "devices.toml"
    path.write_text('# my notes\n["gpu"]\npeak_flops = 1.0\n\n["cpu"]\npeak_flops = 2.0\n'
                    '\n# after\n["other"]\npeak_flops = 3.0\n')
    table = {k: 1.5 for k in ("peak_flops", "peak_flops_fp32", "memory_bandwidth",
                              "intra_bandwidth", "inter_bandwidth", "intra_latency",
                              "inter_latency", "call_overhead", "op_overhead", "efficiency")}
    table["memory_bytes"] = 1024
    write_table(str(path), "cpu", table, "measured now")
    write_table(str(path), "cpu", table, "measured again")  # replaces, does not pile up
    text = path.read_text()
    assert text.count('["cpu"]') == 1 and text.count("# measured") == 1
    assert "# my notes" in text and "# after" in text and 'peak_flops = 3.0' in text
    import tomllib
    assert tomllib.loads(text)["cpu"] == {**table, "memory_bytes": 1024}
    # the measured curves, one line each, load back as written
    curves = {**table, "gemm": [[1.5, 2e9], [3.0, 4e9]], "kernels": [["matmul", 0.75]]}
    mine = tmp_path / "mine.toml"
    write_table(str(mine), "mine", curves, "with curves")
    back = tomllib.loads(mine.read_text())["mine"]
    assert back["gemm"] == [[1.5, 2e9], [3.0, 4e9]] and back["kernels"] == [["matmul", 0.75]]
    assert ct.plan.load_devices(str(mine))["mine"].gemm == ((1.5, 2e9), (3.0, 4e9))


@sim_only
def test_calibration_measures_positive_figures():
    measure = _calibrate().measure
    table = measure(quick=True, mpi=False, repeats=2)
    for key in ("peak_flops_fp32", "memory_bandwidth", "op_overhead"):
        assert table[key] > 0 and math.isfinite(table[key])
    assert 0 < table["efficiency"] <= 1
    assert table["gemm"] and all(rate > 0 for _, rate in table["gemm"])
    assert dict(table["kernels"]).get("matmul", 0) > 0


# ----------------------------------------------------------------------------- benchmark
@sim_only
def test_predictions_of_the_benchmark():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import predict
        a = predict.parse_args(["--quick"])
        one = predict.predict_gpt(a, ["--dp", "1"])
        tp = predict.predict_gpt(a, ["--dp", "1", "--tp", "2", "--sp"])
        block = predict.predict_block(a)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert 0 < one < 10 and 0 < tp < 10 and 0 < block < 10
    assert np.isfinite([one, tp, block]).all()
