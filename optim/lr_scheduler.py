"""Learning-rate schedulers (PyTorch's interface): ``StepLR``, ``ExponentialLR``,
``LinearLR``, ``CosineAnnealingLR``, ``LambdaLR``, ``OneCycleLR``, ``SequentialLR`` and
:func:`cosine_with_warmup`.

A scheduler sets ``group["lr"]`` of its optimizer's parameter groups; call ``step()`` once
per epoch (or per iteration, as the schedule was designed). Schedules are closed forms of
the step count, so ``state_dict`` / ``load_state_dict`` restore them exactly; where PyTorch
computes a schedule recursively (``ExponentialLR``, ``LinearLR`` multiply the last lr by a
factor) the values agree with it to rounding (a relative 1e-15 after thousands of steps).
"""
from __future__ import annotations

import bisect
import math
from typing import Callable, Optional, Sequence, Union

from .optimizer import Optimizer

__all__ = ["LRScheduler", "StepLR", "ExponentialLR", "LinearLR", "CosineAnnealingLR",
           "LambdaLR", "OneCycleLR", "SequentialLR", "cosine_with_warmup"]


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

    def step(self, epoch: Optional[int] = None) -> None:
        """Advance one step (or, as PyTorch's deprecated form, go to step ``epoch``) and set
        the groups' ``lr``."""
        if epoch is None:
            self.last_epoch += 1
        elif isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"{type(self).__name__}.step: argument 'epoch' must be an int >= "
                             f"0 or None, got {epoch!r}")
        else:
            self.last_epoch = epoch
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


def _positive_int(fn: str, arg: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{fn}: argument '{arg}' must be a positive int, got {value!r}")
    return value


class ExponentialLR(LRScheduler):
    """``lr = base_lr * gamma ** step``.

    >>> sched = optim.ExponentialLR(opt, gamma=0.95)
    """

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1):
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or gamma <= 0:
            raise ValueError(f"ExponentialLR: argument 'gamma' must be a positive number, got "
                             f"{gamma!r}")
        self.gamma = float(gamma)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, step: int) -> float:
        return base_lr * self.gamma ** step


class LinearLR(LRScheduler):
    """``lr = base_lr * factor``, the factor going linearly from ``start_factor`` to
    ``end_factor`` over ``total_iters`` steps, then staying (PyTorch's defaults: 1/3 to 1
    over 5 steps).

    >>> warmup = optim.LinearLR(opt, start_factor=0.01, total_iters=100)
    """

    def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3,
                 end_factor: float = 1.0, total_iters: int = 5, last_epoch: int = -1):
        if not isinstance(start_factor, (int, float)) or not 0 < start_factor <= 1:
            raise ValueError(f"LinearLR: argument 'start_factor' must be in (0, 1], got "
                             f"{start_factor!r}")
        if not isinstance(end_factor, (int, float)) or not 0 <= end_factor <= 1:
            raise ValueError(f"LinearLR: argument 'end_factor' must be in [0, 1], got "
                             f"{end_factor!r}")
        self.start_factor, self.end_factor = float(start_factor), float(end_factor)
        self.total_iters = _positive_int("LinearLR", "total_iters", total_iters)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, step: int) -> float:
        done = min(step, self.total_iters) / self.total_iters
        return base_lr * (self.start_factor + (self.end_factor - self.start_factor) * done)


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


class OneCycleLR(LRScheduler):
    """The 1cycle policy (Smith & Topin), PyTorch's ``OneCycleLR``: from
    ``max_lr / div_factor`` up to ``max_lr`` over the first ``pct_start`` of
    ``total_steps`` (or ``epochs * steps_per_epoch``), then down to ``initial_lr /
    final_div_factor`` (``three_phase``: back to the initial lr first, then down), each
    phase annealed by ``anneal_strategy`` (``"cos"`` or ``"linear"``). With
    ``cycle_momentum`` the momentum (SGD's ``momentum``, Adam's ``beta1``) goes the other way
    between ``max_momentum`` and ``base_momentum``. Call ``step()`` after every batch; a step
    past ``total_steps`` raises ``ValueError``. ``max_lr``, ``base_momentum`` and
    ``max_momentum`` may be lists, one per parameter group.

    >>> sched = optim.OneCycleLR(opt, max_lr=1e-2, total_steps=1000)
    """

    def __init__(self, optimizer: Optimizer, max_lr, total_steps: Optional[int] = None,
                 epochs: Optional[int] = None, steps_per_epoch: Optional[int] = None,
                 pct_start: float = 0.3, anneal_strategy: str = "cos",
                 cycle_momentum: bool = True, base_momentum=0.85, max_momentum=0.95,
                 div_factor: float = 25.0, final_div_factor: float = 1e4,
                 three_phase: bool = False, last_epoch: int = -1):
        fn = "OneCycleLR"
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{fn}: argument 'optimizer' must be a ctensor.optim optimizer, "
                            f"got {type(optimizer).__name__}")
        if total_steps is not None:
            self.total_steps = _positive_int(fn, "total_steps", total_steps)
        elif epochs is not None and steps_per_epoch is not None:
            self.total_steps = _positive_int(fn, "epochs", epochs) * \
                _positive_int(fn, "steps_per_epoch", steps_per_epoch)
        else:
            raise ValueError(f"{fn}: give total_steps, or epochs and steps_per_epoch")
        if not isinstance(pct_start, (int, float)) or not 0 <= pct_start <= 1:
            raise ValueError(f"{fn}: argument 'pct_start' must be a number in [0, 1], got "
                             f"{pct_start!r}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"{fn}: argument 'anneal_strategy' must be 'cos' or 'linear', "
                             f"got {anneal_strategy!r}")
        groups = optimizer.param_groups
        max_lrs = self._per_group(fn, "max_lr", max_lr, len(groups))
        T, pct = self.total_steps, float(pct_start)
        if three_phase:
            self._phases = [(pct * T - 1, "initial_lr", "max_lr", "max_momentum",
                             "base_momentum"),
                            (2 * pct * T - 2, "max_lr", "initial_lr", "base_momentum",
                             "max_momentum"),
                            (T - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum")]
        else:
            self._phases = [(pct * T - 1, "initial_lr", "max_lr", "max_momentum",
                             "base_momentum"),
                            (T - 1, "max_lr", "min_lr", "base_momentum", "max_momentum")]
        self.anneal_strategy = anneal_strategy
        self.cycle_momentum = bool(cycle_momentum)
        self.use_beta1 = "betas" in optimizer.defaults
        if self.cycle_momentum:
            if "momentum" not in optimizer.defaults and not self.use_beta1:
                raise ValueError(f"{fn}: the optimizer has neither 'momentum' nor 'betas'; "
                                 f"pass cycle_momentum=False")
            base_m = self._per_group(fn, "base_momentum", base_momentum, len(groups))
            max_m = self._per_group(fn, "max_momentum", max_momentum, len(groups))
        if last_epoch == -1:
            for i, g in enumerate(groups):
                g["initial_lr"] = max_lrs[i] / float(div_factor)
                g["max_lr"] = max_lrs[i]
                g["min_lr"] = g["initial_lr"] / float(final_div_factor)
                if self.cycle_momentum:
                    self._set_momentum(g, max_m[i])
                    g["max_momentum"], g["base_momentum"] = max_m[i], base_m[i]
        super().__init__(optimizer, last_epoch)

    @staticmethod
    def _per_group(fn: str, arg: str, value, n: int) -> list:
        values = list(value) if isinstance(value, (list, tuple)) else [value] * n
        if len(values) != n or not all(isinstance(v, (int, float)) and
                                       not isinstance(v, bool) for v in values):
            raise ValueError(f"{fn}: argument '{arg}' must be a number or a list of {n} "
                             f"numbers (one per parameter group), got {value!r}")
        return [float(v) for v in values]

    def _set_momentum(self, group: dict, momentum: float) -> None:
        if self.use_beta1:
            group["betas"] = (momentum, *group["betas"][1:])
        else:
            group["momentum"] = momentum

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self) -> list:
        step = self.last_epoch
        if step > self.total_steps:
            raise ValueError(f"OneCycleLR: step {step} is past total_steps="
                             f"{self.total_steps}; the schedule was made for "
                             f"{self.total_steps} steps")
        lrs = []
        for g in self.optimizer.param_groups:
            start = 0.0
            for i, (end, lr0, lr1, m0, m1) in enumerate(self._phases):
                if step <= end or i == len(self._phases) - 1:
                    pct = (step - start) / (end - start)
                    lrs.append(self._anneal(g[lr0], g[lr1], pct))
                    if self.cycle_momentum:
                        self._set_momentum(g, self._anneal(g[m0], g[m1], pct))
                    break
                start = end
        return lrs


class SequentialLR(LRScheduler):
    """Run ``schedulers`` one after another: the ``i``-th from step ``milestones[i-1]``
    (restarted at its own step 0 there), as PyTorch's ``SequentialLR``.

    >>> warmup = optim.LinearLR(opt, start_factor=0.1, total_iters=10)
    >>> decay = optim.CosineAnnealingLR(opt, T_max=90)
    >>> sched = optim.SequentialLR(opt, [warmup, decay], milestones=[10])
    """

    def __init__(self, optimizer: Optimizer, schedulers: Sequence[LRScheduler],
                 milestones: Sequence[int], last_epoch: int = -1):
        fn = "SequentialLR"
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{fn}: argument 'optimizer' must be a ctensor.optim optimizer, "
                            f"got {type(optimizer).__name__}")
        schedulers, milestones = list(schedulers), list(milestones)
        if not schedulers or not all(isinstance(s, LRScheduler) for s in schedulers):
            raise TypeError(f"{fn}: argument 'schedulers' must be a non-empty list of "
                            f"schedulers, got {schedulers!r}")
        for i, s in enumerate(schedulers):
            if s.optimizer is not optimizer:
                raise ValueError(f"{fn}: scheduler {i} ({type(s).__name__}) was made for "
                                 f"another optimizer; every scheduler must use this one")
        if len(milestones) != len(schedulers) - 1 or milestones != sorted(milestones) or \
                not all(isinstance(m, int) and not isinstance(m, bool) for m in milestones):
            raise ValueError(f"{fn}: argument 'milestones' must be {len(schedulers) - 1} "
                             f"increasing ints (one fewer than the schedulers), got "
                             f"{milestones!r}")
        self.optimizer = optimizer
        self._schedulers, self._milestones = schedulers, milestones
        self.last_epoch = last_epoch + 1
        for g in optimizer.param_groups:  # undo the schedulers' first steps, then take the
            g["lr"] = g["initial_lr"]     # first scheduler's alone
        for s in schedulers:
            s.last_epoch -= 1
        schedulers[0].step()
        self._last_lr = schedulers[0].get_last_lr()

    def step(self, epoch: Optional[int] = None) -> None:
        """Advance one step of the scheduler whose turn it is (a new one starts at 0)."""
        if epoch is not None:
            raise ValueError("SequentialLR.step: argument 'epoch' is not supported; call "
                             "step() once per step")
        self.last_epoch += 1
        idx = bisect.bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[idx]
        if idx > 0 and self._milestones[idx - 1] == self.last_epoch:
            scheduler.step(0)
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()

    def state_dict(self) -> dict:
        """Its step and every scheduler's own state (as PyTorch)."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer",
                                                                     "_schedulers")}
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state = dict(state_dict)
        inner = state.pop("_schedulers")
        self.__dict__.update(state)
        for s, sd in zip(self._schedulers, inner):
            s.load_state_dict(sd)
        for g, lr in zip(self.optimizer.param_groups, self._last_lr):
            g["lr"] = lr


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
