"""The step profile: where a training step's wall time goes, per rank.

>>> with ct.debug.profile() as prof:
...     for step in range(5):
...         loss = model(x).sum(); loss.backward(); opt.step(); opt.zero_grad()
...         prof.step()
>>> print(prof.table())                 # collective: call it on every rank
>>> prof.export_chrome_trace("step.json")  # chrome://tracing or ui.perfetto.dev

Every moment between ``__enter__`` and ``__exit__`` is charged to exactly one column (the
innermost region that is open, exclusive time):

* **forward kernels** / **backward kernels**: an op's local computation (its kernel over
  this process's shards), outside / inside ``backward()``;
* **dispatch/tape**: the rest of an op call (plan lookup, layout checks, recording the tape)
  and the autograd engine's own bookkeeping between backward functions;
* **boxing copies**: a boxing step or gradient bucket around its collective (packing and
  unpacking, buffer allocation);
* **collectives**: inside the communicator while the data moves (MPI ``Wait`` on a posted
  collective, NCCL not included);
* **waiting**: inside the agreement that opens every MPI collective (the members'
  fingerprint guard, see :mod:`ctensor.comm.mpi`): the time this rank waited for the
  others to reach the same collective, plus one tiny message's latency;
* **optimizer**: anything inside ``Optimizer.step`` (or a ``profile.phase("optimizer")``
  such as gradient clipping), except its collectives;
* **step plan**: the step plan's own work (:mod:`ctensor.stepplan`): recording a call and
  following the plan around it (the op itself is charged as above), and the solve at the
  end of the window that learns a plan (a one-off, tens to hundreds of milliseconds: it
  used to land in **rest** and read as the training loop's own cost);
* **rest**: outside any op: the model's Python code, data loading, the training loop.

In a simulation one process holds every rank, so there is one row, the collectives are
in-process copies (charged to boxing) and nobody waits. The hooks in dispatch, autograd,
boxing and the MPI communicator test one module flag (:data:`on`) when no profile is open,
so they cost nothing measurable (``benchmarks/dispatch.py``). With a profile open each op
costs about two microseconds more; the table says how many events it timed.
"""
from __future__ import annotations

import json
import time

__all__ = ["profile", "phase", "COLUMNS"]

from . import timing
from .timing import (BOXING, BWD, COLL, COLUMNS, DISPATCH, FWD, OPT, PLAN, REST,  # noqa: F401
                     WAIT, phase)

_clock = time.perf_counter


class profile:
    """Profile the steps run inside ``with ct.debug.profile() as prof:`` (see the module
    docstring). ``max_events`` bounds the Chrome trace (the table counts everything).
    Call :meth:`step` at the end of every step for per-step figures; :meth:`table` and
    :meth:`export_chrome_trace` after the block, on every rank (they gather the ranks).
    """

    def __init__(self, max_events: int = 200_000):
        if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 0:
            raise ValueError(f"profile: argument 'max_events' must be an int >= 0, got "
                             f"{max_events!r}")
        self.max_events = max_events
        self.totals = [0.0] * len(COLUMNS)
        self.events: list = []   # (name, column, start, duration) in seconds
        self.counted = 0         # regions timed (events kept or not)
        self.steps = 0
        self.wall = 0.0
        self._stack: list = []   # open regions: [column, name, start]
        self._phase: list = []   # open phases: "backward" / "optimizer"
        self._entering = None    # the op whose region apply() just opened
        self._t0 = self._last = 0.0
        self._epoch_us = 0.0

    # ------------------------------------------------------------------ context
    def __enter__(self) -> "profile":
        if timing._active is not None:
            raise RuntimeError("profile: a profile is already open; nest none")
        timing._active, timing.on = self, True
        self._epoch_us = time.time() * 1e6
        self._t0 = self._last = _clock()
        return self

    def __exit__(self, *exc) -> None:
        now = _clock()
        self._charge(now)
        self.wall += now - self._t0
        timing._active, timing.on = None, False
        self._stack.clear()

    @property
    def is_open(self) -> bool:
        """Whether this profile is open (between ``__enter__`` and ``__exit__``)."""
        return timing._active is self

    def step(self) -> None:
        """Mark the end of one step (for the per-step figures of :meth:`table`)."""
        self.steps += 1

    # ------------------------------------------------------------------ accounting
    def _charge(self, now: float) -> None:
        stack = self._stack
        self.totals[stack[-1][0] if stack else REST] += now - self._last
        self._last = now

    def _enter(self, column: int, name: str) -> None:
        now = _clock()
        self._charge(now)
        self._stack.append([column, name, now])

    def _exit(self) -> None:
        now = _clock()
        self._charge(now)
        column, name, start = self._stack.pop()
        self.counted += 1
        if len(self.events) < self.max_events:
            self.events.append((name, column, start - self._t0, now - start))

    def _column(self, kind: int) -> int:
        ph = self._phase[-1] if self._phase else None
        if kind == FWD:
            return BWD if ph == "backward" else OPT if ph == "optimizer" else FWD
        if kind == DISPATCH:
            return OPT if ph == "optimizer" else DISPATCH
        return kind

    # ------------------------------------------------------------------ reports
    def _row(self) -> dict:
        from . import runtime
        w = runtime.world()
        return {"ranks": list(w.held_ranks), "totals": list(self.totals), "wall": self.wall,
                "steps": self.steps, "counted": self.counted}

    def _rows(self) -> list:
        from . import runtime
        w = runtime.world()
        if len(w.held_ranks) > 1 or w.size == 1:  # a simulation: this process is every rank
            return [self._row()]
        return w.exchange({w.held_ranks[0]: self._row()})

    def table(self) -> str:
        """The profile as a text table, one row per rank (per process in a simulation):
        milliseconds per step (per block when :meth:`step` was not called) in every column
        and their sum, then each column's share of the slowest rank's time. Collective
        under mpiexec: call it on every rank."""
        rows = self._rows()
        head = f"{'rank':<8}" + "".join(f"{c:>12}" for c in ("fwd kernel", "bwd kernel",
                                                              "dispatch", "boxing",
                                                              "collective", "waiting",
                                                              "optimizer", "step plan",
                                                              "rest", "total"))
        unit = "ms per step" if all(r["steps"] for r in rows) else "ms in all"
        lines = [f"step profile ({unit}; {rows[0]['steps']} steps, "
                 f"{max(r['counted'] for r in rows):,} regions timed on the busiest rank)",
                 head]
        for r in rows:
            per = 1e3 / max(r["steps"], 1)
            ranks = r["ranks"]
            label = str(ranks[0]) if len(ranks) == 1 else f"{ranks[0]}-{ranks[-1]} sim"
            lines.append(f"{label:<8}" + "".join(f"{t * per:>12.2f}" for t in r["totals"])
                         + f"{r['wall'] * per:>12.2f}")
        slow = max(rows, key=lambda r: r["wall"])
        lines.append(f"{'share':<8}" + "".join(f"{t / max(slow['wall'], 1e-12):>12.1%}"
                                               for t in slow["totals"]) + f"{1:>12.0%}")
        return "\n".join(lines)

    def trace(self) -> dict:
        """This process's events as a Chrome trace dict (``traceEvents``; one ``pid`` per
        rank, timestamps in microseconds of the wall clock)."""
        from . import runtime
        ranks = list(runtime.world().held_ranks)
        pid = ranks[0]
        label = f"rank {pid}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]} (sim)"
        events = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                   "args": {"name": label}},
                  {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                   "args": {"sort_index": pid}}]
        for name, column, start, dur in self.events:
            events.append({"name": name, "cat": COLUMNS[column], "ph": "X", "pid": pid,
                           "tid": 0, "ts": round(self._epoch_us + start * 1e6, 3),
                           "dur": round(dur * 1e6, 3)})
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def export_chrome_trace(self, path: str) -> None:
        """Write every rank's events into one Chrome-trace JSON file at ``path`` (rank 0
        writes it; one row per rank). Collective under mpiexec: call it on every rank."""
        if not isinstance(path, str) or not path:
            raise ValueError(f"export_chrome_trace: argument 'path' must be a file name, got "
                             f"{path!r}")
        from . import runtime
        w = runtime.world()
        mine = self.trace()
        if len(w.held_ranks) > 1 or w.size == 1:
            traces = [mine]
        else:
            traces = w.exchange({w.held_ranks[0]: mine})
        if w.held_ranks[0] == 0:
            events = [e for t in traces for e in t["traceEvents"]]
            with open(path, "w") as f:
                json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)

    def __repr__(self) -> str:
        state = "open" if timing._active is self else "closed"
        return f"profile({state}, {self.steps} steps, {self.counted} regions)"


profile.phase = phase  # ct.debug.profile.phase("optimizer")
