# SPDX-License-Identifier: Apache-2.0
"""Export of a PyTorch model to the packed model file of the `bie` program (safetensors; see
docs/model-format.md), so that `bie eval MODEL` runs a model trained in PyTorch.

The model must be a chain (nn.Sequential, nested ones are flattened) of layers the bie model
format has:

  PyTorch                                           bie architecture item
  bie.BinaryConv2d / Q4Conv2d / Q8Conv2d            conv b1|q4|q8 OUT K STRIDE PAD
  bie.BinaryLinear / Q4Linear / Q8Linear            linear b1|q4|q8 OUT
  nn.Conv2d / nn.Linear (float)                     conv f32 ... / linear f32 OUT
  nn.BatchNorm1d / nn.BatchNorm2d (eps 1e-5)        bn
  nn.MaxPool2d(K) (stride K, no padding)            maxpool K
  nn.ReLU, nn.Hardtanh(-1, 1)                       relu, hardtanh
  nn.Flatten, nn.Identity, nn.Dropout               (nothing: linear flattens its input)

Convolutions must be square with one stride and one padding, dilation 1, groups 1; bie's binary
convolutions must pad with zeros (PAD_ZERO, the default); bie layers must not have the optional
output bias. The low-bit layers must have run (scale_a set). The file holds the packed weights
exactly as the layers use them in eval mode, so `bie eval` computes what model.eval() computes
(float layers up to float rounding: OpenBLAS against PyTorch).
"""
import ctypes
import os

import torch
import torch.nn as nn

from . import _lib
from . import functional as F
from .functional import PAD_ZERO, QUANT_BINARY, QUANT_INT4, QUANT_INT8
from .layers import BieLayer

__all__ = ["export_model", "architecture"]

_Q = {QUANT_BINARY: "b1", QUANT_INT4: "q4", QUANT_INT8: "q8"}
_FIELD = {QUANT_BINARY: "weight_b1", QUANT_INT4: "weight_s4", QUANT_INT8: "weight_q8"}
_LOGICAL = {QUANT_BINARY: "b1", QUANT_INT4: "s4", QUANT_INT8: "i8"}


class StTensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * _lib.BIE_MAX_DIMS), ("data", ctypes.c_void_p), ("nbytes", ctypes.c_size_t)]


def _flatten(model):
    if isinstance(model, nn.Sequential):
        out = []
        for m in model:
            out.extend(_flatten(m))
        return out
    return [model]


def _square(name, v):
    a, b = (tuple(v) if isinstance(v, (tuple, list)) else (v, v))
    if a != b:
        raise ValueError(f"bie export: {name} must be the same in both directions, is {v}")
    return int(a)


def _conv_geometry(m, where):
    k = _square(f"{where}: kernel_size", m.kernel_size)
    s = _square(f"{where}: stride", m.stride)
    if isinstance(m.padding, str):
        raise ValueError(f"{where}: string padding is not supported")
    p = _square(f"{where}: padding", m.padding)
    if _square(f"{where}: dilation", m.dilation) != 1:
        raise ValueError(f"bie export: {where}: dilation must be 1")
    if p > k:
        raise ValueError(f"bie export: {where}: padding must be at most the kernel size")
    return k, s, p


def _packed_weight(m):
    """The file form of a bie layer's weight: [O, kh, kw, per] bytes (U8 bits / nibbles, I8 codes),
    from the weight the layer uses in eval mode."""
    was = m.training
    m.eval()
    try:
        with torch.no_grad():
            w = m.opt_weight  # generates qweight (and refreshes an 8-bit scale_w) as eval does
    finally:
        m.train(was)
    w = w.detach().cpu()
    if m.is_conv:
        o, c, kh, kw = m.out_channels, m.in_channels, m.kernel_size[0], m.kernel_size[1]
    else:
        o, c, kh, kw = m.out_features, m.in_features, 1, 1
    logical = (o, c, kh, kw) if m.is_conv else (o, c)
    if m.quant == QUANT_INT8:
        codes = w if w.dim() == 4 else w.reshape(o, c, 1, 1)
        return codes.permute(0, 2, 3, 1).contiguous(), torch.int8
    if tuple(w.shape) == logical and w.dtype == torch.int8 and m.quant == QUANT_INT4:
        w = F.pack_weight(QUANT_INT4, w)  # a one-channel layer keeps codes; the file wants nibbles
    per = w.shape[-1]
    return w.reshape(o, kh, kw, per).contiguous().view(torch.uint8), torch.uint8


def architecture(model, input_shape):
    """(arch string, [(name, tensor)], {name: logical}) for the model, checking every layer."""
    c, h, w = (int(v) for v in input_shape)
    items = [f"input {c} {h} {w}"]
    tensors, logical = [], {}
    shape = [c, h, w]
    i = 0
    for m in _flatten(model):
        where = f"layer {i} ({type(m).__name__})"
        pre = f"layers.{i}."
        f32 = lambda t: t.detach().to("cpu", torch.float32).contiguous()
        if isinstance(m, (nn.Flatten, nn.Identity, nn.Dropout)):
            continue
        if isinstance(m, BieLayer):
            if m.bias is not None:
                raise ValueError(f"bie export: {where}: the output bias of a bie layer is not in the model format")
            if getattr(m, "pad_value", PAD_ZERO) != PAD_ZERO:
                raise ValueError(f"bie export: {where}: binary convolutions in bie model files pad with zeros")
            if float(m.scale_a.detach()) <= 0:
                raise ValueError(f"bie export: {where}: scale_a is not set (run the model on data first)")
            if m.is_conv:
                k, s, p = _conv_geometry(m, where)
                if m.in_channels != shape[0]:
                    raise ValueError(f"bie export: {where}: takes {m.in_channels} channels, gets {shape[0]}")
                items.append(f"conv {_Q[m.quant]} {m.out_channels} {k} {s} {p}")
                shape = [m.out_channels, (shape[1] + 2 * p - k) // s + 1, (shape[2] + 2 * p - k) // s + 1]
                cin, kk = m.in_channels, k
            else:
                if m.in_features != shape[0] * shape[1] * shape[2]:
                    raise ValueError(f"bie export: {where}: takes {m.in_features} features, gets {shape}")
                items.append(f"linear {_Q[m.quant]} {m.out_features}")
                cin, kk = m.in_features, 1
                shape = [m.out_features, 1, 1]
            packed, _ = _packed_weight(m)
            tensors += [(pre + "bias_a", f32(m.bias_a)), (pre + "scale_a", f32(m.scale_a).reshape(1)),
                        (pre + "scale_w", f32(m.scale_w).reshape(1)), (pre + _FIELD[m.quant], packed)]
            logical[pre + _FIELD[m.quant]] = f"{_LOGICAL[m.quant]} [{shape[0]},{cin},{kk},{kk}] ohwi"
        elif type(m) is nn.Conv2d:
            if m.groups != 1 or m.padding_mode != "zeros":
                raise ValueError(f"bie export: {where}: groups must be 1 and padding zeros")
            k, s, p = _conv_geometry(m, where)
            items.append(f"conv f32 {m.out_channels} {k} {s} {p}")
            shape = [m.out_channels, (shape[1] + 2 * p - k) // s + 1, (shape[2] + 2 * p - k) // s + 1]
            bias = m.bias if m.bias is not None else torch.zeros(m.out_channels)
            tensors += [(pre + "weight", f32(m.weight)), (pre + "bias", f32(bias))]
        elif type(m) is nn.Linear:
            if m.in_features != shape[0] * shape[1] * shape[2]:
                raise ValueError(f"bie export: {where}: takes {m.in_features} features, gets {shape}")
            items.append(f"linear f32 {m.out_features}")
            shape = [m.out_features, 1, 1]
            bias = m.bias if m.bias is not None else torch.zeros(m.out_features)
            tensors += [(pre + "weight", f32(m.weight)), (pre + "bias", f32(bias))]
        elif isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            if abs(m.eps - 1e-5) > 1e-12 or not m.track_running_stats:
                raise ValueError(f"bie export: {where}: needs eps = 1e-5 and running statistics")
            n = m.num_features
            gamma = m.weight if m.affine else torch.ones(n)
            beta = m.bias if m.affine else torch.zeros(n)
            items.append("bn")
            tensors += [(pre + "gamma", f32(gamma)), (pre + "beta", f32(beta)),
                        (pre + "running_mean", f32(m.running_mean)), (pre + "running_var", f32(m.running_var))]
        elif isinstance(m, nn.MaxPool2d):
            k = _square(f"{where}: kernel_size", m.kernel_size)
            s = _square(f"{where}: stride", m.stride if m.stride is not None else k)
            if s != k or _square(f"{where}: padding", m.padding) != 0 or _square(f"{where}: dilation", m.dilation) != 1 \
                    or m.ceil_mode:
                raise ValueError(f"bie export: {where}: only maxpool with stride = kernel size, no padding")
            items.append(f"maxpool {k}")
            shape = [shape[0], shape[1] // k, shape[2] // k]
        elif isinstance(m, nn.ReLU):
            items.append("relu")
        elif isinstance(m, nn.Hardtanh) and m.min_val == -1 and m.max_val == 1:
            items.append("hardtanh")
        else:
            raise ValueError(f"bie export: {where}: {type(m).__name__} has no counterpart in the bie model format")
        i += 1
    return "; ".join(items), tensors, logical


_ST_DTYPES = {torch.float32: _lib.DT_F32, torch.uint8: _lib.DT_U8, torch.int8: _lib.DT_I8}


def export_model(model, path, input_shape, metadata=None):
    """Writes `model` (see the module's documentation for what it may hold) as a packed bie model
    file at `path`; input_shape is (C, H, W) of one sample. Returns the architecture string."""
    arch, tensors, logical = architecture(model, input_shape)
    meta = {"bie.format": "packed", "bie.version": _lib.version(), "bie.arch": arch, "bie.latent": "f32",
            "bie.step": "0", "bie.seed": "0"}
    meta.update(logical)
    for k, v in (metadata or {}).items():
        if k.startswith("bie."):
            raise ValueError(f"bie export: metadata key {k!r} is reserved")
        meta[k] = str(v)
    keep = []
    arr = (StTensor * len(tensors))()
    for j, (name, t) in enumerate(tensors):
        t = t.contiguous()
        nb = name.encode()
        keep += [t, nb]
        arr[j].name = nb
        arr[j].dtype = _ST_DTYPES[t.dtype]
        arr[j].ndim = t.dim()
        for d, n in enumerate(t.shape):
            arr[j].shape[d] = n
        arr[j].data = t.data_ptr()
        arr[j].nbytes = t.numel() * t.element_size()
    flat = [s.encode() for kv in meta.items() for s in kv]
    mv = (ctypes.c_char_p * len(flat))(*flat)
    lib = _lib.library()
    fn = lib.bie_safetensors_write
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(StTensor), ctypes.c_size_t,
                   ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t]
    ctx = _lib.context()
    ctx.check("bie_safetensors_write", fn(ctx.handle, os.fsencode(path), arr, len(tensors), mv, len(meta)))
    del keep
    return arch
