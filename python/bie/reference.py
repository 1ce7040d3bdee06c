# SPDX-License-Identifier: Apache-2.0
"""The layer math of libbie written again in plain PyTorch, from the formulas of the numerical
contract (docs/semantics.md). It is slow and exists for testing: the binding's tests compare libbie
with it, and gradcheck it in float64.

Notation (per element; float math in float32 unless said otherwise):
  x' = f32(x) + f32(bias_a[c])
  binary: a = +1 if x' >= 0 else -1 (NaN -> -1); w = +1 if W >= 0 else -1
  n-bit:  a = clamp(rne(x'/scale_a), lo, hi); w = clamp(rne(W/scale_w), lo, hi)
          (4-bit: lo, hi = -8, 7; 8-bit: -128, 127)
  acc = a (padded with pad_value) cross-correlated with w, exactly
  y = f32(acc) * (scale_a * scale_w), rounded to y's dtype
Backward (sums in float64):
  gx = conv_transpose(g, w * scale_w);  r = x'/scale_a
  binary: grad_x = gx * 1{|r| <= 1};  grad_scale_a = sum(grad_x * a) / sqrt(numel(x))
  n-bit:  mid = 1{lo <= r <= hi}; grad_x = gx * mid;
          grad_scale_a = sum(gx * (lo*1{r<lo} + hi*1{r>hi} + mid*(rne(r) - r))) / sqrt(numel(x)*hi)
  grad_W = scale_a * correlation of g with the padded codes a_pad; grad_bias_a = sum of grad_x
"""
import math

import torch
import torch.nn.functional as F

BINARY, INT4, INT8 = 1, 4, 8
PAD_ZERO, PAD_MINUS_ONE, PAD_PLUS_ONE = 0, 1, 2
_PAD = {PAD_ZERO: 0.0, PAD_MINUS_ONE: -1.0, PAD_PLUS_ONE: 1.0}


def code_range(quant):
    return {INT4: (-8, 7), INT8: (-128, 127)}[quant]


def _f32(t):
    return t.detach().to(torch.float32)


def unpack_bits(buf, k):
    """uint8 rows of packed bits (LSB first) -> float64 +-1 of length k along the last dim."""
    shifts = torch.arange(8, device=buf.device, dtype=torch.int16)
    bits = (buf.to(torch.int16).unsqueeze(-1) >> shifts) & 1
    bits = bits.reshape(*buf.shape[:-1], buf.shape[-1] * 8)[..., :k]
    return bits.to(torch.float64) * 2 - 1


def unpack_nibbles(buf, k):
    """int8 rows of 4-bit two's-complement nibbles (element 2i high) -> float64 codes, length k."""
    v = buf.to(torch.int16)
    hi = v >> 4
    lo = ((v & 0xF) ^ 8) - 8
    codes = torch.stack([hi, lo], dim=-1).reshape(*buf.shape[:-1], buf.shape[-1] * 2)[..., :k]
    return codes.to(torch.float64)


def activation_codes(quant, x, bias_a, scale_a, channel_dim):
    """(x', a, r) for x of any rank: x' and r in float32, the codes a in float64."""
    xp = _f32(x)
    if bias_a is not None:
        shape = [1] * x.dim()
        shape[channel_dim] = -1
        xp = xp + _f32(bias_a).reshape(shape)
    sa = _f32(scale_a).reshape(())
    r = xp / sa
    if quant == BINARY:
        a = torch.where(xp >= 0, 1.0, -1.0)
    else:
        lo, hi = code_range(quant)
        a = torch.where(torch.isnan(r), float(lo), torch.clamp(torch.round(r), lo, hi))
    return xp, a.to(torch.float64), r


def weight_codes(quant, weight, scale_w, shape):
    """Float64 codes of a weight of logical `shape` given as float, int8 or packed (uint8 B1,
    int8 S4; conv weights packed OHWI)."""
    shape = tuple(shape)
    if weight.dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        w = _f32(weight)
        if quant == BINARY:
            c = torch.where(w >= 0, 1.0, -1.0)
        else:
            lo, hi = code_range(quant)
            r = w / _f32(scale_w).reshape(())
            c = torch.where(torch.isnan(r), float(lo), torch.clamp(torch.round(r), lo, hi))
        return c.to(torch.float64)
    if weight.dtype == torch.int8 and tuple(weight.shape) == shape:
        v = weight.to(torch.float64)
        if quant == BINARY:
            return torch.where(v >= 0, 1.0, -1.0).to(torch.float64)
        lo, hi = code_range(quant)
        return torch.clamp(v, lo, hi)
    unpack = unpack_bits if weight.dtype == torch.uint8 else unpack_nibbles
    if len(shape) == 2:
        return unpack(weight, shape[1])
    o, c, kh, kw = shape
    return unpack(weight, c).permute(0, 3, 1, 2).contiguous()


class Geometry:
    """Conv geometry (None for a linear layer)."""

    def __init__(self, stride=1, padding=0, dilation=1, pad_value=PAD_ZERO):
        p = lambda v: tuple(v) if isinstance(v, (tuple, list)) else (int(v), int(v))
        self.stride, self.padding, self.dilation = p(stride), p(padding), p(dilation)
        self.pad_value = pad_value


def _pad(t, geo, value):
    ph, pw = geo.padding
    return F.pad(t, (pw, pw, ph, ph), value=value) if (ph or pw) else t


def _op(p, q, geo, pad_value_scaled):
    """The bilinear op of the layer on float64 tensors: matmul (linear) or the padded
    cross-correlation (conv) with padding value pad_value_scaled."""
    if geo is None:
        return p @ q.t()
    return F.conv2d(_pad(p, geo, pad_value_scaled), q, stride=geo.stride, dilation=geo.dilation)


def _op_grad_p(g, q, p_shape, geo):
    if geo is None:
        return g @ q
    return torch.nn.grad.conv2d_input(p_shape, q, g, stride=geo.stride, padding=geo.padding, dilation=geo.dilation)


def _op_grad_q(g, p, q_shape, geo, pad_value_scaled):
    if geo is None:
        return g.t() @ p
    return torch.nn.grad.conv2d_weight(_pad(p, geo, pad_value_scaled), q_shape, g, stride=geo.stride,
                                       dilation=geo.dilation)


def _weight_shape(x, weight, geo, kernel_size):
    if geo is None:
        return (weight.shape[0], x.shape[-1])
    kh, kw = (kernel_size if isinstance(kernel_size, (tuple, list)) else (kernel_size, kernel_size))
    return (weight.shape[0], x.shape[1], kh, kw)


def forward(quant, x, weight, scale_a, scale_w, bias_a=None, geo=None, kernel_size=None, out_dtype=None):
    """Reference forward: y in out_dtype (default x.dtype), or the raw accumulation when
    out_dtype is torch.int32."""
    cdim = -1 if geo is None else 1
    _, a, _ = activation_codes(quant, x, bias_a, scale_a, cdim)
    shape_w = _weight_shape(x, weight, geo, kernel_size)
    w = weight_codes(quant, weight, scale_w, shape_w)
    pv = _PAD[geo.pad_value] if (geo is not None and quant == BINARY) else 0.0
    if geo is None:
        acc = (a.reshape(-1, shape_w[1]) @ w.t()).reshape(*x.shape[:-1], shape_w[0])
    else:
        acc = _op(a, w, geo, pv)
    out_dtype = out_dtype or x.dtype
    if out_dtype == torch.int32:
        return acc.to(torch.int32)
    s = _f32(scale_a).reshape(()) * _f32(scale_w).reshape(())
    return (acc.to(torch.float32) * s).to(out_dtype)


def _scale_terms(quant, a, r, numel):
    """(mask, per-element factor of grad_scale_a that multiplies gx)."""
    if quant == BINARY:
        mask = (r.abs() <= 1).to(torch.float64)
        return mask, mask * a / math.sqrt(numel)
    lo, hi = code_range(quant)
    small, large = (r < lo).to(torch.float64), (r > hi).to(torch.float64)
    mid = ((r >= lo) & (r <= hi)).to(torch.float64)
    rd = r.to(torch.float64)
    lsq = lo * small + hi * large + mid * (torch.round(r).to(torch.float64) - rd)
    return mid, lsq / math.sqrt(numel * hi)


def backward(quant, x, weight, scale_a, scale_w, grad_y, bias_a=None, geo=None, kernel_size=None):
    """Reference backward: (grad_x, grad_weight, grad_scale_a, grad_bias_a), all float64."""
    cdim = -1 if geo is None else 1
    _, a, r = activation_codes(quant, x, bias_a, scale_a, cdim)
    shape_w = _weight_shape(x, weight, geo, kernel_size)
    w = weight_codes(quant, weight, scale_w, shape_w)
    sa = _f32(scale_a).reshape(()).to(torch.float64)
    sw = _f32(scale_w).reshape(()).to(torch.float64)
    g = grad_y.detach().to(torch.float64)
    pv = _PAD[geo.pad_value] if (geo is not None and quant == BINARY) else 0.0
    if geo is None:
        k, n = shape_w[1], shape_w[0]
        g2, a2 = g.reshape(-1, n), a.reshape(-1, k)
        gx = (g2 @ (w * sw)).reshape(x.shape)
        gw = sa * (g2.t() @ a2)
    else:
        gx = _op_grad_p(g, w * sw, x.shape, geo)
        gw = sa * _op_grad_q(g, a, shape_w, geo, pv)
    mask, sfac = _scale_terms(quant, a, r, x.numel())
    grad_x = gx * mask
    grad_sa = (gx * sfac).sum()
    dims = [d for d in range(x.dim()) if d != (x.dim() - 1 if geo is None else 1)]
    grad_b = grad_x.sum(dim=dims) if bias_a is not None else None
    return grad_x, gw, grad_sa.reshape(scale_a.shape), grad_b


class Surrogate(torch.autograd.Function):
    """A smooth function whose exact derivative at the anchor point is the straight-through
    backward above, and whose backward is the hand-written `backward`. gradcheck on it (float64,
    inputs equal to the anchors) checks the hand-written formulas against finite differences.

    With the codes a0, w0, the mask and the scale factor frozen at the anchor (x0, b0, W0, s0):
      x'  = x + b
      P   = s0*a0 + mask*(x' - x0') + (s - s0)*sfac        (padding value: pv*s0, a constant)
      Q   = sw*w0 + (W - W0)
      y   = P . Q  (matmul, or the padded cross-correlation)
    """

    @staticmethod
    def forward(ctx, x, bias_a, weight, scale_a, quant, scale_w, geo, kernel_size, anchors):
        x0, b0, w0_, s0 = anchors
        cdim = -1 if geo is None else 1
        _, a, r = activation_codes(quant, x0, b0, s0, cdim)
        shape_w = _weight_shape(x0, w0_, geo, kernel_size)
        w0 = weight_codes(quant, w0_, scale_w, shape_w)
        mask, sfac = _scale_terms(quant, a, r, x0.numel())
        shape = [1] * x.dim()
        shape[cdim] = -1
        shift = lambda t, b: t if b is None else t + b.reshape(shape)
        s0d = s0.detach().to(torch.float64)
        p = s0d * a + mask * (shift(x, bias_a) - shift(x0, b0)) + (scale_a - s0d) * sfac
        q = scale_w.detach().to(torch.float64) * w0 + (weight - w0_)
        pv = _PAD[geo.pad_value] if (geo is not None and quant == BINARY) else 0.0
        if geo is None:
            y = (p.reshape(-1, shape_w[1]) @ q.t()).reshape(*x.shape[:-1], shape_w[0])
        else:
            y = _op(p, q, geo, pv * float(s0d))
        ctx.save_for_backward(x0, b0, w0_, s0, scale_w)
        ctx.quant, ctx.geo, ctx.kernel_size = quant, geo, kernel_size
        ctx.has_bias = bias_a is not None
        return y

    @staticmethod
    def backward(ctx, g):
        x0, b0, w0, s0, scale_w = ctx.saved_tensors
        gx, gw, gs, gb = backward(ctx.quant, x0, w0, s0, scale_w, g, b0 if ctx.has_bias else None, ctx.geo,
                                  ctx.kernel_size)
        return gx, gb, gw, gs, None, None, None, None, None


def surrogate(quant, x, bias_a, weight, scale_a, scale_w, anchors, geo=None, kernel_size=None):
    """Surrogate.apply with the anchors (x0, bias_a0, weight0, scale_a0), detached copies of the
    point where gradcheck evaluates the Jacobian."""
    return Surrogate.apply(x, bias_a, weight, scale_a, quant, scale_w, geo, kernel_size, anchors)
