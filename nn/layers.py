"""Layers: ``Linear``, ``Embedding``, ``LayerNorm``, ``Dropout``, activations and containers.

Parameters are initialised with ``ct.rand`` / ``ct.randn``, whose values depend only on the
seed and the logical index, so every layout (and world size) starts from the same logical
weights. Layers are built on every rank, broadcast; lay them out afterwards with
``Module.to_global`` or :mod:`ctensor.nn.parallel`.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import Iterable, Iterator, Optional

import numpy as np

import ctensor as ct

from . import functional as F
from .module import Module, Parameter

__all__ = ["Linear", "Embedding", "LayerNorm", "RMSNorm", "Dropout", "GELU", "ReLU",
           "Identity", "Sequential", "ModuleList", "ModuleDict", "ParameterList",
           "ParameterDict", "uniform_param", "normal_param"]


def _dtype(dtype) -> np.dtype:
    return np.dtype(ct.get_default_dtype() if dtype is None else dtype)


def uniform_param(shape: tuple, bound: float, dtype=None) -> Parameter:
    """A parameter drawn from U(-bound, bound) with ``ct.rand`` (layout-independent)."""
    dtype = _dtype(dtype)
    return Parameter((ct.rand(*shape, dtype=dtype) * 2.0 - 1.0) * bound)


def normal_param(shape: tuple, std: float, dtype=None) -> Parameter:
    """A parameter drawn from N(0, std^2) with ``ct.randn`` (layout-independent)."""
    dtype = _dtype(dtype)
    return Parameter(ct.randn(*shape, dtype=dtype) * std)


def check_device(fn: str, device) -> None:
    """PyTorch's ``device=`` on a constructor: None or ``"cpu"`` (a module is built on
    every rank's default device and laid out afterwards); anything else raises with the
    fix."""
    if device is None or str(device) == "cpu":
        return
    raise ValueError(f"{fn}: argument 'device' is {device!r}; ctensor builds modules "
                     f"broadcast on the default placement: pass device=None and lay the "
                     f"module out afterwards with module.to_global(ct.placement(...), sbp) "
                     f"(or ct.set_default_device first)")


def _positive(fn: str, arg: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{fn}: argument '{arg}' must be a positive int, got {value!r}")
    return int(value)


class Linear(Module):
    """``y = x @ weight.T + bias`` with ``weight`` of shape ``(out_features, in_features)``.

    Initialised like PyTorch: weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)).

    >>> fc = nn.Linear(16, 32)
    >>> y = fc(ct.randn(8, 16))          # (8, 32)
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None):
        super().__init__()
        check_device("Linear", device)
        self.in_features = _positive("Linear", "in_features", in_features)
        self.out_features = _positive("Linear", "out_features", out_features)
        bound = 1.0 / math.sqrt(self.in_features)
        self.weight = uniform_param((self.out_features, self.in_features), bound, dtype)
        if bias:
            self.bias = uniform_param((self.out_features,), bound, dtype)
        else:
            self.register_parameter("bias", None)

    def forward(self, x: ct.Tensor) -> ct.Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class Embedding(Module):
    """A lookup table ``weight[ids]`` of shape ``(num_embeddings, embedding_dim)``, N(0, 1)
    initialised (pass ``std`` for e.g. GPT-2's 0.02). ``padding_idx`` (PyTorch's): that row
    starts at zero and receives no gradient.

    >>> emb = nn.Embedding(100, 16, padding_idx=0)
    >>> emb(ct.tensor([[1, 2, 3]]))      # (1, 3, 16)
    """

    def __init__(self, num_embeddings: int, embedding_dim: int,
                 padding_idx: Optional[int] = None, max_norm: Optional[float] = None,
                 norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                 sparse: bool = False, _weight: Optional[ct.Tensor] = None,
                 _freeze: bool = False, device=None, dtype=None, *, std: float = 1.0):
        super().__init__()
        check_device("Embedding", device)
        self.num_embeddings = _positive("Embedding", "num_embeddings", num_embeddings)
        self.embedding_dim = _positive("Embedding", "embedding_dim", embedding_dim)
        if max_norm is not None or scale_grad_by_freq or sparse:
            raise ValueError("Embedding: max_norm, scale_grad_by_freq and sparse are not "
                             "supported; renormalise or rescale the weight explicitly")
        if padding_idx is not None:
            if not -self.num_embeddings <= int(padding_idx) < self.num_embeddings:
                raise ValueError(f"Embedding: argument 'padding_idx' must be within "
                                 f"num_embeddings ({self.num_embeddings}), got {padding_idx}")
            padding_idx = int(padding_idx) % self.num_embeddings
        self.padding_idx = padding_idx
        if _weight is not None:  # PyTorch's: the initial weight given (not re-initialised)
            if tuple(_weight.shape) != (self.num_embeddings, self.embedding_dim):
                raise ValueError(f"Embedding: argument '_weight' has shape "
                                 f"{tuple(_weight.shape)}, accepted "
                                 f"{(self.num_embeddings, self.embedding_dim)}")
            self.weight = Parameter(_weight.detach().clone(), requires_grad=not _freeze)
            return
        self.weight = normal_param((self.num_embeddings, self.embedding_dim), std, dtype)
        if _freeze:
            self.weight.requires_grad_(False)
        if padding_idx is not None:
            with ct.no_grad():
                self.weight.copy_(F.zero_padding_row(self.weight, padding_idx))

    @classmethod
    def from_pretrained(cls, embeddings: ct.Tensor, freeze: bool = True,
                        padding_idx: Optional[int] = None, max_norm=None,
                        norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                        sparse: bool = False) -> "Embedding":
        """An embedding holding a copy of ``embeddings`` (2-D), frozen unless
        ``freeze=False`` (PyTorch's classmethod).

        >>> emb = nn.Embedding.from_pretrained(vectors, freeze=False)
        """
        if not isinstance(embeddings, ct.Tensor) or embeddings.ndim != 2:
            raise ValueError("Embedding.from_pretrained: argument 'embeddings' must be a 2-D "
                             "ct.Tensor (num_embeddings, embedding_dim)")
        rows, cols = embeddings.shape
        return cls(rows, cols, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse,
                   _weight=embeddings, _freeze=freeze)

    def forward(self, ids: ct.Tensor) -> ct.Tensor:
        return F.embedding(ids, self.weight, self.padding_idx)

    def extra_repr(self) -> str:
        pad = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"


class LayerNorm(Module):
    """Layer normalisation over the last dim(s) with learnable ``weight`` (ones) and
    ``bias`` (zeros).

    >>> ln = nn.LayerNorm(16)
    """

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, device=None, dtype=None):
        super().__init__()
        check_device("LayerNorm", device)
        if isinstance(normalized_shape, (int, np.integer)):
            normalized_shape = (int(normalized_shape),)
        self.normalized_shape = tuple(_positive("LayerNorm", "normalized_shape", n)
                                      for n in normalized_shape)
        self.eps = float(eps)
        dtype = _dtype(dtype)
        if elementwise_affine:
            self.weight = Parameter(ct.ones(*self.normalized_shape, dtype=dtype))
            if bias:
                self.bias = Parameter(ct.zeros(*self.normalized_shape, dtype=dtype))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, x: ct.Tensor) -> ct.Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class Dropout(Module):
    """Zero each element with probability ``p`` in training mode (scaling the rest by
    ``1/(1-p)``); the mask comes from ``ct.rand_like``, so it is layout-independent."""

    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__()
        self.p = F.check_probability("Dropout", "p", p)
        self.inplace = bool(inplace)

    def forward(self, x: ct.Tensor) -> ct.Tensor:
        if not self.training or self.p == 0.0:
            return x
        return F.dropout(x, self.p, self.training, self.inplace)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class GELU(Module):
    """GELU activation (``approximate="tanh"`` for GPT-2's form)."""

    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: argument 'approximate' must be 'none' or 'tanh', got "
                             f"{approximate!r}")
        self.approximate = approximate

    def forward(self, x: ct.Tensor) -> ct.Tensor:
        return F.gelu(x, approximate=self.approximate)


class ReLU(Module):
    """ReLU activation (``inplace`` as :func:`F.relu`)."""

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = bool(inplace)

    def forward(self, x: ct.Tensor) -> ct.Tensor:
        return F.relu(x, self.inplace)


class Identity(Module):
    """Returns its input."""

    def forward(self, x):
        return x


class _Indexed(Module):
    """Children in order: ``len(c)``, ``c[i]``, ``for m in c``."""

    def __getitem__(self, index: int) -> Module:
        return list(self._modules.values())[index]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())


class Sequential(_Indexed):
    """Modules applied in order; children are named ``"0"``, ``"1"``, ... (or by the
    keys of an ``OrderedDict``).

    >>> mlp = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))
    """

    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], OrderedDict):
            items = list(modules[0].items())
        else:
            items = [(str(i), m) for i, m in enumerate(modules)]
        for name, m in items:
            if not isinstance(m, Module):
                raise TypeError(f"Sequential: every argument must be an nn.Module, got "
                                f"{type(m).__name__} at {name!r}")
            self.add_module(name, m)

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x


class ModuleList(_Indexed):
    """A list of modules registered as children ``"0"``, ``"1"``, ...

    >>> blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
    """

    def __init__(self, modules: Optional[Iterable[Module]] = None):
        super().__init__()
        for m in modules or ():
            self.append(m)

    def append(self, module: Module) -> "ModuleList":
        if not isinstance(module, Module):
            raise TypeError(f"ModuleList.append: argument 'module' must be an nn.Module, got "
                            f"{type(module).__name__}")
        self.add_module(str(len(self._modules)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> "ModuleList":
        for m in modules:
            self.append(m)
        return self

    def forward(self, *args, **kwargs):
        raise TypeError("ModuleList: a ModuleList has no forward(); iterate over it")


class ModuleDict(Module):
    """A dict of modules registered as children under their keys."""

    def __init__(self, modules: Optional[dict] = None):
        super().__init__()
        for k, m in (modules or {}).items():
            self[k] = m

    def __setitem__(self, key: str, module: Module) -> None:
        if not isinstance(key, str):
            raise TypeError(f"ModuleDict: keys must be str, got {key!r}")
        self.add_module(key, module)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __contains__(self, key: str) -> bool:
        return key in self._modules

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def keys(self):
        return self._modules.keys()

    def values(self):
        return self._modules.values()

    def items(self):
        return self._modules.items()

    def forward(self, *args, **kwargs):
        raise TypeError("ModuleDict: a ModuleDict has no forward(); index it by key")


class RMSNorm(Module):
    """Root-mean-square normalisation over the last dim(s) (PyTorch's arguments): ``y = x *
    rsqrt(mean(x^2) + eps) * weight`` with ``weight`` ones; ``eps=None`` is the dtype's
    machine epsilon at run time, as PyTorch.

    >>> norm = nn.RMSNorm(64, eps=1e-6)
    """

    def __init__(self, normalized_shape, eps: Optional[float] = None,
                 elementwise_affine: bool = True, device=None, dtype=None):
        super().__init__()
        check_device("RMSNorm", device)
        if isinstance(normalized_shape, (int, np.integer)):
            normalized_shape = (int(normalized_shape),)
        self.normalized_shape = tuple(_positive("RMSNorm", "normalized_shape", n)
                                      for n in normalized_shape)
        self.eps = None if eps is None else float(eps)
        self.elementwise_affine = bool(elementwise_affine)
        if self.elementwise_affine:
            self.weight = Parameter(ct.ones(*self.normalized_shape, dtype=_dtype(dtype)))
        else:
            self.register_parameter("weight", None)

    def forward(self, x: ct.Tensor) -> ct.Tensor:
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


def _as_parameter(fn: str, value) -> Parameter:
    if isinstance(value, Parameter):
        return value
    if isinstance(value, ct.Tensor):  # PyTorch wraps a plain tensor
        return Parameter(value.detach(), requires_grad=value.dtype.kind in "fc")
    raise TypeError(f"{fn}: values must be nn.Parameter or ct.Tensor, got "
                    f"{type(value).__name__}")


class ParameterList(Module):
    """A list of parameters registered as ``"0"``, ``"1"``, ... (plain tensors are wrapped
    in :class:`Parameter`).

    >>> experts = nn.ParameterList([nn.Parameter(ct.zeros(4, 4)) for _ in range(3)])
    >>> experts[0].shape
    (4, 4)
    """

    def __init__(self, values: Optional[Iterable] = None):
        super().__init__()
        for v in values or ():
            self.append(v)

    def append(self, value) -> "ParameterList":
        self.register_parameter(str(len(self._parameters)),
                                _as_parameter("ParameterList.append", value))
        return self

    def extend(self, values: Iterable) -> "ParameterList":
        for v in values:
            self.append(v)
        return self

    def _key(self, index: int) -> str:
        n = len(self._parameters)
        if not isinstance(index, (int, np.integer)) or not -n <= index < n:
            raise IndexError(f"ParameterList: index {index!r} is out of range for {n} "
                             f"parameters")
        return str(int(index) % n)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return ParameterList(list(self._parameters.values())[index])
        return self._parameters[self._key(index)]

    def __setitem__(self, index: int, value) -> None:
        self.register_parameter(self._key(index),
                                _as_parameter("ParameterList.__setitem__", value))

    def __len__(self) -> int:
        return len(self._parameters)

    def __iter__(self) -> Iterator[Parameter]:
        return iter(self._parameters.values())

    def forward(self, *args, **kwargs):
        raise TypeError("ParameterList: a ParameterList has no forward(); index it")

    def extra_repr(self) -> str:
        return "\n".join(f"({k}): Parameter containing: {tuple(p.shape)} {p.dtype}"
                         for k, p in self._parameters.items())


class ParameterDict(Module):
    """A dict of parameters registered under their (str) keys.

    >>> scales = nn.ParameterDict({"a": nn.Parameter(ct.ones(3))})
    """

    def __init__(self, parameters: Optional[dict] = None):
        super().__init__()
        for k, v in (parameters or {}).items():
            self[k] = v

    def __setitem__(self, key: str, value) -> None:
        if not isinstance(key, str):
            raise TypeError(f"ParameterDict: keys must be str, got {key!r}")
        self.register_parameter(key, _as_parameter("ParameterDict", value))

    def __getitem__(self, key: str) -> Parameter:
        return self._parameters[key]

    def __contains__(self, key: str) -> bool:
        return key in self._parameters

    def __len__(self) -> int:
        return len(self._parameters)

    def __iter__(self) -> Iterator[str]:
        return iter(self._parameters)

    def keys(self):
        return self._parameters.keys()

    def values(self):
        return self._parameters.values()

    def items(self):
        return self._parameters.items()

    def forward(self, *args, **kwargs):
        raise TypeError("ParameterDict: a ParameterDict has no forward(); index it by key")
