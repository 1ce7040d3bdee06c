# SPDX-License-Identifier: Apache-2.0
"""Bitorch Engine's names, call signatures and helpers on top of bie's modules, so that code
written for bitorch_engine runs after changing its imports (python/README.md has the table):

- layer classes under Bitorch Engine's names: BinaryLinearCuda / BinaryLinearCutlass and
  BinaryConv2dCutlass (int8 latent weights, as Bitorch Engine's prepare_params makes them; trained
  by DiodeMix's sign flips), Q4LinearCutlass, Q8LinearCutlass, Q4Conv2dCutlass, and the CPU
  layers BinaryLinearCPP / BinaryConv2dCPP with their unscaled semantics (the raw +-1 dot
  products, forward only; the conv pads with -1);
- utils.model_helper: flatten_x, unflatten_x, pad_embedding_dim, init_weight, save_checkpoint,
  load_checkpoint (and prepare_bie_layers, pack_bie_layers in bie.model_helper);
- utils.convert: collect_layers, replace_layers(module, names_to_replace, class_, replace_fn),
  quantize_linear_with_binary_linear_cuda, quantize_linear_with_q4_linear_cutlass (and the MPQ
  variant, which bie refuses: it has no weight-only LLM layers);
- the checks that keep a state_dict of one layer kind out of another, and qweight's form.
"""
import torch
import torch.nn as nn

from . import functional as F
from .functional import PAD_MINUS_ONE, QUANT_BINARY, QUANT_INT4, QUANT_INT8
from .layers import BinaryConv2d, BinaryLinear, Q4Conv2d, Q4Linear, Q8Conv2d, Q8Linear
from .model_helper import pack_bie_layers, prepare_bie_layers

__all__ = ["BinaryLinearCuda", "BinaryLinearCutlass", "BinaryLinearCPP", "BinaryConv2dCutlass", "BinaryConv2dCPP",
           "Q4LinearCutlass", "Q8LinearCutlass", "Q4Conv2dCutlass", "flatten_x", "unflatten_x", "pad_embedding_dim",
           "init_weight", "save_checkpoint", "load_checkpoint", "collect_layers", "replace_layers",
           "quantize_linear_with_binary_linear_cuda", "quantize_linear_with_q4_linear_cutlass",
           "quantize_linear_with_mpq_linear_cuda", "get_mpq_config"]

_QNAMES = {QUANT_BINARY: "binary", QUANT_INT4: "4-bit", QUANT_INT8: "8-bit"}


# --- the layer kind of a state_dict, and packed weights' forms ---------------------------------------

def _logical_shape(layer):
    if layer.is_conv:
        return (layer.out_channels, layer.in_channels, *layer.kernel_size)
    return (layer.out_features, layer.in_features)


def _qweight_forms(layer):
    """(dtype, shape) pairs a qweight of this layer may have."""
    shape = _logical_shape(layer)
    if layer.quant == QUANT_BINARY:
        return [(torch.uint8, F.packed_shape(QUANT_BINARY, shape))]
    if layer.quant == QUANT_INT4:
        return [(torch.int8, F.packed_shape(QUANT_INT4, shape)), (torch.int8, shape)]
    return [(torch.int8, shape)]


def _qweight_problem(layer, q):
    forms = _qweight_forms(layer)
    if (q.dtype, tuple(q.shape)) in [(d, tuple(s)) for d, s in forms]:
        return None
    want = " or ".join(f"{str(d).replace('torch.', '')} {tuple(s)}" for d, s in forms)
    return (f"a {type(layer).__name__} ({_QNAMES[layer.quant]}) keeps qweight as {want}, got "
            f"{str(q.dtype).replace('torch.', '')} {tuple(q.shape)}")


def check_qweight(layer, x):
    """Raises unless x is a packed weight of this layer's kind and shape."""
    if not isinstance(x, torch.Tensor):
        raise TypeError("bie: set_quantized_weight_data takes a tensor")
    p = _qweight_problem(layer, x)
    if p:
        raise ValueError("bie: " + p)


def state_dict_kind_error(layer, sd, prefix):
    """A message when the state_dict entries under `prefix` belong to another kind of layer (its
    saved kind, or the forms of its weight and qweight), else None."""
    name = f"{prefix.rstrip('.') or type(layer).__name__}"
    kind = sd.get(prefix + "_extra_state")
    mine = f"a {_QNAMES[layer.quant]} {'conv2d' if layer.is_conv else 'linear'} layer"
    if kind is not None:
        if not (isinstance(kind, torch.Tensor) and kind.numel() == 2):
            return f"{name}: the state_dict's layer kind {kind!r} is not one of bie's"
        q, conv = int(kind[0]), bool(kind[1])
        if (q, conv) != (int(layer.quant), bool(layer.is_conv)):
            theirs = f"a {_QNAMES.get(q, q)} {'conv2d' if conv else 'linear'} layer"
            return f"{name}: this is {mine} ({type(layer).__name__}); the state_dict is of {theirs}"
    w, q = sd.get(prefix + "weight"), sd.get(prefix + "qweight")
    if w is not None:
        if tuple(w.shape) != _logical_shape(layer):
            return f"{name}: weight has shape {tuple(w.shape)}; this {type(layer).__name__} has {_logical_shape(layer)}"
        if w.dtype == torch.int8 and layer.quant != QUANT_BINARY and prefix + "eps" not in sd:
            return (f"{name}: an int8 latent weight without eps is a binary layer's (Bitorch Engine's), but this is "
                    f"{mine}")
        if not (w.dtype.is_floating_point or w.dtype == torch.int8):
            return f"{name}: weight of dtype {w.dtype} is not a weight of {mine}"
    if q is not None:
        p = _qweight_problem(layer, q)
        if p:
            return f"{name}: {p}"
    return None


# --- layer classes under Bitorch Engine's names ------------------------------------------------------

class BinaryLinearCuda(BinaryLinear):
    """Bitorch Engine's BinaryLinearCuda(input_features, out_features, device=None, dtype=torch.float,
    symmetric=True, bmm_type=BMM.ADAPTIVE): bie.BinaryLinear with its int8 latent weight (made by
    prepare_params; latent_int8=False keeps a float latent weight)."""

    def __init__(self, *args, latent_int8=True, **kwargs):
        super().__init__(*args, latent_int8=latent_int8, **kwargs)


BinaryLinearCutlass = BinaryLinearCuda


class BinaryConv2dCutlass(BinaryConv2d):
    """Bitorch Engine's BinaryConv2dCutlass(in_channels, out_channels, kernel_size, stride, padding,
    dilation, device=None, dtype=torch.float, symmetric=True): bie.BinaryConv2d with its int8 latent
    weight (a true NCHW cross-correlation; docs/semantics.md)."""

    def __init__(self, *args, latent_int8=True, **kwargs):
        super().__init__(*args, latent_int8=latent_int8, **kwargs)


Q4LinearCutlass = Q4Linear
Q8LinearCutlass = Q8Linear
Q4Conv2dCutlass = Q4Conv2d
Q8Conv2dCutlass = Q8Conv2d


class _Unscaled(torch.autograd.Function):
    """The raw +-1 dot products of a CPP layer (forward only, as in Bitorch Engine)."""

    @staticmethod
    def forward(ctx, x, weight, run):
        return run(x, weight)

    @staticmethod
    def backward(ctx, g):
        raise RuntimeError("bie: Bitorch Engine's CPP layers are inference-only (their outputs are the unscaled "
                           "+-1 dot products): train with BinaryLinear / BinaryConv2d (or BinaryLinearCuda)")


def _ones(x):
    return torch.ones((), dtype=torch.float32, device=x.device)


class BinaryLinearCPP(BinaryLinear):
    """Bitorch Engine's BinaryLinearCPP: y = sign(x) . sign(W)^T, the raw +-1 dot products as float32
    (no scales, no bias_a), forward only."""

    def forward(self, x):
        self._check_forward(x)
        w = self.opt_weight
        return _Unscaled.apply(x, w, lambda a, b: F.linear_forward(QUANT_BINARY, a, b, _ones(a), _ones(a),
                                                                   out_dtype=torch.float32))


class BinaryConv2dCPP(BinaryConv2d):
    """Bitorch Engine's BinaryConv2dCPP: the raw +-1 cross-correlation (no scales, no bias_a) as
    float32, padded with -1 as its im2col pads, forward only."""

    def __init__(self, *args, pad_value=PAD_MINUS_ONE, **kwargs):
        super().__init__(*args, pad_value=pad_value, **kwargs)

    def forward(self, x):
        self._check_forward(x)
        w = self.opt_weight

        def run(a, b):
            return F.conv2d_forward(QUANT_BINARY, a, b, _ones(a), _ones(a), None, self.kernel_size, self.stride,
                                    self.padding, self.dilation, self.pad_value, out_dtype=torch.float32)

        return _Unscaled.apply(x, w, run)


# --- utils.model_helper -----------------------------------------------------------------------------

def flatten_x(x):
    """[..., F] -> ([prod(...), F], list(...)), as Bitorch Engine's flatten_x."""
    shape = list(x.size()[:-1])
    return x.reshape(-1, x.size(-1)), shape


def unflatten_x(x, shape):
    """The inverse of flatten_x: [prod(shape), F] -> [*shape, F]."""
    return x.view(list(shape) + [x.size(-1)])


def pad_embedding_dim(weight):
    """The table [V, D] padded with -1 columns to D a multiple of 8 (Bitorch Engine's helper)."""
    pad = (-weight.shape[1]) % 8
    if not pad:
        return weight
    return torch.cat([weight, -torch.ones((weight.shape[0], pad), dtype=weight.dtype, device=weight.device)], dim=1)


def init_weight(weight, cls=nn.Parameter):
    """(int8 latent weight as cls, scale_w = mean|W|) from a float weight: Bitorch Engine's init_weight
    (bie centres and scales by max |W - mean| where Bitorch Engine took the signed maximum;
    docs/semantics.md)."""
    scale = weight.detach().to(torch.float32).abs().mean().to(weight.device)
    return cls(F.weight_to_latent_int8(weight), requires_grad=False), scale


def save_checkpoint(model, name, qweight_only=True):
    """Packs the bie layers (pack_bie_layers) and saves {'state_dict': model.state_dict()} to `name`."""
    pack_bie_layers(model, qweight_only)
    torch.save({"state_dict": model.state_dict()}, name)


def load_checkpoint(model, checkpoint_path, qweight_only=True):
    """Packs the bie layers, then loads a save_checkpoint file (non-strictly, as Bitorch Engine
    does: keys may be missing, but a tensor of another layer kind or shape is an error)."""
    pack_bie_layers(model, qweight_only)
    checkpoint = torch.load(checkpoint_path, map_location="cpu")
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise ValueError(f"bie: {checkpoint_path} is not a checkpoint of save_checkpoint (no 'state_dict' entry)")
    return model.load_state_dict(checkpoint["state_dict"], strict=False)


# --- utils.convert ----------------------------------------------------------------------------------

def collect_layers(module, layer_types=None, parent_name=""):
    """{qualified name: layer} of the layers of exactly the given types (default [nn.Linear])."""
    layer_types = [nn.Linear] if layer_types is None else list(layer_types)
    if type(module) in layer_types:
        return {parent_name: module}
    out = {}
    for name, child in module.named_children():
        out.update(collect_layers(child, layer_types, f"{parent_name}.{name}" if parent_name else name))
    return out


def replace_layers(module, names_to_replace, class_, replace_fn, parent_name=""):
    """Bitorch Engine's utils.convert.replace_layers: replaces (recursively, in place) every layer
    whose qualified name is in names_to_replace by replace_fn(layer), which must return a class_;
    returns the new layers. (bie.replace_layers(model, "binary", ...) converts by kind instead.)"""
    if isinstance(names_to_replace, str):
        raise TypeError("bie: names_to_replace is a collection of qualified names, e.g. [\"2\"] or collect_layers(m)")
    if not isinstance(class_, type):
        raise TypeError(f"bie: class_ must be a class, got {class_!r}")
    if not callable(replace_fn):
        raise TypeError("bie: replace_fn must be a function taking the old layer and returning the new one")
    if isinstance(module, class_):
        return []
    names = set(names_to_replace)
    replaced = []
    for child_name, child in list(module.named_children()):
        full = f"{parent_name}.{child_name}" if parent_name else child_name
        if full in names:
            new = replace_fn(child)
            if not isinstance(new, class_):
                raise TypeError(f"bie: replace_fn returned a {type(new).__name__} for {full}, not a {class_.__name__}")
            setattr(module, child_name, new)
            replaced.append(new)
        elif not isinstance(child, class_):
            replaced.extend(replace_layers(child, names, class_, replace_fn, full))
    return replaced


def _simple_linear_fn(cls):
    return lambda old: cls(old.in_features, old.out_features)


def quantize_linear_with_binary_linear_cuda(module, names_to_replace, parent_name=""):
    """Replaces the named nn.Linear layers by new BinaryLinearCuda layers (fresh weights, as in
    Bitorch Engine; bie.replace_layers(model, "binary") copies the weights instead)."""
    return replace_layers(module, names_to_replace, BinaryLinearCuda, _simple_linear_fn(BinaryLinearCuda), parent_name)


def quantize_linear_with_q4_linear_cutlass(module, names_to_replace, parent_name=""):
    """Replaces the named nn.Linear layers by new Q4LinearCutlass layers (fresh weights)."""
    return replace_layers(module, names_to_replace, Q4LinearCutlass, _simple_linear_fn(Q4LinearCutlass), parent_name)


_NO_MPQ = ("bie has no MPQ / MBWQ layers (Bitorch Engine's weight-only, GPTQ-format LLM linears): its layers "
           "quantize activations and weights (binary, 4-bit, 8-bit)")


def get_mpq_config(mpq_strategy=None):
    raise NotImplementedError("bie: " + _NO_MPQ)


def quantize_linear_with_mpq_linear_cuda(module, names_to_replace, mpq_strategy=None, dtype=torch.bfloat16,
                                         parent_name=""):
    raise NotImplementedError("bie: " + _NO_MPQ + "; quantize_linear_with_q4_linear_cutlass or "
                              "bie.replace_layers(model, \"q4\") give 4-bit layers")
