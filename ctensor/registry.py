"""Name -> op function table that the Tensor class calls through.

``tensor.py`` defines the operators and methods users expect; the op families in
``ops/`` register the functions behind them here when ``ctensor`` is imported, so the
Tensor type needs no import of any op module (and there is no import cycle).
"""
from __future__ import annotations

from typing import Callable


class _Ops:
    """Attribute access to registered op functions: ``OPS.add(a, b)``."""

    def __init__(self):
        self._table: dict[str, Callable] = {}

    def register(self, name: str, fn: Callable) -> Callable:
        self._table[name] = fn
        self.__dict__[name] = fn  # found by plain attribute lookup: no __getattr__ per call
        return fn

    def __getattr__(self, name: str) -> Callable:
        try:
            return self.__dict__["_table"][name]
        except KeyError:
            raise AttributeError(f"ctensor has no op {name!r}") from None

    def names(self) -> list:
        return sorted(self._table)


OPS = _Ops()


def register(name: str) -> Callable:
    """Decorator: make ``fn`` the implementation behind ``OPS.<name>``."""
    def wrap(fn: Callable) -> Callable:
        return OPS.register(name, fn)
    return wrap
