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
    Sample("zeros_like", lambda a: ct.zeros_like(a) + a, lambda a: a, [(4, 3)]),
    Sample("ones_like", lambda a: ct.ones_like(a) * a, lambda a: a, [(4, 3)]),
    Sample("full_like", lambda a: ct.full_like(a, 2.0) * a, lambda a: 2.0 * a, [(4, 3)]),
]

COVERED_ELSEWHERE = {
    "to_global": "tests/test_boxing.py (every SBP pair) and tests/test_autograd.py",
    "tensor": "the constructor of every test (tests/test_tensor.py)",
    "copy_": "tests/test_tensor.py (in-place copy across SBPs)",
}
