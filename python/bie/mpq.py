# SPDX-License-Identifier: Apache-2.0
"""Weight-only n-bit linear layers for language models, under Bitorch Engine's names: MPQLinear
(its MPQLinearBase / MPQLinearCuda arguments) and MBWQLinear (mixed bit widths per group, input
permutation and channel scale, as MBWQLinearCuda), computed by libbie (include/bie.h "weight-only
n-bit linear layers"; layouts in docs/formats.md).

  y = x' @ W + bias,  x'[:, r] = x[:, perm[r]] * channel_scale[perm[r]],
  W[r, n] = s*(q - z) (GPTQ, RTN asymmetric), s*(q - 2^(b-1)) (symmetric), s*q - z (Bitorch
  Engine's GBA double-quantised statistics and MBWQ, "scale*q - zero")

qweight is GPTQ's int32 [ceil(K*b/32), N] (each column's codes as one LSB-first bit stream down
the column). Training follows Bitorch Engine: grad_x flows through the low-bit weight (the QLoRA
case, see LoRALinear), and the weight gradient x'^T g is stored as qweight.privileged_grad for
bie.mpq_optim.MPQAdam, which updates the codes (and zero points) in place.
"""
import math

import torch
import torch.nn as nn

from . import _lib
from .functional import _Call, _view

__all__ = ["MPQLinear", "MBWQLinear", "LoRALinear", "pack_codes", "unpack_codes", "rtn_params", "quantize_codes",
           "g_idx_to_perm", "replace_layers", "wq_layers", "ZERO_SYM", "ZERO_CODE", "ZERO_OFFSET"]

ZERO_SYM, ZERO_CODE, ZERO_OFFSET = _lib.WQ_ZERO_SYM, _lib.WQ_ZERO_CODE, _lib.WQ_ZERO_OFFSET


# --- the bit-stream layout (torch ops, any device) ---------------------------------------------------

def _row_bits(in_features, bits, group_size, group_bits, device):
    """Stream bit of every packed row, bits per row, and the word rows (bie.h's layout rule)."""
    K = in_features
    gs = min(group_size, K)
    r = torch.arange(K, device=device, dtype=torch.int64)
    g = r // gs
    if bits:
        b = torch.full((K,), bits, dtype=torch.int64, device=device)
        return r * bits, b, (K * bits + 31) // 32
    gb = torch.as_tensor(group_bits, dtype=torch.int64, device=device)
    n = torch.clamp(K - torch.arange(len(gb), device=device) * gs, max=gs)
    words = (n * gb + 31) // 32
    start = torch.cumsum(words, 0) - words
    b = gb[g]
    return start[g] * 32 + (r - g * gs) * b, b, int(words.sum())


def pack_codes(codes, bits, group_size, group_bits=None):
    """qweight (int32 [rows, N]) from codes [K, N] in [0, 2^b - 1] (packed row order)."""
    K, N = codes.shape
    bit, b, rows = _row_bits(K, bits, group_size, group_bits, codes.device)
    word, sh = bit // 32, (bit % 32)
    v = codes.to(torch.int64) << sh[:, None]
    out = torch.zeros(rows + 1, N, dtype=torch.int64, device=codes.device)
    # Disjoint bit fields: a sum is an OR.
    out.index_add_(0, word, v & 0xFFFFFFFF)
    out.index_add_(0, word + 1, v >> 32)
    out = out[:rows]
    return torch.where(out >= 2 ** 31, out - 2 ** 32, out).to(torch.int32)


def unpack_codes(qweight, in_features, bits, group_size, group_bits=None):
    """codes (int32 [K, N]) of qweight."""
    bit, b, rows = _row_bits(in_features, bits, group_size, group_bits, qweight.device)
    word, sh = bit // 32, bit % 32
    q = qweight.to(torch.int64) & 0xFFFFFFFF
    lo = q[word]
    hi = q[torch.clamp(word + 1, max=rows - 1)] * (word + 1 < rows).to(torch.int64)[:, None]
    v = ((lo | (hi << 32)) >> sh[:, None]) & ((1 << b) - 1)[:, None]
    return v.to(torch.int32)


def _group_bits_rows(K, bits, group_size, group_bits, device):
    gs = min(group_size, K)
    if bits:
        return torch.full((K,), bits, dtype=torch.int64, device=device)
    return torch.as_tensor(group_bits, dtype=torch.int64, device=device)[torch.arange(K, device=device) // gs]


def rtn_params(w, bits, group_size, sym, group_bits=None, stat_dtype=torch.float16):
    """GPTQ's quantiser parameters per group and column of w [K, N] (f32 math; bie_wq_quantize's
    equations): scales [G, N] and zeros [G, N] (integer codes; 2^(b-1) when sym), in stat_dtype."""
    K, N = w.shape
    gs = min(group_size, K)
    G = (K + gs - 1) // gs
    pad = G * gs - K
    wf = w.to(torch.float32)
    wg = torch.nn.functional.pad(wf, (0, 0, 0, pad)).view(G, gs, N)
    if pad:  # padded rows must not move the range: use the group's first row
        wg[-1, gs - pad:] = wg[-1, :1]
    lo = torch.clamp(wg.min(1).values, max=0.0)
    hi = torch.clamp(wg.max(1).values, min=0.0)
    if sym:
        hi = torch.maximum(-lo, hi)
        lo = torch.where(lo < 0, -hi, lo)
    both = (lo == 0) & (hi == 0)
    lo = torch.where(both, torch.full_like(lo, -1.0), lo)
    hi = torch.where(both, torch.full_like(hi, 1.0), hi)
    gb = (torch.full((G,), bits, dtype=torch.int64, device=w.device) if bits
          else torch.as_tensor(group_bits, dtype=torch.int64, device=w.device))
    maxq = ((1 << gb) - 1).to(torch.float32)[:, None]
    scale = ((hi - lo) / maxq).to(stat_dtype).to(torch.float32)
    zero = (2.0 ** (gb - 1)).to(torch.float32)[:, None].expand_as(scale) if sym else torch.round(-lo / scale)
    return scale.to(stat_dtype), zero.to(stat_dtype)


def quantize_codes(w, scales, zeros, bits, group_size, zero_mode, group_bits=None):
    """codes [K, N] of w under fixed statistics: clamp(rne(w/s + frac(z)) + floor(z)) (CODE, SYM:
    z = 2^(b-1); GPTQ's rne(w/s) + z when z is an integer) or
    clamp(rne((w + z)/s)) (OFFSET), each in [0, 2^b - 1]."""
    K, N = w.shape
    gs = min(group_size, K)
    g = torch.arange(K, device=w.device) // gs
    s = scales.to(torch.float32)[g]
    b = _group_bits_rows(K, bits, group_size, group_bits, w.device)
    maxq = ((1 << b) - 1).to(torch.float32)[:, None]
    wf = w.to(torch.float32)
    if zero_mode == ZERO_OFFSET:
        q = torch.round((wf + zeros.to(torch.float32)[g]) / s)
    else:
        z = zeros.to(torch.float32)[g] if zero_mode == ZERO_CODE else (2.0 ** (b - 1)).to(torch.float32)[:, None]
        zi = torch.floor(z)  # GPTQ's rne(w/s) + z for integer z; rne(w/s + z) for any other
        q = torch.round(wf / s + (z - zi)) + zi
    q = torch.nan_to_num(q, nan=0.0)
    return torch.minimum(torch.clamp(q, min=0.0), maxq).to(torch.int32)


def g_idx_to_perm(g_idx, group_size):
    """An act-order GPTQ g_idx [K] (group of each input feature, rows in feature order) as bie's
    perm: the features sorted by group (stable), so that packed row r is in group r // group_size.
    Raises ValueError when the groups do not all hold group_size features (the last may hold fewer)."""
    g_idx = g_idx.to(torch.int64)
    perm = torch.sort(g_idx, stable=True).indices
    K = g_idx.numel()
    want = torch.arange(K, device=g_idx.device) // group_size
    if not torch.equal(g_idx[perm], want):
        raise ValueError("bie: g_idx does not give groups of group_size consecutive packed rows")
    return perm.to(torch.int32)


# --- the layer ------------------------------------------------------------------------------------------

def _desc(m, act=_lib.WQ_ACT_FLOAT):
    return _lib.WqDesc(m.in_channels, m.out_channels, m.w_bit if not m.mixed else 0, m.group_size_eff, m.zero_mode, act)


def _weight_views(m, bias):
    """(struct bie_wq_weight, what it points into) for the layer's tensors; the caller keeps the
    second alive while the struct is used (it holds the contiguous copies of non-contiguous
    tensors). The struct is kept on the layer and reused while every tensor is contiguous and keeps
    its address, shape, strides and dtype (its contents may change in place), and group_bits its
    version; the cache holds no reference to the layer's own tensors, only to the host copy of
    group_bits."""
    gbt = m.group_bits if m.mixed else None
    ts = (m.qweight, m.scales, m.zeros if m.zero_mode != ZERO_SYM else None, gbt,
          m.q_perm if m.has_perm else None, m.channel_scale if m.has_channel_scale else None, bias)
    sig = tuple(None if t is None else (t.data_ptr(), t.shape, t.stride(), t.dtype) for t in ts)
    sig += (None if gbt is None else gbt._version,)
    hit = m.__dict__.get("_wq_views")
    if hit is not None and hit[0] == sig:
        return hit[1]
    keep = []

    def v(t):
        if t is None:
            return None
        t = t.contiguous()
        keep.append(t)
        return _view(t)

    gb = None if gbt is None else gbt.to(device="cpu", dtype=torch.int32)
    tv = [v(ts[0]), v(ts[1]), v(ts[2]), v(gb), v(ts[4]), v(ts[5]), v(ts[6])]
    ptrs = [None if t is None else _lib.ctypes.pointer(t) for t in tv]
    w = _lib.WqWeight(*ptrs)
    if all(t is None or t.is_contiguous() for t in ts):
        m.__dict__["_wq_views"] = (sig, (w, [gb] + tv))
    return w, keep + tv


def _wq_forward(x, bias, m):
    """y = x W (+ bias) through bie_wq_linear_forward; x2 is x as [rows, K]."""
    flat = x.dim() == 2
    x2 = x if flat else x.reshape(-1, x.shape[-1])
    y = torch.empty(x2.shape[0], m.out_channels, dtype=x.dtype, device=x.device)
    w, keep = _weight_views(m, bias)
    act = _lib.WQ_ACT_INT8 if m.int8_activations and x.device.type == "cpu" else _lib.WQ_ACT_FLOAT
    _Call(x)("bie_wq_linear_forward", _lib.ctypes.byref(_desc(m, act)), _lib.ctypes.byref(w),
             _lib.ctypes.byref(_view(x2)), _lib.ctypes.byref(_view(y)))
    return x2, y if flat else y.reshape(*x.shape[:-1], m.out_channels)


class _WQFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias, m):
        x2, y = _wq_forward(x, bias, m)
        ctx.m = m
        ctx.save_for_backward(x2, bias)
        ctx.shape = x.shape
        return y

    @staticmethod
    def backward(ctx, g):
        m = ctx.m
        x2, bias = ctx.saved_tensors
        g2 = g.reshape(-1, m.out_channels).contiguous()
        want_x = ctx.needs_input_grad[0]
        want_w = m.training and m.requires_grad
        gx = torch.empty_like(x2) if want_x else None
        gw = torch.empty(m.in_channels, m.out_channels, dtype=torch.float32, device=g.device) if want_w else None
        if want_x or want_w:
            w, keep = _weight_views(m, bias)
            views = [_view(x2), _view(g2), None if gx is None else _view(gx), None if gw is None else _view(gw)]
            ptr = [None if v is None else _lib.ctypes.byref(v) for v in views]
            _Call(g)("bie_wq_linear_backward", _lib.ctypes.byref(_desc(m)), _lib.ctypes.byref(w), *ptr)
        if want_w:  # Bitorch Engine's privileged gradient, read by bie.mpq_optim.MPQAdam
            prev = getattr(m.qweight, "privileged_grad", None)
            m.qweight.privileged_grad = gw if prev is None else prev + gw
        gb = g2.sum(0).to(bias.dtype) if bias is not None and ctx.needs_input_grad[1] else None
        return (None if gx is None else gx.reshape(ctx.shape)), gb, None


class MPQLinear(nn.Module):
    """Bitorch Engine's MPQLinearBase arguments: (in_channels, out_channels, a_bit=16, w_bit=4,
    dtype=torch.half, group_size=-1 (per channel), use_gba_quant=True, dq_group_size=-1, dq_mode=2,
    disable_bias=True, asym=False, requires_grad=True). use_gba_quant=False is GPTQ mode (asym
    forced, zeros stored as GPTQ's qzeros + 1, i.e. W = s*(q - z)); GBA mode uses s*q - z for sym and
    s*(q - z) for asym (see docs/formats.md for the mapping of its double-quantised statistics,
    load_gba). Buffers: qweight int32 [ceil(K*w_bit/32), N], scales and zeros [G, N] (dtype),
    q_perm int32 [K] (act-order), channel_scale [K], bias [N]."""

    def __init__(self, in_channels, out_channels, a_bit=16, w_bit=4, dtype=torch.half, group_size=-1,
                 use_gba_quant=True, dq_group_size=-1, dq_mode=2, disable_bias=True, asym=False,
                 requires_grad=True, device=None, group_bits=None):
        super().__init__()
        if a_bit != 16:
            raise ValueError("bie: MPQLinear takes float activations (a_bit=16)")
        if group_bits is None and w_bit not in range(1, 9):
            raise ValueError(f"bie: w_bit must be in 1..8, got {w_bit}")
        self.in_channels, self.out_channels, self.a_bit, self.w_bit = in_channels, out_channels, a_bit, w_bit
        self.dtype = dtype
        self.group_size = group_size if group_size > 0 else in_channels
        self.group_size_eff = min(self.group_size, in_channels)
        self.use_gba_quant, self.dq_group_size, self.dq_mode = use_gba_quant, dq_group_size, dq_mode
        self.asym = True if not use_gba_quant else asym
        self.zero_mode = ZERO_CODE if self.asym else (ZERO_OFFSET if use_gba_quant else ZERO_SYM)
        self.requires_grad = requires_grad
        self.int8_activations = False
        G = (in_channels + self.group_size_eff - 1) // self.group_size_eff
        self.mixed = group_bits is not None
        if self.mixed:
            self.register_buffer("group_bits", torch.as_tensor(group_bits, dtype=torch.int32).clone())
        _, _, rows = _row_bits(in_channels, 0 if self.mixed else w_bit, self.group_size_eff,
                               group_bits if self.mixed else None, "cpu")
        self.qweight = nn.Parameter(torch.zeros(rows, out_channels, dtype=torch.int32, device=device), requires_grad=False)
        self.register_buffer("scales", torch.ones(G, out_channels, dtype=dtype, device=device))
        self.register_buffer("zeros", torch.zeros(G, out_channels, dtype=dtype, device=device))
        self.register_buffer("q_perm", torch.arange(in_channels, dtype=torch.int32, device=device))
        self.register_buffer("channel_scale", torch.ones(in_channels, dtype=dtype, device=device))
        self.has_perm = False
        self.has_channel_scale = False
        self.bias = None if disable_bias else nn.Parameter(torch.zeros(out_channels, dtype=dtype, device=device))
        self.qweight.wq = self  # the optimizer finds the layer's statistics through its qweight

    # -- weights --
    def set_quantized(self, codes, scales, zeros=None, perm=None, channel_scale=None, bias=None):
        """Installs codes [K, N] (packed row order), statistics [G, N], and optionally perm [K],
        channel_scale [K] and bias [N]."""
        dev = self.qweight.device
        gb = self.group_bits if self.mixed else None
        self.qweight.data = pack_codes(codes.to(dev), 0 if self.mixed else self.w_bit, self.group_size_eff, gb)
        self.scales = scales.to(device=dev, dtype=self.dtype).contiguous()
        if zeros is not None:
            self.zeros = zeros.to(device=dev, dtype=self.dtype).contiguous()
        if perm is not None:
            self.q_perm = perm.to(device=dev, dtype=torch.int32).contiguous()
            self.has_perm = True
        if channel_scale is not None:
            self.channel_scale = channel_scale.to(device=dev, dtype=self.dtype).contiguous()
            self.has_channel_scale = True
        if bias is not None:
            self.bias = nn.Parameter(bias.to(device=dev, dtype=self.dtype).clone())

    def codes(self):
        gb = self.group_bits if self.mixed else None
        return unpack_codes(self.qweight, self.in_channels, 0 if self.mixed else self.w_bit, self.group_size_eff, gb)

    def quantize_from(self, weight, perm=None):
        """Round-to-nearest from a float weight [out, in] (nn.Linear's layout)."""
        w = weight.detach().t().to(torch.float32)
        if perm is not None:
            w = w[perm.long()]
        gb = self.group_bits.tolist() if self.mixed else None
        sym = self.zero_mode != ZERO_CODE
        s, z = rtn_params(w, 0 if self.mixed else self.w_bit, self.group_size_eff, sym, gb, self.dtype)
        mode = ZERO_CODE if self.zero_mode == ZERO_OFFSET else self.zero_mode
        codes = quantize_codes(w, s, z, 0 if self.mixed else self.w_bit, self.group_size_eff, mode, gb)
        if self.zero_mode == ZERO_OFFSET:
            z = (s.to(torch.float32) * z.to(torch.float32)).to(self.dtype)  # s*q - s*z
        self.set_quantized(codes, s, z, perm)

    def dequantize(self):
        """W [K, N] f32 in packed row order (bie_wq_dequantize)."""
        w = torch.empty(self.in_channels, self.out_channels, dtype=torch.float32, device=self.qweight.device)
        wv, keep = _weight_views(self, None)
        out = _view(w)
        _Call(w)("bie_wq_dequantize", _lib.ctypes.byref(_desc(self)), _lib.ctypes.byref(wv), _lib.ctypes.byref(out))
        return w

    def prepare_params(self):
        """Bitorch Engine's protocol; the statistics are already resolved here."""

    def forward(self, x):
        if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"bie: MPQLinear input must be float32, float16 or bfloat16, not {x.dtype}")
        b = self.bias
        if torch.is_grad_enabled() and (x.requires_grad or (b is not None and b.requires_grad) or
                                        (self.training and self.requires_grad)):
            return _WQFunction.apply(x, b, self)
        return _wq_forward(x, b, self)[1]  # nothing to differentiate: no autograd node

    def extra_repr(self):
        bits = f"mixed {sorted(set(self.group_bits.tolist()))}" if self.mixed else f"w_bit={self.w_bit}"
        return (f"in_channels={self.in_channels}, out_channels={self.out_channels}, {bits}, "
                f"group_size={self.group_size}, zero={('sym', 'code', 'offset')[self.zero_mode]}")

    # -- GPTQ checkpoints ------------------------------------------------------------------------------
    def load_gptq(self, qweight, qzeros, scales, g_idx=None, bias=None, zeros_offset=1):
        """GPTQ's tensors exactly: qweight int32 [K*b/32, N] (bie's layout for every b), qzeros int32
        [G, N*b/32] (codes packed along N, stored value = zero - zeros_offset: 1 for GPTQ v1
        checkpoints, 0 for v2), scales [G, N] and, for act-order, g_idx [K] (turned into q_perm: the
        rows are reordered by group, an exact re-indexing)."""
        K, b = self.in_channels, self.w_bit
        zq = unpack_codes(qzeros.t().contiguous(), self.out_channels, b, self.out_channels).t()
        zeros = zq.to(torch.float32) + zeros_offset
        codes = unpack_codes(qweight, K, b, K)
        perm = None
        if g_idx is not None and not torch.equal(g_idx.long().cpu(), torch.arange(K) // self.group_size_eff):
            perm = g_idx_to_perm(g_idx.cpu(), self.group_size_eff)
            codes = codes[perm.long().to(codes.device)]
        self.zero_mode = ZERO_CODE
        self.set_quantized(codes, scales, zeros, perm, None, bias)

    def gptq_state(self):
        """GPTQ's tensors (v1 qzeros, rows in feature order, g_idx) for uniform CODE layers."""
        if self.mixed or self.zero_mode != ZERO_CODE:
            raise ValueError("bie: only uniform asymmetric (CODE) layers have a GPTQ form")
        K, b = self.in_channels, self.w_bit
        codes = self.codes()
        g = torch.arange(K, device=codes.device) // self.group_size_eff
        if self.has_perm:
            inv = torch.empty_like(self.q_perm.long())
            inv[self.q_perm.long()] = torch.arange(K, device=inv.device)
            codes, g_idx = codes[inv], g[inv]
        else:
            g_idx = g
        z = torch.round(self.zeros.to(torch.float32)).to(torch.int32) - 1
        z = torch.remainder(z, 1 << b)
        qzeros = pack_codes(z.t().contiguous(), b, self.out_channels).t().contiguous()
        out = {"qweight": pack_codes(codes, b, K), "qzeros": qzeros, "scales": self.scales, "g_idx": g_idx.to(torch.int32)}
        if self.bias is not None:
            out["bias"] = self.bias.detach()
        return out

    def load_gba(self, qweight, qscales, qscales_zeros, qscales_scales, qzeros=None, qstatistic=None,
                 qzeros_zeros=None, qzeros_scales=None):
        """Bitorch Engine's GBA double-quantised statistics, resolved as its prepare_params does:
          scale = (qscale - qscales_zeros) * qscales_scales
          sym:  zero = (qzero - qzeros_zeros) * qzeros_scales, qscale/qzero the high/low nibble of
                qstatistic [G, N/dq, dq] (uint8)          -> W = scale*q - zero (OFFSET)
          asym: qscales uint8, zero = the GPTQ-packed qzeros codes  -> W = scale*(q - zero) (CODE)
        The statistics' shapes ([G, N/dq, dq] and [G, N/dq, 1], or [1, N, 1] for dq_mode 1) broadcast."""
        G, N = self.scales.shape
        f = torch.float32
        if self.asym:
            qs = qscales.to(f)
            scale = ((qs - qscales_zeros.to(f)) * qscales_scales.to(f)).reshape(G, N)
            zeros = unpack_codes(qzeros.t().contiguous(), N, self.w_bit, N).t().to(f)
            self.zero_mode = ZERO_CODE
        else:
            st = qstatistic.to(torch.int32)
            qs, qz = (st >> 4).to(f), (st & 15).to(f)
            scale = ((qs - qscales_zeros.to(f)) * qscales_scales.to(f)).reshape(G, N)
            zeros = ((qz - qzeros_zeros.to(f)) * qzeros_scales.to(f)).reshape(G, N)
            self.zero_mode = ZERO_OFFSET
        codes = unpack_codes(qweight, self.in_channels, self.w_bit, self.group_size_eff)
        self.set_quantized(codes, scale, zeros)


class MBWQLinear(MPQLinear):
    """Bitorch Engine's MBWQLinearCuda: layer mix (use_mbw=False: uniform w_bit, s*q - z, q_perm)
    or channel mix (use_mbw=True: group_bits per group of group_size rows, exl2's row blocks),
    always with an input permutation q_perm and a channel_scale multiplied into x first."""

    def __init__(self, in_channels, out_channels, w_bit=4, dtype=torch.half, group_size=32, use_mbw=False,
                 group_bits=None, disable_bias=True, asym=False, requires_grad=True, device=None):
        super().__init__(in_channels, out_channels, 16, w_bit, dtype, group_size, True, -1, 2, disable_bias, asym,
                         requires_grad, device, group_bits if use_mbw else None)
        self.use_mbw = use_mbw

    def load_exl2(self, q_weight, q_groups, q_scale, q_scale_max, q_perm=None, channel_scale=None):
        """An exl2-style channel-mix layer whose groups hold 2, 4 or 8 bits (those packed as GPTQ
        streams). q_groups [2*G] = (bits, first word row) per group; q_scale holds each group's
        4-bit scale codes packed 8 per int32 along N; scale = (q_scale + 1)^2 * q_scale_max / 256
        and W = scale * (q - 2^(b-1)) (exl2's symmetric form). 3, 5 and 6-bit groups use ExLlamaV2's
        own shuffle and are refused."""
        qg = q_groups.to(torch.int64).view(-1, 2)
        bits = qg[:, 0]
        if not all(int(b) in (2, 4, 8) for b in bits):
            raise ValueError("bie: exl2 groups of 3, 5 or 6 bits are packed in ExLlamaV2's own order (not imported)")
        self.mixed = True
        self.group_bits = bits.to(torch.int32)
        N = self.out_channels
        qs = unpack_codes(q_scale.t().contiguous(), N, 4, N).t().to(torch.float32)
        scale = (qs + 1) ** 2 * (q_scale_max.to(torch.float32)[:, None] / 256.0)
        codes = unpack_codes(q_weight, self.in_channels, 0, self.group_size_eff, bits.tolist())
        self.zero_mode = ZERO_SYM
        self.set_quantized(codes, scale, None, q_perm, channel_scale)


class LoRALinear(nn.Module):
    """A LoRA adapter beside a frozen low-bit layer (the QLoRA case): y = base(x) + (alpha/r) * B(A(x));
    the gradient reaches x through the n-bit weight (bie_wq_linear_backward) and A, B."""

    def __init__(self, base, r=8, alpha=16, dropout=0.0):
        super().__init__()
        self.base = base
        self.base.requires_grad = False
        self.r, self.alpha = r, alpha
        dt = base.scales.dtype if base.scales.dtype != torch.float16 else torch.float32
        self.lora_A = nn.Linear(base.in_channels, r, bias=False, dtype=dt, device=base.qweight.device)
        self.lora_B = nn.Linear(r, base.out_channels, bias=False, dtype=dt, device=base.qweight.device)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        y = self.base(x)
        d = self.lora_B(self.lora_A(self.dropout(x.to(self.lora_A.weight.dtype)))) * (self.alpha / self.r)
        return y + d.to(y.dtype)


def wq_layers(model):
    return [m for m in model.modules() if isinstance(m, MPQLinear)]


def replace_layers(model, w_bit=4, group_size=128, asym=True, dtype=None, quantize=True, skip=(), group_bits=None):
    """Bitorch Engine's replace_layers for LLMs: every nn.Linear of model (not named in skip)
    becomes an MPQLinear (GPTQ mode when asym, else symmetric), quantised by round-to-nearest from
    its weight when quantize. Returns {qualified name: new layer}."""
    out = {}
    for name, mod in list(model.named_modules()):
        for cname, child in list(mod.named_children()):
            full = f"{name}.{cname}" if name else cname
            if not isinstance(child, nn.Linear) or full in skip:
                continue
            dt = dtype or child.weight.dtype
            q = MPQLinear(child.in_features, child.out_features, 16, w_bit, dt, group_size, use_gba_quant=not asym,
                          disable_bias=child.bias is None, asym=asym, device=child.weight.device,
                          group_bits=group_bits)
            if quantize:
                q.quantize_from(child.weight)
            if child.bias is not None:
                q.bias = nn.Parameter(child.bias.detach().to(dt).clone())
            setattr(mod, cname, q)
            out[full] = q
    return out
