"""Exception types of ctensor."""


class DivergenceError(RuntimeError):
    """Ranks reached different collectives (different op, shapes, SBP or sequence number)."""


class CommTimeoutError(RuntimeError):
    """A collective waited longer than ``CTENSOR_TIMEOUT`` seconds for other ranks."""
