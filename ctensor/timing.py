"""The step profile's hooks: the one flag the instrumented modules test, and the regions
they open (see :mod:`ctensor.profile`, which owns the profile they charge). A leaf module,
so that the communicator (which the runtime imports) can be instrumented without an import
circle.
"""
from __future__ import annotations


__all__ = ["COLUMNS", "phase", "on"]

#: the table's columns, in order
COLUMNS = ("forward kernels", "backward kernels", "dispatch/tape", "boxing copies",
           "collectives", "waiting", "optimizer", "step plan", "rest")
FWD, BWD, DISPATCH, BOXING, COLL, WAIT, OPT, PLAN, REST = range(9)

#: True while a profile is open (the one flag the hooks test)
on = False
_active = None  # the open ctensor.profile.profile


# ----------------------------------------------------------------------------- hooks
# (called by dispatch, autograd, boxing, gradsync and the MPI communicator only while
# ``on`` is True)
def outer(opdef) -> bool:
    """apply()'s test: whether this call should open ``opdef``'s region (False for the
    call that :func:`op` itself makes)."""
    p = _active
    if p is None:
        return False
    if p._entering is opdef:
        p._entering = None
        return False
    return True


def op(apply, opdef, tensors, attrs):
    """Run ``apply(opdef, tensors, attrs)`` as one op's region (dispatch/tape)."""
    p = _active
    p._enter(p._column(DISPATCH), opdef.name)
    p._entering = opdef
    try:
        return apply(opdef, tensors, attrs)
    finally:
        p._entering = None
        if _active is p:
            p._exit()


def kernel_enter(opdef) -> bool:
    """Open an op's kernel region; ``True`` when one was opened (close it with
    :func:`leave`)."""
    p = _active
    if p is None:
        return False
    p._enter(p._column(FWD), opdef.name)
    return True


def enter(kind: int, name: str) -> bool:
    """Open a region of column ``kind`` (BOXING, COLL, WAIT, PLAN); close it with
    :func:`leave`."""
    p = _active
    if p is None:
        return False
    p._enter(kind, name)
    return True


def leave() -> None:
    p = _active
    if p is not None and p._stack:
        p._exit()


class phase:
    """``with ct.debug.profile.phase("optimizer"):``: charge what runs inside to that
    phase (``"backward"`` or ``"optimizer"``); a no-op when no profile is open. The
    optimizer and ``backward()`` open theirs themselves."""

    __slots__ = ("name", "opened")

    def __init__(self, name: str):
        if name not in ("backward", "optimizer"):
            raise ValueError(f"profile.phase: argument 'name' must be 'backward' or "
                             f"'optimizer', got {name!r}")
        self.name = name
        self.opened = None

    def __enter__(self) -> "phase":
        p = _active
        if p is not None:
            p._phase.append(self.name)
            p._enter(DISPATCH if self.name == "backward" else OPT, self.name)
            self.opened = p
        return self

    def __exit__(self, *exc) -> None:
        p = self.opened
        if p is not None and _active is p:
            p._exit()
            p._phase.pop()
