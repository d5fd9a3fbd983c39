"""Strict device mode: a CuPy stand-in on CPU that refuses every implicit device->host transfer.

``install(monkeypatch)`` makes it this process's "CuPy" (``ctensor._device``), so ``cuda``
placements in simulation hold :class:`StrictArray` shards. It behaves like CuPy where CuPy
differs from NumPy, and stricter where a real GPU would stall:

* ``__array__``, ``__bool__``, ``__int__``, ``__float__``, ``__index__``, ``.item()``,
  ``.tolist()``, ``.tobytes()`` and NumPy functions or ufuncs applied to a device array raise
  :class:`HostSyncError` (a real GPU would copy to the host and stall the pipeline, or, for
  ``np.asarray``, CuPy raises too). So do data-dependent output shapes (boolean-mask
  indexing, ``nonzero``, ``unique``, ``argwhere``, ``compress``, ``extract``, one-argument
  ``where``): CuPy must read the count on the host.
* Reductions give 0-d device arrays, never host scalars (as CuPy); a host ``np.ndarray``
  mixed into a device operation is a ``TypeError`` (as CuPy); host scalars are fine.
* Explicit transfers are allowed and counted in :data:`COUNTS`: ``.get()``,
  ``asnumpy()`` (device->host, ``"d2h"``) and ``asarray(host)`` (``"h2d"``). Every refusal
  is counted too (``"refused"``), so a test notices a refusal somebody swallowed.
* Streams and events (``cuda.Stream``, ``cuda.Event``, ``get_current_stream``): every
  buffer remembers the stream and position of its last write; reading it on another stream
  before that stream waited for an event recorded after the write raises
  :class:`OrderingError`. A host synchronisation (``Stream.synchronize``,
  ``Event.synchronize``, ``runtime.deviceSynchronize``) orders everything before it and is
  counted as ``"sync"``. Work can be enqueued on a stream (:func:`enqueue`): it runs when
  the stream is synchronised or waited on, as a GPU completes it asynchronously.
"""
from __future__ import annotations

import collections
import contextlib
import math
import threading
import types
import weakref

import numpy as np

__all__ = ["StrictArray", "HostSyncError", "OrderingError", "COUNTS", "module", "install",
           "counting", "enqueue", "mark_written", "check_read_ptr"]


class HostSyncError(RuntimeError):
    """An implicit device->host transfer (a host synchronisation) in strict device mode."""


class OrderingError(RuntimeError):
    """A buffer read on a stream before the event that produced it."""


COUNTS: collections.Counter = collections.Counter()
_LOCK = threading.RLock()
#: data-dependent output shapes: CuPy reads a count on the host
_DATA_SHAPED = {"nonzero", "flatnonzero", "argwhere", "unique", "compress", "extract",
                "unique_values", "unique_counts", "unique_inverse", "unique_all", "trim_zeros"}
_TRANSFER = {"asarray", "array", "ascontiguousarray", "asanyarray", "asnumpy"}


def _refuse(what: str) -> HostSyncError:
    COUNTS["refused"] += 1
    return HostSyncError(f"strict device mode: {what} is an implicit device->host transfer "
                         f"(a host synchronisation on a GPU); keep the value on the device, "
                         f"or transfer explicitly with .get() / .numpy() / .item()")


# ----------------------------------------------------------------------------- streams
class Stream:
    """A CUDA stream: a position (clock) and what it has waited for (other streams' clocks)."""

    _next = [1]

    def __init__(self, null: bool = False, non_blocking: bool = False, ptr: int = 0):
        with _LOCK:
            self.ptr = 0 if null else self._next[0]
            if not null:
                self._next[0] += 1
        self.clock = 0
        self.seen: dict = {}
        self.queue: collections.deque = collections.deque()
        _STREAMS[self.ptr] = self

    def __enter__(self):
        _stack().append(self)
        return self

    def __exit__(self, *exc):
        _stack().pop()

    def tick(self) -> tuple:
        self.clock += 1
        return self.ptr, self.clock

    def knows(self, stamp) -> bool:
        sid, t = stamp
        return sid == self.ptr or self.seen.get(sid, 0) >= t or _HOST_SEEN.get(sid, 0) >= t

    def run(self) -> None:
        """Complete the work enqueued on this stream (what the GPU does on its own)."""
        while self.queue:
            fn = self.queue.popleft()
            with self:
                fn()

    def wait_event(self, event) -> None:
        for sid, t in event.snapshot.items():
            _STREAMS[sid].run()
            self.seen[sid] = max(self.seen.get(sid, 0), t)

    def synchronize(self) -> None:
        COUNTS["sync"] += 1
        self.run()
        _HOST_SEEN[self.ptr] = max(_HOST_SEEN.get(self.ptr, 0), self.clock)

    def record(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    @property
    def done(self) -> bool:
        return not self.queue


class Event:
    """A CUDA event: what a stream had done when it was recorded."""

    def __init__(self, disable_timing: bool = False, **_):
        self.snapshot: dict = {}
        self.stream = None

    def record(self, stream=None) -> None:
        stream = stream or current_stream()
        self.stream = stream
        self.snapshot = dict(stream.seen)
        self.snapshot[stream.ptr] = stream.clock

    @property
    def done(self) -> bool:
        return self.stream is None or not self.stream.queue

    def synchronize(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()


_STREAMS: dict = {}
_HOST_SEEN: dict = {}
_NULL = Stream(null=True)
_TLS = threading.local()


def _stack() -> list:
    if not hasattr(_TLS, "stack"):
        _TLS.stack = [_NULL]
    return _TLS.stack


def current_stream() -> Stream:
    return _stack()[-1]


def enqueue(stream: Stream, fn) -> None:
    """Run ``fn`` on ``stream`` later (when it is synchronised or waited on)."""
    stream.queue.append(fn)


def _device_synchronize() -> None:
    COUNTS["sync"] += 1
    for s in list(_STREAMS.values()):
        s.run()
        _HOST_SEEN[s.ptr] = max(_HOST_SEEN.get(s.ptr, 0), s.clock)


# ----------------------------------------------------------------------------- buffers
_STAMPS: dict = {}   # id of a root buffer -> (weakref to it, (stream, clock) of its last write)
_BY_PTR: dict = {}   # address of a root buffer -> (nbytes, weakref to it)


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _stamp_root(root: np.ndarray, stamp: tuple) -> None:
    key = id(root)
    entry = _STAMPS.get(key)
    if entry is None or entry[0]() is not root:
        ref = weakref.ref(root, lambda _, k=key: _STAMPS.pop(k, None))
    else:
        ref = entry[0]
    _STAMPS[key] = (ref, stamp)


def _stamp_of(root: np.ndarray):
    entry = _STAMPS.get(id(root))
    return entry[1] if entry is not None and entry[0]() is root else None


def _stamp_write(a: np.ndarray, stream: Stream = None) -> None:
    _stamp_root(_root(a), (stream or current_stream()).tick())


def _check_read(a: np.ndarray) -> None:
    stamp = _stamp_of(_root(a))
    stream = current_stream()
    if stamp is not None and not stream.knows(stamp):
        raise OrderingError(f"strict device mode: a buffer written on stream {stamp[0]} is "
                            f"read on stream {stream.ptr} before it waited for an event "
                            f"recorded after that write")


def mark_written(ptr: int, stream_ptr: int) -> None:
    """A buffer (by device address) is written by work on stream ``stream_ptr``."""
    for addr, (n, ref) in list(_BY_PTR.items()):
        root = ref()
        if root is None:
            del _BY_PTR[addr]
        elif addr <= ptr < addr + max(n, 1):
            _stamp_root(root, _STREAMS[stream_ptr].tick())
            return


def check_read_ptr(ptr: int, stream_ptr: int) -> None:
    """A buffer (by device address) is read by work on stream ``stream_ptr``: it must have
    been written on that stream or before an event that stream waited for."""
    for addr, (n, ref) in list(_BY_PTR.items()):
        root = ref()
        if root is not None and addr <= ptr < addr + max(n, 1):
            stamp = _stamp_of(root)
            if stamp is not None and not _STREAMS[stream_ptr].knows(stamp):
                raise OrderingError(f"strict device mode: a buffer written on stream "
                                    f"{stamp[0]} is read by work on stream {stream_ptr} "
                                    f"before it waited for an event recorded after that write")
            return


class _Data:
    def __init__(self, arr: np.ndarray):
        root = _root(arr)
        _BY_PTR[root.ctypes.data] = (root.nbytes, weakref.ref(root))
        self.ptr = arr.ctypes.data


def _wrap(x):
    if isinstance(x, np.ndarray):
        out = StrictArray.__new__(StrictArray)
        out._a = x
        if _stamp_of(_root(x)) is None:  # new memory: written now, on the current stream
            _stamp_write(x)
        return out
    if isinstance(x, np.generic):  # CuPy's reductions give 0-d arrays, not scalars
        return _wrap(np.asarray(x))
    if isinstance(x, tuple):
        return tuple(_wrap(v) for v in x)
    if isinstance(x, list):
        return [_wrap(v) for v in x]
    return x


def _unwrap(x, where: str):
    if isinstance(x, StrictArray):
        _check_read(x._a)
        return x._a
    if isinstance(x, np.ndarray):
        raise TypeError(f"strict device mode: {where} got a host numpy.ndarray mixed with "
                        f"device arrays (CuPy: 'Unsupported type'); move it with "
                        f"xp.asarray first")
    if isinstance(x, (tuple, list)):
        return type(x)(_unwrap(v, where) for v in x)
    return x


def _index(key):
    """An index for a device array: host integer arrays are fine (CuPy copies them up),
    boolean masks are a data-dependent shape."""
    parts = key if isinstance(key, tuple) else (key,)
    for k in parts:
        arr = k._a if isinstance(k, StrictArray) else k
        if isinstance(arr, np.ndarray) and arr.dtype == np.bool_ and arr.ndim > 0:
            raise _refuse("boolean-mask indexing (a data-dependent output shape)")
    out = tuple(_unwrap(k, "indexing") if isinstance(k, StrictArray) else k for k in parts)
    return out if isinstance(key, tuple) else out[0]


# ----------------------------------------------------------------------------- the array
class StrictArray:
    """A device array: a NumPy array behind CuPy's surface, refusing implicit host reads."""

    __slots__ = ("_a", "__weakref__")
    __array_priority__ = 1000

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):  # np.exp(dev), host + dev
        raise _refuse(f"numpy.{ufunc.__name__} on a device array")

    def __array_function__(self, func, types_, args, kwargs):
        raise _refuse(f"numpy.{func.__name__} on a device array")

    def __array__(self, *args, **kwargs):
        raise _refuse("numpy.asarray(device array)")

    def __bool__(self):
        raise _refuse("bool(device array)")

    def __int__(self):
        raise _refuse("int(device array)")

    def __float__(self):
        raise _refuse("float(device array)")

    def __complex__(self):
        raise _refuse("complex(device array)")

    def __index__(self):
        raise _refuse("a device array used as a Python index")

    def item(self, *args):
        raise _refuse(".item() of a device array")

    def tolist(self):
        raise _refuse(".tolist() of a device array")

    def tobytes(self, *args, **kwargs):
        raise _refuse(".tobytes() of a device array")

    def __repr__(self):  # no data: printing it would be a transfer
        return f"StrictArray(shape={self._a.shape}, dtype={self._a.dtype})"

    __str__ = __repr__
    __hash__ = None

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        for i in range(len(self._a)):
            yield self[i]

    # explicit transfer
    def get(self, stream=None, order="C", out=None, **_):
        _check_read(self._a)
        if not _SYNC_ALLOWED[0]:
            raise _refuse(".get() inside cupyx.allow_synchronize(False)")
        COUNTS["d2h"] += 1
        if out is not None:
            np.copyto(out, self._a)
            return out
        return np.array(self._a, order=order)

    @property
    def data(self):
        return _Data(self._a)

    @property
    def device(self):
        return _DEVICE

    def __getitem__(self, key):
        _check_read(self._a)
        return _wrap(self._a[_index(key)])

    def __setitem__(self, key, value):
        _check_read(self._a)
        value = value._a if isinstance(value, StrictArray) else value
        self._a[_index(key)] = value
        _stamp_write(self._a)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        attr = getattr(self._a, name)
        if not callable(attr):
            return _wrap(attr)

        def method(*args, **kwargs):
            _check_read(self._a)
            if name in ("sort", "argsort") and kwargs.get("kind") is None:
                kwargs["kind"] = "stable"  # as CuPy
            args = _unwrap(args, f".{name}()")
            kwargs = {k: _unwrap(v, f".{name}()") for k, v in kwargs.items()}
            out = _wrap(attr(*args, **kwargs))
            if name in ("fill", "sort", "partition", "put", "resize", "setflags") \
                    or kwargs.get("out") is not None:
                _stamp_write(self._a)
            return out

        return method


def _binary(name):
    def op(self, other):
        _check_read(self._a)
        out = getattr(self._a, name)(_unwrap(other, f"operator {name}"))
        if out is NotImplemented:
            return out
        if name.startswith("__i"):
            _stamp_write(self._a)
            return self
        return _wrap(out)
    op.__name__ = name
    return op


def _unary(name):
    def op(self):
        _check_read(self._a)
        return _wrap(getattr(self._a, name)())
    op.__name__ = name
    return op


for _n in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or",
           "xor", "lshift", "rshift"):
    for _f in (f"__{_n}__", f"__r{_n}__", f"__i{_n}__"):
        setattr(StrictArray, _f, _binary(_f))
for _f in ("__lt__", "__le__", "__eq__", "__ne__", "__gt__", "__ge__", "__divmod__"):
    setattr(StrictArray, _f, _binary(_f))
for _f in ("__neg__", "__pos__", "__abs__", "__invert__"):
    setattr(StrictArray, _f, _unary(_f))


# ----------------------------------------------------------------------------- the module
class _Fn:
    """A NumPy function or ufunc behind CuPy's surface (device arrays in and out)."""

    def __init__(self, fn, name: str):
        self._fn, self._name = fn, name

    def __call__(self, *args, **kwargs):
        if self._name in _DATA_SHAPED or (self._name == "where" and len(args) == 1):
            raise _refuse(f"xp.{self._name} (a data-dependent output shape)")
        if self._name in ("sort", "argsort") and kwargs.get("kind") is None:
            kwargs["kind"] = "stable"  # CuPy's sorts are stable (NumPy's default is not)
        out_arg = kwargs.get("out")
        args = _unwrap(args, f"xp.{self._name}")
        kwargs = {k: _unwrap(v, f"xp.{self._name}") for k, v in kwargs.items()}
        out = self._fn(*args, **kwargs)
        if self._name.endswith(".at"):
            _stamp_write(args[0])
        if out_arg is not None:
            _stamp_write(out_arg._a)
            return out_arg
        return _wrap(out)

    def __getattr__(self, name):
        attr = getattr(self._fn, name)
        return _Fn(attr, f"{self._name}.{name}") if callable(attr) else attr


def _asarray(a, dtype=None, order=None, **_):
    if isinstance(a, StrictArray):
        if dtype is None or np.dtype(dtype) == a._a.dtype:
            return a
        return a.astype(dtype)
    if isinstance(a, (list, tuple)) and any(isinstance(v, StrictArray) for v in a):
        raise _refuse("xp.asarray of a list holding device arrays")
    COUNTS["h2d"] += 1
    return _wrap(np.array(a, dtype=dtype, order=order or "K"))


def _ascontiguousarray(a, dtype=None, **_):
    out = _asarray(a, dtype)
    return out if out._a.flags.c_contiguous else out.copy(order="C")


def _asnumpy(a, stream=None, **_):
    if isinstance(a, StrictArray):
        return a.get()
    return np.asarray(a)


class _Device:
    id = 0
    pci_bus_id = "0000:00:00.0"

    def use(self):
        pass

    def synchronize(self):
        _device_synchronize()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


_DEVICE = _Device()


class _ElementwiseKernel:
    """CuPy's ``ElementwiseKernel`` for the kernels ctensor compiles (the Philox fills of
    ``ctensor/_philox.py``): computed with ctensor's NumPy reference, so the CuPy path's index
    arithmetic is checked against the NumPy bits."""

    def __init__(self, in_params, out_params, operation, name, **_):
        if not name.startswith("ctensor_philox_"):
            raise NotImplementedError(f"strict device mode: no stand-in for kernel {name!r}")
        self.name = name

    def __call__(self, idx, k0, k1, c2, c3, low, span, out):
        from ctensor import _philox, random as ct_random
        kind = _philox.Kind[self.name.rsplit("_", 1)[1].upper()]
        flat = _unwrap(idx, "kernel").reshape(-1).astype(np.int64)
        n = int(flat.max()) + 1 if flat.size else 0
        key = (int(k0) | int(k1) << 32, int(c2) | int(c3) << 32)
        values = ct_random._numpy_region(kind, (n,), ((0, n),), out._a.dtype, key, int(low),
                                         int(span))
        out._a[...] = values.reshape(-1)[flat].reshape(out._a.shape)
        _stamp_write(out._a)
        return out


class _Module(types.ModuleType):
    def __getattr__(self, name):
        attr = getattr(np, name)
        if isinstance(attr, types.ModuleType):
            return _sub(name)
        if callable(attr) and not isinstance(attr, type):
            return _Fn(attr, name)
        return attr


class _SubModule(_Module):
    def __getattr__(self, name):
        attr = getattr(self.__dict__["_np"], name)
        return _Fn(attr, name) if callable(attr) and not isinstance(attr, type) else attr


def _build() -> _Module:
    mod = _Module("cupy_strict")
    mod.__dict__.update(
        ndarray=StrictArray, asarray=_asarray, array=_asarray, asanyarray=_asarray,
        ascontiguousarray=_ascontiguousarray,
        asnumpy=_asnumpy, is_available=lambda: True, ElementwiseKernel=_ElementwiseKernel,
        get_array_module=lambda *a: mod,
        cuda=types.SimpleNamespace(
            Stream=Stream, Event=Event, get_current_stream=current_stream,
            Device=lambda i=0: _DEVICE,
            runtime=types.SimpleNamespace(getDeviceCount=lambda: 1,
                                          deviceSynchronize=_device_synchronize)))
    return mod


StrictArray.__module__ = "cupy_strict"  # ctensor.arrays.is_host tells device arrays by this
module = _build()


def _sub(name):
    sub = _SubModule(f"cupy_strict.{name}")
    sub.__dict__["_np"] = getattr(np, name)
    return sub


for _name in ("linalg", "fft", "random"):
    setattr(module, _name, _sub(_name))


def _erf(x):
    a = _unwrap(x, "cupyx.scipy.special.erf")
    return _wrap(np.vectorize(math.erf, otypes=[a.dtype])(a) if a.size else a.copy())


_SYNC_ALLOWED = [True]


@contextlib.contextmanager
def _allow_synchronize(allow: bool):
    """``cupyx.allow_synchronize``: while False, even an explicit ``.get()`` raises."""
    before, _SYNC_ALLOWED[0] = _SYNC_ALLOWED[0], bool(allow)
    try:
        yield
    finally:
        _SYNC_ALLOWED[0] = before


def _cupyx() -> dict:
    root = types.ModuleType("cupyx")
    root.allow_synchronize = _allow_synchronize
    scipy = types.ModuleType("cupyx.scipy")
    special = types.ModuleType("cupyx.scipy.special")
    special.erf = _erf
    root.scipy, scipy.special = scipy, special
    return {"cupyx": root, "cupyx.scipy": scipy, "cupyx.scipy.special": special}


def install(monkeypatch) -> types.ModuleType:
    """Make the strict module this process's CuPy (``ctensor._device``) for one test, with
    the ``cupyx`` parts ctensor uses (``scipy.special.erf``, ``allow_synchronize``)."""
    import sys
    from ctensor import _device
    monkeypatch.setattr(_device, "_cupy", module)
    monkeypatch.setattr(_device, "_device", 0)
    for name, mod in _cupyx().items():
        monkeypatch.setitem(sys.modules, name, mod)
    COUNTS.clear()
    return module


@contextlib.contextmanager
def counting():
    """``COUNTS`` for the block alone (a fresh Counter yielded, filled on exit)."""
    before = COUNTS.copy()
    got: collections.Counter = collections.Counter()
    try:
        yield got
    finally:
        got.update(COUNTS - before)
