"""``Optimizer``: parameter groups, per-parameter state laid out like the parameter, and
state_dict / load_state_dict in PyTorch's format.

Every update is ordinary ctensor ops under ``ct.no_grad()`` followed by ``p.copy_(new)``;
there is no communication call here. Parallelism comes from layouts alone:

* a state tensor takes its parameter's placement and SBP (``ct.zeros_like(p)``), so an
  update on split parameters is local and one on broadcast parameters is replicated;
* ``shard_states_along=mesh_axis`` (ZeRO-1 as an SBP choice): for a parameter that is
  broadcast along that mesh axis, its states are split ``S(d)`` along it instead (``d`` the
  first dim not split elsewhere and at least as long as the axis). The update runs on the
  shard -- the gradient and the parameter are sliced locally, B -> S -- and ``copy_``
  boxes the new shard back to the parameter's SBP (an all-gather). The numbers are the
  same; each rank keeps only its part of the states.
"""
from __future__ import annotations

import copy
from typing import Callable, Optional

import numpy as np

import ctensor as ct
from ctensor.profile import phase

from . import foreach

__all__ = ["Optimizer"]


def _require(fn: str, arg: str, value, ok: bool, accepted: str) -> None:
    if not ok:
        raise ValueError(f"{fn}: argument '{arg}' must be {accepted}, got {value!r}")


class Optimizer:
    """Base class: holds ``param_groups`` (dicts with ``"params"`` and hyper-parameters)
    and ``state`` (per-parameter dicts). Subclasses define ``_init_state`` and ``_update``.

    >>> opt = optim.SGD(model.parameters(), lr=0.1)
    >>> opt.zero_grad(); loss.backward(); opt.step()
    """

    def __init__(self, params, defaults: dict, shard_states_along: Optional[int] = None):
        name = type(self).__name__
        if isinstance(params, ct.Tensor):
            raise TypeError(f"{name}: argument 'params' must be an iterable of tensors or of "
                            f"dicts, got a single ct.Tensor; pass [tensor] or "
                            f"model.parameters()")
        params = list(params)
        if not params:
            raise ValueError(f"{name}: argument 'params' is an empty list; pass "
                             f"model.parameters()")
        if shard_states_along is not None and (isinstance(shard_states_along, bool) or
                                               not isinstance(shard_states_along, int) or
                                               shard_states_along < 0):
            raise ValueError(f"{name}: argument 'shard_states_along' must be None or a mesh "
                             f"axis (int >= 0), got {shard_states_along!r}")
        self.defaults = dict(defaults)
        self.shard_states_along = shard_states_along
        self.param_groups: list = []
        self.state: dict = {}  # id(param) -> {name: tensor or number}
        self._flat: dict = {}  # (group index, layout) -> foreach.FlatStates
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        for g in groups:
            self.add_param_group(g)

    def add_param_group(self, group: dict) -> None:
        """Add a group: ``{"params": [...], "lr": ...}``; missing options take defaults."""
        name = type(self).__name__
        if not isinstance(group, dict) or "params" not in group:
            raise TypeError(f"{name}: a parameter group must be a dict with key 'params', got "
                            f"{type(group).__name__}")
        params = group["params"]
        params = [params] if isinstance(params, ct.Tensor) else list(params)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        for p in params:
            if not isinstance(p, ct.Tensor):
                raise TypeError(f"{name}: parameters must be ct.Tensor, got "
                                f"{type(p).__name__}")
            if not p.is_leaf:
                raise ValueError(f"{name}: can only optimise leaf tensors (parameters); got a "
                                 f"tensor computed by {p.grad_fn!r}")
            if id(p) in seen:
                raise ValueError(f"{name}: a parameter appears in more than one place of "
                                 f"'params'")
            seen.add(id(p))
        full = dict(self.defaults)
        full.update({k: v for k, v in group.items() if k != "params"})
        full["params"] = params
        self._check_group(full)
        self.param_groups.append(full)

    def _check_group(self, group: dict) -> None:
        """Validate hyper-parameters (subclasses extend)."""
        lr = group.get("lr")
        _require(type(self).__name__, "lr", lr, isinstance(lr, (int, float)) and lr >= 0,
                 "a number >= 0")

    # ----------------------------------------------------------------- stepping
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop (or zero) every parameter's gradient."""
        for g in self.param_groups:
            for p in g["params"]:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()

    def step(self, closure: Optional[Callable] = None):
        """One update of every parameter that has a gradient; returns ``closure()``'s
        value when given (the closure recomputes the loss with grad enabled)."""
        loss = None
        if closure is not None:
            with ct.enable_grad():
                loss = closure()
        with ct.no_grad(), phase("optimizer"):  # (ct.debug.profile()'s column)
            for index, group in enumerate(self.param_groups):
                for p in self._step_flat(index, group):  # (the rest: one at a time)
                    placement, sbp = self.state_layout(p)
                    state = self._state_for(p, placement, sbp)
                    grad = p.grad.to_global(placement, sbp)
                    param = p.detach().to_global(placement, sbp)
                    new = self._update(param, grad, state, group)
                    p.copy_(new)  # boxes a sharded update back to the parameter's SBP
                    for v in state.values():  # for ct.debug.memory() (no-op unless on)
                        if isinstance(v, ct.Tensor):
                            ct.debug.tag_memory(v, "optimizer")
        return loss

    def _step_flat(self, index: int, group: dict) -> list:
        """Update the parameters of ``group`` that the multi-tensor kernel can take
        (:mod:`optim.foreach`); return those left to update one by one."""
        fused = self._foreach_kernel(group)
        if fused is None:
            return [p for p in group["params"] if p.grad is not None]
        names, kernel, attrs = fused
        flat, single = foreach.plan_groups(self, group, names)
        for key, params in flat.items():
            for chunk, part in enumerate(foreach.chunks(params)):
                states = [self._state_for(p, *key[:2]) for p in part]
                for s in states:
                    s["step"] += 1
                where = (index, key[:3], chunk)
                self._flat[where] = foreach.apply(part, states, self._flat.get(where), names,
                                                  kernel, **attrs(states[0]["step"]))
        return single

    def _foreach_kernel(self, group: dict):
        """``(state names, kernel, attrs(step) -> dict)`` of the multi-tensor update of
        ``group``, or None (subclasses that have one define it)."""
        return None

    def _init_state(self, p: ct.Tensor, state: dict, zeros: Callable) -> None:
        """Fill ``state`` for a fresh parameter; ``zeros()`` gives a tensor in the state
        layout."""
        raise TypeError(f"{type(self).__name__}: optimizers must define _init_state")

    def _update(self, param, grad, state: dict, group: dict) -> ct.Tensor:
        """Return the new parameter value (in the state layout) and update ``state``."""
        raise TypeError(f"{type(self).__name__}: optimizers must define _update")

    # ----------------------------------------------------------------- state layout
    def state_layout(self, p: ct.Tensor) -> tuple:
        """``(placement, sbp)`` of ``p``'s state tensors (see the module docstring)."""
        placement = p.placement
        sbp = list(ct.sbp.without_partial(p.sbp))
        axis = self.shard_states_along
        if axis is None:
            return placement, tuple(sbp)
        if axis >= placement.ndim:
            raise ValueError(f"{type(self).__name__}: argument 'shard_states_along' is mesh "
                             f"axis {axis} but a parameter's placement {placement!r} has "
                             f"{placement.ndim} axes")
        if sbp[axis] != ct.sbp.broadcast:
            return placement, tuple(sbp)
        taken = {s.dim for s in sbp if isinstance(s, ct.sbp.Split)}
        for d, n in enumerate(p.shape):
            if d not in taken and n >= placement.shape[axis]:
                sbp[axis] = ct.sbp.split(d)
                break
        return placement, tuple(sbp)

    def _state_for(self, p: ct.Tensor, placement, sbp) -> dict:
        state = self.state.setdefault(id(p), {})
        if not state:
            self._init_state(p, state, lambda: ct.zeros(*p.shape, dtype=p.dtype,
                                                        placement=placement, sbp=sbp))
        for k, v in state.items():  # the parameter may have been resharded since
            if isinstance(v, ct.Tensor) and (v.placement != placement or v.sbp != sbp):
                state[k] = v.to_global(placement, sbp)
        return state

    # ----------------------------------------------------------------- checkpoints
    def _indexed(self) -> list:
        return [p for g in self.param_groups for p in g["params"]]

    def state_dict(self) -> dict:
        """``{"state": {index: {...}}, "param_groups": [{..., "params": [index, ...]}]}``
        (PyTorch's format; state tensors in their own layouts)."""
        params = self._indexed()
        index = {id(p): i for i, p in enumerate(params)}
        state = {}
        for p in params:
            s = self.state.get(id(p))
            if s:
                state[index[id(p)]] = {k: (v.detach() if isinstance(v, ct.Tensor) else v)
                                       for k, v in s.items()}
        groups = []
        for g in self.param_groups:
            entry = {k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
            entry["params"] = [index[id(p)] for p in g["params"]]
            groups.append(entry)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore hyper-parameters and states; each state tensor is copied into its
        parameter's state layout (any saved layout or a NumPy array is accepted). All
        entries are checked before anything changes."""
        name = f"{type(self).__name__}.load_state_dict"
        if not isinstance(state_dict, dict) or set(state_dict) != {"state", "param_groups"}:
            raise ValueError(f"{name}: expected a dict with keys 'state' and 'param_groups', "
                             f"got {type(state_dict).__name__} with keys "
                             f"{sorted(state_dict) if isinstance(state_dict, dict) else None}")
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError(f"{name}: the state dict has {len(groups)} parameter groups, the "
                             f"optimizer has {len(self.param_groups)}")
        for i, (saved, own) in enumerate(zip(groups, self.param_groups)):
            if len(saved["params"]) != len(own["params"]):
                raise ValueError(f"{name}: parameter group {i} has {len(saved['params'])} "
                                 f"parameters in the state dict and {len(own['params'])} here")
        saved_index = [j for g in groups for j in g["params"]]
        params = self._indexed()
        by_saved = dict(zip(saved_index, params))
        plan = []
        for key, entries in state_dict["state"].items():
            j = int(key)
            if j not in by_saved:
                raise ValueError(f"{name}: state for parameter index {j}, which no group "
                                 f"lists")
            p = by_saved[j]
            for k, v in entries.items():
                if isinstance(v, (ct.Tensor, np.ndarray)) and tuple(v.shape) != tuple(p.shape):
                    raise ValueError(f"{name}: state {k!r} of parameter {j} has shape "
                                     f"{tuple(v.shape)}, the parameter has {tuple(p.shape)}")
            plan.append((p, entries))
        for saved, own in zip(groups, self.param_groups):
            for k, v in saved.items():
                if k != "params":
                    own[k] = copy.deepcopy(v)
        self.state = {}
        with ct.no_grad():
            for p, entries in plan:
                placement, sbp = self.state_layout(p)
                state = {}
                for k, v in entries.items():
                    if isinstance(v, (ct.Tensor, np.ndarray)):
                        t = ct.zeros(*p.shape, dtype=p.dtype, placement=placement, sbp=sbp)
                        state[k] = t.copy_(v)
                    else:
                        state[k] = v
                self.state[id(p)] = state

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, g in enumerate(self.param_groups):
            lines.append(f"  group {i}: " + ", ".join(f"{k}={v}" for k, v in g.items()
                                                       if k != "params"))
        return "\n".join(lines) + "\n)"
