"""In-place ops: each updates a clone (a non-leaf, so the gradient flows through the update
to both operands) and must equal the out-of-place NumPy result in every layout."""
import numpy as np

from . import Sample, positive

SAMPLES = [
    Sample("add_", lambda a, b: a.clone().add_(b), np.add, [(4, 3), (3,)], grad=(0, 1)),
    Sample("sub_", lambda a, b: a.clone().sub_(b), np.subtract, [(4, 3), (4, 3)], grad=(0, 1)),
    Sample("mul_", lambda a, b: a.clone().mul_(b), np.multiply, [(4, 3), (4, 1)], grad=(0, 1)),
    Sample("div_", lambda a, b: a.clone().div_(b), np.divide, [(4, 3), (3,)], make=positive,
           grad=(0, 1)),
    Sample("pow_", lambda a: a.clone().pow_(2.0), lambda a: a ** 2.0, [(4, 3)]),
    Sample("clamp_", lambda a: a.clone().clamp_(-0.5, 0.5), lambda a: np.clip(a, -0.5, 0.5),
           [(4, 3)], make=lambda r, s, i: (r.permutation(int(np.prod(s))).reshape(s) + 0.37)
           / 6.0 - 1),  # distinct values, none on the clamp bounds
    Sample("neg_", lambda a: a.clone().neg_(), np.negative, [(4, 3)]),
    Sample("exp_", lambda a: a.clone().exp_(), np.exp, [(4, 3)]),
    Sample("fill_", lambda a: a.clone().fill_(2.5) + a, lambda a: 2.5 + a, [(4, 3)]),
    Sample("zero_", lambda a: a.clone().zero_() + a, lambda a: a, [(4, 3)]),
]
