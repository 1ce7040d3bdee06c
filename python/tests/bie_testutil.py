# SPDX-License-Identifier: Apache-2.0
"""Shared test helpers: comparing libbie's gradients with the reference's under a named tolerance."""
import torch

from bie import functional as F
from bie import reference as R

U32 = 2.0 ** -24  # unit roundoff of float32


def assert_grad_close(got, want, dtype, what, bound, n_terms):
    """got (libbie, dtype) against want (float64 reference). Named tolerance: one rounding to
    `dtype` (eps * |want|), plus the float32 accumulation bound gamma_n * sum|terms| with
    gamma_n = (n + 2) * u32, since a backend may accumulate the n products of each sum in float32
    (an OpenBLAS sgemm, say) where the reference sums in float64. `bound` is sum|terms| per element."""
    assert got.dtype == dtype, what
    eps = torch.finfo(dtype).eps
    w = want.to(torch.float64).cpu()
    g = got.to(torch.float64).cpu()
    tol = eps * w.abs() + (n_terms + 2) * U32 * bound.cpu() + 1e-300
    bad = (g - w).abs() > tol
    assert not bad.any(), f"{what}: {int(bad.sum())} of {bad.numel()} differ, e.g. got {g[bad][:4].tolist()} " \
                          f"want {w[bad][:4].tolist()} (tolerance {tol[bad][:4].tolist()})"


def term_bounds(quant, x, w, sa, sw, g, bias, geo, ks):
    """sum|terms| of every gradient sum, and the number of terms, from the reference's formulas
    applied to absolute values."""
    cdim = -1 if geo is None else 1
    _, a, r = R.activation_codes(quant, x, bias, sa, cdim)
    shape_w = R._weight_shape(x, w, geo, ks)
    wc = R.weight_codes(quant, w, sw, shape_w).abs() * float(sw)
    G = g.detach().to(torch.float64).abs()
    if geo is None:
        n, k = shape_w
        bx = (G.reshape(-1, n) @ wc).reshape(x.shape)
        bw = float(sa.detach()) * (G.reshape(-1, n).t() @ a.abs().reshape(-1, k))
        nx, nw = n, G.numel() // n
    else:
        bx = R._op_grad_p(G, wc, x.shape, geo)
        bw = float(sa.detach()) * R._op_grad_q(G, a.abs(), shape_w, geo, 1.0)
        nx = shape_w[0] * shape_w[2] * shape_w[3]
        nw = G.numel() // shape_w[0]
    _, sfac = R._scale_terms(quant, a, r, x.numel())
    dims = [d for d in range(x.dim()) if d != (x.dim() - 1 if geo is None else 1)]
    return (bx, nx), (bw, nw), ((bx * sfac.abs()).sum(), nx + x.numel()), (bx.sum(dim=dims), nx + x.numel() // x.shape[cdim])


def check_backward(quant, x, w, sa, sw, bias, g, geo=None, ks=None):
    """libbie's backward (bie.functional) against the reference, with the named tolerance."""
    if geo is None:
        got = F.linear_backward(quant, x, w, sa, sw, g, bias)
    else:
        got = F.conv2d_backward(quant, x, w, sa, sw, g, bias, ks, geo.stride, geo.padding, geo.dilation, geo.pad_value)
    want = R.backward(quant, x, w, sa, sw, g, bias, geo, ks)
    bounds = term_bounds(quant, x, w, sa, sw, g, bias, geo, ks)
    dtypes = (x.dtype, w.dtype if w.dtype.is_floating_point else torch.float32, sa.dtype,
              bias.dtype if bias is not None else None)
    for name, gt, wt, (bd, nt), dt in zip(("grad_x", "grad_weight", "grad_scale_a", "grad_bias_a"), got, want, bounds,
                                          dtypes):
        if name == "grad_bias_a" and bias is None:
            assert gt is None
            continue
        assert_grad_close(gt, wt, dt, name, bd, nt)
