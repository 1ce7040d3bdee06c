# SPDX-License-Identifier: Apache-2.0
"""Import of a bie model file (docs/model-format.md) as a PyTorch module: bie.import_model(path)
returns a torch.fx.GraphModule made of bie's layers and PyTorch's modules that computes what
`bie eval` and the C model API compute from the file.

The file is read and checked by libbie (bie_model_load: every tensor against the architecture),
then each architecture item becomes a module of `model.layers` (ModuleList; layers.<i> holds the
tensors layers.<i>.* of the file) and the graph calls them in order, each on its named inputs:

  conv f32 / linear f32        nn.Conv2d / nn.Linear
  conv|linear b1|q4|q8 [bias]  bie.BinaryConv2d / Q4Conv2d / Q8Conv2d / BinaryLinear / Q4Linear /
                               Q8Linear holding the packed weight (qweight; weight is None), in
                               eval mode
  bn                           nn.BatchNorm2d (images) or nn.BatchNorm1d (flat features)
  maxpool, avgpool             nn.MaxPool2d, nn.AvgPool2d (count_include_pad)
  adaptive_avgpool             nn.AdaptiveAvgPool2d
  flatten                      nn.Flatten
  relu, hardtanh, tanh, gelu, gelu_tanh, silu, prelu
                               nn.ReLU, nn.Hardtanh, nn.Tanh, nn.GELU('none' / 'tanh'), nn.SiLU,
                               nn.PReLU
  sign                         bie's Sign (+1 where x >= 0, else -1; straight-through gradient)
  add                          bie's Add (a + b)

A linear layer flattens its input, as in the format: the graph flattens an image before it. The
low-bit layers hold only their packed weights, so the module runs inference (and can be exported
again with bie.export_model); a checkpoint's latent weights and optimizer state are not imported.
"""
import ctypes
import os

import torch
import torch.fx
import torch.nn as nn

from . import _lib
from .functional import QUANT_INT4, packed_shape
from .layers import BinaryConv2d, BinaryLinear, Q4Conv2d, Q4Linear, Q8Conv2d, Q8Linear

__all__ = ["import_model", "Sign", "Add"]

# The architecture items of model format version 1 (a chain; docs/model-format.md).
VERSION_1_KINDS = frozenset({"conv", "linear", "bn", "maxpool", "relu", "sign", "hardtanh"})


class StTensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * _lib.BIE_MAX_DIMS), ("data", ctypes.c_void_p), ("nbytes", ctypes.c_size_t)]


class _SignSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.where(x >= 0, torch.ones_like(x), -torch.ones_like(x))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (x.abs() <= 1).to(g.dtype)


class Sign(nn.Module):
    """The bie model format's sign activation: +1 where x >= 0, else -1, with the straight-through
    gradient 1{|x| <= 1}."""

    def forward(self, x):
        return _SignSTE.apply(x)


class Add(nn.Module):
    """A residual add, as a module (the bie model format's add)."""

    def forward(self, a, b):
        return a + b


def _api():
    lib = _lib.library()
    p = ctypes.c_void_p
    lib.bie_model_load.restype = ctypes.c_int
    lib.bie_model_load.argtypes = [p, ctypes.c_char_p, ctypes.POINTER(p), ctypes.POINTER(p)]
    lib.bie_model_destroy.argtypes = [p]
    lib.bie_safetensors_free.argtypes = [p]
    lib.bie_safetensors_count.restype = ctypes.c_size_t
    lib.bie_safetensors_count.argtypes = [p]
    lib.bie_safetensors_at.restype = ctypes.POINTER(StTensor)
    lib.bie_safetensors_at.argtypes = [p, ctypes.c_size_t]
    lib.bie_safetensors_metadata.restype = ctypes.c_char_p
    lib.bie_safetensors_metadata.argtypes = [p, ctypes.c_char_p]
    return lib


_TORCH_DTYPES = {_lib.DT_F32: torch.float32, _lib.DT_U8: torch.uint8, _lib.DT_I8: torch.int8}


def _read(path):
    """(architecture string, bie.format, {name: tensor}) of a model file that libbie loads."""
    lib = _api()
    ctx = _lib.context()
    model, st = ctypes.c_void_p(), ctypes.c_void_p()
    ctx.check("bie_model_load", lib.bie_model_load(ctx.handle, os.fsencode(path), ctypes.byref(model), ctypes.byref(st)))
    try:
        arch = lib.bie_safetensors_metadata(st, b"bie.arch").decode()
        fmt = lib.bie_safetensors_metadata(st, b"bie.format").decode()
        tensors = {}
        for i in range(lib.bie_safetensors_count(st)):
            t = lib.bie_safetensors_at(st, i).contents
            dtype = _TORCH_DTYPES.get(t.dtype)
            if dtype is None:
                raise ValueError(f"bie import: {path}: tensor {t.name.decode()} has dtype {t.dtype}")
            raw = ctypes.string_at(t.data, t.nbytes)
            shape = tuple(t.shape[d] for d in range(t.ndim))
            tensors[t.name.decode()] = torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape).clone()
    finally:
        lib.bie_model_destroy(model)
        lib.bie_safetensors_free(st)
    return arch, fmt, tensors


def _items(arch):
    """[(kind, positional words, [source values], has_bias)] and the input shape; value 0 is the
    input, i + 1 layer i's output (the string is valid: libbie parsed it)."""
    parts = [p.split() for p in arch.split(";") if p.split()]
    c, h, w = (int(v) for v in parts[0][1:4])
    items = []
    for i, words in enumerate(parts[1:]):
        srcs = [0 if s == "@input" else int(s[1:]) + 1 for s in words if s.startswith("@")]
        words = [s for s in words if not s.startswith("@")]
        has_bias = words[-1] == "bias" and words[0] in ("conv", "linear")
        if has_bias:
            words = words[:-1]
        if words[0] == "add":
            srcs = [i] + srcs if len(srcs) == 1 else srcs
        elif not srcs:
            srcs = [i]
        items.append((words[0], words[1:], srcs, has_bias))
    return (c, h, w), items


_LOWBIT = {("conv", "b1"): BinaryConv2d, ("conv", "q4"): Q4Conv2d, ("conv", "q8"): Q8Conv2d,
           ("linear", "b1"): BinaryLinear, ("linear", "q4"): Q4Linear, ("linear", "q8"): Q8Linear}
_FIELDS = {"b1": "weight_b1", "q4": "weight_s4", "q8": "weight_q8"}
_ACTS = {"relu": nn.ReLU, "hardtanh": nn.Hardtanh, "tanh": nn.Tanh, "silu": nn.SiLU, "sign": Sign,
         "gelu": lambda: nn.GELU(), "gelu_tanh": lambda: nn.GELU(approximate="tanh")}


def _qweight(layer, q, packed):
    """The layer's qweight from the file's packed weight [O, kh, kw, per]: bits / nibbles in the
    layer's packed shape, or 8-bit codes [O, C, kh, kw] ([O, K] for a linear layer)."""
    if layer.is_conv:
        logical = (layer.out_channels, layer.in_channels) + tuple(layer.kernel_size)
    else:
        logical = (layer.out_features, layer.in_features)
    if q == "q8":
        codes = packed.permute(0, 3, 1, 2).contiguous()
        return codes if layer.is_conv else codes.reshape(logical)
    quant = layer.quant
    shape = packed_shape(quant, logical)
    if quant == QUANT_INT4 and tuple(shape) == logical:
        # One channel: the layer reads codes, not nibbles (each byte holds one code, high nibble).
        return (packed.view(torch.int8) >> 4).reshape(logical)
    dtype = torch.int8 if quant == QUANT_INT4 else torch.uint8
    return packed.view(dtype).reshape(shape).contiguous()


def _layer(kind, args, has_bias, tensors, i, shape, flat):
    """(module, output shape, flat) of item i reading a value of the given shape."""
    def t(field):
        return tensors[f"layers.{i}.{field}"]

    c, h, w = shape
    if kind in ("conv", "linear"):
        q, o = args[0], int(args[1])
        if kind == "conv":
            k = int(args[2])
            s = int(args[3]) if len(args) > 3 else 1
            p = int(args[4]) if len(args) > 4 else k // 2
            out, oflat = (o, (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1), False
        else:
            features = c * h * w
            out, oflat = (o, 1, 1), True
        if q == "f32":
            m = nn.Conv2d(c, o, k, s, p) if kind == "conv" else nn.Linear(features, o)
            with torch.no_grad():
                m.weight.copy_(t("weight").reshape(m.weight.shape))
                m.bias.copy_(t("bias"))
            return m, out, oflat
        cls = _LOWBIT[(kind, q)]
        m = cls(c, o, k, s, p, bias=has_bias) if kind == "conv" else cls(features, o, bias=has_bias)
        with torch.no_grad():
            m.bias_a.copy_(t("bias_a"))
            m.scale_a.copy_(t("scale_a").reshape(()))
            m.scale_w.copy_(t("scale_w").reshape(()))
            if has_bias:
                m.bias.copy_(t("bias"))
        m.qweight = _qweight(m, q, t(_FIELDS[q]))
        m.weight = None
        m.weight_grad = None
        return m.eval(), out, oflat
    if kind == "bn":
        m = nn.BatchNorm1d(c) if flat else nn.BatchNorm2d(c)
        with torch.no_grad():
            m.weight.copy_(t("gamma"))
            m.bias.copy_(t("beta"))
            m.running_mean.copy_(t("running_mean"))
            m.running_var.copy_(t("running_var"))
        return m, shape, flat
    if kind in ("maxpool", "avgpool"):
        k = int(args[0])
        s = int(args[1]) if len(args) > 1 else k
        p = int(args[2]) if len(args) > 2 else 0
        m = nn.MaxPool2d(k, s, p) if kind == "maxpool" else nn.AvgPool2d(k, s, p)
        return m, (c, (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1), False
    if kind == "adaptive_avgpool":
        oh = int(args[0])
        ow = int(args[1]) if len(args) > 1 else oh
        return nn.AdaptiveAvgPool2d((oh, ow)), (c, oh, ow), False
    if kind == "flatten":
        return nn.Flatten(), (c * h * w, 1, 1), True
    if kind == "prelu":
        n = int(args[0])
        m = nn.PReLU(n)
        with torch.no_grad():
            m.weight.copy_(t("weight"))
        return m, shape, flat
    if kind == "add":
        return Add(), shape, flat
    return _ACTS[kind](), shape, flat


def import_model(path):
    """Reads the bie model file at `path` (packed, or a checkpoint) and returns a
    torch.fx.GraphModule in eval mode that computes the model's logits from x [N, C, H, W]
    (model.input_shape is (C, H, W); model.arch the architecture string)."""
    arch, fmt, tensors = _read(path)
    if fmt == "checkpoint":
        raise ValueError(f"bie import: {path} is a checkpoint; import the packed model (bie train --out)")
    (c, h, w), items = _items(arch)
    shapes, flats = [(c, h, w)], [False]
    modules = []
    for i, (kind, args, srcs, has_bias) in enumerate(items):
        m, shape, flat = _layer(kind, args, has_bias, tensors, i, shapes[srcs[0]], flats[srcs[0]])
        modules.append(m)
        shapes.append(shape)
        flats.append(flat)
    root = nn.Module()
    root.layers = nn.ModuleList(modules)
    graph = torch.fx.Graph()
    values = [graph.placeholder("x")]
    for i, (kind, args, srcs, _) in enumerate(items):
        inputs = [values[s] for s in srcs]
        if kind == "linear" and not flats[srcs[0]]:  # the format's linear layer flattens its input
            inputs = [graph.call_function(torch.flatten, (inputs[0], 1))]
        values.append(graph.call_module(f"layers.{i}", tuple(inputs)))
    graph.output(values[-1])
    model = torch.fx.GraphModule(root, graph, class_name="BieModel")
    model.input_shape = (c, h, w)
    model.arch = arch
    return model.eval()
