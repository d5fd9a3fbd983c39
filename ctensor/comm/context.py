"""What this process is doing right now, for collective fingerprints, timeout messages and
the communication log: the op whose inputs are being boxed and the boxing step being run.

Dispatch pushes op names, boxing pushes steps; the communicators and ``ct.debug`` read
them. This module imports only the pure SBP module, so every layer may use it.
"""
from __future__ import annotations

from ..sbp import format_sbp

__all__ = ["op_stack", "step_stack", "current", "describe_step"]

#: names of the ops being dispatched, innermost last (outside any op: ``to_global``)
op_stack: list = ["to_global"]
#: boxing steps being run, innermost last
step_stack: list = []


def current() -> tuple:
    """``(op name, boxing step or None)`` of the collective about to run."""
    return op_stack[-1], (step_stack[-1] if step_stack else None)


def describe_step(step) -> str:
    """One line about a boxing step: collective, SBPs, shape, dtype and placement(s)."""
    before, after = step.before, step.after
    axis = "" if getattr(step, "mesh_axis", None) is None else f" on mesh axis {step.mesh_axis}"
    what = f"{tuple(before.shape)} {before.dtype}"
    if before.placement == after.placement:
        return (f"{step.collective}{axis} {format_sbp(before.sbp)} -> {format_sbp(after.sbp)} "
                f"of {what} on {before.placement!r}")
    return (f"{step.collective} of {what} from {format_sbp(before.sbp)} on "
            f"{before.placement!r} to {format_sbp(after.sbp)} on {after.placement!r}")
