"""Placement: a device kind plus an N-D mesh of ranks.

A placement says *where* a global tensor lives; its SBP (see :mod:`ctensor.sbp`) says
how the tensor is laid out over each mesh axis. Placements are immutable, hashable and
compare by value. This module is pure: it knows ranks, not communicators.
"""
from __future__ import annotations

from functools import cached_property
import numpy as np

__all__ = ["placement", "Placement", "DEVICES"]

DEVICES = ("cpu", "cuda")


class Placement:
    """A device kind (``"cpu"`` or ``"cuda"``) and a mesh of distinct ranks.

    >>> ct.placement("cpu", [0, 1, 2, 3])            # 1-D mesh of 4 ranks
    placement('cpu', [0, 1, 2, 3])
    >>> ct.placement("cpu", [[0, 1], [2, 3]]).shape  # 2x2 mesh
    (2, 2)
    """

    __slots__ = ("_device", "_ranks", "__dict__")

    def __init__(self, device: str, ranks):
        if not isinstance(device, str) or device not in DEVICES:
            raise ValueError(f"placement: argument 'device' must be one of {DEVICES}, "
                             f"got {device!r}")
        if isinstance(ranks, (int, np.integer)) and not isinstance(ranks, bool):
            ranks = [ranks]
        try:
            arr = np.array(ranks, dtype=object)
        except Exception as exc:  # ragged nested lists
            raise ValueError(f"placement: argument 'ranks' must be a list or nested list of "
                             f"ranks forming a rectangular mesh, got {ranks!r}") from exc
        if arr.ndim == 0 or arr.size == 0:
            raise ValueError(f"placement: argument 'ranks' must be a non-empty list or nested "
                             f"list of ranks, got {ranks!r}")
        flat = arr.ravel().tolist()
        for r in flat:
            if isinstance(r, (list, tuple, np.ndarray)):
                raise ValueError(f"placement: argument 'ranks' must form a rectangular mesh "
                                 f"(every row the same length), got {ranks!r}")
            if isinstance(r, bool) or not isinstance(r, (int, np.integer)):
                raise TypeError(f"placement: argument 'ranks' must hold ints forming a "
                                f"rectangular mesh, got {ranks!r}")
            if r < 0 or r >= 2**31:
                raise ValueError(f"placement: argument 'ranks' holds rank {r}; ranks are "
                                 f"0..world_size-1")
        flat = [int(r) for r in flat]
        if len(set(flat)) != len(flat):
            dup = sorted({r for r in flat if flat.count(r) > 1})
            raise ValueError(f"placement: argument 'ranks' holds duplicate ranks {dup} in "
                             f"{ranks!r}; each rank may appear once")
        self._device = device
        self._ranks = np.array(flat, dtype=np.int64).reshape(arr.shape)
        self._ranks.setflags(write=False)

    # ------------------------------------------------------------------ identity
    @classmethod
    def all(cls, device: str | None = None) -> "Placement":
        """Every rank of the current world as a 1-D mesh (device: the default device)."""
        from . import runtime
        return cls(device or runtime.default_device(), list(range(runtime.world_size())))

    @property
    def device(self) -> str:
        return self._device

    @property
    def ranks(self) -> np.ndarray:
        """The mesh as a read-only integer array of shape :attr:`shape`."""
        return self._ranks

    @property
    def shape(self) -> tuple[int, ...]:
        return self._ranks.shape

    @property
    def ndim(self) -> int:
        return self._ranks.ndim

    @property
    def size(self) -> int:
        return self._ranks.size

    @cached_property
    def rank_list(self) -> tuple[int, ...]:
        """The ranks in mesh (row-major) order."""
        return tuple(int(r) for r in self._ranks.ravel())

    @cached_property
    def _key(self):
        return (self._device, self.shape, self.rank_list)

    def __eq__(self, other) -> bool:
        return isinstance(other, Placement) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        return f"placement({self._device!r}, {self._ranks.tolist()})"

    def __contains__(self, rank: int) -> bool:
        return rank in self._coords

    # ------------------------------------------------------------------ geometry
    @cached_property
    def _coords(self) -> dict[int, tuple[int, ...]]:
        return {int(r): tuple(int(i) for i in idx) for idx, r in np.ndenumerate(self._ranks)}

    def coord(self, rank: int) -> tuple[int, ...]:
        """Mesh coordinate of ``rank`` (``KeyError`` if the rank is not in the mesh)."""
        return self._coords[rank]

    @cached_property
    def _axis_groups(self) -> dict:
        return {}

    def axis_group(self, rank: int, mesh_axis: int) -> tuple[int, ...]:
        """The ranks along ``mesh_axis`` through ``rank``'s coordinate, in mesh order (made
        once per rank and axis: every collective asks)."""
        groups = self._axis_groups
        group = groups.get((rank, mesh_axis))
        if group is None:
            idx = list(self.coord(rank))
            idx[mesh_axis] = slice(None)
            group = groups[(rank, mesh_axis)] = tuple(int(r) for r in self._ranks[tuple(idx)])
        return group

    def check_world(self, world_size: int, fn: str) -> None:
        """Raise ``ValueError`` if a rank lies outside ``0..world_size-1``."""
        bad = [r for r in self.rank_list if r >= world_size]
        if bad:
            raise ValueError(f"{fn}: placement {self!r} names ranks {bad} outside the world of "
                             f"{world_size} rank(s) (valid ranks: 0..{world_size - 1})")


class _PlacementFactory:
    """``ct.placement(device, ranks)`` builds a :class:`Placement`; ``ct.placement.all()``
    spans the world. ``isinstance(p, ct.placement)`` works as with a class."""

    def __call__(self, device: str, ranks) -> Placement:
        return Placement(device, ranks)

    @staticmethod
    def all(device: str | None = None) -> Placement:
        return Placement.all(device)

    def __instancecheck__(self, obj) -> bool:
        return isinstance(obj, Placement)

    def __repr__(self) -> str:
        return "ct.placement"


placement = _PlacementFactory()
