import numpy as np

import ctensor as ct
from . import Sample


def _int(rng, shape, i):
    return rng.integers(-5, 5, shape)


def _split_ref(a, size, axis):
    n = a.shape[axis]
    return [np.take(a, range(s, min(s + size, n)), axis=axis) for s in range(0, n, size)]


def _weighted_cat(parts, dim):
    return ct.cat([p * (i + 1.0) for i, p in enumerate(parts)], dim)


def _weighted_cat_ref(parts, axis):
    return np.concatenate([p * (i + 1.0) for i, p in enumerate(parts)], axis)


SAMPLES = [
    # reshape / view / flatten: splits kept when aligned, boxed otherwise
    Sample("reshape", lambda a: a.reshape(a.shape[0], 2, -1),
           lambda a: a.reshape(a.shape[0], 2, -1), [(8, 6)], uneven=[(6, 10)]),
    Sample("reshape", lambda a: a.reshape(-1), lambda a: a.reshape(-1), [(4, 3)],
           name="reshape_merge"),
    Sample("reshape", lambda a: a.reshape((a.shape[1], a.shape[0])),
           lambda a: a.reshape(a.shape[1], a.shape[0]), [(4, 3)], name="reshape_tuple"),
    Sample("reshape", lambda a: ct.reshape(a, (a.shape[0] * a.shape[1], -1)),
           lambda a: a.reshape(a.shape[0] * a.shape[1], -1), [(2, 4, 3)],
           name="reshape_merge_lead"),
    Sample("reshape", lambda a: a.reshape(2, -1), lambda a: a.reshape(2, -1), [(8, 6)],
           uneven=[(6, 5)], name="reshape_outer"),
    Sample("reshape", lambda a: a.reshape(-1, 4, 2), lambda a: a.reshape(-1, 4, 2), [(16,)],
           uneven=[(24,)], name="reshape_unmerge"),
    Sample("reshape", lambda a: a.reshape(1, 1), lambda a: a.reshape(1, 1), [()],
           name="reshape_scalar"),
    Sample("reshape", lambda a: a.reshape(a.shape[1], -1), lambda a: a.reshape(a.shape[1], -1),
           [(4, 3)], make=_int, grad=(), name="reshape_int"),
    Sample("view", lambda a: a.view(-1, a.shape[-1]), lambda a: a.reshape(-1, a.shape[-1]),
           [(2, 4, 3)]),
    Sample("flatten", lambda a: a.flatten(), lambda a: a.reshape(-1), [(2, 4, 3)]),
    Sample("flatten", lambda a: ct.flatten(a, 1), lambda a: a.reshape(a.shape[0], -1),
           [(2, 4, 3)], name="flatten_from1"),
    Sample("flatten", lambda a: a.flatten(0, -2), lambda a: a.reshape(-1, a.shape[-1]),
           [(2, 4, 3)], name="flatten_lead"),
    Sample("flatten", lambda a: a.flatten(), lambda a: a.reshape(1), [()],
           name="flatten_scalar"),
    Sample("unsqueeze", lambda a: a.unsqueeze(0), lambda a: a[None], [(4, 3)]),
    Sample("unsqueeze", lambda a: a.unsqueeze(1), lambda a: a[:, None], [(4, 3)],
           name="unsqueeze_mid"),
    Sample("unsqueeze", lambda a: ct.unsqueeze(a, -1), lambda a: a[..., None], [(4, 3)],
           name="unsqueeze_last"),
    Sample("squeeze", lambda a: a.squeeze(), lambda a: a.squeeze(), [(4, 1, 3)]),
    Sample("squeeze", lambda a: a.squeeze(-1), lambda a: a.squeeze(-1), [(4, 3, 1)],
           name="squeeze_last"),
    Sample("squeeze", lambda a: a.squeeze((0, 2)), lambda a: a.squeeze((0, 2)), [(1, 4, 1)],
           name="squeeze_dims"),
    Sample("squeeze", lambda a: a.squeeze(0), lambda a: a, [(4, 3)], name="squeeze_noop"),
    # permute / transpose
    Sample("permute", lambda a: a.permute(2, 0, 1), lambda a: a.transpose(2, 0, 1),
           [(2, 4, 3)]),
    Sample("permute", lambda a: ct.permute(a, (1, -1, 0)), lambda a: a.transpose(1, 2, 0),
           [(2, 4, 3)], name="permute_tuple"),
    Sample("permute", lambda a: a.T, lambda a: a.T, [(2, 4, 3)], name="T"),
    Sample("transpose", lambda a: a.transpose(0, 1), lambda a: a.T, [(4, 3)]),
    Sample("transpose", lambda a: ct.transpose(a, -1, -3), lambda a: a.swapaxes(-1, -3),
           [(2, 4, 3)], name="transpose_neg"),
    Sample("t", lambda a: a.t(), lambda a: a.T, [(4, 3)]),
    Sample("t", lambda a: ct.t(a), lambda a: a, [(4,)], name="t_1d"),
    Sample("flip", lambda a: a.flip(0), lambda a: np.flip(a, 0), [(4, 3)]),
    Sample("flip", lambda a: ct.flip(a, (0, -1)), lambda a: np.flip(a, (0, 2)), [(2, 4, 3)],
           name="flip_dims"),
    Sample("repeat", lambda a: a.repeat(2, 1), lambda a: np.tile(a, (2, 1)), [(4, 3)]),
    Sample("repeat", lambda a: a.repeat(2, 1, 3), lambda a: np.tile(a, (2, 1, 3)), [(4, 3)],
           name="repeat_lead"),
    Sample("contiguous", lambda a: a.transpose(0, 1).contiguous(), lambda a: a.T, [(4, 3)]),
    # expand
    Sample("expand", lambda a: a.expand(-1, 3), lambda a: np.broadcast_to(a, (a.shape[0], 3)),
           [(4, 1)]),
    Sample("expand", lambda a: a.expand(2, -1, -1),
           lambda a: np.broadcast_to(a, (2,) + a.shape), [(4, 3)], name="expand_lead"),
    Sample("expand", lambda a: a.expand((2, 4, a.shape[-1])),
           lambda a: np.broadcast_to(a, (2, 4, a.shape[-1])), [(1, 3)], name="expand_tuple"),
    Sample("broadcast_to", lambda a: ct.broadcast_to(a, (2,) + a.shape[:-1] + (3,)),
           lambda a: np.broadcast_to(a, (2,) + a.shape[:-1] + (3,)), [(4, 1)]),
    # tril / triu
    Sample("tril", lambda a: a.tril(), np.tril, [(4, 3)]),
    Sample("tril", lambda a: ct.tril(a, -1), lambda a: np.tril(a, -1), [(2, 4, 4)],
           uneven=[(2, 7, 5)], name="tril_batched"),
    Sample("triu", lambda a: a.triu(), np.triu, [(4, 3)]),
    Sample("triu", lambda a: ct.triu(a, 1), lambda a: np.triu(a, 1), [(3, 4)],
           name="triu_diag"),
    Sample("triu", lambda a: ct.triu(a, -1) > 0, lambda a: np.triu(a, -1) > 0, [(4, 4)],
           grad=(), name="triu_bool"),
    # basic indexing
    Sample("getitem", lambda a: a[1], lambda a: a[1], [(4, 3)]),
    Sample("getitem", lambda a: a[-1], lambda a: a[-1], [(4, 3)], name="getitem_neg"),
    Sample("getitem", lambda a: a[1:3], lambda a: a[1:3], [(4, 3)], name="getitem_slice"),
    Sample("getitem", lambda a: a[::2], lambda a: a[::2], [(4, 3)], name="getitem_step"),
    Sample("getitem", lambda a: a[:, 1:], lambda a: a[:, 1:], [(4, 3)],
           name="getitem_cols"),
    Sample("getitem", lambda a: a[None], lambda a: a[None], [(4, 3)], name="getitem_none"),
    Sample("getitem", lambda a: a[..., 0], lambda a: a[..., 0], [(2, 4, 3)],
           name="getitem_ellipsis"),
    Sample("getitem", lambda a: a[1:, None, ::2], lambda a: a[1:, None, ::2], [(4, 3)],
           name="getitem_mixed"),
    Sample("getitem", lambda a: a[:, -2, 1::2], lambda a: a[:, -2, 1::2], [(2, 4, 3)],
           name="getitem_3d"),
    Sample("getitem", lambda a: a[0, -1], lambda a: a[0, -1], [(4, 3)],
           name="getitem_scalar"),
    Sample("getitem", lambda a: a[..., None, :-1], lambda a: a[..., None, :-1], [(2, 4, 3)],
           name="getitem_ellipsis_none"),
    Sample("getitem", lambda a: a[-3:10, :], lambda a: a[-3:10, :], [(4, 3)],
           name="getitem_clip"),
    Sample("narrow", lambda a: a.narrow(1, 1, 2), lambda a: a[:, 1:3], [(4, 3)]),
    Sample("narrow", lambda a: ct.narrow(a, 0, -2, 2), lambda a: a[-2:], [(4, 3)],
           name="narrow_neg"),
    Sample("split", lambda a: _weighted_cat(a.split(2, dim=1), 1),
           lambda a: _weighted_cat_ref(_split_ref(a, 2, 1), 1), [(4, 3)]),
    Sample("split", lambda a: _weighted_cat(ct.split(a, [1, a.shape[0] - 1]), 0),
           lambda a: _weighted_cat_ref([a[:1], a[1:]], 0), [(4, 3)], name="split_sections"),
    Sample("chunk", lambda a: _weighted_cat(a.chunk(2, dim=-1), -1),
           lambda a: _weighted_cat_ref(_split_ref(a, -(-a.shape[-1] // 2), -1), -1),
           [(4, 3)]),
    # cat / stack
    Sample("cat", lambda a, b: ct.cat([a, b]), lambda a, b: np.concatenate([a, b]),
           [(4, 3), (2, 3)], grad=(0, 1)),
    Sample("cat", lambda a, b: ct.cat((a, b), dim=-1), lambda a, b: np.concatenate([a, b], -1),
           [(4, 3), (4, 2)], grad=(0, 1), name="cat_last"),
    Sample("cat", lambda a, b, c: ct.cat([a, b, c], 1),
           lambda a, b, c: np.concatenate([a, b, c], 1), [(2, 1, 3), (2, 4, 3), (2, 2, 3)],
           grad=(0, 2), kinds=("S", "B"), name="cat_three"),
    Sample("stack", lambda a, b: ct.stack([a, b]), lambda a, b: np.stack([a, b]),
           [(4, 3), (4, 3)], grad=(0, 1)),
    Sample("stack", lambda a, b: ct.stack([a, b], dim=-1), lambda a, b: np.stack([a, b], -1),
           [(4, 3), (4, 3)], grad=(0, 1), name="stack_last"),
    Sample("stack", lambda a, b: ct.stack((a, b), 1), lambda a, b: np.stack([a, b], 1),
           [(4, 3), (4, 3)], make=_int, grad=(), name="stack_int"),
]

COVERED_ELSEWHERE = {
    "getitem.scatter": "the gradient kernel of getitem, checked by its gradient tests",
}
