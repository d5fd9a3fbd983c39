"""What each rank did during one pipeline step: compute, waiting, activation memory.

:func:`ctensor.nn.pipeline.pipeline_step` fills a :class:`Timeline` when it is given one.
Each rank records, for every event of its own stage, when the walk reached it, when its
input (forward) or output gradient (backward) was there, and when its compute ended; and
the bytes of the activations its stage keeps for the backward (every tensor an op saves,
counted once per buffer through :func:`ctensor.autograd.saved_tensors_hooks`; parameters
are not activations and are left out, copies of them made for an op are not). The records
are gathered on every rank at the end of the step (one small collective).

Under ``mpiexec`` the times are measured (wall clock; ranks on one machine share it). In a
simulation one process computes every stage one after the other, so the timeline is
*replayed*: each event keeps its measured compute time and starts as soon as its device is
free and its input is there (transfers free) — what the schedule would do on real ranks.

>>> tl = nn.pipeline.Timeline()
>>> loss = pipeline_step(stages, xs, loss_fn, ys, timeline=tl)
>>> print(tl.summary())
>>> tl.save("timeline.svg")            # .svg needs nothing; .png needs matplotlib
"""
from __future__ import annotations

import contextlib
import html
import time
from typing import Optional

import numpy as np

import ctensor as ct

from .module import Parameter

__all__ = ["Timeline", "bubble_fraction"]

# the columns of one recorded event
_VALID, _KIND, _STAGE, _MICRO, _BEGIN, _READY, _END, _LIVE = range(8)
_COLUMNS = 8
COLOURS = {"F": "#4c72b0", "B": "#55a868", "idle": "#e5e5e5"}


def bubble_fraction(num_stages: int, num_micro_batches: int, num_model_chunks: int = 1) -> float:
    """The theoretical idle fraction of a device in one step of 1F1B (GPipe alike) with
    forward and backward times equal on every stage and free communication:
    ``(p - 1) / (v m + p - 1)`` — the bubble ``(p - 1)(t_f + t_b) / v`` over the step's
    length (Narayanan et al. 2021: bubble / ideal time ``(p - 1) / (v m)``).

    >>> bubble_fraction(4, 8)
    0.2727272727272727
    """
    p, m, v = num_stages, num_micro_batches, num_model_chunks
    return (p - 1) / (v * m + p - 1)


def _buffer(arr) -> tuple:
    """A key of the memory an array views (its first byte and length)."""
    data = getattr(arr, "data", None)
    ptr = getattr(data, "ptr", None)
    if ptr is None:
        ptr = arr.__array_interface__["data"][0] if hasattr(arr, "__array_interface__") \
            else id(arr)
    return int(ptr), int(arr.nbytes)


class Timeline:
    """One pipeline step's events per rank; fill it with ``pipeline_step(...,
    timeline=tl)`` (each call records that step, replacing what was there).

    ``events[rank]`` is a list of ``(kind, stage, micro_batch, begin, ready, end,
    live_bytes)``: seconds from the step's start (``begin`` the walk reached the event,
    ``ready`` its input or gradient had arrived, ``end`` its compute ended) and the
    activation bytes the rank holds for the backward after the event.

    >>> tl = nn.pipeline.Timeline()
    >>> pipeline_step(stages, xs, loss_fn, ys, kind="gpipe", timeline=tl)
    >>> tl.peak_live_micro_batches()         # GPipe: every micro-batch at once
    {0: 8, 1: 8}
    """

    def __init__(self) -> None:
        self.events: dict = {}
        self.kind: Optional[str] = None
        self.num_stages = self.num_micro_batches = self.num_model_chunks = 0
        self.stage_ranks: list = []  # virtual stage -> its placement's ranks
        self.replayed = False

    @classmethod
    def replayed_schedule(cls, report) -> "Timeline":
        """The timeline of a planned step (a ``ct.plan.StepReport``): its schedule as
        replayed (``report.events``), one row per pipeline device (its first rank).

        >>> Timeline.replayed_schedule(ct.plan.step_report(...)).save("predicted.svg")
        """
        tl = cls()
        p = report.devices or len(report.stage_forward)
        tl.kind, tl.num_stages, tl.num_micro_batches = report.schedule, p, report.micro_batches
        tl.num_model_chunks = len(report.stage_forward) // p
        tl.stage_ranks = [tuple(r) for r in report.stage_ranks]
        tl.replayed = True
        for k, j, m, start, end in report.events:
            rank = tl.stage_ranks[j % p][0]
            tl.events.setdefault(rank, []).append((k, j, m, start, start, end, 0))
        return tl

    # ------------------------------------------------------------------ recording
    def _start(self, stages, p: int, m: int, v: int, kind: str, held) -> "_Recorder":
        self.kind, self.num_stages, self.num_micro_batches, self.num_model_chunks = kind, p, m, v
        self.stage_ranks = [tuple(s.placement.rank_list) for s in stages]
        self.events = {}
        return _Recorder(self, held)

    # ------------------------------------------------------------------ statistics
    def ranks(self) -> list:
        return sorted(r for r, evs in self.events.items() if evs)

    def span(self) -> float:
        """Seconds from the first event's start to the last one's end, over all ranks."""
        ends = [e[5] for evs in self.events.values() for e in evs]
        return max(ends) if ends else 0.0

    def busy(self, rank: int) -> float:
        """Seconds ``rank`` computed (forward or backward) during the step."""
        return sum(e[5] - e[4] for e in self.events.get(rank, ()))

    def idle_fraction(self) -> dict:
        """``{rank: share of the step it did not compute}`` (waiting for inputs and
        gradients, passing over other stages' events, the bubble)."""
        span = self.span()
        return {r: (1.0 - self.busy(r) / span if span else 0.0) for r in self.ranks()}

    def theoretical_bubble(self) -> float:
        """:func:`bubble_fraction` of this step's schedule."""
        return bubble_fraction(self.num_stages, self.num_micro_batches, self.num_model_chunks)

    def peak_activation_bytes(self) -> dict:
        """``{rank: most activation bytes it held for the backward at once}``."""
        return {r: max((e[6] for e in self.events[r]), default=0) for r in self.ranks()}

    def peak_live_micro_batches(self) -> dict:
        """``{rank: most forwards it had run whose backward had not run yet}`` (GPipe:
        ``m`` on every device; 1F1B: at most ``p - d`` on device ``d``)."""
        out = {}
        for r in self.ranks():
            live = peak = 0
            for e in self.events[r]:
                live += 1 if e[0] == "F" else -1
                peak = max(peak, live)
            out[r] = peak
        return out

    def summary(self) -> str:
        """A small table: per rank its stages, compute, idle share against the theory, and
        peak activations."""
        theory = self.theoretical_bubble()
        idle = self.idle_fraction()
        mem = self.peak_activation_bytes()
        live = self.peak_live_micro_batches()
        how = "replayed from one process's compute times" if self.replayed else "measured"
        lines = [f"{self.kind} schedule, {self.num_stages} devices x {self.num_model_chunks} "
                 f"chunk(s), {self.num_micro_batches} micro-batches ({how}); step "
                 f"{1e3 * self.span():.1f} ms; theoretical idle (p-1)/(vm+p-1) = {theory:.1%}",
                 f"{'rank':>4}  {'stages':<10} {'busy ms':>8} {'idle':>6} {'peak act MiB':>13} "
                 f"{'live mb':>7}"]
        for r in self.ranks():
            stages = ",".join(str(j) for j, ranks in enumerate(self.stage_ranks) if r in ranks)
            lines.append(f"{r:>4}  {stages:<10} {1e3 * self.busy(r):>8.1f} {idle[r]:>6.1%} "
                         f"{mem[r] / 2**20:>13.2f} {live[r]:>7}")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        """The statistics as plain numbers (for a JSON log)."""
        return {"kind": self.kind, "num_stages": self.num_stages,
                "num_micro_batches": self.num_micro_batches,
                "num_model_chunks": self.num_model_chunks, "replayed": self.replayed,
                "step_s": self.span(), "theoretical_idle": self.theoretical_bubble(),
                "idle_fraction": {str(r): v for r, v in self.idle_fraction().items()},
                "busy_s": {str(r): self.busy(r) for r in self.ranks()},
                "peak_activation_bytes": {str(r): int(v) for r, v in
                                          self.peak_activation_bytes().items()},
                "peak_live_micro_batches": {str(r): v for r, v in
                                            self.peak_live_micro_batches().items()}}

    # ------------------------------------------------------------------ pictures
    def save(self, path: str, title: Optional[str] = None) -> None:
        """Draw the timeline: one row per rank, forwards, backwards and idle time in their
        colours, each bar labelled with its micro-batch (and chunk). A ``.svg`` path is
        written without any dependency; other formats (``.png``) need matplotlib
        (``ImportError`` saying so without it)."""
        if str(path).lower().endswith(".svg"):
            with open(path, "w") as f:
                f.write(self._svg(title))
            return
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            raise ImportError(f"Timeline.save: writing {path} needs matplotlib (pip install -e "
                              f"'.[examples]'); a .svg path needs nothing") from None
        ranks = self.ranks()
        span = self.span() or 1.0
        fig, ax = plt.subplots(figsize=(10, 0.55 * len(ranks) + 1.4))
        for row, r in enumerate(ranks):
            y = len(ranks) - 1 - row
            ax.barh(y, span, left=0, height=0.8, color=COLOURS["idle"])
            for k, j, i, _, ready, end, _ in self.events[r]:
                ax.barh(y, end - ready, left=ready, height=0.8, color=COLOURS[k],
                        edgecolor="white", linewidth=0.5)
                if (end - ready) / span > 0.015:
                    ax.text(ready + (end - ready) / 2, y, self._label(j, i), ha="center",
                            va="center", fontsize=7, color="white")
        ax.set_yticks(range(len(ranks)))
        ax.set_yticklabels([f"rank {r}" for r in reversed(ranks)])
        ax.set_xlim(0, span)
        ax.set_xlabel("seconds" + (" (replayed)" if self.replayed else ""))
        ax.set_title(title or self.describe(), fontsize=9)
        from matplotlib.patches import Patch
        ax.legend(handles=[Patch(color=COLOURS["F"], label="forward"),
                           Patch(color=COLOURS["B"], label="backward"),
                           Patch(color=COLOURS["idle"], label="idle")],
                  loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(ranks) < 3 else -0.2),
                  ncol=3, fontsize=8, frameon=False)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)

    def _label(self, stage: int, micro: int) -> str:
        if self.num_model_chunks > 1:
            return f"{micro}.{stage // self.num_stages}"
        return str(micro)

    def describe(self) -> str:
        """One line: the schedule, its sizes, the idle share of each rank and the theory."""
        idle = self.idle_fraction()
        shown = ", ".join(f"{r}: {v:.0%}" for r, v in idle.items())
        return (f"{self.kind}, p={self.num_stages}, m={self.num_micro_batches}"
                + (f", v={self.num_model_chunks}" if self.num_model_chunks > 1 else "")
                + f" — idle per rank {shown}; theory {self.theoretical_bubble():.0%}"
                + (" (replayed)" if self.replayed else ""))

    def _svg(self, title: Optional[str]) -> str:
        ranks = self.ranks()
        span = self.span() or 1.0
        left, width, row_h, top = 70, 900, 26, 34
        height = top + row_h * len(ranks) + 44
        scale = width / span
        out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 20}" '
               f'height="{height}" font-family="sans-serif" font-size="11">',
               f'<text x="{left}" y="18" font-size="12">{html.escape(title or self.describe())}'
               f'</text>']
        for row, r in enumerate(ranks):
            y = top + row * row_h
            out.append(f'<text x="4" y="{y + row_h / 2 + 4}">rank {r}</text>')
            out.append(f'<rect x="{left}" y="{y}" width="{width}" height="{row_h - 4}" '
                       f'fill="{COLOURS["idle"]}"/>')
            for k, j, i, _, ready, end, _ in self.events[r]:
                x, w = left + ready * scale, max((end - ready) * scale, 0.5)
                out.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{row_h - 4}" '
                           f'fill="{COLOURS[k]}" stroke="white" stroke-width="0.5"/>')
                if w > 14:
                    out.append(f'<text x="{x + w / 2:.2f}" y="{y + row_h / 2 + 2}" '
                               f'fill="white" text-anchor="middle">{self._label(j, i)}</text>')
        y = top + row_h * len(ranks) + 16
        for n, (name, colour) in enumerate((("forward", COLOURS["F"]), ("backward", COLOURS["B"]),
                                            ("idle", COLOURS["idle"]))):
            x = left + n * 110
            out.append(f'<rect x="{x}" y="{y - 10}" width="14" height="12" fill="{colour}"/>')
            out.append(f'<text x="{x + 20}" y="{y}">{name}</text>')
        out.append(f'<text x="{left + 360}" y="{y}">{1e3 * span:.1f} ms'
                   f'{" (replayed)" if self.replayed else ""}</text>')
        out.append("</svg>")
        return "\n".join(out) + "\n"


class _Recorder:
    """Fills a :class:`Timeline` during one ``pipeline_step`` (this process's ranks)."""

    def __init__(self, timeline: Timeline, held):
        self.timeline = timeline
        self.held = tuple(held)
        self.rows: dict = {r: [] for r in self.held}
        self.saved: dict = {}   # (stage, micro) -> {rank: bytes it saved for the backward}
        self.live: dict = {r: 0 for r in self.held}
        self.offset = time.time() - time.perf_counter()  # perf_counter -> wall clock

    @contextlib.contextmanager
    def saving(self, stage: int, micro: int):
        """Count the bytes of every tensor saved for the backward inside the block."""
        seen, per_rank = set(), self.saved.setdefault((stage, micro), {})

        def pack(t):
            if isinstance(t, Parameter):  # weights are no activations (a boxed copy is)
                return t
            for r, arr in t.local_shards().items():
                key = (r,) + _buffer(arr)
                if key not in seen:
                    seen.add(key)
                    per_rank[r] = per_rank.get(r, 0) + int(arr.nbytes)
            return t

        with ct.autograd.saved_tensors_hooks(pack, lambda t: t):
            yield

    def event(self, kind: str, stage: int, micro: int, begin: float, ready: float,
              end: float) -> None:
        ranks = [r for r in self.held if r in self.timeline.stage_ranks[stage]]
        saved = self.saved.get((stage, micro), {})
        for r in ranks:
            self.live[r] += saved.get(r, 0) * (1 if kind == "F" else -1)
            self.rows[r].append((1.0, 0.0 if kind == "F" else 1.0, stage, micro,
                                 begin + self.offset, ready + self.offset, end + self.offset,
                                 float(self.live[r])))

    def finish(self) -> None:
        """Replay (in a simulation of several ranks) or gather (under mpiexec) the rows."""
        tl = self.timeline
        size = ct.world_size()
        per_rank = 2 * tl.num_micro_batches * tl.num_model_chunks
        if len(self.held) > 1:
            self._replay()
        tl.replayed = len(self.held) > 1
        local = {}
        for r in self.held:
            arr = np.zeros((per_rank, _COLUMNS))
            rows = self.rows[r][:per_rank]
            if rows:
                arr[:len(rows)] = np.array(rows)
            local[r] = arr
        if size > 1 and len(self.held) == 1:  # one rank per process: gather everybody's
            everyone = ct.placement.all()
            full = ct.from_local(local[self.held[0]], everyone, ct.sbp.split(0)).numpy()
            table = {r: full[r * per_rank:(r + 1) * per_rank] for r in range(size)}
        else:
            table = local
        valid = [a[a[:, _VALID] > 0] for a in table.values()]
        t0 = min((float(a[:, _BEGIN].min()) for a in valid if len(a)), default=0.0)
        tl.events = {}
        for r, arr in table.items():
            arr = arr[arr[:, _VALID] > 0]
            tl.events[r] = [("F" if row[_KIND] == 0 else "B", int(row[_STAGE]), int(row[_MICRO]),
                             row[_BEGIN] - t0, row[_READY] - t0, row[_END] - t0, int(row[_LIVE]))
                            for row in arr]

    def _replay(self) -> None:
        """Place every event as if each device ran on its own: it starts when its device is
        free and its input is there, and takes the compute time it took here (shared by the
        ranks of its stage, which this process computed one after another)."""
        tl = self.timeline
        p = tl.num_stages
        last = len(tl.stage_ranks) - 1
        done: dict = {}  # (kind, stage, micro) -> replayed end
        free: dict = {}  # device -> when it is free
        first = min((row[_BEGIN] for rows in self.rows.values() for row in rows), default=0.0)
        seen: dict = {}
        for r in self.held:  # every rank of a stage computed the same events: take one
            for row in self.rows[r]:
                key = (row[_KIND], int(row[_STAGE]), int(row[_MICRO]))
                seen.setdefault(key, (row, len(tl.stage_ranks[int(row[_STAGE])])))
        order = sorted(seen, key=lambda key: seen[key][0][_BEGIN])
        placed = {}
        for key in order:
            row, n = seen[key]
            kind, j, m = key
            needs = []
            if kind == 0.0 and j > 0:
                needs.append(done.get((0.0, j - 1, m), first))
            if kind == 1.0:
                needs.append(done.get((0.0, j, m), first))
                if j < last:
                    needs.append(done.get((1.0, j + 1, m), first))
            device = j % p
            previous = free.get(device, first)
            start = max([previous] + needs)
            end = start + (row[_END] - row[_READY]) / n
            done[key] = free[device] = end
            placed[key] = (previous, start, end)
        for r in self.held:
            self.rows[r] = [row[:_BEGIN] + placed[(row[_KIND], int(row[_STAGE]),
                                                   int(row[_MICRO]))] + row[_LIVE:]
                            for row in self.rows[r]]
