"""Tensor.new_*: the new tensor (broadcast, the source's dtype and placement) combined with
the source, so every input layout is exercised and the gradient flows through the source."""
import numpy as np

from . import Sample

SAMPLES = [
    Sample("new_zeros", lambda a: a.new_zeros(a.shape) + a, lambda a: a, [(4, 3)]),
    Sample("new_ones", lambda a: a.new_ones(*a.shape) * a, lambda a: a, [(4, 3)]),
    Sample("new_empty", lambda a: a.new_empty(a.shape).fill_(2.0) * a, lambda a: 2.0 * a,
           [(4, 3)]),
    Sample("new_full", lambda a: a.new_full(a.shape[-1:], -1.5) * a, lambda a: -1.5 * a,
           [(4, 3)]),
    Sample("new_tensor", lambda a: a + a.new_tensor(np.arange(a.shape[-1]) - 1.0),
           lambda a: a + (np.arange(a.shape[-1]) - 1.0), [(4, 3)]),
    Sample("new_tensor", lambda a: a * a.new_tensor(a.detach()), lambda a: a * a, [(4, 3)],
           name="new_tensor_of_a_tensor", grad=()),
]
