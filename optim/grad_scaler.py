"""``GradScaler``: dynamic loss scaling for float16 training (PyTorch's ``torch.amp.GradScaler``).

float16 gradients of small magnitude underflow to zero; multiplying the loss by a large
``scale`` before ``backward()`` lifts them into range, and dividing the gradients by it
before the update (:meth:`GradScaler.unscale_`) restores their value. Too large a scale
overflows: then some gradient is ``inf`` or ``nan``, the step is skipped and the scale is
multiplied by ``backoff_factor``; after ``growth_interval`` steps without overflow it is
multiplied by ``growth_factor``. Whether a gradient is not finite is decided once per step
over every parameter, on every rank alike (one scalar reduced over the world), so all
ranks skip or take the step together.

The scale is a Python float, the same on every rank; no communication besides that one
check.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

import ctensor as ct

__all__ = ["GradScaler"]

_READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"


@ct.meta.reads_values(default=False)
def _not_finite_value(total: ct.Tensor) -> bool:
    """Whether ``total`` is inf or nan (``.item()``: every rank of the world); shape-only:
    no values, taken as finite (the step runs)."""
    return not math.isfinite(float(total.item()))


class GradScaler:
    """Dynamic loss scaling (PyTorch's API).

    >>> scaler = optim.GradScaler()
    >>> scaler.scale(loss).backward()
    >>> scaler.unscale_(opt); nn.utils.clip_grad_norm_(params, 1.0)    # optional
    >>> scaler.step(opt)          # skipped when a gradient is inf/nan
    >>> scaler.update()           # lower the scale after an overflow, raise it later
    """

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True):
        checks = [("init_scale", init_scale, init_scale > 0, "a number > 0"),
                  ("growth_factor", growth_factor, growth_factor > 1, "a number > 1"),
                  ("backoff_factor", backoff_factor, 0 < backoff_factor < 1,
                   "a number in (0, 1)")]
        for name, value, ok, accepted in checks:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok:
                raise ValueError(f"GradScaler: argument '{name}' must be {accepted}, got "
                                 f"{value!r}")
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, int) or \
                growth_interval < 1:
            raise ValueError(f"GradScaler: argument 'growth_interval' must be an int >= 1, "
                             f"got {growth_interval!r}")
        self._scale = float(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = growth_interval
        self._growth_tracker = 0
        self._enabled = bool(enabled)
        self._found_inf: Optional[bool] = None
        self._stage: dict = {}  # id(optimizer) -> stage this step

    # ----------------------------------------------------------------- the step
    def is_enabled(self) -> bool:
        return self._enabled

    def get_scale(self) -> float:
        """The current scale (1.0 when disabled)."""
        return self._scale if self._enabled else 1.0

    def scale(self, outputs):
        """``outputs * scale`` in float32 (a tensor or a list/tuple of tensors); call
        ``backward()`` on the result."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        if not isinstance(outputs, ct.Tensor):
            raise TypeError(f"GradScaler.scale: argument 'outputs' must be a ct.Tensor (the "
                            f"loss), got {type(outputs).__name__}")
        loss = outputs if outputs.dtype.itemsize >= 4 else outputs.float()
        return loss * self._scale

    def unscale_(self, optimizer) -> None:
        """Divide the gradients of ``optimizer``'s parameters by the scale, in place, and
        find out whether any is inf or nan (collective). At most once per step, before
        clipping; :meth:`step` calls it when you did not."""
        if not self._enabled:
            return
        if self._stage.get(id(optimizer)) == _UNSCALED:
            raise RuntimeError("GradScaler.unscale_: already called for this optimizer "
                               "since the last update(); call it once per step")
        if self._stage.get(id(optimizer)) == _STEPPED:
            raise RuntimeError("GradScaler.unscale_: step() already ran for this optimizer; "
                               "call update() first")
        grads = [p.grad for g in optimizer.param_groups for p in g["params"]
                 if p.grad is not None]
        inverse = 1.0 / self._scale
        with ct.no_grad():
            for g in grads:
                g.mul_(inverse)
            found = self._not_finite(grads)
        self._found_inf = bool(self._found_inf) or found
        self._stage[id(optimizer)] = _UNSCALED

    @staticmethod
    def _not_finite(grads) -> bool:
        """Whether any gradient holds inf or nan: ``sum(g * 0)`` is 0 unless some entry is
        inf or nan (``inf * 0`` is nan), reduced to one scalar that every rank reads."""
        if not grads:
            return False
        home = grads[0].placement
        replicated = (ct.sbp.broadcast,) * home.ndim
        total = None
        for g in grads:
            with np.errstate(invalid="ignore"):  # inf * 0 is the nan looked for
                part = (g * 0.0).sum()
            part = part.to(ct.float32).to_global(home, replicated)
            total = part if total is None else total + part
        return _not_finite_value(total)

    def step(self, optimizer, *args, **kwargs):
        """``optimizer.step()`` unless a gradient was inf or nan (then the step is skipped
        and None returned); unscales first if :meth:`unscale_` was not called."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if self._stage.get(id(optimizer)) == _STEPPED:
            raise RuntimeError("GradScaler.step: already called for this optimizer since "
                               "the last update()")
        if self._stage.get(id(optimizer)) != _UNSCALED:
            self.unscale_(optimizer)
        self._stage[id(optimizer)] = _STEPPED
        if self._found_inf:
            return None
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale: Optional[float] = None) -> None:
        """Adjust the scale for the next step: times ``backoff_factor`` after an overflow,
        times ``growth_factor`` after ``growth_interval`` clean steps (or ``new_scale``)."""
        if not self._enabled:
            return
        if new_scale is not None:
            self._scale = float(new_scale)
        elif self._found_inf:
            self._scale *= self._backoff_factor
            self._growth_tracker = 0
        elif self._found_inf is not None:
            self._growth_tracker += 1
            if self._growth_tracker == self._growth_interval:
                self._scale *= self._growth_factor
                self._growth_tracker = 0
        self._found_inf = None
        self._stage.clear()

    @property
    def found_inf(self) -> bool:
        """Whether this step's gradients held inf or nan (after unscale_ / step)."""
        return bool(self._found_inf)

    # ----------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        """``{"scale", "growth_factor", "backoff_factor", "growth_interval",
        "_growth_tracker"}`` (PyTorch's keys)."""
        if not self._enabled:
            return {}
        return {"scale": self._scale, "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval,
                "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state: dict) -> None:
        if not self._enabled:
            return
        if not isinstance(state, dict) or "scale" not in state:
            raise ValueError("GradScaler.load_state_dict: expected the dict state_dict() "
                             "returned, with key 'scale'")
        self._scale = float(state["scale"])
        self._growth_factor = float(state.get("growth_factor", self._growth_factor))
        self._backoff_factor = float(state.get("backoff_factor", self._backoff_factor))
        self._growth_interval = int(state.get("growth_interval", self._growth_interval))
        self._growth_tracker = int(state.get("_growth_tracker", 0))

    def __repr__(self) -> str:
        return f"GradScaler(scale={self.get_scale()}, enabled={self._enabled})"
