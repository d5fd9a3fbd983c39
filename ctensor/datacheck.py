"""Checks that ranks hold the data they are meant to share: ``ct.tensor``'s full value, and
the shards along broadcast mesh axes.

A broadcast (``B``) mesh axis says that the ranks along it hold the same values. Nothing
else makes that true when each rank builds its own array: an unseeded (or rank-seeded)
random generator, a rank-dependent value, a shard read from another file. Then ``x.sum()``
gives each rank another answer and training runs on, silently. So the places where data
enter a layout check it, with no debug mode needed:

* :func:`check_same_data` — ``ct.tensor(data, ...)``: one all-reduce of a 32-byte digest
  of ``data`` over the placement (several processes only);
* :func:`check_broadcast_data` — ``ct.from_local`` (whose shard-shape exchange carries
  the digests: no extra collective) and ``Module.to_global`` / ``nn.parallel.*`` /
  ``nn.fully_shard`` (one exchange of every parameter's digest for the whole module):
  each broadcast mesh axis' group of ranks must hold equal shards.

Either raises ``ValueError`` on every rank involved, naming the ranks (and tensors) that
differ and the fix. :class:`check_tensor_data` turns the checks off (``False``) or on.
The digest (:func:`_data_digest`) is two sums over the bytes, ~0.1 ms per MiB.
"""
from __future__ import annotations

from typing import Mapping, Sequence, Union

import numpy as np

from .arrays import to_host
from .meta import reads_values
from .sbp import Broadcast, format_sbp

__all__ = ["check_tensor_data", "check_same_data", "check_broadcast_data",
           "broadcast_differences", "shard_digest", "enabled"]


def _process_comm():
    from . import runtime
    return runtime._base_world().comm


def enabled() -> bool:
    """Whether the data checks are on in this process (:class:`check_tensor_data`)."""
    return bool(_process_comm().check_tensor_data)


class check_tensor_data:
    """Turn off (or on again) the data checks made by default: that every rank of the
    placement passed ``ct.tensor`` the same ``data`` (under mpiexec), and that the shards
    along each broadcast mesh axis are equal in ``ct.from_local``, ``Module.to_global``
    and ``nn.parallel.*`` (:func:`check_broadcast_data`).

    ``ct.tensor``'s check hashes ``data`` (about 0.1 ms per MiB) and all-reduces a 32-byte
    digest once; the broadcast checks hash the shards and exchange their digests once per
    call. Ranks whose data differ get a ``ValueError`` on every rank. Turn them off for
    large tensors built identically on purpose, or where ``ct.tensor`` runs in a hot loop.
    Call it on every rank alike. ``ct.tensor``'s check is a no-op in a simulation (one
    process holds every rank).

    >>> ct.debug.check_tensor_data(False)          # from here on
    >>> with ct.debug.check_tensor_data(False):    # or only inside the block
    ...     x = ct.tensor(big_array, sbp=ct.sbp.split(0))
    """

    def __init__(self, enabled: bool = True):
        if not isinstance(enabled, bool):
            raise TypeError(f"check_tensor_data: argument 'enabled' must be True or False, "
                            f"got {enabled!r}")
        self._comm = _process_comm()
        self._previous = bool(self._comm.check_tensor_data)
        self._comm.check_tensor_data = enabled

    def __enter__(self) -> "check_tensor_data":
        return self

    def __exit__(self, *exc) -> None:
        self._comm.check_tensor_data = self._previous

    def __repr__(self) -> str:
        return f"check_tensor_data(enabled={bool(self._comm.check_tensor_data)})"


#: uint64 lanes hashed per step (1 MiB): hashing holds at most two such buffers
_DIGEST_LANES = 1 << 17
_digest_buffers: list = []  # [odd weights 1, 3, 5, ..., scratch], made on first use


def _data_digest(arr: np.ndarray) -> tuple:
    """Two sums over ``arr``'s bytes read as uint64 lanes ``v_i`` (the tail zero-padded),
    modulo 2**64: ``sum(v_i)`` and ``sum((2i + 1) * v_i)``.

    A change of one lane by ``d != 0`` changes the first sum by ``d`` and the second by
    ``(2i + 1) * d``, non-zero because odd numbers are invertible modulo 2**64; swapping
    lanes ``i`` and ``j`` changes the second by ``2 (j - i) (v_i - v_j)``. So another seed,
    a rank-dependent value or a permutation is caught (an adversary could defeat it; no
    user does by accident), at the cost of two NumPy reductions (~0.1 ms per MiB, where a
    cryptographic hash takes 0.5-1 ms).
    """
    if not _digest_buffers:
        _digest_buffers.append(np.arange(1, 2 * _DIGEST_LANES, 2, dtype=np.uint64))
        _digest_buffers.append(np.empty(_DIGEST_LANES, dtype=np.uint64))
    weights, scratch = _digest_buffers
    raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    n = raw.size // 8
    lanes = raw[:n * 8].view(np.uint64)
    total = weighted = 0
    for start in range(0, n, _DIGEST_LANES):
        part = lanes[start:start + _DIGEST_LANES]
        k = part.size
        part_sum = int(part.sum(dtype=np.uint64))
        # lane start + j has weight 2 (start + j) + 1 = weights[j] + 2 start
        total += part_sum
        weighted += int(np.multiply(part, weights[:k], out=scratch[:k]).sum(dtype=np.uint64))
        weighted += 2 * start * part_sum
    tail = raw[n * 8:].tobytes()
    if tail:
        last = int.from_bytes(tail, "little")
        total += last
        weighted += (2 * n + 1) * last
    mask = (1 << 64) - 1
    return total & mask, weighted & mask


def check_same_data(fn: str, data: np.ndarray, placement) -> None:
    """Under mpiexec (unless :func:`check_tensor_data` turned it off): check that every rank
    of ``placement`` passed the same ``data`` (shape, dtype and values), with one all-reduce
    of a 32-byte digest; raise ``ValueError`` on every rank of the placement otherwise."""
    from . import runtime
    w = runtime.world()
    if w.size == 1 or len(w.held_ranks) != 1 or not w.comm.check_tensor_data:
        return
    me = w.held_ranks[0]
    group = tuple(sorted(placement.rank_list))
    if me not in group or len(group) == 1:
        return
    arr = np.asarray(data)
    total, weighted = _data_digest(arr)
    total ^= hash((arr.shape, arr.dtype.num)) & ((1 << 64) - 1)  # ints only: the same everywhere
    mine = np.array([total, weighted], dtype=np.uint64).view(np.int64)
    if w.agree({me: mine}, group):
        return
    # some rank differs, and every rank of the group knows it: find out which ones
    mine_text = (tuple(arr.shape), str(arr.dtype), f"{total:016x}{weighted:016x}")
    listing = w.exchange({me: mine_text}, group)
    reference = listing[0]
    differ = [r for r, m in zip(group, listing) if m != reference]
    seen_text = "; ".join(f"rank {r}: shape {s} {d}, digest {h[:8]}"
                          for r, (s, d, h) in zip(group, listing))
    every = ", every rank's differs" if len(set(listing)) == len(group) > 2 else ""
    raise ValueError(
        f"{fn}: argument 'data' must be the same full logical value on every rank of the "
        f"placement, but ranks {differ} passed data different from rank {group[0]}'s"
        f"{every} ({seen_text}). Build it identically on every rank: seed every "
        f"random generator alike (np.random.default_rng(0); an unseeded np.random call gives "
        f"each rank different numbers) and make nothing depend on the rank; or pass each "
        f"rank's own shard to ct.from_local.")


def shard_digest(arr) -> str:
    """32 hex digits naming ``arr``'s shape, dtype and bytes (:func:`_data_digest`; a GPU
    array is copied to the host first): equal arrays give equal digests in every process."""
    host = np.asarray(to_host(arr))
    total, weighted = _data_digest(host)
    total ^= hash((host.shape, host.dtype.num)) & ((1 << 64) - 1)  # ints: alike everywhere
    return f"{total:016x}{weighted:016x}"


def _has_broadcast(sbp) -> bool:
    return any(isinstance(s, Broadcast) for s in sbp)


def broadcast_differences(placement, sbp: tuple, digests: Mapping[int, str]) -> list:
    """``[(mesh_axis, group, ranks)]``: for every broadcast mesh axis of ``sbp``, each
    group of ranks along it (its other coordinates fixed) whose members' ``digests``
    differ, with the ranks whose digest is not the group's first rank's."""
    out = []
    for axis, entry in enumerate(sbp):
        if not isinstance(entry, Broadcast) or placement.shape[axis] == 1:
            continue
        seen = set()
        for r in placement.rank_list:
            group = placement.axis_group(r, axis)
            if group in seen:
                continue
            seen.add(group)
            differ = [g for g in group if digests[g] != digests[group[0]]]
            if differ:
                out.append((axis, group, differ))
    return out


def _describe(what: str, placement, sbp, problems: list, digests: Mapping[int, str]) -> str:
    parts = []
    for axis, group, differ in problems[:4]:
        seen = ", ".join(f"rank {r}: {digests[r][:8]}" for r in group[:8])
        parts.append(f"along mesh axis {axis} (B) ranks {differ} hold other values than rank "
                     f"{group[0]} (digests {seen})")
    more = f", and {len(problems) - 4} more groups" if len(problems) > 4 else ""
    return (f"{what} is {format_sbp(sbp)} on {placement!r}, but " + "; ".join(parts) + more)


FIX = ("A broadcast (B) mesh axis means every rank along it holds the same values: build "
       "them identically on every rank (seed every generator alike, ct.manual_seed(0) or "
       "np.random.default_rng(0), not with the rank; make nothing depend on the rank), or "
       "lay the data out with the SBP that says how they differ (split, partial_sum). "
       "ct.debug.check_tensor_data(False) turns this check off.")


def check_broadcast_data(tensors: Union[Mapping[str, object], Sequence],
                         fn: str = "check_broadcast_data", kind: str = "tensor") -> None:
    """Check that every tensor's shards are equal along each of its broadcast mesh axes,
    and raise ``ValueError`` on every rank otherwise, naming the tensors, mesh axes and
    ranks that differ and the fix (``fn`` starts the message, ``kind`` names what the
    tensors are: ``"parameter"`` for ``Module.to_global``).

    ``tensors`` maps names to ``ct.Tensor`` s (or is a sequence of them, named by index).
    Collective over the ranks of the tensors' placements (every one of them calls it alike,
    as for the ``to_global`` that usually follows): each hashes its shards of the tensors
    that have a broadcast axis (:func:`shard_digest`) and all of them exchange the digests
    once, for every tensor together. Nothing to check (no broadcast axis, placements of one
    rank, a shape-only world, :class:`check_tensor_data` off) communicates nothing. Under
    mpiexec and in a simulation alike.

    >>> ct.manual_seed(ct.rank())                  # each rank draws other weights ...
    >>> ct.debug.check_broadcast_data(dict(nn.Linear(4, 4).named_parameters()))
    ValueError: check_broadcast_data: 2 tensors differ between ranks that their SBP says ...
    """
    if enabled():
        _check_broadcast(tensors, fn, kind)


@reads_values()
def _check_broadcast(tensors, fn: str, kind: str) -> None:
    """:func:`check_broadcast_data`'s work (skipped shape-only: no data to hash)."""
    from . import runtime
    w = runtime.world()
    named = list(tensors.items()) if hasattr(tensors, "items") else \
        [(str(i), t) for i, t in enumerate(tensors)]
    items = [(name, t) for name, t in named
             if t.placement.size > 1 and _has_broadcast(t.sbp)]
    if not items:
        return
    group = tuple(sorted({r for _, t in items for r in t.placement.rank_list}))
    mine = {}
    for r in w.held_ranks:
        if r in group:
            mine[r] = [shard_digest(t.local_shards()[r]) if r in t.placement else None
                       for _, t in items]
    if not mine:
        return  # this process holds no rank of these placements
    listing = dict(zip(group, w.exchange(mine, group)))
    found = []
    for i, (name, t) in enumerate(items):
        digests = {r: listing[r][i] for r in t.placement.rank_list}
        problems = broadcast_differences(t.placement, t.sbp, digests)
        if problems:
            found.append(_describe(f"{kind} {name!r}", t.placement, t.sbp, problems,
                                   digests))
    if found:
        shown = "; ".join(found[:6]) + (f"; and {len(found) - 6} more" if len(found) > 6 else "")
        many = len(found) > 1
        raise ValueError(f"{fn}: {len(found)} {kind}{'s' if many else ''} "
                         f"differ{'' if many else 's'} between ranks that "
                         f"{'their' if many else 'its'} SBP says hold the same values: "
                         f"{shown}. {FIX}")
