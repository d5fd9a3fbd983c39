"""``compute_dtype``: the floating dtype a mixed-precision computation runs in, from its
name (``"fp16"``, ``"float32"``, ...) or a dtype, with the reason bfloat16 is refused."""
from __future__ import annotations

import numpy as np

__all__ = ["compute_dtype"]


_NO_BF16 = ("bfloat16 is not available: NumPy (and CuPy) have no bfloat16 dtype, and ctensor "
            "does not add one through the ml_dtypes package (its bfloat16 products have no "
            "BLAS kernel, so on a CPU they would be slower than float32 and save no more "
            "memory than float16); use float16 (ct.float16 with optim.GradScaler) or float32")


def compute_dtype(dtype) -> np.dtype:
    """``dtype`` (a dtype or one of ``"fp32" "float32" "fp16" "float16" "half" "fp64"
    "float64"``) as a NumPy floating dtype; ``"bf16"``/``"bfloat16"`` raise ``TypeError``
    saying what to use instead.

    >>> nn.compute_dtype("fp16")
    dtype('float16')
    """
    names = {"fp16": np.float16, "half": np.float16, "float16": np.float16,
             "fp32": np.float32, "float32": np.float32, "float": np.float32,
             "fp64": np.float64, "float64": np.float64, "double": np.float64}
    if isinstance(dtype, str):
        if dtype.lower() in ("bf16", "bfloat16"):
            raise TypeError(f"mixed_precision: {_NO_BF16}")
        if dtype.lower() not in names:
            raise ValueError(f"mixed_precision: unknown dtype {dtype!r}; accepted "
                             f"{sorted(names)} or a floating dtype")
        return np.dtype(names[dtype.lower()])
    try:
        out = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"mixed_precision: argument 'dtype' must be a floating dtype, got "
                        f"{dtype!r}") from None
    if "bfloat16" in str(out):
        raise TypeError(f"mixed_precision: {_NO_BF16}")
    if out.kind != "f":
        raise TypeError(f"mixed_precision: argument 'dtype' must be a floating dtype, got "
                        f"{out}")
    return out
