"""The files of a checkpoint: checksummed ``.npy`` writes and reads, and the background
writer of asynchronous saves (``ct.save(..., async_op=True)``).

**Checksums.** Every data file of a checkpoint carries a checksum of all its bytes,
``.npy`` header included, recorded in the metadata under the name the metadata gives
(``"checksum"``): XXH3-64 (the ``xxhash`` package) since this version, CRC-32 (``zlib``,
IEEE polynomial) in earlier version-2 checkpoints, which still load and verify. The
``COMPLETE`` marker records the CRC-32 of the metadata. Both guard against damage (a flipped
bit on a disk or in a copy), not against tampering. Why XXH3: 11 GB/s on one core here
against zlib's CRC-32 at 3.6 GB/s, and the checksum is most of the CPU an asynchronous
save's writer spends (with direct I/O, below), so of what it takes from training.

**Direct I/O.** A synced data file of 1 MiB or more is written with ``O_DIRECT`` where the
file system allows it: no kernel copy of the bytes into the page cache and no dirty pages
to flush (measured here: writing 256 MiB through the page cache costs 0.46 s of CPU, the
direct write 0.005 s). The header is padded to a page so that the data starts on one; the
staging buffers of asynchronous saves are page-aligned (no bounce copy); other arrays go
through a page-aligned bounce buffer, one chunk at a time. A file system that refuses
(tmpfs, some overlays) gets the page-cache write, and ``CTENSOR_DIRECT_IO=0`` turns direct
I/O off.

**The background writer.** :class:`SaveHandle` owns one save of this process: the arrays it
writes (host copies taken in the call) and a thread that writes them and fsyncs them. Every
collective of a save runs on the calling thread, in :meth:`SaveHandle.poll` or
:meth:`SaveHandle.wait` (or at the next save to the same path, or at interpreter exit),
ordered with the rank's other collectives: one small exchange each, which hands every rank
the same notes. Once every rank's notes say "written" (with its checksums), rank 0 starts a
second thread for the commit's file work (the metadata and the marker, written and fsynced,
the renames, the directory's fsync, removing the replaced checkpoint), and a later exchange
tells every rank how it ended. The threads do file I/O and checksums only: removing a
replaced 537 MB checkpoint alone took 0.1 s of wall time here (0.003 s of CPU), which the
calling thread used to wait for. The pending handles are process state, like the world: a
list in start order, finished at exit (an error is printed, never lost silently).
"""
from __future__ import annotations

import atexit
import io
import os
import sys
import threading
import zlib

import xxhash
from typing import Callable, Optional, Protocol

import numpy as np

from . import _device
from .arrays import is_host, to_host

__all__ = ["ChecksumError", "SaveHandle", "write_array", "write_text", "file_checksum",
           "read_into", "aligned_empty", "pending_saves", "free_staging_buffers"]

#: the checksum new checkpoints record for their data files, by this name
CHECKSUM = "xxh3_64"
#: the checksums this version verifies
CHECKSUMS = ("xxh3_64", "crc32")
_CHUNK = 1 << 26  # bytes checksummed and written per call: each call is a GIL round trip


class ChecksumError(ValueError):
    """A checkpoint file's bytes do not match the checksum recorded when it was written:
    the file was damaged after the save (the message names the file and, for data, the
    tensor and the region it holds). Restore the file or load another checkpoint."""


class Digest:
    """A checksum computed over bytes fed in parts: ``"xxh3_64"`` or ``"crc32"``."""

    def __init__(self, name: Optional[str] = None):
        name = name or CHECKSUM
        if name not in CHECKSUMS:
            raise ValueError(f"checksum {name!r} is not one this ctensor knows "
                             f"({', '.join(CHECKSUMS)})")
        self.name = name
        self._crc = 0
        self._xxh = xxhash.xxh3_64() if name == "xxh3_64" else None

    def update(self, data) -> None:
        if self._xxh is not None:
            self._xxh.update(data)
        else:
            self._crc = zlib.crc32(data, self._crc)

    def value(self) -> int:
        return self._xxh.intdigest() if self._xxh is not None else self._crc


def checksum_text(value: int, name: Optional[str] = None) -> str:
    """A checksum as the hex digits its width gives (8 for CRC-32, 16 for XXH3-64)."""
    return f"{value:0{16 if (name or CHECKSUM) == 'xxh3_64' else 8}x}"


def _hash_and_write(f, data: memoryview, digest: Digest) -> None:
    for start in range(0, len(data), _CHUNK):
        part = data[start:start + _CHUNK]
        digest.update(part)  # both release the GIL for large buffers
        f.write(part)


# ----------------------------------------------------------------------------- direct I/O
#: the alignment direct I/O asks of buffers, file offsets and lengths (a page: every
#: logical block size of Linux file systems divides it)
_BLOCK = 4096
#: files below this size are written through the page cache (direct I/O's setup and its
#: padded last block are not worth it)
_DIRECT_MIN = 1 << 20
_O_DIRECT = getattr(os, "O_DIRECT", 0)
#: False once a file system refused direct I/O in this process (tmpfs, some overlays)
_direct_ok = [bool(_O_DIRECT) and sys.platform.startswith("linux")
              and os.environ.get("CTENSOR_DIRECT_IO", "1") != "0"]


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialised C-order array whose data starts on a page boundary (what direct
    I/O reads into and writes from without a bounce copy)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + _BLOCK, dtype=np.uint8)
    start = (-raw.ctypes.data) % _BLOCK
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def _npy_header(arr: np.ndarray) -> bytes:
    """The ``.npy`` header of ``arr``; for an array of :data:`_DIRECT_MIN` bytes or more,
    padded with spaces to a multiple of :data:`_BLOCK` bytes, so that the data of the file
    starts on a block boundary (``np.load`` reads it as any other header; the format allows
    padding)."""
    buf = io.BytesIO()
    fields = np.lib.format.header_data_from_array_1_0(arr)
    try:
        np.lib.format.write_array_header_1_0(buf, fields)
        width = 2
    except ValueError:  # a header over 64 KiB (a very long structured dtype)
        buf = io.BytesIO()
        np.lib.format.write_array_header_2_0(buf, fields)
        width = 4
    header = buf.getvalue()
    pad = (-len(header)) % _BLOCK
    if pad and arr.nbytes >= _DIRECT_MIN and (width == 4 or len(header) + pad - 10 < 65536):
        text = header[8 + width:-1] + b" " * pad + b"\n"
        header = header[:8] + len(text).to_bytes(width, "little") + text
    return header


def _direct_write(part: str, header: bytes, data: memoryview) -> Optional[int]:
    """Write ``header`` + ``data`` to ``part`` with ``O_DIRECT`` (the page cache is
    skipped: no kernel copy of the bytes, no dirty pages to flush, and the process's cached
    files stay cached) and fsync it; the checksum of the bytes. ``None`` where the file
    system refuses direct I/O (the caller writes through the page cache instead). A buffer
    not on a page boundary goes through a page-aligned bounce buffer, one chunk at a time;
    the last partial block is padded, then the file truncated to its size."""
    try:
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_DIRECT, 0o644)
    except OSError:
        _direct_ok[0] = False
        return None
    try:
        head = aligned_empty(len(header), np.uint8)
        head[:] = np.frombuffer(header, dtype=np.uint8)
        _write_all(fd, memoryview(head))
        digest = Digest()
        digest.update(header)
        full = len(data) - len(data) % _BLOCK
        base = np.frombuffer(data, dtype=np.uint8) if len(data) else np.empty(0, np.uint8)
        bounce = None if base.ctypes.data % _BLOCK == 0 else aligned_empty(
            min(_CHUNK, max(full, _BLOCK)), np.uint8)
        for start in range(0, full, _CHUNK):
            part_view = data[start:min(start + _CHUNK, full)]
            digest.update(part_view)
            if bounce is None:
                _write_all(fd, part_view)
            else:
                n = len(part_view)
                bounce[:n] = base[start:start + n]
                _write_all(fd, memoryview(bounce[:n]))
        tail = len(data) - full
        if tail:
            last = aligned_empty(_BLOCK, np.uint8)
            last[:tail] = base[full:]
            last[tail:] = 0
            digest.update(data[full:])
            _write_all(fd, memoryview(last))
            os.ftruncate(fd, len(header) + len(data))
        os.fsync(fd)
        return digest.value()
    except OSError as exc:
        import errno
        if exc.errno != errno.EINVAL:
            raise
        _direct_ok[0] = False  # a file system that opens with O_DIRECT but refuses writes
        return None
    finally:
        os.close(fd)


def _write_all(fd: int, view: memoryview) -> None:
    while len(view):
        n = os.write(fd, view)
        view = view[n:]


def write_array(path: str, arr: np.ndarray, sync: bool = True) -> int:
    """Write ``arr`` (a host array) as ``.npy`` at ``path`` through ``path.part`` and a
    rename; return the checksum (:data:`CHECKSUM`) of the file's bytes. ``sync``: fsync
    before the rename (a checkpoint whose marker survives a power loss has its data too). A synced file of 1 MiB
    or more is written with direct I/O where the file system allows it (its header padded to
    a page, so its data starts on one), else through the page cache."""
    arr = np.asarray(arr)
    if not arr.flags.c_contiguous:  # (np.ascontiguousarray would make a 0-d array 1-d)
        arr = arr.copy(order="C")
    header = _npy_header(arr)
    data = memoryview(arr.reshape(-1).view(np.uint8)) if arr.size else memoryview(b"")
    part = path + ".part"
    value = None
    if sync and _direct_ok[0] and len(data) >= _DIRECT_MIN and len(header) % _BLOCK == 0:
        value = _direct_write(part, header, data)
    if value is None:
        digest = Digest()
        with open(part, "wb") as f:
            _hash_and_write(f, memoryview(header), digest)
            _hash_and_write(f, data, digest)
            if sync:
                f.flush()
                os.fsync(f.fileno())
                _drop_cached(f.fileno())
        value = digest.value()
    os.replace(part, path)
    return value


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


def file_checksum(path: str, checksum: Optional[str] = None) -> int:
    """The ``checksum`` of the bytes of the file at ``path`` (read in 64 MiB chunks)."""
    digest = Digest(checksum)
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb") as f:
        while True:
            n = f.readinto(buf)
            if not n:
                return digest.value()
            digest.update(view[:n])


def read_into(path: str, offset: int, out: np.ndarray, checksum: Optional[str] = None) -> int:
    """Read a ``.npy`` file whose data starts at ``offset`` straight into ``out`` (C order,
    the file's shape and dtype); the ``checksum`` of all the file's bytes, computed on the
    way (one pass: no memory map, no second read to verify)."""
    view = memoryview(out.reshape(-1).view(np.uint8)) if out.size else memoryview(b"")
    digest = Digest(checksum)
    with open(path, "rb", buffering=0) as f:
        digest.update(f.read(offset))
        pos = 0
        while pos < len(view):
            n = f.readinto(view[pos:pos + _CHUNK])
            if not n:
                raise EOFError(f"{path} ends after {offset + pos} bytes")
            digest.update(view[pos:pos + n])
            pos += n
        digest.update(f.read())  # bytes past the data, if any, count too
    return digest.value()


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
    buf = free.pop() if free else aligned_empty(arr.shape, arr.dtype)
    if is_host(arr):
        np.copyto(buf, arr)
    else:  # a CuPy array: one device-to-host copy into the buffer
        try:
            with _device.explicit():  # a save asks for this copy (ct.debug's sync mode)
                _device.host_sync("a checkpoint save")
                arr.get(out=buf)
        except (TypeError, ValueError):  # a CuPy without get(out=), or a layout it refuses
            np.copyto(buf, to_host(arr, explicit=True))
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


class Commit(Protocol):
    """What a :class:`SaveHandle` needs of the save that made it (see ``ct.checkpoint``)."""

    #: whether this process holds rank 0, which commits
    root: bool

    def exchange(self, note) -> list:
        """Collective: every rank's ``note``, in rank order."""

    def write(self, checksums: dict) -> None:
        """Rank 0, on any thread: write the metadata and the marker, rename the directory
        into place, remove the replaced checkpoint."""

    def discard(self) -> None:
        """Rank 0: remove the unfinished directory of a failed save."""


def _failure(error: BaseException) -> tuple:
    return ("failed", type(error).__name__, str(error))


class SaveHandle:
    """One asynchronous ``ct.save`` (what ``ct.save(..., async_op=True)`` returns).

    * :meth:`poll` — collective and never blocking on the disk: one small exchange that
      moves the save on if every rank can; whether the save is over (committed). Call it
      once per training step: the step after every rank's writes end, rank 0's thread
      commits (metadata, marker, renames, removing the replaced checkpoint) while training
      goes on, and the next poll after that returns True.
    * :meth:`wait` — collective, like the save: this process's writes, then the commit.
      Re-raises a failed write's or commit's error, on every rank. Call it on every rank (or
      let the next save to the same path, or the interpreter's exit, call it).
    * :meth:`done` — local: whether this process's writes are finished (it may differ between
      ranks: never branch a collective on it).

    Every collective runs on the calling thread, in :meth:`poll` / :meth:`wait`, ordered
    with the rank's other collectives; the threads do file I/O and checksums only. The
    ranks move through the stages together ("writing", "committing", over): each exchange
    gives every rank the same notes, so the same decision.

    >>> handle = ct.save(state, "ckpt/step-100", async_op=True)   # training goes on
    >>> ...
    >>> handle.wait()                                             # "ckpt/step-100" exists
    """

    def __init__(self, path: str, files: list, commit: Commit, background: bool,
                 staged: bool = False):
        self.path = path
        self._staged = staged  # the arrays are staging buffers: reused once written
        self._files = files  # [(file path, host array)]
        self._commit = commit
        self._background = background
        self._checksums: dict = {}
        self._error: Optional[BaseException] = None  # this process's write or commit error
        self._stage = "writing"  # -> "committing" -> "over"
        self._result: Optional[BaseException] = None  # what poll()/wait() raise once over
        self._thread: Optional[threading.Thread] = None
        if background:
            _pending.append(self)
            _install_exit_hook()
        self._start(self._write, bool(files))

    def _start(self, work: Callable[[], None], thread: bool = True) -> None:
        if self._background and thread:
            self._thread = threading.Thread(target=work, daemon=True,
                                            name=f"ctensor-save {os.path.basename(self.path)}")
            self._thread.start()
        else:
            work()

    def _busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _write(self) -> None:
        # not niced: a starved writer that asks for the GIL makes the training thread,
        # which must hand it over, wait for the writer to be scheduled (measured: worse)
        try:
            for name, arr in self._files:
                self._checksums[os.path.basename(name)] = write_array(name, arr)
        except BaseException as exc:  # noqa: BLE001 - raised by poll()/wait() on every rank
            self._error = exc

    def _write_commit(self, checksums: dict) -> None:
        try:
            self._commit.write(checksums)
        except BaseException as exc:  # noqa: BLE001 - raised by poll()/wait() on every rank
            self._error = exc
            self._commit.discard()

    def _step(self) -> None:
        """One exchange (collective): on to the next stage if every rank can."""
        if self._stage == "writing":
            note = "writing" if self._busy() else _failure(self._error) if self._error \
                else ("written", self._checksums)
            notes = self._commit.exchange(note)
            if "writing" in notes:
                return
            self._release()
            failed = [r for r, n in enumerate(notes) if n[0] == "failed"]
            if failed:
                if self._commit.root:
                    self._commit.discard()
                self._end(failed, notes, "writing the files of")
                return
            checksums = {k: v for n in notes for k, v in n[1].items()}
            self._stage = "committing"
            if self._commit.root:
                self._start(lambda: self._write_commit(checksums))
        else:
            note = None
            if self._commit.root:
                note = "busy" if self._busy() else _failure(self._error) if self._error \
                    else ("committed",)
            notes = self._commit.exchange(note)
            if notes[0] != "busy":
                self._end([0] if notes[0][0] == "failed" else [], notes, "committing")

    def _release(self) -> None:
        """The host copies go (or serve the next save) once they are on disk."""
        if self._staged:
            unstage([arr for _, arr in self._files])
        self._files = []

    def _end(self, failed: list, notes: list, what: str) -> None:
        self._stage = "over"
        if self in _pending:
            _pending.remove(self)
        if failed and self._error is None:
            kind, text = notes[failed[0]][1:]
            cls = ChecksumError if kind == ChecksumError.__name__ else ValueError
            self._error = cls(f"save: {what} {self.path!r} failed on rank(s) {failed}; "
                              f"the old checkpoint, if any, is unchanged; rank {failed[0]}: "
                              f"{kind}: {text}")
        self._result = self._error if failed else None

    def done(self) -> bool:
        """Whether this process's writes are finished (local; see the class docstring)."""
        return self._stage != "writing" or not self._busy()

    def poll(self) -> bool:
        """Collective: one small exchange that moves the save on where every rank can (the
        commit starts on rank 0's thread once every rank's writes are done); whether the save
        is over, raising its error if it failed. Never waits for a disk, so a training loop
        may call it every step."""
        if self._stage != "over":
            self._step()
        if self._result is not None:
            raise self._result
        return self._stage == "over"

    def wait(self) -> None:
        """Finish the save (collective): this process's writes, then the commit on every
        rank. Raises the save's error (on every rank) if any rank's writes or the commit
        failed; a second call returns at once (or raises the same error)."""
        while self._stage != "over":
            if self._thread is not None:
                self._thread.join()
            self._step()
        if self._result is not None:
            raise self._result

    def __repr__(self) -> str:
        state = {"over": "failed" if self._result is not None else "committed",
                 "committing": "committing"}.get(self._stage,
                                                 "writing" if self._busy() else "written")
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
