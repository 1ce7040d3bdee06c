# SPDX-License-Identifier: Apache-2.0
"""Batched matmul of two activations: Bitorch Engine's BinaryMatMul and Q4MatMul (and Q8MatMul,
the same with 8-bit codes), with the math in libbie (bie_matmul_forward / _backward).

    out[..., m, n] = x_clip * y_clip * sum_k a[..., m, k] * b[..., n, k]
    = torch.matmul(a, b.transpose(-1, -2)) * x_clip * y_clip

for x [..., M, K] and y [..., N, K] (the same leading dims), where a and b are the codes of x and y
under their clips: binary sign(v) (sign(0) = +1); 4/8-bit clamp(rne(v / clip), lo, hi). The
backward is the layers' straight-through estimator applied to each operand (docs/semantics.md):

    grad_x = (g @ (b * y_clip)) * 1{x inside the clip range}     (binary: |x / x_clip| <= 1)
    grad_y = (g^T @ (a * x_clip)) * 1{y inside the clip range}
    grad_x_clip = sum(grad_x * a) / sqrt(numel(x))               (binary; n-bit: LSQ, as the layers)

The modules hold x_clip and y_clip as Parameters, 0 until the first forward sets them from its
inputs: binary 2*mean|x|, 2*mean|y|; n-bit 2*mean|x|/11.269, 2*mean|y|/11.269.
"""
import ctypes

import torch
import torch.nn as nn

from . import _lib
from .functional import QUANT_BINARY, QUANT_INT4, QUANT_INT8, _Call, _check_float, _ptr, _scalar, _view
from . import functional as F

__all__ = ["matmul_forward", "matmul_backward", "BinaryMatMulFunction", "Q4MatMulFunction", "Q8MatMulFunction",
           "BinaryMatMul", "Q4MatMul", "Q8MatMul"]


def _mergeable(t, lead):
    """Whether the first `lead` dims of t merge into one without a copy (libbie's rule)."""
    stride, extent = None, 1
    for i in range(lead - 1, -1, -1):
        if t.shape[i] == 1:
            continue
        if stride is None:
            stride = t.stride(i)
        elif t.stride(i) != stride * extent:
            return False
        extent *= t.shape[i]
    return True


def _operand(t, name):
    _check_float(t, name)
    if t.dim() < 2:
        raise ValueError(f"bie: {name} must have at least 2 dimensions [..., rows, K], has {t.dim()}")
    t = t.detach()
    return t if _mergeable(t, t.dim() - 2) else t.contiguous()


def _check_pair(x, y):
    if x.shape[:-2] != y.shape[:-2]:
        raise ValueError(f"bie: x {tuple(x.shape)} and y {tuple(y.shape)} must have the same leading dimensions "
                         "(x [..., M, K], y [..., N, K]; no broadcasting)")
    if x.shape[-1] != y.shape[-1]:
        raise ValueError(f"bie: x {tuple(x.shape)} and y {tuple(y.shape)} must have the same last dimension K "
                         "(out = x @ y^T; pass y.transpose(-1, -2) for a y of [..., K, N])")
    if x.device != y.device:
        raise ValueError(f"bie: x is on {x.device}, y on {y.device}")


def matmul_forward(quant, x, y, x_clip, y_clip, out_dtype=None):
    """out [..., M, N] = x_clip*y_clip * (codes of x) @ (codes of y)^T (libbie). out_dtype: a float
    dtype (default x.dtype) or torch.int32 (the raw integer sums)."""
    x, y = _operand(x, "x"), _operand(y, "y")
    _check_pair(x, y)
    _scalar(x_clip, "x_clip")
    _scalar(y_clip, "y_clip")
    out = torch.empty((*x.shape[:-2], x.shape[-2], y.shape[-2]), dtype=out_dtype or x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    if x.shape[-1] == 0:
        return out.zero_()
    keep = [_view(x), _view(y), _view(x_clip.detach()), _view(y_clip.detach()), _view(out)]
    args = _lib.MatmulArgs(*[_ptr(v) for v in keep])
    desc = _lib.MatmulDesc(int(quant))
    _Call(x)("bie_matmul_forward", ctypes.byref(desc), ctypes.byref(args))
    del keep
    return out


def matmul_backward(quant, x, y, x_clip, y_clip, grad_out, needs=(True, True, True, True)):
    """Straight-through backward of matmul_forward: (grad_x, grad_y, grad_x_clip, grad_y_clip), each
    None where `needs` says so."""
    x, y = _operand(x, "x"), _operand(y, "y")
    _check_pair(x, y)
    _scalar(x_clip, "x_clip")
    _scalar(y_clip, "y_clip")
    _check_float(grad_out, "grad_out")
    gx = torch.empty_like(x, memory_format=torch.contiguous_format) if needs[0] else None
    gy = torch.empty_like(y, memory_format=torch.contiguous_format) if needs[1] else None
    gxc = torch.empty_like(x_clip) if needs[2] else None
    gyc = torch.empty_like(y_clip) if needs[3] else None
    if x.numel() == 0 or y.numel() == 0:
        for t in (gx, gy, gxc, gyc):
            if t is not None:
                t.zero_()
        return gx, gy, gxc, gyc
    g = grad_out.detach()
    if not _mergeable(g, g.dim() - 2):
        g = g.contiguous()
    keep = [_view(x), _view(y), _view(x_clip.detach()), _view(y_clip.detach()), _view(g)] + \
        [_view(t) if t is not None else None for t in (gx, gy, gxc, gyc)]
    args = _lib.MatmulBackwardArgs(*[_ptr(v) for v in keep])
    desc = _lib.MatmulDesc(int(quant))
    _Call(x)("bie_matmul_backward", ctypes.byref(desc), ctypes.byref(args))
    del keep
    return gx, gy, gxc, gyc


def _function(quant):
    class _MatMul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y, x_clip, y_clip, eps=None, is_train=True):
            ctx.is_train = bool(is_train)
            if is_train:
                ctx.save_for_backward(x, y, x_clip, y_clip)
            return matmul_forward(quant, x, y, x_clip, y_clip)

        @staticmethod
        def backward(ctx, grad_out):
            if not ctx.is_train:
                raise RuntimeError("bie: backward through a matmul made with is_train=False")
            x, y, x_clip, y_clip = ctx.saved_tensors
            gx, gy, gxc, gyc = matmul_backward(quant, x, y, x_clip, y_clip, grad_out, ctx.needs_input_grad[:4])
            return gx, gy, gxc, gyc, None, None

    return _MatMul


class BinaryMatMulFunction(_function(QUANT_BINARY)):
    """BinaryMatMulFunction.apply(x, y, x_clip, y_clip): out = x_clip*y_clip * sign(x) @ sign(y)^T."""


class Q4MatMulFunction(_function(QUANT_INT4)):
    """Q4MatMulFunction.apply(x, y, x_clip, y_clip, eps, is_train): 4-bit codes (eps is accepted and
    unused: the clips must be > 0)."""


class Q8MatMulFunction(_function(QUANT_INT8)):
    """Q8MatMulFunction.apply(x, y, x_clip, y_clip, eps, is_train): 8-bit codes."""


class _MatMulModule(nn.Module):
    quant = None
    function = None

    def __init__(self, dtype=torch.float, device=None, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"bie: dtype must be a floating-point torch.dtype, not {dtype!r}")
        self.dtype = dtype
        self.device = device
        self.x_clip = nn.Parameter(torch.tensor(0.0, dtype=dtype, device=device))
        self.y_clip = nn.Parameter(torch.tensor(0.0, dtype=dtype, device=device))
        self.register_buffer("eps", torch.tensor(1e-5, dtype=dtype, device=device))

    def set_activation_scale(self, x, y):
        """Sets x_clip and y_clip from the first inputs if they are still 0 (one synchronisation)."""
        for clip, t in ((self.x_clip, x), (self.y_clip, y)):
            if float(clip.detach()) == 0.0:
                if t.numel() == 0:
                    raise ValueError("bie: the first batch of a matmul module is empty: its clips are set from the "
                                     "first inputs' mean |value|; give a non-empty batch first (or set x_clip and "
                                     "y_clip yourself)")
                with torch.no_grad():
                    clip.copy_(F.activation_scale_init(self.quant, t))

    def forward(self, x, y):
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            raise TypeError("bie: a matmul module takes two tensors x [..., M, K] and y [..., N, K]")
        if x.dim() < 2 or y.dim() < 2:
            raise ValueError(f"bie: expected tensors of at least 2 dimensions, got x {x.dim()}-D and y {y.dim()}-D")
        _check_pair(x, y)
        self.set_activation_scale(x, y)
        return self.function.apply(x, y, self.x_clip, self.y_clip, self.eps, self.training)

    def extra_repr(self):
        return f"dtype={self.dtype}"


class BinaryMatMul(_MatMulModule):
    """Bitorch Engine's BinaryMatMul(dtype=torch.float): out = x_clip*y_clip * sign(x) @ sign(y)^T
    on the AND-popcount GEMM (tensor cores on CUDA)."""

    quant = QUANT_BINARY
    function = BinaryMatMulFunction


class Q4MatMul(_MatMulModule):
    """Bitorch Engine's Q4MatMul(dtype=torch.float, device=None): 4-bit codes of both operands."""

    quant = QUANT_INT4
    function = Q4MatMulFunction


class Q8MatMul(_MatMulModule):
    """Q8MatMul(dtype=torch.float, device=None): 8-bit codes of both operands (Q4MatMul's protocol)."""

    quant = QUANT_INT8
    function = Q8MatMulFunction
