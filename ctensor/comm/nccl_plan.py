"""Pure planning for the NCCL backend: how a dtype is reduced, where each member's part lies
in a gathered buffer, how an uneven reduce-scatter is padded, the shapes of an all-to-all
and the transfers of a point-to-point exchange — and whether NCCL can serve a set of ranks.

No CuPy, no MPI: these functions are tested on CPU; :mod:`ctensor.comm.nccl` runs them.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..sbp import ReduceOp
from .base import Message

__all__ = ["Staging", "ReducePlan", "reduction_plan", "gather_plan", "pad_plan",
           "all_to_all_plan", "exchange_plan", "nccl_refusal", "NCCL_DTYPES", "NCCL_OPS"]

NCCL_DTYPES = {"int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32",
                "uint32": "NCCL_UINT32", "int64": "NCCL_INT64", "uint64": "NCCL_UINT64",
                "float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32",
                "float64": "NCCL_FLOAT64"}
NCCL_OPS = {ReduceOp.SUM: "NCCL_SUM", ReduceOp.MAX: "NCCL_MAX", ReduceOp.MIN: "NCCL_MIN"}
# dtypes NCCL cannot reduce, widened exactly (a 16-bit sum wraps the same after casting back)
_WIDEN = {"int16": np.dtype(np.int32), "uint16": np.dtype(np.uint32)}


class Staging(enum.Enum):
    """How an array is handed to an NCCL reduction."""

    NATIVE = "native"  # as it is
    VIEW = "view"      # reinterpreted (bool as uint8, complex as pairs of floats)
    CAST = "cast"      # widened copy, cast back after (int16, uint16)


@dataclass(frozen=True)
class ReducePlan:
    staging: Staging
    work: np.dtype
    op: ReduceOp


def reduction_plan(dtype, op: ReduceOp) -> ReducePlan:
    """How to reduce ``dtype`` with ``op`` in NCCL, with the MPI backend's results.

    Bools reduce logically like MPI's LOR/LAND: as uint8 0/1 values, sum and max are 'or'
    (max), min is 'and' (min). Complex sums add real and imaginary parts as floats.
    """
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return ReducePlan(Staging.VIEW, np.dtype(np.uint8),
                          ReduceOp.MIN if op is ReduceOp.MIN else ReduceOp.MAX)
    if dtype.name in NCCL_DTYPES:
        return ReducePlan(Staging.NATIVE, dtype, op)
    if dtype.name in _WIDEN:
        return ReducePlan(Staging.CAST, _WIDEN[dtype.name], op)
    if dtype.kind == "c" and op is ReduceOp.SUM:
        return ReducePlan(Staging.VIEW, np.dtype(f"f{dtype.itemsize // 2}"), op)
    raise TypeError(f"NCCL reduction: dtype {dtype} cannot be reduced with {op.value!r}; "
                    f"accepted: bool, (u)int8/16/32/64, float16/32/64 (and complex for sum); "
                    f"cast the tensor with .to(dtype) first")


def gather_plan(sizes: Sequence[int], row_bytes: int) -> list:
    """``(offset, nbytes)`` of each member's part in the gathered buffer (parts along dim 0
    of rows of ``row_bytes``, in group order)."""
    out, offset = [], 0
    for n in sizes:
        out.append((offset, int(n) * row_bytes))
        offset += int(n) * row_bytes
    return out


def pad_plan(sizes: Sequence[int]) -> tuple:
    """``(width, starts)`` for an uneven reduce-scatter by padding: every part is padded to
    ``width = max(sizes)`` rows; part ``i`` (rows ``starts[i]..starts[i]+sizes[i]`` of the
    input) goes to rows ``i*width..`` of the padded buffer, and member ``i`` keeps the first
    ``sizes[i]`` rows of what it receives."""
    width = max((int(n) for n in sizes), default=0)
    starts, total = [], 0
    for n in sizes:
        starts.append(total)
        total += int(n)
    return width, starts


def all_to_all_plan(shape: Sequence[int], split_dim: int, split_sizes: Sequence[int],
                    concat_dim: int, concat_sizes: Sequence[int], me: int) -> tuple:
    """``(send_shapes, recv_shapes)``: the part member ``me`` sends to each member (its
    array cut along ``split_dim``) and the part it receives from each (``split_dim`` of
    ``me``'s size, ``concat_dim`` of the sender's)."""
    send_shapes, recv_shapes = [], []
    for n in split_sizes:
        s = list(shape)
        s[split_dim] = int(n)
        send_shapes.append(tuple(s))
    for n in concat_sizes:
        s = list(shape)
        s[split_dim] = int(split_sizes[me])
        s[concat_dim] = int(n)
        recv_shapes.append(tuple(s))
    return send_shapes, recv_shapes


def exchange_plan(messages: Sequence[Message], rank: int) -> tuple:
    """``(members, transfers)`` of a point-to-point exchange for ``rank``: the ranks that
    move data between processes, and this rank's ``("send" | "recv", message)`` transfers
    in message order. NCCL matches transfers between one pair in the order they are posted,
    and every rank derives the same order from the same message list."""
    cross = [m for m in messages if m.src != m.dst]
    members = tuple(sorted({r for m in cross for r in (m.src, m.dst)}))
    transfers = []
    for m in cross:
        if m.src == rank:
            transfers.append(("send", m))
        elif m.dst == rank:
            transfers.append(("recv", m))
    return members, transfers


def nccl_refusal(everyone: Sequence[tuple]) -> Optional[str]:
    """Why NCCL cannot serve these ranks (``None`` when it can). ``everyone[r]`` is rank
    ``r``'s ``(node name, GPU bus id, NCCL loadable)``; NCCL refuses two ranks of one
    communicator on the same GPU."""
    missing = [r for r, (_, _, ok) in enumerate(everyone) if not ok]
    if missing:
        return (f"NCCL is not loadable on ranks {missing} (pip install nvidia-nccl-cu13 or -cu12 "
                f"for your CUDA, or pip install -e '.[gpu-cu13]' / '.[gpu-cu12]')")
    seen: dict = {}
    for r, (node, bus, _) in enumerate(everyone):
        seen.setdefault((node, bus), []).append(r)
    shared = [ranks for ranks in seen.values() if len(ranks) > 1]
    if shared:
        return (f"ranks {shared[0]} share one GPU ({len(seen)} GPU(s) for {len(everyone)} "
                f"ranks); NCCL needs one GPU per rank")
    return None
