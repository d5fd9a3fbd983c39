"""Placement, SBP values, constructors, from_local, metadata, repr and bad input."""
import numpy as np
import pytest

import ctensor as ct
from conftest import MPI_MODE, assert_layout

S0, S1, B, P = ct.sbp.split(0), ct.sbp.split(1), ct.sbp.broadcast, ct.sbp.partial_sum


def test_sbp_values():
    assert ct.sbp.split(0) == ct.sbp.split(0) and ct.sbp.split(0) != ct.sbp.split(1)
    assert repr(S0) == "S(0)" and repr(B) == "B" and repr(P) == "P"
    assert repr(ct.sbp.partial_max) == "P(max)" and repr(ct.sbp.partial_min) == "P(min)"
    assert hash(ct.sbp.split(1)) == hash(S1)
    assert ct.sbp.broadcast() is B
    with pytest.raises(TypeError, match="split"):
        ct.sbp.split("0")


def test_placement_values():
    p = ct.placement("cpu", [[0, 1], [2, 3]])
    assert p.shape == (2, 2) and p.ndim == 2 and p.device == "cpu"
    assert p == ct.placement("cpu", [[0, 1], [2, 3]]) and p != ct.placement("cpu", [0, 1, 2, 3])
    assert hash(p) == hash(ct.placement("cpu", np.array([[0, 1], [2, 3]])))
    assert p.ranks.tolist() == [[0, 1], [2, 3]]
    assert isinstance(p, ct.placement)
    assert p.axis_group(3, 0) == (1, 3) and p.axis_group(3, 1) == (2, 3)
    with pytest.raises(ValueError, match="duplicate"):
        ct.placement("cpu", [0, 0])
    with pytest.raises(ValueError, match="device"):
        ct.placement("tpu", [0])
    with pytest.raises(ValueError, match="rectangular|non-empty"):
        ct.placement("cpu", [[0, 1], [2]])
    with pytest.raises(TypeError):
        ct.placement("cpu", ["a"])


def test_constructors(mesh):
    sbp = (S0,) * mesh.ndim
    assert_layout(ct.zeros(5, 3, placement=mesh, sbp=sbp), np.zeros((5, 3), np.float32))
    assert_layout(ct.ones((5, 3), placement=mesh, sbp=sbp), np.ones((5, 3), np.float32))
    assert_layout(ct.full((2, 7), 2.5, placement=mesh, sbp=(S1,) * mesh.ndim),
                  np.full((2, 7), 2.5, np.float32))
    assert_layout(ct.arange(11, placement=mesh, sbp=sbp), np.arange(11))
    assert_layout(ct.arange(1.0, 3.0, 0.25, placement=mesh, sbp=sbp),
                  np.arange(1.0, 3.0, 0.25, dtype=np.float32))
    # partial constructors give the stated logical value, not N times it
    for p in [P, ct.sbp.partial_max, ct.sbp.partial_min]:
        x = ct.ones(3, 2, placement=mesh, sbp=(p,) * mesh.ndim)
        np.testing.assert_array_equal(x.numpy(), np.ones((3, 2)))
        y = ct.tensor(np.arange(6.0).reshape(3, 2), placement=mesh, sbp=(p,) * mesh.ndim)
        np.testing.assert_array_equal(y.numpy(), np.arange(6.0).reshape(3, 2))
    assert ct.zeros(2, 2, placement=mesh).sbp == (B,) * mesh.ndim


def test_defaults_and_dtypes(mesh):
    x = ct.tensor([[1, 2], [3, 4]], placement=mesh)
    assert x.dtype == np.int64 and x.sbp == (B,) * mesh.ndim
    assert ct.tensor([1.0, 2.0], placement=mesh).dtype == np.float32
    assert ct.tensor(np.ones(2, np.float64), placement=mesh).dtype == np.float64
    assert ct.tensor([1.0], placement=mesh, dtype=np.float16).dtype == np.float16
    ct.set_default_dtype(np.float64)
    try:
        assert ct.ones(2, placement=mesh).dtype == np.float64
    finally:
        ct.set_default_dtype(np.float32)
    d = ct.zeros(3)
    assert d.placement == ct.placement.all() and d.sbp == (B,)


def test_metadata_and_repr(mesh):
    x = ct.tensor(np.arange(12.0).reshape(3, 4), placement=mesh, sbp=(S1,) * mesh.ndim,
                  requires_grad=True)
    assert x.shape == (3, 4) and x.ndim == 2 and x.dtype == np.float64  # arrays keep dtype
    assert x.placement == mesh and x.sbp == (S1,) * mesh.ndim
    assert x.is_leaf and x.requires_grad and x.grad is None
    text = repr(x)
    assert "shape=(3, 4)" in text and "S(1)" in text and "placement" in text
    assert x.numel() == 12 and len(x) == 3 and x.size(1) == 4


def test_local_shards_and_to_local(mesh):
    x = ct.arange(10, placement=mesh, sbp=(S0,) * mesh.ndim)
    shards = x.local_shards()
    if MPI_MODE:
        me = ct.rank()
        assert list(shards) == ([me] if me in mesh else [])
        if me in mesh:
            np.testing.assert_array_equal(x.to_local(), shards[me])
    else:
        assert sorted(shards) == sorted(mesh.rank_list)
        if mesh.size > 1:
            with pytest.raises(ValueError, match="rank"):
                x.to_local()
        for r in mesh.rank_list:
            np.testing.assert_array_equal(x.to_local(r), shards[r])


def test_from_local_infers_shape(mesh):
    value = np.arange(13 * 5, dtype=np.float64).reshape(13, 5)
    for sbp in [(S0,) * mesh.ndim, (S1,) * mesh.ndim, (B,) * mesh.ndim]:
        ref = ct.tensor(value, placement=mesh, sbp=sbp)
        shards = ref.local_shards()
        local = shards if len(shards) != 1 or not MPI_MODE else next(iter(shards.values()))
        if MPI_MODE and not shards:
            local = None
        y = ct.from_local(local, mesh, sbp)
        assert y.shape == (13, 5)
        assert_layout(y, value)
        z = ct.from_local(local, mesh, sbp, shape=(13, 5))
        assert_layout(z, value)


def test_from_local_rejects_bad_shards(mesh):
    if mesh.size < 2:
        pytest.skip("needs several ranks")
    # every rank passes 3 rows: for shape (6, 2) on 4 ranks the rule wants 2,2,1,1
    local = {r: np.zeros((3, 2)) for r in mesh.rank_list}
    if MPI_MODE:
        local = local.get(ct.rank())
    with pytest.raises(ValueError, match="uneven-split rule"):
        ct.from_local(local, mesh, (S0,) * mesh.ndim, shape=(3 * mesh.size - 1, 2))
    # the world stays usable
    x = ct.ones(4, 4, placement=mesh, sbp=(S0,) * mesh.ndim)
    assert x.to_global(sbp=(B,) * mesh.ndim).numpy().sum() == 16


@pytest.mark.parametrize("call,exc,words", [
    (lambda m: ct.ones(4, 4, placement=m, sbp=(ct.sbp.split(2),) * m.ndim), ValueError,
     ["ones", "S(2)", "dims"]),
    (lambda m: ct.ones(4, placement=m, sbp=(S0,) * (m.ndim + 1)), ValueError, ["mesh", "axes"]),
    (lambda m: ct.ones(4, placement=m, sbp="S0"), TypeError, ["sbp"]),
    (lambda m: ct.ones(4, placement=m, sbp=(0,) * m.ndim), TypeError, ["sbp"]),
    (lambda m: ct.ones(4, placement=ct.placement("cpu", [0, 99])), ValueError, ["outside"]),
    (lambda m: ct.ones(4, placement="cpu"), TypeError, ["placement"]),
    (lambda m: ct.ones(-1, placement=m), ValueError, ["shape"]),
    (lambda m: ct.tensor(["a"], placement=m), TypeError, ["numeric"]),
    (lambda m: ct.ones(2, placement=m).to_global(sbp=(ct.sbp.split(3),) * m.ndim), ValueError,
     ["to_global", "S(3)"]),
    (lambda m: ct.ones(2, placement=m).to_global(placement=[0]), TypeError, ["placement"]),
    (lambda m: ct.ones(2, placement=m, dtype=np.int64, requires_grad=True), ValueError,
     ["floating"]),
])
def test_bad_input_is_clear_and_harmless(mesh, call, exc, words):
    with pytest.raises(exc) as info:
        call(mesh)
    for w in words:
        assert w in str(info.value), str(info.value)
    x = ct.ones(6, placement=mesh, sbp=(S0,) * mesh.ndim)
    assert x.to_global(sbp=(B,) * mesh.ndim).numpy().sum() == 6


def test_copy_(mesh):
    x = ct.zeros(5, 3, placement=mesh, sbp=(S0,) * mesh.ndim, dtype=np.float64)
    value = np.arange(15.0).reshape(5, 3)
    shards_before = x.local_shards()
    x.copy_(ct.tensor(value, placement=mesh, sbp=(S1,) * mesh.ndim))
    assert_layout(x, value)
    for r, a in x.local_shards().items():
        assert a is shards_before[r]
    x.copy_(2.0)
    assert_layout(x, np.full((5, 3), 2.0))


def test_simulate_as_plain_call_and_nesting():
    if MPI_MODE:
        pytest.skip("simulation-only behaviour")
    sim = ct.simulate(3)
    try:
        assert ct.world_size() == 3
        with ct.simulate(2):
            assert ct.world_size() == 2
        assert ct.world_size() == 3
    finally:
        sim.close()
    assert ct.world_size() == 1
    with pytest.raises(ValueError):
        ct.simulate(0)
