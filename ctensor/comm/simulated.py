"""In-process backend: one process holds every rank's shard; collectives are array maths.

Also the backend of a plain single-process run (a world of one rank).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from .. import quiet
from ..arrays import array_module
from .base import Communicator, Group, Message, Shards, contiguous


def _xp(arr):
    return array_module(arr)


class SimulatedCommunicator(Communicator):
    """Holds ranks ``0..size-1``; every group member's buffer is present in each call."""

    def __init__(self, size: int):
        self.size = size
        self.held_ranks = tuple(range(size))

    def _ordered(self, group: Group, bufs: Shards) -> list:
        missing = [r for r in group if r not in bufs]
        if missing:
            raise RuntimeError(f"simulated collective: no buffer for ranks {missing} of group "
                               f"{group}")
        return [bufs[r] for r in group]

    def all_reduce(self, group, bufs, op):
        parts = self._ordered(group, bufs)
        xp = _xp(parts[0])
        total = parts[0].copy()
        token = quiet.off()  # a float16 overflow is inf without a warning, as MPI's C sum
        try:
            for p in parts[1:]:
                total = op.reduce(xp, total, p)
        finally:
            quiet.restore(token)
        total = xp.asarray(total)  # 0-d arithmetic yields scalars
        # every rank gets its own copy so no two shards alias one buffer
        return {r: (total if i == 0 else total.copy()) for i, r in enumerate(group)}

    def all_gather(self, group, bufs, dim, sizes):
        parts = self._ordered(group, bufs)
        xp = _xp(parts[0])
        full = xp.concatenate(parts, axis=dim)
        return {r: (full if i == 0 else full.copy()) for i, r in enumerate(group)}

    def reduce_scatter(self, group, bufs, op, dim, sizes):
        total = self.all_reduce(group, bufs, op)[group[0]]
        out, start = {}, 0
        for r, n in zip(group, sizes):
            idx = [slice(None)] * total.ndim
            idx[dim] = slice(start, start + n)
            out[r] = contiguous(total[tuple(idx)])
            start += n
        return out

    def all_to_all(self, group, bufs, split_dim, split_sizes, concat_dim, concat_sizes):
        parts = self._ordered(group, bufs)
        xp = _xp(parts[0])
        offsets = [0]
        for n in split_sizes:
            offsets.append(offsets[-1] + n)
        out = {}
        for j, r in enumerate(group):
            pieces = []
            for src in parts:
                idx = [slice(None)] * src.ndim
                idx[split_dim] = slice(offsets[j], offsets[j + 1])
                pieces.append(src[tuple(idx)])
            out[r] = xp.concatenate(pieces, axis=concat_dim)
        return out

    def exchange(self, messages: Sequence[Message], sends: Mapping[Message, Any]) -> dict:
        return {m: sends[m] for m in messages}

    def all_gather_object(self, group, objs):
        values = [objs[r] for r in group]
        return {r: list(values) for r in group}
