"""What this process is doing right now, for collective fingerprints, timeout messages and
the communication log: the op whose inputs are being boxed and the boxing step being run.

Dispatch pushes op names, boxing pushes steps; the communicators and ``ct.debug`` read
them. This module imports nothing, so every layer may use it.
"""
from __future__ import annotations

__all__ = ["op_stack", "step_stack", "current"]

#: names of the ops being dispatched, innermost last (outside any op: ``to_global``)
op_stack: list = ["to_global"]
#: boxing steps being run, innermost last
step_stack: list = []


def current() -> tuple:
    """``(op name, boxing step or None)`` of the collective about to run."""
    return op_stack[-1], (step_stack[-1] if step_stack else None)
