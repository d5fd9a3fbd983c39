"""Exception types of ctensor.

Bad arguments are plain ``ValueError`` / ``TypeError`` raised before any communication.
The errors below are about the *ranks of a job disagreeing*: they come from the MPI
collectives (see :mod:`ctensor.comm.watchdog`). Once one is raised, the ranks no longer
agree on which collectives they run, so the job cannot safely run further collectives:
let it propagate, and the MPI excepthook installed by ctensor aborts the whole job
(every rank that detected the problem prints its own view first).
"""


class CollectiveError(RuntimeError):
    """Base of the errors that mean the ranks of a job no longer agree; not recoverable."""


class DivergenceError(CollectiveError):
    """Ranks reached different collectives (different op, shapes, SBP or sequence number).

    Always checked with one tiny all-reduce of a 64-bit digest before each collective's
    data moves, so ranks that disagree raise it on every member instead of exchanging
    garbage; in debug mode (``CTENSOR_DEBUG=1`` or :func:`ct.debug.check_consistency`)
    also for ranks that reached collectives of different groups; and always for ranks about
    to create different communicators (a group's ranks listed in another order, say). The
    message names what each rank was doing.
    """


class CommTimeoutError(CollectiveError):
    """A collective waited longer than ``CTENSOR_TIMEOUT`` seconds (default 60) for other
    ranks; the message names the op, the ranks it waited for and, where they answered,
    what those ranks were doing instead, and says how to turn on ``CTENSOR_DEBUG=1`` and
    how to raise ``CTENSOR_TIMEOUT``."""


class RankExitedError(CollectiveError):
    """A rank that this rank waits for in a collective has finished its script instead
    (reached its end, returned from ``main`` or called ``sys.exit``). Raised within about
    a second of that rank's exit; the message names the rank, where it left and what this
    rank was waiting in."""


class MetaModeError(RuntimeError):
    """A value was asked of a tensor in a shape-only world (``ct.simulate(n, meta=True)``):
    such tensors are their layouts and hold no data, so ``numpy()``, ``item()``,
    ``to_local()`` and the like cannot answer. Take values in a real run; in a plan, keep
    control flow that depends on values out of the script (or branch on
    ``ct.runtime.is_meta()``)."""
