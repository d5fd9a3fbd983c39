"""Samples of ctensor/ops/rearrange.py: roll, repeat_interleave, unbind, unflatten, movedim,
moveaxis, expand_as, concat, concatenate (composites: every layout of their input)."""
import numpy as np

import ctensor as ct
from . import Sample


def _weighted_stack(parts):
    """The parts of an unbind, stacked back with weights (so each part's gradient differs)."""
    return ct.stack([p * (i + 1.0) for i, p in enumerate(parts)])


def _weighted_stack_ref(a, axis):
    parts = [np.take(a, i, axis=axis) for i in range(a.shape[axis])]
    return np.stack([p * (i + 1.0) for i, p in enumerate(parts)])


def _repeat_counts(n):
    return np.array([(i % 3) for i in range(n)])


SAMPLES = [
    Sample("roll", lambda a: a.roll(1, 0), lambda a: np.roll(a, 1, 0), [(4, 3)]),
    Sample("roll", lambda a: ct.roll(a, (-2, 5), (1, 0)), lambda a: np.roll(a, (-2, 5), (1, 0)),
           [(4, 3)], name="roll_dims"),
    Sample("roll", lambda a: a.roll(3), lambda a: np.roll(a, 3), [(4, 3)], name="roll_flat"),
    Sample("repeat_interleave", lambda a: a.repeat_interleave(2, dim=0),
           lambda a: np.repeat(a, 2, 0), [(4, 3)]),
    Sample("repeat_interleave", lambda a: a.repeat_interleave(3), lambda a: np.repeat(a, 3),
           [(4, 3)], name="repeat_interleave_flat"),
    Sample("repeat_interleave",
           lambda a: ct.repeat_interleave(a, ct.tensor(_repeat_counts(a.shape[1])), dim=1),
           lambda a: np.repeat(a, _repeat_counts(a.shape[1]), 1), [(4, 3)],
           name="repeat_interleave_tensor"),
    Sample("unbind", lambda a: _weighted_stack(a.unbind(1)),
           lambda a: _weighted_stack_ref(a, 1), [(4, 3)]),
    Sample("unbind", lambda a: _weighted_stack(ct.unbind(a)), lambda a: _weighted_stack_ref(a, 0),
           [(4, 3)], name="unbind_dim0"),
    Sample("unflatten", lambda a: a.unflatten(1, (2, -1)),
           lambda a: a.reshape(a.shape[0], 2, -1), [(4, 6)], uneven=[(7, 10)]),
    Sample("unflatten", lambda a: ct.unflatten(a, 0, (-1, 2)), lambda a: a.reshape(-1, 2, 3),
           [(8, 3)], uneven=[(10, 3)], name="unflatten_dim0"),
    Sample("movedim", lambda a: a.movedim(0, -1), lambda a: np.moveaxis(a, 0, -1), [(2, 4, 3)]),
    Sample("movedim", lambda a: ct.movedim(a, (0, 1), (2, 0)),
           lambda a: np.moveaxis(a, (0, 1), (2, 0)), [(2, 4, 3)], name="movedim_tuple"),
    Sample("moveaxis", lambda a: a.moveaxis(-1, 0), lambda a: np.moveaxis(a, -1, 0),
           [(2, 4, 3)]),
    Sample("expand_as", lambda a, b: a.expand_as(b), lambda a, b: np.broadcast_to(a, b.shape),
           [(4, 1), (4, 3)]),
    Sample("concat", lambda a, b: ct.concat([a, b], dim=1), lambda a, b: np.concatenate(
           [a, b], 1), [(4, 3), (4, 2)], grad=(0, 1)),
    Sample("concatenate", lambda a, b: ct.concatenate((a, b)), lambda a, b: np.concatenate(
           [a, b]), [(4, 3), (2, 3)], grad=(0, 1)),
]
