"""``ct.inference_mode``: PyTorch's name for a no-grad region, as a context manager and a
decorator (with or without the call)."""
from __future__ import annotations

import contextlib
import functools
from typing import Callable

from . import autograd

__all__ = ["inference_mode"]


class inference_mode:  # noqa: N801 - PyTorch's name
    """Ops inside record nothing on the tape, as under :func:`ct.no_grad` (ctensor has no
    separate inference tensors: this is ``no_grad`` under PyTorch's name). A context
    manager and a decorator, with or without the call: ``@ct.inference_mode``,
    ``@ct.inference_mode()``; ``inference_mode(False)`` changes nothing.

    >>> with ct.inference_mode():
    ...     logits = model(x)
    """

    def __new__(cls, mode=True):
        if callable(mode) and not isinstance(mode, bool):  # used as a bare decorator
            return cls()(mode)
        return super().__new__(cls)

    def __init__(self, mode: bool = True):
        if not isinstance(mode, bool):
            raise TypeError(f"inference_mode: argument 'mode' must be True or False, got "
                            f"{mode!r}")
        self.mode = mode
        self._stack: list = []

    def __enter__(self) -> None:
        context = autograd.no_grad() if self.mode else contextlib.nullcontext()
        context.__enter__()
        self._stack.append(context)

    def __exit__(self, *exc) -> None:
        self._stack.pop().__exit__(*exc)

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(*args, **kwargs):
            with inference_mode(self.mode):
                return fn(*args, **kwargs)
        return run
