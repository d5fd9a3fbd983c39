import numpy as np

import ctensor as ct
from . import Sample

SAMPLES = [
    Sample("clone", lambda a: a.clone(), np.copy, [(4, 3)]),
    Sample("to", lambda a: a.to(np.float32).to(np.float64), lambda a: a.astype(np.float32)
           .astype(np.float64), [(4, 3)], rtol=1e-6, atol=1e-7, grad=()),
    Sample("float", lambda a: a.float(), lambda a: a.astype(np.float32), [(4, 3)], grad=(),
           rtol=1e-6),
    Sample("double", lambda a: a.float().double(), lambda a: a.astype(np.float32)
           .astype(np.float64), [(4, 3)], rtol=1e-6, atol=1e-7, grad=()),
    Sample("half", lambda a: a.half(), lambda a: a.astype(np.float16), [(4, 3)], grad=()),
    Sample("long", lambda a: (a * 3).long(), lambda a: (a * 3).astype(np.int64), [(4, 3)],
           grad=()),
    Sample("int", lambda a: (a * 3).int(), lambda a: (a * 3).astype(np.int32), [(4, 3)],
           grad=()),
    Sample("bool", lambda a: a.long().bool(), lambda a: a.astype(np.int64).astype(bool),
           [(4, 3)], grad=()),
    Sample("type_as", lambda a, b: a.type_as(b), lambda a, b: a.astype(b.dtype),
           [(4, 3), (3,)], make=lambda r, s, i: r.standard_normal(s) * 3 if i == 0 else
           r.integers(0, 5, s).astype(np.int32), grad=()),
    Sample("type_as", lambda a, b: b.type_as(a), lambda a, b: b.astype(a.dtype),
           [(4, 3), (3,)], make=lambda r, s, i: r.standard_normal(s) if i == 0 else
           r.integers(0, 5, s).astype(np.int32), grad=(), name="type_as_float"),
    Sample("zeros_like", lambda a: ct.zeros_like(a) + a, lambda a: a, [(4, 3)]),
    Sample("ones_like", lambda a: ct.ones_like(a) * a, lambda a: a, [(4, 3)]),
    Sample("full_like", lambda a: ct.full_like(a, 2.0) * a, lambda a: 2.0 * a, [(4, 3)]),
]

COVERED_ELSEWHERE = {
    "to_global": "tests/test_boxing.py (every SBP pair) and tests/test_autograd.py",
    "tensor": "the constructor of every test (tests/test_tensor.py)",
    "copy_": "tests/test_tensor.py (in-place copy across SBPs)",
}
