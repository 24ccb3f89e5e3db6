"""Session 35 (issue 40): one 3x3 conv layer's error against float64, by Winograd tile and operand dtype, on a CPU.

A 128 -> 64 channel conv over a 26 x 26 plane (bf16 activations and weights: Gaussian, and SiLU of Gaussian x 1.5),
computed as F(m x m, 3x3) for m = 2, 4, 6 with the transformed input and weight rounded once to bf16 or fp16 and
everything else in float64, against the direct conv of the same bf16 operands in float64; the direct conv's own
bf16 output rounding for scale. The matrices come from interpolation points (the last point infinity), built here
by Vandermonde inversion. Prints the error RMS relative to the output RMS, in dB (higher is closer).

    python docs/data/experiments/winograd_tile_accuracy_cpu.py
"""

import math

import numpy as np
import torch
import torch.nn.functional as F


def matrices(points, m, r=3):
    """(A^T, G, B^T) of F(m, r) for these finite points (m + r - 2 of them) and infinity."""
    n = m + r - 1

    def vandermonde(columns):
        v = np.zeros((n, columns))
        for i, p in enumerate(points):
            v[i] = [p ** j for j in range(columns)]
        v[n - 1, columns - 1] = 1.0
        return v

    return vandermonde(m).T, vandermonde(r), np.linalg.inv(vandermonde(n)).T


def winograd(x, w, at, g, bt, m, rounding):
    n = m + 2
    at, g, bt = (torch.tensor(a, dtype=torch.float64) for a in (at, g, bt))
    u = rounding(torch.einsum("ij,ocjk,lk->ocil", g, w, g))
    patches = x.unfold(1, n, m).unfold(2, n, m)
    v = rounding(torch.einsum("ij,cabjk,lk->cabil", bt, patches, bt))
    y = torch.einsum("ij,oabjk,lk->oabil", at, torch.einsum("ocij,cabij->oabij", u, v), at)
    o, rows, cols = y.shape[:3]
    return y.permute(0, 1, 3, 2, 4).reshape(o, rows * m, cols * m)


def main():
    bf16 = lambda t: t.to(torch.bfloat16).double()  # noqa: E731
    fp16 = lambda t: t.to(torch.float16).double()  # noqa: E731
    torch.manual_seed(0)
    channels, out_channels, side = 128, 64, 2 + 24
    tiles = (("F(2x2, 3x3) 0, 1, -1", 2, [0, 1, -1]), ("F(4x4, 3x3) 0, 1, -1, 2, -2", 4, [0, 1, -1, 2, -2]),
             ("F(4x4, 3x3) 0, 1, -1, 1/2, -1/2", 4, [0, 1, -1, .5, -.5]),
             ("F(4x4, 3x3) 0, 1, -1, 2, -1/2", 4, [0, 1, -1, 2, -.5]),
             ("F(6x6, 3x3) 0, 1, -1, 2, -2, 1/2, -1/2", 6, [0, 1, -1, 2, -2, .5, -.5]))
    for kind in ("gauss", "silu"):
        x = torch.randn(channels, side, side, dtype=torch.float64)
        x = bf16(F.silu(1.5 * x) if kind == "silu" else x)
        w = bf16(torch.randn(out_channels, channels, 3, 3, dtype=torch.float64) / math.sqrt(9 * channels))
        exact = F.conv2d(x[None], w)[0]

        def db(y):
            return -20 * math.log10(((y - exact).pow(2).mean().sqrt() / exact.pow(2).mean().sqrt()).item())

        print(f"{kind}: the direct conv's bf16 output rounding {db(bf16(exact)):.1f} dB")
        for name, m, points in tiles:
            at, g, bt = matrices(points, m)
            assert torch.allclose(winograd(x, w, at, g, bt, m, lambda t: t), exact, atol=1e-9)
            errors = {dtype: db(bf16(winograd(x, w, at, g, bt, m, rounding)))
                      for dtype, rounding in (("bf16", bf16), ("fp16", fp16))}
            print(f"{kind}: {name:<40} operands bf16 {errors['bf16']:5.1f} dB, fp16 {errors['fp16']:5.1f} dB")


if __name__ == "__main__":
    main()
