"""Host-staged backend: CuPy buffers moved through the MPI communicator.

Used for ``cuda`` placements in MPI mode when NCCL cannot serve the job (NCCL missing, or
several ranks sharing one GPU, which NCCL refuses); :func:`ctensor.comm.nccl.cuda_communicator`
chooses it and says so once. Each collective copies this rank's device buffer to the host,
runs the MPI collective of the wrapped :class:`~ctensor.comm.mpi.MPICommunicator` (with its
timeouts and debug checks) and copies the result back to the device. The copies synchronise
the host with the current stream; this path is for correctness where NCCL is unavailable,
not for speed.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from .base import Communicator, HostWrapper, Message, Pending

__all__ = ["StagedCommunicator"]


class StagedCommunicator(HostWrapper):
    """Wraps a host communicator; arrays go device -> host -> MPI -> host -> device.

    ``xp`` is the device array module (default: CuPy, through :func:`ctensor._device.module`);
    it needs ``asarray`` and ``asnumpy``.
    """

    backend_name = "host-staged"
    #: exchange() takes device arrays as they are (it stages them itself)
    device_arrays = True

    def __init__(self, host: Communicator, xp=None):
        super().__init__(host)
        self._xp = xp

    def _array_module(self):
        if self._xp is None:
            from .. import _device
            self._xp = _device.module()
        return self._xp

    def _down(self, bufs: Mapping) -> dict:
        xp = self._array_module()
        return {r: (a if type(a) is np.ndarray else xp.asnumpy(a)) for r, a in bufs.items()}

    def _up(self, bufs: Mapping) -> dict:
        xp = self._array_module()
        return {r: xp.asarray(a) for r, a in bufs.items()}

    def all_reduce(self, group, bufs, op):
        return self._up(self._host.all_reduce(group, self._down(bufs), op))

    def all_gather(self, group, bufs, dim, sizes):
        return self._up(self._host.all_gather(group, self._down(bufs), dim, sizes))

    def reduce_scatter(self, group, bufs, op, dim, sizes):
        return self._up(self._host.reduce_scatter(group, self._down(bufs), op, dim, sizes))

    def all_to_all(self, group, bufs, split_dim, split_sizes, concat_dim, concat_sizes):
        return self._up(self._host.all_to_all(group, self._down(bufs), split_dim, split_sizes,
                                              concat_dim, concat_sizes))

    def exchange(self, messages: Sequence[Message], sends: Mapping[Message, Any]) -> dict:
        return self._up(self._host.exchange(messages, self._down(sends)))

    def exchange_start(self, messages: Sequence[Message], sends: Mapping[Message, Any]) -> Pending:
        """The host communicator's nonblocking exchange of host copies; the result is copied
        to the device when waited for."""
        pending = self._host.exchange_start(messages, self._down(sends))
        return Pending(wait=lambda: self._up(pending.wait()), test=pending.test)

    def all_gather_object(self, group, objs):
        return self._host.all_gather_object(group, objs)

    def barrier(self) -> None:
        self._host.barrier()
