"""The cost model: estimated seconds of communication and computation, in one place.

Dispatch picks each op's signature (per mesh axis) by the time it expects the choice to
cost, boxing prices its steps with it, and nothing else steers layouts:

* **communication** — an alpha-beta model per collective: ``latency`` seconds per call plus
  the bytes one rank sends divided by ``link_bandwidth`` (ring algorithms: an all-reduce
  sends ``2 (k-1)/k`` of its buffer, an all-gather / reduce-scatter / all-to-all ``(k-1)/k``,
  a point-to-point transfer its bytes);
* **computation** — the kernel's time on the largest shard: its floating-point operations
  divided by ``flop_rate`` where the op declares them (matmul: ``2 m n k``), else the bytes
  it reads and writes divided by ``memory_bandwidth`` (elementwise and reductions are
  memory-bound). Running an op on a broadcast or gathered input when a split one was
  possible thus costs ``k`` times the work;
* **deferred reductions** — a partial output will be reduced later: it is charged the
  cheapest reduction it can take (a reduce-scatter of its shard) now, so a "free" partial
  layout is never preferred to an equally cheap reduced one.

The constants are defaults per device kind, the same in simulation and under mpiexec (so a
simulated run makes exactly the choices a real one makes); they describe the relative
speeds that matter for a choice, not any particular machine. Change them with
:func:`set_machine`.

>>> ct.cost.machine("cpu")
Machine(latency=2e-05, link_bandwidth=6000000000.0, flop_rate=50000000000.0, memory_bandwidth=40000000000.0)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Optional

__all__ = ["Machine", "machine", "set_machine", "collective", "compute", "deferred",
           "on_change"]


@dataclass(frozen=True)
class Machine:
    """The speeds of one device kind that the cost model uses.

    ``latency``: seconds per collective call (alpha); ``link_bandwidth``: bytes per second
    one rank sends (1/beta); ``flop_rate``: FLOP/s of one rank in matmul-like kernels;
    ``memory_bandwidth``: bytes per second one rank streams through memory-bound kernels.
    """

    latency: float
    link_bandwidth: float
    flop_rate: float
    memory_bandwidth: float


_DEFAULTS = {
    # one CPU core per rank and MPI over shared memory, as measured on the 2-core development
    # machine (2026-12): raw MPI moves 5-10 GB/s, a ctensor collective costs ~20 us of its own
    # (guard, watchdog, Python); NumPy streams ~40 GB/s and multiplies ~50 GFLOP/s (float64)
    "cpu": Machine(latency=20e-6, link_bandwidth=6e9, flop_rate=50e9, memory_bandwidth=40e9),
    # a data-centre GPU with NVLink-class links
    "cuda": Machine(latency=15e-6, link_bandwidth=100e9, flop_rate=50e12,
                    memory_bandwidth=2e12),
}
_machines = dict(_DEFAULTS)
_listeners: list = []


def machine(device: str) -> Machine:
    """The :class:`Machine` the cost model uses for ``device`` (``"cpu"``/``"cuda"``)."""
    try:
        return _machines[device]
    except KeyError:
        raise ValueError(f"cost.machine: argument 'device' must be one of "
                         f"{sorted(_machines)}, got {device!r}") from None


def set_machine(device: str, **speeds) -> Machine:
    """Change some speeds of ``device`` (keyword names as in :class:`Machine`; no keywords:
    back to the defaults); returns the new description. Cached op plans are dropped, so
    later ops choose with the new numbers. Call it alike on every rank.

    >>> ct.cost.set_machine("cpu", link_bandwidth=25e9)   # a faster interconnect
    """
    current = machine(device)
    for key, value in speeds.items():
        if key not in Machine.__dataclass_fields__:
            raise TypeError(f"cost.set_machine: unknown speed {key!r}; accepted: "
                            f"{list(Machine.__dataclass_fields__)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
                or not math.isfinite(value):
            raise ValueError(f"cost.set_machine: {key} must be a positive number, got "
                             f"{value!r}")
    _machines[device] = replace(current, **{k: float(v) for k, v in speeds.items()}) \
        if speeds else _DEFAULTS[device]
    for listener in _listeners:
        listener()
    return _machines[device]


def on_change(listener: Callable[[], None]) -> None:
    """Call ``listener()`` whenever a machine description changes (plan caches register)."""
    _listeners.append(listener)


# ----------------------------------------------------------------------------- communication
#: bytes each rank sends per byte of its buffer, as a function of the group size k
_SENT = {
    "all_reduce": lambda k: 2.0 * (k - 1) / k,
    "all_gather": lambda k: (k - 1) / k,      # of the gathered (output) buffer
    "reduce_scatter": lambda k: (k - 1) / k,  # of the input buffer
    "all_to_all": lambda k: (k - 1) / k,
    "send_recv": lambda k: 1.0,
}


def collective(kind: str, group_size: int, nbytes: float, device: str = "cpu") -> float:
    """Seconds of one ``kind`` collective over ``group_size`` ranks moving a buffer of
    ``nbytes`` per rank (the output of an all-gather, the input of the others)."""
    if group_size <= 1 and kind != "send_recv":
        return 0.0
    m = machine(device)
    return m.latency + _SENT[kind](group_size) * nbytes / m.link_bandwidth


# ----------------------------------------------------------------------------- computation
def compute(device: str, nbytes: float, flops: Optional[float] = None) -> float:
    """Seconds of a kernel that touches ``nbytes`` of memory (inputs and outputs) and, when
    given, performs ``flops`` floating-point operations (the larger time counts)."""
    m = machine(device)
    seconds = nbytes / m.memory_bandwidth
    if flops is not None:
        seconds = max(seconds, flops / m.flop_rate)
    return seconds


def deferred(layout) -> float:
    """Seconds the later reduction of a partial ``layout`` will take at least: a
    reduce-scatter of its largest shard along each partial mesh axis."""
    from .sbp import Partial  # pure module; imported here to keep this one dependency-free
    total = 0.0
    p = layout.placement
    nbytes = layout.local_nbytes(p.rank_list[0])
    for axis, entry in enumerate(layout.sbp):
        if isinstance(entry, Partial):
            total += collective("reduce_scatter", p.shape[axis], nbytes, p.device)
    return total
