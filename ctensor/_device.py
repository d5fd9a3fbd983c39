"""CuPy and the GPU this process uses: the one place that imports CuPy (lazily).

Pure device handling, no communication and no other ctensor module: the array helpers and
the GPU communicators use it; :mod:`ctensor.cuda` is the public face. The GPU is chosen on
the first call of :func:`module`: under MPI the runtime first tells this module the
process's rank among those of its node (:func:`set_local_rank`), and the process takes GPU
``local_rank % device_count``; otherwise (one process, simulation) the current CuPy device,
which all simulated ranks share.
"""
from __future__ import annotations

import contextlib
import threading
import warnings
from typing import Callable, Optional

__all__ = ["import_cupy", "is_available", "device_count", "module", "current_device",
           "set_local_rank", "INSTALL", "check_later", "pending_checks", "raise_checks",
           "set_sync_debug_mode", "get_sync_debug_mode", "host_sync", "explicit", "SYNCS"]

INSTALL = ("pip install -e '.[gpu-cu13]' or '.[gpu-cu12]' (CuPy 14 and the NCCL runtime for "
           "your CUDA major version; nvidia-smi shows it), or any CuPy build matching your CUDA")

_cupy = None                   # set once CuPy works and this process's GPU is chosen
_device: Optional[int] = None
_local_rank: Optional[int] = None


def import_cupy():
    """The ``cupy`` module, or ``None`` when it cannot be imported."""
    try:
        import cupy
    except Exception:  # ImportError, or a broken install raising something else
        return None
    return cupy


def is_available() -> bool:
    """Whether CuPy imports and a CUDA GPU is visible."""
    if _cupy is not None:
        return True
    cupy = import_cupy()
    if cupy is None:
        return False
    try:
        return bool(cupy.is_available())
    except Exception:
        return False


def device_count() -> int:
    """Number of CUDA GPUs this process sees (0 without CuPy or without a GPU)."""
    cupy = import_cupy()
    if cupy is None:
        return 0
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # CUDARuntimeError: no driver, no device
        return 0


def set_local_rank(rank: int) -> None:
    """This process's rank among the processes of its node (set by the MPI runtime)."""
    global _local_rank
    _local_rank = int(rank)


def _fail(reason: str) -> RuntimeError:
    return RuntimeError(f"ct.placement('cuda', ...) {reason}")


def module():
    """CuPy, checked, with this process's GPU made current (chosen on the first call).

    Raises ``RuntimeError`` saying what to install when CuPy is missing, or that no GPU is
    visible.
    """
    global _cupy, _device
    if _cupy is not None:
        return _cupy
    cupy = import_cupy()
    if cupy is None:
        raise _fail(f"needs CuPy, which is not installed: {INSTALL}; or use "
                    f"ct.placement('cpu', ...)")
    try:
        visible = bool(cupy.is_available())
    except Exception:
        visible = False
    if not visible:
        raise _fail("needs a CUDA GPU, but no CUDA GPU is visible (cupy.is_available() is "
                    "False: check the NVIDIA driver and CUDA_VISIBLE_DEVICES); use "
                    "ct.placement('cpu', ...) on this machine")
    if _local_rank is not None:
        # one GPU per process of a node, round robin when ranks outnumber GPUs
        _device = _local_rank % int(cupy.cuda.runtime.getDeviceCount())
        cupy.cuda.Device(_device).use()
    else:
        _device = int(cupy.cuda.Device().id)
    _cupy = cupy
    if _mode == "error":  # set before CuPy was first used: CuPy's own guard now
        _cupy_guard(True)
    return cupy


def current_device() -> int:
    """The GPU index this process uses for ``cuda`` placements (chooses it if needed)."""
    module()
    return int(_device)


# ----------------------------------------------------------------------------- deferred checks
# A check of device data (ids in range, targets valid) must not stop the GPU pipeline to read
# one flag: the kernel records ``(bad, low, high)`` as device values here, merged per check
# (no host read), and the next explicit transfer (``Tensor.numpy()``, ``.item()``, a
# checkpoint save) reads them with its own data, in one copy, and raises the first failed
# check's ``ValueError``.
_checks: dict = {}   # key -> [xp, bad (0-d bool), low (0-d int64), high (0-d int64), message]


def check_later(xp, key, bad, low, high, message: Callable, error: type = ValueError) -> None:
    """Record a device-side check: ``bad`` (0-d bool) says it failed, ``low``/``high`` (0-d
    integers) are the values its message names (``message(low, high)`` is the error text).
    Checks of one ``key`` merge on the device (or of the flags, min of the lows, max of the
    highs), so a loop of steps keeps one entry per check. ``error`` is the exception type
    raised (a ``ValueError`` subclass)."""
    entry = _checks.get(key)
    bad, low, high = bad.reshape(()), low.astype("int64").reshape(()), \
        high.astype("int64").reshape(())
    if entry is None:
        _checks[key] = [xp, bad, low, high, (message, error)]
    else:
        entry[1] = entry[1] | bad
        entry[2] = xp.minimum(entry[2], low)
        entry[3] = xp.maximum(entry[3], high)


def pending_checks():
    """``(xp, flat int64 device array)`` of the recorded checks (3 values each), cleared, or
    ``None``; :func:`raise_checks` reads the host copy."""
    if not _checks:
        return None
    entries = list(_checks.values())
    _checks.clear()
    xp = entries[0][0]
    flat = xp.stack([v for e in entries for v in (e[1].astype("int64"), e[2], e[3])])
    return xp, flat, [e[4] for e in entries]


def raise_checks(values, messages) -> None:
    """``ValueError`` of the first failed check (``values``: the host copy, 3 per check)."""
    for i, (message, error) in enumerate(messages):
        if values[3 * i]:
            raise error(message(int(values[3 * i + 1]), int(values[3 * i + 2])))


# ----------------------------------------------------------------------------- sync debugging
#: device->host copies ctensor made in this process: {"explicit": n, "implicit": n}
SYNCS = {"explicit": 0, "implicit": 0}
_mode = "default"
_explicit = threading.local()
_MODES = ("default", "warn", "error")


def set_sync_debug_mode(mode: str) -> None:
    """What ctensor does at an implicit device->host synchronisation (one not asked for by
    ``numpy()``, ``item()``, ``tolist()``, a print or a checkpoint save), like PyTorch's
    ``torch.cuda.set_sync_debug_mode``: ``"default"`` nothing, ``"warn"`` a
    ``RuntimeWarning``, ``"error"`` a ``RuntimeError``. On a real GPU ``"error"`` also turns
    on CuPy's own guard (``cupyx.allow_synchronize(False)``), so a synchronisation inside
    CuPy (``int(array)``, ``bool(array)``) raises too."""
    global _mode
    if mode not in _MODES:
        raise ValueError(f"set_sync_debug_mode: mode must be one of {_MODES}, got {mode!r}")
    _mode = mode
    _cupy_guard(mode == "error")


def get_sync_debug_mode() -> str:
    """The mode :func:`set_sync_debug_mode` set (``"default"`` at start)."""
    return _mode


_guard = None


def _cupy_guard(on: bool) -> None:
    global _guard
    if _cupy is None or not hasattr(_cupy, "cuda"):
        return
    try:
        import cupyx
    except Exception:
        return
    if on and _guard is None and hasattr(cupyx, "allow_synchronize"):
        _guard = cupyx.allow_synchronize(False)
        _guard.__enter__()
    elif not on and _guard is not None:
        _guard.__exit__(None, None, None)
        _guard = None


@contextlib.contextmanager
def implicit():
    """The copies inside are a library op's own (``nonzero``'s count, ``bernoulli``'s check
    of ``p``), even where they go through ``Tensor.item()``: :func:`host_sync` treats them
    as implicit."""
    depth = getattr(_explicit, "forced", 0)
    _explicit.forced = depth + 1
    try:
        yield
    finally:
        _explicit.forced = depth


def _is_explicit() -> bool:
    return bool(getattr(_explicit, "depth", 0)) and not getattr(_explicit, "forced", 0)


@contextlib.contextmanager
def explicit():
    """The device->host copies inside are ones the user asked for (allowed in every mode)."""
    depth = getattr(_explicit, "depth", 0)
    _explicit.depth = depth + 1
    try:
        if _guard is not None and not getattr(_explicit, "forced", 0):
            import cupyx
            with cupyx.allow_synchronize(True):
                yield
        else:
            yield
    finally:
        _explicit.depth = depth


def host_sync(what: str) -> None:
    """Called at every device->host copy ctensor makes: counted, and an implicit one (outside
    :func:`explicit`) warns or raises as :func:`set_sync_debug_mode` says."""
    if _is_explicit():
        SYNCS["explicit"] += 1
        return
    SYNCS["implicit"] += 1
    if _mode == "default":
        return
    text = (f"ctensor: {what} synchronises the host with the GPU (a device->host copy) "
            f"outside an explicit transfer (ct.debug.set_sync_debug_mode({_mode!r}))")
    if _mode == "error":
        raise RuntimeError(text)
    warnings.warn(text, RuntimeWarning, stacklevel=3)
