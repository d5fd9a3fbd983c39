"""``ct.linalg``: the ``torch.linalg`` functions ctensor has, declared with the other
linear-algebra ops in ``ctensor/ops/linalg.py`` (registered as ``linalg.norm``, ...).

>>> ct.linalg.norm(x, dim=-1); ct.linalg.vector_norm(x, ord=1); ct.linalg.matrix_norm(w)
"""
from .ops.linalg import linalg_norm as norm, matrix_norm, vector_norm

__all__ = ["norm", "vector_norm", "matrix_norm"]
