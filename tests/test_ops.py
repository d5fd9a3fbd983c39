"""The table-driven op test: every sample of every registered op, over meshes (1,), (2,),
(3,), (4,), (2,2), over input SBPs the signatures accept and ones that need boxing, even and
uneven shapes; values against NumPy, gradients (float64) against finite differences of the
NumPy reference. Gradients must come back in each leaf's own placement and SBP."""
import itertools
import zlib

import numpy as np
import pytest

import ctensor as ct
from ctensor.registry import OPS
from conftest import MPI_MODE, numeric_grad
from samples import collect

SAMPLES, COVERED = collect()
# layouts per sample and mesh (drawn alike on every rank where there are more): the
# simulation tries 12; the mpiexec reruns, which add the real communicators to the same
# boxing code, try 6 under -n 2 and 3 under -n 4 (its meshes' layouts ran in simulation)
MAX_COMBOS = (3 if ct.world_size() >= 4 else 6) if MPI_MODE else 12


def _kinds(sample, arr, i):
    out = []
    for k in sample.kinds:
        if k == "S":
            out += [ct.sbp.split(d) for d in range(arr.ndim) if arr.shape[d] > 0]
        elif k == "B":
            out.append(ct.sbp.broadcast)
        elif k == "P" and arr.dtype.kind == "f":
            out.append(ct.sbp.partial_sum)
    return out


def _combos(sample, arrays, mesh, rng):
    per_input = [_kinds(sample, a, i) for i, a in enumerate(arrays)]
    if mesh.ndim == 1:
        combos = [tuple((s,) for s in c) for c in itertools.product(*per_input)]
    else:
        per_axis = [list(itertools.product(k, repeat=mesh.ndim)) for k in per_input]
        combos = list(itertools.product(*per_axis))
    if len(combos) > MAX_COMBOS:
        idx = rng.choice(len(combos), MAX_COMBOS, replace=False)
        combos = [combos[0]] + [combos[i] for i in sorted(idx) if i != 0][:MAX_COMBOS - 1]
    return combos


def _declared_names() -> set:
    """Every public op and every gradient kernel declared with one (``gelu.grad``)."""
    names, stack = set(), [r.opdef for r in OPS.records() if r.opdef is not None]
    names.update(OPS.names())
    while stack:
        opdef = stack.pop()
        for child in opdef.grads.values():
            names.add(child.name)
            stack.append(child)
    return names


def test_every_registered_op_has_a_sample():
    names = _declared_names()
    sampled = {s.op for s in SAMPLES}
    missing = sorted(names - sampled - set(COVERED))
    assert not missing, f"registered ops without a sample in tests/samples: {missing}"


@pytest.mark.parametrize("uneven", [False, True], ids=["even", "uneven"])
@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: s.name)
def test_op(sample, mesh, uneven):
    rng = np.random.default_rng(zlib.crc32(sample.name.encode()) + uneven)
    arrays = sample.inputs(rng, uneven)
    expected = np.asarray(sample.ref(*arrays))
    weight = rng.standard_normal(expected.shape)
    combos = _combos(sample, arrays, mesh, rng)
    for n, combo in enumerate(combos):
        check_grad = n < 3 and expected.dtype.kind == "f" and len(sample.grad) > 0
        xs = [ct.tensor(a, placement=mesh, sbp=s,
                        requires_grad=check_grad and i in sample.grad)
              for i, (a, s) in enumerate(zip(arrays, combo))]
        out = sample.fn(*xs)
        got = out.numpy()
        assert got.shape == expected.shape, (combo, got.shape, expected.shape)
        if expected.dtype.kind in "biu":
            np.testing.assert_array_equal(got, expected, err_msg=f"sbp {combo}")
            continue
        np.testing.assert_allclose(got, expected, rtol=sample.rtol, atol=sample.atol,
                                   err_msg=f"sbp {combo}")
        if not check_grad:
            continue
        loss = (out * ct.tensor(weight, placement=mesh)).sum()
        loss.backward()
        for i in sample.grad:
            g = xs[i].grad
            assert g is not None, f"input {i} got no grad (sbp {combo})"
            assert g.placement == xs[i].placement and g.sbp == xs[i].sbp, (g.sbp, xs[i].sbp)
            np.testing.assert_allclose(g.numpy(), numeric_grad(sample.ref, arrays, i, weight),
                                       rtol=1e-5, atol=1e-6,
                                       err_msg=f"grad of input {i}, sbp {combo}")
