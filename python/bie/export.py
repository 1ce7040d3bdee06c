# SPDX-License-Identifier: Apache-2.0
"""Export of a PyTorch model to the packed model file of the `bie` program (safetensors; see
docs/model-format.md), so that `bie eval MODEL` and the C model API run a model trained in PyTorch.

Any model that torch.fx can trace (symbolic_trace; bie's layers are kept whole) exports when its
graph is made of what the bie model format has:

  PyTorch                                                 bie architecture item
  bie.BinaryConv2d / Q4Conv2d / Q8Conv2d (bias or not)    conv b1|q4|q8 OUT K STRIDE PAD [bias]
  bie.BinaryLinear / Q4Linear / Q8Linear (bias or not)    linear b1|q4|q8 OUT [bias]
  nn.Conv2d / nn.Linear (float)                           conv f32 OUT K STRIDE PAD / linear f32 OUT
  nn.BatchNorm1d / nn.BatchNorm2d (eps 1e-5)              bn
  nn.MaxPool2d, F.max_pool2d (padding <= K/2)             maxpool K [STRIDE PAD]
  nn.AvgPool2d, F.avg_pool2d                              avgpool K STRIDE PAD
  nn.AdaptiveAvgPool2d, F.adaptive_avg_pool2d             adaptive_avgpool OH OW
  nn.Flatten, torch.flatten(x, 1), x.view(x.size(0), -1)  flatten
  nn.ReLU, nn.Hardtanh(-1, 1), nn.Tanh, nn.GELU, nn.SiLU, relu, hardtanh, tanh, gelu|gelu_tanh, silu
    and their functional forms
  nn.PReLU (1 or C slopes)                                prelu N
  a + b, torch.add, x.add(y)                              add @I @J (a residual add)
  nn.Identity, nn.Dropout, x.contiguous()                 (nothing)
  bie's Sign and Add modules (made by bie.import_model)   sign, add

Each layer reads the previous item's output or names its inputs ("@J"), so shortcuts export as
they are. Convolutions and pooling windows must be square with one stride and one padding,
dilation 1, groups 1, floor mode (no ceil_mode); average pooling counts padding
(count_include_pad, the default) unless it has none; bie's binary convolutions must pad with zeros
(PAD_ZERO, the default); linear layers take flat [N, F] inputs. The low-bit layers must have run
(scale_a set). The file holds the packed weights exactly as the layers use them in eval mode, so
`bie eval` computes what model.eval() computes (float layers up to float rounding: OpenBLAS
against PyTorch). bie.import_model reads such a file back into an nn.Module.
"""
import ctypes
import operator
import os

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as Fn

from . import _lib
from . import functional as F
from .functional import PAD_ZERO, QUANT_BINARY, QUANT_INT4, QUANT_INT8
from .layers import BieLayer
from .model_import import VERSION_1_KINDS, Add, Sign, StTensor

__all__ = ["export_model", "architecture"]

_Q = {QUANT_BINARY: "b1", QUANT_INT4: "q4", QUANT_INT8: "q8"}
_FIELD = {QUANT_BINARY: "weight_b1", QUANT_INT4: "weight_s4", QUANT_INT8: "weight_q8"}
_LOGICAL = {QUANT_BINARY: "b1", QUANT_INT4: "s4", QUANT_INT8: "i8"}


class _Tracer(torch.fx.Tracer):
    """torch.fx's tracer, keeping bie's layers and modules whole (their forward calls libbie)."""

    def is_leaf_module(self, m, qualname):
        return isinstance(m, (BieLayer, Sign, Add)) or super().is_leaf_module(m, qualname)


def _trace(model):
    try:
        graph = _Tracer().trace(model)
    except Exception as e:  # torch.fx raises many kinds (TraceError, TypeError, NotImplementedError ...)
        raise ValueError(f"bie export: torch.fx cannot trace the model ({type(e).__name__}: {e})") from e
    gm = torch.fx.GraphModule(model, graph)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def _square(what, v):
    a, b = (tuple(v) if isinstance(v, (tuple, list)) else (v, v))
    if a != b:
        raise ValueError(f"bie export: {what} must be the same in both directions, is {v}")
    return int(a)


def _conv_geometry(m, where):
    k = _square(f"{where}: kernel_size", m.kernel_size)
    s = _square(f"{where}: stride", m.stride)
    if isinstance(m.padding, str):
        raise ValueError(f"bie export: {where}: string padding is not supported")
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
        return codes.permute(0, 2, 3, 1).contiguous()
    if tuple(w.shape) == logical and w.dtype == torch.int8 and m.quant == QUANT_INT4:
        w = F.pack_weight(QUANT_INT4, w)  # a one-channel layer keeps codes; the file wants nibbles
    per = w.shape[-1]
    return w.reshape(o, kh, kw, per).contiguous().view(torch.uint8)


def _f32(t):
    return t.detach().to("cpu", torch.float32).contiguous()


def _call_args(node, names, defaults):
    """node's arguments by name: positional ones in the order of `names`, then keywords."""
    out = dict(defaults)
    for name, v in zip(names, node.args):
        out[name] = v
    for k, v in node.kwargs.items():
        if k not in names:
            raise ValueError(f"bie export: {node.name}: argument {k!r} of {node.target} is not supported")
        out[k] = v
    return out


_FUNCTIONS = {
    # function: (names, defaults, kind)
    Fn.relu: (("input", "inplace"), {"inplace": False}, "relu"),
    torch.relu: (("input",), {}, "relu"),
    Fn.hardtanh: (("input", "min_val", "max_val", "inplace"), {"min_val": -1.0, "max_val": 1.0, "inplace": False},
                  "hardtanh"),
    torch.tanh: (("input",), {}, "tanh"),
    Fn.tanh: (("input",), {}, "tanh"),
    Fn.gelu: (("input", "approximate"), {"approximate": "none"}, "gelu"),
    Fn.silu: (("input", "inplace"), {"inplace": False}, "silu"),
    Fn.max_pool2d: (("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices"),
                    {"stride": None, "padding": 0, "dilation": 1, "ceil_mode": False, "return_indices": False},
                    "maxpool"),
    Fn.avg_pool2d: (("input", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad",
                     "divisor_override"),
                    {"stride": None, "padding": 0, "ceil_mode": False, "count_include_pad": True,
                     "divisor_override": None}, "avgpool"),
    Fn.adaptive_avg_pool2d: (("input", "output_size"), {}, "adaptive_avgpool"),
    torch.flatten: (("input", "start_dim", "end_dim"), {"start_dim": 0, "end_dim": -1}, "flatten"),
    operator.add: (("input", "other"), {}, "add"),
    operator.iadd: (("input", "other"), {}, "add"),
    torch.add: (("input", "other", "alpha"), {"alpha": 1}, "add"),
}

_METHODS = {
    "relu": (("input",), {}, "relu"),
    "relu_": (("input",), {}, "relu"),
    "tanh": (("input",), {}, "tanh"),
    "tanh_": (("input",), {}, "tanh"),
    "flatten": (("input", "start_dim", "end_dim"), {"start_dim": 0, "end_dim": -1}, "flatten"),
    "add": (("input", "other", "alpha"), {"alpha": 1}, "add"),
    "add_": (("input", "other", "alpha"), {"alpha": 1}, "add"),
    "view": (None, None, "view"),
    "reshape": (None, None, "view"),
    "contiguous": (("input",), {}, "identity"),
}


class _Value:
    """A tensor of the graph: the item that computes it (-1: the input), its per-sample shape
    (C, H, W) and whether PyTorch holds it flat ([N, F]) or as an image ([N, C, H, W])."""

    def __init__(self, index, shape, flat):
        self.index, self.shape, self.flat = index, tuple(int(v) for v in shape), flat


class _Builder:
    def __init__(self, input_shape):
        self.items = ["input {} {} {}".format(*input_shape)]
        self.kinds = []
        self.tensors, self.logical = [], {}

    def ref(self, v):
        return "@input" if v.index < 0 else f"@{v.index}"

    def emit(self, text, srcs, shape, flat, kind):
        """Appends an item reading the values srcs; the previous item's output goes unnamed (an
        add names the other input, or both when neither is the previous item)."""
        i = len(self.items) - 1
        prev = i - 1
        if kind == "add":
            a, c = srcs
            refs = [c] if a.index == prev else [a] if c.index == prev else [a, c]
        else:
            refs = [] if srcs[0].index == prev else srcs
        self.items.append(" ".join([text] + [self.ref(r) for r in refs]))
        self.kinds.append(kind)
        return _Value(i, shape, flat)

    def add_tensors(self, i, pairs):
        self.tensors += [(f"layers.{i}.{name}", t) for name, t in pairs]


def _pool_size(k, s, p, h, w):
    return ((h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1)


def _pool_item(where, kind, k, s, p, v):
    k = _square(f"{where}: kernel_size", k)
    s = k if s is None or (isinstance(s, (tuple, list)) and len(s) == 0) else _square(f"{where}: stride", s)
    p = _square(f"{where}: padding", p)
    if p > k // 2:
        raise ValueError(f"bie export: {where}: padding must be at most half the window")
    if v.flat:
        raise ValueError(f"bie export: {where}: pooling needs an image [N, C, H, W]")
    c, h, w = v.shape
    oh, ow = _pool_size(k, s, p, h, w)
    if oh < 1 or ow < 1:
        raise ValueError(f"bie export: {where}: a {k}x{k} window does not fit the {h}x{w} input")
    text = f"maxpool {k}" if kind == "maxpool" and s == k and p == 0 else f"{kind} {k} {s} {p}"
    return text, (c, oh, ow)


def _adaptive_item(where, size, v):
    if v.flat:
        raise ValueError(f"bie export: {where}: pooling needs an image [N, C, H, W]")
    c, h, w = v.shape
    oh, ow = (size, size) if not isinstance(size, (tuple, list)) else size
    oh, ow = h if oh is None else int(oh), w if ow is None else int(ow)
    if oh > h or ow > w:
        raise ValueError(f"bie export: {where}: an adaptive pool to {oh}x{ow} of a {h}x{w} input")
    return f"adaptive_avgpool {oh} {ow}", (c, oh, ow)


def _module(b, m, v, where):
    """The item for module m reading value v; returns the new value (or v itself for no-ops)."""
    i = len(b.items) - 1
    if isinstance(m, (nn.Identity, nn.Dropout)):
        return v
    if isinstance(m, BieLayer):
        if getattr(m, "pad_value", PAD_ZERO) != PAD_ZERO:
            raise ValueError(f"bie export: {where}: binary convolutions in bie model files pad with zeros")
        if float(m.scale_a.detach()) <= 0:
            raise ValueError(f"bie export: {where}: scale_a is not set (run the model on data first)")
        bias = " bias" if m.bias is not None else ""
        if m.is_conv:
            k, s, p = _conv_geometry(m, where)
            if v.flat or m.in_channels != v.shape[0]:
                raise ValueError(f"bie export: {where}: takes {m.in_channels} channels, gets {v.shape}")
            out = (m.out_channels,) + _pool_size(k, s, p, v.shape[1], v.shape[2])
            nv = b.emit(f"conv {_Q[m.quant]} {m.out_channels} {k} {s} {p}{bias}", [v], out, False, "conv")
            cin, kk = m.in_channels, k
        else:
            if not v.flat or m.in_features != v.shape[0]:
                raise ValueError(f"bie export: {where}: takes {m.in_features} flat features, gets {v.shape}"
                                 f"{'' if v.flat else ' (an image: flatten it first)'}")
            nv = b.emit(f"linear {_Q[m.quant]} {m.out_features}{bias}", [v], (m.out_features, 1, 1), True, "linear")
            cin, kk = m.in_features, 1
        b.add_tensors(i, [("bias_a", _f32(m.bias_a)), ("scale_a", _f32(m.scale_a).reshape(1)),
                          ("scale_w", _f32(m.scale_w).reshape(1)), (_FIELD[m.quant], _packed_weight(m))])
        if m.bias is not None:
            b.add_tensors(i, [("bias", _f32(m.bias))])
        b.logical[f"layers.{i}.{_FIELD[m.quant]}"] = f"{_LOGICAL[m.quant]} [{nv.shape[0]},{cin},{kk},{kk}] ohwi"
        return nv
    if type(m) is nn.Conv2d:
        if m.groups != 1 or m.padding_mode != "zeros":
            raise ValueError(f"bie export: {where}: groups must be 1 and padding zeros")
        k, s, p = _conv_geometry(m, where)
        if v.flat or m.in_channels != v.shape[0]:
            raise ValueError(f"bie export: {where}: takes {m.in_channels} channels, gets {v.shape}")
        out = (m.out_channels,) + _pool_size(k, s, p, v.shape[1], v.shape[2])
        nv = b.emit(f"conv f32 {m.out_channels} {k} {s} {p}", [v], out, False, "conv")
        bias = m.bias if m.bias is not None else torch.zeros(m.out_channels)
        b.add_tensors(i, [("weight", _f32(m.weight)), ("bias", _f32(bias))])
        return nv
    if type(m) is nn.Linear:
        if not v.flat or m.in_features != v.shape[0]:
            raise ValueError(f"bie export: {where}: takes {m.in_features} flat features, gets {v.shape}"
                             f"{'' if v.flat else ' (an image: flatten it first)'}")
        nv = b.emit(f"linear f32 {m.out_features}", [v], (m.out_features, 1, 1), True, "linear")
        bias = m.bias if m.bias is not None else torch.zeros(m.out_features)
        b.add_tensors(i, [("weight", _f32(m.weight)), ("bias", _f32(bias))])
        return nv
    if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
        if abs(m.eps - 1e-5) > 1e-12 or not m.track_running_stats:
            raise ValueError(f"bie export: {where}: needs eps = 1e-5 and running statistics")
        if isinstance(m, nn.BatchNorm2d) == v.flat or m.num_features != v.shape[0]:
            raise ValueError(f"bie export: {where}: {type(m).__name__}({m.num_features}) of a value of shape {v.shape}")
        n = m.num_features
        gamma = m.weight if m.affine else torch.ones(n)
        beta = m.bias if m.affine else torch.zeros(n)
        nv = b.emit("bn", [v], v.shape, v.flat, "bn")
        b.add_tensors(i, [("gamma", _f32(gamma)), ("beta", _f32(beta)), ("running_mean", _f32(m.running_mean)),
                          ("running_var", _f32(m.running_var))])
        return nv
    if isinstance(m, nn.MaxPool2d):
        if _square(f"{where}: dilation", m.dilation) != 1 or m.ceil_mode or m.return_indices:
            raise ValueError(f"bie export: {where}: only max pooling with dilation 1 and floor mode")
        text, shape = _pool_item(where, "maxpool", m.kernel_size, m.stride, m.padding, v)
        return b.emit(text, [v], shape, False, "maxpool")
    if isinstance(m, nn.AvgPool2d):
        if m.ceil_mode or m.divisor_override is not None or (not m.count_include_pad and m.padding != 0):
            raise ValueError(f"bie export: {where}: only average pooling in floor mode that counts its padding")
        text, shape = _pool_item(where, "avgpool", m.kernel_size, m.stride, m.padding, v)
        return b.emit(text, [v], shape, False, "avgpool")
    if isinstance(m, nn.AdaptiveAvgPool2d):
        text, shape = _adaptive_item(where, m.output_size, v)
        return b.emit(text, [v], shape, False, "adaptive_avgpool")
    if isinstance(m, nn.Flatten):
        if m.start_dim != 1 or m.end_dim != -1:
            raise ValueError(f"bie export: {where}: only nn.Flatten(1, -1)")
        return _flatten(b, v)
    if isinstance(m, nn.PReLU):
        if m.num_parameters not in (1, v.shape[0]):
            raise ValueError(f"bie export: {where}: PReLU with {m.num_parameters} slopes on {v.shape[0]} channels")
        nv = b.emit(f"prelu {m.num_parameters}", [v], v.shape, v.flat, "prelu")
        b.add_tensors(i, [("weight", _f32(m.weight))])
        return nv
    if isinstance(m, nn.Hardtanh) and not (m.min_val == -1 and m.max_val == 1):
        raise ValueError(f"bie export: {where}: Hardtanh({m.min_val}, {m.max_val}): only the bounds -1, 1")
    simple = {nn.ReLU: "relu", nn.Hardtanh: "hardtanh", nn.Tanh: "tanh", nn.SiLU: "silu", Sign: "sign"}
    for cls, kind in simple.items():
        if isinstance(m, cls):
            return b.emit(kind, [v], v.shape, v.flat, kind)
    if isinstance(m, nn.GELU):
        kind = {"none": "gelu", "tanh": "gelu_tanh"}[getattr(m, "approximate", "none")]
        return b.emit(kind, [v], v.shape, v.flat, kind)
    raise ValueError(f"bie export: {where}: {type(m).__name__} has no counterpart in the bie model format")


def _flatten(b, v):
    if v.flat:
        return v
    return b.emit("flatten", [v], (v.shape[0] * v.shape[1] * v.shape[2], 1, 1), True, "flatten")


def _add(b, x, y, where):
    if not isinstance(x, _Value) or not isinstance(y, _Value):
        raise ValueError(f"bie export: {where}: adds a constant; only adds of two tensors are in the format")
    if x.shape != y.shape or x.flat != y.flat:
        raise ValueError(f"bie export: {where}: adds values of shapes {x.shape} and {y.shape}")
    return b.emit("add", [x, y], x.shape, x.flat, "add")


def _function(b, kind, args, where):
    """The item for a functional call of the given kind, args by name (graph values resolved)."""
    x = args["input"]
    if not isinstance(x, _Value):
        raise ValueError(f"bie export: {where}: its input is not a tensor of the model")
    if kind in ("relu", "tanh", "silu"):
        return b.emit(kind, [x], x.shape, x.flat, kind)
    if kind == "hardtanh":
        if args["min_val"] != -1 or args["max_val"] != 1:
            raise ValueError(f"bie export: {where}: hardtanh({args['min_val']}, {args['max_val']}): only -1, 1")
        return b.emit(kind, [x], x.shape, x.flat, kind)
    if kind == "gelu":
        kind = {"none": "gelu", "tanh": "gelu_tanh"}[args["approximate"]]
        return b.emit(kind, [x], x.shape, x.flat, kind)
    if kind == "maxpool":
        if _square(f"{where}: dilation", args["dilation"]) != 1 or args["ceil_mode"] or args["return_indices"]:
            raise ValueError(f"bie export: {where}: only max pooling with dilation 1 and floor mode")
        text, shape = _pool_item(where, "maxpool", args["kernel_size"], args["stride"], args["padding"], x)
        return b.emit(text, [x], shape, False, "maxpool")
    if kind == "avgpool":
        if args["ceil_mode"] or args["divisor_override"] is not None or (
                not args["count_include_pad"] and args["padding"] != 0):
            raise ValueError(f"bie export: {where}: only average pooling in floor mode that counts its padding")
        text, shape = _pool_item(where, "avgpool", args["kernel_size"], args["stride"], args["padding"], x)
        return b.emit(text, [x], shape, False, "avgpool")
    if kind == "adaptive_avgpool":
        text, shape = _adaptive_item(where, args["output_size"], x)
        return b.emit(text, [x], shape, False, "adaptive_avgpool")
    if kind == "flatten":
        if args["start_dim"] != 1 or args["end_dim"] != -1:
            raise ValueError(f"bie export: {where}: only flatten(x, 1): the batch stays")
        return _flatten(b, x)
    if kind == "add":
        if args.get("alpha", 1) != 1:
            raise ValueError(f"bie export: {where}: add with alpha")
        return _add(b, x, args["other"], where)
    if kind == "identity":
        return x
    raise ValueError(f"bie export: {where}: not in the bie model format")


def _view(b, node, values, where):
    """x.view(N, -1), x.view(-1, F) or x.reshape(...) alike, N the batch size (x.size(0) or
    x.shape[0]) and F the features of one sample: a flatten (other views are refused)."""
    args = [values.get(a, a) if isinstance(a, torch.fx.Node) else a for a in node.args]
    if len(args) == 2 and isinstance(args[1], (tuple, list)):
        args = [args[0]] + list(args[1])
    x, dims = args[0], args[1:]
    if isinstance(x, _Value) and len(dims) == 2 and not node.kwargs:
        features = x.shape[0] * x.shape[1] * x.shape[2]
        if (dims[0] == "batch" and dims[1] in (-1, features)) or (dims[0] == -1 and dims[1] == features):
            return _flatten(b, x)
    raise ValueError(f"bie export: {where}: only view/reshape(x.size(0), -1) (a flatten) is in the format")


def architecture(model, input_shape):
    """(arch string, [(name, tensor)], {name: logical}) for the model, checking every layer."""
    arch, tensors, logical, _ = _describe(model, input_shape)
    return arch, tensors, logical


def _describe(model, input_shape):
    """architecture()'s results and the file's format version."""
    c, h, w = (int(v) for v in input_shape)
    gm = _trace(model)
    b = _Builder((c, h, w))
    values = {}  # node -> _Value, or "batch" for x.size(0) / x.shape[0], or "shape" for x.shape
    out = None
    for node in gm.graph.nodes:
        where = f"{node.name} ({node.op} {getattr(node.target, '__name__', node.target)})"
        if node.op == "placeholder":
            if values:
                raise ValueError(f"bie export: {where}: the model takes more than one input")
            values[node] = _Value(-1, (c, h, w), False)
        elif node.op == "output":
            out = node.args[0]
        elif node.op == "call_module":
            m = gm.get_submodule(node.target)
            where = f"{node.target} ({type(m).__name__})"
            if len(node.args) != 1 or node.kwargs or not isinstance(values.get(node.args[0]), _Value):
                if isinstance(m, Add) and len(node.args) == 2:
                    values[node] = _add(b, values.get(node.args[0]), values.get(node.args[1]), where)
                    continue
                raise ValueError(f"bie export: {where}: takes other arguments than one tensor of the model")
            values[node] = _module(b, m, values[node.args[0]], where)
        elif node.op == "call_method" and node.target == "size" and node.args[1:] in [(0,)]:
            values[node] = "batch"
        elif node.op == "call_function" and node.target is getattr and node.args[1] == "shape":
            values[node] = "shape"
        elif node.op == "call_function" and node.target is operator.getitem and values.get(node.args[0]) == "shape":
            if node.args[1] != 0:
                raise ValueError(f"bie export: {where}: only the batch size of a shape is used")
            values[node] = "batch"
        elif node.op == "call_method" and node.target in ("view", "reshape"):
            values[node] = _view(b, node, values, where)
        elif node.op in ("call_function", "call_method"):
            table = _FUNCTIONS if node.op == "call_function" else _METHODS
            spec = table.get(node.target)
            if spec is None:
                raise ValueError(f"bie export: {where}: has no counterpart in the bie model format")
            names, defaults, kind = spec
            args = _call_args(node, names, defaults)
            args = {k: values.get(a, a) if isinstance(a, torch.fx.Node) else a for k, a in args.items()}
            values[node] = _function(b, kind, args, where)
        else:
            raise ValueError(f"bie export: {where}: {node.op} is not in the bie model format (parameters read "
                             f"directly, outside a module)")
    result = values.get(out) if isinstance(out, torch.fx.Node) else None
    if not isinstance(result, _Value):
        raise ValueError("bie export: the model must return one tensor")
    if result.index < 0:
        raise ValueError("bie export: the model has no layer")
    if result.index != len(b.items) - 2:
        raise ValueError("bie export: the model's output is not its last layer")
    _check_shapes(model, gm, (c, h, w), values)
    arch = "; ".join(b.items)
    return arch, b.tensors, b.logical, _format_version(b.kinds, arch)


def _check_shapes(model, gm, input_shape, values):
    """Runs the traced graph on one sample (eval mode) and checks every value's shape against the
    shape the export derived for it."""
    from torch.fx.passes.shape_prop import ShapeProp
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            ShapeProp(gm).propagate(torch.zeros((1,) + tuple(input_shape)))
    except Exception as e:
        raise ValueError(f"bie export: the model does not run on a {tuple(input_shape)} input ({e})") from e
    finally:
        model.train(was)
    for node, v in values.items():
        if not isinstance(v, _Value) or "tensor_meta" not in node.meta:
            continue
        got = tuple(node.meta["tensor_meta"].shape)[1:]
        want = (v.shape[0],) if v.flat else v.shape
        if got != want:
            raise ValueError(f"bie export: {node.name}: PyTorch computes a value of shape {got}, the export {want}")


def _format_version(kinds, arch):
    v1 = all(k in VERSION_1_KINDS for k in kinds) and "@" not in arch and " bias" not in arch
    v1 = v1 and not any(it.strip().startswith("maxpool") and len(it.split()) > 2 for it in arch.split(";"))
    return 1 if v1 else 2


_ST_DTYPES = {torch.float32: _lib.DT_F32, torch.uint8: _lib.DT_U8, torch.int8: _lib.DT_I8}


def export_model(model, path, input_shape, metadata=None):
    """Writes `model` (see the module's documentation for what it may hold) as a packed bie model
    file at `path`; input_shape is (C, H, W) of one sample. Returns the architecture string."""
    arch, tensors, logical, version = _describe(model, input_shape)
    meta = {"bie.format": "packed", "bie.version": _lib.version(), "bie.format_version": str(version),
            "bie.arch": arch, "bie.latent": "f32",
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
