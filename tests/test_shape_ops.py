"""Shape and indexing ops beyond the sample table: splits kept without communication, the
aligned-split rule of reshape checked exhaustively on small shapes, and bad input raising
before any collective (the world keeps working afterwards)."""
import itertools
import math

import numpy as np
import pytest

import ctensor as ct
from conftest import assert_layout

S, B, P = ct.sbp.split, ct.sbp.broadcast, ct.sbp.partial_sum


def _all4():
    return ct.placement("cpu", [0, 1, 2, 3])


def _values(shape):
    return np.arange(math.prod(shape), dtype=np.float64).reshape(shape)


# ----------------------------------------------------------------------------- no communication
@pytest.mark.parametrize("fn, sbp_in, sbp_out", [
    (lambda x: x.reshape(8, 2, 3), S(0), S(0)),
    (lambda x: x.reshape(48), S(0), S(0)),            # 8 and 48 are multiples of 4 ranks
    (lambda x: x.reshape(4, 12), S(0), S(0)),
    (lambda x: x.reshape(2, 4, 6), S(1), S(2)),       # a dim of equal size keeps any split
    (lambda x: x.unsqueeze(0), S(1), S(2)),
    (lambda x: x.transpose(0, 1), S(0), S(1)),
    (lambda x: x.T, S(1), S(0)),
    (lambda x: x[:, 1:5:2], S(0), S(0)),
    (lambda x: x[None, ..., -1], S(0), S(1)),
    (lambda x: ct.tril(x, 1), S(1), S(1)),
    (lambda x: ct.triu(x), S(0), S(0)),
    (lambda x: ct.cat([x, x * 2.0], dim=1), S(0), S(0)),
    (lambda x: ct.stack([x, x], dim=0), S(1), S(2)),
    (lambda x: x.unsqueeze(1).expand(-1, 3, -1), S(0), S(0)),
    (lambda x: x.reshape(8, 2, 3), P, P),
])
def test_split_kept_without_communication(world4, fn, sbp_in, sbp_out):
    x0 = _values((8, 6))
    x = ct.tensor(x0, placement=_all4(), sbp=sbp_in)
    with ct.debug.comm_log() as log:
        y = fn(x)
    assert log.collectives() == []
    assert y.sbp == (sbp_out,)
    ref = fn(ct.tensor(x0, placement=_all4())).numpy()
    assert_layout(y, ref)


@pytest.mark.parametrize("src, dst, sbp", [
    ((6, 4), (24,), S(0)),      # 6 rows over 4 ranks: 8,8,4,4 elements, not 6 each
    ((8, 6), (8, 3, 2), S(1)),  # 6 columns over 4 ranks do not split 3 evenly
])
def test_unaligned_reshape_boxes_and_is_correct(world4, src, dst, sbp):
    x0 = _values(src)
    x = ct.tensor(x0, placement=_all4(), sbp=sbp)
    with ct.debug.comm_log() as log:
        y = x.reshape(dst)
    assert log.collectives()
    assert not y._layout.has_partial  # a gather, never a full-size partial output
    assert_layout(y, x0.reshape(dst))


SHAPE_PAIRS = [((8, 6), (48,)), ((6, 4), (24,)), ((4, 6), (2, 12)), ((2, 12), (4, 6)),
               ((7, 5), (7, 5, 1)), ((1, 7, 5), (7, 5)), ((12,), (3, 4)), ((6, 10), (6, 2, 5)),
               ((2, 3, 4), (6, 4)), ((4, 1, 6), (4, 6)), ((8, 4, 2), (4, 16)), ((5, 4), (4, 5))]


@pytest.mark.parametrize("shapes", SHAPE_PAIRS, ids=str)
def test_reshape_every_sbp(mesh, shapes):
    """Every SBP combination: values and every shard exact, gradient in the input's SBP."""
    src, dst = shapes
    x0 = _values(src)
    kinds = [S(d) for d in range(len(src))] + [B, P]
    for sbp in itertools.product(kinds, repeat=mesh.ndim):
        x = ct.tensor(x0, placement=mesh, sbp=sbp, requires_grad=True)
        y = x.reshape(dst)
        assert_layout(y, x0.reshape(dst))
        (y * ct.tensor(x0.reshape(dst), placement=mesh)).sum().backward()
        assert x.grad.sbp == x.sbp
        np.testing.assert_array_equal(x.grad.numpy(), x0)


def test_getitem_grad_keeps_split(mesh):
    x0 = _values((5, 7))
    x = ct.tensor(x0, placement=mesh, sbp=(S(1),) * mesh.ndim, requires_grad=True)
    y = x[1::2, None]
    y.sum().backward()
    expected = np.zeros_like(x0)
    expected[1::2] = 1.0
    assert x.grad.sbp == x.sbp
    assert_layout(x.grad, expected)


def test_iteration_stops_at_the_end(world4):
    x0 = _values((3, 2))
    rows = list(ct.tensor(x0, placement=_all4(), sbp=S(0)))
    assert len(rows) == 3
    for row, ref in zip(rows, x0):
        np.testing.assert_array_equal(row.numpy(), ref)


def test_split_and_chunk_pieces(world4):
    x0 = _values((4, 7))
    x = ct.tensor(x0, placement=_all4(), sbp=S(0))
    assert [p.shape for p in x.split(3, dim=1)] == [(4, 3), (4, 3), (4, 1)]
    assert [p.shape for p in x.chunk(3, dim=1)] == [(4, 3), (4, 3), (4, 1)]
    assert [p.shape for p in x.chunk(4, dim=0)] == [(1, 7)] * 4
    assert [p.sbp for p in x.split([2, 5], dim=1)] == [(S(0),), (S(0),)]


# ----------------------------------------------------------------------------- bad input
BAD = [
    (lambda x: x.reshape(5, 5), ValueError, "reshape"),
    (lambda x: x.reshape(-1, -1), ValueError, "reshape"),
    (lambda x: x.reshape(5, -1), ValueError, "reshape"),
    (lambda x: x.reshape(2.0, 24), TypeError, "reshape"),
    (lambda x: x.view(7, -1), ValueError, "view"),
    (lambda x: x.flatten(1, 0), ValueError, "flatten"),
    (lambda x: x.unsqueeze(3), ValueError, "unsqueeze"),
    (lambda x: x.squeeze(2), ValueError, "squeeze"),
    (lambda x: x.permute(0, 0), ValueError, "permute"),
    (lambda x: x.permute(1, 0, 2), ValueError, "permute"),
    (lambda x: x.transpose(0, 2), ValueError, "transpose"),
    (lambda x: x.expand(3, 6), ValueError, "expand"),
    (lambda x: x.expand(6), ValueError, "expand"),
    (lambda x: x[8], IndexError, "getitem"),
    (lambda x: x[-9], ValueError, "getitem"),
    (lambda x: x[0, 0, 0], IndexError, "getitem"),
    (lambda x: x[::0], ValueError, "getitem"),
    (lambda x: x[..., ...], ValueError, "getitem"),
    (lambda x: x[[0, 8]], IndexError, "getitem"),
    (lambda x: x[x], TypeError, "getitem"),  # a float tensor as an index
    (lambda x: x[1.5], TypeError, "getitem"),
    (lambda x: x[np.ones(3, dtype=bool)], IndexError, "getitem"),
    (lambda x: x.narrow(0, 6, 3), ValueError, "narrow"),
    (lambda x: x.split([2, 2], dim=0), ValueError, "split"),
    (lambda x: x.chunk(0), ValueError, "chunk"),
    (lambda x: ct.cat([x, x.T]), ValueError, "cat"),
    (lambda x: ct.cat([]), ValueError, "cat"),
    (lambda x: ct.cat(x), TypeError, "cat"),
    (lambda x: ct.stack([x, x.T]), ValueError, "stack"),
    (lambda x: ct.tril(x[0]), ValueError, "tril"),
    (lambda x: ct.triu(x, 0.5), TypeError, "triu"),
]


@pytest.mark.parametrize("fn, error, name", BAD, ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input_raises_before_communication(world4, fn, error, name):
    x = ct.tensor(_values((8, 6)), placement=_all4(), sbp=S(1))
    with ct.debug.comm_log() as log:
        with pytest.raises(error) as info:
            fn(x)
    assert name in str(info.value)
    assert log.collectives() == []
    # the world still works: a collective after the error completes on every rank
    np.testing.assert_array_equal(x.reshape(6, 8).numpy(), _values((6, 8)))


def test_cat_mixed_placements_names_placement(world4):
    a = ct.tensor(_values((2, 3)), placement=ct.placement("cpu", [0, 1]))
    b = ct.tensor(_values((2, 3)), placement=_all4())
    with pytest.raises(ValueError, match="placement"):
        ct.cat([a, b])
