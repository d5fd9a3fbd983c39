"""NumPy's floating-point warnings off while kernels run: PyTorch gives ``inf``/``nan``
silently (``log(0)``, ``sqrt(-1)``, a float16 overflow), so ctensor does too, without a
``RuntimeWarning`` pointing at a ctensor source line.

``np.errstate`` costs ~2.5 us per use (it builds its state on every entry), as much as a
cached dispatch; the state it sets is one context variable, so :func:`off` sets that
variable to a state made once and :func:`restore` resets it (~0.3 us together, with the
ufunc's lookup of the new state). Where NumPy keeps it elsewhere, a fresh ``np.errstate``
does the same, slower. NumPy's own state outside ctensor's kernels is left as it was.
"""
from __future__ import annotations

import functools

import numpy as np

__all__ = ["off", "restore"]

try:  # NumPy >= 2: the error state is the context variable np.errstate sets
    from numpy._core._ufunc_config import _extobj_contextvar, _make_extobj

    #: ``off()`` turns floating-point warnings off and returns a token; ``restore(token)``
    #: puts back the state it replaced (C calls: no Python frame on dispatch's hot path)
    off = functools.partial(_extobj_contextvar.set, _make_extobj(all="ignore"))
    restore = _extobj_contextvar.reset
except ImportError:  # pragma: no cover - other NumPy layouts
    def off():
        """Turn floating-point warnings off; pass the result to :func:`restore`."""
        state = np.errstate(all="ignore")
        state.__enter__()
        return state

    def restore(token) -> None:
        """Put back the error state :func:`off` replaced."""
        token.__exit__(None, None, None)
