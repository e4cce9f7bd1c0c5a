#!/usr/bin/env python3
"""Fits the polynomial coefficients of core/src/math (trident's elementary functions).

Each kernel function is approximated on its reduced interval by a weighted minimax polynomial
(Remez exchange in 50-digit arithmetic), then rounded to f32 (or kept in f64 where the
algorithm computes in f64). The weight says which error matters: relative error of the
function, or the error it makes in the final result (for erfc, weighted by exp(-x^2)). The
script prints the coefficients (highest degree first, as Horner's rule takes them) and the
largest weighted error of the rounded polynomial, sampled densely. The accuracy of the
algorithms as a whole is measured exhaustively in Rust (`cargo xtask math`), not here.

    pip install mpmath && python3 scripts/fit_math.py
"""
import struct
import mpmath as mp

mp.mp.dps = 50


def f32(x):
    return struct.unpack("<f", struct.pack("<f", float(x)))[0]


def horner(cs, x):
    p = mp.mpf(0)
    for c in cs:
        p = p * x + c
    return p


def remez(f, w, a, b, n, iters=30):
    """Coefficients (highest first) of the degree-n polynomial minimising max |w (p - f)|."""
    a, b = mp.mpf(a), mp.mpf(b)
    m = n + 2
    xs = [(a + b) / 2 - (b - a) / 2 * mp.cos(mp.pi * i / (m - 1)) for i in range(m)]
    grid = [a + (b - a) * i / 6000 for i in range(6001)]
    cs = None
    for _ in range(iters):
        A = mp.matrix(m, m)
        rhs = mp.matrix(m, 1)
        for i, x in enumerate(xs):
            for j in range(n + 1):
                A[i, j] = x ** (n - j)
            A[i, n + 1] = (-1) ** i / w(x)
            rhs[i] = f(x)
        sol = mp.lu_solve(A, rhs)
        cs = [sol[j] for j in range(n + 1)]
        err = [w(x) * (horner(cs, x) - f(x)) for x in grid]
        # One extremum per run of equal sign, then keep m alternating ones.
        ext = []
        i = 0
        while i < len(grid):
            j = i
            best = i
            while j < len(grid) and (err[j] >= 0) == (err[i] >= 0):
                if abs(err[j]) > abs(err[best]):
                    best = j
                j += 1
            ext.append(best)
            i = j
        while len(ext) > m:
            # Drop the smaller end.
            if abs(err[ext[0]]) < abs(err[ext[-1]]):
                ext.pop(0)
            else:
                ext.pop()
        if len(ext) < m:
            break
        xs = [grid[k] for k in ext]
    return cs


def report(name, cs, f, w, a, b, dtype="f32"):
    rounded = [f32(c) for c in cs] if dtype == "f32" else [float(c) for c in cs]
    worst = mp.mpf(0)
    for i in range(20001):
        x = mp.mpf(a) + (mp.mpf(b) - a) * i / 20000
        worst = max(worst, abs(w(x) * (horner([mp.mpf(c) for c in rounded], x) - f(x))))
    print(f"// {name}: degree {len(cs) - 1} on [{a}, {b}], weighted error 2^{float(mp.log(worst, 2)):.1f} ({dtype})")
    print("    " + ", ".join(repr(c) for c in rounded) + ",")


def fit(name, f, a, b, n, w=None, dtype="f32"):
    if ONLY and not any(o in name for o in ONLY):
        return
    w = w or (lambda x: 1 / abs(f(x)))
    report(name, remez(f, w, a, b, n), f, w, a, b, dtype)


def removable(g, eps=mp.mpf("1e-12")):
    """g with its removable singularity at 0 filled by its value next to it."""
    return lambda x: g(x if abs(x) > eps else eps)


one = lambda x: mp.mpf(1)
ONLY = __import__("sys").argv[1:]

# exp2: 2^f = 1 + f q(f), f in [-1/2, 1/2]; q matters relative to itself.
fit("exp2 q", removable(lambda f: (mp.power(2, f) - 1) / f), -0.5, 0.5, 6)
# exp: e^r = 1 + r + r^2 q(r), r in [-ln2/2, ln2/2] (a little wider).
fit("exp q", removable(lambda r: (mp.exp(r) - 1 - r) / r**2), -0.3466, 0.3466, 5)
# log: log1p(f) = f + f^2 Q(f), f in [sqrt(1/2)-1, sqrt(2)-1] (a little wider).
fit("log1p Q", removable(lambda f: (mp.log1p(f) - f) / f**2), -0.2930, 0.4143, 10)
# sin: sin(r) = r + r^3 S(r^2), |r| <= pi/4 (a little wider).
fit("sin S", removable(lambda z: (mp.sin(mp.sqrt(z)) - mp.sqrt(z)) / (z * mp.sqrt(z))), 0, 0.6275, 3)
# cos: cos(r) = 1 - r^2/2 + r^4 C(r^2).
fit("cos C", removable(lambda z: (mp.cos(mp.sqrt(z)) - 1 + z / 2) / z**2), 0, 0.6275, 3)
# tanh: tanh(x) = x + x^3 T(x^2), |x| < 0.55.
fit("tanh T", removable(lambda z: (mp.tanh(mp.sqrt(z)) - mp.sqrt(z)) / (z * mp.sqrt(z))), 0, 0.3025, 6)
# erf: erf(x) = x + x E(x^2), |x| < 0.875: the error of E counts absolutely (against 1).
fit("erf E", removable(lambda z: mp.erf(mp.sqrt(z)) / mp.sqrt(z) - 1), 0, 0.875**2, 7, w=one)
# erfc: erfc(x) = exp(-x^2) R(x - 2.4375), x in [0.875, 4]: the error of R counts times
# exp(-x^2); the variable is centred so that Horner's rule does not cancel.
ERFC_C = mp.mpf("2.4375")
fit("erfc R", lambda t: mp.erfc(t + ERFC_C) * mp.exp((t + ERFC_C) ** 2), 0.875 - 2.4375, 4.0 - 2.4375, 14,
    w=lambda t: mp.exp(-(t + ERFC_C) ** 2))
