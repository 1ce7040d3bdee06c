# SPDX-License-Identifier: Apache-2.0
"""torch.autograd.Function wrappers of libbie's layers, with Bitorch Engine's signatures:

  BinaryLinearForward.apply(input, weight, scale_a, scale_w, gemm_kernel_id, is_train[, bias_a])
  Q4LinearForward.apply(input, weight, scale_a, scale_w, is_train[, bias_a])
  Q8LinearForward.apply(input, weight, scale_a, scale_w, is_train[, bias_a])
  BinaryConv2dForward.apply(x, weight, scale_a, scale_w, is_train, kernel_size, stride, padding,
                            dilation[, bias_a[, pad_value]])
  Q4Conv2dForward.apply(x, weight, scale_a, scale_w, is_train, kernel_size, stride, padding,
                        dilation[, bias_a])                  (alias: Q4Conv2dCutlassForward)
  Q8Conv2dForward.apply(... as Q4Conv2dForward ...)

The optional trailing bias_a (the learnable input shift, [in_features] or [C]) is added inside
the libbie call instead of by a separate PyTorch op; its gradient is libbie's grad_bias_a.
gemm_kernel_id is accepted for compatibility and ignored (libbie picks its kernels itself).

Backward passes call bie_*_backward and give gradients to the input, the float weight, scale_a and
bias_a (scale_w is not trained). A binary linear layer in training keeps 2 bits per element of its
input for the backward instead of the input (binarize_ste: the sign bits, which its forward also
takes, and the STE's mask), from SAVED_BITS_MIN elements of input on; every result is the one the
float input gives. A binary conv on CUDA does the same whenever its channels-last input allows it
(_conv_saves_bits), whatever its size. An int8 latent binary weight cannot carry a gradient in stock
PyTorch: when it has a `privileged_grad` attribute (a float32 tensor of its shape, set by the
modules), the weight gradient is accumulated there instead (see bie.optim.DiodeMix).
"""
import math

import torch

from . import _plans
from . import functional as F
from .functional import QUANT_BINARY, QUANT_INT4, QUANT_INT8, PAD_ZERO

__all__ = ["BinaryLinearForward", "Q4LinearForward", "Q8LinearForward", "BinaryConv2dForward",
           "Q4Conv2dForward", "Q4Conv2dCutlassForward", "Q8Conv2dForward", "ClampedBinaryConv2dForward",
           "BlockTrain"]


# Inputs of fewer elements save the float input. The bits cost one more libbie call per forward
# (host time, which small layers and host-bound GPU calls feel), while they take GPU time off the
# step's kernels on large inputs. Set it to 0 to keep bits whatever the size (memory).
SAVED_BITS_MIN = 1 << 25


def _save(ctx, is_train, quant, x, weight, scale_a, scale_w, bias_a, conv, mask=None, gate=None):
    ctx.is_train = bool(is_train)
    ctx.quant = quant
    ctx.conv = conv
    ctx.has_bias = bias_a is not None
    ctx.saved_bits = None
    if is_train:
        ctx.save_for_backward(x, weight, scale_a, scale_w, bias_a, *(t for t in (mask, gate) if t is not None))
        # the int8 latent weight's float gradient buffer, if any
        ctx.grad_sink = getattr(weight, "privileged_grad", None) if weight.dtype == torch.int8 else None


def _backward(ctx, grad_y, bias_index):
    if not ctx.is_train:
        raise RuntimeError("bie: backward through a layer call made with is_train=False")
    x, weight, scale_a, scale_w, bias_a, *mask = ctx.saved_tensors  # mask: x_mask, then grad_x_mask (a clamp's)
    need_x, need_w, need_s = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
    need_b = ctx.has_bias and ctx.needs_input_grad[bias_index]
    sink = ctx.grad_sink
    want_w = need_w or sink is not None
    if not (need_x or want_w or need_s or need_b):
        return None
    needs = (need_x, want_w, need_s, need_b)
    if ctx.saved_bits is not None and ctx.conv is not None:  # a conv's bits and mask (NHWC)
        c, x_dtype = ctx.saved_bits
        ks, st, pd, dl, pv = ctx.conv
        gx, gw, gs, gb = F.conv2d_backward(ctx.quant, x, weight, scale_a, scale_w, grad_y, bias_a, ks, st, pd, dl, pv,
                                           needs, x_mask=mask[0], in_channels=c, grad_x_dtype=x_dtype,
                                           grad_x_mask=mask[1] if len(mask) > 1 else None, _replay=True)
    elif ctx.saved_bits is not None:  # x: binarize_ste's bits, beside its mask
        k, x_dtype = ctx.saved_bits
        gx, gw, gs, gb = F.linear_backward(ctx.quant, x, weight, scale_a, scale_w, grad_y, bias_a, needs,
                                           x_mask=mask[0], in_features=k, grad_x_dtype=x_dtype, _replay=True)
    elif ctx.conv is None:
        gx, gw, gs, gb = F.linear_backward(ctx.quant, x, weight, scale_a, scale_w, grad_y, bias_a, needs,
                                           _replay=True)
    else:
        ks, st, pd, dl, pv = ctx.conv
        gx, gw, gs, gb = F.conv2d_backward(ctx.quant, x, weight, scale_a, scale_w, grad_y, bias_a, ks, st, pd, dl,
                                           pv, needs, _replay=True)
    if sink is not None:
        sink.add_(gw.to(sink.dtype))
        gw = None
    if gw is not None and not need_w:
        gw = None
    return gx, gw, (gs.reshape(scale_a.shape) if gs is not None and gs.shape != scale_a.shape else gs), gb


def _grads(ctx, grad_y, n_args, bias_index):
    """A Function's backward result for its n_args forward arguments: the gradients of input,
    weight and scale_a (arguments 0-2) and of bias_a (argument bias_index), None for the others."""
    out = [None] * n_args
    g = _backward(ctx, grad_y, bias_index)
    if g is not None:
        out[0], out[1], out[2], out[bias_index] = g
    return tuple(out)


class BinaryLinearForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, scale_a, scale_w, gemm_kernel_id=None, is_train=True, bias_a=None):
        if not is_train or input.numel() < SAVED_BITS_MIN:
            _save(ctx, is_train, QUANT_BINARY, input, weight, scale_a, scale_w, bias_a, None)
            return F.linear_forward(QUANT_BINARY, input, weight, scale_a, scale_w, bias_a, _replay=True)
        bits, mask = F.binarize_ste(input, scale_a, bias_a, _replay=True)
        k = input.shape[-1]
        _save(ctx, is_train, QUANT_BINARY, bits, weight, scale_a, scale_w, bias_a, None, mask)
        ctx.saved_bits = (k, input.dtype)
        return F.linear_forward(QUANT_BINARY, bits, weight, scale_a, scale_w, out_dtype=input.dtype, in_features=k,
                                _replay=True)

    @staticmethod
    def backward(ctx, grad_y):
        return _grads(ctx, grad_y, 7, 6)


def _nbit_linear(quant):
    class _NBitLinear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, input, weight, scale_a, scale_w, is_train=True, bias_a=None):
            _save(ctx, is_train, quant, input, weight, scale_a, scale_w, bias_a, None)
            return F.linear_forward(quant, input, weight, scale_a, scale_w, bias_a, _replay=True)

        @staticmethod
        def backward(ctx, grad_y):
            return _grads(ctx, grad_y, 6, 5)

    return _NBitLinear


class Q4LinearForward(_nbit_linear(QUANT_INT4)):
    """4-bit linear: a = clamp(rne(x'/scale_a), -8, 7), w = clamp(rne(W/scale_w), -8, 7)."""


class Q8LinearForward(_nbit_linear(QUANT_INT8)):
    """8-bit linear: a = clamp(rne(x'/scale_a), -128, 127), w = clamp(rne(W/scale_w), -128, 127)."""


_RANK = {torch.bfloat16: 1, torch.float16: 2}


def _conv_saves_bits(x, quant, padding, pad_value, weight, scale_a, bias_a):
    """Whether a binary conv in training keeps binarize_ste's bits and mask of its input instead of
    the input (1/8 of f16 in memory): on CUDA, for an f16 or bf16 channels-last x whose channels fill
    32-bit words (the forward then reads the bits in place), with zero padding, a weight of x's dtype
    and scale_a, bias_a no more precise than x (the backward's cuDNN route, the one that reads bits,
    computes in grad_y's dtype)."""
    pads = padding if isinstance(padding, (tuple, list)) else (padding, padding)
    r = _RANK.get(x.dtype, 0)
    return (quant == QUANT_BINARY and x.is_cuda and x.dim() == 4 and x.shape[1] % 32 == 0 and x.numel() > 0
            and (pad_value == PAD_ZERO or not any(pads)) and weight.dtype == x.dtype
            and _RANK.get(scale_a.dtype, 4) <= r and (bias_a is None or _RANK.get(bias_a.dtype, 4) <= r)
            and x.is_contiguous(memory_format=torch.channels_last))


def _conv_from_bits(ctx, x, bits, mask, gate, weight, scale_a, scale_w, bias_a, conv):
    """A training binary conv's forward from conv2d_binarize_ste's bits of x (bias_a in them), keeping
    bits, mask and the clamp's bits (gate, or None) for the backward instead of x."""
    _save(ctx, True, QUANT_BINARY, bits, weight, scale_a, scale_w, bias_a, conv, mask, gate)
    ctx.saved_bits = (x.shape[1], x.dtype)
    return F.conv2d_forward(QUANT_BINARY, bits, weight, scale_a, scale_w, None, *conv, out_dtype=x.dtype,
                            in_channels=x.shape[1], _replay=True)


def _conv(quant, default_pad):
    class _Conv(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, scale_a, scale_w, is_train, kernel_size, stride, padding, dilation, bias_a=None,
                    pad_value=default_pad):
            if quant != QUANT_BINARY and pad_value != PAD_ZERO:
                raise ValueError("bie: n-bit convolutions pad with zero")
            conv = (kernel_size, stride, padding, dilation, pad_value)
            if not (is_train and _conv_saves_bits(x, quant, padding, pad_value, weight, scale_a, bias_a)):
                _save(ctx, is_train, quant, x, weight, scale_a, scale_w, bias_a, conv)
                return F.conv2d_forward(quant, x, weight, scale_a, scale_w, bias_a, *conv, _replay=True)
            bits, mask = F.conv2d_binarize_ste(x, scale_a, bias_a, _replay=True)
            return _conv_from_bits(ctx, x, bits, mask, None, weight, scale_a, scale_w, bias_a, conv)

        @staticmethod
        def backward(ctx, grad_y):
            return _grads(ctx, grad_y, 11, 9)

    return _Conv


class BinaryConv2dForward(_conv(QUANT_BINARY, PAD_ZERO)):
    """Binary conv2d. Spatial padding taps count 0 by default (the float convolution of the +-1
    tensors with zero padding, as libbie and the bie model format do); pass
    pad_value=bie.PAD_MINUS_ONE for Bitorch Engine's CPU convention (padded taps are -1)."""


class Q4Conv2dForward(_conv(QUANT_INT4, PAD_ZERO)):
    """4-bit conv2d (zero padding)."""


Q4Conv2dCutlassForward = Q4Conv2dForward


class Q8Conv2dForward(_conv(QUANT_INT8, PAD_ZERO)):
    """8-bit conv2d (zero padding)."""


_EXACT = {}  # (t, dtype): whether t is a value of dtype (asked once per pair, not on every call)


def _exact_in(t, dtype):
    v = _EXACT.get((t, dtype))
    if v is None:
        v = _EXACT[(t, dtype)] = float(torch.tensor(t, dtype=dtype)) == t
    return v


def clamp_saves_bits(x, lo, hi, weight, scale_a, bias_a, padding, pad_value):
    """Whether ClampedBinaryConv2dForward takes x: a binary conv's bits-saving case (_conv_saves_bits)
    behind a symmetric clamp [-t, t] whose t is a positive value of x's dtype (so that libbie's f32
    clamp is PyTorch's clamp in x's dtype)."""
    return (0.0 < hi == -lo and _exact_in(hi, x.dtype)
            and _conv_saves_bits(x, QUANT_BINARY, padding, pad_value, weight, scale_a, bias_a))


class ClampedBinaryConv2dForward(torch.autograd.Function):
    """A binary conv in training after a symmetric clamp h = clamp(x, -t, t) (a Hardtanh), as one
    autograd node that keeps 3 bits per element of x for the backward, all from one pass over x
    (conv2d_binarize_ste with clamp=t: libbie's bie_binarize_ste_clamped): the sign bits of
    h + bias_a, the STE's pass bits of h, and the clamp's own pass bits 1{|x| < t}. The backward is
    the conv's from those bits with the clamp's bits as grad_x_mask: grad_x is the gradient of x,
    and grad_scale_a, grad_bias_a and grad_weight those of the conv on h, the numbers that Hardtanh
    followed by BinaryConv2dForward give (but for a NaN x, whose gradient the clamp's bits stop).
    Takes what clamp_saves_bits accepts.

        apply(x, weight, scale_a, scale_w, t, kernel_size, stride, padding, dilation[, bias_a])"""

    @staticmethod
    def forward(ctx, x, weight, scale_a, scale_w, t, kernel_size, stride, padding, dilation, bias_a=None):
        bits, mask, gate = F.conv2d_binarize_ste(x, scale_a, bias_a, clamp=t, _replay=True)
        return _conv_from_bits(ctx, x, bits, mask, gate, weight, scale_a, scale_w, bias_a,
                               (kernel_size, stride, padding, dilation, PAD_ZERO))

    @staticmethod
    def backward(ctx, grad_y):
        return _grads(ctx, grad_y, 10, 9)


def _grad_like(grad, x):
    """grad in x's channels-last memory when x has it and grad does not (one pass at memory speed,
    which sends libbie's batch norm and pool backward down their dense routes)."""
    cl = torch.channels_last
    if x.dim() == 4 and x.is_contiguous(memory_format=cl) and not grad.is_contiguous(memory_format=cl):
        return grad.contiguous(memory_format=cl)
    return grad


class BatchNormTrain(torch.autograd.Function):
    """A training-mode BatchNorm2d and the residual add after it, bn(x) + residual, as one libbie
    pass after the statistics (F.batch_norm_train) and one backward (F.batch_norm_backward); the
    residual's gradient is grad_y itself. Updates the running statistics and the batch count
    (num_batches_tracked, or None) like the module.

        apply(x, weight, bias, residual (or None), running_mean, running_var, momentum, eps, num_batches)"""

    @staticmethod
    def forward(ctx, x, weight, bias, residual, running_mean, running_var, momentum, eps, num_batches):
        y, stats = F._batch_norm_train(x, weight, bias, running_mean, running_var, momentum, eps, residual, True,
                                       num_batches)
        ctx.save_for_backward(x, weight, stats)
        ctx.has_residual = residual is not None
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, weight, stats = ctx.saved_tensors
        mean, invstd = stats.unbind(0)
        grad_y = _grad_like(grad_y, x)
        gx, gw, gb = F.batch_norm_backward(x, weight, mean, invstd, grad_y, ctx.needs_input_grad[0])
        return gx, gw, gb, grad_y if ctx.has_residual else None, None, None, None, None, None


class StemTrain(torch.autograd.Function):
    """A training-mode BatchNorm2d, a clamp (ReLU or Hardtanh) and a MaxPool2d after a float conv
    (a network's stem) as one node: the statistics (F.batch_norm_train without its pass), then one
    pass that pools, applies the batch's affine map and the clamp and keeps a byte per output of
    where its value came from (F.affine_maxpool2d with argmax); the backward gathers grad_y to the
    pooled positions (F.affine_maxpool2d_backward) and runs the batch norm's backward. Keeps the
    conv's output and the argmax bytes, not the BatchNorm's, clamp's and pool's outputs and indices.

        apply(x, weight, bias, running_mean, running_var, momentum, eps, kernel_size, stride,
              padding, lo, hi, num_batches)"""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, momentum, eps, kernel_size, stride, padding, lo,
                hi, num_batches):
        _, stats = F._batch_norm_train(x, weight, bias, running_mean, running_var, momentum, eps, None, False,
                                       num_batches)
        mean, invstd = stats.unbind(0)
        mul = torch.mul(weight, invstd)  # (f32: weight.float() * invstd, f32(bias) - mean * mul)
        add = torch.sub(bias, mean * mul)
        n, c, h, w = x.shape
        oh, ow = F.conv2d_output_size(h, w, kernel_size, stride, padding)
        argmax = torch.empty((n, c, oh, ow), dtype=torch.uint8, device=x.device,
                             memory_format=F._like_memory_format(x))
        y = F.affine_maxpool2d(x, kernel_size, stride, padding, mul, add, lo, hi, argmax=argmax)
        ctx.save_for_backward(x, weight, stats, argmax)
        ctx.geometry = (kernel_size, stride, padding)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, weight, stats, argmax = ctx.saved_tensors
        mean, invstd = stats.unbind(0)
        k, s, p = ctx.geometry
        gz = F.affine_maxpool2d_backward(argmax, _grad_like(grad_y, x), x.shape[2:], k, s, p, dtype=x.dtype)
        gx, gw, gb = F.batch_norm_backward(x, weight, mean, invstd, gz, ctx.needs_input_grad[0])
        return gx, gw, gb, None, None, None, None, None, None, None, None, None, None


def _empty(spec, device):
    """A new tensor of spec = (shape, strides, dtype) on device."""
    return torch.empty_strided(spec[0], spec[1], dtype=spec[2], device=device)


def _grad_as(grad, spec):
    """grad with the strides of spec = (shape, strides, dtype), a copy where its own differ (a kept
    call reads its tensors in the strides it was made for)."""
    if grad.stride() == spec[1]:
        return grad
    return torch.empty_strided(spec[0], spec[1], dtype=grad.dtype, device=grad.device).copy_(grad)


def _spec(t):
    return None if t is None else (tuple(t.shape), t.stride(), t.dtype)


def _ptr(t):
    """t's data pointer (0: None, or a number rather than a tensor)."""
    return t.data_ptr() if isinstance(t, torch.Tensor) else 0


def _aligned(n):
    return -(-n // 256) * 256


class _Saved:
    """Where a fused block's forward keeps what its backward reads, in one uint8 tensor: a binary
    conv's three bit planes of x ([3, ...]: x's bits, the STE mask, the clamp's gate), the conv's
    output z, and the batch statistics (float32 [2, C]: mean, invstd), each at a multiple of 256
    bytes. Its calls take addresses into it; views of it are made only where a call is first made."""

    __slots__ = ("planes", "plane", "z", "channels", "offsets", "size")

    def __init__(self, planes_shape, z, channels):
        self.planes, self.z, self.channels = planes_shape, _spec(z), channels
        self.plane = 0 if planes_shape is None else math.prod(planes_shape) // 3  # (bytes of one plane)
        parts = (3 * self.plane, z.numel() * z.element_size(), 8 * channels)
        self.offsets = (0, _aligned(parts[0]), _aligned(parts[0]) + _aligned(parts[1]))
        self.size = self.offsets[2] + parts[2]

    def new(self, device):
        return torch.empty(self.size, dtype=torch.uint8, device=device)

    def addresses(self, saved):
        """(planes' three row addresses (0 without planes), z's address, mean's, invstd's)."""
        b = saved.data_ptr()
        p, z, st = (b + o for o in self.offsets)
        step = self.plane
        return (p, p + step, p + 2 * step) if step else (0, 0, 0), z, st, st + 4 * self.channels

    def views(self, saved):
        """(planes or None, z, stats): the parts as tensors."""
        o = self.offsets
        planes = None if self.planes is None else saved[: 3 * self.plane].view(self.planes)
        shape, stride, dtype = self.z
        z = saved[o[1]: o[2]].view(dtype).as_strided(shape, stride)
        return planes, z, saved[o[2]:].view(torch.float32).view(2, self.channels)


class BlockRun:
    """The libbie calls of BlockTrain for one metadata of its tensors, kept after its first call:
    later calls allocate their outputs and patch the calls' data pointers, nothing else. It belongs
    to one thread (the calls' argument structs are patched in place): the forward's calls are made
    in the thread of its first call, the backward's in that of its first backward.
    Constants: the conv's quant, scale_w, clamp t (binary: the Hardtanh's; None for a 4-bit or 8-bit
    conv), geometry (kernel_size, stride, padding, dilation) and
    channels, the BatchNorm's running_mean, running_var, num_batches_tracked (or None), momentum and
    eps (its batch norm call adds 1 to num_batches_tracked, so a replay does too), and x_clamp: a 4-bit or
    8-bit conv's symmetric Hardtanh bound when the node takes x before it (the conv's calls clamp x
    and, in the backward, gate grad_x by the clamp's derivative), else None (its input comes
    clamped). An 8-bit conv's forward first writes scale_w from the current weight (the layer's
    2*mean|W|/11.269), as a libbie call that replays with the others."""

    __slots__ = ("quant", "scale_w", "t", "x_clamp", "geometry", "channels", "running", "count", "momentum", "eps",
                 "fwd", "saved", "yspec", "back", "replay", "scale")

    def __init__(self, quant, scale_w, t, geometry, channels, running_mean, running_var, count, momentum, eps,
                 x_clamp=None):
        self.quant, self.scale_w, self.t = quant, scale_w, None if t is None else float(t)
        self.x_clamp = None if x_clamp is None else float(x_clamp)
        self.geometry, self.channels = geometry, channels
        self.running, self.count, self.momentum, self.eps = (running_mean, running_var), count, momentum, eps
        self.fwd = None  # (binarize call or None, conv plan, bn call), after the first forward
        self.saved = self.yspec = None  # (_Saved, the block output's spec), after the first forward
        # (bn call, conv backward plan, specs of grad z, of the conv's and of the bn's gradients, Replay)
        # by a backward's needs
        self.back = {}
        self.replay = _plans.Replay()  # the forward's calls
        self.scale = None  # an 8-bit conv's weight scale call, after the first forward

    def forward(self, x, weight, scale_a, bias_a, bn_weight, bn_bias, residual):
        """(y, kept, saved): the block's output, x where the conv's backward reads it (a 4-bit or
        8-bit conv; None for a binary conv, whose bit planes are in saved), and saved (uint8, laid out
        by self.saved: the planes, the conv's output z and the batch statistics)."""
        sw, (rm, rv), nb = self.scale_w, self.running, self.count
        binary = self.t is not None
        ba = None if binary else bias_a  # (the conv reads the bits of x, bias_a in them, or x)
        if self.fwd is None:
            return self._first_forward(x, weight, scale_a, bias_a, bn_weight, bn_bias, residual)
        ctx = _plans.bound_context(x)
        if ctx is None:  # (a device other than the current one)
            with torch.cuda.device(x.device):
                return self.forward(x, weight, scale_a, bias_a, bn_weight, bn_bias, residual)
        ste, conv, bn = self.fwd
        scale = self.scale
        dev = x.device
        saved = self.saved.new(dev)
        (xk, mk, gk), z, mean, invstd = self.saved.addresses(saved)
        kept = None if binary else x
        if not binary:
            xk = x.data_ptr()
        y = _empty(self.yspec, dev)

        def calls():
            if scale is not None:
                scale.run_bound(ctx, (weight, sw))
            if binary:
                ste.run_bound(ctx, (x, bias_a, scale_a, xk, mk, gk))
            conv.run_bound(ctx, (xk, ba, weight, scale_a, sw, z, None, None, None, None, None))
            bn.run_bound(ctx, (z, bn_weight, bn_bias, rm, rv, mean, invstd, y, residual, nb))
        self.replay.run(ctx, (x.data_ptr(), _ptr(bias_a), _ptr(scale_a), weight.data_ptr(), _ptr(sw), z, y.data_ptr(),
                              _ptr(bn_weight), _ptr(bn_bias), _ptr(rm), _ptr(rv), _ptr(nb), _ptr(residual)), calls)
        return y, kept, saved

    def _first_forward(self, x, weight, scale_a, bias_a, bn_weight, bn_bias, residual):
        """forward()'s first call: makes the calls on tensors of their own, then copies what the
        backward reads into the saved tensor that later calls write directly."""
        sw, (rm, rv), nb = self.scale_w, self.running, self.count
        binary = self.t is not None
        ste = None
        if self.quant == QUANT_INT8:
            self.scale = F._weight_scale_call(QUANT_INT8, weight.detach(), sw)
            self.scale.run(weight, (weight, sw))
        if binary:
            planes, ste, _ = F._binarize_ste_call(x, scale_a, bias_a, True, self.t)
            ste.run(x, (x, bias_a, scale_a, *planes))
            xk = planes[0]
        else:
            xk = x
        z, conv = F._conv2d_forward_planned(self.quant, xk, weight, scale_a, sw, None if binary else bias_a,
                                            *self.geometry, PAD_ZERO, x.dtype if binary else None,
                                            self.channels if binary else None, None, None, None, None, None,
                                            self.x_clamp)
        stats = torch.empty((2, z.shape[1]), dtype=torch.float32, device=x.device)
        mean, invstd = stats.unbind(0)
        y = torch.empty_like(z, memory_format=F._like_memory_format(z))
        ts = (z, bn_weight, bn_bias, rm, rv, mean, invstd, y, residual, nb)
        bn = F._batch_norm_call(ts, self.momentum, self.eps)
        bn.run(z, ts)
        if not (z.is_contiguous() or z.is_contiguous(memory_format=torch.channels_last)):
            raise RuntimeError("bie: a fused block's conv output is not dense")  # (the plans allocate it dense)
        self.fwd = (ste, conv, bn)
        self.saved = _Saved(planes[0]._base.shape if binary else None, z, z.shape[1])
        self.yspec = _spec(y)
        saved = self.saved.new(x.device)
        p, zs, st = self.saved.views(saved)
        if binary:
            p.copy_(planes[0]._base)  # (the planes are the rows of one [3, ...] tensor)
        zs.copy_(z)
        st.copy_(stats)
        return y, None if binary else x, saved

    def backward(self, needs, grad_y, kept, saved, weight, scale_a, bias_a, bn_weight, x_dtype, identity=False):
        """(grad_x, grad_weight, grad_scale_a, grad_bias_a (each None where needs, the conv's (x, weight,
        scale_a, bias_a), says so), grad_bn_weight, grad_bn_bias); kept and saved as forward() gave
        them. identity: the block's shortcut is x itself, so grad_x takes grad_y too (the conv
        backward's grad_x_add)."""
        k = self.back.get((needs, identity))
        sw, dev = self.scale_w, saved.device
        binary = self.t is not None
        grad_y = _grad_as(grad_y, self.yspec)
        if k is None:
            planes, z, stats = self.saved.views(saved)
            x, mask, gate = planes.unbind(0) if binary else (kept, None, None)
            mean, invstd = stats.unbind(0)
            gz, gbw, gbb = F.batch_norm_backward(z, bn_weight, mean, invstd, grad_y)
            bn = F._batch_norm_backward_call((z, bn_weight, mean, invstd, grad_y, gz, gbw, gbb))
            conv, grads = None, (None, None, None, None)
            if any(needs):
                grads, conv = F._conv2d_backward_planned(self.quant, x, weight, scale_a, sw, gz, bias_a,
                                                         *self.geometry, PAD_ZERO, needs, None, mask,
                                                         self.channels if binary else None,
                                                         x_dtype if binary else None, gate, self.x_clamp,
                                                         grad_y if identity and needs[0] else None)
            self.back[(needs, identity)] = (bn, conv, _spec(gz), tuple(_spec(g) for g in grads), _spec(gbw),
                                            _plans.Replay())
            return (*grads, gbw, gbb)
        ctx = _plans.bound_context(saved)
        if ctx is None:  # (a device other than the current one)
            with torch.cuda.device(dev):
                return self.backward(needs, grad_y, kept, saved, weight, scale_a, bias_a, bn_weight, x_dtype,
                                     identity)
        bn, conv, gzspec, gspecs, cspec, replay = k
        (x, mask, gate), z, mean, invstd = self.saved.addresses(saved)
        if not binary:
            x = kept.data_ptr()
        gz = _empty(gzspec, dev)
        gbw, gbb = _empty(cspec, dev), _empty(cspec, dev)
        grads = tuple(None if s is None else _empty(s, dev) for s in gspecs)
        gadd = grad_y if identity and needs[0] else None

        def calls():
            bn.run_bound(ctx, (z, bn_weight, mean, invstd, grad_y, gz, gbw, gbb))
            if conv is not None:
                conv.run_bound(ctx, (x, None if binary else bias_a, weight, scale_a, sw, gz, *grads, mask, gate, gadd))
        replay.run(ctx, (z, _ptr(bn_weight), grad_y.data_ptr(), gz.data_ptr(), gbw.data_ptr(), gbb.data_ptr(), x,
                         _ptr(bias_a), weight.data_ptr(), _ptr(scale_a), _ptr(sw), *(_ptr(g) for g in grads)), calls)
        return (*grads, gbw, gbb)


class BlockTrain(torch.autograd.Function):
    """bn(conv(x)) + residual in training, a bie conv and the training-mode BatchNorm2d after it, as
    one autograd node with the numbers of the conv's node followed by BatchNormTrain: the conv, the
    statistics, the pass that normalises and adds the residual; the backward is the batch norm's,
    then the conv's. A binary conv in its bits-saving case takes x before a symmetric clamp
    (clamp_saves_bits; the clamp's t is run.t): its node is ClampedBinaryConv2dForward, one pass over
    x makes the three bit planes that are kept instead of x. A 4-bit or 8-bit conv takes x before
    its symmetric Hardtanh where run.x_clamp is set (the conv's calls clamp it), else its input as it
    comes (its Hardtanh runs before), and keeps that. Both keep the conv's output and the statistics.
    identity=True (binary, or n-bit with run.x_clamp): the residual is x itself (a block's identity
    shortcut), and x's gradient takes the shortcut's in the conv backward's own pass (grad_x_add).

        apply(x, weight, scale_a, bias_a, bn_weight, bn_bias, residual (None with identity), run, identity,
              scale_a_factor=None)

    run: the BlockRun of these tensors' metadata (fuse.FusedConv2d keeps them). scale_a_factor: a
    number that grad_scale_a is multiplied by, as the layer's _GradScale would (set_data_parallel),
    or None."""

    @staticmethod
    def forward(ctx, x, weight, scale_a, bias_a, bn_weight, bn_bias, residual, run, identity, scale_a_factor=None):
        y, kept, saved = run.forward(x, weight, scale_a, bias_a, bn_weight, bn_bias, x if identity else residual)
        ctx.save_for_backward(kept, saved, weight, scale_a, bias_a, bn_weight)
        ctx.run, ctx.identity, ctx.x_dtype, ctx.scale_a_factor = run, identity, x.dtype, scale_a_factor
        return y

    @staticmethod
    def backward(ctx, grad_y):
        kept, saved, weight, scale_a, bias_a, bn_weight = ctx.saved_tensors
        need = ctx.needs_input_grad
        gx, gw, gs, gb, gbw, gbb = ctx.run.backward(need[:4], grad_y, kept, saved, weight, scale_a, bias_a, bn_weight,
                                                    ctx.x_dtype, ctx.identity)
        if gs is not None and gs.shape != scale_a.shape:
            gs = gs.reshape(scale_a.shape)
        if gs is not None and ctx.scale_a_factor is not None:
            gs = gs * ctx.scale_a_factor
        return gx, gw, gs, gb, gbw, gbb, grad_y if need[6] else None, None, None, None
