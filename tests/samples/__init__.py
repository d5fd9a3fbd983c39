"""The op sample table: one or more :class:`Sample` per registered op.

Each op family has its own module here (``elementwise.py``, ``reduction.py``, ...); every
module defines ``SAMPLES`` (a list) and, if some registered names need no sample of their
own, ``COVERED_ELSEWHERE`` (name -> reason). ``tests/test_ops.py`` runs every sample over
every mesh and every input SBP and fails if a registered op has no sample.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence



@dataclass
class Sample:
    """``fn(*tensors)`` on ctensor must equal ``ref(*arrays)`` on NumPy.

    ``shapes``: input shapes for the even case; ``uneven``: shapes that split unevenly on 2, 3
    and 4 ranks (default: ``shapes`` with every dim made 5 or 7). ``make(rng, shape, i)``
    builds input ``i`` (default standard normal float64). ``grad``: which inputs get a
    finite-difference gradient check. ``kinds``: the SBP kinds tried for every input ("S",
    "B", "P"; default all) — outputs are checked for every combination, so ops without a P
    rule are tested on boxing a P input too.
    """

    op: str
    fn: Callable
    ref: Callable
    shapes: Sequence[tuple]
    uneven: Optional[Sequence[tuple]] = None
    make: Optional[Callable] = None
    grad: Sequence[int] = (0,)
    rtol: float = 1e-7
    atol: float = 1e-9
    name: str = ""
    kinds: Sequence[str] = field(default_factory=lambda: ("S", "B", "P"))

    def __post_init__(self):
        if not self.name:
            self.name = self.op

    def inputs(self, rng, uneven: bool):
        shapes = self.uneven if (uneven and self.uneven is not None) else self.shapes
        if uneven and self.uneven is None:
            shapes = [tuple(7 if n == 4 else 5 if n == 3 else n for n in s) for s in shapes]
        out = []
        for i, s in enumerate(shapes):
            out.append(self.make(rng, s, i) if self.make else rng.standard_normal(s))
        return out


def positive(rng, shape, i):
    return rng.uniform(0.5, 2.0, shape)


def collect():
    samples, covered = [], {}
    for info in pkgutil.iter_modules(__path__):
        mod = importlib.import_module(f"{__name__}.{info.name}")
        samples += getattr(mod, "SAMPLES", [])
        covered.update(getattr(mod, "COVERED_ELSEWHERE", {}))
    return samples, covered

