"""Checkpoints that reshard: ``ct.save(obj, path)`` / ``ct.load(path)``.

A checkpoint is a directory::

    path/metadata.json        the object tree, and per tensor: shape, dtype, placement, SBP
                              and the regions (logical boxes) saved with the file of each
    path/t<i>_r<rank>.npy     one file per distinct region of tensor i, written by the first
                              rank of the placement holding that region (no duplicates for
                              broadcast tensors)
    path/COMPLETE             written last

Saving is collective and atomic: every rank writes its regions into ``path.ctensor-tmp``,
then rank 0 writes the metadata and the marker and renames the directory into place, so
``path`` is either the old checkpoint or the complete new one. Partial tensors are reduced
(boxed to broadcast on their partial axes) before saving.

Loading builds each tensor in the layout asked for (default: every rank of the current
world, broadcast) by reading, for each shard this process holds, just the intersecting
parts of the saved regions (memory-mapped). So a checkpoint saved on 4 ranks as (S(0), S(1))
on a 2x2 mesh loads on 2 ranks as S(1), or in one process. Everything is checked (marker,
metadata, every file's header) before any tensor is built; ranks agree on success, so a
failure on one rank is an error on all of them, never a hang or a half-loaded object.
"""
from __future__ import annotations

import fnmatch
import json
import os
import shutil
from typing import Any, Callable, Optional, Union

import numpy as np

from .arrays import to_host
from .creation import generate, resolve
from .layout import intersect, slices
from .placement import Placement
from .runtime import world
from .sbp import without_partial
from .tensor import Tensor

__all__ = ["save", "load"]

FORMAT = "ctensor-checkpoint"
VERSION = 1
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


def _sbp_text(s) -> str:
    return repr(s)


# ----------------------------------------------------------------------------- agreement
def _agree(error: Optional[BaseException], what: str) -> None:
    """Collective: raise on every rank if any rank failed (its own error where it failed)."""
    w = world()
    flags = w.exchange({r: error is not None for r in w.held_ranks})
    failed = [r for r, f in enumerate(flags) if f]
    if error is not None:
        raise error
    if failed:
        raise ValueError(f"{what}: failed on rank(s) {failed} (see the error there); nothing "
                         f"was changed on this rank")


def _is_root() -> bool:
    return 0 in world().held_ranks


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


def _write_array(path: str, arr) -> None:
    arr = to_host(arr)
    part = path + ".part"
    with open(part, "wb") as f:
        np.save(f, np.asarray(arr, order="C"))
    os.replace(part, path)


def _write_text(path: str, text: str) -> None:
    part = path + ".part"
    with open(part, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(part, path)


def save(obj: Any, path: Union[str, os.PathLike]) -> None:
    """Save a (nested) dict/list of ct tensors, NumPy arrays, numbers and strings.

    Collective: every rank calls it with the same object structure and path (on a file
    system all ranks see). Each rank writes only its own shards; the write is atomic.

    >>> ct.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": 5}, "ckpt")
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"save: argument 'path' must be a str or path, got "
                        f"{type(path).__name__}")
    path = os.path.abspath(os.fspath(path))
    tensors: list = []
    arrays: list = []
    tree = _encode(obj, tensors, arrays, "")
    if os.path.isfile(path) or (os.path.isdir(path) and os.listdir(path) and
                                not os.path.exists(os.path.join(path, METADATA))):
        raise ValueError(f"save: argument 'path' {path!r} exists and is not a ctensor "
                         f"checkpoint; choose another path (an old checkpoint is replaced)")
    # reduce partial tensors first (collective, same order on every rank)
    tensors = [t.to_global(sbp=without_partial(t.sbp)) if t._layout.has_partial else t
               for t in tensors]
    tmp = path + TMP_SUFFIX
    error = None
    if _is_root():
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
        except OSError as exc:
            error = exc
    _agree(error, "save")
    meta_tensors = []
    try:
        for i, t in enumerate(tensors):
            regions = _regions(t, i)
            for writer, _, name in regions:
                if writer in t.local_shards():
                    _write_array(os.path.join(tmp, name), t.local_shards()[writer])
            meta_tensors.append({
                "shape": list(t.shape), "dtype": np.dtype(t.dtype).str,
                "placement": {"device": t.placement.device,
                              "ranks": t.placement.ranks.tolist()},
                "sbp": [_sbp_text(s) for s in t.sbp],
                "regions": [{"file": name, "rank": r, "box": [list(b) for b in box]}
                            for r, box, name in regions]})
    except OSError as exc:
        error = exc
    _agree(error, "save")
    if _is_root():
        try:
            meta_arrays = []
            for j, a in enumerate(arrays):
                name = f"a{j}.npy"
                _write_array(os.path.join(tmp, name), a)
                meta_arrays.append({"file": name, "shape": list(a.shape),
                                    "dtype": a.dtype.str})
            meta = {"format": FORMAT, "version": VERSION, "world_size": world().size,
                    "tree": tree, "tensors": meta_tensors, "arrays": meta_arrays}
            _write_text(os.path.join(tmp, METADATA), json.dumps(meta))
            _write_text(os.path.join(tmp, MARKER), f"{FORMAT} {VERSION}\n")
            old = path + OLD_SUFFIX
            if os.path.exists(path):
                shutil.rmtree(old, ignore_errors=True)
                os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        except OSError as exc:
            error = exc
    _agree(error, "save")


# ----------------------------------------------------------------------------- load
def _check_file(directory: str, name: str, shape: tuple, dtype: np.dtype, cache: dict):
    """Open ``name`` memory-mapped (cached) after checking its header."""
    if name in cache:
        return cache[name]
    full = os.path.join(directory, name)
    if not os.path.isfile(full):
        raise ValueError(f"load: checkpoint {directory!r} is corrupt: file {name!r} is missing")
    try:
        arr = np.load(full, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ValueError(f"load: checkpoint {directory!r} is corrupt: file {name!r} cannot be "
                         f"read ({exc})") from None
    if tuple(arr.shape) != tuple(shape) or arr.dtype != dtype:
        raise ValueError(f"load: checkpoint {directory!r} is corrupt: file {name!r} holds "
                         f"{arr.dtype}{tuple(arr.shape)}, the metadata says "
                         f"{dtype}{tuple(shape)}")
    cache[name] = arr
    return arr


def _read_metadata(directory: str) -> dict:
    if not os.path.exists(directory):
        raise FileNotFoundError(f"load: no checkpoint at {directory!r}")
    if not os.path.isfile(os.path.join(directory, MARKER)):
        raise ValueError(f"load: {directory!r} is not a complete ctensor checkpoint (no "
                         f"{MARKER} marker: the save did not finish, or this is another "
                         f"kind of directory)")
    try:
        with open(os.path.join(directory, METADATA), encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"load: checkpoint {directory!r} is corrupt: {METADATA} cannot be "
                         f"read ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"load: {directory!r} is not a ctensor checkpoint (bad {METADATA})")
    if meta.get("version") != VERSION:
        raise ValueError(f"load: checkpoint {directory!r} has format version "
                         f"{meta.get('version')!r}; this ctensor reads version {VERSION}")
    return meta


def _validate_tensor(directory: str, i: int, tm: dict, cache: dict) -> tuple:
    try:
        shape = tuple(int(n) for n in tm["shape"])
        dtype = np.dtype(tm["dtype"])
        regions = [(r["file"], tuple((int(a), int(b)) for a, b in r["box"]))
                   for r in tm["regions"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"load: checkpoint {directory!r} is corrupt: bad entry for tensor "
                         f"{i} ({exc})") from None
    covered = 0
    for name, box in regions:
        if len(box) != len(shape) or any(not 0 <= a <= b <= n for (a, b), n in zip(box, shape)):
            raise ValueError(f"load: checkpoint {directory!r} is corrupt: region {box} of "
                             f"tensor {i} lies outside its shape {shape}")
        _check_file(directory, name, tuple(b - a for a, b in box), dtype, cache)
        covered += int(np.prod([b - a for a, b in box], dtype=np.int64))
    if covered != int(np.prod(shape, dtype=np.int64)):
        raise ValueError(f"load: checkpoint {directory!r} is corrupt: the regions of tensor "
                         f"{i} cover {covered} of its {int(np.prod(shape))} elements")
    return shape, dtype, regions


def _read_region(region: tuple, dtype: np.dtype, regions: list, cache: dict) -> np.ndarray:
    out = np.empty(tuple(b - a for a, b in region), dtype=dtype)
    for name, saved in regions:
        common = intersect(region, saved)
        if common is not None:
            out[slices(common, region)] = cache[name][slices(common, saved)]
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


def load(path: Union[str, os.PathLike], placement: Optional[Placement] = None, sbp=None,
         map: Union[Callable, dict, None] = None):  # noqa: A002 - the documented name
    """Load what :func:`save` wrote, laid out for the current world.

    Tensors come back on ``placement`` (default: every rank of the world) with ``sbp``
    (default: broadcast); ``map`` chooses per tensor: a function ``(name, shape, dtype)``
    returning an SBP, a ``(placement, sbp)`` pair or None, or a dict from dotted name
    (fnmatch patterns allowed, e.g. ``"model.*.weight"``) to those. Each rank reads only the
    parts of the saved regions its shards need. Collective.

    Raises ``FileNotFoundError`` if there is no checkpoint at ``path`` and ``ValueError``
    if it is incomplete or corrupt (on every rank, before anything is returned).

    >>> state = ct.load("ckpt")
    >>> model.load_state_dict(state["model"]); opt.load_state_dict(state["optim"])
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"load: argument 'path' must be a str or path, got "
                        f"{type(path).__name__}")
    if placement is not None and not isinstance(placement, Placement):
        raise TypeError(f"load: argument 'placement' must be a ct.placement, got "
                        f"{placement!r} ({type(placement).__name__})")
    directory = os.path.abspath(os.fspath(path))
    placement = placement or Placement.all()
    error, result = None, None
    try:
        meta = _read_metadata(directory)
        cache: dict = {}
        checked = [_validate_tensor(directory, i, tm, cache)
                   for i, tm in enumerate(meta.get("tensors", []))]
        arrays = []
        for j, am in enumerate(meta.get("arrays", [])):
            arr = _check_file(directory, am["file"], tuple(am["shape"]),
                              np.dtype(am["dtype"]), cache)
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
                _read_region(box, dtype, regions, cache)))

        try:
            result = _decode(meta["tree"], build)
        except (KeyError, IndexError) as exc:
            raise ValueError(f"load: checkpoint {directory!r} is corrupt: bad object tree "
                             f"({exc})") from None
    except (OSError, ValueError, TypeError) as exc:
        error = exc
    _agree(error, "load")
    return result

