"""Boxing: every SBP pair on 1-D and 2x2 meshes, even/uneven/empty shapes, round trips,
nested splits, cross-placement moves and plan caching."""
import itertools

import numpy as np
import pytest

import ctensor as ct
from ctensor import boxing, runtime
from conftest import assert_layout

S0, S1, B = ct.sbp.split(0), ct.sbp.split(1), ct.sbp.broadcast
P, PMAX, PMIN = ct.sbp.partial_sum, ct.sbp.partial_max, ct.sbp.partial_min
SBPS_1D = [S0, S1, B, P, PMAX, PMIN]
SBPS_2D = [S0, S1, B, P, PMAX]
SHAPES = [(8, 12), (13, 17), (1, 5), (0, 3)]


def data(shape, dtype=np.float64):
    return np.random.default_rng(sum(shape) + 7).standard_normal(shape).astype(dtype)


def sbp_id(s):
    return repr(s) if not isinstance(s, tuple) else ",".join(map(repr, s))


@pytest.mark.parametrize("dst", SBPS_1D, ids=sbp_id)
@pytest.mark.parametrize("src", SBPS_1D, ids=sbp_id)
def test_pairs_1d(mesh, src, dst):
    if mesh.ndim != 1:
        pytest.skip("1-D pairs")
    for shape in SHAPES:
        value = data(shape)
        x = ct.tensor(value, placement=mesh, sbp=src)
        assert_layout(x, value)
        y = x.to_global(sbp=dst)
        assert y.sbp == (dst,)
        assert_layout(y, value)


@pytest.mark.parametrize("src", list(itertools.product(SBPS_2D, repeat=2)), ids=sbp_id)
def test_pairs_2x2(mesh, src):
    if mesh.shape != (2, 2):
        pytest.skip("2x2 pairs")
    for shape in [(8, 12), (13, 17), (1, 5)]:
        value = data(shape)
        x = ct.tensor(value, placement=mesh, sbp=src)
        assert_layout(x, value)
        for dst in itertools.product(SBPS_2D, repeat=2):
            assert_layout(x.to_global(sbp=dst), value)


def test_round_trips(mesh):
    value = data((13, 17))
    for s in [S0, S1]:
        sbp = (s,) * mesh.ndim
        x = ct.tensor(value, placement=mesh, sbp=sbp)
        back = x.to_global(sbp=(B,) * mesh.ndim).to_global(sbp=sbp)
        for r, a in x.local_shards().items():
            np.testing.assert_array_equal(back.local_shards()[r], a)
        via_p = x.to_global(sbp=(P,) * mesh.ndim).to_global(sbp=sbp)
        assert_layout(via_p, value)


def test_uneven_rule_exact(mesh):
    """Shard shapes follow n//k + (i < n%k), nested splits in mesh-axis order."""
    n = 13
    x = ct.arange(n, placement=mesh, sbp=(S0,) * mesh.ndim)
    k = mesh.size
    sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
    starts = np.cumsum([0] + sizes)
    for r, a in x.local_shards().items():
        i = mesh.rank_list.index(r)
        if mesh.ndim == 2:  # nested: axis 0 first, then axis 1 inside it
            c0, c1 = mesh.coord(r)
            outer = [n // 2 + (1 if j < n % 2 else 0) for j in range(2)]
            o0 = sum(outer[:c0])
            inner = [outer[c0] // 2 + (1 if j < outer[c0] % 2 else 0) for j in range(2)]
            lo = o0 + sum(inner[:c1])
            np.testing.assert_array_equal(a, np.arange(lo, lo + inner[c1]))
        else:
            np.testing.assert_array_equal(a, np.arange(starts[i], starts[i + 1]))


def test_integer_and_bool_dtypes(mesh):
    value = np.arange(35, dtype=np.int32).reshape(5, 7)
    x = ct.tensor(value, placement=mesh, sbp=(S1,) * mesh.ndim)
    for dst in [B, S0, P, PMAX, PMIN]:
        y = x.to_global(sbp=(dst,) * mesh.ndim)
        np.testing.assert_array_equal(y.numpy(), value)
    flags = value % 3 == 0
    f = ct.tensor(flags, placement=mesh, sbp=(S0,) * mesh.ndim)
    np.testing.assert_array_equal(f.to_global(sbp=(S1,) * mesh.ndim).numpy(), flags)


def test_scalar_and_3d(mesh):
    s = ct.tensor(np.float64(3.5), placement=mesh, sbp=(P,) * mesh.ndim)
    assert s.to_global(sbp=(B,) * mesh.ndim).item() == 3.5
    value = data((5, 3, 7))
    x = ct.tensor(value, placement=mesh, sbp=(ct.sbp.split(2),) * mesh.ndim)
    assert_layout(x.to_global(sbp=(ct.sbp.split(1),) * mesh.ndim), value)
    assert_layout(x.to_global(sbp=(ct.sbp.split(-3),) * mesh.ndim), value)


def test_same_layout_returns_self(mesh):
    x = ct.ones(4, 4, placement=mesh, sbp=(S0,) * mesh.ndim)
    assert x.to_global() is x
    assert x.to_global(mesh, (S0,) * mesh.ndim) is x


def test_s0_to_s1_is_one_all_to_all(mesh):
    if mesh.ndim != 1 or mesh.size == 1:
        pytest.skip("1-D mesh of several ranks")
    x = ct.ones(8, 8, placement=mesh, sbp=S0)
    with ct.debug.comm_log() as log:
        x.to_global(sbp=S1)
    assert log.collectives() == ["all_to_all"]
    with ct.debug.comm_log() as log:
        x.to_global(sbp=P).to_global(sbp=S1)
    assert log.collectives() == ["reduce_scatter"]


def test_plans_are_cached(mesh):
    x = ct.ones(6, 6, placement=mesh, sbp=(S0,) * mesh.ndim)
    x.to_global(sbp=(B,) * mesh.ndim)
    before = boxing.plan.cache_info().hits
    y = ct.ones(6, 6, placement=mesh, sbp=(S0,) * mesh.ndim)  # another tensor, same layout
    y.to_global(sbp=(B,) * mesh.ndim)
    assert boxing.plan.cache_info().hits == before + 1


def test_a_tensor_is_boxed_once(mesh):
    # q, k and v of one x: the layout an op needs x in is made once, kept on x while x is
    # unchanged, and reused; a write in place makes it stale
    x = ct.tensor(np.arange(36.0).reshape(6, 6), placement=mesh, sbp=(S0,) * mesh.ndim)
    with ct.debug.comm_log() as first:
        x.argmax(0)  # argmax needs dim 0 whole
    with ct.debug.comm_log() as again:
        x.argmax(0)
        x.argmax(0)
    assert again.collectives() == []
    with ct.no_grad():
        x.add_(1.0)
    with ct.debug.comm_log() as after:
        got = x.argmax(0)
    assert after.collectives() == first.collectives()
    np.testing.assert_array_equal(got.numpy(), np.full(6, 5))


def test_a_kept_boxed_copy_is_counted_while_its_tensor_lives(mesh):
    # the copy kept on x for reuse holds memory: ct.debug.memory() counts it (activations)
    # until x is gone
    if mesh.size == 1:
        pytest.skip("one rank: x is already whole, nothing is boxed")
    held = [r for r in ct.runtime.world().held_ranks if r in mesh]
    if not held:  # (under mpiexec: a rank outside the mesh holds nothing to count)
        pytest.skip("this rank is not in the mesh")

    def activations() -> int:
        return ct.debug.memory(held[0]).current["activations"]

    with ct.debug.track_memory():
        base = activations()
        x = ct.tensor(np.arange(36.0).reshape(6, 6), placement=mesh, sbp=(S0,) * mesh.ndim)
        alone = activations()
        x.argmax(0)  # keeps x gathered along dim 0 (36 float64 per rank); the result is gone
        assert activations() - alone == 36 * 8
        del x
        assert activations() == base


# ----------------------------------------------------------------------------- placements
PLACEMENT_PAIRS = [
    ([0, 1, 2, 3], [1, 0]),                 # subset, reversed order
    ([0, 1], [2, 3]),                       # disjoint
    ([0], [0, 1, 2, 3]),                    # one -> many (pipeline-stage move)
    ([[0, 1], [2, 3]], [3, 2, 1, 0]),       # other mesh shape, reversed
    ([0, 1, 2], [1, 2, 3]),                 # overlapping
    ([[0, 1], [2, 3]], [0]),                # many -> one
    ([[0, 1], [2, 3]], [[0, 2], [1, 3]]),   # transposed mesh
]


def _sbps(ndim):
    return [tuple(t) for t in itertools.product([S0, S1, B, P], repeat=ndim)]


@pytest.mark.parametrize("src_ranks,dst_ranks", PLACEMENT_PAIRS, ids=str)
def test_cross_placement(world4, src_ranks, dst_ranks):
    src_p, dst_p = ct.placement("cpu", src_ranks), ct.placement("cpu", dst_ranks)
    for shape in [(13, 17), (1, 5), (4, 0)]:
        value = data(shape)
        for src in _sbps(src_p.ndim):
            x = ct.tensor(value, placement=src_p, sbp=src)
            for dst in _sbps(dst_p.ndim):
                y = x.to_global(dst_p, dst)
                assert y.placement == dst_p and y.sbp == dst
                assert_layout(y, value)


def test_cross_placement_backward_round_trip(world4):
    a = ct.placement("cpu", [0, 1])
    b = ct.placement("cpu", [2, 3])
    x = ct.tensor(data((5, 4)), placement=a, sbp=S0)
    y = x.to_global(b, S1).to_global(a, B)
    np.testing.assert_allclose(y.numpy(), data((5, 4)))


def test_buffer_pool_reuses_only_released_buffers():
    from ctensor.comm.buffers import BufferPool
    pool = BufferPool(max_bytes=64 << 20)
    a = pool.empty((512, 1024), np.float32)
    owner = id(a.base)                # (an id: holding the buffer would keep it busy)
    view = a.reshape(-1)[7:]          # a derived view keeps the buffer in use
    del a
    b = pool.empty((512, 1024), np.float32)
    assert id(b.base) != owner
    del view
    c = pool.empty((1024, 512), np.float32)   # same bytes, other shape: reused
    assert id(c.base) == owner and c.shape == (1024, 512) and c.flags.c_contiguous
    small = pool.empty((4,), np.float64)
    assert small.base is None          # small arrays are left to malloc
    del b, c
    assert pool.idle_bytes() == 2 * 512 * 1024 * 4
    pool.empty((16 << 20,), np.uint8)  # over the cap: idle buffers are evicted first
    assert pool.idle_bytes() <= 64 << 20


def test_three_axis_mesh_pairs(world4):
    """A 3-D mesh (2, 1, 2): nested splits over three axes, a size-1 axis in the middle."""
    mesh = ct.placement("cpu", [[[0, 1]], [[2, 3]]])
    value = data((7, 5, 3))
    sbps = [tuple(t) for t in itertools.product([S0, S1, B, P], repeat=3)]
    for src in sbps[::3]:
        x = ct.tensor(value, placement=mesh, sbp=src)
        for dst in sbps[::2]:
            assert_layout(x.to_global(sbp=dst), value)


def test_a_broadcast_tensor_meets_a_mesh_of_the_same_ranks_as_it_is(world4):
    # a tensor made without a placement (positions, a mask) is broadcast over the world's
    # 1-D placement; a model on a 2-D mesh of the same ranks uses it with no message
    S, B = ct.sbp.split, ct.sbp.broadcast
    mesh = ct.placement("cpu", [[0, 1], [2, 3]])
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(6), rng.standard_normal((5, 6))
    x = ct.tensor(a, placement=ct.placement("cpu", [0, 1, 2, 3]), requires_grad=True)
    y = ct.tensor(b, placement=mesh, sbp=(S(0), S(1)), requires_grad=True)
    with ct.debug.comm_log() as log:
        z = y * x
        w = (x > 0) & (y > 0)
    assert log.collectives() == []
    assert z.placement == mesh and z.sbp == (S(0), S(1)) and w.placement == mesh
    assert_layout(z, b * a)
    np.testing.assert_array_equal(w.numpy(), (a > 0) & (b > 0))
    z.sum().backward()
    assert x.grad.placement == x.placement and x.grad.sbp == (B,)
    np.testing.assert_allclose(x.grad.numpy(), b.sum(0))
    # the step is local and a view of each rank's shard; a split source is not taken so
    src = x._layout.with_sbp((B,))
    dst = ct.layout.Layout(src.shape, src.dtype, mesh, (B, B))
    assert [type(s).__name__ for s in boxing.plan(src, dst)] == ["_Rehome"]
    split = ct.tensor(a, placement=ct.placement("cpu", [0, 1, 2, 3]), sbp=S(0))
    with pytest.raises(ValueError, match="different placements"):
        split + y
    other = ct.tensor(a, placement=ct.placement("cpu", [0, 1]))
    with pytest.raises(ValueError, match="different placements"):
        other + y


def test_every_dim_pair_in_place_or_packed_is_exact(mesh):
    """The MPI collectives send, receive and reduce in place where the parts are consecutive
    byte ranges and through one packed buffer elsewhere: every split/concat dim pair of a 3-D
    uneven tensor, gathers and reduce-scatters along each dim, several dtypes, bit for bit;
    the source shards are left as they were and the results own their memory."""
    sbp = lambda s: (s,) * mesh.ndim  # noqa: E731
    value = np.arange(5 * 7 * 3, dtype=np.int64).reshape(5, 7, 3) - 40
    even = np.arange(4 * 8 * 4, dtype=np.int64).reshape(4, 8, 4)  # equal parts on 2 and 4
    cases = [value, value.astype(np.float64) / 7, value % 3 == 0, value * (1 - 2j), even]
    for arr in cases:
        dims = range(arr.ndim)
        for i in dims:
            x = ct.tensor(arr, placement=mesh, sbp=sbp(ct.sbp.split(i)))
            before = {r: a.copy() for r, a in x.local_shards().items()}
            results = [x.to_global(sbp=sbp(B))]
            results += [x.to_global(sbp=sbp(ct.sbp.split(j))) for j in dims if j != i]
            for y in results:
                np.testing.assert_array_equal(y.numpy(), arr)
                for r, a in y.local_shards().items():
                    np.testing.assert_array_equal(a, arr[slices_of(y, r)])
                    if boxing.communicates(x._layout, y._layout):
                        assert not np.shares_memory(a, x.local_shards()[r])
            for r, a in x.local_shards().items():
                np.testing.assert_array_equal(a, before[r])
        if arr.dtype == np.bool_:
            continue
        p = ct.tensor(arr, placement=mesh, sbp=sbp(B)).to_global(sbp=sbp(P))
        for j in dims:
            np.testing.assert_array_equal(p.to_global(sbp=sbp(ct.sbp.split(j))).numpy(), arr)
    # a shard that is a strided view of a bigger array (from_local keeps it as given)
    wide = np.arange(6 * 8, dtype=np.float64).reshape(6, 8)[:, ::2]
    held = [r for r in runtime.world().held_ranks if r in mesh]
    local = ({r: wide for r in held} if len(runtime.world().held_ranks) > 1
             else wide if held else None)
    x = ct.from_local(local, mesh, sbp(S0))
    full = np.concatenate([wide] * mesh.size)
    np.testing.assert_array_equal(x.to_global(sbp=sbp(S1)).numpy(), full)
    np.testing.assert_array_equal(x.to_global(sbp=sbp(B)).numpy(), full)


def slices_of(y, r):
    return tuple(slice(a, b) for a, b in y._layout.region(r))


def test_a_sum_of_two_partials_is_exact(mesh):
    """Two members scatter (or all-reduce) a partial sum by exchanging only each other's
    segment (or input, or by halves from pairsum.HALVES_BYTES: the odd element count of
    the large shape cuts it unevenly) and adding locally: the same bits as MPI's (two
    operands); the started all-reduce polled to its end gives the same."""
    if mesh.size != 2:
        pytest.skip("a group of two")
    rng = np.random.default_rng(3)
    cases = [(d, (4, 7, 3)) for d in (np.float32, np.float64, np.complex128, np.int32)]
    cases += [(np.float32, (363, 181, 1)), (np.float64, (181, 183, 1))]  # >= 256 KiB
    for dtype, shape in cases:
        values = {r: (rng.standard_normal(shape) * 100).astype(dtype) for r in mesh.rank_list}
        held = [r for r in runtime.world().held_ranks if r in mesh]
        local = ({r: values[r] for r in held} if len(runtime.world().held_ranks) > 1
                 else values[held[0]] if held else None)
        p = ct.from_local(local, mesh, (P,))
        total = values[mesh.rank_list[0]] + values[mesh.rank_list[1]]
        for dst in (ct.sbp.split(0), ct.sbp.split(1), ct.sbp.split(2), B):
            y = p.to_global(sbp=(dst,))
            np.testing.assert_array_equal(y.numpy(), total)
            assert y.numpy().dtype == dtype
            if dst == B:  # every member holds the same bits
                for a in y.local_shards().values():
                    np.testing.assert_array_equal(a, total)
                started = boxing.box_start(p._shards, p._layout, y._layout)
                while not started.test():
                    pass
                for a in started.wait().values():
                    np.testing.assert_array_equal(a, total)
