# SPDX-License-Identifier: Apache-2.0
"""Low-level calls into libbie on torch tensors: the layer forward and backward passes, packing,
and the layer-protocol helpers (scale initialisation, int8 latent weights).

Every function takes tensors of any strides (f32/f16/bf16 activations, on the CPU or on a CUDA
device) and allocates its outputs. CUDA calls run on the current CUDA stream without a host
synchronisation. Weights may be float (quantized on the fly), int8 (binary: latent weight; n-bit:
integer codes) or packed:

- binary B1: ``torch.uint8``, rows of ceil(K/8) bytes, least-significant bit first; linear
  ``[out, ceil(in/8)]``, conv ``[O, kh, kw, ceil(C/8)]`` (OHWI, channels fastest);
- 4-bit S4: ``torch.int8``, rows of ceil(K/2) bytes, element 2i in the high nibble; linear
  ``[out, ceil(in/2)]``, conv ``[O, kh, kw, ceil(C/2)]``.

The math is libbie's (docs/semantics.md); nothing numerical is done here.
"""
import ctypes
import math

import torch

from . import _lib, _plans
from ._lib import BieError, QUANT_BINARY, QUANT_INT4, QUANT_INT8, PAD_ZERO, PAD_MINUS_ONE, PAD_PLUS_ONE

__all__ = [
    "BieError", "QUANT_BINARY", "QUANT_INT4", "QUANT_INT8", "PAD_ZERO", "PAD_MINUS_ONE", "PAD_PLUS_ONE",
    "linear_forward", "linear_backward", "binarize_ste", "conv2d_binarize_ste", "conv2d_forward", "conv2d_backward",
    "conv2d_output_size", "pack_weight", "unpack_weight", "packed_shape", "quantize_int8", "activation_scale_init",
    "weight_scale_init", "weight_to_latent_int8", "affine_maxpool2d", "affine_maxpool2d_backward",
    "batch_norm_train", "batch_norm_backward",
]

_DTYPES = {
    torch.float32: _lib.DT_F32, torch.float16: _lib.DT_F16, torch.bfloat16: _lib.DT_BF16,
    torch.int8: _lib.DT_I8, torch.uint8: _lib.DT_U8, torch.int32: _lib.DT_I32, torch.float64: _lib.DT_F64,
    torch.int64: _lib.DT_I64,
}
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_QUANTS = {QUANT_BINARY: "binary", QUANT_INT4: "4-bit", QUANT_INT8: "8-bit"}


def _check_float(t, name):
    if t.dtype not in _FLOATS:
        raise TypeError(f"bie: {name} must be float32, float16 or bfloat16, not {t.dtype}")


_DEVICES = {}
_I64x8 = ctypes.c_int64 * _lib.BIE_MAX_DIMS


def _device(t):
    d = t.device
    r = _DEVICES.get(d)
    if r is None:
        if d.type == "cpu":
            r = (_lib.DEV_CPU, 0)
        elif d.type == "cuda":
            if d.index is None:  # torch.device("cuda"): resolve each time, it is not cached
                return _lib.DEV_CUDA, torch.cuda.current_device()
            r = (_lib.DEV_CUDA, d.index)
        else:
            raise TypeError(f"bie: tensors on {d.type} are not supported (CPU and CUDA only)")
        _DEVICES[d] = r
    return r


def _view(t, dtype=None, shape=None, stride=None):
    """struct bie_tensor for a torch tensor (or, with dtype/shape/stride, a packed view of its
    storage). The caller keeps `t` alive while the struct is used."""
    if shape is None:
        shape = t.shape
        stride = t.stride()
    nd = len(shape)
    if nd > _lib.BIE_MAX_DIMS:
        raise ValueError(f"bie: tensors have at most {_lib.BIE_MAX_DIMS} dimensions, got {nd}")
    dev, idx = _device(t)
    return _lib.Tensor(t.data_ptr(), _DTYPES[t.dtype] if dtype is None else dtype, nd, _I64x8(*shape),
                       _I64x8(*stride), dev, idx)


def _ptr(v):
    return ctypes.pointer(v) if v is not None else None


def _scalar(t, name):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"bie: {name} must be a tensor")
    if t.numel() != 1:
        raise ValueError(f"bie: {name} must hold exactly one element, has {t.numel()}")
    _check_float(t, name)


def _no_cuda(ref):
    return BieError("bie", _lib.STATUS_UNSUPPORTED,
                    f"a {ref.device} tensor was given, but this libbie ({_lib.library_path()}) was built without the "
                    "CUDA backend or sees no GPU (rebuild it with a CUDA toolkit, or use CPU tensors)")


class _Call:
    """Runs a libbie function on this thread's context; for CUDA tensors, with the context pointed
    at the current CUDA stream of `ref`'s device (no synchronisation)."""

    def __init__(self, ref):
        self.ref = ref

    def __call__(self, function, *args):
        ctx = _lib.context()
        dev = self.ref.device
        if dev.type != "cuda":
            ctx.call(function, *args)
            return
        if not _lib.cuda_available():
            raise _no_cuda(self.ref)
        if dev.index is not None and dev.index != torch.cuda.current_device():
            with torch.cuda.device(dev):
                _lib.bind_stream(ctx, dev)
                ctx.call(function, *args)
            return
        _lib.bind_stream(ctx, dev)
        ctx.call(function, *args)


def _cuda_checked(ref, make):
    """make() (a plan's creation) with the checks and the device of _Call."""
    if ref.device.type != "cuda":
        return make()
    if not _lib.cuda_available():
        raise _no_cuda(ref)
    with torch.cuda.device(ref.device):
        _lib.bind_stream(_lib.context(), ref.device)
        return make()


# --- weights ------------------------------------------------------------------------------------

def _bits(quant):
    return 1 if quant == QUANT_BINARY else 4


def packed_shape(quant, shape):
    """Storage shape of the packed form of a weight of logical `shape` ([O, K] or [O, C, kh, kw])."""
    per = 8 // _bits(quant)
    if len(shape) == 2:
        return (shape[0], -(-shape[1] // per))
    o, c, kh, kw = shape
    return (o, kh, kw, -(-c // per))


def _packed_view(quant, buf, shape):
    """B1/S4 view with logical `shape` of a packed uint8/int8 buffer (see packed_shape)."""
    per = 8 // _bits(quant)
    if buf.stride(-1) != 1:
        raise ValueError("bie: the last dimension of a packed weight must be contiguous")
    s = [st * per for st in buf.stride()]
    dtype = _lib.DT_B1 if quant == QUANT_BINARY else _lib.DT_S4
    if len(shape) == 2:
        return _view(buf, dtype, shape, (s[0], 1))
    return _view(buf, dtype, shape, (s[0], 1, s[1], s[2]))


def _weight_view(quant, weight, shape):
    """View of a layer weight of logical `shape` in any of its accepted forms."""
    shape = tuple(shape)
    if weight.dtype in _FLOATS:
        if tuple(weight.shape) != shape:
            raise ValueError(f"bie: weight has shape {tuple(weight.shape)}, expected {shape}")
        return _view(weight)
    if weight.dtype == torch.uint8 and quant == QUANT_BINARY:
        want = packed_shape(quant, shape)
        if tuple(weight.shape) != want:
            raise ValueError(f"bie: packed binary weight has shape {tuple(weight.shape)}, expected {want}")
        return _packed_view(quant, weight, shape)
    if weight.dtype == torch.int8:
        if tuple(weight.shape) == shape:  # binary: int8 latent weight; n-bit: integer codes
            return _view(weight)
        if quant == QUANT_INT4 and tuple(weight.shape) == packed_shape(quant, shape):
            return _packed_view(quant, weight, shape)
        raise ValueError(f"bie: int8 weight has shape {tuple(weight.shape)}, expected {shape}"
                         + (f" or the packed {packed_shape(quant, shape)}" if quant == QUANT_INT4 else ""))
    raise TypeError(f"bie: a {_QUANTS.get(quant, quant)} layer does not take a {weight.dtype} weight")


def _host_scale(scale):
    return None if scale is None else scale.detach().reshape(()).to("cpu", torch.float32)


def pack_weight(quant, weight, scale_w=None):
    """Packs a float (or int8) weight [O, K] / [O, C, kh, kw] into its public packed form:
    binary -> uint8 B1 (bit = W >= 0), 4-bit -> int8 S4 codes clamp(rne(W/scale_w), -8, 7).
    Bytes past the last element of a row are zero."""
    if quant not in (QUANT_BINARY, QUANT_INT4):
        raise ValueError("bie: only binary and 4-bit weights have a packed form (8-bit: quantize_int8)")
    shape = tuple(weight.shape)
    buf = torch.zeros(packed_shape(quant, shape), dtype=torch.uint8 if quant == QUANT_BINARY else torch.int8,
                      device=weight.device)
    w = weight.detach()
    src = _view(w)
    dst = _packed_view(quant, buf, shape)
    scale = _host_scale(scale_w) if quant == QUANT_INT4 and w.dtype != torch.int8 else None
    sv = _view(scale) if scale is not None else None
    _Call(w)("bie_pack", ctypes.byref(src), _ptr(sv), ctypes.byref(dst))
    return buf


def unpack_weight(quant, packed, shape, scale=None, dtype=torch.float32):
    """The inverse of pack_weight: a `dtype` tensor of logical `shape` holding code * scale."""
    out = torch.empty(tuple(shape), dtype=dtype, device=packed.device)
    src = _packed_view(quant, packed, tuple(shape))
    dst = _view(out)
    scale = _host_scale(scale) if dtype != torch.int8 else None
    sv = _view(scale) if scale is not None else None
    _Call(packed)("bie_unpack", ctypes.byref(src), _ptr(sv), ctypes.byref(dst))
    return out


def quantize_int8(weight, scale_w):
    """8-bit integer codes clamp(rne(W/scale_w), -128, 127) as an int8 tensor of W's shape."""
    w = weight.detach()
    out = torch.empty(w.shape, dtype=torch.int8, device=w.device)
    src, dst, scale = _view(w), _view(out), _host_scale(scale_w)
    sv = _view(scale)
    _Call(w)("bie_pack", ctypes.byref(src), ctypes.byref(sv), ctypes.byref(dst))
    return out


def weight_to_latent_int8(weight):
    """Bitorch Engine's int8 latent binary weight (prepare_params): c = W - mean(W),
    q = rne(c * 127 / max|c|), q == 0 -> sign(c). Computed on the CPU by libbie."""
    w = weight.detach().to("cpu")
    out = torch.empty(w.shape, dtype=torch.int8)
    src, dst = _view(w), _view(out)
    _lib.context().call("bie_weight_to_latent_int8", ctypes.byref(src), ctypes.byref(dst))
    return out.to(weight.device)


def activation_scale_init(quant, x, symmetric=True):
    """Initial scale_a from a first input (float32 CPU scalar): binary 2*mean|x| (4*mean|x| when
    not symmetric); n-bit 2*mean|x|/11.269. Synchronises with the device (a one-off)."""
    xd = x.detach()
    _check_float(xd, "x")
    out = torch.empty((), dtype=torch.float32)
    src, dst = _view(xd), _view(out)
    _Call(xd)("bie_activation_scale_init", int(quant), int(bool(symmetric)), ctypes.byref(src), ctypes.byref(dst))
    return out


def weight_scale_init(quant, weight, out=None):
    """scale_w from a float weight: binary mean|W|; 4-bit max(2*mean|W|/5.6345, 1e-5); 8-bit
    2*mean|W|/11.269 (summed in double, rounded to float32). Without `out`, a float32 CPU scalar (a
    CUDA weight is read back: a host synchronisation). With `out`, a one-element float tensor on
    the weight's device, the scale is written there and `out` returned; on a CUDA device it is
    computed there, on the current stream, without a synchronisation (an all-zero weight then gives
    what the formula gives instead of an error)."""
    w = weight.detach()
    if out is not None:
        _weight_scale_call(quant, w, out).run(w, (w, out))
        return out
    _check_float(w, "weight")
    out = torch.empty((), dtype=torch.float32)
    src, dst = _view(w), _view(out)
    _Call(w)("bie_weight_scale_init", int(quant), ctypes.byref(src), ctypes.byref(dst))
    return out


def _weight_scale_call(quant, w, out):
    """The kept _plans.Call of weight_scale_init(quant, w, out) (its tensors: w, out)."""
    key = ("weight_scale", quant, _plans.meta_fast(w), _plans.meta_fast(out))
    cache = _plans.cache()
    call = cache.get(key)
    if call is None:
        _check_float(w, "weight")
        _scalar(out, "out")
        if out.device != w.device:
            raise ValueError(f"bie: out must be on the weight's device ({w.device}), is on {out.device}")
        views = [_view(w), _view(out)]
        call = cache[key] = _plans.Call("bie_weight_scale_init", [int(quant)] + [_ptr(v) for v in views], None,
                                        views)
    return call


# --- layers -------------------------------------------------------------------------------------

def _common(x, bias_a, scale_a, scale_w):
    _check_float(x, "x")
    _scalar(scale_a, "scale_a")
    _scalar(scale_w, "scale_w")
    if bias_a is not None:
        _check_float(bias_a, "bias_a")


def _fwd_args(x, bias_a, weight_v, scale_a, scale_w, y, out_mul=None, out_add=None, residual=None, out_bits_v=None,
              out_bits_bias=None, x_clamp=None):
    keep = [x if isinstance(x, _lib.Tensor) else _view(x), _view(bias_a) if bias_a is not None else None, weight_v,
            _view(scale_a), _view(scale_w), _view(y)]
    keep += [None if t is None else _view(t.detach()) for t in (out_mul, out_add, residual)]
    keep += [out_bits_v, None if out_bits_bias is None else _view(out_bits_bias.detach())]
    args = _lib.ForwardArgs(*[_ptr(v) for v in keep], 0.0 if x_clamp is None else float(x_clamp))
    return args, keep


def _features(x):
    """K, the size of x's last axis: at least 1, as the C library requires (a BieError, not a torch
    error from reshaping an empty tensor, otherwise)."""
    k = x.shape[-1] if x.dim() else 0
    if k < 1:
        raise BieError("bie", _lib.STATUS_INVALID_ARGUMENT, f"x: has {k} features on its last axis; a layer needs K >= 1")
    return k


def _out_features(weight):
    """N, the weight's first dimension: at least 1, as the C library requires."""
    n = weight.shape[0] if weight.dim() else 0
    if n < 1:
        raise BieError("bie", _lib.STATUS_INVALID_ARGUMENT, f"weight: has {n} output features; a layer needs N >= 1")
    return n


def _x_operand(quant, x, bias_a, scale_a, scale_w, in_features):
    """(rows of x as [M, K], their libbie view, K) for a float x [..., K], or for the sign bits of
    binarize_ste (uint8 [..., ceil(K/8)], in_features = K: binary layers, bias_a already applied)."""
    if in_features is None:
        _common(x, bias_a, scale_a, scale_w)
        k = _features(x)
        x2 = x.detach().reshape(-1, k)
        return x2, _view(x2), k
    if quant != QUANT_BINARY or x.dtype != torch.uint8:
        raise TypeError("bie: saved bits (in_features given) are a uint8 x of a binary layer")
    if bias_a is not None:
        raise ValueError("bie: saved bits already hold bias_a (binarize_ste added it); pass bias_a=None")
    k = int(in_features)
    if k < 1:
        raise BieError("bie", _lib.STATUS_INVALID_ARGUMENT, f"in_features: = {k}; a layer needs K >= 1")
    if x.shape[-1] != -(-k // 8):
        raise ValueError(f"bie: saved bits have rows of {x.shape[-1]} bytes, {k} features need {-(-k // 8)}")
    _scalar(scale_a, "scale_a")
    _scalar(scale_w, "scale_w")
    x2 = x.detach().reshape(-1, x.shape[-1])
    return x2, _packed_view(QUANT_BINARY, x2, (x2.shape[0], k)), k


def linear_forward(quant, x, weight, scale_a, scale_w, bias_a=None, out_dtype=None, in_features=None, _replay=False):
    """y[..., N] = scale_a*scale_w * (a . w^T), a = codes of x + bias_a (libbie's linear forward).
    `out_dtype` (default x.dtype) may be a float dtype or torch.int32 (the raw accumulation).
    A binary layer takes the sign bits of binarize_ste for x with in_features = K (out_dtype then
    defaults to float32). Planned once per metadata of the tensors (bie._plans)."""
    return _linear_forward_planned(quant, x, weight, scale_a, scale_w, bias_a, out_dtype, in_features, _replay)[0]


def _linear_forward_planned(quant, x, weight, scale_a, scale_w, bias_a=None, out_dtype=None, in_features=None,
                            replay=False):
    """linear_forward's (y, plan): for a 2-D x, the plan runs later calls whose tensors have the same
    metadata with plan.run(x, (x, bias_a, weight, scale_a, scale_w, y)) into a y of
    (x.shape[0], plan.out[0]) and dtype plan.out[1]; None for an empty x."""
    key = ("linear_forward", quant, _plans.meta(x), _plans.meta(weight), _plans.meta(bias_a), _plans.meta(scale_a),
           _plans.meta(scale_w), out_dtype, in_features)
    cache = _plans.cache()
    p = cache.get(key)
    if p is not None:
        n, ydt = p.out
        if x.dim() == 2:  # (rows already: no views to make)
            y = torch.empty((x.shape[0], n), dtype=ydt, device=x.device)
            _run(p, replay, x, (x, bias_a, weight, scale_a, scale_w, y))
            return y, p
        x2 = x.detach().reshape(-1, x.shape[-1])
        y = torch.empty((x2.shape[0], n), dtype=ydt, device=x.device)
        _run(p, replay, x, (x2, bias_a, weight, scale_a, scale_w, y))
        return y.reshape(*x.shape[:-1], n), p
    x2, xv, k = _x_operand(quant, x, bias_a, scale_a, scale_w, in_features)
    n = _out_features(weight)
    y = torch.empty((x2.shape[0], n), dtype=out_dtype or (x.dtype if in_features is None else torch.float32),
                    device=x.device)
    if x2.shape[0] == 0:
        return y.reshape(*x.shape[:-1], n), None
    wv = _weight_view(quant, weight.detach(), (n, k))
    desc = _lib.LinearDesc(int(quant), k, n)
    args, keep = _fwd_args(xv, None if bias_a is None else bias_a.detach(), wv, scale_a.detach(),
                           scale_w.detach(), y)
    p = _cuda_checked(x, lambda: _plans.Plan("bie_plan_linear_forward", desc, args, keep, keep, False))
    p.out = (n, y.dtype)
    cache[key] = p
    p.run(x, (x2, bias_a, weight, scale_a, scale_w, y))
    return y.reshape(*x.shape[:-1], n), p


def binarize_ste(x, scale_a, bias_a=None, _nhwc=False, clamp=None, _replay=False):
    """libbie's bie_binarize_ste: what a binary linear layer's training needs of x [..., K], in 2
    bits per element. Returns (bits, mask), uint8 [..., ceil(K/8)], element k of a row in bit k % 8
    of byte k // 8 (least-significant first): bits holds x' >= 0 and mask the STE's pass bit
    |x'| <= scale_a, x' = x + bias_a. linear_forward takes bits for x (in_features=K, bias_a=None),
    linear_backward bits and mask (x_mask), with the results of the float x. The argument views
    are built once per metadata of the tensors and reused (their data pointers replaced).
    (_nhwc: x is a channels-last [N, C, H, W], binarized as its [N, H, W, C] rows.)
    With clamp = t (a float > 0): bie_binarize_ste_clamped, the bits and mask of clamp(x, -t, t) and
    a third result, the clamp's pass bits |x| < t (what the backward takes as grad_x_mask)."""
    outs, call, x2 = _binarize_ste_call(x, scale_a, bias_a, _nhwc, clamp)
    if call is not None:
        _run(call, _replay, x, (x2, bias_a, scale_a, *outs))
    return outs


def _binarize_ste_call(x, scale_a, bias_a, nhwc, clamp):
    """binarize_ste's outputs (new tensors), the kept _plans.Call that writes them (None for an empty
    x) and the rows of x that it reads (the call's first tensor; then bias_a, scale_a, the outputs)."""
    key = ("binarize_ste", _plans.meta_fast(x), _plans.meta(scale_a), _plans.meta(bias_a), nhwc, clamp)
    cache = _plans.cache()
    e = cache.get(key)
    n_out = 2 if clamp is None else 3
    if e is None:
        _check_float(x, "x")
        _scalar(scale_a, "scale_a")
        if bias_a is not None:
            _check_float(bias_a, "bias_a")
        rows = x.permute(0, 2, 3, 1) if nhwc else x
        k = _features(rows)
        x2 = rows.detach().reshape(-1, k)
        shape = (n_out, *rows.shape[:-1], -(-k // 8))
        outs = torch.empty(shape, dtype=torch.uint8, device=x.device).unbind(0)
        views = [_view(x2), _view(bias_a.detach()) if bias_a is not None else None, _view(scale_a.detach())] + [
            _packed_view(QUANT_BINARY, o.view(-1, shape[-1]), (x2.shape[0], k)) for o in outs]
        ptrs = [_ptr(v) for v in views]
        if clamp is None:
            call = _plans.Call("bie_binarize_ste", ptrs, None, views)
        else:
            call = _plans.Call("bie_binarize_ste_clamped", [ptrs[0], ctypes.c_float(clamp), *ptrs[1:]], None, views)
        # (rows that are a view of x are read in place; others are copied on each call)
        e = cache[key] = (None if x2.shape[0] == 0 else call, shape, k, x2.data_ptr() == x.data_ptr())
        return outs, e[0], x2
    call, shape, k, in_place = e
    outs = torch.empty(shape, dtype=torch.uint8, device=x.device).unbind(0)
    return outs, call, x if in_place else (x.permute(0, 2, 3, 1) if nhwc else x).detach().reshape(-1, k)


def _grad_outputs(x_shape, x_dtype, device, weight, shape_w, scale_a, bias_a, needs, grad_weight_dtype,
                  x_format=torch.contiguous_format):
    gx = torch.empty(x_shape, dtype=x_dtype, device=device, memory_format=x_format) if needs[0] else None
    if needs[1]:
        gdt = grad_weight_dtype or (weight.dtype if weight.dtype in _FLOATS else torch.float32)
        # a float conv weight's own layout (a channels-last weight: OHWI, which libbie writes row by
        # row, and which the weight's .grad keeps, with no copy to that layout after)
        same = weight.dim() == 4 and tuple(weight.shape) == tuple(shape_w) and weight.dtype in _FLOATS
        gw = torch.empty(tuple(shape_w), dtype=gdt, device=device,
                         memory_format=_like_memory_format(weight) if same else torch.contiguous_format)
    else:
        gw = None
    gs = torch.empty_like(scale_a, dtype=scale_a.dtype) if needs[2] else None
    gb = torch.empty_like(bias_a) if (needs[3] and bias_a is not None) else None
    return gx, gw, gs, gb


def _bwd_args(x, bias_a, weight_v, scale_a, scale_w, grad_y, gx, gw, gs, gb, x_mask=None, grad_x_mask=None,
              x_clamp=None, grad_x_add=None):
    keep = [x if isinstance(x, _lib.Tensor) else _view(x), _view(bias_a) if bias_a is not None else None, weight_v,
            _view(scale_a), _view(scale_w), _view(grad_y)] + [_view(t) if t is not None else None
                                                               for t in (gx, gw, gs, gb)] + [
        x_mask, grad_x_mask, None if grad_x_add is None else _view(grad_x_add)]
    return _lib.BackwardArgs(*[_ptr(v) for v in keep], 0.0 if x_clamp is None else float(x_clamp)), keep


def linear_backward(quant, x, weight, scale_a, scale_w, grad_y, bias_a=None, needs=(True, True, True, True),
                    grad_weight_dtype=None, x_mask=None, in_features=None, grad_x_dtype=None, _replay=False):
    """Straight-through backward of linear_forward. Returns (grad_x, grad_weight, grad_scale_a,
    grad_bias_a); an entry is None where `needs` says so. grad_weight is float (weight's dtype for a
    float weight, float32 otherwise unless grad_weight_dtype is given).
    From saved bits (a binary layer): x and x_mask are binarize_ste's bits and mask, in_features = K,
    grad_x of grad_x_dtype (default float32); bias_a, if given, only sets grad_bias_a's shape and
    dtype (the bits already hold it), and every gradient is the float x's."""
    saved = in_features is not None
    key = ("linear_backward", quant, _plans.meta(x), _plans.meta(weight), _plans.meta(bias_a), _plans.meta(scale_a),
           _plans.meta(scale_w), _plans.meta(grad_y), tuple(needs), grad_weight_dtype, _plans.meta(x_mask),
           in_features, grad_x_dtype)
    cache = _plans.cache()
    p = cache.get(key)
    if p is None:
        x2, xv, k = _x_operand(quant, x, None if saved else bias_a, scale_a, scale_w, in_features)
        if saved:
            if bias_a is not None:
                _check_float(bias_a, "bias_a")
            if x_mask is not None and (x_mask.dtype != torch.uint8 or x_mask.shape != x.shape):
                raise ValueError(f"bie: x_mask must be uint8 of the bits' shape {tuple(x.shape)}")
        elif x_mask is not None:
            raise ValueError("bie: x_mask goes with saved bits (in_features)")
        _check_float(grad_y, "grad_y")
    else:
        k = p.out
        x2 = x.detach().reshape(-1, x.shape[-1])
    m2 = x_mask.detach().reshape(-1, x.shape[-1]) if saved and x_mask is not None else None
    n = _out_features(weight)
    g2 = grad_y.reshape(-1, n)
    gx, gw, gs, gb = _grad_outputs((x2.shape[0], k), (grad_x_dtype or torch.float32) if saved else x2.dtype, x.device,
                                   weight, (n, k), scale_a, bias_a, needs, grad_weight_dtype)
    sources = (x2, None if saved else bias_a, weight, scale_a, scale_w, g2, gx, gw, gs, gb, m2)
    if x2.shape[0] == 0:
        for t in (gw, gs, gb):
            if t is not None:
                t.zero_()
    elif p is not None:
        _run(p, _replay, x, sources)
    else:
        mv = _packed_view(QUANT_BINARY, m2, (m2.shape[0], k)) if m2 is not None else None
        wv = _weight_view(quant, weight.detach(), (n, k))
        desc = _lib.LinearDesc(int(quant), k, n)
        args, keep = _bwd_args(xv, None if bias_a is None or saved else bias_a.detach(), wv, scale_a.detach(),
                               scale_w.detach(), g2, gx, gw, gs, gb, mv)
        p = _cuda_checked(x, lambda: _plans.Plan("bie_plan_linear_backward", desc, args, keep, keep, True))
        p.out = k
        cache[key] = p
        p.run(x, sources)
    if gx is not None:
        gx = gx.reshape(*x.shape[:-1], k)
    return gx, gw, gs, gb


def _run(p, replay, ref, tensors):
    """A kept plan's call on tensors: as usual, or (replay: a training step's call) through the plan's
    own Replay (_plans.run_kept)."""
    if replay:
        _plans.run_kept(p, ref, tensors)
    else:
        p.run(ref, tensors)


def _pair(v):
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ValueError(f"bie: expected an int or a pair, got {v}")
        return int(v[0]), int(v[1])
    return int(v), int(v)


def _geometry_key(kernel_size, stride, padding, dilation):
    """A conv's geometry as a plan's key holds it: as given (ints or tuples, which hash as they are;
    another spelling of the same geometry only makes another entry), lists as tuples."""
    geo = (kernel_size, stride, padding, dilation)
    if list in (type(kernel_size), type(stride), type(padding), type(dilation)):
        geo = tuple(tuple(v) if isinstance(v, list) else v for v in geo)
    return geo


def conv2d_output_size(h, w, kernel_size, stride=1, padding=0, dilation=1):
    kh, kw = _pair(kernel_size)
    sh, sw = _pair(stride)
    ph, pw = _pair(padding)
    dh, dw = _pair(dilation)
    if min(kh, kw, sh, sw, dh, dw) < 1 or min(ph, pw) < 0:  # as bie_conv2d_output_size refuses them
        raise BieError("bie", _lib.STATUS_INVALID_ARGUMENT, f"kernel {kh}x{kw}, stride {sh}x{sw}, dilation {dh}x{dw} "
                       f"must be >= 1 and padding {ph}x{pw} >= 0")
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    return oh, ow


def _conv_desc(quant, c, o, kernel_size, stride, padding, dilation, pad_value):
    """The C descriptor, with the checks of the C library that do not need data (made here too, so
    that an empty batch, which never reaches the library, is refused alike)."""
    if int(pad_value) not in (PAD_ZERO, PAD_MINUS_ONE, PAD_PLUS_ONE) or (int(pad_value) != PAD_ZERO and
                                                                        quant != QUANT_BINARY):
        raise BieError("bie", _lib.STATUS_INVALID_ARGUMENT, f"pad_value: {pad_value} is not a pad value of a "
                       f"{'binary' if quant == QUANT_BINARY else 'n-bit'} conv (n-bit convs pad with zeros)")
    d = _lib.Conv2dDesc()
    d.quant = int(quant)
    d.in_channels = c
    d.out_channels = o
    for name, v in (("kernel", kernel_size), ("stride", stride), ("padding", padding), ("dilation", dilation)):
        a, b = _pair(v)
        getattr(d, name)[0] = a
        getattr(d, name)[1] = b
    d.groups = 1
    d.pad_value = int(pad_value)
    return d


def _conv_weight_shape_c(c, weight, kernel_size):
    o = weight.shape[0]
    if kernel_size is None:
        if weight.dim() != 4:
            raise ValueError("bie: conv weight must be 4-D")
        # float / int8 codes [O, C, kh, kw]; packed [O, kh, kw, C']
        kh, kw = (weight.shape[2], weight.shape[3]) if weight.shape[1] == c and weight.dtype != torch.uint8 \
            else (weight.shape[1], weight.shape[2])
    else:
        kh, kw = _pair(kernel_size)
    if min(c, o) < 1:  # as the C library requires (checked here too for an empty batch)
        raise BieError("bie", _lib.STATUS_INVALID_ARGUMENT, f"a conv needs C >= 1 input and O >= 1 output channels, "
                       f"has C = {c}, O = {o}")
    return (o, c, kh, kw)


def _like_memory_format(x):
    """torch.channels_last when x is a channels-last 4-D tensor (and not also NCHW-contiguous), so
    that a layer's output keeps its input's layout, as PyTorch's convolutions do."""
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def _bits_view(bits, c):
    """B1 view [N, C, H, W] of NHWC sign bits (uint8 [N, H, W, ceil(C/8)], binarize_ste's layout)."""
    if bits.dtype != torch.uint8 or bits.dim() != 4 or bits.shape[-1] != -(-c // 8) or bits.stride(-1) != 1:
        raise ValueError(f"bie: saved conv bits must be uint8 [N, H, W, {-(-c // 8)}] with contiguous bytes")
    n, h, w, _ = bits.shape
    st = bits.stride()
    return _view(bits, _lib.DT_B1, (n, c, h, w), (st[0] * 8, 1, st[1] * 8, st[2] * 8))


def affine_maxpool2d(x, kernel_size, stride=None, padding=0, mul=None, add=None, lo=-math.inf, hi=math.inf,
                     out_bits=None, out_bits_bias=None, argmax=None):
    """max_pool2d(clamp(x * mul[c] + add[c], lo, hi), kernel_size, stride, padding) in one pass
    (bie_affine_maxpool2d_forward): a float conv's folded BatchNorm, its ReLU (lo = 0) or Hardtanh
    and its MaxPool2d. mul and add are float32 [C] or None; y has x's dtype and memory format.
    out_bits (uint8 [N, OH, OW, ceil(C/8)], conv2d_binarize_ste's layout) gets the sign bits of
    y + out_bits_bias[c] (float32 [C], or None): a following binary conv's input (in_channels=C).
    argmax (uint8 shaped like y) gets each output's position in its window, 255 where the clamp
    stops its gradient: what affine_maxpool2d_backward takes."""
    if x.dim() != 4:
        raise ValueError(f"bie: affine_maxpool2d input must be 4-D [N, C, H, W], has {x.dim()} dimensions")
    _check_float(x, "x")
    k = _pair(kernel_size)
    s = k if stride is None else _pair(stride)
    p = _pair(padding)
    n, c, h, w = x.shape
    oh, ow = conv2d_output_size(h, w, k, s, p, (1, 1))
    if oh < 1 or ow < 1 or any(2 * p[i] > k[i] for i in range(2)):
        raise ValueError(f"bie: a {k[0]}x{k[1]} max-pool (stride {s}, padding {p}) does not fit a {h}x{w} input")
    y = torch.empty((n, c, oh, ow), dtype=x.dtype, device=x.device, memory_format=_like_memory_format(x))
    if y.numel() == 0:
        return y
    ts = (x, mul, add, y, out_bits, out_bits_bias, argmax)
    m = _plans.meta_fast
    key = ("affine maxpool2d", k, s, p, float(lo).hex(), float(hi).hex(), *(None if t is None else m(t) for t in ts))

    def pre():
        return (ctypes.byref(_lib.AffineMaxpool2dDesc(k[0], k[1], s[0], s[1], p[0], p[1], float(lo), float(hi))),)

    def views():
        if x.is_cuda and not _lib.cuda_available():
            raise _no_cuda(x)
        return [_view(x.detach()), None if mul is None else _view(mul), None if add is None else _view(add), _view(y),
                None if out_bits is None else _bits_view(out_bits, c),
                None if out_bits_bias is None else _view(out_bits_bias), None if argmax is None else _view(argmax)]
    _cached_call(key, "bie_affine_maxpool2d_forward", pre, _lib.AffineMaxpool2dArgs, ts, views).run(x, ts)
    return y


def affine_maxpool2d_backward(argmax, grad_y, input_size, kernel_size, stride=None, padding=0, dtype=None):
    """The gradient of affine_maxpool2d to z = x * mul + add (before the clamp), from the forward's
    argmax (bie_affine_maxpool2d_backward): grad_z [N, C, H, W] (input_size = (H, W)) of grad_y's
    dtype (or dtype) and memory format, each element the sum of the grad_y of the outputs whose
    argmax names it."""
    k = _pair(kernel_size)
    s = k if stride is None else _pair(stride)
    p = _pair(padding)
    n, c = grad_y.shape[:2]
    gz = torch.empty((n, c, input_size[0], input_size[1]), dtype=grad_y.dtype if dtype is None else dtype,
                     device=grad_y.device, memory_format=_like_memory_format(grad_y))
    ts = (argmax, grad_y, gz)
    m = _plans.meta_fast
    key = ("affine maxpool2d backward", k, s, p, m(argmax), m(grad_y), m(gz))

    def pre():
        return (ctypes.byref(_lib.AffineMaxpool2dDesc(k[0], k[1], s[0], s[1], p[0], p[1], -math.inf, math.inf)),)

    def views():
        if grad_y.is_cuda and not _lib.cuda_available():
            raise _no_cuda(grad_y)
        return [_view(t.detach()) for t in ts]
    _cached_call(key, "bie_affine_maxpool2d_backward", pre, _lib.AffineMaxpool2dBackwardArgs, ts, views).run(grad_y, ts)
    return gz


def _cached_call(key, function, pre, struct, tensors, views=None):
    """The _plans.Call of `function` kept in this thread's cache under key (which must fix the
    metadata of `tensors`), made on its first use with pre() as the arguments before the struct and
    a `struct` of the views that views() gives (default: a plain view of each of `tensors`)."""
    cache = _plans.cache()
    call = cache.get(key)
    if call is None:
        vs = views() if views is not None else [None if t is None else _view(t.detach()) for t in tensors]
        call = cache[key] = _plans.Call(function, pre(), struct(*[_ptr(v) for v in vs]), vs)
    return call


def batch_norm_train(x, weight, bias, running_mean, running_var, momentum=0.1, eps=1e-5, residual=None,
                     normalize=True, num_batches=None):
    """Training-mode batch norm of x [N, C, ...] (bie_batchnorm_forward): batch statistics per
    channel, running_mean and running_var updated in place (momentum; the variance unbiased),
    y = (x - mean) * invstd * weight + bias, plus residual (shaped like x) when given, in one pass
    after the statistics. Returns (y, saved_mean, saved_invstd), y in x's dtype and memory format
    (None with normalize=False: the statistics only), the saved statistics float32 [C] for
    batch_norm_backward. On CUDA tensors any float dtypes and strides (2 to 4 dimensions); on the CPU
    dense float32 only. num_batches: an int64 tensor of one element on x's device (a BatchNorm2d's
    num_batches_tracked) that the call adds 1 to, or None."""
    y, stats = _batch_norm_train(x, weight, bias, running_mean, running_var, momentum, eps, residual, normalize,
                                 num_batches)
    mean, invstd = stats.unbind(0)
    return y, mean, invstd


def _batch_norm_train(x, weight, bias, running_mean, running_var, momentum, eps, residual, normalize, num_batches):
    """batch_norm_train with the saved statistics as the rows of one float32 [2, C] tensor: (y or
    None, stats), stats[0] the mean and stats[1] invstd. Its kept call takes their addresses."""
    _check_float(x, "x")
    if x.dim() < 2:
        raise ValueError(f"bie: batch_norm_train input must be [N, C, ...], has {x.dim()} dimensions")
    y = torch.empty_like(x, memory_format=_like_memory_format(x)) if normalize else None
    c = x.shape[1]
    stats = torch.empty((2, c), dtype=torch.float32, device=x.device)
    p = stats.data_ptr()
    ts = (x, weight, bias, running_mean, running_var, p, p + 4 * c, y, residual, num_batches)
    _batch_norm_call(ts, momentum, eps, stats).run(x, ts)
    return y, stats


def _batch_norm_call(ts, momentum, eps, stats=None):
    """batch_norm_train's kept _plans.Call for its tensors ts = (x, weight, bias, running_mean,
    running_var, saved_mean, saved_invstd, y or None, residual or None, num_batches or None); with
    stats (float32 [2, C]), ts's saved_mean and saved_invstd may be the addresses of its rows."""
    x, weight, bias, running_mean, running_var, _, _, y, residual, num_batches = ts
    m = _plans.meta_fast  # (y and the saved statistics follow from x's metadata)
    key = ("bn", momentum, eps, m(x), m(weight), m(bias), m(running_mean), m(running_var),
           None if residual is None else m(residual), y is not None, None if num_batches is None else m(num_batches))
    def pre():  # (the desc lives as long as its byref in the call)
        return (ctypes.byref(_lib.BatchnormDesc(float(momentum), float(eps), 1)),)

    def views():
        t = ts if stats is None else (*ts[:5], *stats.unbind(0), *ts[7:])
        return [None if u is None else _view(u.detach()) for u in t]
    return _cached_call(key, "bie_batchnorm_forward", pre, _lib.BatchnormArgs, ts, views)


def batch_norm_backward(x, weight, saved_mean, saved_invstd, grad_y, grad_x=True):
    """The backward of batch_norm_train (bie_batchnorm_backward) from its input x and saved
    statistics: (grad_x or None when grad_x is False, grad_weight, grad_bias); grad_x takes x's
    dtype and memory format, grad_weight and grad_bias weight's dtype."""
    gx = torch.empty_like(x, memory_format=_like_memory_format(x)) if grad_x else None
    gw, gb = torch.empty((2, x.shape[1]), dtype=weight.dtype, device=x.device).unbind(0)
    ts = (x, weight, saved_mean, saved_invstd, grad_y, gx, gw, gb)
    _batch_norm_backward_call(ts).run(x, ts)
    return gx, gw, gb


def _batch_norm_backward_call(ts):
    """batch_norm_backward's kept _plans.Call for its tensors ts = (x, weight, saved_mean,
    saved_invstd, grad_y, grad_x or None, grad_weight, grad_bias)."""
    x, weight, saved_mean, saved_invstd, grad_y, gx = ts[:6]
    m = _plans.meta_fast  # (the gradients follow from x's and weight's metadata)
    key = ("bn backward", m(x), m(weight), m(saved_mean), m(saved_invstd), m(grad_y), gx is None)
    return _cached_call(key, "bie_batchnorm_backward", tuple, _lib.BatchnormBackwardArgs, ts)


def conv2d_binarize_ste(x, scale_a, bias_a=None, clamp=None, _replay=False):
    """binarize_ste of a conv input x [N, C, H, W] in channels-last memory: (bits, mask), uint8
    [N, H, W, ceil(C/8)], the sign bits of x' = x + bias_a[c] and the STE's pass bits, which
    conv2d_forward (in_channels=C) and conv2d_backward (x_mask) take instead of x. With clamp = t:
    those of clamp(x, -t, t), and the clamp's pass bits |x| < t third (conv2d_backward's grad_x_mask)."""
    if not x.is_contiguous(memory_format=torch.channels_last):
        raise ValueError("bie: conv2d_binarize_ste takes a channels-last x")
    if clamp is not None and not (0.0 < float(clamp) < math.inf):
        raise ValueError(f"bie: clamp must be finite and > 0, got {clamp!r}")
    return binarize_ste(x, scale_a, bias_a, _nhwc=True, clamp=None if clamp is None else float(clamp),
                        _replay=_replay)


def conv2d_forward(quant, x, weight, scale_a, scale_w, bias_a=None, kernel_size=None, stride=1, padding=0,
                   dilation=1, pad_value=PAD_ZERO, out_dtype=None, in_channels=None, out_mul=None, out_add=None,
                   residual=None, out_bits=None, out_bits_bias=None, x_clamp=None, _replay=False):
    """y[N, O, OH, OW] = scale_a*scale_w * (a cross-correlated with w), libbie's conv2d forward. y
    keeps x's memory format (channels-last in, channels-last out). A binary layer takes the bits of
    conv2d_binarize_ste for x with in_channels = C (bias_a is in them; out_dtype then required).
    The optional epilogue (float32 [O] out_mul and out_add, a residual shaped like y of y's dtype)
    gives y = ((y * out_mul[o]) + out_add[o]) + residual in the same call (bie_forward_args), and
    out_bits (uint8 [N, OH, OW, ceil(O/8)], conv2d_binarize_ste's layout) the sign bits of
    y + out_bits_bias[o] (float32 [O], or None), what a following binary conv with that bias_a
    takes as its input (in_channels=O). x_clamp = t (finite, > 0) reads a float x as clamp(x, -t, t)
    (NaN kept) in the same call: a Hardtanh(-t, t) before the layer, without its own pass over x.
    Planned once per metadata of the tensors (bie._plans)."""
    return _conv2d_forward_planned(quant, x, weight, scale_a, scale_w, bias_a, kernel_size, stride, padding, dilation,
                                   pad_value, out_dtype, in_channels, out_mul, out_add, residual, out_bits,
                                   out_bits_bias, x_clamp, _replay)[0]


def _conv2d_forward_planned(quant, x, weight, scale_a, scale_w, bias_a, kernel_size, stride, padding, dilation,
                            pad_value, out_dtype, in_channels, out_mul, out_add, residual, out_bits, out_bits_bias,
                            x_clamp=None, replay=False):
    """conv2d_forward's (y, plan): the plan runs later calls whose tensors have the same metadata with
    plan.run(x, (x, bias_a, weight, scale_a, scale_w, y, out_mul, out_add, residual, out_bits,
    out_bits_bias)) into a y of plan.out = (shape, dtype, memory format); None for an empty batch."""
    meta = _plans.meta
    key = ("conv2d_forward", quant, meta(x), meta(weight), meta(bias_a), meta(scale_a), meta(scale_w),
           _geometry_key(kernel_size, stride, padding, dilation), pad_value, out_dtype, in_channels,
           _plans.metas(out_mul, out_add, residual, out_bits, out_bits_bias), x_clamp)
    cache = _plans.cache()
    p = cache.get(key)
    if p is not None:
        shape, ydt, fmt = p.out
        y = torch.empty(shape, dtype=ydt, device=x.device, memory_format=fmt)
        _run(p, replay, x,
             (x, bias_a, weight, scale_a, scale_w, y, out_mul, out_add, residual, out_bits, out_bits_bias))
        return y, p
    if in_channels is None:
        _common(x, bias_a, scale_a, scale_w)
        if x.dim() != 4:
            raise ValueError(f"bie: conv2d input must be 4-D [N, C, H, W], has {x.dim()} dimensions")
        n, c, h, w_ = x.shape
        xv = _view(x.detach())
        fmt = _like_memory_format(x)
    else:
        if quant != QUANT_BINARY or bias_a is not None or out_dtype is None:
            raise ValueError("bie: saved bits go to a binary conv, without bias_a, with out_dtype")
        _scalar(scale_a, "scale_a")
        _scalar(scale_w, "scale_w")
        c = int(in_channels)
        xv = _bits_view(x, c)
        n, h, w_ = x.shape[0], x.shape[1], x.shape[2]
        fmt = torch.channels_last
    shape_w = _conv_weight_shape_c(c, weight, kernel_size)
    oh, ow = conv2d_output_size(h, w_, shape_w[2:], stride, padding, dilation)
    if oh < 1 or ow < 1:
        raise ValueError(f"bie: conv2d output would be {oh}x{ow} for a {h}x{w_} input")
    y = torch.empty((n, shape_w[0], oh, ow), dtype=out_dtype or x.dtype, device=x.device, memory_format=fmt)
    desc = _conv_desc(quant, shape_w[1], shape_w[0], shape_w[2:], stride, padding, dilation, pad_value)
    if n == 0:
        return y, None
    wv = _weight_view(quant, weight.detach(), shape_w)
    bits_v = None if out_bits is None else _bits_view(out_bits, shape_w[0])
    args, keep = _fwd_args(xv, None if bias_a is None else bias_a.detach(), wv, scale_a.detach(),
                           scale_w.detach(), y, out_mul, out_add, residual, bits_v, out_bits_bias, x_clamp)
    p = _cuda_checked(x, lambda: _plans.Plan("bie_plan_conv2d_forward", desc, args, keep, keep, False))
    p.out = (tuple(y.shape), y.dtype, fmt)
    cache[key] = p
    p.run(x, (x, bias_a, weight, scale_a, scale_w, y, out_mul, out_add, residual, out_bits, out_bits_bias))
    return y, p


def conv2d_backward(quant, x, weight, scale_a, scale_w, grad_y, bias_a=None, kernel_size=None, stride=1, padding=0,
                    dilation=1, pad_value=PAD_ZERO, needs=(True, True, True, True), grad_weight_dtype=None,
                    x_mask=None, in_channels=None, grad_x_dtype=None, grad_x_mask=None, x_clamp=None,
                    grad_x_add=None, _replay=False):
    """Straight-through backward of conv2d_forward: (grad_x, grad_weight, grad_scale_a, grad_bias_a).
    grad_weight takes a float weight's memory format (a channels-last weight's, as its .grad keeps).
    From saved bits (a binary conv): x and x_mask are conv2d_binarize_ste's bits and mask,
    in_channels = C, grad_x (channels-last) of grad_x_dtype; bias_a, if given, only sets
    grad_bias_a's shape and dtype, and every gradient is the float x's. grad_x_mask (saved bits
    only; bits laid out as x_mask) zeroes grad_x where its bit is 0 and leaves the other gradients:
    the derivative of a 0/1-sloped activation (a Hardtanh) before the layer, whose input grad_x then
    belongs to. x_clamp = t (a float x): the forward's x_clamp; the layer's input is clamp(x, -t, t),
    and grad_x is x's, the clamp's derivative 1{|x| < t} applied after grad_scale_a and grad_bias_a
    are taken (a Hardtanh(-t, t) before the layer, in the same calls). grad_x_add (a float tensor
    shaped like grad_x; needs grad_x): a gradient x gets from elsewhere (a shortcut around the
    layer), added to grad_x last, as an add after the call would (grad_x's dtype). Planned once per
    metadata."""
    return _conv2d_backward_planned(quant, x, weight, scale_a, scale_w, grad_y, bias_a, kernel_size, stride, padding,
                                    dilation, pad_value, needs, grad_weight_dtype, x_mask, in_channels, grad_x_dtype,
                                    grad_x_mask, x_clamp, grad_x_add, _replay)[0]


def _conv2d_backward_planned(quant, x, weight, scale_a, scale_w, grad_y, bias_a, kernel_size, stride, padding,
                             dilation, pad_value, needs, grad_weight_dtype, x_mask, in_channels, grad_x_dtype,
                             grad_x_mask, x_clamp=None, grad_x_add=None, replay=False):
    """conv2d_backward's (gradients, plan): the plan runs later calls whose tensors have the same
    metadata with plan.run(x, (x, bias_a or None (saved bits), weight, scale_a, scale_w, grad_y,
    grad_x, grad_weight, grad_scale_a, grad_bias_a, x_mask, grad_x_mask, grad_x_add)); None for an empty
    batch."""
    saved = in_channels is not None
    geo = _geometry_key(kernel_size, stride, padding, dilation)
    key = ("conv2d_backward", quant, _plans.meta(x), _plans.meta(weight), _plans.meta(bias_a), _plans.meta(scale_a),
           _plans.meta(scale_w), _plans.meta(grad_y), geo, pad_value, tuple(needs), grad_weight_dtype,
           _plans.meta(x_mask), in_channels, grad_x_dtype, _plans.meta(grad_x_mask), x_clamp, _plans.meta(grad_x_add))
    cache = _plans.cache()
    p = cache.get(key)
    if p is None:
        _check_float(grad_y, "grad_y")
        if saved:
            _scalar(scale_a, "scale_a")
            _scalar(scale_w, "scale_w")
            if bias_a is not None:
                _check_float(bias_a, "bias_a")
            c = int(in_channels)
            xv = _bits_view(x, c)
            mv = _bits_view(x_mask, c) if x_mask is not None else None
            gmv = _bits_view(grad_x_mask, c) if grad_x_mask is not None else None
            x_shape = (x.shape[0], c, x.shape[1], x.shape[2])
        else:
            if x_mask is not None or grad_x_mask is not None:
                raise ValueError("bie: x_mask and grad_x_mask go with saved bits (in_channels)")
            _common(x, bias_a, scale_a, scale_w)
            c = x.shape[1]
            xv, mv, gmv = _view(x.detach()), None, None
            x_shape = tuple(x.shape)
        shape_w = _conv_weight_shape_c(c, weight, kernel_size)
        fmt = torch.channels_last if saved else _like_memory_format(x)
        desc = _conv_desc(quant, shape_w[1], shape_w[0], shape_w[2:], stride, padding, dilation, pad_value)
        conv2d_output_size(x_shape[2], x_shape[3], shape_w[2:], stride, padding, dilation)  # its checks
    else:
        x_shape, shape_w, fmt = p.out
    x_dtype = (grad_x_dtype or torch.float32) if saved else x.dtype
    gx, gw, gs, gb = _grad_outputs(x_shape, x_dtype, x.device, weight, shape_w, scale_a, bias_a, needs,
                                   grad_weight_dtype, fmt)  # grad_x in x's memory format (saved bits: channels-last)
    if x_shape[0] == 0:
        for t in (gw, gs, gb):
            if t is not None:
                t.zero_()
        return (gx, gw, gs, gb), None
    sources = (x, None if saved else bias_a, weight, scale_a, scale_w, grad_y, gx, gw, gs, gb, x_mask, grad_x_mask,
               grad_x_add)
    if p is None:
        wv = _weight_view(quant, weight.detach(), shape_w)
        args, keep = _bwd_args(xv, None if bias_a is None or saved else bias_a.detach(), wv, scale_a.detach(),
                               scale_w.detach(), grad_y, gx, gw, gs, gb, mv, gmv, x_clamp, grad_x_add)
        p = _cuda_checked(x, lambda: _plans.Plan("bie_plan_conv2d_backward", desc, args, keep, keep, True))
        p.out = (x_shape, shape_w, fmt)
        cache[key] = p
        p.run(x, sources)
    else:
        _run(p, replay, x, sources)
    return (gx, gw, gs, gb), p
