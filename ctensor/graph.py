"""Saved-tensor hooks: how the tape keeps what a backward will read (``ct.autograd.graph``).

:func:`saved_tensors_hooks` is PyTorch's ``torch.autograd.graph.saved_tensors_hooks``:
inside the block, every tensor an op saves for its backward goes through ``pack`` when
the op is recorded (:func:`ctensor.tape.record`) and its packed form through ``unpack``
when the backward runs. The innermost pair decides; a pair that wants the ones around it
too calls them (:func:`saved_hooks` gives the innermost pair, before its own is entered).

:func:`regather_saved` is one such pair, built in: a saved input that the op had to gather
is packed as its source and gathered again when unpacked. FSDP's re-gather of a freed
parameter is another, written in ``nn/fsdp.py`` with the public functions only.

A packed value that is a :class:`SelfUnpacking` unpacks itself (``value.unpack(outer)``):
that is how a pack function hands the backward an object that knows how to rebuild its
tensor (``nn/fsdp.py``'s re-gathers may do the same).

This module imports nothing from ctensor: autograd, the tape and nn all stand on it.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Optional

__all__ = ["saved_tensors_hooks", "saved_hooks", "regather_saved", "SelfUnpacking",
           "regathering"]

#: the open ``(pack, unpack)`` pairs, innermost last (read by the tape on every record)
stack: list = []


def saved_hooks() -> Optional[tuple]:
    """The innermost ``(pack, unpack)`` of :func:`saved_tensors_hooks`, or None."""
    return stack[-1] if stack else None


@contextlib.contextmanager
def saved_tensors_hooks(pack: Callable, unpack: Callable) -> Iterator[None]:
    """Inside the block, every tensor an op saves for its backward goes through
    ``pack(tensor) -> anything`` when the op runs and ``unpack(anything) -> tensor`` when
    its backward runs (PyTorch's ``torch.autograd.graph.saved_tensors_hooks``; the
    innermost block decides): the way to keep less memory between forward and backward,
    e.g. to free a gathered parameter after the forward and gather it again for the
    backward. Tensors a backward never reads (its op's ``saves`` leaves them out) are not
    saved, so ``pack`` never sees them.

    >>> with ct.autograd.graph.saved_tensors_hooks(lambda t: t.numpy(),
    ...                                            lambda a: ct.tensor(a)):
    ...     y = (x * w).sum()
    """
    if not callable(pack) or not callable(unpack):
        raise TypeError("saved_tensors_hooks: arguments 'pack' and 'unpack' must be callable")
    pair = (pack, unpack)
    stack.append(pair)
    try:
        yield
    finally:
        _close(pair)


def _close(pair: tuple) -> None:
    """Take ``pair`` off the stack: the last entry that is it (blocks opened and closed by
    module hooks need not nest: FSDP's and sequence parallelism's may close in either
    order)."""
    for i in range(len(stack) - 1, -1, -1):
        if stack[i] is pair:
            del stack[i]
            return


class SelfUnpacking:
    """A packed value that rebuilds its tensor itself: ``unpack(outer_unpack)`` returns
    the tensor (``outer_unpack``: the unpack of the hooks around the ones that packed it,
    or None)."""

    __slots__ = ()

    def unpack(self, outer_unpack: Optional[Callable]):  # pragma: no cover - interface
        raise NotImplementedError


#: the open :func:`regather_saved` blocks, innermost last: each a dict
#: ``id(gathered copy) -> (weak reference to the copy, what packs it)`` that the tape fills
#: as ops inside the block gather inputs their backward reads
_blocks: list = []


def regathering() -> Optional[dict]:
    """The table of the innermost open :func:`regather_saved` block, or None (the tape
    offers it the gathered inputs it saves: ``table[id(copy)] = (ref(copy), packer)``,
    where ``packer((pack, unpack))`` gives the value packed with the innermost pair (None:
keep the copy) and ``packer.release()`` drops the
    shared gathered copy when the block ends)."""
    return _blocks[-1] if _blocks else None


@contextlib.contextmanager
def regather_saved() -> Iterator[None]:
    """Inside the block, an op whose backward reads an input it had to gather (boxed to a
    layout holding more bytes per rank than the input's own, as ``S(1)`` to ``B``) keeps
    the input as it came and gathers it again when its backward runs: the memory of a
    shard instead of the whole between forward and backward, for one more collective in
    the backward (Megatron-LM sequence parallelism's re-gather of a linear layer's input).
    It is a :func:`saved_tensors_hooks` pair: it packs the gathered copy as its source
    (the source itself saved through the innermost pair then, as any saved tensor) and
    regathers on unpack; other tensors go to the hooks around the block. Hooks opened
    inside the block that do not call the ones around them (:func:`saved_hooks`) decide
    for themselves.

    Ops inside the block still share one gathered copy (query, key and value of one
    input); leaving the block drops it, so it lives only as long as something else holds
    it. ``nn.parallel.sequence_parallel`` runs every transformer block (and the LM head)
    inside one. Values and gradients are the same either way.

    >>> with ct.autograd.regather_saved():
    ...     y = x_seq_split @ w           # x is gathered for the matmul; y's backward
    ...                                   # gathers x again instead of keeping the copy
    """
    table: dict = {}
    outer = saved_hooks()
    outer_pack = outer[0] if outer is not None else None
    outer_unpack = outer[1] if outer is not None else None

    def pack(t):
        hit = table.get(id(t))
        if hit is not None and hit[0]() is t:
            # the source is saved as any tensor is now: through the innermost pair (FSDP's
            # inside a sequence-parallel block: a freed parameter is gathered again first)
            packed = hit[1](stack[-1])
            if packed is not None:
                return packed
        return outer_pack(t) if outer_pack is not None else t

    def unpack(value):
        if isinstance(value, SelfUnpacking):
            return value.unpack(outer_unpack)
        return outer_unpack(value) if outer_unpack is not None else value

    pair = (pack, unpack)
    _blocks.append(table)
    stack.append(pair)
    try:
        yield
    finally:
        _close(pair)
        del _blocks[next(i for i in range(len(_blocks) - 1, -1, -1) if _blocks[i] is table)]
        for _, packer in table.values():  # the gathered copies shared inside the block
            packer.release()
