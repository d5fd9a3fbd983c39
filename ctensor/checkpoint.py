"""Checkpoints that reshard: ``ct.save(obj, path)`` / ``ct.load(path)``.

A checkpoint is a directory::

    path/metadata.json        the object tree, and per tensor: shape, dtype, placement, SBP
                              and the regions (logical boxes) saved with the file and the
                              checksum of each (XXH3-64; CRC-32 before version 3)
    path/t<i>_r<rank>.npy     one file per distinct region of tensor i, written by the first
                              rank of the placement holding that region (no duplicates for
                              broadcast tensors)
    path/COMPLETE             written last: the format, its version and the CRC-32 of
                              metadata.json

Saving is collective and atomic: every rank writes (and fsyncs) its regions into
``path.ctensor-tmp``, then rank 0 writes the metadata and the marker and renames the
directory into place, so ``path`` is either the old checkpoint or the complete new one.
Partial tensors are reduced (boxed to broadcast on their partial axes) before saving. With
``async_op=True`` the writes run on a background thread from host copies taken in the
call, and ``handle.poll()`` / ``handle.wait()`` move the commit on: rank 0's file work runs
on a thread of its own once every rank has written (see :mod:`ctensor.checkpoint_io`).

Loading builds each tensor in the layout asked for (default: every rank of the current
world, broadcast) by reading, for each shard this process holds, just the intersecting
parts of the saved regions (memory-mapped), after checking the checksum of each file it
reads. So a checkpoint saved on 4 ranks as (S(0), S(1)) on a 2x2 mesh loads on 2 ranks as
S(1), or in one process. Everything is checked (marker, metadata, every file's header and
checksum) before anything is returned; ranks agree on success, so a failure on one rank is
an error on all of them, never a hang or a half-loaded object.
"""
from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import warnings
import zlib
from typing import Any, Callable, Optional, Union

import numpy as np

from .arrays import to_host
from .checkpoint_io import (CHECKSUM, CHECKSUMS, ChecksumError, SaveHandle, checksum_text,
                            file_checksum, finish_pending, read_into, stage, sync_directory,
                            write_text)
from .creation import generate, resolve
from .layout import intersect, slices
from .placement import Placement
from .runtime import world
from .sbp import without_partial
from .tensor import Tensor

__all__ = ["save", "load", "ChecksumError", "SaveHandle"]

FORMAT = "ctensor-checkpoint"
#: version 2 adds the checksums; version 1 (no checksums) still loads, with a warning
VERSION = 3  # 3: data files checksummed with XXH3-64 (2: CRC-32; 1: no checksums)
METADATA = "metadata.json"
MARKER = "COMPLETE"
TMP_SUFFIX = ".ctensor-tmp"
OLD_SUFFIX = ".ctensor-old"


# ----------------------------------------------------------------------------- tree
def _encode(obj, tensors: list, arrays: list, where: str):
    """JSON node for ``obj``; tensors and arrays are appended to the lists."""
    if isinstance(obj, Tensor):
        tensors.append(obj)
        return {"tensor": len(tensors) - 1}
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise TypeError(f"save: cannot save a NumPy array of dtype {obj.dtype} at "
                            f"{where or 'the top level'} (it would need pickling); convert it "
                            f"to a numeric or string dtype, or to a list")
        arrays.append(obj)
        return {"ndarray": len(arrays) - 1}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return {"value": obj}
    if isinstance(obj, np.generic):
        return {"value": obj.item()}
    if isinstance(obj, dict):
        items = []
        for k, v in obj.items():
            if isinstance(k, bool) or not isinstance(k, (str, int)):
                raise TypeError(f"save: dict keys must be str or int, got {k!r} "
                                f"({type(k).__name__}) at {where or 'the top level'}")
            items.append([k, _encode(v, tensors, arrays, f"{where}.{k}" if where else str(k))])
        return {"dict": items}
    if isinstance(obj, (list, tuple)):
        kind = "list" if isinstance(obj, list) else "tuple"
        return {kind: [_encode(v, tensors, arrays, f"{where}.{i}" if where else str(i))
                       for i, v in enumerate(obj)]}
    raise TypeError(f"save: cannot save {type(obj).__name__} at "
                    f"{where or 'the top level'}; accepted: ct tensors, NumPy arrays, "
                    f"numbers, str, None and dicts/lists/tuples of them")


def _decode(node, build: Callable, where: str = ""):
    if not isinstance(node, dict) or len(node) != 1:
        raise ValueError(f"load: the checkpoint's object tree is corrupt at "
                         f"{where or 'the top level'}")
    kind, body = next(iter(node.items()))
    if kind == "value":
        return body
    if kind in ("tensor", "ndarray"):
        return build(kind, int(body), where)
    if kind == "dict":
        return {k: _decode(v, build, f"{where}.{k}" if where else str(k)) for k, v in body}
    if kind in ("list", "tuple"):
        items = [_decode(v, build, f"{where}.{i}" if where else str(i))
                 for i, v in enumerate(body)]
        return items if kind == "list" else tuple(items)
    raise ValueError(f"load: the checkpoint's object tree has an unknown node kind {kind!r} "
                     f"at {where or 'the top level'}")


def _names(tree) -> dict:
    """``{("tensor" | "ndarray", index): dotted name}`` of a saved object tree (for messages;
    a corrupt tree gives what it can)."""
    found: dict = {}

    def walk(node, where: str) -> None:
        if not isinstance(node, dict) or len(node) != 1:
            return
        kind, body = next(iter(node.items()))
        if kind in ("tensor", "ndarray") and isinstance(body, int):
            found[(kind, body)] = where
        elif kind == "dict" and isinstance(body, list):
            for item in body:
                if isinstance(item, list) and len(item) == 2:
                    walk(item[1], f"{where}.{item[0]}" if where else str(item[0]))
        elif kind in ("list", "tuple") and isinstance(body, list):
            for i, v in enumerate(body):
                walk(v, f"{where}.{i}" if where else str(i))

    walk(tree, "")
    return found


def _sbp_text(s) -> str:
    return repr(s)


# ----------------------------------------------------------------------------- agreement
def _agree(error: Optional[BaseException], what: str, w=None) -> None:
    """Collective: raise on every rank if any rank failed — its own error where it failed,
    elsewhere a ``ValueError`` (a :class:`ChecksumError` for a damaged file) that repeats
    the first failing rank's message."""
    w = w or world()
    note = None if error is None else (type(error).__name__, str(error))
    notes = w.exchange({r: note for r in w.held_ranks})
    failed = [r for r, n in enumerate(notes) if n is not None]
    if error is not None:
        raise error
    if failed:
        kind, text = notes[failed[0]]
        cls = ChecksumError if kind == ChecksumError.__name__ else ValueError
        raise cls(f"{what}: failed on rank(s) {failed}, nothing was changed on this rank; "
                  f"rank {failed[0]}: {text}")


def _is_root(w=None) -> bool:
    return 0 in (w or world()).held_ranks


# ----------------------------------------------------------------------------- save
def _regions(t: Tensor, index: int) -> list:
    """One entry per distinct non-empty region: (writer rank, box, file name)."""
    out, seen = [], set()
    for r in t.placement.rank_list:
        box = t._layout.region(r)
        if box in seen:
            continue
        seen.add(box)
        if all(b > a for a, b in box):
            out.append((r, box, f"t{index}_r{r}.npy"))
    return out


def _host_copy(arr, copy: bool) -> np.ndarray:
    """``arr`` in host memory; with ``copy`` a copy of its own (in a reused staging buffer)."""
    return stage(arr) if copy else to_host(arr, explicit=True)


def save(obj: Any, path: Union[str, os.PathLike], async_op: bool = False
         ) -> Optional[SaveHandle]:
    """Save a (nested) dict/list of ct tensors, NumPy arrays, numbers and strings.

    Collective: every rank calls it with the same object structure and path (on a file
    system all ranks see). Each rank writes only its own shards, each file with a checksum
    that :func:`load` verifies; the write is atomic (``path`` is the old checkpoint or the
    complete new one, never a mixture).

    ``async_op=True`` returns a :class:`~ctensor.checkpoint_io.SaveHandle` at once: the
    shards are copied to host memory in the call (from the GPU too), so training may go on
    and change them; a background thread writes the copies, and ``handle.wait()``
    (collective) commits the checkpoint on every rank. ``handle.poll()`` (collective, once
    per step, never blocking on the disk) starts the commit on rank 0's thread the step after
    every rank's writes are done, and returns True at the first step after it ends. A save
    to a path whose previous save is still in flight first finishes that one; saves to other
    paths stay in flight together. Pending saves are finished at interpreter exit (a failure is
    printed). The host copies go into staging buffers kept from the previous asynchronous
    save (``ct.checkpoint_io.free_staging_buffers()`` lets them go).

    >>> ct.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": 5}, "ckpt")
    >>> handle = ct.save(state, "ckpt-100", async_op=True); ...; handle.wait()
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"save: argument 'path' must be a str or path, got "
                        f"{type(path).__name__}")
    if not isinstance(async_op, bool):
        raise TypeError(f"save: argument 'async_op' must be True or False, got {async_op!r}")
    path = os.path.abspath(os.fspath(path))
    tensors: list = []
    arrays: list = []
    tree = _encode(obj, tensors, arrays, "")
    finish_pending(path)  # a save still in flight to this path commits first (collective)
    if os.path.isfile(path) or (os.path.isdir(path) and os.listdir(path) and
                                not os.path.exists(os.path.join(path, METADATA))):
        raise ValueError(f"save: argument 'path' {path!r} exists and is not a ctensor "
                         f"checkpoint; choose another path (an old checkpoint is replaced)")
    # reduce partial tensors first (collective, same order on every rank)
    tensors = [t.to_global(sbp=without_partial(t.sbp)) if t._layout.has_partial else t
               for t in tensors]
    w = world()
    tmp = path + TMP_SUFFIX
    error = None
    if _is_root(w):
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
        except OSError as exc:
            error = exc
    _agree(error, "save", w)
    files, meta_tensors, meta_arrays = [], [], []
    for i, t in enumerate(tensors):
        regions = _regions(t, i)
        shards = t.local_shards()
        files += [(os.path.join(tmp, name), _host_copy(shards[writer], async_op))
                  for writer, _, name in regions if writer in shards]
        meta_tensors.append({
            "shape": list(t.shape), "dtype": np.dtype(t.dtype).str,
            "placement": {"device": t.placement.device, "ranks": t.placement.ranks.tolist()},
            "sbp": [_sbp_text(s) for s in t.sbp],
            "regions": [{"file": name, "rank": r, "box": [list(b) for b in box]}
                        for r, box, name in regions]})
    for j, a in enumerate(arrays):
        meta_arrays.append({"file": f"a{j}.npy", "shape": list(a.shape), "dtype": a.dtype.str})
        if _is_root(w):
            files.append((os.path.join(tmp, f"a{j}.npy"), _host_copy(a, async_op)))
    meta = {"format": FORMAT, "version": VERSION, "checksum": CHECKSUM,
            "world_size": w.size, "tree": tree, "tensors": meta_tensors, "arrays": meta_arrays}

    handle = SaveHandle(path, files, _Commit(w, path, tmp, meta), background=async_op,
                        staged=async_op)
    if async_op:
        return handle
    handle.wait()
    return None


class _Commit:
    """A save's collective parts and rank 0's commit, for its :class:`SaveHandle`: the
    handle exchanges notes (every rank's checksums once written) on the calling thread;
    rank 0's thread then writes the metadata and the marker, renames ``tmp`` into place
    and removes the replaced checkpoint."""

    def __init__(self, w, path: str, tmp: str, meta: dict):
        self.w, self.path, self.tmp, self.meta = w, path, tmp, meta
        self.root = _is_root(w)

    def exchange(self, note) -> list:
        return self.w.exchange({r: note for r in self.w.held_ranks})

    def write(self, checksums: dict) -> None:
        meta, tmp, path = self.meta, self.tmp, self.path
        for entry in [r for tm in meta["tensors"] for r in tm["regions"]] + meta["arrays"]:
            entry[CHECKSUM] = checksums[entry["file"]]
        meta_crc = write_text(os.path.join(tmp, METADATA), json.dumps(meta))
        write_text(os.path.join(tmp, MARKER), f"{FORMAT} {VERSION} crc32 {meta_crc:08x}\n")
        old = path + OLD_SUFFIX
        if os.path.exists(path):
            shutil.rmtree(old, ignore_errors=True)
            os.rename(path, old)
        os.rename(tmp, path)
        sync_directory(os.path.dirname(path))
        shutil.rmtree(old, ignore_errors=True)

    def discard(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


# ----------------------------------------------------------------------------- load
def _check_file(directory: str, name: str, shape: tuple, dtype: np.dtype, cache: dict,
                verify: Callable, what: Callable):
    """Open ``name`` memory-mapped (cached) after checking its header; a bad header is
    reported as a checksum mismatch where the checksum says the file was damaged."""
    if name in cache:
        return cache[name]
    full = os.path.join(directory, name)
    if not os.path.isfile(full):
        raise ValueError(f"load: checkpoint {directory!r} is corrupt: file {name!r} is missing")
    try:
        arr = np.load(full, mmap_mode="r", allow_pickle=False)
        problem = None
    except (ValueError, OSError, EOFError) as exc:
        problem = f"cannot be read ({exc})"
    else:
        if tuple(arr.shape) != tuple(shape) or arr.dtype != dtype:
            problem = (f"holds {arr.dtype}{tuple(arr.shape)}, the metadata says "
                       f"{dtype}{tuple(shape)}")
    if problem is not None:
        verify(name, what())
        raise ValueError(f"load: checkpoint {directory!r} is corrupt: file {name!r} "
                         f"{problem}")
    cache[name] = arr
    return arr


class _Verifier:
    """Checks each file's checksum once, when this rank first reads it (a rank reads, and
    so verifies, only the files its shards need)."""

    def __init__(self, directory: str, expected: Optional[dict], checksum: str):
        self.directory = directory
        self.checksum = checksum  # the metadata's name of it: "xxh3_64", or "crc32"
        self.expected = expected  # {file: crc}; None: a version-1 checkpoint (no checksums)
        self.verified: set = set()

    def __call__(self, name: str, what: str, got: Optional[int] = None) -> None:
        """Check ``name`` (``got``: its checksum, if the caller computed it on a read)."""
        if self.expected is None or name in self.verified:
            return
        if got is None:
            got = file_checksum(os.path.join(self.directory, name), self.checksum)
        if got != self.expected.get(name):
            raise ChecksumError(
                f"load: checkpoint {self.directory!r} is corrupt: file {name!r} ({what}) has "
                f"{self.checksum} checksum {checksum_text(got, self.checksum)}, the metadata "
                f"recorded {checksum_text(self.expected.get(name, 0), self.checksum)} when it "
                f"was written: the file was damaged since; restore it or load another "
                f"checkpoint")
        self.verified.add(name)


def _replaced(directory: str) -> str:
    """``directory``, or, when a save was stopped between its two renames (the old checkpoint
    moved aside, the new one not yet in place), the old checkpoint where it was moved."""
    old = directory + OLD_SUFFIX
    if not os.path.exists(directory) and os.path.isfile(os.path.join(old, MARKER)):
        return old
    return directory


def _read_metadata(directory: str) -> tuple:
    """The metadata and the per-file checksums (None for a version-1 checkpoint)."""
    if not os.path.exists(directory):
        raise FileNotFoundError(f"load: no checkpoint at {directory!r}")
    marker = os.path.join(directory, MARKER)
    if not os.path.isfile(marker):
        raise ValueError(f"load: {directory!r} is not a complete ctensor checkpoint (no "
                         f"{MARKER} marker: the save did not finish, or this is another "
                         f"kind of directory)")
    try:
        with open(marker, "rb") as f:
            text = f.read(200)
        with open(os.path.join(directory, METADATA), "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ValueError(f"load: checkpoint {directory!r} cannot be read ({exc})") from None
    found = re.fullmatch(rb"%s ([23]) crc32 ([0-9a-f]{8})\n" % FORMAT.encode(), text)
    version = int(found.group(1)) if found else 1 if text == f"{FORMAT} 1\n".encode() \
        else None
    if version is None:
        raise ValueError(f"load: checkpoint {directory!r} is corrupt: its {MARKER} marker "
                         f"{text[:60]!r} is not one this ctensor writes (version {VERSION}: "
                         f"'{FORMAT} {VERSION} crc32 <8 hex digits>')")
    if found and zlib.crc32(raw) != int(found.group(2), 16):
        raise ChecksumError(f"load: checkpoint {directory!r} is corrupt: file {METADATA!r} "
                            f"has CRC-32 {zlib.crc32(raw):08x}, the {MARKER} marker recorded "
                            f"{found.group(2).decode()}: the file was damaged since it was "
                            f"written; restore it or load another checkpoint")
    try:
        meta = json.loads(raw.decode("utf-8"))
    except ValueError as exc:
        raise ValueError(f"load: checkpoint {directory!r} is corrupt: {METADATA} cannot be "
                         f"read ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"load: {directory!r} is not a ctensor checkpoint (bad {METADATA})")
    if meta.get("version") != version:
        raise ValueError(f"load: checkpoint {directory!r} has format version "
                         f"{meta.get('version')!r}; this ctensor reads versions 1 to {VERSION}")
    if version == 1:
        warnings.warn(f"load: checkpoint {directory!r} was written by an older ctensor "
                      f"(format version 1) without checksums: its data cannot be verified; "
                      f"save it again to add them", UserWarning, stacklevel=3)
        return meta, None
    checksum = meta.get("checksum")
    if checksum not in CHECKSUMS:
        raise ValueError(f"load: checkpoint {directory!r} records its files' checksums as "
                         f"{checksum!r}; this ctensor verifies {', '.join(CHECKSUMS)}")
    try:
        checksums = {e["file"]: int(e[checksum]) for e in meta["arrays"] +
                     [r for tm in meta["tensors"] for r in tm["regions"]]}
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"load: checkpoint {directory!r} is corrupt: a file entry has no "
                         f"checksum ({exc})") from None
    return meta, checksums


def _validate_tensor(directory: str, i: int, tm: dict, cache: dict, verify: Callable,
                     name: str) -> tuple:
    try:
        shape = tuple(int(n) for n in tm["shape"])
        dtype = np.dtype(tm["dtype"])
        regions = [(r["file"], tuple((int(a), int(b)) for a, b in r["box"]))
                   for r in tm["regions"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"load: checkpoint {directory!r} is corrupt: bad entry for tensor "
                         f"{i} ({exc})") from None
    covered = 0
    for file, box in regions:
        if len(box) != len(shape) or any(not 0 <= a <= b <= n for (a, b), n in zip(box, shape)):
            raise ValueError(f"load: checkpoint {directory!r} is corrupt: region {box} of "
                             f"tensor {i} lies outside its shape {shape}")
        _check_file(directory, file, tuple(b - a for a, b in box), dtype, cache, verify,
                    lambda: _region_text(name, shape, box))
        covered += int(np.prod([b - a for a, b in box], dtype=np.int64))
    if covered != int(np.prod(shape, dtype=np.int64)):
        raise ValueError(f"load: checkpoint {directory!r} is corrupt: the regions of tensor "
                         f"{i} cover {covered} of its {int(np.prod(shape))} elements")
    return shape, dtype, regions


def _region_text(name: str, shape: tuple, box: tuple) -> str:
    return f"tensor {name!r} of shape {shape}, region {[list(b) for b in box]}"


def _read_region(region: tuple, dtype: np.dtype, regions: list, cache: dict,
                 verify: Callable, name: str, shape: tuple) -> np.ndarray:
    out = np.empty(tuple(b - a for a, b in region), dtype=dtype)
    for file, saved in regions:
        common = intersect(region, saved)
        if common == region == saved and file not in verify.verified:  # the whole file:
            full = os.path.join(verify.directory, file)                 # read and verify
            got = read_into(full, cache[file].offset, out, verify.checksum)  # in one pass
            verify(file, _region_text(name, shape, saved), got)
            continue
        if common is not None:
            verify(file, _region_text(name, shape, saved))
            out[slices(common, region)] = cache[file][slices(common, saved)]
    return out


def _target(name: str, shape: tuple, dtype, placement, sbp, map_) -> tuple:
    """The (placement, sbp) a loaded tensor gets."""
    rule = None
    if callable(map_):
        rule = map_(name, shape, dtype)
    elif isinstance(map_, dict):
        rule = next((v for k, v in map_.items() if k == name or fnmatch.fnmatchcase(name, k)),
                    None)
    elif map_ is not None:
        raise TypeError(f"load: argument 'map' must be a function (name, shape, dtype) -> "
                        f"sbp or (placement, sbp), or a dict from name pattern to those; got "
                        f"{type(map_).__name__}")
    if isinstance(rule, tuple) and len(rule) == 2 and isinstance(rule[0], Placement):
        return rule
    if rule is not None:
        return placement, rule
    return placement, sbp


def _device_of(map_location) -> Optional[str]:
    """The device PyTorch's ``map_location`` names: None, ``"cpu"``, ``"cuda"``,
    ``"cuda:N"`` or a ``torch.device``."""
    if map_location is None:
        return None
    text = getattr(map_location, "type", map_location)
    if isinstance(text, str) and text.split(":")[0] in ("cpu", "cuda"):
        return text.split(":")[0]
    raise TypeError(f"load: argument 'map_location' must be None, 'cpu', 'cuda' (or "
                    f"'cuda:N', a torch.device), got {map_location!r}; a function or dict "
                    f"of storages has no meaning here: choose layouts with placement= / map=")


def load(path: Union[str, os.PathLike], placement: Optional[Placement] = None, sbp=None,
         map: Union[Callable, dict, None] = None,  # noqa: A002 - the documented name
         *, map_location=None, weights_only: Optional[bool] = None):
    """Load what :func:`save` wrote, laid out for the current world.

    Tensors come back on ``placement`` (default: every rank of the world) with ``sbp``
    (default: broadcast); ``map`` chooses per tensor: a function ``(name, shape, dtype)``
    returning an SBP, a ``(placement, sbp)`` pair or None, or a dict from dotted name
    (fnmatch patterns allowed, e.g. ``"model.*.weight"``) to those. Each rank reads only the
    parts of the saved regions its shards need, and verifies the checksum of every file it
    reads. Collective.

    PyTorch's keywords are accepted: ``map_location`` (``"cpu"``, ``"cuda"``, ``"cuda:N"``
    or a ``torch.device``) is the device of the default placement (``cuda:N``: this rank's
    GPU, as every ctensor placement); ``weights_only`` is ignored — a checkpoint never
    unpickles anything (JSON and ``.npy`` without pickles), so every load is weights-only.

    Raises ``FileNotFoundError`` if there is no checkpoint at ``path``, ``ValueError`` if
    it is incomplete or corrupt and :class:`ChecksumError` (a ``ValueError``) naming the
    file, the tensor and the region if a file's bytes changed since the save — on every
    rank, before anything is returned. A checkpoint of format version 1 (before checksums)
    loads with a ``UserWarning``.

    >>> state = ct.load("ckpt")
    >>> model.load_state_dict(state["model"]); opt.load_state_dict(state["optim"])
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"load: argument 'path' must be a str or path, got "
                        f"{type(path).__name__}")
    if placement is not None and not isinstance(placement, Placement):
        raise TypeError(f"load: argument 'placement' must be a ct.placement, got "
                        f"{placement!r} ({type(placement).__name__})")
    if weights_only is not None and not isinstance(weights_only, bool):
        raise TypeError(f"load: argument 'weights_only' must be None, True or False, got "
                        f"{weights_only!r}")
    device = _device_of(map_location)
    if device is not None and placement is not None and placement.device != device:
        raise ValueError(f"load: map_location={map_location!r} and a placement on "
                         f"{placement.device!r} disagree; give one of them")
    directory = _replaced(os.path.abspath(os.fspath(path)))
    placement = placement or Placement.all(device)
    error, result = None, None
    try:
        meta, checksums = _read_metadata(directory)
        verify = _Verifier(directory, checksums, meta.get("checksum", "crc32"))
        cache: dict = {}
        names = _names(meta.get("tree"))
        checked = [_validate_tensor(directory, i, tm, cache, verify, names.get(("tensor", i)))
                   for i, tm in enumerate(meta.get("tensors", []))]
        arrays = []
        for j, am in enumerate(meta.get("arrays", [])):
            what = f"NumPy array {names.get(('ndarray', j))!r} of shape {tuple(am['shape'])}"
            arr = _check_file(directory, am["file"], tuple(am["shape"]),
                              np.dtype(am["dtype"]), cache, verify, lambda: what)
            verify(am["file"], what)
            arrays.append(np.array(arr))

        def build(kind: str, index: int, name: str):
            if kind == "ndarray":
                return arrays[index].copy()
            shape, dtype, regions = checked[index]
            where, how = _target(name, shape, dtype, placement, sbp, map)
            try:
                layout = resolve("load", shape, where, how, dtype)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"{exc} (for tensor {name!r} of shape {shape}; choose its "
                                f"layout with map=)") from None
            return generate(layout, lambda xp, box, dt: xp.asarray(
                _read_region(box, dtype, regions, cache, verify, name, shape)))

        try:
            result = _decode(meta["tree"], build)
        except (KeyError, IndexError) as exc:
            raise ValueError(f"load: checkpoint {directory!r} is corrupt: bad object tree "
                             f"({exc})") from None
    except (OSError, ValueError, TypeError) as exc:
        error = exc
    _agree(error, "load")
    return result
