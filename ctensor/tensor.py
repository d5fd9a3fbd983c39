"""The global tensor type: logical metadata plus the shards this process holds.

A :class:`Tensor` is *logical*: its shape is the whole tensor's, whatever the layout.
``_shards`` maps each rank this process holds (and the placement contains) to that rank's
NumPy/CuPy array. The type holds no op bodies: its operators call the op functions in
:data:`ctensor.registry.OPS`, and its op methods (``x.sum()``, ``x.reshape()``, ...) are the
public op functions themselves, bound by their declarations in ``ops/`` (see
:func:`ctensor.dispatch.defop`). It communicates only through ops: the value accessors
(``numpy``, ``item``, ``bool``, ``float``, ``repr`` in one process) run ``to_global``, which
gathers, and are therefore collective.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from . import autograd, grad_hooks, memory
from .arrays import is_host, to_host
from .layout import Layout
from .errors import MetaModeError
from .meta import MetaBuffer, describe, held_values, no_values, share_arrays, shared
from .placement import Placement
from .registry import OPS
from .runtime import Mode, world
from .sbp import Broadcast, format_sbp

__all__ = ["Tensor", "TENSOR_TYPES", "Version", "is_tensor", "numel", "is_floating_point"]

#: Tensor and its subclasses (nn.Parameter): the dispatch fast path checks ``type(v) in``
TENSOR_TYPES: set = set()


class Version:
    """How often the shards of a tensor were written in place; shared by the tensors that
    share those shards (``detach()``, views), so autograd can tell that a tensor saved for
    a backward was modified after it was saved."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


class Tensor:
    """A global tensor: ``shape``, ``dtype``, ``placement``, ``sbp`` and per-rank shards.

    Make one with :func:`ct.tensor`, :func:`ct.from_local` or a constructor such as
    :func:`ct.zeros`; redistribute with :meth:`to_global`.
    """

    __slots__ = ("_layout", "_shards", "requires_grad", "grad", "_node", "_out_index", "_version",
                 "_grad_layout", "_retains_grad", "_boxed", "_hooks", "__weakref__")
    __array_priority__ = 1000  # numpy_array + tensor -> Tensor.__radd__

    #: names of the op methods bound by op declarations (``defop(..., method=...)``)
    _op_methods: dict = {}

    def __init__(self, layout: Layout, shards: dict, requires_grad: bool = False):
        self._layout = layout
        self._shards = shards
        self.requires_grad = requires_grad
        self.grad: Optional[Tensor] = None
        self._node = None  # autograd.Node that produced this tensor (None for leaves)
        self._out_index = 0  # which output of that node this tensor is
        self._version = Version()
        self._grad_layout = None  # where backward() leaves this leaf's gradient (None: here)
        self._retains_grad = False
        self._boxed = None  # {layout: (write count, own layout, copy)}: boxings kept for reuse
        if memory.tracking:  # ct.debug.track_memory(): count the buffers behind the shards
            memory.track(self)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        TENSOR_TYPES.add(cls)

    @classmethod
    def _bind_method(cls, name: str, fn: Callable) -> None:
        """Make the op function ``fn`` the method ``Tensor.<name>`` (called by op
        declarations only; a name the class defines itself is never replaced)."""
        if name in cls._op_methods or name in cls.__dict__:
            raise RuntimeError(f"Tensor.{name} is already defined; op declarations cannot "
                               f"replace it")
        cls._op_methods[name] = fn
        setattr(cls, name, fn)

    # ----------------------------------------------------------------- metadata
    @property
    def shape(self) -> tuple:
        return self._layout.shape

    @property
    def dtype(self) -> np.dtype:
        return self._layout.dtype

    @property
    def ndim(self) -> int:
        return len(self._layout.shape)

    def dim(self) -> int:
        return self.ndim

    @property
    def placement(self):
        return self._layout.placement

    @property
    def sbp(self) -> tuple:
        return self._layout.sbp

    @property
    def is_leaf(self) -> bool:
        return self._node is None

    @property
    def grad_fn(self):
        return self._node

    @property
    def device(self) -> str:
        return self._layout.placement.device

    def size(self, dim: Optional[int] = None):
        """The shape, or its entry at ``dim`` (PyTorch style; ``x.size(-1)``)."""
        if dim is None:
            return self.shape
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
            raise TypeError(f"size: argument 'dim' must be an int, got {dim!r}")
        if not -max(self.ndim, 1) <= dim < max(self.ndim, 1) or not self.ndim:
            raise IndexError(f"size: dim {dim} is out of range for a tensor of {self.ndim} "
                             f"dims; accepted {-self.ndim}..{self.ndim - 1}")
        return self.shape[dim]

    def numel(self) -> int:
        """The number of elements (``nelement()`` is the same)."""
        return self._layout.numel

    nelement = numel

    def element_size(self) -> int:
        """Bytes per element (``x.element_size() * x.numel()`` is the logical size)."""
        return self.dtype.itemsize

    def is_floating_point(self) -> bool:
        """Whether the dtype is float16, float32 or float64."""
        return self.dtype.kind == "f"

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    # ----------------------------------------------------------------- shards
    @property
    def is_meta(self) -> bool:
        """Whether this tensor is shape-only (made in ``ct.simulate(n, meta=True)``): its
        layout without data."""
        return type(self._shards) is MetaBuffer

    @property
    def layout(self):
        """Shape, dtype, placement and SBP as one immutable value (interned: equal layouts
        are the same object, so it keys a cache cheaply); what ``Tensor(layout, shards)``
        is made from."""
        return self._layout

    def shares_shards(self, other) -> bool:
        """Whether ``other`` holds this tensor's very shards (same layout, the same arrays:
        a ``detach()`` or a ``set_`` of it), not merely equal values. A process that holds
        no rank of the placement tells only a ``detach()`` (or the tensor itself) apart."""
        if not isinstance(other, Tensor) or other._layout is not self._layout:
            return False
        return share_arrays(self._shards, other._shards, every=True)

    def free_(self) -> "Tensor":
        """Drop this process's shards (their memory goes once nothing else holds them),
        keeping the layout, the autograd node and the flags: what ``nn.fully_shard`` does
        with a gathered parameter after its module's forward. Reading the values or using
        the tensor in an op afterwards is an error, until :meth:`set_` gives it shards
        again. Not differentiable.

        >>> full = shard.to_global(mesh, ct.sbp.broadcast); y = layer(full); full.free_()
        """
        self._shards = {}
        return self

    def _values(self, fn: str) -> dict:
        return held_values(self._shards, fn)  # shape-only: MetaModeError

    def local_shards(self) -> dict:
        """``{rank: array}`` for the ranks of the placement that this process holds."""
        self._values("local_shards")
        return dict(self._shards)

    def to_local(self, rank: Optional[int] = None):
        """This rank's shard (``rank`` is required in a simulation of several ranks).

        Returns ``None`` on a process that holds no rank of the placement.
        """
        self._values("to_local")
        w = world()
        if rank is None:
            if len(w.held_ranks) > 1:
                raise ValueError(f"to_local: argument 'rank' is required in a simulation of "
                                 f"{w.size} ranks (given None); pass one of "
                                 f"{list(self.placement.rank_list)} or use local_shards()")
            rank = w.held_ranks[0]
        if rank not in self.placement:
            if rank in w.held_ranks:
                return None
            raise ValueError(f"to_local: argument 'rank' is {rank}, which is not in placement "
                             f"{self.placement!r}")
        if rank not in self._shards:
            raise ValueError(f"to_local: rank {rank} is not held by this process (it holds "
                             f"{list(w.held_ranks)}); under mpiexec each process sees its own "
                             f"shard only")
        return self._shards[rank]

    # ----------------------------------------------------------------- conversion
    def to_global(self, placement=None, sbp=None, async_op: bool = False):
        """Redistribute to ``placement`` (default: the same) and ``sbp`` (default: the same
        SBP when the placement's mesh has the same number of axes, else broadcast).

        Differentiable; returns ``self`` when nothing changes. Collective: every rank of
        both placements must call it. ``async_op=True`` only starts the move and returns a
        :class:`~ctensor.PendingTensor` whose ``wait()`` gives the result: a rank that only
        sends (another placement's producer) goes on at once, and a receiver waits only
        when it asks for the data.

        >>> y = x.to_global(sbp=ct.sbp.broadcast)      # all-gather / all-reduce as needed
        >>> moving = x.to_global(other, sbp=ct.sbp.split(0), async_op=True)
        >>> z = moving.wait()
        """
        return OPS.to_global(self, placement, sbp, async_op=async_op)

    def numpy(self) -> np.ndarray:
        """A copy of the whole logical value as a NumPy array, on every rank of the world
        (collective: a tensor that is not broadcast over the world is gathered)."""
        self._values("numpy")
        w = world()
        everyone = Placement(self.placement.device, list(range(w.size)))
        if set(self.placement.rank_list) == set(everyone.rank_list):
            everyone = self.placement
        with autograd.no_grad():
            full = OPS.to_global(self, everyone, (Broadcast(),) * everyone.ndim)
        arr = full._shards[w.held_ranks[0]]
        return np.array(arr, copy=True) if is_host(arr) else to_host(arr, explicit=True)

    def item(self):
        """The value of a one-element tensor as a Python scalar (collective)."""
        self._values("item")
        if self.numel() != 1:
            raise ValueError(f"item: the tensor has {self.numel()} elements (shape "
                             f"{self.shape}); only one-element tensors can be converted")
        return self.numpy().reshape(()).item()

    def tolist(self):
        """The logical value as nested Python lists (collective)."""
        return self.numpy().tolist()

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __bool__(self) -> bool:
        return bool(self.item())

    def __format__(self, spec: str) -> str:
        """``f"{loss:.4f}"``: a 0-d tensor formats as its Python scalar (collective, like
        :meth:`item`); other tensors take only the empty spec (their ``str``), as PyTorch."""
        if self.ndim == 0:
            try:
                value = self.item()
            except MetaModeError:  # shape-only: no value to format
                if not spec:
                    return str(self)
                raise no_values("format") from None
            return format(value, spec)
        if spec:
            raise TypeError(f"unsupported format string {spec!r} for a tensor of shape "
                            f"{tuple(self.shape)}; format a 0-d tensor or x.item()")
        return str(self)

    def cpu(self) -> "Tensor":
        """The tensor on the same mesh of ranks on the host (``self`` when its placement is
        already ``cpu``; from ``cuda``, each rank copies its shard to host memory)."""
        if self.placement.device == "cpu":
            return self
        return self.to_global(Placement("cpu", self.placement.ranks.tolist()), self.sbp)

    def __array__(self, dtype=None, copy=None):
        arr = self.numpy()
        return arr.astype(dtype) if dtype is not None else arr

    def __repr__(self) -> str:
        grad = ", requires_grad=True" if self.requires_grad else ""
        head = (f"tensor(shape={tuple(self.shape)}, dtype={self.dtype}, "
                f"placement={self.placement!r}, sbp={format_sbp(self.sbp)}{grad}")
        tail = describe(self._shards)
        if tail:  # shape-only
            return head + tail + ")"
        if world().mode is not Mode.MPI and self.numel() <= 64 and self._shards:
            try:  # in one process the value is at hand without asking other processes
                body = np.array2string(self.numpy(), separator=", ", prefix="       ")
                return head + f",\n       {body})"
            except Exception:  # noqa: BLE001 - repr must never raise
                pass
        return head + ")"

    def visualize(self) -> str:
        """A text picture of the layout (see :func:`ct.debug.visualize`)."""
        from .debug import visualize  # debug imports the world, not this module
        return visualize(self)

    # ----------------------------------------------------------------- autograd
    def backward(self, grad: Optional["Tensor"] = None, retain_graph: bool = False) -> None:
        """Accumulate d(self)/d(leaf) into every leaf's ``.grad`` (collective).

        ``grad`` (a ct.Tensor or a NumPy array of this tensor's shape) is required unless
        the tensor has one element.
        """
        if not self.requires_grad:
            raise ValueError("backward: the tensor does not require grad (no input of the "
                             "computation had requires_grad=True, or it ran under ct.no_grad())")
        if grad is None:
            if self.numel() != 1:
                raise ValueError(f"backward: grad can be implicitly created only for scalar "
                                 f"outputs; the tensor has shape {tuple(self.shape)}, pass "
                                 f"grad= with that shape")
            grad = OPS.ones_like(self)
        elif isinstance(grad, (np.ndarray, np.generic, list, float, int)):
            grad = OPS.tensor(np.asarray(grad, dtype=self.dtype), placement=self.placement,
                              sbp=tuple(Broadcast() for _ in self.sbp))
        elif not isinstance(grad, Tensor):
            raise TypeError(f"backward: argument 'grad' must be a ct.Tensor or a NumPy array, "
                            f"got {type(grad).__name__}")
        if tuple(grad.shape) != tuple(self.shape):
            raise ValueError(f"backward: argument 'grad' has shape {tuple(grad.shape)} but the "
                             f"tensor has shape {tuple(self.shape)}")
        autograd.backward(self, grad, retain_graph=retain_graph)

    def detach(self) -> "Tensor":
        """The same shards, cut from the graph (no copy; in-place writes show in both)."""
        out = Tensor(self._layout, self._shards)
        out._version = self._version
        return out

    def retain_grad(self) -> None:
        """Keep this non-leaf tensor's gradient in ``.grad`` after ``backward()`` (leaves
        always keep theirs), like PyTorch.

        >>> h = x @ w; h.retain_grad(); h.sum().backward(); h.grad
        """
        if not self.requires_grad:
            raise ValueError("retain_grad: the tensor does not require grad, so it never gets "
                             "one")
        if not self.is_leaf:
            self._retains_grad = True

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        """Turn gradient tracking on (or off) for this leaf; floating tensors only."""
        if not self.is_leaf and not requires_grad:
            raise ValueError("requires_grad_: a non-leaf tensor cannot stop requiring grad; "
                             "use detach()")
        if requires_grad and self.dtype.kind not in "fc":
            raise ValueError(f"requires_grad_: only floating tensors can require grad, got "
                             f"dtype {self.dtype}; convert it with .float() first")
        self.requires_grad = bool(requires_grad)
        return self

    def set_(self, source: "Tensor") -> "Tensor":
        """Make this tensor take ``source``'s layout and shards (shared, like PyTorch's
        ``set_``), keeping its own identity and autograd flags. Used to reshard parameters
        in place; not differentiable."""
        if not isinstance(source, Tensor):
            raise TypeError(f"set_: argument 'source' must be a ct.Tensor, got "
                            f"{type(source).__name__}")
        self._layout = source._layout
        self._shards = shared(source._shards)
        self._version.value += 1
        if memory.tracking:
            memory.track(self)
        return self

    # ----------------------------------------------------------------- operators
    def __add__(self, o): return OPS.add(self, o)
    def __radd__(self, o): return OPS.add(o, self)
    def __sub__(self, o): return OPS.sub(self, o)
    def __rsub__(self, o): return OPS.sub(o, self)
    def __mul__(self, o): return OPS.mul(self, o)
    def __rmul__(self, o): return OPS.mul(o, self)
    def __truediv__(self, o): return OPS.div(self, o)
    def __rtruediv__(self, o): return OPS.div(o, self)
    def __pow__(self, o): return OPS.pow(self, o)
    def __rpow__(self, o): return OPS.pow(o, self)
    def __mod__(self, o): return OPS.remainder(self, o)
    def __rmod__(self, o): return OPS.remainder(o, self)
    def __floordiv__(self, o): return OPS.floor_divide(self, o)
    def __rfloordiv__(self, o): return OPS.floor_divide(o, self)
    def __matmul__(self, o): return OPS.matmul(self, o)
    def __rmatmul__(self, o): return OPS.matmul(o, self)
    def __neg__(self): return OPS.neg(self)
    def __pos__(self): return self
    def __abs__(self): return OPS.abs(self)
    def __invert__(self): return OPS.logical_not(self)
    def __eq__(self, o): return OPS.eq(self, o)  # type: ignore[override]
    def __ne__(self, o): return OPS.ne(self, o)  # type: ignore[override]
    def __lt__(self, o): return OPS.lt(self, o)
    def __le__(self, o): return OPS.le(self, o)
    def __gt__(self, o): return OPS.gt(self, o)
    def __ge__(self, o): return OPS.ge(self, o)
    def __and__(self, o): return OPS.logical_and(self, o)
    def __or__(self, o): return OPS.logical_or(self, o)
    def __getitem__(self, index): return OPS.getitem(self, index)
    def __setitem__(self, index, value): OPS.setitem(self, index, value)  # in place
    # in place, PyTorch's semantics (see ctensor/ops/inplace.py)
    def __iadd__(self, o): return OPS.add_(self, o)
    def __isub__(self, o): return OPS.sub_(self, o)
    def __imul__(self, o): return OPS.mul_(self, o)
    def __itruediv__(self, o): return OPS.div_(self, o)
    def __ipow__(self, o): return OPS.pow_(self, o)
    def __imod__(self, o): return OPS.remainder_(self, o)
    def __ifloordiv__(self, o): return OPS.floor_divide_(self, o)
    __hash__ = object.__hash__

    @property
    def T(self) -> "Tensor":
        """The tensor with its dims reversed."""
        return OPS.permute(self, *reversed(range(self.ndim)))

    @property
    def mT(self) -> "Tensor":
        """The last two dims swapped (a batch of matrices transposed)."""
        if self.ndim < 2:
            raise ValueError(f"mT: the tensor has {self.ndim} dims; it needs at least 2 (a "
                             f"matrix or a batch of matrices)")
        return OPS.transpose(self, -2, -1)

    def register_hook(self, hook: Callable):
        """Call ``hook(grad)`` with this tensor's gradient each time a backward pass computes
        it (leaf or not, as PyTorch); a hook that returns a tensor replaces the gradient.
        Returns a handle whose ``remove()`` takes the hook off.

        >>> h = w.register_hook(lambda g: g * 0.5)     # w.grad gets half the gradient
        >>> h.remove()
        """
        return grad_hooks.register(self, hook)


TENSOR_TYPES.add(Tensor)
memory.register_tensor_class(Tensor)


def is_tensor(obj) -> bool:
    """Whether ``obj`` is a ct.Tensor (an ``nn.Parameter`` too), as ``torch.is_tensor``."""
    return isinstance(obj, Tensor)


def _tensor_arg(fn: str, x) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{fn}: argument 'input' must be a ct.Tensor, got {type(x).__name__}")
    return x


def numel(x: Tensor) -> int:
    """The number of elements of ``x`` (``ct.numel(x) == x.numel()``)."""
    return _tensor_arg("numel", x).numel()


def is_floating_point(x: Tensor) -> bool:
    """Whether ``x`` has a floating dtype (``x.is_floating_point()``)."""
    return _tensor_arg("is_floating_point", x).is_floating_point()
