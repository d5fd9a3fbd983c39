import numpy as np

import ctensor as ct
from . import Sample


def _einsum(equation):
    return lambda *xs: ct.einsum(equation, *xs)


def _ref(equation):
    return lambda *xs: np.einsum(equation, *xs)


SAMPLES = [
    Sample("einsum", _einsum("ij,jk->ik"), _ref("ij,jk->ik"), [(4, 3), (3, 2)],
           uneven=[(5, 7), (7, 3)], grad=(0, 1), name="einsum_matmul"),
    Sample("einsum", _einsum("bij,bkj->bik"), _ref("bij,bkj->bik"), [(2, 4, 3), (2, 2, 3)],
           uneven=[(3, 5, 7), (3, 2, 7)], grad=(0, 1), name="einsum_batched_nt"),
    Sample("einsum", lambda a, b: ct.einsum("i,j", [a, b]), _ref("i,j"), [(4,), (3,)],
           grad=(0, 1), name="einsum_outer_implicit"),
    Sample("einsum", _einsum("...ij->...ji"), _ref("...ij->...ji"), [(2, 4, 3)],
           name="einsum_transpose"),
    Sample("einsum", _einsum("ii->"), _ref("ii->"), [(4, 4)], name="einsum_trace"),
    Sample("einsum", _einsum("iij,j->ij"), _ref("iij,j->ij"), [(3, 3, 4), (4,)],
           grad=(0, 1), name="einsum_diagonal"),
    Sample("einsum", _einsum("ij,ij->"), _ref("ij,ij->"), [(4, 3), (4, 3)], grad=(0, 1),
           name="einsum_sum_all"),
]
