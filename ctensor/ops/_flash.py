"""The attention kernel's arithmetic, for one block of queries against one block of keys:
blockwise scores with an online softmax (forward) and the recomputing backward, written
against the array module ``xp``. Only ``(rows, _BLOCK)`` scores exist at a time; the forward
keeps the running max, the running sum and the unnormalised output per query row, the
backward reads the log-sum-exp ``lse`` instead of the probabilities, so an attention's
activations are O(T·D), not O(T²) (FlashAttention's recurrences, Dao et al. 2022).

Causal masking is by *true positions*: ``qpos``/``kpos`` (host int arrays) give each row's
position in the sequence, so a permuted sequence (the zig-zag layout of context
parallelism, :func:`positions`) masks as the natural order does. Positions are cut into
contiguous runs; a (query run, key chunk) pair whose keys all lie after its queries is
skipped, one whose keys all lie before is computed without a mask.
"""
from __future__ import annotations

import numpy as np

from ..random import Kind, region

__all__ = []  # (private to ops/attention.py and ops/attention_ring.py)

#: keys per chunk: the scores held at a time are (rows, _BLOCK)
_BLOCK = 512


def positions(n: int, zigzag: int) -> np.ndarray:
    """The true position of each logical index of a sequence of ``n``: ``arange(n)``, or
    for ``zigzag=c`` the zig-zag order of ``c`` ranks — the sequence in ``2c`` chunks, the
    ``i``-th of ``c`` equal parts holding chunks ``i`` and ``2c-1-i`` (what
    ``ct.zigzag_index(n, c)`` lays out)."""
    if not zigzag:
        return np.arange(n)
    c = n // (2 * zigzag)
    j = np.arange(n)
    part, half, within = j // (2 * c), (j // c) % 2, j % c
    chunk = np.where(half == 0, part, 2 * zigzag - 1 - part)
    return chunk * c + within


def runs(pos: np.ndarray) -> list:
    """``[(start, stop, first position)]``: the maximal runs of consecutive positions."""
    if not len(pos):
        return []
    cuts = np.flatnonzero(np.diff(pos) != 1) + 1
    starts = [0] + cuts.tolist()
    stops = cuts.tolist() + [len(pos)]
    return [(a, b, int(pos[a])) for a, b in zip(starts, stops)]


def _blocks(pieces: list) -> list:
    """Runs cut into blocks of at most ``_BLOCK`` rows (so a causal mask skips whole
    (query block, key chunk) pairs above the diagonal)."""
    return [(a, min(b, a + _BLOCK), p0 + a - start) for start, b, p0 in pieces
            for a in range(start, b, _BLOCK)]


def _pairs(qpos, kpos, causal: bool):
    """``(q slice, k slice, mask or None)`` of every (query run, key chunk) pair with
    something to compute."""
    for qa, qb, q0 in _blocks(runs(qpos)):
        q1 = q0 + (qb - qa) - 1  # the block's last position
        for ka, kb, k0 in runs(kpos):
            for ca in range(ka, kb, _BLOCK):
                cb = min(kb, ca + _BLOCK)
                first, last = k0 + ca - ka, k0 + cb - 1 - ka
                if causal and first > q1:
                    continue  # every key after every query: masked whole
                mask = None
                if causal and last > q0:
                    mask = (np.arange(first, last + 1)[None, :] >
                            np.arange(q0, q1 + 1)[:, None])
                yield slice(qa, qb), slice(ca, cb), mask


def dropper(xp, key, p: float, shape: tuple, batch: tuple, q0: int, k0: int, dtype):
    """``drop`` for :func:`accumulate`/:func:`grad_block`: the factors of the rows and
    columns given as local slices, drawn as ``ct.rand_like(probabilities) >= p`` draws them
    for the logical (..., L, S) probabilities of ``shape`` (``key`` from
    ``ct.random.next_key()``; ``batch``: the shard's region of the leading dims, ``q0``/``k0``
    its first query row and key column), so the mask is one process's on every layout."""
    keep = 1.0 / (1.0 - p)

    def drop(qs, ks):
        box = tuple(batch) + ((q0 + qs.start, q0 + qs.stop), (k0 + ks.start, k0 + ks.stop))
        u = region(Kind.UNIFORM, shape, box, dtype, key, xp)
        return xp.where(u >= p, keep, 0.0).astype(u.dtype)
    return drop


def _t(x):
    return x.swapaxes(-1, -2)


def new_state(xp, q, v, dtype):
    """The running (max, sum, unnormalised output) of ``q``'s rows: nothing seen yet."""
    rows = q.shape[:-1]
    return (xp.full(rows, -np.inf, dtype=dtype), xp.zeros(rows, dtype=dtype),
            xp.zeros(rows + (v.shape[-1],), dtype=dtype))


def accumulate(xp, state, q, k, v, qpos, kpos, causal: bool, scale: float,
               drop=None) -> None:
    """Fold the keys ``k``/values ``v`` (positions ``kpos``) into ``state`` (in place).
    ``drop(q slice, k slice)``: the dropout factors (0 or ``1/(1-p)``) of those
    probabilities, applied after the softmax (its sums see them all), or None."""
    m, s_, acc = state
    for qs, ks, mask in _pairs(qpos, kpos, causal):
        s = (q[..., qs, :] @ _t(k[..., ks, :])) * scale
        if mask is not None:
            s = xp.where(xp.asarray(mask), -np.inf, s)
        m_old = m[..., qs]
        m_new = xp.maximum(m_old, s.max(axis=-1))
        safe = xp.where(xp.isneginf(m_new), 0.0, m_new)
        p = xp.exp(s - safe[..., None])
        alpha = xp.exp(m_old - safe)
        s_[..., qs] = s_[..., qs] * alpha + p.sum(axis=-1)
        if drop is not None:
            p = p * drop(qs, ks)
        acc[..., qs, :] = acc[..., qs, :] * alpha[..., None] + p @ v[..., ks, :]
        m[..., qs] = m_new


def finish(xp, state):
    """``(output, lse)`` from a state: the output normalised, ``lse = max + log(sum)``
    (``-inf`` and a zero output for a row that saw no key)."""
    m, s_, acc = state
    empty = s_ == 0
    denom = xp.where(empty, 1.0, s_)
    out = acc / denom[..., None]
    lse = xp.where(empty, -np.inf, xp.where(xp.isneginf(m), 0.0, m) + xp.log(denom))
    return out, lse


def _one_block(xp, qpos, kpos, causal: bool, dtype):
    """``(True, bias)`` when ``q`` against ``k`` is one pair of blocks in which every query
    row sees a key and every key is seen (``bias``: 0 where a score counts, ``-inf`` where
    the causal mask hides it, or None without a mask); ``(False, None)`` otherwise. Such a
    pair's online softmax reduces to the plain one: its running max starts at ``-inf`` and
    its correction factors are 0, so the plain arithmetic gives the same bits without the
    state's passes and the backward needs no zeroed accumulators."""
    q_runs, k_runs = runs(qpos), runs(kpos)
    if len(q_runs) != 1 or len(k_runs) != 1:
        return False, None
    (qa, qb, q0), (ka, kb, k0) = q_runs[0], k_runs[0]
    if qb - qa > _BLOCK or kb - ka > _BLOCK or qb == qa or kb == ka:
        return False, None
    q1, k1 = q0 + qb - qa - 1, k0 + kb - ka - 1
    if not causal or k1 <= q0:
        return True, None
    if k0 > q0 or k1 > q1:  # a query row that sees no key, or a key no query sees
        return False, None
    hidden = np.arange(k0, k1 + 1)[None, :] > np.arange(q0, q1 + 1)[:, None]
    return True, xp.asarray(np.where(hidden, -np.inf, 0.0).astype(dtype))


def _scores(xp, q, k, scale: float, bias):
    """``q @ k^T * scale``, masked by adding ``bias`` (``x + 0`` is ``x``, ``x - inf`` is
    ``-inf``: what :func:`accumulate`'s ``where`` gives, in one pass)."""
    s = q @ _t(k)
    s *= scale
    if bias is not None:
        s += bias
    return s


def attend(xp, q, k, v, qpos, kpos, causal: bool, scale: float, dtype, drop=None):
    """``(output, lse)`` of ``q`` against all of ``k``/``v``."""
    one, bias = _one_block(xp, qpos, kpos, causal, dtype) if drop is None else (False, None)
    if one:
        p = _scores(xp, q, k, scale, bias)
        m = p.max(axis=-1)
        p -= m[..., None]
        xp.exp(p, out=p)
        total = p.sum(axis=-1)
        out = p @ v
        out /= total[..., None]
        return out, m + xp.log(total)
    state = new_state(xp, q, v, dtype)
    accumulate(xp, state, q, k, v, qpos, kpos, causal, scale, drop)
    return finish(xp, state)


def grad_block(xp, q, k, v, g, lse, delta, qpos, kpos, causal: bool, scale: float,
               dq, dk, dv, drop=None) -> None:
    """Add one key block's contributions to ``dq`` (rows of ``q``) and to ``dk``/``dv``
    (rows of ``k``), in place: the probabilities are recomputed from ``lse``; ``delta`` is
    ``sum(g * output, -1)`` (with dropout too: the dropped probabilities' rows sum to it)."""
    lse = xp.where(xp.isneginf(lse), np.inf, lse)  # a row that saw no key: p = 0
    for qs, ks, mask in _pairs(qpos, kpos, causal):
        qq, kk, vv, gg = q[..., qs, :], k[..., ks, :], v[..., ks, :], g[..., qs, :]
        s = (qq @ _t(kk)) * scale
        if mask is not None:
            s = xp.where(xp.asarray(mask), -np.inf, s)
        p = xp.exp(s - lse[..., qs, None])
        dp = gg @ _t(vv)
        if drop is not None:
            d = drop(qs, ks)
            dv[..., ks, :] += _t(p * d) @ gg
            dp *= d
        else:
            dv[..., ks, :] += _t(p) @ gg
        ds = p * (dp - delta[..., qs, None])
        dq[..., qs, :] += (ds @ kk) * scale
        dk[..., ks, :] += (_t(ds) @ qq) * scale


def grad_one(xp, q, k, v, g, lse, delta, qpos, kpos, causal: bool, scale: float, dtype,
             drop=None):
    """``(dq, dk, dv)`` of ``q`` against all of ``k``/``v`` when they are one pair of
    blocks (:func:`_one_block`; the same bits as :func:`grad_block` into zeros), else
    None."""
    one, bias = _one_block(xp, qpos, kpos, causal, dtype) if drop is None else (False, None)
    if not one:
        return None
    p = _scores(xp, q, k, scale, bias)
    p -= lse[..., None]
    xp.exp(p, out=p)
    ds = g @ _t(v)
    dv = _t(p) @ g
    ds -= delta[..., None]
    ds *= p
    dq = ds @ k
    dq *= scale
    dk = _t(ds) @ q
    dk *= scale
    return dq, dk, dv
