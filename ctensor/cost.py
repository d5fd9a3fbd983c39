"""The cost model: estimated seconds of communication and computation, in one place.

The per-op signature choice (:mod:`ctensor.choice`), boxing's plans (:func:`ctensor.boxing.cost`)
and the price of a whole step (:mod:`ctensor.plan`, ``ct.plan``) all price with the functions
here, on one kind of device description (:class:`Device`, read from ``ctensor/devices.toml``):

* **communication** (:func:`collective`) — alpha-beta per step:
  ``call_overhead + steps(kind, k) * latency + sent(kind, k) * nbytes / bandwidth``. The
  bytes are the ring's: an all-reduce sends ``2 (k-1)/k`` of its buffer, an all-gather /
  reduce-scatter / all-to-all ``(k-1)/k``, a broadcast and a point-to-point transfer their
  buffer. The steps are those of the algorithm run where latency counts (small buffers):
  recursive doubling / halving or a tree, ``ceil(log2 k)`` for an all-reduce, all-gather,
  reduce-scatter and broadcast (one exchange on 2 ranks, as MPICH's and NCCL's small
  all-reduce and all-gather both make), ``k-1`` for an all-to-all, one for a transfer (at
  large sizes the ring's ``2(k-1)`` steps' latency is negligible against its bytes).
  ``call_overhead`` is the software's per call (ctensor's Python, MPI's or NCCL's launch).
  Inside a node the device's ``intra_*`` figures apply; a group spread over nodes crosses
  the network with ``inter_bandwidth`` per rank of the group on a node (NCCL runs one ring
  per NIC), at most ``intra_bandwidth``, and ``inter_latency`` per step;
* **computation** (:func:`compute`) — the roofline of the kernel on its largest shard:
  ``max(flops / rate, bytes / memory_bandwidth) / efficiency`` (``rate``: the half-precision
  peak for 2-byte dtypes, else the float32 one — or, where the table has a measured
  ``gemm`` / ``gemm_fp64`` curve, the FLOP/s a GEMM of the kernel's arithmetic intensity
  reached: small GEMMs run far below a large one's rate), plus ``op_overhead`` per
  dispatched op where a whole step is priced (:func:`dispatch`: Python dispatch and the
  autograd tape, which dominate on a CPU at small sizes; the choice leaves it out, as every
  candidate pays it). ``efficiency`` is the table's, or, for an op the table's measured
  ``kernels`` names, that op's (a price given the op's name: ``ct.plan``'s); a kernel
  priced as running while every rank of the machine computes (``ranks > 1``) is slowed by
  the table's ``contention`` (shared caches and memory bandwidth; 1 on the GPU tables).
  The choice (:mod:`ctensor.choice`, :mod:`ctensor.stepsolve`) prices with the same
  function and table without an op name or concurrency: those two factors scale every
  candidate of one op alike;
* **deferred reductions** (:func:`deferred`) — a partial output will be reduced later: it is
  charged the cheapest reduction it can take (a reduce-scatter of its shard) now.

For a planner that minimises a whole step (issue 21) the public prices are
:func:`collective`, :func:`compute`, :func:`kernel_seconds` (an op's kernel given its boxed
input and output layouts), :func:`dispatch` and, for boxing one layout into another,
:func:`ctensor.boxing.cost` (each of its steps priced by :func:`collective`).

The choice prices a placement's device kind (``"cpu"`` or ``"cuda"``) with
:func:`machine` — the ``cpu`` / ``cuda`` tables of ``devices.toml`` unless
:func:`set_machine` changed them — the same in simulation and under mpiexec, so a simulated
run makes exactly the choices a real one makes. ``python benchmarks/calibrate.py`` measures this
machine and writes its ``cpu`` table.

>>> ct.cost.collective("all_reduce", 2, 4 << 20, "cpu")      # seconds of 4 MiB on 2 ranks
>>> ct.cost.machine("cpu").intra_bandwidth
"""
from __future__ import annotations

import bisect
import contextlib
import functools
import math
import os
import tomllib
from dataclasses import dataclass, fields, replace
from typing import Callable, Iterator, Optional, Union

__all__ = ["EFFICIENCY", "Device", "devices", "device", "load_devices", "machine",
           "set_machine", "using", "on_change", "steps", "sent", "collective", "compute",
           "kernel_work", "kernel_seconds", "dispatch", "deferred", "COLLECTIVES"]

#: the fraction of a device's peak (FLOP/s and memory bandwidth) a kernel achieves when a
#: device table does not say (its ``efficiency``): fixed once (2026-12) as a round figure
#: between the ~0.45 of large GEMMs' peak a training step of Megatron-LM sustains end to end
#: and the ~0.8 cuBLAS reaches on one large GEMM, and not tuned per configuration. A table
#: measured by ``benchmarks/calibrate.py`` holds the rates of one large GEMM and of streaming, and
#: the fraction of them a GPT step's kernels reached.
EFFICIENCY = 0.6

DEVICE_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "devices.toml")


@dataclass(frozen=True)
class Device:
    """One device as the cost model prices it (keys as in ``ctensor/devices.toml``).

    ``peak_flops`` / ``peak_flops_fp32``: FLOP/s of half-precision / float32 matmuls;
    ``memory_bytes``; ``memory_bandwidth`` (bytes/s of memory-bound kernels);
    ``intra_bandwidth`` / ``inter_bandwidth``: bytes/s one rank sends inside its node / off
    it; ``intra_latency`` / ``inter_latency``: seconds per collective step. Optional:
    ``call_overhead`` (seconds per collective call, default 0), ``op_overhead`` (seconds per
    dispatched op, default 0), ``efficiency`` (of the peaks, default :data:`EFFICIENCY`),
    ``contention`` (how much slower kernels run while every core of the machine runs a
    rank: shared caches and memory bandwidth; default 1).

    Measured curves (``benchmarks/calibrate.py`` writes them for this machine; a table
    without them is priced from its peaks), TOML lists of ``[x, y]`` pairs with ``x``
    increasing: ``gemm`` / ``gemm_fp64`` — ``[FLOPs per byte, FLOP/s]`` of float32 /
    float64 GEMMs (a GEMM's arithmetic intensity grows with its size, and so does its
    speed; linear in ``log x`` between points, the end's rate beyond them); ``kernels`` —
    ``[op name, efficiency]``: the fraction of the roofline an op's kernels reached in a
    measured training step (``efficiency`` for the ops it does not name).
    """

    name: str
    peak_flops: float
    peak_flops_fp32: float
    memory_bytes: int
    memory_bandwidth: float
    intra_bandwidth: float
    inter_bandwidth: float
    intra_latency: float
    inter_latency: float
    call_overhead: float = 0.0
    op_overhead: float = 0.0
    efficiency: float = EFFICIENCY
    contention: float = 1.0
    gemm: tuple = ()        # ((FLOPs per byte, FLOP/s), ...) of float32 GEMMs
    gemm_fp64: tuple = ()   # the same of float64 GEMMs
    kernels: tuple = ()     # ((op name, efficiency), ...)


_OPTIONAL = ["call_overhead", "op_overhead", "efficiency", "contention"]
#: the measured curves (lists of ``[x, y]`` pairs; see :class:`Device`)
_CURVES = ["gemm", "gemm_fp64", "kernels"]
_REQUIRED = [f.name for f in fields(Device) if f.name not in ["name"] + _OPTIONAL + _CURVES]
_devices: dict = {}
_overrides: dict = {}   # device kind -> Device (set_machine)
_listeners: list = []


def _check_number(where: str, key: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value < 0 or (value == 0 and key not in _OPTIONAL[:2]):
        raise ValueError(f"{where}: {key} must be a positive number, got {value!r}")
    return float(value)


def load_devices(path: str = DEVICE_FILE) -> dict:
    """Read device descriptions from a TOML file (one table per device, keys as in
    :class:`Device`) and add them to :func:`devices`; returns them by name. Cached op plans
    are dropped (a ``cpu`` or ``cuda`` table changes what the choice prices).

    >>> ct.plan.load_devices("my_cluster.toml")["my-gpu"].peak_flops
    """
    with open(path, "rb") as f:
        tables = tomllib.load(f)
    out = {}
    for name, table in tables.items():
        missing = [k for k in _REQUIRED if k not in table]
        unknown = [k for k in table if k not in _REQUIRED + _OPTIONAL + _CURVES]
        if missing or unknown:
            raise ValueError(f"load_devices: device {name!r} in {path}: missing keys "
                             f"{missing}, unknown keys {unknown}; expected exactly "
                             f"{_REQUIRED} (optional: {_OPTIONAL}; measured curves: "
                             f"{_CURVES})")
        out[name] = _from_table(f"load_devices: device {name!r} in {path}", name, table)
    if not _devices and path != DEVICE_FILE:
        _load_default()
    _devices.update(out)
    _changed()
    return out


def _check_curve(where: str, key: str, value) -> tuple:
    """A measured curve: a list of ``[x, y]`` pairs of numbers >= 0 with ``x`` increasing
    (``kernels``: ``[op name, efficiency > 0]``), as a tuple of tuples."""
    pairs = isinstance(value, (list, tuple)) and len(value) > 0 and all(
        isinstance(p, (list, tuple)) and len(p) == 2 for p in value)
    if pairs and key == "kernels":
        ok = all(isinstance(n, str) and _number(e) and e > 0 for n, e in value)
        if ok:
            return tuple((n, float(e)) for n, e in value)
        raise ValueError(f"{where}: {key} must be a list of [op name, efficiency > 0] pairs, "
                         f"got {value!r}")
    if pairs and all(_number(v) and v >= 0 for p in value for v in p) and \
            all(a[0] < b[0] for a, b in zip(value, value[1:])):
        return tuple((float(x), float(y)) for x, y in value)
    raise ValueError(f"{where}: {key} must be a non-empty list of [x, y] pairs of numbers "
                     f">= 0 with x increasing, got {value!r}")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _from_table(where: str, name: str, table: dict) -> Device:
    return Device(name, **{k: _check_curve(where, k, v) if k in _CURVES else
                           _check_number(where, k, v) for k, v in table.items()})


def _load_default() -> None:
    with open(DEVICE_FILE, "rb") as f:
        tables = tomllib.load(f)
    for name, table in tables.items():
        _devices[name] = _from_table(f"device {name!r} in {DEVICE_FILE}", name, table)


def devices() -> dict:
    """The known devices by name (``ctensor/devices.toml`` plus any loaded later)."""
    if not _devices:
        _load_default()
    return dict(_devices)


def device(name: Union[str, Device]) -> Device:
    """The :class:`Device` named ``name`` (``"cpu"``, ``"a100-80gb"``, ``"h100"``, ...)."""
    if isinstance(name, Device):
        return name
    known = devices() if not _devices else _devices
    if name not in known:
        raise ValueError(f"plan.device: unknown device {name!r}; known: {sorted(known)} "
                         f"(add one to ctensor/devices.toml or load_devices(path))")
    return known[name]


def machine(kind: str) -> Device:
    """The :class:`Device` the signature choice prices placements of ``kind`` with
    (``"cpu"``/``"cuda"``): :func:`set_machine`'s, else the table of that name."""
    hit = _overrides.get(kind)
    if hit is not None:
        return hit
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"cost.machine: argument 'kind' must be one of ['cpu', 'cuda'], "
                         f"got {kind!r}")
    return device(kind)


def set_machine(kind: str, base: Union[None, str, Device] = None, **speeds) -> Device:
    """Make the choice price placements of ``kind`` with ``base`` (a :class:`Device` or a
    device's name; default: what it uses now) with some fields changed (``speeds``, keyword
    names as in :class:`Device`); no arguments: back to the ``kind`` table of
    ``devices.toml``. Returns the description now used. Cached op plans are dropped, so
    later ops choose with the new numbers. Call it alike on every rank.

    >>> ct.cost.set_machine("cpu", intra_bandwidth=25e9)   # a faster interconnect
    >>> ct.cost.set_machine("cuda", "h100")                # choose as on an H100
    """
    current = machine(kind)
    checked = {}
    for key, value in speeds.items():
        if key not in _REQUIRED + _OPTIONAL + _CURVES:
            raise TypeError(f"cost.set_machine: unknown field {key!r}; accepted: "
                            f"{_REQUIRED + _OPTIONAL + _CURVES}")
        checked[key] = (_check_curve if key in _CURVES else _check_number)(
            "cost.set_machine", key, value)
    if base is None and not speeds:
        _overrides.pop(kind, None)
    else:
        start = current if base is None else device(base)
        _overrides[kind] = replace(start, **checked)
    _changed()
    return machine(kind)


@contextlib.contextmanager
def using(kind: str, base: Union[str, Device]) -> Iterator[Device]:
    """Within the block the choice prices placements of ``kind`` with ``base`` (as
    :func:`set_machine`), after it as before. ``ct.plan`` chooses so with the device it
    prices the step on.

    >>> with ct.cost.using("cuda", "a100-80gb"):
    ...     y = x @ w
    """
    saved = _overrides.get(kind)
    set_machine(kind, base)
    try:
        yield machine(kind)
    finally:
        if saved is None:
            _overrides.pop(kind, None)
        else:
            _overrides[kind] = saved
        _changed()


def on_change(listener: Callable[[], None]) -> None:
    """Call ``listener()`` whenever a device description changes (plan caches register)."""
    _listeners.append(listener)


def _changed() -> None:
    for listener in _listeners:
        listener()


def _resolve(dev: Union[str, Device]) -> Device:
    if isinstance(dev, Device):
        return dev
    return machine(dev) if dev in ("cpu", "cuda") else device(dev)


# ----------------------------------------------------------------------------- communication
#: bytes each rank sends per byte of its buffer (an all-gather's output, the input of the
#: others), as a function of the group size k
_SENT = {
    "all_reduce": lambda k: 2.0 * (k - 1) / k,
    "all_gather": lambda k: (k - 1) / k,
    "reduce_scatter": lambda k: (k - 1) / k,
    "all_to_all": lambda k: (k - 1) / k,
    "broadcast": lambda k: 1.0,   # a pipelined tree: each rank forwards the buffer once
    "send_recv": lambda k: 1.0,
}
#: latency-bound steps of each collective over k ranks: the algorithm MPI and NCCL run where
#: latency matters (small buffers) — recursive doubling / halving, or a tree, ``ceil(log2
#: k)`` steps (one exchange on 2 ranks) — while the bandwidth term above is the ring's (large
#: buffers, where the steps' latency is negligible); an all-to-all exchanges with each peer
def _log2(k: int) -> int:
    return math.ceil(math.log2(k)) if k > 1 else 0


_STEPS = {
    "all_reduce": _log2,
    "all_gather": _log2,
    "reduce_scatter": _log2,
    "all_to_all": lambda k: k - 1,
    "broadcast": _log2,
    "send_recv": lambda k: 1,
}
COLLECTIVES = tuple(_SENT)


def _kind(kind: str) -> str:
    if kind not in _SENT:
        raise ValueError(f"cost: unknown collective {kind!r}; known: {list(_SENT)}")
    return kind


def steps(kind: str, group_size: int) -> int:
    """Latency-bound steps of one ``kind`` collective over ``group_size`` ranks."""
    return _STEPS[_kind(kind)](group_size)


def sent(kind: str, group_size: int) -> float:
    """Bytes one rank sends per byte of its buffer in one ``kind`` collective."""
    return _SENT[_kind(kind)](group_size)


def collective(kind: str, group_size: int, nbytes: float, device: Union[str, Device] = "cpu",
               *, intra: bool = True, ranks_per_node: int = 1) -> float:
    """Seconds of one ``kind`` collective over ``group_size`` ranks moving a buffer of
    ``nbytes`` per rank (the output of an all-gather, the input of the others; a transfer:
    the busiest rank's bytes sent plus received). ``device``: a device kind (priced as the
    choice prices it, :func:`machine`), a device name or a :class:`Device`. ``intra=False``:
    the group spans nodes, ``ranks_per_node`` of it on each."""
    d = _resolve(device)
    if group_size <= 1 and kind != "send_recv":
        _kind(kind)
        return 0.0
    if intra:
        bandwidth, latency = d.intra_bandwidth, d.intra_latency
    else:  # the group's m ranks on a node cross the network over m NICs (NCCL's rings)
        bandwidth = min(d.intra_bandwidth, d.inter_bandwidth * max(1, ranks_per_node))
        latency = d.inter_latency
    return (d.call_overhead + steps(kind, group_size) * latency
            + sent(kind, group_size) * nbytes / bandwidth)


# ----------------------------------------------------------------------------- computation
def _rate(curve: tuple, x: float) -> float:
    """A measured ``(x, rate)`` curve at ``x``: linear in ``log x`` between its points, the
    end's rate beyond them."""
    if x <= curve[0][0]:
        return curve[0][1]
    hi = bisect.bisect_left(curve, (x,))
    if hi == len(curve):
        return curve[-1][1]
    (x0, y0), (x1, y1) = curve[hi - 1], curve[hi]
    return y0 + (y1 - y0) * (math.log(x / x0) / math.log(x1 / x0) if x0 > 0 else 1.0)


@functools.lru_cache(maxsize=64)
def _kernel_table(kernels: tuple) -> dict:
    return dict(kernels)


def compute(device: Union[str, Device], nbytes: float, flops: Optional[float] = None,
            itemsize: int = 4, op: str = "", ranks: int = 1) -> float:
    """Seconds of a kernel that touches ``nbytes`` of memory (inputs and outputs) and, when
    given, performs ``flops`` floating-point operations (the larger time counts), on
    ``itemsize``-byte elements (2: the half-precision peak; 8: the ``gemm_fp64`` curve where
    the table has one). ``op``: the op's name (its efficiency from the table's ``kernels``,
    if named there). ``ranks``: how many ranks of the machine compute at once (more than
    one: the table's ``contention`` slows the kernel)."""
    d = _resolve(device)
    seconds = nbytes / d.memory_bandwidth
    if flops:
        if itemsize <= 2:
            rate = d.peak_flops
        else:
            curve = d.gemm_fp64 if itemsize >= 8 and d.gemm_fp64 else d.gemm
            rate = _rate(curve, flops / max(nbytes, 1.0)) if curve else d.peak_flops_fp32
        seconds = max(seconds, flops / rate)
    efficiency = d.efficiency
    if op and d.kernels:
        efficiency = _kernel_table(d.kernels).get(op, efficiency)
    seconds /= efficiency
    return seconds * d.contention if ranks > 1 else seconds


def kernel_work(opdef, inputs: tuple, outputs: tuple, attrs: dict) -> tuple:
    """``(flops, bytes)`` of one kernel of ``opdef`` on its largest shard (the first rank of
    the mesh holds the largest part under the uneven rule), given its boxed ``inputs`` and its
    ``outputs`` (:class:`~ctensor.layout.Layout` s; None inputs are skipped): the op's declared
    FLOPs (``defop(..., flops=)``, matmul ``2 m n k``; 0 without), bytes read plus written."""
    first = outputs[0].placement.rank_list[0]
    nbytes = float(sum(l.local_nbytes(first) for l in inputs if l is not None) +
                   sum(l.local_nbytes(first) for l in outputs))
    flops = 0.0
    if opdef.flops is not None:
        flops = float(opdef.flops([l.local_shape(first) for l in inputs],
                                  [l.local_shape(first) for l in outputs], **attrs))
    return flops, nbytes


def kernel_seconds(opdef, inputs: tuple, outputs: tuple, attrs: dict,
                   device: Union[None, str, Device] = None, overhead: bool = True) -> float:
    """Seconds of one op given its boxed input and output layouts: its kernel's roofline
    (:func:`compute`; a view op computes nothing) plus, with ``overhead``, one dispatch
    (:func:`dispatch`). ``device``: default the outputs' placement's kind."""
    d = _resolve(outputs[0].placement.device if device is None else device)
    seconds = dispatch(d) if overhead else 0.0
    if getattr(opdef, "view", False):
        return seconds
    flops, nbytes = kernel_work(opdef, inputs, outputs, attrs)
    return seconds + compute(d, nbytes, flops, outputs[0].dtype.itemsize, opdef.name)


def dispatch(device: Union[str, Device], ops: float = 1) -> float:
    """Seconds ``ops`` dispatched ops cost beyond their kernels (``op_overhead`` each)."""
    return ops * _resolve(device).op_overhead


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
