"""The dtype names and the promotion table of ``ctensor/dtypes.py`` (PyTorch's rules), as a
table, and end to end through ops on split and broadcast tensors."""
import numpy as np
import pytest

import ctensor as ct
from ctensor.dtypes import promote_types, reduction_dtype, result_type

f16, f32, f64 = np.float16, np.float32, np.float64
i8, i16, i32, i64, u8, b = np.int8, np.int16, np.int32, np.int64, np.uint8, np.bool_
c64, c128 = np.complex64, np.complex128

# (tensor dtypes, scalars, result) with the default float dtype float32
RESULT_TYPE = [
    # tensors only: NumPy within a category, the higher category across
    ([i32, i64], [], i64),
    ([u8, i8], [], i16),
    ([f16, f32], [], f32),
    ([i64, f16], [], f16),
    ([i64, f32], [], f32),
    ([b, i8], [], i8),
    ([b, b], [], b),
    ([f64, c64], [], c128),
    ([i32, c64], [], c64),
    # a scalar of a category not above the tensors': the tensors' dtype
    ([u8], [1], u8),
    ([i8], [1000 // 10], i8),
    ([i32], [True], i32),
    ([f32], [1.0], f32),
    ([f16], [2], f16),
    ([f32], [np.float64(1.0)], f32),    # np.float64 is a Python float
    ([f32], [np.int64(3)], f32),
    ([f16], [np.float32(1.5)], f16),
    ([b], [True], b),
    ([c64], [1.5], c64),
    # a scalar of a higher category: that category's default
    ([b], [1], i64),
    ([b], [np.int32(1)], i64),
    ([u8], [2.5], f32),
    ([i32], [2.5], f32),
    ([i64], [np.float64(2.5)], f32),
    ([f32], [1j], c64),
    ([f64], [1j], c128),
    ([i32], [1j], c64),
    ([b], [2.5], f32),
    ([i32, f64], [1], f64),
    # only scalars
    ([], [1], i64),
    ([], [1.0], f32),
    ([], [True, 2], i64),
]


@pytest.mark.parametrize("tensors, scalars, expected", RESULT_TYPE,
                         ids=[f"{[np.dtype(t).name for t in ts]}-{sc}" for ts, sc, _ in
                              RESULT_TYPE])
def test_result_type_table(tensors, scalars, expected):
    assert result_type([np.dtype(t) for t in tensors], scalars) == np.dtype(expected)


def test_result_type_follows_the_default_float_dtype():
    ct.set_default_dtype(np.float64)
    try:
        assert result_type([np.dtype(i32)], [2.5]) == np.float64
        assert result_type([np.dtype(f32)], [2.5]) == np.float32
        assert result_type([np.dtype(i32)], [1j]) == np.complex128
    finally:
        ct.set_default_dtype(np.float32)


def test_promote_types_is_symmetric():
    dtypes = [np.dtype(d) for d in (b, u8, i8, i16, i32, i64, f16, f32, f64, c64, c128)]
    for x in dtypes:
        for y in dtypes:
            assert promote_types(x, y) == promote_types(y, x), (x, y)


@pytest.mark.parametrize("op, dtype, expected", [
    ("sum", b, i64), ("sum", i32, i64), ("sum", u8, i64), ("sum", f16, f16),
    ("prod", i8, i64), ("cumsum", b, i64), ("mean", i32, f32), ("var", b, f32),
    ("norm", i64, f32), ("mean", f64, f64), ("amax", i32, i32), ("argmax", f32, i64),
])
def test_reduction_dtype_table(op, dtype, expected):
    assert reduction_dtype(op, np.dtype(dtype)) == np.dtype(expected)


def test_dtype_names():
    assert (ct.float16, ct.float32, ct.float64) == (np.float16, np.float32, np.float64)
    assert (ct.int8, ct.int16, ct.int32, ct.int64, ct.uint8) == (i8, i16, i32, i64, u8)
    assert ct.bool == np.bool_ and isinstance(ct.bool, np.dtype)
    assert not hasattr(ct, "bfloat16")  # NumPy has no bfloat16
    x = ct.zeros(2, 3, dtype=ct.int8)
    assert x.dtype == np.int8
    assert x.to(ct.float16).dtype == np.float16
    assert ct.tensor([1, 0], dtype=ct.bool).dtype == np.bool_
    assert ct.ones(2, dtype=ct.uint8).to(ct.bool).dtype == np.bool_
    with pytest.raises(TypeError, match="to: argument 'dtype' is not a dtype"):
        x.to("no-such-dtype")


def _t(values, mesh, split=True, dtype=None):
    arr = np.asarray(values, dtype=dtype)
    sbp = (ct.sbp.split(0) if split and arr.ndim else ct.sbp.broadcast,) * mesh.ndim
    return ct.tensor(arr, placement=mesh, sbp=sbp)


def test_integer_sums_do_not_wrap(mesh):
    x = _t([2_000_000_000, 2_000_000_000, 1, 2], mesh, dtype=np.int32)
    s = x.sum()
    assert s.dtype == np.int64 and s.item() == 4_000_000_003
    assert x.sum(0, keepdim=True).numpy().tolist() == [4_000_000_003]
    c = x.cumsum(0)
    assert c.dtype == np.int64 and c.numpy()[1] == 4_000_000_000
    p = _t([100_000, 100_000, 1, 1], mesh, dtype=np.int32).prod()
    assert p.dtype == np.int64 and p.item() == 10_000_000_000
    flags = _t([True, True, False, True], mesh)
    assert flags.sum().dtype == np.int64 and flags.sum().item() == 3


def test_scalar_promotion_through_ops(mesh):
    u = _t([250, 1, 2, 3], mesh, dtype=np.uint8)
    assert (u + 1).dtype == np.uint8 and (u + 1).numpy()[1] == 2
    i = _t([1, 2, 3, 4], mesh, dtype=np.int32)
    assert (i * 2).dtype == np.int32
    assert (i * 2.5).dtype == np.float32
    np.testing.assert_allclose((i * 2.5).numpy(), [2.5, 5.0, 7.5, 10.0])
    assert (i / i).dtype == np.float32 and (i / 2).dtype == np.float32
    f = _t([1.0, 2.0, 3.0, 4.0], mesh, dtype=np.float32)
    assert (f + 1.0).dtype == np.float32
    assert (f + np.float64(1.0)).dtype == np.float32
    assert (f + np.ones(4)).dtype == np.float64           # a NumPy array promotes
    assert (f + _t(1.0, mesh, dtype=np.float64)).dtype == np.float64  # so does a 0-d tensor
    assert (f + i.to(ct.int64)).dtype == np.float32       # int64 + float32 -> float32
    flags = _t([True, False, True, False], mesh)
    assert (flags + True).dtype == np.bool_
    assert (flags + 1).dtype == np.int64 and (flags + 1).numpy().tolist() == [2, 1, 2, 1]
    assert ct.where(flags, i, 0.5).dtype == np.float32
    with pytest.raises(OverflowError, match="300 does not fit uint8"):
        u + 300


def test_statistics_of_integers_raise_as_in_pytorch(mesh):
    i = _t([1, 2, 3, 4], mesh, dtype=np.int64)
    for name in ("mean", "var", "std", "norm", "logsumexp"):
        with pytest.raises(TypeError, match=rf"^{name}: the input has dtype int64; accepted: "
                                            rf"floating or complex tensors"):
            getattr(i, name)(0) if name == "logsumexp" else getattr(i, name)()
    with pytest.raises(TypeError, match="mean: argument 'dtype' is int32"):
        i.mean(dtype=ct.int32)
    out = i.mean(dtype=ct.float32)                       # PyTorch's way to average integers
    assert out.dtype == np.float32 and out.item() == 2.5
    assert i.sum(dtype=ct.float64).dtype == np.float64 and i.sum(dtype=ct.float64).item() == 10
    np.testing.assert_allclose(i.float().std().item(), np.std([1, 2, 3, 4], ddof=1), rtol=1e-6)


def test_pytorch_short_dtype_names_are_dtypes(mesh):
    names = {"half": np.float16, "float": np.float32, "double": np.float64,
             "short": np.int16, "int": np.int32, "long": np.int64, "bool": np.bool_}
    for name, expected in names.items():
        dtype = getattr(ct, name)
        assert isinstance(dtype, np.dtype) and dtype == expected, name
        x = ct.zeros(2, 3, dtype=dtype, placement=mesh, sbp=(ct.sbp.split(1),) * mesh.ndim)
        assert x.dtype == expected and ct.ones(2, dtype=dtype).to(ct.float).dtype == np.float32
    x = ct.tensor([[1.5, -2.5]], placement=mesh)
    # the casts stay methods
    assert (x.float().dtype, x.double().dtype, x.half().dtype) == (f32, f64, np.float16)
    assert (x.long().dtype, x.int().dtype, x.bool().dtype) == (i64, i32, b)
    assert x.to(ct.long).numpy().tolist() == [[1, -2]]
    assert ct.full((2,), 7, dtype=ct.int).dtype == i32
    assert ct.arange(3, dtype=ct.double).dtype == f64
    torch = pytest.importorskip("torch")
    for name, expected in names.items():  # the same names stand for the same dtypes
        assert str(getattr(torch, name)).removeprefix("torch.") == np.dtype(expected).name \
            or (name == "bool" and getattr(torch, name) is torch.bool)
