"""Argument checks shared by ``nn.functional``, the loss functions and the layers: each
raises ``TypeError`` / ``ValueError`` naming the function and the argument, before any op
runs (so before any communication)."""
from __future__ import annotations

import warnings

import ctensor as ct

REDUCTIONS = ("mean", "sum", "none")


def check_tensor(fn: str, arg: str, x) -> None:
    """``TypeError`` unless ``x`` is a ``ct.Tensor``."""
    if not isinstance(x, ct.Tensor):
        raise TypeError(f"{fn}: argument '{arg}' must be a ct.Tensor, got "
                        f"{type(x).__name__}")


def check_float(fn: str, arg: str, x) -> None:
    """``TypeError`` unless ``x`` is a floating ``ct.Tensor``."""
    check_tensor(fn, arg, x)
    if x.dtype.kind not in "fc":
        raise TypeError(f"{fn}: argument '{arg}' must be a floating tensor, got {x.dtype}; "
                        f"convert it with .float()")


def check_int(fn: str, arg: str, x) -> None:
    """``TypeError`` unless ``x`` is an integer ``ct.Tensor`` (class ids)."""
    check_tensor(fn, arg, x)
    if x.dtype.kind not in "iu":
        raise TypeError(f"{fn}: argument '{arg}' must be an integer tensor of class ids, got "
                        f"{x.dtype}; convert it with .long()")


def check_probability(fn: str, arg: str, p) -> float:
    """``p`` as a float in [0, 1]; ``ValueError`` naming the function and argument."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{fn}: argument '{arg}' must be a probability in [0, 1], got {p!r}")
    return float(p)


def check_reduction(fn: str, reduction) -> str:
    """``reduction`` if it is one of PyTorch's three, else ``ValueError``."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"{fn}: argument 'reduction' is {reduction!r}, accepted "
                         f"{REDUCTIONS}")
    return reduction


def check_same_shape(fn: str, x, target) -> None:
    """Warn, as PyTorch does, when ``x`` and ``target`` differ in shape (they are then
    broadcast against each other, which is rarely what a loss means)."""
    if tuple(x.shape) != tuple(target.shape):
        warnings.warn(f"{fn}: using a target size {tuple(target.shape)} that is different "
                      f"to the input size {tuple(x.shape)}; this will likely lead to "
                      f"incorrect results due to broadcasting. Please ensure they have the "
                      f"same size.", UserWarning, stacklevel=3)


def reduce(loss, reduction: str):
    """``loss.mean()``, ``loss.sum()`` or ``loss`` itself."""
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


def legacy_reduction(fn: str, size_average, reduce_, reduction: str) -> str:
    """PyTorch's deprecated ``size_average`` / ``reduce`` pair mapped onto ``reduction``
    (``reduce=False``: "none"; ``size_average=False``: "sum"); ``reduction`` otherwise."""
    if size_average is None and reduce_ is None:
        return check_reduction(fn, reduction)
    if reduce_ is not None and not reduce_:
        return "none"
    return "sum" if size_average is not None and not size_average else "mean"
