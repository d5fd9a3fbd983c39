"""Parallelism as layouts: helpers that only choose SBPs for a model's parameters.

Nothing here communicates. Each helper returns a rule dict (parameter name -> SBP) for
:meth:`Module.to_global` or applies it; dispatch and boxing then insert every collective.

* **Data parallel** — every parameter broadcast; the user splits the batch ``S(0)`` (see
  :func:`batch_sbp`). Gradients of broadcast parameters are partial after backward and
  are all-reduced when autograd boxes them to the parameter's SBP.
* **Tensor parallel** (Megatron-LM): in attention, query/key/value are *column*-parallel
  (weight ``(out, in)`` split ``S(0)``: each rank computes whole heads) and the output
  projection *row*-parallel (``S(1)``: a partial result, one all-reduce); in the MLP ``fc``
  is column- and ``proj`` row-parallel; the token embedding and the LM head are
  *vocabulary*-parallel (``S(0)``; the cross entropy then works on vocabulary-split logits).
  In a ``Sequential``, consecutive ``Linear`` layers alternate column, row, column, ...
  Everything else (LayerNorm, position embedding, row-parallel biases) is broadcast.
* **2-D** on a ``(dp, tp)`` mesh: broadcast along the data-parallel axis and the
  tensor-parallel rule along the other, e.g. ``(B, S(0))``.
* **Expert parallel** (GShard; Megatron-Core's EP within DP): an ``nn.MoE``'s experts
  ``S(0)`` on an expert axis that also splits the batch (:func:`expert_parallel_rules`);
  the dispatch and the combine are then one all-to-all each (boxing), and with a tensor
  axis the experts' hidden dim is split there too (ETP, one reduction). The router is
  broadcast.
* **Sequence parallel** (Megatron-SP, ``sequence_parallel=True``): the same parameter
  layouts, and the *residual stream* — the input of every transformer ``Block``, of every
  ``LayerNorm`` and of the dropouts of what is added to it — laid out ``S(1)`` (split along
  the sequence) on the tensor-parallel axis. Nothing else is stated: the cost model then
  places an all-gather before each column-parallel linear (its input must be whole), a reduce-scatter after each
  row-parallel one (the partial output meets the split residual), and their duals in the
  backward; LayerNorm, dropout and the residual adds run on sequence shards.

>>> mesh = ct.placement("cpu", [[0, 1], [2, 3]])           # (dp=2, tp=2)
>>> nn.parallel.hybrid_parallel(model, mesh)
>>> idx = idx.to_global(mesh, nn.parallel.batch_sbp(mesh))  # (S(0), B)
"""
from __future__ import annotations

import weakref
from typing import Optional

import ctensor as ct

from .fsdp import fully_shard  # noqa: F401  (nn.parallel.fully_shard: ZeRO-2/3 by SBP)
from .layers import Embedding, LayerNorm, Linear, Sequential
from .module import Module
from .moe import MoE
from .transformer import GPT, MLP, Block, CausalSelfAttention

__all__ = ["data_parallel", "data_parallel_rules", "tensor_parallel", "tensor_parallel_rules",
           "hybrid_parallel", "hybrid_parallel_rules", "sequence_parallel", "batch_sbp",
           "expert_parallel_rules", "fully_shard"]

S, B = ct.sbp.split, ct.sbp.broadcast
COLUMN = {"weight": S(0), "bias": S(0)}   # output features split
ROW = {"weight": S(1)}                    # input features split; bias broadcast


def _check_module(fn: str, module) -> None:
    if not isinstance(module, Module):
        raise TypeError(f"{fn}: argument 'module' must be an nn.Module, got "
                        f"{type(module).__name__}")


def _check_placement(fn: str, placement, ndim=None) -> None:
    if not isinstance(placement, ct.Placement):
        raise TypeError(f"{fn}: argument 'placement' must be a ct.placement, got "
                        f"{placement!r} ({type(placement).__name__})")
    if ndim is not None and placement.ndim != ndim:
        raise ValueError(f"{fn}: argument 'placement' must be a {ndim}-D mesh, got "
                         f"{placement!r} with {placement.ndim} axes")


def data_parallel_rules(module: Module, mesh_ndim: int = 1) -> dict:
    """Every parameter broadcast on a mesh of ``mesh_ndim`` axes."""
    _check_module("data_parallel_rules", module)
    return {name: (B,) * mesh_ndim for name, _ in module.named_parameters()}


def data_parallel(module: Module, placement) -> Module:
    """Replicate ``module`` over ``placement`` (every parameter broadcast) and return it.

    >>> model = nn.parallel.data_parallel(model, ct.placement("cpu", [0, 1]))
    >>> x = x.to_global(sbp=ct.sbp.split(0))                   # split the batch
    """
    _check_module("data_parallel", module)
    _check_placement("data_parallel", placement)
    return module.to_global(placement, (B,) * placement.ndim)


def _linear_rules(prefix: str, linear: Linear, kind: dict, rules: dict) -> None:
    for pname, sbp in kind.items():
        if getattr(linear, pname, None) is not None:
            rules[f"{prefix}.{pname}" if prefix else pname] = sbp


def tensor_parallel_rules(module: Module) -> dict:
    """Megatron-style 1-D rules ``{parameter name: SBP}`` for the layers this module
    contains (attention, MLP, GPT embeddings and head, Linear pairs in Sequential);
    parameters without a rule are broadcast by ``to_global``.

    >>> nn.parallel.tensor_parallel_rules(nn.MLP(8))
    {'fc.weight': S(0), 'fc.bias': S(0), 'proj.weight': S(1)}
    """
    _check_module("tensor_parallel_rules", module)
    rules: dict = {}
    for name, mod in module.named_modules():
        def sub(child: str) -> str:
            return f"{name}.{child}" if name else child

        if isinstance(mod, CausalSelfAttention):
            for child in ("query", "key", "value"):
                _linear_rules(sub(child), getattr(mod, child), COLUMN, rules)
            _linear_rules(sub("proj"), mod.proj, ROW, rules)
        elif isinstance(mod, MLP):
            _linear_rules(sub("fc"), mod.fc, COLUMN, rules)
            _linear_rules(sub("proj"), mod.proj, ROW, rules)
        elif isinstance(mod, MoE):  # expert tensor parallel (ETP); the router replicated
            rules.update({sub("router.weight"): B, sub("w1"): S(2), sub("w2"): S(1)})
        elif isinstance(mod, GPT):
            rules[sub("wte.weight")] = S(0)
            if not mod.tie_weights:
                rules[sub("lm_head.weight")] = S(0)
        elif isinstance(mod, Sequential):
            linears = [(k, m) for k, m in mod.named_children() if isinstance(m, Linear)]
            for i, (k, lin) in enumerate(linears):
                _linear_rules(sub(k), lin, COLUMN if i % 2 == 0 else ROW, rules)
        elif isinstance(mod, Embedding) and not name:
            rules["weight"] = S(0)
    return rules


def _check_covered(fn: str, module: Module, rules: dict) -> None:
    """``ValueError`` naming the ``Linear`` layers that ``rules`` leaves without a
    tensor-parallel layout (they would run replicated on every rank: no memory saved, no
    speed-up) and the ``to_global`` call that lays them out, before anything moves."""
    ruled = {id(p) for name, p in module.named_parameters() if name in rules}
    missing = [(name, mod) for name, mod in module.named_modules()
               if isinstance(mod, Linear) and id(mod.weight) not in ruled]
    if not missing:
        return
    pairs = []
    for i, (name, mod) in enumerate(missing):  # Megatron's pattern: column, row, ...
        prefix = f"{name}." if name else ""
        if i % 2 == 0:
            pairs.append(f"'{prefix}weight': ct.sbp.split(0)")
            if mod.bias is not None:
                pairs.append(f"'{prefix}bias': ct.sbp.split(0)")
        else:
            pairs.append(f"'{prefix}weight': ct.sbp.split(1)")
    shown = [name or "(the module itself)" for name, _ in missing]
    raise ValueError(
        f"{fn}: no tensor-parallel rule for the Linear layers {shown} of "
        f"{type(module).__name__}; they would stay replicated on every rank. Lay them out by "
        f"SBP rules, e.g. Megatron's column-parallel then row-parallel pair (the second "
        f"Linear consumes the first one's output): model.to_global(mesh, "
        f"{{**nn.parallel.tensor_parallel_rules(model), {', '.join(pairs)}}}); or replicate "
        f"on purpose with nn.parallel.data_parallel(model, mesh)")


def _residual_stream_modules(module: Module) -> list:
    """The modules whose input is the residual stream of a pre-LayerNorm transformer: every
    ``Block`` and every ``LayerNorm`` (the two inside each block and the final one), and the
    dropouts of what is added to it (attention's and the MLP's output dropout, the GPT's
    embedding dropout): Megatron-SP runs them on sequence shards, after the reduce-scatter
    of the row-parallel output, so the mask and everything after it are 1/tp the size."""
    out = []
    for _, mod in module.named_modules():
        if isinstance(mod, (Block, LayerNorm)):
            out.append(mod)
        elif isinstance(mod, CausalSelfAttention):
            out.append(mod.resid_dropout)
        elif isinstance(mod, MLP):
            out.append(mod.dropout)
        elif isinstance(mod, GPT):
            out.append(mod.drop)
    return out


def _gathering_modules(module: Module) -> list:
    """The modules that gather the sequence-split stream for a column-parallel linear:
    every ``Block`` (query, key and value share one gather, the MLP's ``fc`` another) and
    the GPT's LM head."""
    return [mod for _, mod in module.named_modules() if isinstance(mod, Block)] + \
        [mod.lm_head for _, mod in module.named_modules() if isinstance(mod, GPT)]


#: module -> (mesh axis, entry SBP, regather) of the sequence-parallel hooks it carries
_sequence_hooks: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class _SequenceHooks:
    """The forward hooks that make a module take its first input laid out ``entry`` along
    ``mesh_axis`` (a differentiable ``to_global``, free when it already is) and, with
    ``regather``, run its forward inside ``ct.autograd.regather_saved()``."""

    def __init__(self, mesh_axis: int, entry, regather: bool):
        self.mesh_axis, self.entry, self.regather = mesh_axis, entry, regather
        self.blocks: list = []  # the regather_saved blocks of the forwards running

    def before(self, module, args):
        x = args[0] if args else None
        if self.entry is not None and isinstance(x, ct.Tensor) and \
                x.placement.ndim > self.mesh_axis and x.ndim > 1:
            sbp = list(x.sbp)
            sbp[self.mesh_axis] = self.entry
            args = (x.to_global(x.placement, tuple(sbp)),) + tuple(args[1:])
        if self.regather:
            block = ct.autograd.regather_saved()
            block.__enter__()
            self.blocks.append(block)
        return args

    def after(self, module, args, output):  # (always called: a failed forward too)
        if self.regather and self.blocks:
            self.blocks.pop().__exit__(None, None, None)


def _hook_forward(module: Module, fn: str, mesh_axis: int, entry=None,
                  regather: bool = False) -> None:
    """Give ``module`` the :class:`_SequenceHooks` ``(mesh_axis, entry, regather)``, once."""
    wanted = (mesh_axis, entry, regather)
    current = _sequence_hooks.get(module)
    if current is not None:
        if current != wanted:
            raise ValueError(f"{fn}: {type(module).__name__} is already laid out (input "
                             f"axis, SBP, regather {current}, now asked for {wanted}); lay "
                             f"the model out once")
        return
    hooks = _SequenceHooks(mesh_axis, entry, regather)
    module.register_forward_pre_hook(hooks.before)
    module.register_forward_hook(hooks.after, always_call=True)
    _sequence_hooks[module] = wanted


def sequence_parallel(module: Module, tp_axis: int = 0, regather: bool = True) -> Module:
    """Lay the residual stream out along the sequence on mesh axis ``tp_axis`` (Megatron
    sequence parallelism; see the module docstring): the input of every ``Block``, of
    every ``LayerNorm`` and of the residual dropouts (attention and MLP output, the GPT's
    embedding) becomes ``S(1)`` there. Use with the tensor-parallel parameter
    layout (``tensor_parallel(..., sequence_parallel=True)`` does both).

    ``regather=True`` (Megatron-SP's choice, the default) keeps the sequence shard of each
    gathered linear input for the backward and gathers it again there (blocks and the LM
    head run inside ``ct.autograd.regather_saved()``): the activations a block keeps are
    then all 1/tp of the stream's size, for one more all-gather per gathered input in the
    backward (``6L + 3`` all-gathers and ``4L + 2`` reduce-scatters per forward and
    backward of an ``L``-block GPT). ``regather=False`` keeps the gathered copies instead
    (``4L + 2`` of each; more memory).

    >>> nn.parallel.sequence_parallel(model)
    """
    _check_module("sequence_parallel", module)
    if not isinstance(regather, bool):
        raise TypeError(f"sequence_parallel: argument 'regather' must be a bool, got "
                        f"{regather!r}")
    targets = _residual_stream_modules(module)
    if not targets:
        raise ValueError("sequence_parallel: the module contains no transformer Block or "
                         "LayerNorm whose input is a residual stream; accepted: models built "
                         "from nn.Block (such as nn.GPT)")
    gathering = {id(m): m for m in _gathering_modules(module)} if regather else {}
    for mod in targets:
        _hook_forward(mod, "sequence_parallel", tp_axis, S(1), gathering.pop(id(mod), None)
                      is not None)
    for mod in gathering.values():  # (the LM head: its input is laid out by the LayerNorm)
        _hook_forward(mod, "sequence_parallel", tp_axis, None, True)
    return module


_sequence_parallel = sequence_parallel  # (the name that tensor_parallel's flag shadows)


def tensor_parallel(module: Module, placement, sequence_parallel: bool = False) -> Module:
    """Lay ``module`` out tensor-parallel over a 1-D ``placement`` and return it; feed it
    broadcast inputs. Rules exist for ``nn``'s attention, MLP, GPT and ``Sequential``
    layers; a ``Linear`` of a user-written module without one raises ``ValueError`` (before
    anything moves) naming it and the ``module.to_global(mesh, {pattern: sbp})`` to write.
    ``sequence_parallel=True`` also splits the residual stream along the
    sequence (Megatron-SP: reduce-scatters and all-gathers instead of all-reduces, and
    LayerNorm and dropout on sequence shards).

    >>> model = nn.parallel.tensor_parallel(model, ct.placement("cpu", [0, 1]))
    """
    _check_module("tensor_parallel", module)
    _check_placement("tensor_parallel", placement, 1)
    rules = tensor_parallel_rules(module)
    _check_covered("tensor_parallel", module, rules)
    module.to_global(placement, rules)
    if sequence_parallel:
        _sequence_parallel(module, 0)
    return module


def hybrid_parallel_rules(module: Module, mesh_ndim: int = 2, tp_axis: int = 1) -> dict:
    """2-D (or N-D) rules: the tensor-parallel SBP on mesh axis ``tp_axis``, broadcast on
    every other axis (data parallel), for every parameter.

    >>> nn.parallel.hybrid_parallel_rules(nn.MLP(8))["fc.weight"]
    (B, S(0))
    """
    _check_module("hybrid_parallel_rules", module)
    if not 0 <= tp_axis < mesh_ndim:
        raise ValueError(f"hybrid_parallel_rules: argument 'tp_axis' must be in "
                         f"0..{mesh_ndim - 1} for a {mesh_ndim}-D mesh, got {tp_axis!r}")
    tp = tensor_parallel_rules(module)
    out = {}
    for name, _ in module.named_parameters():
        sbp = [B] * mesh_ndim
        sbp[tp_axis] = tp.get(name, B)
        out[name] = tuple(sbp)
    return out


def hybrid_parallel(module: Module, placement, tp_axis: int = 1,
                    sequence_parallel: bool = False) -> Module:
    """Data parallel along every mesh axis but ``tp_axis``, tensor parallel along it (and,
    with ``sequence_parallel=True``, the residual stream split along the sequence there).

    >>> mesh = ct.placement("cpu", [[0, 1], [2, 3]])     # rows: data, columns: tensor
    >>> model = nn.parallel.hybrid_parallel(model, mesh)
    """
    _check_module("hybrid_parallel", module)
    _check_placement("hybrid_parallel", placement)
    _check_covered("hybrid_parallel", module, tensor_parallel_rules(module))
    module.to_global(placement, hybrid_parallel_rules(module, placement.ndim, tp_axis))
    if sequence_parallel:
        _sequence_parallel(module, tp_axis)
    return module


def expert_parallel_rules(module: Module, mesh_ndim: int = 1, ep_axis: int = 0,
                          tp_axis: Optional[int] = None) -> dict:
    """Rules laying out the experts of every ``nn.MoE`` in ``module``: ``w1 (E, d, f)``
    and ``w2 (E, f, d)`` split ``S(0)`` on the expert axis ``ep_axis`` and, with
    ``tp_axis``, ``S(2)`` / ``S(1)`` there (expert tensor parallel: one partial output,
    reduced once); broadcast elsewhere. Split the tokens' batch on ``ep_axis`` too (expert
    parallelism within data parallelism, as Megatron-Core): the dispatch's all-to-all then
    carries each group's tokens to their experts. Merge into other rules
    (``{**hybrid_parallel_rules(model, 3, 2), **expert_parallel_rules(model, 3, 1, 2)}``).

    >>> nn.parallel.expert_parallel_rules(nn.MoE(8, 4), 2, ep_axis=0, tp_axis=1)
    {'w1': (S(0), S(2)), 'w2': (S(0), S(1))}
    """
    _check_module("expert_parallel_rules", module)
    for arg, axis in (("ep_axis", ep_axis), ("tp_axis", tp_axis)):
        if axis is not None and not (isinstance(axis, int) and 0 <= axis < mesh_ndim):
            raise ValueError(f"expert_parallel_rules: argument '{arg}' must be a mesh axis "
                             f"in 0..{mesh_ndim - 1}, got {axis!r}")
    if tp_axis == ep_axis:
        raise ValueError(f"expert_parallel_rules: 'ep_axis' and 'tp_axis' are both "
                         f"{ep_axis}; give the experts and their hidden dim different axes")

    def layout(tensor_dim: int) -> tuple:
        sbp = [B] * mesh_ndim
        sbp[ep_axis] = S(0)
        if tp_axis is not None:
            sbp[tp_axis] = S(tensor_dim)
        return tuple(sbp)

    rules = {}
    for name, mod in module.named_modules():
        if isinstance(mod, MoE):
            prefix = f"{name}." if name else ""
            rules[f"{prefix}w1"], rules[f"{prefix}w2"] = layout(2), layout(1)
    if not rules:
        raise ValueError(f"expert_parallel_rules: {type(module).__name__} contains no "
                         f"nn.MoE layer; build the model with experts (nn.GPT(..., "
                         f"moe_experts=E))")
    return rules


def batch_sbp(placement, dp_axis: int = 0, dim: int = 0) -> tuple:
    """The SBP of a batch for data parallelism: ``S(dim)`` on the data-parallel mesh axis,
    broadcast on the others (e.g. ``(S(0), B)`` on a (dp, tp) mesh).

    >>> x = x.to_global(mesh, nn.parallel.batch_sbp(mesh))
    """
    _check_placement("batch_sbp", placement)
    if not 0 <= dp_axis < placement.ndim:
        raise ValueError(f"batch_sbp: argument 'dp_axis' must be in 0..{placement.ndim - 1}, "
                         f"got {dp_axis!r}")
    sbp = [B] * placement.ndim
    sbp[dp_axis] = S(dim)
    return tuple(sbp)
