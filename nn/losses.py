"""Loss functions (``F.cross_entropy``, ``F.nll_loss``, ``F.mse_loss``, ...) and their modules
(``nn.CrossEntropyLoss``, ``nn.MSELoss``, ...), with PyTorch's arguments and semantics.

Every loss is a composition of registered ops, so it runs on any placement and SBP:

* class-index losses take PyTorch's layouts: input ``(C,)``, ``(N, C)`` or ``(N, C, d1, ...)``
  (the class dim is 1 when there are more than two dims) with target ``()``, ``(N,)`` or
  ``(N, d1, ...)``. Internally the class dim is moved last (``permute``) and the per-target
  loss is :func:`ctensor.softmax_cross_entropy` (fused) or ``log_softmax`` and
  :func:`ctensor.pick`; a class-split input is never gathered (max via P(max), sums via P,
  the target value via ``pick``: P).
* elementwise losses (``mse_loss``, ``l1_loss``, ``smooth_l1_loss``, ``huber_loss``, the binary
  cross entropies) keep every split; their mean is a sum over ranks.

``reduction="mean"`` of a class-index loss divides by the summed weight of the targets that
are not ``ignore_index`` (their number without ``weight``), as PyTorch: all ignored gives nan.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

import ctensor as ct

from ._checks import (check_float, check_probability, check_same_shape, check_tensor,
                      legacy_reduction)
from ._checks import reduce as apply_reduction
from .module import Module

__all__ = ["cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
           "binary_cross_entropy", "binary_cross_entropy_with_logits",
           "CrossEntropyLoss", "NLLLoss", "MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss",
           "BCELoss", "BCEWithLogitsLoss", "kl_div", "KLDivLoss"]


# ----------------------------------------------------------------------------- layout
def _class_last(fn: str, x, target):
    """``(x, target, squeeze)`` with the class dim of ``x`` moved last (PyTorch's ``(C,)``,
    ``(N, C)``, ``(N, C, d...)`` -> ``(1, C)``, ``(N, C)``, ``(N, d..., C)``)."""
    if x.ndim == 0:
        raise ValueError(f"{fn}: input must have a class dim, got a 0-d tensor; accepted: "
                         f"(C,), (N, C) or (N, C, d1, ...)")
    squeeze = x.ndim == 1
    if squeeze:
        x, target = x.unsqueeze(0), target.unsqueeze(0)
    elif x.ndim > 2:
        x = x.permute(0, *range(2, x.ndim), 1)
        if target.dtype.kind == "f" and target.ndim == x.ndim:
            target = target.permute(0, *range(2, target.ndim), 1)
    return x, target, squeeze


def _check_index_target(fn: str, x, target, original_shape) -> None:
    if tuple(target.shape) != tuple(x.shape[:-1]):
        n, rest = original_shape[:1], original_shape[2:]
        expected = "()" if len(original_shape) == 1 else str(tuple(n) + tuple(rest))
        hint = ""
        if len(original_shape) > 2 and tuple(target.shape) == tuple(original_shape[:-1]):
            hint = ("; the class dim is dim 1 (PyTorch's (N, C, d1, ...) layout): for "
                    "class-last logits (B, T, C) pass logits.flatten(0, -2) and "
                    "target.flatten(), or logits.transpose(1, 2)")
        raise ValueError(f"{fn}: target of shape {tuple(target.shape)} does not match input "
                         f"of shape {tuple(original_shape)}; accepted: class ids of shape "
                         f"{expected}, or class probabilities of the input's shape{hint}")


def _check_weight(fn: str, weight, classes: int) -> None:
    if weight is None:
        return
    check_float(fn, "weight", weight)
    if tuple(weight.shape) != (classes,):
        raise ValueError(f"{fn}: argument 'weight' has shape {tuple(weight.shape)}, accepted "
                         f"({classes},): one weight per class")


def _target_weights(x, target, weight, ignore_index: int, dtype):
    """Per-target weights ``weight[target]`` (ones without ``weight``), 0 where ignored."""
    valid = target != ignore_index
    if weight is None:
        return valid.to(dtype)
    table = weight.to(dtype).expand(*x.shape)
    return ct.where(valid, ct.pick(table, target, ignore_index=ignore_index), 0.0)


def _reduce_weighted(per, weights, reduction: str):
    if reduction == "none":
        return per
    total = per.sum()
    return total if reduction == "sum" else total / weights.sum()


# ----------------------------------------------------------------------------- class losses
def cross_entropy(input, target, weight=None, size_average=None,  # noqa: A002 - PyTorch's
                  ignore_index: int = -100, reduce=None, reduction: str = "mean",
                  label_smoothing: float = 0.0):
    """Softmax cross entropy of ``input`` logits against class ids or class probabilities.

    Layouts as PyTorch: ``input`` ``(C,)``, ``(N, C)`` or ``(N, C, d1, ...)`` (class dim 1);
    ``target`` integer ids ``()``, ``(N,)`` or ``(N, d1, ...)``, or floating probabilities
    of ``input``'s shape. ``weight`` ``(C,)`` rescales each class; ``label_smoothing`` ``e``
    mixes the target with the uniform distribution: ``(1 - e) * nll + e / C * sum_c -w_c
    log p_c``. ``reduction="mean"`` divides by the summed weight of the non-ignored targets
    (by the number of targets for probabilities). For float16 logits the mean or sum is
    reduced and returned in float32 (as under PyTorch's autocast; with ``weight``, smoothing
    or probabilities the whole loss is computed in float32).

    Without ``weight`` and smoothing the per-target loss is one fused op
    (:func:`ctensor.softmax_cross_entropy`); class-split logits are never gathered.

    >>> loss = F.cross_entropy(logits, targets, label_smoothing=0.1)     # (N, C), (N,)
    >>> loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())   # (B, T, C)
    """
    fn = "cross_entropy"
    check_float(fn, "input", input)
    check_tensor(fn, "target", target)
    reduction = legacy_reduction(fn, size_average, reduce, reduction)
    eps = check_probability(fn, "label_smoothing", label_smoothing)
    shape = tuple(input.shape)
    x, t, squeeze = _class_last(fn, input, target)
    classes = x.shape[-1]
    _check_weight(fn, weight, classes)
    half = x.dtype == np.float16
    if t.dtype.kind == "f":
        return _soft_cross_entropy(fn, x.float() if half else x, t, weight, eps, reduction,
                                   shape, squeeze)
    if t.dtype.kind not in "iu":
        raise TypeError(f"{fn}: argument 'target' must hold integer class ids or floating "
                        f"class probabilities, got {t.dtype}")
    _check_index_target(fn, x, t, shape)
    ignore_index = int(ignore_index)
    if weight is None and eps == 0.0:
        per = ct.softmax_cross_entropy(x, t, ignore_index=ignore_index)
        if reduction == "none":
            return per.squeeze(0) if squeeze else per
        # float16: the kernel works in float32 inside; a float16 sum of many per-target
        # losses overflows (65504) or loses its digits: reduce in float32, as autocast does
        per = per.float() if half else per
        weights = _target_weights(x, t, None, ignore_index, per.dtype)
    else:
        x = x.float() if half else x  # the statistics in float32 (autocast's rule)
        weights = _target_weights(x, t, weight, ignore_index, x.dtype)
        logp = ct.log_softmax(x, -1)
        valid = t != ignore_index
        per = ct.where(valid, -ct.pick(logp, t, ignore_index=ignore_index), 0.0)
        if weight is not None:
            per = per * weights
        if eps:
            wlogp = logp if weight is None else logp * weight.to(x.dtype)
            smooth = ct.where(valid, -wlogp.sum(-1), 0.0)
            per = per * (1.0 - eps) + smooth * (eps / classes)
    if squeeze and reduction == "none":
        return per.squeeze(0)
    return _reduce_weighted(per, weights, reduction)


def _soft_cross_entropy(fn, x, target, weight, eps, reduction, shape, squeeze):
    """Cross entropy against class probabilities ``target`` (class dim last here)."""
    if tuple(target.shape) != tuple(x.shape):
        raise ValueError(f"{fn}: probability target of shape {tuple(target.shape)} does not "
                         f"match input of shape {shape}; accepted: the input's shape")
    classes = x.shape[-1]
    target = target.to(x.dtype)
    if eps:
        target = target * (1.0 - eps) + eps / classes
    terms = ct.log_softmax(x, -1) * target
    if weight is not None:
        terms = terms * weight.to(x.dtype)
    per = -terms.sum(-1)
    if squeeze:
        per = per.squeeze(0)
    return apply_reduction(per, reduction)


def nll_loss(input, target, weight=None, size_average=None,  # noqa: A002 - PyTorch's name
             ignore_index: int = -100, reduce=None, reduction: str = "mean"):
    """Negative log likelihood ``-weight[t] * input[t]`` of log-probabilities ``input``
    (``(C,)``, ``(N, C)`` or ``(N, C, d1, ...)``) at class ids ``target``; 0 where
    ``target == ignore_index``. ``"mean"`` divides by the summed weight of the non-ignored
    targets.

    >>> loss = F.nll_loss(F.log_softmax(logits, dim=1), targets)
    """
    fn = "nll_loss"
    check_float(fn, "input", input)
    check_tensor(fn, "target", target)
    if target.dtype.kind not in "iu":
        raise TypeError(f"{fn}: argument 'target' must be an integer tensor of class ids, got "
                        f"{target.dtype}; convert it with .long()")
    reduction = legacy_reduction(fn, size_average, reduce, reduction)
    shape = tuple(input.shape)
    x, t, squeeze = _class_last(fn, input, target)
    _check_index_target(fn, x, t, shape)
    _check_weight(fn, weight, x.shape[-1])
    ignore_index = int(ignore_index)
    weights = _target_weights(x, t, weight, ignore_index, x.dtype)
    per = ct.where(t != ignore_index, -ct.pick(x, t, ignore_index=ignore_index), 0.0)
    if weight is not None:
        per = per * weights
    if squeeze and reduction == "none":
        return per.squeeze(0)
    return _reduce_weighted(per, weights, reduction)


# ----------------------------------------------------------------------------- elementwise
def _pair(fn: str, input, target):  # noqa: A002
    check_float(fn, "input", input)
    check_tensor(fn, "target", target)
    check_same_shape(fn, input, target)
    return input - target.to(input.dtype)


def _weighted(fn: str, loss, input, weight, reduction: str,  # noqa: A002
              by_weight: bool = True):
    """PyTorch's elementwise ``weight`` (the input's shape): ``sum(w * loss) / sum(w)`` for
    ``"mean"`` (``by_weight=False``: the plain mean of ``w * loss``, as PyTorch's
    ``huber_loss`` does)."""
    if weight is None:
        return apply_reduction(loss, reduction)
    check_float(fn, "weight", weight)
    if tuple(weight.shape) != tuple(input.shape):
        raise ValueError(f"{fn}: argument 'weight' has shape {tuple(weight.shape)}; accepted "
                         f"the input's shape {tuple(input.shape)}")
    weight = weight.to(loss.dtype)
    loss = loss * weight
    if reduction == "mean" and by_weight:
        return loss.sum() / weight.sum()
    return apply_reduction(loss, reduction)


def mse_loss(input, target, size_average=None, reduce=None,  # noqa: A002 - PyTorch's name
             reduction: str = "mean", weight=None):
    """Mean squared error ``(input - target) ** 2``, reduced (``weight``: elementwise, the
    mean then divides by its sum).

    >>> loss = F.mse_loss(pred, y)
    """
    reduction = legacy_reduction("mse_loss", size_average, reduce, reduction)
    d = _pair("mse_loss", input, target)
    return _weighted("mse_loss", d * d, input, weight, reduction)


def l1_loss(input, target, size_average=None, reduce=None,  # noqa: A002 - PyTorch's name
            reduction: str = "mean", weight=None):
    """Mean absolute error ``|input - target|``, reduced (``weight`` as :func:`mse_loss`).

    >>> loss = F.l1_loss(pred, y, reduction="sum")
    """
    reduction = legacy_reduction("l1_loss", size_average, reduce, reduction)
    return _weighted("l1_loss", _pair("l1_loss", input, target).abs(), input, weight,
                     reduction)


def smooth_l1_loss(input, target, size_average=None, reduce=None,  # noqa: A002
                   reduction: str = "mean", beta: float = 1.0):
    """``0.5 d^2 / beta`` where ``|d| < beta``, else ``|d| - 0.5 beta`` (``d = input -
    target``); ``beta=0`` is the L1 loss.

    >>> loss = F.smooth_l1_loss(pred, y, beta=0.5)
    """
    fn = "smooth_l1_loss"
    reduction = legacy_reduction(fn, size_average, reduce, reduction)
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or beta < 0:
        raise ValueError(f"{fn}: argument 'beta' must be a number >= 0, got {beta!r}")
    a = _pair(fn, input, target).abs()
    if beta == 0:
        return apply_reduction(a, reduction)
    return apply_reduction(ct.where(a < beta, a * a * (0.5 / beta), a - 0.5 * beta),
                               reduction)


def huber_loss(input, target, reduction: str = "mean", delta: float = 1.0,  # noqa: A002
               weight=None):
    """``0.5 d^2`` where ``|d| < delta``, else ``delta (|d| - 0.5 delta)``; with
    ``weight`` the mean is the plain mean of the weighted losses (PyTorch's rule here,
    unlike ``mse_loss`` and ``l1_loss``, which divide by the summed weight).

    >>> loss = F.huber_loss(pred, y, delta=2.0)
    """
    fn = "huber_loss"
    reduction = legacy_reduction(fn, None, None, reduction)
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or delta <= 0:
        raise ValueError(f"{fn}: argument 'delta' must be a number > 0, got {delta!r}")
    a = _pair(fn, input, target).abs()
    return _weighted(fn, ct.where(a < delta, a * a * 0.5, (a - 0.5 * delta) * delta), input,
                     weight, reduction, by_weight=False)


def binary_cross_entropy(input, target, weight=None, size_average=None,  # noqa: A002
                         reduce=None, reduction: str = "mean"):
    """``-(y log p + (1 - y) log(1 - p))`` of probabilities ``input``; each log is clamped
    at -100 as PyTorch does (so ``p`` of 0 or 1 gives a finite loss).

    >>> loss = F.binary_cross_entropy(ct.sigmoid(z), y)
    """
    fn = "binary_cross_entropy"
    reduction = legacy_reduction(fn, size_average, reduce, reduction)
    _pair(fn, input, target)
    y = target.to(input.dtype)
    log_p = ct.clamp(ct.log(input), min=-100.0)
    log_q = ct.clamp(ct.log(1.0 - input), min=-100.0)
    loss = -(y * log_p + (1.0 - y) * log_q)
    if weight is not None:
        check_float(fn, "weight", weight)
        loss = loss * weight.to(input.dtype)
    return apply_reduction(loss, reduction)


def binary_cross_entropy_with_logits(input, target, weight=None,  # noqa: A002
                                     size_average=None, reduce=None, reduction: str = "mean",
                                     pos_weight=None):
    """``-w (pw y log s(x) + (1 - y) log(1 - s(x)))`` with ``s`` the sigmoid, computed stably
    as PyTorch: ``(1 - y) x + (1 + (pw - 1) y) (log(1 + exp(-|x|)) + max(-x, 0))``.
    ``weight`` broadcasts against the input; ``pos_weight`` weighs the positives per class
    (broadcast along the last dim).

    >>> loss = F.binary_cross_entropy_with_logits(z, y, pos_weight=ct.tensor([3.0]))
    """
    fn = "binary_cross_entropy_with_logits"
    reduction = legacy_reduction(fn, size_average, reduce, reduction)
    _pair(fn, input, target)
    y = target.to(input.dtype)
    softplus_neg = ct.log(1.0 + ct.exp(-input.abs())) + ct.relu(-input)  # -log s(x)
    if pos_weight is None:
        loss = (1.0 - y) * input + softplus_neg
    else:
        check_float(fn, "pos_weight", pos_weight)
        loss = (1.0 - y) * input + (1.0 + (pos_weight.to(input.dtype) - 1.0) * y) * softplus_neg
    if weight is not None:
        check_float(fn, "weight", weight)
        loss = loss * weight.to(input.dtype)
    return apply_reduction(loss, reduction)


def kl_div(input, target, size_average=None, reduce=None,  # noqa: A002 - PyTorch's
           reduction: str = "mean", log_target: bool = False):
    """Kullback-Leibler divergence of ``target`` from log-probabilities ``input``:
    ``target * (log(target) - input)`` (0 where ``target`` is 0), or with ``log_target``
    ``exp(target) * (target - input)``. ``reduction="batchmean"`` divides the sum by the
    batch size (the mathematically right mean); ``"mean"`` by the number of elements, as
    PyTorch.

    >>> loss = F.kl_div(F.log_softmax(student, -1), F.softmax(teacher, -1), reduction="batchmean")
    """
    fn = "kl_div"
    if reduction == "batchmean" and size_average is None and reduce is None:
        batchmean = True
    else:
        batchmean, reduction = False, legacy_reduction(fn, size_average, reduce, reduction)
    _pair(fn, input, target)
    t = target.to(input.dtype)
    if log_target:
        loss = ct.exp(t) * (t - input)
    else:
        positive = t > 0
        loss = ct.where(positive, t * (ct.log(ct.where(positive, t, 1.0)) - input), 0.0)
    if batchmean:
        return loss.sum() / (input.shape[0] if input.ndim else 1)
    return apply_reduction(loss, reduction)


# ----------------------------------------------------------------------------- modules
class _Loss(Module):
    """A loss module: its arguments are stored at construction, ``forward(input, target)``
    calls the function."""

    _function = None
    _options: tuple = ()

    def __init__(self, **options):
        super().__init__()
        reduction = legacy_reduction(type(self).__name__, options.pop("size_average", None),
                                     options.pop("reduce", None),
                                     options.pop("reduction", "mean"))
        self.reduction = reduction
        for name, value in options.items():
            if isinstance(value, ct.Tensor):
                self.register_buffer(name, value)
            else:
                setattr(self, name, value)

    def forward(self, input, target):  # noqa: A002 - PyTorch's name
        kwargs = {name: getattr(self, name) for name in self._options}
        return type(self)._function(input, target, reduction=self.reduction, **kwargs)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"


class CrossEntropyLoss(_Loss):
    """``F.cross_entropy`` as a module (``weight`` is a buffer, saved in ``state_dict``).

    >>> criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    >>> loss = criterion(logits, targets)
    """

    _function = staticmethod(cross_entropy)
    _options = ("weight", "ignore_index", "label_smoothing")

    def __init__(self, weight: Optional[ct.Tensor] = None, size_average=None,
                 ignore_index: int = -100, reduce=None, reduction: str = "mean",
                 label_smoothing: float = 0.0):
        check_probability("CrossEntropyLoss", "label_smoothing", label_smoothing)
        super().__init__(weight=weight, size_average=size_average, ignore_index=ignore_index,
                         reduce=reduce, reduction=reduction, label_smoothing=label_smoothing)


class NLLLoss(_Loss):
    """``F.nll_loss`` as a module."""

    _function = staticmethod(nll_loss)
    _options = ("weight", "ignore_index")

    def __init__(self, weight: Optional[ct.Tensor] = None, size_average=None,
                 ignore_index: int = -100, reduce=None, reduction: str = "mean"):
        super().__init__(weight=weight, size_average=size_average, ignore_index=ignore_index,
                         reduce=reduce, reduction=reduction)


class MSELoss(_Loss):
    """``F.mse_loss`` as a module.

    >>> nn.MSELoss()(pred, y)
    """

    _function = staticmethod(mse_loss)

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean"):
        super().__init__(size_average=size_average, reduce=reduce, reduction=reduction)


class L1Loss(_Loss):
    """``F.l1_loss`` as a module."""

    _function = staticmethod(l1_loss)

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean"):
        super().__init__(size_average=size_average, reduce=reduce, reduction=reduction)


class SmoothL1Loss(_Loss):
    """``F.smooth_l1_loss`` as a module."""

    _function = staticmethod(smooth_l1_loss)
    _options = ("beta",)

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean",
                 beta: float = 1.0):
        super().__init__(size_average=size_average, reduce=reduce, reduction=reduction,
                         beta=beta)


class HuberLoss(_Loss):
    """``F.huber_loss`` as a module."""

    _function = staticmethod(huber_loss)
    _options = ("delta",)

    def __init__(self, reduction: str = "mean", delta: float = 1.0):
        super().__init__(reduction=reduction, delta=delta)


class BCELoss(_Loss):
    """``F.binary_cross_entropy`` as a module."""

    _function = staticmethod(binary_cross_entropy)
    _options = ("weight",)

    def __init__(self, weight: Optional[ct.Tensor] = None, size_average=None, reduce=None,
                 reduction: str = "mean"):
        super().__init__(weight=weight, size_average=size_average, reduce=reduce,
                         reduction=reduction)


class BCEWithLogitsLoss(_Loss):
    """``F.binary_cross_entropy_with_logits`` as a module (``weight`` and ``pos_weight``
    are buffers).

    >>> criterion = nn.BCEWithLogitsLoss(pos_weight=ct.ones(5) * 2)
    """

    _function = staticmethod(binary_cross_entropy_with_logits)
    _options = ("weight", "pos_weight")

    def __init__(self, weight: Optional[ct.Tensor] = None, size_average=None, reduce=None,
                 reduction: str = "mean", pos_weight: Optional[ct.Tensor] = None):
        super().__init__(weight=weight, size_average=size_average, reduce=reduce,
                         reduction=reduction, pos_weight=pos_weight)


class KLDivLoss(_Loss):
    """``F.kl_div`` as a module."""

    _options = ("log_target",)

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean",
                 log_target: bool = False):
        batchmean = reduction == "batchmean"
        super().__init__(size_average=size_average, reduce=reduce,
                         reduction="mean" if batchmean else reduction, log_target=log_target)
        if batchmean:
            self.reduction = "batchmean"

    @staticmethod
    def _function(input, target, **kwargs):  # noqa: A002
        return kl_div(input, target, **kwargs)
