"""Megatron-style tensor-parallel MLP: the parallelism is two SBP choices.

``fc1`` is column-parallel (weight (out, in) split on dim 0 -> each rank computes a slice of
the hidden units), ``fc2`` row-parallel (weight split on dim 1 -> each rank's partial product
is a partial sum, reduced once). Run: ``python examples/mlp_tp.py`` (simulates 2 ranks) or
``mpiexec -n 2 python examples/mlp_tp.py``.
"""
import argparse
import contextlib

import numpy as np

import ctensor as ct
import ctensor.nn as nn


def main() -> None:
    ct.manual_seed(0)
    tp = ct.placement.all()
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    reference = {k: v.numpy() for k, v in model.state_dict().items()}
    model.to_global(tp, {"0.weight": ct.sbp.split(0), "0.bias": ct.sbp.split(0),
                         "2.weight": ct.sbp.split(1)})           # 2.bias stays broadcast
    x = ct.randn(32, 64, placement=tp, sbp=ct.sbp.broadcast)
    with ct.debug.comm_log() as log:
        loss = model(x).pow(2).mean()
        loss.backward()

    # one process, same weights: same loss
    h = x.numpy() @ reference["0.weight"].T + reference["0.bias"]
    h = 0.5 * h * (1 + np.vectorize(__import__("math").erf)(h / np.sqrt(2)))
    y = h @ reference["2.weight"].T + reference["2.bias"]
    # every rank takes part in every collective: ``loss.item()`` reduces a partial loss, so
    # it runs here, and only the printing is left to rank 0 (else rank 0 waits forever)
    value = loss.item()
    if ct.rank() == 0:
        print(f"loss {value:.6f} (one process: {np.mean(y ** 2):.6f})")
        print("fc1.weight.grad", model[0].weight.grad.sbp, "fc2.weight.grad",
              model[2].weight.grad.sbp)
        print(log.summary())
    assert abs(value - np.mean(y ** 2)) < 1e-4 * abs(np.mean(y ** 2))


if __name__ == "__main__":
    # no options: an argument given by mistake is an error, not silently ignored
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    with (contextlib.nullcontext() if ct.launched_by_mpi() else ct.simulate(2)):
        main()
