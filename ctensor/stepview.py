"""What the step plan did, for ``ct.debug.step_plan()``: its counters and, per planned
call, the plan's signatures against the per-op choice's (see :mod:`ctensor.stepplan`)."""
from __future__ import annotations

from . import stepplan
from .sbp import format_sbp

__all__ = ["report", "StepPlanReport"]

_IDLE = {"same": "; idle (the per-op choice is the plan: steps run unrecorded)",
         "small": "; idle (the plan's saving is below its replay's cost: steps run the "
                  "per-op choice, unrecorded; ct.step_plan(always=True) follows it)"}


class StepPlanReport:
    """What the step plan did (``ct.debug.step_plan()``): counters, and per planned call
    where the plan's layouts differ from the per-op choice's.

    ``learned``: windows solved; ``reused``: windows given the plan solved before for the
    same sequence; ``replayed``: windows that followed the plan to their end;
    ``deviations``: replays that a guard ended early (each fell back to the per-op choice
    for the rest of its window, silently); ``gave_up``: planning stopped after repeated
    failures, or windows that never repeated; ``solve_seconds``: the last solve's time;
    ``estimated``: the cost model's seconds of the planned and the per-op step; ``rows``:
    per call ``(index, op, per-op layouts, planned layouts)`` (layouts as ``inputs ->
    outputs`` in S/B/P notation).
    """

    def __init__(self, enabled, stats, plan):
        self.enabled = enabled
        self.learned, self.replayed = stats["learned"], stats["replayed"]
        self.reused = stats["reused"]
        self.deviations, self.gave_up = stats["deviations"], stats["gave_up"]
        self.idle = stats["idle"]
        self.solve_seconds = stats["solve_seconds"]
        last = stats["last_deviation"]  # (plan, position, call, the window's values)
        self.last_deviation = None if last is None else \
            (last[1], last[2].opdef.name, _why(*last))
        self.calls = len(plan.calls) if plan is not None else 0
        self.estimated = plan.totals if plan is not None else None
        self.rows = _rows(plan) if plan is not None else []

    @property
    def changed(self) -> list:
        """The rows whose planned layouts differ from the per-op choice."""
        return [r for r in self.rows if r[2] != r[3]]

    def summary(self, all_calls: bool = False) -> str:
        head = (f"step plan: {'on' if self.enabled else 'off'}; {self.calls} calls, learned "
                f"{self.learned}{f' (reused {self.reused})' if self.reused else ''}, "
                f"replayed {self.replayed}, deviations {self.deviations}"
                f"{', gave up' if self.gave_up else ''}"
                f"{_IDLE[self.idle] if self.idle else ''}")
        if self.estimated is not None:
            head += (f"; estimated {self.estimated[0] * 1e3:.3f} ms planned vs "
                     f"{self.estimated[1] * 1e3:.3f} ms per-op (solved in "
                     f"{self.solve_seconds:.3f} s)")
        rows = self.rows if all_calls else self.changed
        lines = [head, f"{'#':>5}  {'op':<24}{'per-op choice':<34}plan"]
        for i, name, per_op, planned in rows:
            lines.append(f"{i:>5}  {name:<24}{per_op:<34}{planned}")
        return "\n".join(lines)

    __str__ = summary


def _format(sigs) -> str:
    """Signatures per mesh axis as ``inputs -> outputs`` (axes joined by `` | ``)."""
    return " | ".join(f"{format_sbp(s.inputs)} -> {format_sbp(s.outputs)}" for s in sigs)


def _rows(plan) -> list:
    if plan.rows is None:
        plan.rows = [(i, c.opdef.name, _format(c.per_op or p.sigs), _format(q.sigs))
                     for i, (c, p, q) in enumerate(zip(plan.calls, plan.per_op, plan.chosen))
                     if q.sigs is not None and p.sigs is not None]
    return plan.rows


def _why(plan, pos: int, call, values: list) -> str:
    """What differs at a failed guard, in words (``ct.debug.step_plan().last_deviation``):
    call ``pos`` of the window whose ``values`` were recorded, against ``plan``."""
    if pos >= len(plan.calls):
        return f"the plan has {len(plan.calls)} calls; this is one more"
    rec, expected = plan.calls[pos], plan.expected[pos]
    sources = stepplan._sources(values, call.inputs)
    rec_sources = stepplan._sources(plan.values, rec.inputs)
    if rec.opdef is not call.opdef:
        return f"the plan has {rec.opdef.name} here"
    if rec.attrs_key != call.attrs_key:
        return "other attributes"
    if rec_sources != sources or rec.req != call.req:
        return f"other inputs ({sources}, the plan's {rec_sources})"
    got = ", ".join(f"{format_sbp(l.sbp)} {l.shape}" for l in call.layouts)
    want = ", ".join(f"{format_sbp(l.sbp)} {l.shape}" for l in expected)
    return f"input layouts {got}, the plan expects {want}"


def report() -> StepPlanReport:
    """The step plan's counters and, per call, what the plan chose against what the per-op
    choice would have (see :class:`StepPlanReport`).

    >>> print(ct.debug.step_plan())
    step plan: on; 412 calls, learned 1, replayed 3, deviations 0; ...
        #  op                      per-op choice                     plan
       14  mul                     P, B -> P                         B, B -> B
    """
    st = stepplan._state
    return StepPlanReport(st.enabled, st.stats, st.plan)
