"""The one op registry: public name -> the op's record (function, kernel declaration, method).

Every op family in ``ops/`` declares its ops with :func:`ctensor.dispatch.defop`, which
builds the kernel declaration (:class:`ctensor.dispatch.OpDef`, when the op has a kernel),
the public function and, where asked, the ``Tensor`` method, and records all of them here
under the op's public name. ``ct.<name>`` and the Tensor operators find the functions here
by plain attribute lookup (``OPS.add``), so the Tensor type imports no op module.

This module imports nothing from ctensor: it is the bottom of the op layer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

__all__ = ["OpRecord", "OPS"]


@dataclass(frozen=True)
class OpRecord:
    """What one public op name stands for.

    ``function`` is the public function (``ct.<name>``); ``opdef`` its kernel declaration
    (``None`` for an op written with other ops, e.g. ``clamp``); ``method`` the name of the
    ``Tensor`` method it is bound as (``None`` when it is not a method).
    """

    name: str
    function: Callable
    opdef: Optional[Any] = None
    method: Optional[str] = None


class _Ops:
    """Attribute access to the public op functions (``OPS.add(a, b)``) and their records.

    Method names here (``declare``, ``record``, ``records``, ``names``) are not op names.
    """

    def __init__(self) -> None:
        self.__dict__["_records"] = {}

    def declare(self, record: OpRecord) -> None:
        if record.name in self._records:
            raise RuntimeError(f"op {record.name!r} is declared twice "
                               f"({self._records[record.name].function.__module__} and "
                               f"{record.function.__module__})")
        self._records[record.name] = record
        self.__dict__[record.name] = record.function  # plain attribute lookup per call

    def __getattr__(self, name: str) -> Callable:
        raise AttributeError(f"ctensor has no op {name!r}")

    def record(self, name: str) -> OpRecord:
        return self._records[name]

    def records(self) -> Iterator[OpRecord]:
        return iter(self._records.values())

    def names(self) -> list:
        return sorted(self._records)

    def __contains__(self, name: str) -> bool:
        return name in self._records


OPS = _Ops()
