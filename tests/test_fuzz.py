"""Fuzz the public constructors and ``to_global`` with random bad arguments (hypothesis).

Every call either works or raises ``ValueError`` / ``TypeError`` -- nothing else -- and the
world stays usable: a ``to_global`` afterwards gives the right values. Examples are
derandomized, so under mpiexec every rank runs the same ones (a collective that some rank
skipped would hang, and the timeout would fail the run).
"""
from __future__ import annotations

import contextlib
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import ctensor as ct
from conftest import MPI_MODE

S, B = ct.sbp.split, ct.sbp.broadcast
SETTINGS = settings(max_examples=100, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))

# numbers are small or absurd: a plausible but huge size would really be allocated
numbers = st.one_of(
    st.integers(-3, 8), st.sampled_from([-10**30, 10**30, 2**63, -2**63 - 1, 2**64]),
    st.floats(-1e3, 1e3), st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e300]),
    st.complex_numbers(max_magnitude=1e3))
scalars = st.one_of(
    st.none(), st.booleans(), numbers,
    st.text(max_size=3), st.binary(max_size=3), st.just(object()), st.just(np.float64(2.0)),
    st.just(np.int64(3)), st.just(ct.sbp.split(0)), st.just(ct.sbp.broadcast))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.tuples(inner, inner),
    st.dictionaries(st.integers(0, 3), inner, max_size=2)), max_leaves=6)
sbp_entries = st.one_of(
    st.builds(S, st.integers(-5, 5)), st.just(B), st.just(ct.sbp.partial_sum),
    st.just(ct.sbp.partial_max), scalars)
sbps = st.one_of(sbp_entries, st.lists(sbp_entries, max_size=3),
                 st.tuples(sbp_entries, sbp_entries), values)
rank_lists = st.one_of(
    st.lists(st.integers(-2, 9), min_size=0, max_size=5),
    st.lists(st.lists(st.integers(-1, 6), min_size=1, max_size=3), min_size=1, max_size=3),
    values)


@contextlib.contextmanager
def world():
    """The real world under mpiexec, else a simulated world of 3 ranks (uneven splits)."""
    if MPI_MODE:
        yield ct.world_size()
    else:
        with ct.simulate(3):
            yield 3


def bad_call(fn, *args, **kwargs) -> None:
    """Run ``fn``; it may work or raise ValueError/TypeError, anything else fails."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. casting a complex fill value to float
        try:
            fn(*args, **kwargs)
        except (ValueError, TypeError):
            pass


def still_usable() -> None:
    """A collective after the error completes on every rank with the right values."""
    value = np.arange(20.0).reshape(5, 4)
    x = ct.tensor(value, placement=ct.placement.all(), sbp=S(0))
    np.testing.assert_array_equal(x.to_global(sbp=S(1)).to_global(sbp=B).numpy(), value)


@SETTINGS
@given(data=values, sbp=sbps, dtype=values, requires_grad=values)
def test_tensor(data, sbp, dtype, requires_grad):
    with world():
        p = ct.placement.all()
        bad_call(ct.tensor, data, placement=p)
        bad_call(ct.tensor, [[1.0, 2.0], [3.0, 4.0]], placement=p, sbp=sbp)
        bad_call(ct.tensor, [1.0, 2.0], placement=p, dtype=dtype)
        bad_call(ct.tensor, [1.0, 2.0], placement=p, requires_grad=requires_grad)
        bad_call(ct.tensor, [1.0], placement=data)
        still_usable()


@SETTINGS
@given(size=values, sbp=sbps, dtype=values, fill=values, requires_grad=values)
def test_zeros_ones_full(size, sbp, dtype, fill, requires_grad):
    with world():
        p = ct.placement.all()
        for fn in (ct.zeros, ct.ones):
            bad_call(fn, size, placement=p)
            bad_call(fn, 4, size, placement=p)
            bad_call(fn, 4, 3, placement=p, sbp=sbp)
            bad_call(fn, 4, 3, placement=p, dtype=dtype)
            bad_call(fn, 4, 3, placement=p, requires_grad=requires_grad)
            bad_call(fn, 4, 3, placement=size)
        bad_call(ct.full, (4, 3), fill, placement=p)
        bad_call(ct.full, size, 1.0, placement=p)
        bad_call(ct.full, (4, 3), fill_value=fill, placement=p, sbp=sbp, dtype=dtype)
        still_usable()


@SETTINGS
@given(start=values, end=values, step=values, sbp=sbps, dtype=values)
def test_arange(start, end, step, sbp, dtype):
    with world():
        p = ct.placement.all()
        bad_call(ct.arange, start, placement=p)
        bad_call(ct.arange, 0, end, placement=p)
        bad_call(ct.arange, 0, 6, step, placement=p)
        bad_call(ct.arange, 6, placement=p, sbp=sbp, dtype=dtype)
        still_usable()


@SETTINGS
@given(local=values, sbp=sbps, shape=values, placement=rank_lists)
def test_from_local(local, sbp, shape, placement):
    with world():
        p = ct.placement.all()
        held = ct.runtime.world().held_ranks

        def per_rank(value):  # a simulation holding several ranks needs a {rank: array}
            return {r: value for r in held} if len(held) > 1 else value
        good = per_rank(np.ones((2, 3)))
        bad_call(ct.from_local, per_rank(local), p, S(0))
        bad_call(ct.from_local, local, p, S(0))
        bad_call(ct.from_local, good, p, sbp)
        bad_call(ct.from_local, good, p, S(0), shape=shape)
        if isinstance(placement, list):  # a placement the world may not have
            with contextlib.suppress(ValueError, TypeError):
                bad_call(ct.from_local, good, ct.placement("cpu", placement), S(0))
        bad_call(ct.from_local, good, placement, S(0))
        still_usable()


@SETTINGS
@given(device=values, ranks=rank_lists, dim=values)
def test_placement_and_split(device, ranks, dim):
    with world():
        bad_call(ct.placement, device, [0])
        bad_call(ct.placement, "cpu", ranks)
        bad_call(ct.sbp.split, dim)
        still_usable()


@SETTINGS
@given(sbp=sbps, ranks=rank_lists, mesh_2d=st.booleans())
def test_to_global(sbp, ranks, mesh_2d):
    with world() as size:
        value = np.arange(35.0).reshape(7, 5)
        x = ct.tensor(value, placement=ct.placement.all(), sbp=S(0))
        bad_call(x.to_global, sbp=sbp)
        bad_call(x.to_global, placement=ranks)
        try:
            target = ct.placement("cpu", ranks)
        except (ValueError, TypeError):
            target = None
        if target is not None:  # ranks outside the world, other meshes, ...
            bad_call(x.to_global, placement=target, sbp=sbp)
            bad_call(x.to_global, placement=target)
        if mesh_2d and size >= 2:
            mesh = ct.placement("cpu", [[0], [1]])
            bad_call(x.to_global, placement=mesh, sbp=sbp)
        np.testing.assert_array_equal(x.to_global(sbp=B).numpy(), value)
        still_usable()


@pytest.mark.parametrize("call, error, words", [
    (lambda p: ct.tensor([1.0, 2.0], placement=p, sbp=S(1)), ValueError, ["tensor", "S(1)"]),
    (lambda p: ct.zeros(4, placement=p, sbp=(S(0), B)), ValueError, ["zeros", "sbp"]),
    (lambda p: ct.full((2,), "x", placement=p), TypeError, ["full", "fill_value"]),
    (lambda p: ct.full((2,), 10**20, placement=p), ValueError, ["full", "int64"]),
    (lambda p: ct.arange(float("inf"), placement=p), ValueError, ["arange", "finite"]),
    (lambda p: ct.ones(2, placement=p, requires_grad="yes"), TypeError, ["requires_grad"]),
    (lambda p: ct.tensor([[1, 2], [3]], placement=p), ValueError, ["tensor", "rectangular"]),
    (lambda p: ct.placement("cpu", [0, 0]), ValueError, ["placement", "duplicate"]),
    (lambda p: ct.placement("cpu", [10**20]), ValueError, ["placement", "ranks"]),
    (lambda p: ct.placement("gpu", [0]), ValueError, ["placement", "device"]),
    (lambda p: ct.ones(3, placement=p).to_global(placement=ct.placement("cpu", [0, 99])),
     ValueError, ["to_global", "outside the world"]),
    (lambda p: ct.ones(3, placement=p).to_global(sbp=S(3)), ValueError, ["to_global", "S(3)"]),
    (lambda p: ct.ones(3, placement=p).to_global(sbp="B"), TypeError, ["to_global", "sbp"]),
])
def test_errors_name_the_function_and_argument(call, error, words):
    with world():
        with ct.debug.comm_log() as log:
            with pytest.raises(error) as info:
                call(ct.placement.all())
        assert log.collectives() == []  # raised before any communication
        for word in words:
            assert word in str(info.value), (word, str(info.value))
        still_usable()
