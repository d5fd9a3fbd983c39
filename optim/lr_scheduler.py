"""Learning-rate schedulers (PyTorch's interface): ``StepLR``, ``CosineAnnealingLR``,
``LambdaLR`` and :func:`cosine_with_warmup`.

A scheduler sets ``group["lr"]`` of its optimizer's parameter groups; call ``step()`` once
per epoch (or per iteration, as the schedule was designed). Schedules are closed forms of
the step count, so ``state_dict`` / ``load_state_dict`` restore them exactly.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence, Union

from .optimizer import Optimizer

__all__ = ["LRScheduler", "StepLR", "CosineAnnealingLR", "LambdaLR", "cosine_with_warmup"]


class LRScheduler:
    """Base class: ``base_lrs`` are the groups' initial learning rates; subclasses give
    ``lr_at(base_lr, step)``.

    >>> sched = optim.StepLR(opt, step_size=10, gamma=0.5)
    >>> for epoch in range(30):
    ...     train_one_epoch(); sched.step()
    """

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(self).__name__}: argument 'optimizer' must be a "
                            f"ctensor.optim optimizer, got {type(optimizer).__name__}")
        self.optimizer = optimizer
        for g in optimizer.param_groups:
            g.setdefault("initial_lr", g["lr"])
        self.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._last_lr: list = []
        self.step()

    def lr_at(self, base_lr: float, step: int) -> float:
        raise TypeError(f"{type(self).__name__}: schedulers must define lr_at")

    def get_lr(self) -> list:
        """The learning rates for the current step."""
        return [self.lr_at(base, self.last_epoch) for base in self.base_lrs]

    def step(self) -> None:
        """Advance one step and set the groups' ``lr``."""
        self.last_epoch += 1
        self._last_lr = self.get_lr()
        for g, lr in zip(self.optimizer.param_groups, self._last_lr):
            g["lr"] = lr

    def get_last_lr(self) -> list:
        """The learning rates the last ``step()`` set."""
        return list(self._last_lr)

    def state_dict(self) -> dict:
        """Everything but the optimizer (and functions, which cannot be saved)."""
        return {k: v for k, v in self.__dict__.items()
                if k != "optimizer" and not callable(v) and k != "lr_lambdas"}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore what :meth:`state_dict` returned and set the groups' ``lr``."""
        self.__dict__.update(state_dict)
        for g, lr in zip(self.optimizer.param_groups, self._last_lr):
            g["lr"] = lr


class StepLR(LRScheduler):
    """``lr = base_lr * gamma ** (step // step_size)``."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1,
                 last_epoch: int = -1):
        if isinstance(step_size, bool) or not isinstance(step_size, int) or step_size <= 0:
            raise ValueError(f"StepLR: argument 'step_size' must be a positive int, got "
                             f"{step_size!r}")
        self.step_size, self.gamma = step_size, float(gamma)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, step: int) -> float:
        return base_lr * self.gamma ** (step // self.step_size)


class CosineAnnealingLR(LRScheduler):
    """``lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * step / T_max)) / 2``."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0,
                 last_epoch: int = -1):
        if isinstance(T_max, bool) or not isinstance(T_max, int) or T_max <= 0:
            raise ValueError(f"CosineAnnealingLR: argument 'T_max' must be a positive int, "
                             f"got {T_max!r}")
        self.T_max, self.eta_min = T_max, float(eta_min)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, step: int) -> float:
        return self.eta_min + (base_lr - self.eta_min) * (
            1.0 + math.cos(math.pi * step / self.T_max)) / 2.0


class LambdaLR(LRScheduler):
    """``lr = base_lr * lr_lambda(step)`` (one function, or one per parameter group)."""

    def __init__(self, optimizer: Optimizer,
                 lr_lambda: Union[Callable[[int], float], Sequence[Callable[[int], float]]],
                 last_epoch: int = -1):
        n = len(optimizer.param_groups) if isinstance(optimizer, Optimizer) else 0
        if callable(lr_lambda):
            self.lr_lambdas = [lr_lambda] * n
        else:
            lambdas = list(lr_lambda)
            if len(lambdas) != n or not all(callable(f) for f in lambdas):
                raise ValueError(f"LambdaLR: argument 'lr_lambda' must be a function or a "
                                 f"list of {n} functions (one per parameter group), got "
                                 f"{lr_lambda!r}")
            self.lr_lambdas = lambdas
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        return [base * f(self.last_epoch) for base, f in zip(self.base_lrs, self.lr_lambdas)]


def cosine_with_warmup(optimizer: Optimizer, warmup_steps: int, total_steps: int,
                       min_lr_ratio: float = 0.0) -> LambdaLR:
    """Linear warm-up from ``base_lr / warmup_steps`` to ``base_lr`` over ``warmup_steps``,
    then cosine decay to ``min_lr_ratio * base_lr`` at ``total_steps`` (constant after).

    >>> sched = optim.cosine_with_warmup(opt, warmup_steps=100, total_steps=2000)
    """
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"cosine_with_warmup: argument 'warmup_steps' must be an int >= 0, "
                         f"got {warmup_steps!r}")
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or \
            total_steps <= warmup_steps:
        raise ValueError(f"cosine_with_warmup: argument 'total_steps' must be an int > "
                         f"warmup_steps ({warmup_steps}), got {total_steps!r}")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"cosine_with_warmup: argument 'min_lr_ratio' must be in [0, 1], "
                         f"got {min_lr_ratio!r}")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return LambdaLR(optimizer, factor)
