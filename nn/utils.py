"""``clip_grad_norm_``, ``clip_grad_value_`` and ``checkpoint`` (activation recompute).

``clip_grad_norm_``: the norm is computed with ctensor ops, so each parameter's contribution is reduced over
its own shards by dispatch (a split gradient gives a partial sum; a broadcast one is
counted once): the result is the same for every placement and SBP. Contributions of
parameters on other placements are moved to the first parameter's placement.
"""
from __future__ import annotations

import math
from typing import Iterable, Union

import ctensor as ct

__all__ = ["clip_grad_norm_", "clip_grad_value_", "checkpoint", "is_recomputing"]


def clip_grad_norm_(parameters: Union[ct.Tensor, Iterable[ct.Tensor]], max_norm: float,
                    norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach=None) -> ct.Tensor:
    """Scale the gradients in place so that their joint ``norm_type``-norm is at most
    ``max_norm``; return the norm before clipping (a 0-d tensor, like PyTorch). Replicated
    gradients of one layout take a multi-tensor path (``foreach=False``: never), with the
    same bits.

    >>> loss.backward()
    >>> total = nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    >>> opt.step()
    """
    if isinstance(parameters, ct.Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) or max_norm < 0:
        raise ValueError(f"clip_grad_norm_: argument 'max_norm' must be a number >= 0, got "
                         f"{max_norm!r}")
    norm_type = float(norm_type)
    if not (norm_type > 0):
        raise ValueError(f"clip_grad_norm_: argument 'norm_type' must be > 0 or inf, got "
                         f"{norm_type!r}")
    if not grads:
        return ct.zeros(())
    if foreach is not False and not error_if_nonfinite:  # one pass over the shards, same bits
        from ctensor.optim.foreach import clip_grad_norm
        total = clip_grad_norm(grads, max_norm, norm_type)
        if total is not None:
            return total
    home = grads[0].placement
    replicated = (ct.sbp.broadcast,) * home.ndim
    with ct.no_grad():
        parts = []
        for g in grads:
            if norm_type == 2.0:  # (g * g, as the multi-tensor path squares: the same
                part = (g * g).sum()  # bits on a GPU too, and no pass for |g|)
            else:
                a = g.abs()
                part = a.amax() if math.isinf(norm_type) else (a ** norm_type).sum()
            parts.append(part.to(grads[0].dtype).to_global(home, replicated))
        total = parts[0]
        for part in parts[1:]:
            total = ct.maximum(total, part) if math.isinf(norm_type) else total + part
        if not math.isinf(norm_type):
            total = total ** (1.0 / norm_type)
        if error_if_nonfinite:
            _check_finite(total, norm_type)
        coef = ct.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in grads:
            scale = coef.to_global(g.placement, (ct.sbp.broadcast,) * g.placement.ndim)
            g.copy_(g * scale.to(g.dtype))
    return total


@ct.meta.reads_values()
def _check_finite(total: ct.Tensor, norm_type: float) -> None:
    """``clip_grad_norm_(error_if_nonfinite=True)``'s check (shape-only: no values, none)."""
    value = float(total.item())
    if not math.isfinite(value):
        raise ValueError(f"clip_grad_norm_: the total norm of order {norm_type} of the "
                         f"gradients is non-finite ({value}); pass error_if_nonfinite=False "
                         f"to clip anyway")


def clip_grad_value_(parameters: Union[ct.Tensor, Iterable[ct.Tensor]], clip_value: float,
                     foreach=None) -> None:
    """Clamp every gradient in place to ``[-clip_value, clip_value]`` (PyTorch's; ``foreach``
    is accepted and changes nothing). Each gradient keeps its layout; a partial one (inside
    ``no_sync``) is reduced first, since a clamp of partial sums is not the clamp of the sum.

    >>> nn.utils.clip_grad_value_(model.parameters(), 0.5)
    """
    if isinstance(parameters, ct.Tensor):
        parameters = [parameters]
    if isinstance(clip_value, bool) or not isinstance(clip_value, (int, float)) or \
            not clip_value >= 0:
        raise ValueError(f"clip_grad_value_: argument 'clip_value' must be a number >= 0, got "
                         f"{clip_value!r}")
    clip_value = float(clip_value)
    with ct.no_grad():
        for p in parameters:
            if p.grad is not None:
                p.grad.clamp_(-clip_value, clip_value)


# ----------------------------------------------------------------------------- recompute
_recomputing = 0  # > 0 while a checkpoint re-runs its function in the backward


def is_recomputing() -> bool:
    """True while :func:`checkpoint` re-runs a function in the backward pass (hooks that
    gather or free parameters, such as ``fully_shard``'s, behave accordingly)."""
    return _recomputing > 0


def _outputs(result) -> tuple:
    """The function's result as a tuple of tensors, or the error that says what to do."""
    items = result if isinstance(result, tuple) else (result,)
    bad = [type(o).__name__ for o in items if not isinstance(o, ct.Tensor)]
    if bad or not items:
        raise TypeError(f"checkpoint: the function must return a ct.Tensor or a tuple of "
                        f"ct.Tensors, got {type(result).__name__}"
                        + (f" holding {', '.join(sorted(set(bad)))}" if bad and
                           isinstance(result, tuple) else "")
                        + "; return the tensors only (compute other values outside the "
                          "checkpointed function, or return them as tensors)")
    return items


class _Run:
    """What one checkpoint call hands its node: the function, its arguments, the random
    state before it ran, and the leaves (parameters) it used."""

    __slots__ = ("function", "args", "kwargs", "rng_before", "outputs", "leaves")

    def __init__(self, function, args, kwargs, rng_before, outputs, leaves):
        self.function, self.args, self.kwargs = function, args, kwargs
        self.rng_before, self.outputs, self.leaves = rng_before, outputs, leaves

    def fresh_args(self) -> list:
        """The arguments for a run: tensors detached (new leaves, requiring grad where the
        argument does), everything else as given."""
        out = []
        for a in self.args:
            if isinstance(a, ct.Tensor):
                d = a.detach()
                if a.requires_grad and a.dtype.kind in "fc":
                    d.requires_grad_()
                out.append(d)
            else:
                out.append(a)
        return out


class _Recompute(ct.autograd.Function):
    """The node a checkpoint records: its inputs are the tensor arguments and the leaves
    (parameters) the function used; its backward re-runs the function and returns the
    gradients of all of them, unreduced, to the backward pass that runs it."""

    @staticmethod
    def forward(ctx, run: _Run, *tensors):
        ctx.run = run
        outputs, run.outputs = run.outputs, None  # no cycle node -> ctx -> outputs -> node
        return outputs if len(outputs) > 1 else outputs[0]

    @staticmethod
    def backward(ctx, *grads):
        global _recomputing
        run = ctx.run
        args = run.fresh_args()
        after = ct.random.get_state()
        ct.random.set_state(run.rng_before)  # the dropout masks of the first run
        _recomputing += 1
        try:
            with ct.autograd.forward_context():
                outputs = _outputs(run.function(*args, **run.kwargs))
        finally:
            _recomputing -= 1
            ct.random.set_state(after)  # later draws are not shifted by the re-run
        if len(outputs) != len(grads):
            raise RuntimeError(f"checkpoint: the recomputed function returned {len(outputs)} "
                               f"outputs, the first run {len(grads)}; the function must "
                               f"compute the same thing every time it runs")
        wrt = [a for a in args if isinstance(a, ct.Tensor) and a.requires_grad]
        got = ct.autograd.raw_grad(outputs, wrt + run.leaves, grads)
        by_id = {id(t): g for t, g in zip(wrt + run.leaves, got)}
        arg_grads = tuple(by_id.get(id(a)) if isinstance(a, ct.Tensor) else None
                          for a in args)
        return (None,) + arg_grads + tuple(by_id.get(id(p)) for p in run.leaves)


def checkpoint(function, *args, use_reentrant=None, preserve_rng_state: bool = True,
               **kwargs):
    """Run ``function(*args, **kwargs)`` without keeping its intermediate activations for
    the backward pass: only the inputs are kept, and the backward re-runs ``function`` to
    get them again (activation recompute; PyTorch's ``torch.utils.checkpoint.checkpoint``).

    Values and gradients are bit-identical to running ``function`` directly, in every
    layout: the re-run draws the same random numbers (the generator state before the first
    run is restored for it, and the state after it is restored afterwards, so dropout masks
    repeat and later draws are unaffected) and its ops pick the signatures of the first
    run. The gradients of ``function``'s parameters reach the backward pass that runs the
    re-run unreduced, so they are bucketed and reduced (or kept partial under
    ``ct.autograd.no_sync()``) exactly as without recompute.

    ``function`` must return a ct.Tensor or a tuple of them and compute the same thing
    each time it runs; tensors that need a gradient must be passed as positional
    arguments (or be parameters of the modules it calls). ``use_reentrant`` and
    ``preserve_rng_state`` are accepted for PyTorch compatibility (the random state is
    always preserved). Under ``ct.no_grad()`` it simply calls ``function``.

    >>> y = nn.utils.checkpoint(block, x)        # block's activations are recomputed
    >>> y.sum().backward()
    """
    if not callable(function):
        raise TypeError(f"checkpoint: argument 'function' must be callable (a module or a "
                        f"function), got {type(function).__name__}; call "
                        f"checkpoint(fn, *args)")
    for k, v in kwargs.items():
        if isinstance(v, ct.Tensor) and v.requires_grad:
            raise TypeError(f"checkpoint: keyword argument {k!r} is a tensor that requires "
                            f"grad; pass tensors that need a gradient positionally")
    if not ct.is_grad_enabled():
        return function(*args, **kwargs)
    run = _Run(function, args, kwargs, ct.random.get_state(), None, [])
    first = run.fresh_args()
    # the first run records its graph (so its ops choose what they would without
    # recompute, and so the parameters it uses are found); the graph is dropped on return
    outputs = _outputs(function(*first, **kwargs))
    detached = {id(a) for a in first if isinstance(a, ct.Tensor)}  # (the arguments)
    run.leaves = [t for t in ct.autograd.graph_leaves(outputs) if id(t) not in detached]
    needs = run.leaves or any(isinstance(a, ct.Tensor) and a.requires_grad for a in args)
    if not needs or not any(o.requires_grad for o in outputs):
        return outputs if len(outputs) > 1 else outputs[0]
    run.outputs = tuple(o.detach() for o in outputs)
    del outputs, first
    tensors = [a if isinstance(a, ct.Tensor) else None for a in args]
    return _Recompute.apply(run, *tensors, *run.leaves)
