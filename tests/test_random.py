"""ctensor.random: Philox known answers, the documented bit recipe (a scalar reference and,
with a C++ compiler at hand, the CUDA kernel source built for the host), layout
independence over every mesh and SBP, MPI = simulation (hard-coded digests), state, errors.
"""
import ctypes
import hashlib
import math
import os
import shutil
import subprocess
import tempfile
from math import factorial

import numpy as np
import pytest

import ctensor as ct
from ctensor import _philox
from ctensor.random import Kind, region
from ctensor.sbp import Partial
from conftest import MPI_MODE

S, B = ct.sbp.split, ct.sbp.broadcast
P, PMAX = ct.sbp.partial_sum, ct.sbp.partial_max
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)


# ------------------------------------------------------------------ scalar reference
def philox_ref(ctr, key):
    """Philox4x32-10, written out as in the Random123 paper, on Python ints."""
    c, k = list(ctr), list(key)
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k[0], p1 & 0xFFFFFFFF, (p0 >> 32) ^ c[3] ^ k[1],
             p0 & 0xFFFFFFFF]
        k = [(k[0] + 0x9E3779B9) & 0xFFFFFFFF, (k[1] + 0xBB67AE85) & 0xFFFFFFFF]
    return c


def _split(v):
    return v & 0xFFFFFFFF, v >> 32


def words_ref(seed, call, block):
    return philox_ref(_split(block) + _split(call), _split(seed))


def _series(size):
    n_log, n_sin, n_cos = (5, 7, 8) if size == 4 else (11, 11, 12)
    return ([2.0 / (2 * i + 1) for i in range(n_log)],
            [(-1.0) ** i / factorial(2 * i + 1) for i in range(n_sin)],
            [(-1.0) ** i / factorial(2 * i) for i in range(n_cos)])


def _horner(x, c):
    p = x * c[-1]
    p = p + c[-2]
    for ci in c[-3::-1]:
        p = p * x
        p = p + ci
    return p


def box_muller_ref(N, V, bits, size):
    """The module doc's Box-Muller, one IEEE double operation per step."""
    log_c, sin_c, cos_c = _series(size)
    m, e = math.frexp(float(N))
    small = 1.0 if m < math.sqrt(0.5) else 0.0
    m = m + m * small
    e = e - int(small)
    d = m + 1.0
    m = (m - 1.0) / d
    p = _horner(m * m, log_c) * m
    p = p + float(e - bits) * math.log(2.0)
    r = math.sqrt(p * -2.0)
    half = bits - 1
    k = V >> half
    t = float((V & ((1 << half) - 1)) - (1 << (half - 1))) * (math.pi * 2.0 ** -half)
    r = r * (float(k) * -2.0 + 1.0)
    t2 = t * t
    return _horner(t2, cos_c) * r, _horner(t2, sin_c) * t * r


def element_ref(kind, dtype, seed, call, i, low=0, span=0):
    """Element ``i`` of a draw, straight from the table in ctensor/_philox.py."""
    E = 2 if kind == Kind.INTEGER or dtype.itemsize == 8 else 4
    block, j = divmod(i, E)
    x = words_ref(seed, call, block)
    if kind == Kind.INTEGER:
        v = (x[2 * j] << 32) | x[2 * j + 1]
        w = ((v % span if span else v) + low) % 2 ** 64
        if dtype.kind == "i" and w >= 2 ** 63:
            w -= 2 ** 64
        return np.array(w).astype(dtype)
    if dtype.itemsize == 8:
        if kind == Kind.UNIFORM:
            return np.float64((x[2 * j] * 2 ** 21 + (x[2 * j + 1] >> 11)) * 2.0 ** -53)
        N = x[0] * 2 ** 21 + (x[1] >> 11) + 1
        zc, zs = box_muller_ref(N, x[2] * 2 ** 21 + (x[3] >> 11), 53, 8)
        return np.float64(zs if j else zc)
    if kind == Kind.UNIFORM:
        return (np.float32((x[j] >> 8) * 2.0 ** -24) if dtype == F32
                else np.float16((x[j] >> 21) * 2.0 ** -11))
    zc, zs = box_muller_ref(x[j & 2] + 1, x[(j & 2) + 1], 32, 4)
    return np.float32(zs if j & 1 else zc).astype(dtype)


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# ------------------------------------------------------------------ Philox
@pytest.mark.parametrize("ctr, key, expected", [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_philox_known_answers(ctr, key, expected):
    assert tuple(philox_ref(ctr, key)) == expected
    block, call = ctr[0] | ctr[1] << 32, ctr[2] | ctr[3] << 32
    A, Bw = _philox.philox4x32(np.array([block], np.uint64), call, key[0] | key[1] << 32)
    assert (int(A[0, 0]), int(Bw[0, 0]), int(A[1, 0]), int(Bw[1, 0])) == expected


def test_vectorised_philox_matches_scalar_reference():
    rng = np.random.default_rng(7)
    blocks = np.concatenate([rng.integers(0, 2 ** 63, 20, dtype=np.int64).view(np.uint64),
                             np.array([0, 1, 2 ** 32 - 1, 2 ** 32, 2 ** 64 - 1], np.uint64)])
    for seed, call in [(0, 0), (2 ** 64 - 1, 2 ** 64 - 1), (0x1234_5678_9ABC_DEF0, 3)]:
        A, Bw = _philox.philox4x32(blocks, call, seed)
        for q, b in enumerate(blocks.tolist()):
            got = [int(A[0, q]), int(Bw[0, q]), int(A[1, q]), int(Bw[1, q])]
            assert got == words_ref(seed, call, b)


# ------------------------------------------------------------------ the bit recipe
RECIPES = [(Kind.UNIFORM, F32), (Kind.UNIFORM, F64), (Kind.UNIFORM, F16), (Kind.NORMAL, F32),
           (Kind.NORMAL, F64), (Kind.NORMAL, F16)]
INT_RECIPES = [(np.dtype(np.int64), -5, 2 ** 40), (np.dtype(np.int64), 0, 2 ** 64),
               (np.dtype(np.int32), -(2 ** 31), 2 ** 32), (np.dtype(np.uint8), 3, 200)]


@pytest.mark.parametrize("kind, dtype", RECIPES, ids=lambda v: str(v))
def test_region_matches_elementwise_recipe(kind, dtype):
    seed, call = 0xDEADBEEF_00C0FFEE, 2 ** 33 + 5
    shape = (3, 11, 7)
    got = region(kind, shape, ((0, 3), (2, 9), (1, 6)), dtype, (seed, call))
    idx = np.arange(3 * 11 * 7).reshape(shape)[:, 2:9, 1:6]
    want = np.array([element_ref(kind, dtype, seed, call, int(i)) for i in idx.ravel()])
    assert same_bits(got.ravel(), want.astype(dtype))


@pytest.mark.parametrize("dtype, low, span", INT_RECIPES, ids=str)
def test_integer_region_matches_elementwise_recipe(dtype, low, span):
    seed, call = 99, 4
    got = region(Kind.INTEGER, (41,), ((3, 40),), dtype, (seed, call), low=low, span=span % 2 ** 64)
    want = [element_ref(Kind.INTEGER, dtype, seed, call, i, low, span % 2 ** 64)
            for i in range(3, 40)]
    assert same_bits(got, np.array(want, dtype))


@pytest.mark.parametrize("kind, dtype", RECIPES, ids=lambda v: str(v))
def test_any_region_is_a_slice_of_the_whole(kind, dtype):
    shape, key = (7, 9, 5), (5, 3)
    whole = region(kind, shape, tuple((0, n) for n in shape), dtype, key)
    boxes = [((0, 7), (2, 5), (0, 5)), ((3, 4), (0, 9), (1, 2)), ((1, 6), (3, 8), (0, 5)),
             ((0, 7), (0, 9), (4, 5)), ((6, 7), (8, 9), (4, 5)), ((2, 2), (0, 9), (0, 5))]
    for box in boxes:
        part = region(kind, shape, box, dtype, key)
        assert same_bits(part, whole[tuple(slice(a, b) for a, b in box)]), box
    assert same_bits(region(kind, (), (), dtype, key), whole.reshape(-1)[:1].reshape(()))


# Kernel entry points for the host build of the CUDA source (one per kind and dtype).
_HOST_WRAPPER = """
#include <cmath>
#define __device__ static inline
using std::frexp; using std::sqrt;
%(preamble)s
%(functions)s
"""
_HOST_FUNCTION = """
extern "C" void %(name)s(const unsigned long long* idxs, long n, unsigned int k0,
    unsigned int k1, unsigned int c2, unsigned int c3, unsigned long long low,
    unsigned long long span, %(ctype)s* outs) {
  typedef %(ctype)s T;
  for (long q = 0; q < n; ++q) { unsigned long long idx = idxs[q]; T out; %(body)s outs[q] = out; }
}
"""
_HOST_CASES = [(Kind.UNIFORM, F32, "float"), (Kind.UNIFORM, F64, "double"),
               (Kind.NORMAL, F32, "float"), (Kind.NORMAL, F64, "double"),
               (Kind.INTEGER, np.dtype(np.int64), "long long"),
               (Kind.INTEGER, np.dtype(np.int32), "int"),
               (Kind.INTEGER, np.dtype(np.uint8), "unsigned char")]


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build the kernel source")
def test_cuda_kernel_source_gives_the_same_bits_on_the_host():
    """The CuPy kernel's arithmetic, compiled for the CPU without FMA contraction, must give
    NumPy's bits (the GPU build uses --fmad=false for the same reason)."""
    functions = "".join(_HOST_FUNCTION % dict(name=f"k{n}", ctype=ctype,
                                              body="{" + _philox.CUDA_SOURCE[kind] + "}")
                        for n, (kind, _, ctype) in enumerate(_HOST_CASES))
    folder = tempfile.mkdtemp(prefix="ctensor_kernel_")
    try:
        src, lib = os.path.join(folder, "k.cpp"), os.path.join(folder, "k.so")
        with open(src, "w") as f:
            f.write(_HOST_WRAPPER % dict(preamble=_philox.CUDA_PREAMBLE, functions=functions))
        subprocess.run(["g++", "-O2", "-ffp-contract=off", "-shared", "-fPIC", "-o", lib, src],
                       check=True, capture_output=True)
        so = ctypes.CDLL(lib)
        shape, box = (5, 13), ((1, 4), (3, 12))
        idx = np.ascontiguousarray(
            (np.arange(*box[0])[:, None] * shape[1] + np.arange(*box[1])).astype(np.uint64))
        seed, call, low, span = 2 ** 40 + 17, 2 ** 35 + 9, -7, 1000
        for n, (kind, dtype, _) in enumerate(_HOST_CASES):
            out = np.empty(idx.shape, dtype)
            getattr(so, f"k{n}")(
                idx.ctypes.data_as(ctypes.c_void_p), ctypes.c_long(idx.size),
                ctypes.c_uint(seed & 0xFFFFFFFF), ctypes.c_uint(seed >> 32),
                ctypes.c_uint(call & 0xFFFFFFFF), ctypes.c_uint(call >> 32),
                ctypes.c_ulonglong(low % 2 ** 64), ctypes.c_ulonglong(span),
                out.ctypes.data_as(ctypes.c_void_p))
            want = region(kind, shape, box, dtype, (seed, call), low=low, span=span)
            assert same_bits(out, want), (kind, dtype)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ------------------------------------------------------------------ statistics
def test_statistics_of_a_million_samples():
    one = ct.placement("cpu", [0])
    ct.manual_seed(123)
    n = 1_000_000
    for dtype in (np.float32, np.float64):
        u = ct.rand(n, placement=one, dtype=dtype).numpy().astype(np.float64)
        assert u.min() >= 0.0 and u.max() < 1.0
        assert abs(u.mean() - 0.5) < 5 * math.sqrt(1 / 12 / n)
        assert abs(u.var() - 1 / 12) < 2e-3
        z = ct.randn(n, placement=one, dtype=dtype).numpy().astype(np.float64)
        assert abs(z.mean()) < 5 / math.sqrt(n)
        assert abs(z.var() - 1) < 5 * math.sqrt(2 / n)
        assert abs((np.abs(z) > 2).mean() - 0.0455) < 2e-3         # the tails are there
        assert abs(np.mean(z ** 4) - 3) < 0.05                      # normal kurtosis
        assert abs(np.corrcoef(z[0::2], z[1::2])[0, 1]) < 5 / math.sqrt(n / 2)
    k = ct.randint(0, 10, (n,), placement=one).numpy()
    counts = np.bincount(k, minlength=10)
    assert k.dtype == np.int64 and counts.size == 10
    assert np.all(np.abs(counts - n / 10) < 5 * math.sqrt(n / 10))


# ------------------------------------------------------------------ layout independence
def _sbps(mesh, ndim):
    one_d = [B, P, PMAX] + [S(d) for d in range(ndim)]
    if mesh.ndim == 1:
        return [(s,) for s in one_d]
    return [(S(0), S(0)), (S(0), S(ndim - 1)), (S(ndim - 1), S(0)), (B, S(ndim - 1)),
            (P, S(0)), (S(ndim - 1), PMAX), (B, B)]


DRAWS = {
    "rand_f32": lambda shape, **kw: ct.rand(*shape, **kw),
    "rand_f64": lambda shape, **kw: ct.rand(*shape, dtype=np.float64, **kw),
    "randn_f32": lambda shape, **kw: ct.randn(*shape, **kw),
    "randn_f64": lambda shape, **kw: ct.randn(shape, dtype=np.float64, **kw),
    "randn_f16": lambda shape, **kw: ct.randn(shape, dtype=np.float16, **kw),
    "randint": lambda shape, **kw: ct.randint(-3, 1000, shape, **kw),
}


@pytest.mark.parametrize("draw", sorted(DRAWS))
def test_value_does_not_depend_on_placement_or_sbp(mesh, draw):
    one = ct.placement("cpu", [0])
    for shape in [(7, 5), (8, 12), (3, 2, 5), (10,)]:
        for sbp in _sbps(mesh, len(shape)):
            ct.manual_seed(11)
            ct.rand(3, placement=one)                       # the call counter moves on
            want = DRAWS[draw](shape, placement=one).numpy()
            ct.manual_seed(11)
            ct.rand(3, placement=mesh, sbp=(S(0),) * mesh.ndim)
            x = DRAWS[draw](shape, placement=mesh, sbp=sbp)
            assert x.placement == mesh and x.sbp == tuple(sbp) and x.shape == shape
            assert same_bits(x.numpy(), want), (shape, sbp)
            if not any(isinstance(s, Partial) for s in sbp):
                for r, arr in x.local_shards().items():
                    part = want[tuple(slice(a, b) for a, b in x._layout.region(r))]
                    assert same_bits(arr, part), (shape, sbp, r)


def test_same_bits_for_every_simulated_world_size():
    ct.manual_seed(5)
    want = ct.randn(9, 6, placement=ct.placement("cpu", [0]), dtype=np.float64).numpy()
    for size, ranks in [(1, [0]), (2, [0, 1]), (3, [2, 0, 1]), (4, [[0, 1], [2, 3]]),
                        (4, [[3, 2], [1, 0]])]:
        with ct.simulate(size):
            mesh = ct.placement("cpu", ranks)
            for sbp in ([S(1)] * mesh.ndim, [S(0)] * mesh.ndim):
                ct.manual_seed(5)
                x = ct.randn(9, 6, placement=mesh, sbp=tuple(sbp), dtype=np.float64)
                assert same_bits(x.numpy(), want), (size, ranks, sbp)


FIRST_VALUES = ["0x1.3516d6e689812p-1", "0x1.f81d53722acd1p-1", "0x1.629853bdbe5b0p-2",
                "0x1.cbb91544ed87ep-1"]


def _digest(x):
    return hashlib.sha256(x.numpy().tobytes()).hexdigest()[:16]


# Computed once in simulation; MPI runs (any world size) must give the very same bits, and
# any change to the bit recipe shows up here (it would change every seeded model).
DIGESTS = {"rand": "df1b18cf3deaecaf", "randn": "258ce32eb0bea770",
           "randn64": "fd3ed28c30bc8e8c", "randint": "6d935bb1a05fe21a"}


def test_hard_coded_digests_in_every_mode():
    p = ct.placement.all()
    sbp = ct.sbp.split(1)
    ct.manual_seed(2024)
    got = {"rand": _digest(ct.rand(37, 29, placement=p, sbp=sbp)),
           "randn": _digest(ct.randn(37, 29, placement=p, sbp=sbp)),
           "randn64": _digest(ct.randn(37, 29, placement=p, sbp=sbp, dtype=np.float64)),
           "randint": _digest(ct.randint(-50, 50, (37, 29), placement=p, sbp=sbp))}
    assert got == DIGESTS
    ct.manual_seed(2024)
    first = ct.rand(4, dtype=np.float64).numpy()
    assert [v.hex() for v in first.tolist()] == FIRST_VALUES




def test_ranks_outside_the_placement_advance_the_counter(mesh):
    last = mesh.rank_list[-1]
    ct.manual_seed(3)
    ct.rand(5, placement=ct.placement("cpu", [last]))       # only the last rank holds it
    state = ct.random.get_state()
    x = ct.randn(6, 4, placement=mesh, sbp=(S(0),) * mesh.ndim)
    ct.manual_seed(3)
    ct.rand(5, placement=ct.placement("cpu", [0]))
    assert ct.random.get_state() == state == {"seed": 3, "counter": 1}
    want = ct.randn(6, 4, placement=ct.placement("cpu", [0])).numpy()
    assert same_bits(x.numpy(), want)


# ------------------------------------------------------------------ state and API
def test_state_round_trip_and_seeds():
    one = ct.placement("cpu", [0])
    ct.manual_seed(77)
    assert ct.random.initial_seed() == 77
    state = ct.random.get_state()
    a = ct.rand(5, placement=one).numpy()
    b = ct.rand(5, placement=one).numpy()
    assert not np.array_equal(a, b)                          # each call is a new stream
    ct.random.set_state(state)
    assert same_bits(ct.rand(5, placement=one).numpy(), a)
    assert ct.random.get_state() == {"seed": 77, "counter": 1}
    ct.manual_seed(78)
    assert not np.array_equal(ct.rand(5, placement=one).numpy(), a)
    ct.manual_seed(-1)
    assert ct.random.initial_seed() == 2 ** 64 - 1
    assert ct.random.next_key() == (2 ** 64 - 1, 0) and ct.random.next_key() == (2 ** 64 - 1, 1)


def test_like_functions_follow_x(mesh):
    x = ct.ones(6, 5, placement=mesh, sbp=(P,) + (S(1),) * (mesh.ndim - 1), dtype=np.float64)
    ct.manual_seed(9)
    u = ct.rand_like(x)
    assert u.shape == x.shape and u.dtype == x.dtype and u.placement == mesh
    assert u.sbp == (B,) + (S(1),) * (mesh.ndim - 1)
    z = ct.randn_like(x, dtype=np.float32, sbp=(S(0),) * mesh.ndim)
    assert z.dtype == np.float32 and z.sbp == (S(0),) * mesh.ndim
    ct.manual_seed(9)
    one = ct.placement("cpu", [0])
    assert same_bits(u.numpy(), ct.rand(6, 5, placement=one, dtype=np.float64).numpy())
    assert same_bits(z.numpy(), ct.randn(6, 5, placement=one).numpy())
    w = ct.randn(3, 4, requires_grad=True)
    assert w.requires_grad and w.is_leaf and w.grad is None


def test_randint_range_and_dtype():
    one = ct.placement("cpu", [0])
    ct.manual_seed(1)
    k = ct.randint(-4, 3, (200,), placement=one).numpy()
    assert k.dtype == np.int64 and k.min() == -4 and k.max() == 2
    k = ct.randint(5, (300,), placement=one, dtype=np.uint8).numpy()
    assert k.dtype == np.uint8 and set(k.tolist()) == set(range(5))
    k = ct.randint(-(2 ** 63), 2 ** 63, (100,), placement=one).numpy()
    assert k.dtype == np.int64 and k.min() < -(2 ** 60) and k.max() > 2 ** 60
    k = ct.randint(-128, 128, [50, 2], placement=one, dtype=np.int8).numpy()
    assert k.shape == (50, 2) and k.dtype == np.int8


@pytest.mark.parametrize("call, error", [
    (lambda: ct.rand(-1, 3), ValueError),
    (lambda: ct.randn(2, 2.5), ValueError),
    (lambda: ct.rand(3, dtype=np.int32), TypeError),
    (lambda: ct.randn(3, dtype="not-a-dtype"), TypeError),
    (lambda: ct.rand(3, requires_grad=1), TypeError),
    (lambda: ct.rand(3, placement=[0]), TypeError),
    (lambda: ct.randint(5, 5, (3,)), ValueError),
    (lambda: ct.randint(7, 2, (3,)), ValueError),
    (lambda: ct.randint(0, 10, (3,), dtype=np.float32), TypeError),
    (lambda: ct.randint(0, 300, (3,), dtype=np.uint8), ValueError),
    (lambda: ct.randint(-1, 3, (3,), dtype=np.uint8), ValueError),
    (lambda: ct.randint(0.5, 3, (3,)), TypeError),
    (lambda: ct.randint(0, 3, (-2,)), ValueError),
    (lambda: ct.randint(0, 3), TypeError),
    (lambda: ct.randint(0, 3, (3,), requires_grad=True), ValueError),
    (lambda: ct.rand_like(np.ones(3)), TypeError),
    (lambda: ct.rand_like(ct.ones(3, dtype=np.int64)), TypeError),
    (lambda: ct.manual_seed("7"), TypeError),
    (lambda: ct.manual_seed(1.5), TypeError),
    (lambda: ct.random.set_state({"seed": 1}), TypeError),
    (lambda: ct.random.set_state({"seed": 1, "counter": -1}), ValueError),
    (lambda: ct.random.set_state({"seed": "1", "counter": 0}), TypeError),
])
def test_bad_arguments_raise_before_drawing(call, error):
    ct.manual_seed(0)
    with pytest.raises(error) as info:
        call()
    assert info.value.args and isinstance(info.value.args[0], str)
    assert ct.random.get_state() == {"seed": 0, "counter": 0}   # nothing was drawn


# ------------------------------------------------------------------ Generator
def test_generators_are_independent_streams():
    one = ct.placement("cpu", [0])
    assert ct.manual_seed(5) is ct.default_generator and ct.initial_seed() == 5
    g = ct.Generator()
    assert g.initial_seed() == 0 and g.device == "cpu" and "seed=0" in repr(g)
    assert g.manual_seed(5) is g and g.get_state() == {"seed": 5, "counter": 0}
    a = ct.rand(4, 3, generator=g, placement=one).numpy()
    assert ct.random.get_state() == {"seed": 5, "counter": 0}       # default did not move
    assert same_bits(a, ct.rand(4, 3, placement=one).numpy())       # same seed, same bits
    assert g.get_state() == {"seed": 5, "counter": 1}
    state = g.get_state()
    draws = [lambda: ct.randn(5, generator=g, placement=one),
             lambda: ct.randint(0, 9, (5,), generator=g, placement=one),
             lambda: ct.randperm(6, generator=g, placement=one),
             lambda: ct.rand_like(ct.ones(2, 2, placement=one), generator=g),
             lambda: ct.randn_like(ct.ones(2, 2, placement=one), generator=g),
             lambda: ct.ones(4, placement=one).uniform_(generator=g),
             lambda: ct.ones(4, placement=one).normal_(generator=g),
             lambda: ct.ones(4, placement=one).exponential_(generator=g),
             lambda: ct.ones(4, placement=one).bernoulli_(generator=g),
             lambda: ct.bernoulli(ct.full((4,), 0.5, placement=one), generator=g),
             lambda: ct.multinomial(ct.ones(4, placement=one), 2, generator=g)]
    first = [d().numpy() for d in draws]
    assert g.get_state()["counter"] == 1 + len(draws)
    assert ct.random.get_state() == {"seed": 5, "counter": 1}
    assert g.set_state(state) is g
    assert all(same_bits(d().numpy(), f) for d, f in zip(draws, first))
    ct.manual_seed(5)
    ct.rand(1, placement=one)
    assert same_bits(ct.randn(5, placement=one).numpy(), first[0])   # the same stream
    seeded = g.seed()                       # entropy, agreed by every rank
    assert g.initial_seed() == seeded and g.get_state() == {"seed": seeded, "counter": 0}
    assert 0 <= ct.seed() < 2 ** 64 and ct.initial_seed() == ct.default_generator.initial_seed()
    assert ct.Generator(device="cuda").device == "cuda"
    with pytest.raises(ValueError, match="Generator: argument 'device' must be 'cpu' or 'cuda'"):
        ct.Generator("tpu")
    with pytest.raises(TypeError, match="rand: argument 'generator' must be a ct.Generator"):
        ct.rand(3, generator=np.random.default_rng(0))
    with pytest.raises(TypeError, match="set_state: argument 'state' must be a dict"):
        g.set_state([1, 2])


def test_seed_is_the_same_on_every_rank(mesh):
    ct.seed()
    x = ct.rand(4, 6, placement=mesh, sbp=(S(1),) * mesh.ndim)
    shards = x.local_shards()
    want = x.numpy()                       # one logical value: every rank drew alike
    for r, arr in shards.items():
        assert same_bits(arr, want[tuple(slice(a, b) for a, b in x._layout.region(r))])


# ------------------------------------------------------------------ sampling
def _region_of(shape, kind, key, dtype=np.float64, low=0, span=0):
    return region(kind, shape, tuple((0, n) for n in shape), dtype, key, np, low, span)


SAMPLING = {
    "randperm": lambda mesh, sbp: ct.randperm(23, placement=mesh, sbp=sbp),
    "randperm_f32": lambda mesh, sbp: ct.randperm(9, placement=mesh, sbp=sbp,
                                                  dtype=np.float32),
    "multinomial": lambda mesh, sbp: ct.multinomial(_weights(mesh, sbp), 4),
    "multinomial_replacement": lambda mesh, sbp: ct.multinomial(_weights(mesh, sbp), 9, True),
    "multinomial_one_row": lambda mesh, sbp: ct.multinomial(_weights(mesh, sbp)[3:4], 2, True),
    "uniform_": lambda mesh, sbp: ct.zeros(7, 5, placement=mesh, sbp=_nd(sbp, 2)).uniform_(2, 3),
    "normal_": lambda mesh, sbp: ct.zeros(7, 5, placement=mesh, sbp=_nd(sbp, 2),
                                          dtype=np.float64).normal_(1, 2),
    "exponential_": lambda mesh, sbp: ct.zeros(7, 5, placement=mesh, sbp=_nd(sbp, 2),
                                               dtype=np.float16).exponential_(),
    "bernoulli_": lambda mesh, sbp: ct.zeros(7, 5, placement=mesh, sbp=_nd(sbp, 2),
                                             dtype=np.int32).bernoulli_(0.3),
    "bernoulli": lambda mesh, sbp: ct.bernoulli(_weights(mesh, sbp) / 3.0),
}


def _nd(sbp, ndim):
    """``sbp`` with splits of dims the tensor lacks made broadcast."""
    return tuple(B if isinstance(s, ct.sbp.Split) and s.dim >= ndim else s for s in sbp)


def _weights(mesh, sbp):
    w = np.abs(np.sin(np.arange(7 * 11, dtype=np.float64))).reshape(7, 11)
    w[2, :7] = 0.0                          # a row with just enough positive weights (4)
    return ct.tensor(w, placement=mesh, sbp=_nd(sbp, 2))


@pytest.mark.parametrize("name", sorted(SAMPLING))
def test_sampling_does_not_depend_on_placement_or_sbp(mesh, name):
    one = ct.placement("cpu", [0])
    ct.manual_seed(21)
    want = SAMPLING[name](one, (B,)).numpy()
    for sbp in _sbps(mesh, 2):
        if name.startswith("randperm"):
            sbp = tuple(B if isinstance(s, Partial) or getattr(s, "dim", 0) > 0 else s
                        for s in sbp)
        ct.manual_seed(21)
        x = SAMPLING[name](mesh, sbp)
        assert x.placement == mesh
        assert same_bits(x.numpy(), want), (name, sbp)
    assert ct.random.get_state()["counter"] == 1        # one call each, on every rank


def test_randperm_is_the_argsort_of_one_draw():
    one = ct.placement("cpu", [0])
    ct.manual_seed(4)
    p = ct.randperm(1000, placement=one).numpy()
    keys = _region_of((1000,), Kind.INTEGER, (4, 0), np.int64, 0, 1 << 63)
    assert keys.min() >= 0 and p.dtype == np.int64
    np.testing.assert_array_equal(p, np.argsort(keys, kind="stable"))
    assert sorted(p.tolist()) == list(range(1000))
    assert ct.randperm(0, placement=one).shape == (0,)
    assert ct.randperm(5, dtype=ct.float64, requires_grad=True).requires_grad


def test_sampling_statistics():
    one = ct.placement("cpu", [0])
    ct.manual_seed(8)
    w = np.array([0.1, 0.0, 0.2, 0.3, 0.4])
    n = 40000
    draws = ct.multinomial(ct.tensor(w, placement=one), n, replacement=True).numpy()
    freq = np.bincount(draws, minlength=5) / n
    np.testing.assert_allclose(freq, w, atol=0.01)
    assert freq[1] == 0
    rows = ct.tensor(np.tile(w * 7.0, (4000, 1)), placement=one)     # weights need not sum 1
    picks = ct.multinomial(rows, 3).numpy()
    assert all(len(set(r)) == 3 for r in picks.tolist()) and (picks != 1).all()
    np.testing.assert_allclose(np.bincount(picks[:, 0], minlength=5) / 4000, w, atol=0.025)
    # second pick without replacement: P(j second) = sum_i w_i w_j / (1 - w_i)
    second = [sum(w[i] * w[j] / (1 - w[i]) for i in range(5) if i != j) for j in range(5)]
    np.testing.assert_allclose(np.bincount(picks[:, 1], minlength=5) / 4000, second, atol=0.025)
    x = ct.empty(200000, dtype=ct.float64, placement=one)
    e = x.exponential_(4.0).numpy()
    assert e.min() >= 0 and abs(e.mean() - 0.25) < 0.005 and abs(e.std() - 0.25) < 0.005
    u = x.uniform_(-2.0, 6.0).numpy()
    assert u.min() >= -2.0 and u.max() < 6.0 and abs(u.mean() - 2.0) < 0.03
    z = x.normal_(3.0, 0.5).numpy()
    assert abs(z.mean() - 3.0) < 0.01 and abs(z.std() - 0.5) < 0.01
    b = ct.zeros(100000, dtype=ct.long, placement=one).bernoulli_(0.25).numpy()
    assert b.dtype == np.int64 and set(b.tolist()) == {0, 1} and abs(b.mean() - 0.25) < 0.01
    p = ct.tensor(np.linspace(0, 1, 5), placement=one)
    hits = np.mean([ct.bernoulli(p).numpy() for _ in range(2000)], axis=0)
    np.testing.assert_allclose(hits, np.linspace(0, 1, 5), atol=0.04)
    assert hits[0] == 0 and hits[-1] == 1


def test_in_place_sampling_rules():
    w = ct.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="uniform_: a leaf tensor that requires grad"):
        w.uniform_()
    with ct.no_grad():
        assert w.normal_() is w and w.requires_grad and w.is_leaf
    h = w * 2
    h.uniform_(**{"from": 5, "to": 6})                 # PyTorch's keyword names
    assert not h.requires_grad and (h.numpy() >= 5).all()


@pytest.mark.parametrize("call, error, words", [
    (lambda: ct.randperm(-1), ValueError, "randperm: argument 'n' must be >= 0"),
    (lambda: ct.randperm(3.0), TypeError, "randperm: argument 'n' must be an int"),
    (lambda: ct.randperm(3000, dtype=ct.float16), TypeError, "holds 0..2999 exactly"),
    (lambda: ct.randperm(3, dtype=ct.bool), TypeError, "randperm: argument 'dtype'"),
    (lambda: ct.randperm(3, requires_grad=True), ValueError, "needs a floating dtype"),
    (lambda: ct.multinomial(ct.ones(3), 4), ValueError, "without replacement at most"),
    (lambda: ct.multinomial(ct.ones(3), 0, True), ValueError, "'num_samples' is 0"),
    (lambda: ct.multinomial(ct.ones(3), 2.0), TypeError, "'num_samples' must be an int"),
    (lambda: ct.multinomial(ct.ones(2, 2, 2), 1), ValueError, "1-D or 2-D floating"),
    (lambda: ct.multinomial(ct.ones(3, dtype=ct.long), 1), ValueError, "1-D or 2-D floating"),
    (lambda: ct.multinomial(ct.tensor([1.0, -1.0, 2.0]), 1), ValueError,
     "1 elements of 'input' are negative, inf or nan"),
    (lambda: ct.multinomial(ct.tensor([[1.0, float("nan")]]), 1, True), ValueError,
     "negative, inf or nan"),
    (lambda: ct.multinomial(ct.tensor([[1.0, 0.0], [0.0, 0.0]]), 1, True), ValueError,
     "1 rows of 'input' have fewer than 1 positive weights"),
    (lambda: ct.multinomial(ct.tensor([1.0, 0.0, 0.0]), 2), ValueError,
     "fewer than 2 positive weights"),
    (lambda: ct.ones(3, dtype=ct.long).uniform_(), TypeError, "uniform_: the tensor has dtype"),
    (lambda: ct.ones(3).uniform_(2, 1), ValueError, "expects from <= to"),
    (lambda: ct.ones(3).uniform_(0, 1, 2), TypeError, "accepted: uniform_(from=0, to=1"),
    (lambda: ct.ones(3).uniform_(low=0), TypeError, "unexpected arguments ['low']"),
    (lambda: ct.ones(3).normal_(0, -1), ValueError, "normal_: expects std >= 0.0"),
    (lambda: ct.ones(3).normal_("0"), TypeError, "normal_: argument 'mean' must be a real"),
    (lambda: ct.ones(3).exponential_(0), ValueError, "exponential_: expects lambd > 0.0"),
    (lambda: ct.ones(3).bernoulli_(1.5), ValueError, "bernoulli_: expects 0 <= p <= 1"),
    (lambda: ct.ones(3).bernoulli_(ct.tensor([0.5, 2.0, 0.1])), ValueError,
     "1 elements of 'p' are outside it"),
    (lambda: ct.bernoulli(ct.ones(3, dtype=ct.long)), TypeError, "must have a floating"),
    (lambda: ct.bernoulli(np.ones(3)), TypeError, "bernoulli: argument 'input' must be a ct"),
    (lambda: ct.ones(3).normal_(generator=3), TypeError, "must be a ct.Generator"),
])
def test_sampling_bad_arguments_raise_before_drawing(call, error, words):
    ct.manual_seed(0)
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)
    assert ct.random.get_state() == {"seed": 0, "counter": 0}   # nothing was drawn


# Computed once in simulation; MPI runs must give the very same bits.
SAMPLING_DIGESTS = {"exponential": "15c413522098c3c5", "multinomial": "e033f773310c28c1",
                    "multinomial_r": "103be05b8d16c5eb", "randperm": "de9a44d2ae2c2c92"}


def test_sampling_digests_in_every_mode():
    p = ct.placement.all()
    ct.manual_seed(2024)
    w = ct.tensor(np.abs(np.cos(np.arange(60.0))).reshape(6, 10), placement=p,
                  sbp=ct.sbp.split(0))
    got = {"randperm": _digest(ct.randperm(101, placement=p, sbp=S(0))),
           "multinomial": _digest(ct.multinomial(w, 5)),
           "multinomial_r": _digest(ct.multinomial(w, 7, True)),
           "exponential": _digest(ct.zeros(13, 7, placement=p, sbp=S(1)).exponential_())}
    assert got == SAMPLING_DIGESTS


def test_randint_like_follows_x(mesh):
    x = ct.zeros(6, 5, placement=mesh, sbp=(P,) + (S(1),) * (mesh.ndim - 1), dtype=ct.int32)
    ct.manual_seed(9)
    k = ct.randint_like(x, 7)
    assert k.dtype == np.int32 and k.shape == (6, 5) and k.placement == mesh
    assert k.sbp == (B,) + (S(1),) * (mesh.ndim - 1)
    ct.manual_seed(9)
    want = ct.randint(0, 7, (6, 5), placement=ct.placement("cpu", [0]), dtype=ct.int32)
    assert same_bits(k.numpy(), want.numpy())
    f = ct.randint_like(ct.ones(400, placement=mesh), -3, 3, generator=ct.Generator())
    values = f.numpy()
    assert f.dtype == np.float32 and set(values.tolist()) == set(range(-3, 3))
    with pytest.raises(ValueError, match="randint_like: \\[low, high\\) = \\[0, 100000\\)"):
        ct.randint_like(ct.ones(2, dtype=ct.half), 100000)
    with pytest.raises(TypeError, match="randint_like: argument 'input' must be a ct.Tensor"):
        ct.randint_like(np.ones(2), 3)
    torch = pytest.importorskip("torch")
    t = torch.randint_like(torch.ones(400), -3, 3)
    assert str(t.dtype).removeprefix("torch.") == f.dtype.name
    assert set(t.unique().tolist()) == set(range(-3, 3))


def test_sampling_runs_shape_only():
    if MPI_MODE:
        pytest.skip("simulation-only behaviour")
    ct.manual_seed(0)
    with ct.simulate(2, meta=True):
        p = ct.placement("cpu", [0, 1])
        x = ct.zeros(4, 6, placement=p, sbp=S(0))
        for filled in (x.uniform_(), x.normal_(), x.exponential_(), x.bernoulli_(0.5)):
            assert filled is x and x.is_meta
        assert ct.multinomial(x, 2).shape == (4, 2) and ct.multinomial(x, 3, True).sbp == (S(0),)
        assert ct.randperm(5, placement=p).is_meta and ct.bernoulli(x).shape == (4, 6)
        assert ct.random.get_state()["counter"] == 8       # every call still takes a counter
