"""Philox4x32-10 and the maps from its output words to numbers, vectorised with NumPy.

This module is the arithmetic behind :mod:`ctensor.random`; it knows nothing of tensors.

The random stream of one call
-----------------------------
A call (``seed``, ``call``) owns the blocks ``b = 0, 1, 2, ...``; block ``b`` is the
Philox4x32-10 output ``x0 x1 x2 x3`` (four uint32) for

    key     = (seed & 0xffffffff, seed >> 32)
    counter = (b & 0xffffffff, b >> 32, call & 0xffffffff, call >> 32)

Block ``b`` fills the ``E`` consecutive elements ``E*b .. E*b + E - 1`` of the flattened
(row-major) logical tensor, one of these ways (``j`` = the element's place in its block):

===============  ===  ==========================================================
kind, dtype      E    element ``E*b + j``
===============  ===  ==========================================================
uniform f32      4    ``(x_j >> 8) * 2^-24``                      (24 bits)
uniform f16      4    ``(x_j >> 21) * 2^-11``                     (11 bits)
uniform f64      2    ``(x_{2j} * 2^21 + (x_{2j+1} >> 11)) * 2^-53`` (53 bits)
integer          2    ``low + (v mod span)``, ``v = x_{2j} * 2^32 + x_{2j+1}``
normal f32, f16  4    pair ``p = j // 2`` from ``N = x_{2p} + 1`` (32 bits) and
                      ``V = x_{2p+1}`` (32 bits); ``j`` even: cosine, odd: sine
normal f64       2    one pair from ``N = (x0 * 2^21 + (x1 >> 11)) + 1`` and
                      ``V = x2 * 2^21 + (x3 >> 11)`` (53 bits each); ``j = 0``: cosine
===============  ===  ==========================================================

Box-Muller on a pair (``N`` in ``[1, 2^B]``, ``V`` in ``[0, 2^B)``) with only IEEE double
``+ - * /``, ``sqrt`` and the exact ``frexp``, so any machine gives the same bits:

* ``u1 = N * 2^-B``; ``ln u1 = ln m + (e - B) ln 2`` with ``N = m 2^e`` (``frexp``, ``m``
  doubled into ``[sqrt(1/2), sqrt(2))``), ``ln m = s * P(s^2)``, ``s = (m-1)/(m+1)``
  (atanh series), and ``r = sqrt(-2 ln u1)``;
* ``k = V >> (B-1)`` (half turn), ``t = pi * ((V mod 2^(B-1)) - 2^(B-2)) * 2^-(B-1)`` in
  ``[-pi/2, pi/2)``; ``sin t = t * S(t^2)``, ``cos t = C(t^2)`` (Taylor, Horner form);
* series lengths (P, S, C): 5, 7, 8 terms for float32/float16, 11, 11, 12 for float64;
* cosine element ``(1 - 2k) r * cos t``, sine element ``(1 - 2k) r * sin t`` (the point at
  angle ``t + k pi`` on the circle of radius ``r``): exactly two independent N(0, 1).

Polynomials are evaluated as ``p = x*c[n-1]; p = p + c[n-2]; p = p*x; p = p + c[n-3] ...``,
each step rounded (no fused multiply-add). float32 (and float16) results are the double
result rounded to float32 (then to float16). :data:`CUDA_SOURCE` is the same arithmetic
as CuPy ElementwiseKernels (compiled with ``--fmad=false``) that :func:`cuda_fill` runs for
``cuda`` placements; tests/test_random.py builds that source for the host with g++ and
checks it against NumPy bit for bit (no GPU was available when it was written).
"""
from __future__ import annotations

import enum
import math
from math import factorial

import numpy as np

__all__ = ["philox4x32", "Kind", "Scratch", "elements_per_block", "fill_blocks", "CUDA_SOURCE",
           "cuda_fill"]

# Philox4x32 multipliers and Weyl key increments (Salmon et al., SC'11, "Random123").
M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
ROUNDS = 10
_MASK32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)
_MULTIPLIERS = np.array([[M0], [M1]], dtype=np.uint64)


class Kind(enum.IntEnum):
    """What a call draws (selects the row of the module doc's table and the CUDA kernel)."""

    UNIFORM = 0
    NORMAL = 1
    INTEGER = 2


def elements_per_block(kind: int, dtype: np.dtype) -> int:
    """``E``: how many consecutive elements one Philox block fills (table in the module doc)."""
    if kind == Kind.INTEGER or np.dtype(dtype).itemsize == 8:
        return 2
    return 4


class Scratch(dict):
    """Working arrays reused from one chunk to the next: ``scratch("name", shape, dtype)``.

    Fresh temporaries of ~100 KiB per NumPy call would go through malloc's mmap/trim path
    and page-fault on every chunk; reusing them keeps the loop in cache and out of the kernel.
    """

    def __call__(self, name: str, shape: tuple, dtype) -> np.ndarray:
        a = self.get(name)
        if a is None or a.shape != shape or a.dtype != dtype:
            a = self[name] = np.empty(shape, dtype)
        return a


# ------------------------------------------------------------------------------ Philox
def philox4x32(blocks: np.ndarray, call: int, seed: int, scratch: Scratch | None = None):
    """Philox4x32-10 of counters ``(blocks lo, blocks hi, call lo, call hi)``, key ``seed``.

    ``blocks`` is a 1-D uint64 array. Returns ``(A, B)``, two ``(2, n)`` uint64 arrays
    holding ``A = (x0, x2)`` and ``B = (x1, x3)`` (each value below ``2^32``), which live in
    ``scratch`` when one is given (valid until its next use).

    >>> A, B = philox4x32(np.zeros(1, np.uint64), 0, 0)
    >>> hex(int(A[0, 0]))        # Random123 known answer for key 0, counter 0
    '0x6627e8d5'
    """
    n = blocks.shape[0]
    k0, k1 = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
    # state kept as two (2, n) uint64 arrays, A = (c0, c2) and B = (c1, c3), so each step of
    # a round is one ufunc call over both halves; uint32 products are exact in uint64
    scratch = Scratch() if scratch is None else scratch
    A, B, P = (scratch(name, (2, n), np.uint64) for name in "ABP")
    np.bitwise_and(blocks, _MASK32, out=A[0])
    A[1] = call & 0xFFFFFFFF
    np.right_shift(blocks, _SHIFT32, out=B[0])
    B[1] = (call >> 32) & 0xFFFFFFFF
    key = np.empty((2, 1), np.uint64)
    for _ in range(ROUNDS):
        # (hi0, lo0) = M0*c0, (hi1, lo1) = M1*c2;
        # new (c0, c1, c2, c3) = (hi1^c1^k0, lo1, hi0^c3^k1, lo0)
        key[0, 0], key[1, 0] = k1, k0
        np.multiply(A, _MULTIPLIERS, out=P)
        np.right_shift(P, _SHIFT32, out=A)      # (hi0, hi1)
        A ^= B[::-1]                           # (hi0^c3, hi1^c1)
        A ^= key                               # (new c2, new c0)
        np.bitwise_and(P, _MASK32, out=B)      # (lo0, lo1) = (new c3, new c1)
        A, B = A[::-1], B[::-1]                # back to (c0, c2), (c1, c3) order
        k0, k1 = (k0 + W0) & 0xFFFFFFFF, (k1 + W1) & 0xFFFFFFFF
    return A, B


# ------------------------------------------------------------------------------ Box-Muller
def _taylor(odd: bool, terms: int) -> tuple:
    """Coefficients of sin(t)/t (odd) or cos(t) in powers of t^2: (-1)^i / (2i + odd)!."""
    return tuple((-1.0) ** i / factorial(2 * i + odd) for i in range(terms))


# Series lengths per output precision: truncation below 1e-9 (float32) and 1e-17 (float64)
# for |t| <= pi/2 and |s| <= 3 - 2 sqrt(2).
_SERIES = {
    4: dict(log=tuple(2.0 / (2 * i + 1) for i in range(5)),
            sin=_taylor(True, 7), cos=_taylor(False, 8)),
    8: dict(log=tuple(2.0 / (2 * i + 1) for i in range(11)),
            sin=_taylor(True, 11), cos=_taylor(False, 12)),
}
_LN2 = math.log(2.0)
_SQRT_HALF = math.sqrt(0.5)


def _horner(x: np.ndarray, coefs: tuple, out: np.ndarray) -> np.ndarray:
    p = np.multiply(x, coefs[-1], out=out)
    p += coefs[-2]
    for c in coefs[-3::-1]:
        p *= x
        p += c
    return p


def box_muller(N: np.ndarray, V: np.ndarray, bits: int, series: dict, scratch: Scratch):
    """Two standard normals per pair, from ``N`` (int64, in 1..2^bits) and ``V`` (int64,
    below 2^bits; overwritten). Returns float64 ``(cos t, sin t, r)``: the normals are
    ``cos t * r`` and ``sin t * r``, the last product left to the caller so that it can
    write (and round) straight into the output. The exact operations are in the module doc.
    """
    def buf(name: str, dtype=np.float64) -> np.ndarray:
        return scratch(name, N.shape, dtype)

    m, e, d, p = buf("m"), buf("e", np.int32), buf("d"), buf("p")
    m[...] = N
    np.frexp(m, out=(m, e))
    small = np.less(m, _SQRT_HALF, out=buf("small", np.bool_))
    m += np.multiply(m, small, out=d)          # m in [sqrt(1/2), sqrt(2)), exact
    e -= small
    np.add(m, 1.0, out=d)
    m -= 1.0
    m /= d                                     # s = (m - 1) / (m + 1)
    _horner(np.multiply(m, m, out=d), series["log"], out=p)
    p *= m                                     # ln m = 2 atanh(s)
    e -= bits
    p += np.multiply(e, _LN2, out=d)           # ln u1
    p *= -2.0
    r = np.sqrt(p, out=p)
    half = bits - 1
    # the half turn k = V >> half is the sign of r: r * (1 - 2k) flips the sign bit
    sign = np.right_shift(V, half, out=buf("sign", np.int64))
    sign <<= 63
    r.view(np.int64)[...] ^= sign
    V &= (1 << half) - 1
    V -= 1 << (half - 1)
    t = np.multiply(V, math.pi * 2.0 ** -half, out=d)     # t in [-pi/2, pi/2)
    t2 = np.multiply(t, t, out=m)
    sin = _horner(t2, series["sin"], out=buf("sin"))
    sin *= t
    return _horner(t2, series["cos"], out=buf("cos")), sin, r


# ------------------------------------------------------------------------------ words -> values
def _join53(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """``hi * 2^21 + (lo >> 11)`` as int64: 53 random bits from two words (in place)."""
    hi <<= np.uint64(21)
    lo >>= np.uint64(11)
    hi |= lo
    return hi.view(np.int64)


def _store(out: np.ndarray, a: np.ndarray, b) -> None:
    """``out[...] = a * b`` rounded once to ``out``'s dtype (float16 through float32)."""
    if out.dtype.itemsize == 2:
        out[...] = np.multiply(a, b).astype(np.float32)
    else:
        np.multiply(a, b, out=out, casting="unsafe")


def fill_blocks(out: np.ndarray, A: np.ndarray, B: np.ndarray, kind: int, low: int = 0,
                span: int = 0, scratch: Scratch | None = None) -> None:
    """Write the ``(n, E)`` values of ``n`` blocks (words ``A``, ``B`` of :func:`philox4x32`)
    into ``out`` (shape ``(n, E)``, the tensor's dtype). ``A``, ``B`` are overwritten.

    ``low``/``span`` are the integer kind's range: ``low + (v mod span)`` (``span`` 0: 2^64).
    """
    dtype = out.dtype
    scratch = Scratch() if scratch is None else scratch
    if kind == Kind.INTEGER:
        A <<= _SHIFT32
        A |= B                                 # v = x_{2j} * 2^32 + x_{2j+1}
        if span:
            A %= np.uint64(span)
        A += np.uint64(low % (1 << 64))        # wraps like the two's-complement sum
        np.copyto(out.T, A.view(np.int64) if dtype.kind == "i" else A, casting="unsafe")
    elif dtype.itemsize == 8:                  # element 2b + j from x_{2j}, x_{2j+1}
        if kind == Kind.UNIFORM:
            np.multiply(_join53(A, B), 2.0 ** -53, out=out.T)
        else:
            N = _join53(A[0], B[0])
            N += 1
            cos, sin, r = box_muller(N, _join53(A[1], B[1]), 53, _SERIES[8], scratch)
            np.multiply(cos, r, out=out[:, 0])
            np.multiply(sin, r, out=out[:, 1])
    else:  # element 4b + 2p + h; rows p of A, B are x_{2p}, x_{2p+1}
        quad = out.reshape(out.shape[0], 2, 2)
        if kind == Kind.UNIFORM:
            shift, scale = (8, 2.0 ** -24) if dtype.itemsize == 4 else (21, 2.0 ** -11)
            floats = scratch("floats", A.shape, np.float64)
            for h, words in enumerate((A, B)):
                words >>= np.uint64(shift)
                np.copyto(floats, words.view(np.int64), casting="unsafe")
                _store(quad[:, :, h].T, floats, scale)
        else:
            N = A.view(np.int64)
            N += 1
            cos, sin, r = box_muller(N, B.view(np.int64), 32, _SERIES[4], scratch)
            _store(quad[:, :, 0].T, cos, r)
            _store(quad[:, :, 1].T, sin, r)


# ------------------------------------------------------------------------------ CUDA
def _c_horner(var: str, x: str, coefs: tuple) -> str:
    lines = [f"{var} = {x} * {coefs[-1]!r};", f"{var} = {var} + {coefs[-2]!r};"]
    for c in coefs[-3::-1]:
        lines += [f"{var} = {var} * {x};", f"{var} = {var} + {c!r};"]
    return " ".join(lines)


def _c_box_muller(size: int, bits: int) -> str:
    s = _SERIES[size]
    half = bits - 1
    return f"""
__device__ void ct_box_muller{size}(unsigned long long N, unsigned long long V,
                                    double* zc, double* zs) {{
  int e; double m = frexp((double)N, &e), p, t, t2, sn, cs;
  double small = m < {_SQRT_HALF!r} ? 1.0 : 0.0;
  m = m + m * small; e = e - (int)small;
  double d = m + 1.0; m = m - 1.0; m = m / d;
  double s2 = m * m; {_c_horner("p", "s2", s["log"])} p = p * m;
  p = p + (double)(e - {bits}) * {_LN2!r};
  p = p * -2.0; double r = sqrt(p);
  long long k = (long long)(V >> {half});
  long long w = (long long)(V & ((1ULL << {half}) - 1)) - (1LL << {half - 1});
  t = (double)w * {math.pi * 2.0 ** -half!r};
  r = r * ((double)k * -2.0 + 1.0);
  t2 = t * t; {_c_horner("sn", "t2", s["sin"])} sn = sn * t;
  {_c_horner("cs", "t2", s["cos"])}
  *zc = cs * r; *zs = sn * r;
}}"""


CUDA_PREAMBLE = f"""
__device__ void ct_philox(unsigned long long b, unsigned int c2, unsigned int c3,
                          unsigned int k0, unsigned int k1, unsigned int* x) {{
  unsigned int c0 = (unsigned int)b, c1 = (unsigned int)(b >> 32);
  for (int i = 0; i < {ROUNDS}; ++i) {{
    unsigned long long p0 = (unsigned long long){M0:#x}U * c0;
    unsigned long long p1 = (unsigned long long){M1:#x}U * c2;
    c0 = (unsigned int)(p1 >> 32) ^ c1 ^ k0; c1 = (unsigned int)p1;
    c2 = (unsigned int)(p0 >> 32) ^ c3 ^ k1; c3 = (unsigned int)p0;
    k0 += {W0:#x}U; k1 += {W1:#x}U;
  }}
  x[0] = c0; x[1] = c1; x[2] = c2; x[3] = c3;
}}
{_c_box_muller(4, 32)}
{_c_box_muller(8, 53)}
"""

# One kernel per kind (each compiled only for the dtypes it accepts); every thread computes
# its element's block (recomputing a block per element costs little on a GPU) and applies
# the row of the module doc's table.
_CUDA_HEAD = """
unsigned long long E = %s;
unsigned int x[4];
ct_philox(idx / E, c2, c3, k0, k1, x);
int j = (int)(idx %% E);
"""
CUDA_SOURCE = {
    Kind.INTEGER: _CUDA_HEAD % "2" + """
unsigned long long u = ((unsigned long long)x[2 * j] << 32) | x[2 * j + 1];
if (span != 0) u = u % span;
out = (T)(long long)(u + low);
""",
    Kind.UNIFORM: _CUDA_HEAD % "sizeof(T) == 8 ? 2 : 4" + """
if (sizeof(T) == 8) {
  unsigned long long w = ((unsigned long long)x[2 * j] << 21) | (x[2 * j + 1] >> 11);
  out = (T)((double)(long long)w * 1.1102230246251565e-16);
} else if (sizeof(T) == 4) {
  out = (T)(float)((double)(x[j] >> 8) * 5.9604644775390625e-08);
} else {
  out = (T)(float)((double)(x[j] >> 21) * 0.00048828125);
}
""",
    Kind.NORMAL: _CUDA_HEAD % "sizeof(T) == 8 ? 2 : 4" + """
double zc, zs;
if (sizeof(T) == 8) {
  unsigned long long un = ((unsigned long long)x[0] << 21) | (x[1] >> 11);
  unsigned long long uv = ((unsigned long long)x[2] << 21) | (x[3] >> 11);
  ct_box_muller8(un + 1, uv, &zc, &zs);
  out = (T)(j == 0 ? zc : zs);
} else {
  ct_box_muller4((unsigned long long)x[j & 2] + 1, x[(j & 2) + 1], &zc, &zs);
  out = (T)(float)((j & 1) ? zs : zc);
}
""",
}

_kernel_cache: dict = {}


def cuda_fill(xp, idx, dtype, kind: int, seed: int, call: int, low: int = 0,
              span: int = 0):
    """The values at global linear indices ``idx`` (a CuPy uint64 array) on the GPU.

    Same bits as :func:`fill_blocks` on NumPy (see the module doc); needs CuPy.
    """
    if kind not in _kernel_cache:
        _kernel_cache[kind] = xp.ElementwiseKernel(
            "uint64 idx, uint32 k0, uint32 k1, uint32 c2, uint32 c3, uint64 low, uint64 span",
            "T out", CUDA_SOURCE[kind], f"ctensor_philox_{Kind(kind).name.lower()}",
            preamble=CUDA_PREAMBLE, options=("--fmad=false",))
    out = xp.empty(idx.shape, dtype=dtype)
    u32 = np.uint32
    _kernel_cache[kind](idx, u32(seed & 0xFFFFFFFF), u32(seed >> 32), u32(call & 0xFFFFFFFF),
                        u32(call >> 32), np.uint64(low % (1 << 64)), np.uint64(span), out)
    return out
