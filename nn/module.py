"""``Module`` and ``Parameter``: the containers every layer is built from.

A module is made without a placement (its parameters broadcast on every rank) and laid
out with :meth:`Module.to_global` or :mod:`ctensor.nn.parallel`, which reshard each
:class:`Parameter` *in place* (same object: an optimizer built before keeps working) by
ordinary ``Tensor.to_global`` boxing; nothing else here communicates.
"""
from __future__ import annotations

import fnmatch
from collections import OrderedDict
from typing import Iterator, NamedTuple, Optional

import numpy as np

import ctensor as ct

__all__ = ["Module", "Parameter", "IncompatibleKeys", "RemovableHandle", "resolve_sbp_rules"]


class Parameter(ct.Tensor):
    """A leaf tensor that a :class:`Module` registers as one of its parameters.

    Wraps ``data``'s shards without copying (``requires_grad`` defaults to True).

    >>> w = nn.Parameter(ct.zeros(4, 3))
    >>> w.requires_grad
    True
    """

    __slots__ = ()
    _memory_kind = "parameters"  # how ct.debug.memory() counts its shards

    def __init__(self, data: ct.Tensor, requires_grad: bool = True):
        if not isinstance(data, ct.Tensor):
            raise TypeError(f"Parameter: argument 'data' must be a ct.Tensor, got "
                            f"{type(data).__name__}")
        if requires_grad and data.dtype.kind not in "fc":
            raise ValueError(f"Parameter: requires_grad=True needs a floating dtype, got "
                             f"{data.dtype}")
        # a Parameter *is* a tensor: it adopts the layout and shards of ``data``
        super().__init__(data.layout, {}, requires_grad=requires_grad)
        self.set_(data)

    def _adopt(self, src: ct.Tensor) -> None:
        """Take ``src``'s layout and (copied) shards, keeping this object's identity."""
        self.set_(src.clone())

    def reshard_(self, placement=None, sbp=None) -> "Parameter":
        """Move this parameter (and its gradient) to ``placement``/``sbp`` in place.

        Collective (every rank calls it). The object stays the same, so optimizers and
        tied modules that hold it see the new layout.

        >>> w.reshard_(ct.placement("cpu", [0, 1]), ct.sbp.split(0))
        """
        with ct.no_grad():
            new = self.detach().to_global(placement, sbp)
            if new.placement != self.placement or new.sbp != self.sbp:
                self._adopt(new)
            if self.grad is not None:
                self.grad = self.grad.to_global(self.placement, self.sbp).detach()
        return self

    def cast_(self, dtype) -> "Parameter":
        """Change this parameter's dtype in place (its gradient is dropped)."""
        dtype = np.dtype(dtype)
        if dtype != self.dtype:
            with ct.no_grad():
                self._adopt(self.detach().to(dtype))
            self.grad = None
        return self

    def __repr__(self) -> str:
        return "Parameter(" + super().__repr__()[len("tensor("):]


#: what the hook registrations return (``remove()``), the core's: PyTorch's
#: ``torch.utils.hooks.RemovableHandle``
RemovableHandle = ct.autograd.RemovableHandle


class IncompatibleKeys(NamedTuple):
    """What :meth:`Module.load_state_dict` returns (like PyTorch)."""

    missing_keys: list
    unexpected_keys: list


def _sbp_tuple(value, ndim: int, where: str) -> tuple:
    if isinstance(value, ct.sbp.SBP):
        return (value,) * ndim if ndim > 1 and value == ct.sbp.broadcast else (value,)
    if isinstance(value, (tuple, list)):
        return tuple(value)
    raise TypeError(f"Module.to_global: argument 'sbp' {where} must be an SBP or a tuple of "
                    f"SBPs (one per mesh axis), got {value!r} ({type(value).__name__})")


def resolve_sbp_rules(names_shapes: list, placement, sbp) -> dict:
    """The SBP tuple of every parameter for ``Module.to_global(placement, sbp)``.

    ``sbp`` is one SBP / tuple for all, or a dict from name (exact, else the first
    matching fnmatch pattern in dict order) to SBP; unmatched names get broadcast.
    Raises for a pattern that matches no parameter, before anything moves.
    """
    ndim = placement.ndim
    broadcast = (ct.sbp.broadcast,) * ndim
    if not isinstance(sbp, dict):
        one = broadcast if sbp is None else _sbp_tuple(sbp, ndim, "")
        return {name: one for name, _ in names_shapes}
    for key in sbp:
        if not isinstance(key, str):
            raise TypeError(f"Module.to_global: the keys of argument 'sbp' must be parameter "
                            f"names or fnmatch patterns (str), got {key!r}")
    names = [n for n, _ in names_shapes]
    unused = [k for k in sbp if not any(n == k or fnmatch.fnmatchcase(n, k) for n in names)]
    if unused:
        raise ValueError(f"Module.to_global: argument 'sbp' has rules {unused} that match no "
                         f"parameter; the parameters are {names}")
    out = {}
    for name, _ in names_shapes:
        if name in sbp:
            rule = sbp[name]
        else:
            rule = next((v for k, v in sbp.items() if fnmatch.fnmatchcase(name, k)), None)
        out[name] = broadcast if rule is None else _sbp_tuple(rule, ndim, f"for {name!r}")
    return out


def _add_hook(fn: str, hooks: dict, hook) -> "RemovableHandle":
    """Put ``hook`` into ``hooks`` (a module's pre- or post-forward hooks) under a new
    handle; ``TypeError`` naming ``fn`` when it is not callable."""
    if not callable(hook):
        raise TypeError(f"{fn}: argument 'hook' must be callable, got {type(hook).__name__}")
    return RemovableHandle.add(hooks, hook)


class _AlwaysCalled(tuple):
    """``(hook,)``: a forward hook with ``always_call=True`` (also run when forward raises)."""

    def __call__(self, module, args, output):
        return self[0](module, args, output)


class Module:
    """Base class of layers and models (PyTorch style).

    Assigning a :class:`Parameter` or a :class:`Module` as an attribute registers it;
    ``model(x)`` calls ``forward``.

    >>> class Net(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc = nn.Linear(4, 2)
    ...     def forward(self, x):
    ...         return self.fc(x)
    >>> net = Net().to_global(ct.placement("cpu", [0, 1]), ct.sbp.broadcast)
    """

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_forward_pre_hooks", OrderedDict())
        object.__setattr__(self, "_forward_hooks", OrderedDict())
        # name -> tensor that ``self.<name>`` returns instead of the registered parameter
        # (set_parameter_overrides: a gathered or cast copy, nn.fully_shard/mixed_precision)
        object.__setattr__(self, "_param_overrides", {})

    # ----------------------------------------------------------------- registration
    def __setattr__(self, name: str, value) -> None:
        if "_parameters" not in self.__dict__:
            raise TypeError(f"{type(self).__name__}: call super().__init__() before assigning "
                            f"attribute {name!r}")
        for table in (self._parameters, self._buffers, self._modules):
            table.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str):
        d = self.__dict__
        overrides = d.get("_param_overrides")
        if overrides and name in overrides:
            return overrides[name]
        for table in ("_parameters", "_buffers", "_modules"):
            if table in d and name in d[table]:
                return d[table][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        for table in (self._parameters, self._buffers, self._modules):
            if name in table:
                del table[name]
                return
        object.__delattr__(self, name)

    def register_parameter(self, name: str, param: Optional[Parameter]) -> None:
        """Register ``param`` (or ``None``: an absent optional parameter) under ``name``."""
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"register_parameter: argument 'param' must be an nn.Parameter or "
                            f"None, got {type(param).__name__}")
        if param is None:
            object.__setattr__(self, name, None)
        else:
            setattr(self, name, param)

    def register_buffer(self, name: str, tensor: Optional[ct.Tensor],
                        persistent: bool = True) -> None:
        """Register a non-trainable tensor moved by ``to_global`` (always broadcast) and,
        unless ``persistent=False`` (PyTorch's: e.g. a rotary table), saved in
        ``state_dict``."""
        if tensor is not None and not isinstance(tensor, ct.Tensor):
            raise TypeError(f"register_buffer: argument 'tensor' must be a ct.Tensor or None, "
                            f"got {type(tensor).__name__}")
        for table in (self._parameters, self._modules):
            table.pop(name, None)
        self.__dict__.pop(name, None)
        self._buffers[name] = tensor
        skipped = self.__dict__.setdefault("_non_persistent_buffers", set())
        if persistent:
            skipped.discard(name)
        else:
            skipped.add(name)

    def add_module(self, name: str, module: "Module") -> None:
        """Register ``module`` as the child ``name`` (same as assigning the attribute)."""
        if not isinstance(module, Module):
            raise TypeError(f"add_module: argument 'module' must be an nn.Module, got "
                            f"{type(module).__name__}")
        setattr(self, name, module)

    # ----------------------------------------------------------------- traversal
    def forward(self, *args, **kwargs):
        """The computation; subclasses define it and callers use ``module(...)``."""
        raise TypeError(f"{type(self).__name__}: subclasses of nn.Module must define "
                        f"forward()")

    def __call__(self, *args, **kwargs):
        d = self.__dict__
        pre, post = d.get("_forward_pre_hooks"), d.get("_forward_hooks")
        if not pre and not post:
            return self.forward(*args, **kwargs)
        try:
            for hook in list(pre.values()):
                result = hook(self, args)
                if result is not None:
                    args = result if isinstance(result, tuple) else (result,)
            out = self.forward(*args, **kwargs)
        except BaseException:
            for hook in list(post.values()):  # always_call hooks clean up (PyTorch's)
                if type(hook) is _AlwaysCalled:
                    hook(self, args, None)
            raise
        for hook in list(post.values()):
            result = hook(self, args, out)
            if result is not None:
                out = result
        return out

    def register_forward_pre_hook(self, hook) -> RemovableHandle:
        """Call ``hook(module, args)`` before every ``forward``; a non-None result replaces
        the positional arguments (PyTorch's API). Returns a handle whose ``remove()`` takes
        the hook off.

        >>> handle = model.fc.register_forward_pre_hook(lambda m, args: print(m))
        >>> handle.remove()
        """
        return _add_hook("register_forward_pre_hook", self._forward_pre_hooks, hook)

    def register_forward_hook(self, hook, always_call: bool = False) -> RemovableHandle:
        """Call ``hook(module, args, output)`` after every ``forward``; a non-None result
        replaces the output (PyTorch's API). ``always_call=True``: also (output None) when
        the forward or a pre-hook raises, to undo what a pre-hook set up. Returns a handle.

        >>> handle = model.fc.register_forward_hook(lambda m, args, out: None)
        """
        if not isinstance(always_call, bool):
            raise TypeError(f"register_forward_hook: argument 'always_call' must be a bool, "
                            f"got {always_call!r}")
        if always_call and callable(hook):
            hook = _AlwaysCalled((hook,))
        return _add_hook("register_forward_hook", self._forward_hooks, hook)

    def set_parameter_overrides(self, overrides: Optional[dict] = None) -> None:
        """Make ``self.<name>`` return ``overrides[name]`` (a tensor) instead of this
        module's parameter ``name`` until the next call (``None``: the parameters again),
        which optimizers and ``state_dict`` keep seeing: how a forward pre-hook gives the
        forward a gathered (``nn.fully_shard``) or cast (``mixed_precision``) copy.

        >>> m.set_parameter_overrides({"weight": m.weight.to(ct.float16)})
        """
        overrides = dict(overrides or {})
        bad = [k for k, t in overrides.items() if k not in self._parameters or
               not isinstance(t, ct.Tensor)]
        if bad:
            raise ValueError(f"set_parameter_overrides: {bad} are not parameters of "
                             f"{type(self).__name__} ({list(self._parameters)}) overridden "
                             f"by a ct.Tensor")
        object.__setattr__(self, "_param_overrides", overrides)

    def children(self) -> Iterator["Module"]:
        """The direct sub-modules."""
        yield from self._modules.values()

    def named_children(self) -> Iterator[tuple]:
        """``(name, module)`` for the direct sub-modules."""
        yield from self._modules.items()

    def named_modules(self, prefix: str = "") -> Iterator[tuple]:
        """``(name, module)`` for this module and every descendant, each once."""
        seen: set = set()
        stack = [(prefix, self)]
        while stack:
            name, mod = stack.pop()
            if id(mod) in seen:
                continue
            seen.add(id(mod))
            yield name, mod
            kids = [(f"{name}.{k}" if name else k, m) for k, m in mod._modules.items()]
            stack.extend(reversed(kids))

    def modules(self, remove_duplicate: bool = True) -> Iterator["Module"]:
        """This module and every descendant, each once (``remove_duplicate`` is accepted
        for PyTorch's signature; a shared module is listed once either way)."""
        yield from (m for _, m in self.named_modules())

    def apply(self, fn) -> "Module":
        """Call ``fn(module)`` on every child (recursively, children first) and then on
        this module, as PyTorch does (e.g. nanoGPT's ``self.apply(self._init_weights)``).

        >>> model.apply(lambda m: nn.init.zeros_(m.bias) if isinstance(m, nn.Linear) else None)
        """
        if not callable(fn):
            raise TypeError(f"Module.apply: argument 'fn' must be callable, got "
                            f"{type(fn).__name__}")
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple]:
        """``(dotted name, Parameter)``; a parameter shared by several modules (tied
        weights) appears once, under its first name (every name with
        ``remove_duplicate=False``)."""
        seen: set = set()
        mods = self.named_modules(prefix) if recurse else [(prefix, self)]
        for mname, mod in mods:
            for pname, p in mod._parameters.items():
                if id(p) in seen and remove_duplicate:
                    continue
                seen.add(id(p))
                yield (f"{mname}.{pname}" if mname else pname), p

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        """Every parameter once (for optimizers: ``optim.AdamW(model.parameters())``)."""
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True,
                      persistent_only: bool = False) -> Iterator[tuple]:
        """``(dotted name, tensor)`` for every registered buffer (of this module only
        without ``recurse``; ``persistent_only``: those ``state_dict`` saves)."""
        mods = self.named_modules(prefix) if recurse else [(prefix, self)]
        for mname, mod in mods:
            skipped = mod.__dict__.get("_non_persistent_buffers", ()) if persistent_only \
                else ()
            for bname, b in mod._buffers.items():
                if b is not None and bname not in skipped:
                    yield (f"{mname}.{bname}" if mname else bname), b

    def buffers(self, recurse: bool = True) -> Iterator[ct.Tensor]:
        """Every registered buffer."""
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def get_submodule(self, target: str) -> "Module":
        """The descendant at the dotted path ``target`` (``""``: this module)."""
        mod = self
        for part in target.split(".") if target else ():
            if part not in mod._modules:
                raise AttributeError(f"{type(mod).__name__} has no submodule {part!r} (path "
                                     f"{target!r})")
            mod = mod._modules[part]
        return mod

    def get_parameter(self, target: str) -> "Parameter":
        """The parameter at the dotted path ``target`` (e.g. ``"fc.weight"``)."""
        path, _, name = target.rpartition(".")
        mod = self.get_submodule(path)
        if name not in mod._parameters or mod._parameters[name] is None:
            raise AttributeError(f"{type(mod).__name__} has no parameter {name!r} (path "
                                 f"{target!r})")
        return mod._parameters[name]

    # ----------------------------------------------------------------- modes and grads
    def train(self, mode: bool = True) -> "Module":
        """Training mode (dropout active) for this module and every descendant."""
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self) -> "Module":
        """Evaluation mode (dropout off)."""
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop (or zero) every parameter's gradient."""
        for p in self.parameters():
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        """Turn gradient tracking of every parameter on or off (freezing)."""
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def to(self, *args, **kwargs) -> "Module":
        """PyTorch's ``module.to(...)``: ``to(dtype)`` casts every floating parameter and
        buffer in place; ``to("cpu")`` (or ``device="cpu"``) is a no-op — modules live on
        every rank's default device until laid out; ``to(placement)`` lays every parameter
        out broadcast there (``to_global``); ``to(tensor)`` takes its dtype. Any other
        device raises with the fix (``to_global``).

        >>> model.to("cpu").to(ct.float64)
        """
        dtype, device = kwargs.pop("dtype", None), kwargs.pop("device", None)
        kwargs.pop("non_blocking", None), kwargs.pop("copy", None)
        kwargs.pop("memory_format", None)
        if kwargs:
            raise TypeError(f"Module.to: got unexpected keyword arguments {sorted(kwargs)}")
        for a in args:
            if isinstance(a, ct.Tensor):
                dtype = a.dtype
            elif isinstance(a, (str, ct.Placement)) or a is None:
                device = a
            else:
                dtype = a
        if isinstance(device, ct.Placement):
            self.to_global(device, (ct.sbp.broadcast,) * device.ndim)
        elif device is not None and str(device) != "cpu":
            raise ValueError(f"Module.to: device {device!r}: ctensor places modules by "
                             f"placement; lay it out with module.to_global(ct.placement("
                             f"'cuda', ranks), sbp) or module.to(placement)")
        if dtype is None:
            return self
        for p in self.parameters():
            p.cast_(dtype)
        for mod in self.modules():
            for name, b in list(mod._buffers.items()):
                if b is not None and b.dtype.kind in "fc":
                    mod._buffers[name] = b.to(dtype)
        return self

    def cpu(self) -> "Module":
        """A no-op (PyTorch's ``module.cpu()``): modules are built on the default device."""
        return self

    def double(self) -> "Module":
        """Cast to float64 in place."""
        return self.to(np.float64)

    def float(self) -> "Module":
        """Cast to float32 in place."""
        return self.to(np.float32)

    def half(self) -> "Module":
        """Cast to float16 in place."""
        return self.to(np.float16)

    # ----------------------------------------------------------------- layout
    def to_global(self, placement=None, sbp=None) -> "Module":
        """Reshard every parameter in place and return the module.

        ``sbp`` is one SBP (or tuple, one per mesh axis) for every parameter, or a dict from
        parameter name or fnmatch pattern to SBP; parameters no rule matches are broadcast.
        ``placement`` defaults to each parameter's own. Buffers become broadcast on the
        placement. Collective: every rank calls it with the same arguments. Parameters
        broadcast along a mesh axis must hold the same values on its ranks (a ``ValueError``
        on every rank names those that differ: ``ct.debug.check_broadcast_data``).

        >>> mesh = ct.placement("cpu", [0, 1])
        >>> model.to_global(mesh, {"fc1.weight": ct.sbp.split(0), "fc2.weight": ct.sbp.split(1)})
        """
        if placement is not None and not isinstance(placement, ct.Placement):
            raise TypeError(f"Module.to_global: argument 'placement' must be a ct.placement, "
                            f"got {placement!r} ({type(placement).__name__})")
        params = list(self.named_parameters())
        plans = []
        if placement is None and sbp is None:
            return self
        groups: dict = {}
        for name, p in params:  # rules resolve per target placement (its number of axes)
            groups.setdefault(placement or p.placement, []).append((name, p))
        for target, members in groups.items():
            rules = resolve_sbp_rules([(n, tuple(p.shape)) for n, p in members], target, sbp)
            for name, p in members:
                try:
                    norm = ct.sbp.normalize_sbp(rules[name], target.ndim, p.ndim,
                                                "Module.to_global")
                except (TypeError, ValueError) as exc:
                    raise type(exc)(f"{exc} (parameter {name!r} of shape "
                                    f"{tuple(p.shape)})") from None
                plans.append((p, target, norm))
        # broadcast axes must hold equal shards before they are moved (one digest exchange
        # for the whole module; off with ct.debug.check_tensor_data(False))
        ct.debug.check_broadcast_data(dict(params), "Module.to_global", "parameter")
        for p, target, norm in plans:  # everything validated: now move
            p.reshard_(target, norm)
        if placement is not None:
            for mod in self.modules():
                for bname, b in list(mod._buffers.items()):
                    if b is not None:
                        mod._buffers[bname] = b.to_global(
                            placement, (ct.sbp.broadcast,) * placement.ndim)
        return self

    # ----------------------------------------------------------------- state
    def state_dict(self, destination=None, prefix: str = "",
                   keep_vars: bool = False) -> "OrderedDict[str, ct.Tensor]":
        """Name -> tensor (parameters, detached unless ``keep_vars``, then buffers) in their
        current layouts; names start with ``prefix``; filled into ``destination`` when
        given (PyTorch's arguments). A tied parameter is listed once, under its first name
        (``load_state_dict`` accepts PyTorch's other names for it)."""
        out: OrderedDict = OrderedDict() if destination is None else destination
        for name, p in self.named_parameters():
            out[prefix + name] = p if keep_vars else p.detach()
        for name, b in self.named_buffers(persistent_only=True):
            out[prefix + name] = b
        return out

    def load_state_dict(self, state_dict, strict: bool = True,
                        assign: bool = False) -> IncompatibleKeys:
        """Copy values into this module's parameters and buffers, keeping their layouts.

        Values may be ct tensors in any placement/SBP or NumPy arrays. Everything is
        checked (missing/unexpected keys when ``strict``, shapes, types) before the first
        copy, so a failed load changes nothing. A tied parameter may also appear under its
        other names (PyTorch's ``state_dict`` lists every one); those keys are accepted.
        ``assign`` (PyTorch's) is accepted and copies too: a parameter keeps its object and
        its layout.

        >>> model.load_state_dict(ct.load("ckpt")["model"])
        """
        if not hasattr(state_dict, "items"):
            raise TypeError(f"load_state_dict: argument 'state_dict' must be a mapping, got "
                            f"{type(state_dict).__name__}")
        own = self.state_dict()
        # the other names of tied parameters (PyTorch's state_dict lists each of them)
        aliases = {n for n, _ in self.named_parameters(remove_duplicate=False)} - set(own)
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own and k not in aliases]
        if strict and (missing or unexpected):
            raise ValueError(f"load_state_dict: the state dict does not match "
                             f"{type(self).__name__}: missing keys {missing}, unexpected keys "
                             f"{unexpected}; pass strict=False to load the common keys")
        plan = []
        for key, dst in own.items():
            if key not in state_dict:
                continue
            src = state_dict[key]
            if isinstance(src, ct.Tensor):
                shape = tuple(src.shape)
            elif isinstance(src, (np.ndarray, np.generic, int, float)):
                src = np.asarray(src)
                shape = src.shape
            else:
                raise TypeError(f"load_state_dict: entry {key!r} must be a ct.Tensor or a "
                                f"NumPy array, got {type(src).__name__}")
            if shape != tuple(dst.shape):
                raise ValueError(f"load_state_dict: entry {key!r} has shape {shape} but the "
                                 f"module's has shape {tuple(dst.shape)}")
            plan.append((key, src))
        targets = {**dict(self.named_parameters()), **dict(self.named_buffers())}
        with ct.no_grad():
            for key, src in plan:
                targets[key].copy_(src)
        return IncompatibleKeys(missing, unexpected)

    # ----------------------------------------------------------------- printing
    def extra_repr(self) -> str:
        """The text inside this module's parentheses in ``repr`` (subclasses override)."""
        return ""

    def __repr__(self) -> str:
        lines = [f"({k}): " + repr(m).replace("\n", "\n  ") for k, m in self._modules.items()]
        head = f"{type(self).__name__}({self.extra_repr()}"
        if not lines:
            return head + ")"
        return head + "\n  " + "\n  ".join(lines) + "\n)"
