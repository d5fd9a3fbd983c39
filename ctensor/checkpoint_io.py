"""The files of a checkpoint: checksummed ``.npy`` writes and reads, and the background
writer of asynchronous saves (``ct.save(..., async_op=True)``).

**Checksums.** Every file of a checkpoint carries a CRC-32 (``zlib.crc32``, IEEE polynomial)
of all its bytes, ``.npy`` header included: the metadata records each data file's, and the
``COMPLETE`` marker records the metadata's. CRC-32 detects every error of up to 32
consecutive bits and any other with probability 1 - 2**-32 — it guards against damage
(a flipped bit on a disk or in a copy), not against tampering. Why zlib's: it is in the
standard library (no new dependency) and runs at about 2.4 GB/s on one core here, faster
than the fsynced writes it guards (~0.3-0.6 GB/s here); xxhash's xxh3 measured 8.6 GB/s
and would cut the checksum's share of a warm load (about 45%), at the cost of a package.
The metadata and the marker name the checksum, so another can be added later.

**The background writer.** :class:`SaveHandle` owns one save of this process: the arrays it
writes (host copies taken in the call) and a thread that writes them and fsyncs them. The
thread does file I/O and checksums only — never a collective: the commit, which needs every
rank's checksums, runs on the calling thread in :meth:`SaveHandle.wait` (or at the next save
to the same path, or at interpreter exit). The pending handles are process state, like the
world: a list in start order, finished at exit (an error is printed, never lost silently).
"""
from __future__ import annotations

import atexit
import io
import os
import sys
import threading
import zlib
from typing import Callable, Optional

import numpy as np

from .arrays import is_host, to_host

__all__ = ["ChecksumError", "SaveHandle", "write_array", "write_text", "file_checksum",
           "read_into", "pending_saves", "free_staging_buffers"]

#: the checksum every version-2 checkpoint records, by this name
CHECKSUM = "crc32"
_CHUNK = 1 << 26  # bytes checksummed and written per call: each call is a GIL round trip


class ChecksumError(ValueError):
    """A checkpoint file's bytes do not match the checksum recorded when it was written:
    the file was damaged after the save (the message names the file and, for data, the
    tensor and the region it holds). Restore the file or load another checkpoint."""


def _crc_and_write(f, data: memoryview, crc: int) -> int:
    for start in range(0, len(data), _CHUNK):
        part = data[start:start + _CHUNK]
        crc = zlib.crc32(part, crc)  # both release the GIL for large buffers
        f.write(part)
    return crc


def write_array(path: str, arr: np.ndarray, sync: bool = True) -> int:
    """Write ``arr`` (a host array) as ``.npy`` at ``path`` through ``path.part`` and a
    rename; return the CRC-32 of the file's bytes. ``sync``: fsync before the rename (a
    checkpoint whose marker survives a power loss has its data too)."""
    arr = np.asarray(arr)
    if not arr.flags.c_contiguous:  # (np.ascontiguousarray would make a 0-d array 1-d)
        arr = arr.copy(order="C")
    header = io.BytesIO()
    fields = np.lib.format.header_data_from_array_1_0(arr)
    try:
        np.lib.format.write_array_header_1_0(header, fields)
    except ValueError:  # a header over 64 KiB (a very long structured dtype)
        header = io.BytesIO()
        np.lib.format.write_array_header_2_0(header, fields)
    data = memoryview(arr.reshape(-1).view(np.uint8)) if arr.size else memoryview(b"")
    part = path + ".part"
    with open(part, "wb") as f:
        crc = _crc_and_write(f, memoryview(header.getvalue()), 0)
        crc = _crc_and_write(f, data, crc)
        if sync:
            f.flush()
            os.fsync(f.fileno())
            _drop_cached(f.fileno())
    os.replace(part, path)
    return crc


def _drop_cached(fd: int) -> None:
    """Tell the kernel the pages just written are not read again soon (a checkpoint's
    data is read at the next start, if ever): the training process's memory keeps them
    from pushing it out of the page cache."""
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass


def write_text(path: str, text: str) -> int:
    """Write ``text`` (UTF-8) at ``path`` through a fsynced ``.part``; its CRC-32."""
    data = text.encode("utf-8")
    part = path + ".part"
    with open(part, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(part, path)
    return zlib.crc32(data)


def file_checksum(path: str) -> int:
    """CRC-32 of the bytes of the file at ``path`` (read in 64 MiB chunks)."""
    crc = 0
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb") as f:
        while True:
            n = f.readinto(buf)
            if not n:
                return crc
            crc = zlib.crc32(view[:n], crc)


def read_into(path: str, offset: int, out: np.ndarray) -> int:
    """Read a ``.npy`` file whose data starts at ``offset`` straight into ``out`` (C order,
    the file's shape and dtype); the CRC-32 of all the file's bytes, computed on the way
    (one pass: no memory map, no second read to verify)."""
    view = memoryview(out.reshape(-1).view(np.uint8)) if out.size else memoryview(b"")
    with open(path, "rb", buffering=0) as f:
        crc = zlib.crc32(f.read(offset))
        pos = 0
        while pos < len(view):
            n = f.readinto(view[pos:pos + _CHUNK])
            if not n:
                raise EOFError(f"{path} ends after {offset + pos} bytes")
            crc = zlib.crc32(view[pos:pos + n], crc)
            pos += n
        return zlib.crc32(f.read(), crc)  # bytes past the data, if any, count too


def sync_directory(path: str) -> None:
    """fsync a directory (its new entries survive a power loss); a no-op where the
    platform cannot open directories."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- staging
#: host buffers of finished asynchronous saves, by (shape, dtype), for the next save's
#: copies: a fresh buffer costs a page fault per 4 KiB (the copy then runs at a third of
#: memory speed), a reused one does not. At most one save's worth is kept.
_staging: dict = {}


def stage(arr) -> np.ndarray:
    """A host copy of ``arr`` (NumPy or CuPy) that nothing else refers to, in a reused
    buffer where one of its shape and dtype is free."""
    key = (tuple(arr.shape), np.dtype(arr.dtype).str)
    free = _staging.get(key)
    buf = free.pop() if free else np.empty(arr.shape, dtype=arr.dtype)
    if is_host(arr):
        np.copyto(buf, arr)
    else:  # a CuPy array: one device-to-host copy into the buffer
        try:
            arr.get(out=buf)
        except (TypeError, ValueError):  # a CuPy without get(out=), or a layout it refuses
            np.copyto(buf, to_host(arr))
    return buf


def unstage(buffers: list) -> None:
    """Give the buffers of a finished save back for the next one (replacing older ones)."""
    _staging.clear()
    for buf in buffers:
        _staging.setdefault((tuple(buf.shape), buf.dtype.str), []).append(buf)


def free_staging_buffers() -> None:
    """Let go of the host buffers kept for the next asynchronous save's copies."""
    _staging.clear()


# ----------------------------------------------------------------------------- writer
_pending: list["SaveHandle"] = []
_exit_hook_installed = False


def pending_saves() -> list:
    """The saves started with ``async_op=True`` that no ``wait()`` has finished yet, oldest
    first."""
    return list(_pending)


class SaveHandle:
    """One asynchronous ``ct.save`` (what ``ct.save(..., async_op=True)`` returns).

    * :meth:`wait` — collective, like the save: waits for this process's writes, then every
      rank commits together (rank 0 writes the metadata and the marker and renames the
      directory into place). Re-raises a failed write's error, on every rank. Call it on
      every rank (or let the next save to the same path, or the interpreter's exit, call it).
    * :meth:`done` — local: whether this process's writes are finished, so that ``wait()``
      has only the commit left (it may differ between ranks: never branch a collective on it).
    * :meth:`poll` — collective and never blocking on the disk: commits if every rank's
      writes are finished; whether the save is over (call it once per training step).

    >>> handle = ct.save(state, "ckpt/step-100", async_op=True)   # training goes on
    >>> ...
    >>> handle.wait()                                             # "ckpt/step-100" exists
    """

    def __init__(self, path: str, files: list, commit: Callable[[dict, Optional[BaseException]],
                                                                  None], background: bool,
                 all_ranks: Callable[[bool], bool] = bool, staged: bool = False):
        self.path = path
        self._staged = staged  # the arrays are staging buffers: reused once written
        self._all_ranks = all_ranks  # collective: whether a flag holds on every rank
        self._files = files  # [(file path, host array)]
        self._buffers: list = []
        self._commit = commit
        self._checksums: dict = {}
        self._write_error: Optional[BaseException] = None
        self._result: Optional[BaseException] = None
        self._finished = False
        self._thread: Optional[threading.Thread] = None
        if background:
            self._thread = threading.Thread(target=self._write, daemon=True,
                                            name=f"ctensor-save {os.path.basename(path)}")
            _pending.append(self)
            _install_exit_hook()
            self._thread.start()
        else:
            self._write()

    def _write(self) -> None:
        # not niced: a starved writer that asks for the GIL makes the training thread,
        # which must hand it over, wait for the writer to be scheduled (measured: worse)
        try:
            for name, arr in self._files:
                self._checksums[os.path.basename(name)] = write_array(name, arr)
        except BaseException as exc:  # noqa: BLE001 - re-raised by wait()
            self._write_error = exc
        finally:  # the host copies go (or serve the next save) once they are on disk
            self._buffers = [arr for _, arr in self._files] if self._staged else []
            self._files = []

    def done(self) -> bool:
        """Whether this process's writes are finished (local; see the class docstring)."""
        return self._finished or self._thread is None or not self._thread.is_alive()

    def poll(self) -> bool:
        """Collective: if every rank's writes are finished, commit (as :meth:`wait`, raising
        its error); whether the save is over. Costs one small exchange; never waits for a
        disk, so a training loop may call it every step to commit a save soon after its
        writes end."""
        if self._finished:
            self.wait()
            return True
        if self._all_ranks(self.done()):
            self.wait()
            return True
        return False

    def wait(self) -> None:
        """Finish the save (collective): this process's writes, then the commit on every
        rank. Raises the save's error (on every rank) if any rank's writes or the commit
        failed; a second call returns at once (or raises the same error)."""
        if not self._finished:
            if self._thread is not None:
                self._thread.join()
            if self._buffers:
                unstage(self._buffers)
                self._buffers = []
            self._finished = True
            if self in _pending:
                _pending.remove(self)
            try:
                self._commit(self._checksums, self._write_error)
            except BaseException as exc:  # noqa: BLE001 - kept for a second wait()
                self._result = exc
        if self._result is not None:
            raise self._result

    def __repr__(self) -> str:
        state = "committed" if self._finished and self._result is None else \
            "failed" if self._finished else "writing" if not self.done() else "written"
        return f"SaveHandle({self.path!r}, {state})"


def finish_pending(path: Optional[str] = None) -> None:
    """``wait()`` the pending saves (to ``path`` only, if given), oldest first."""
    for handle in [h for h in _pending if path is None or h.path == path]:
        handle.wait()


def _finish_at_exit() -> None:
    for handle in list(_pending):
        try:
            handle.wait()
        except BaseException as exc:  # noqa: BLE001 - reported, the exit goes on
            print(f"ctensor: the asynchronous save to {handle.path!r} failed at exit: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


def _install_exit_hook() -> None:
    # installed at the first asynchronous save, after the world (and under MPI its exit
    # handler): atexit runs last-registered first, so pending saves commit while the
    # communicator still works
    global _exit_hook_installed
    if not _exit_hook_installed:
        atexit.register(_finish_at_exit)
        _exit_hook_installed = True
