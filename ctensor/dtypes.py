"""dtype names and the type-promotion table (PyTorch's rules), in one place.

Names: ``ct.float16 float32 float64 int8 int16 int32 int64 uint8 bool`` are NumPy dtypes
(``ct.float32 == np.float32``), usable wherever a dtype is accepted. PyTorch's short names
are the same dtypes: ``ct.half`` float16, ``ct.float`` float32, ``ct.double`` float64,
``ct.short`` int16, ``ct.int`` int32, ``ct.long`` int64 (``ct.zeros(2, dtype=ct.long)``);
the casts are the methods ``x.half() x.float() x.double() x.int() x.long() x.bool()``
(or ``x.to(ct.long)``). There is no
``ct.bfloat16``: NumPy has no bfloat16 dtype (it lives in the separate ``ml_dtypes``
package, which ctensor does not depend on).

Promotion (:func:`result_type`) orders dtypes by *category*, bool < integer < floating <
complex, and follows PyTorch:

===================================== ===============================================
 operands                              result
===================================== ===============================================
 tensors of one category               NumPy's table: int32 + int64 -> int64,
                                       uint8 + int8 -> int16, float16 + float32 -> float32
 tensors of different categories       the higher category's dtype: int64 + float16 ->
                                       float16, bool + int8 -> int8 (float + complex: the
                                       complex type of at least the float's precision)
 tensor + Python scalar, scalar's      the tensors' dtype: uint8 + 1 -> uint8,
 category not higher                   float32 + 1.0 -> float32, bool + True -> bool
 tensor + Python scalar of a higher    that category's default: bool + 1 -> int64,
 category                              int32 * 2.5 -> the default float dtype (float32),
                                       float32 + 1j -> complex64, int + 1j -> the default
                                       complex dtype
===================================== ===============================================

A *scalar* is a Python ``bool``/``int``/``float``/``complex`` or a NumPy scalar
(``np.float64(1)`` is a Python float; ``np.int64(1)`` is treated like a Python int). A NumPy
*array* (0-d too) and a 0-d ct.Tensor are tensors and promote normally:
``float32 tensor + np.array(1.0)`` is float64.

Reductions (:func:`reduction_dtype`): ``sum``/``prod``/``cumsum`` of bool and integer
tensors give int64 (no wrap-around: an int32 sum of ``[2e9, 2e9]`` is ``4e9``); ``mean``,
``var``, ``std`` and ``norm`` of bool and integer tensors raise ``TypeError`` in their ops,
as PyTorch (:func:`reduction_dtype` still answers the default float dtype for them);
``amax``/``amin``/``sort`` keep the dtype; indices are int64. Division of integers
gives the default float dtype.
"""
from __future__ import annotations

import numbers
from typing import Iterable, Optional, Sequence

import numpy as np

from .runtime import get_default_dtype

__all__ = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
           "bool_", "half", "float_", "double", "short", "int_", "long", "category", "promote_types", "result_type", "scalar_dtype",
           "reduction_dtype", "is_scalar", "to_dtype"]

float16 = np.dtype(np.float16)
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
int8 = np.dtype(np.int8)
int16 = np.dtype(np.int16)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
uint8 = np.dtype(np.uint8)
bool_ = np.dtype(np.bool_)  # exported as ct.bool
# PyTorch's short names (exported as ct.half, ct.float, ct.double, ct.short, ct.int, ct.long)
half, float_, double = float16, float32, float64
short, int_, long = int16, int32, int64

BOOL, INTEGER, FLOATING, COMPLEX = 0, 1, 2, 3
_CATEGORY = {"b": BOOL, "i": INTEGER, "u": INTEGER, "f": FLOATING, "c": COMPLEX}


def to_dtype(opname: str, arg: str, dtype) -> np.dtype:
    """``dtype`` as a NumPy dtype of a supported kind; ``TypeError`` naming the op else."""
    try:
        out = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{opname}: argument '{arg}' is not a dtype: {dtype!r}; accepted: "
                        f"ct.float32, ct.int64, ct.bool, ... or NumPy dtypes") from None
    if out.kind not in _CATEGORY:
        raise TypeError(f"{opname}: argument '{arg}' must be a bool, integer, floating or "
                        f"complex dtype, got {out}")
    return out


def category(dtype) -> int:
    """0 bool, 1 integer, 2 floating, 3 complex."""
    try:
        return _CATEGORY[np.dtype(dtype).kind]
    except KeyError:
        raise TypeError(f"dtype {np.dtype(dtype)} is not a bool, integer, floating or "
                        f"complex dtype") from None


def promote_types(a, b) -> np.dtype:
    """The dtype of an op on tensors of dtypes ``a`` and ``b`` (see the module table)."""
    a, b = np.dtype(a), np.dtype(b)
    if a == b:
        return a
    ca, cb = category(a), category(b)
    if ca == cb or {ca, cb} == {FLOATING, COMPLEX}:
        return np.promote_types(a, b)
    return a if ca > cb else b


def is_scalar(value) -> bool:
    """Whether ``value`` is a Python or NumPy *number* (not an array, not a tensor)."""
    return isinstance(value, (numbers.Number, np.generic)) and not isinstance(value, np.ndarray)


def _scalar_category(value) -> int:
    if isinstance(value, (bool, np.bool_)):
        return BOOL
    if isinstance(value, (numbers.Integral, np.integer)):
        return INTEGER
    if isinstance(value, (numbers.Real, np.floating)):
        return FLOATING
    return COMPLEX


def _default(cat: int, floating: Optional[np.dtype] = None) -> np.dtype:
    """The dtype a scalar of category ``cat`` brings in: bool, int64, the default float,
    or the complex type of ``floating`` (the tensors' float dtype, else the default)."""
    if cat == BOOL:
        return bool_
    if cat == INTEGER:
        return int64
    if cat == FLOATING:
        return get_default_dtype()
    base = floating if floating is not None else get_default_dtype()
    return np.dtype(np.complex128) if base == float64 else np.dtype(np.complex64)


def result_type(tensor_dtypes: Iterable, scalars: Sequence = ()) -> np.dtype:
    """The result dtype of an op on tensors of ``tensor_dtypes`` and the Python/NumPy
    scalars ``scalars`` (the values themselves), by the table in the module docstring.

    >>> result_type([np.int32], [2.5])          # default float dtype
    dtype('float32')
    >>> result_type([np.uint8], [1])
    dtype('uint8')
    """
    result = None
    for d in tensor_dtypes:
        result = np.dtype(d) if result is None else promote_types(result, d)
    if not scalars:
        if result is None:
            raise TypeError("result_type: no operands")
        return result
    top = max(_scalar_category(v) for v in scalars)
    if result is None:
        return _default(top)
    if top <= category(result):
        return result
    if top == COMPLEX and category(result) == FLOATING:
        return _default(COMPLEX, result)
    if top == FLOATING or top == COMPLEX:
        return _default(top)
    return promote_types(result, _default(top))  # bool tensor + int -> int64


def scalar_dtype(value, tensor_dtypes: Sequence, opname: str = "op") -> np.dtype:
    """The dtype of the broadcast constant made for the operand ``value`` of an op on
    tensors of ``tensor_dtypes``: for a scalar, the dtype :func:`result_type` gives (so the
    constant promotes nothing further); for a NumPy array, its own dtype.

    ``OverflowError`` when an integer scalar does not fit the integer dtype it takes
    (``uint8 tensor + 300``: PyTorch would wrap around; cast the tensor first).
    """
    if isinstance(value, np.ndarray):
        return value.dtype
    if not is_scalar(value):
        return np.asarray(value).dtype
    dtype = result_type(tensor_dtypes, [value])
    if dtype.kind in "iu" and not isinstance(value, (bool, np.bool_)):
        info = np.iinfo(dtype)
        if not info.min <= int(value) <= info.max:
            raise OverflowError(f"{opname}: the scalar {value!r} does not fit {dtype}, the "
                                f"dtype it takes next to {dtype} tensors (ctensor follows "
                                f"PyTorch: a Python scalar does not widen a tensor's dtype); "
                                f"accepted: {info.min}..{info.max}; cast the tensor first, "
                                f"e.g. x.long()")
    return dtype


_ACCUMULATE = ("sum", "prod", "cumsum")
_FLOAT_STATS = ("mean", "var", "std", "norm")


def reduction_dtype(opname: str, dtype) -> np.dtype:
    """The output dtype of the reduction ``opname`` over a tensor of ``dtype``: int64 for
    sums and products of bool/integer tensors, the default float dtype for statistics of
    them, int64 for indices (``argmax``), else ``dtype``."""
    dtype = np.dtype(dtype)
    if opname in _ACCUMULATE:
        return int64 if dtype.kind in "biu" else dtype
    if opname in _FLOAT_STATS:
        return dtype if dtype.kind in "fc" else get_default_dtype()
    if opname in ("argmax", "argmin", "argsort"):
        return int64
    return dtype
