# SPDX-License-Identifier: Apache-2.0
"""Model-level helpers, as in Bitorch Engine's utils/model_helper and utils/convert."""
import torch.nn as nn

from .layers import BieLayer, BinaryConv2d, BinaryLinear, Q4Conv2d, Q4Linear, Q8Conv2d, Q8Linear

__all__ = ["prepare_bie_layers", "pack_bie_layers", "bie_layers", "replace_layers"]

_KINDS = {
    "binary": (BinaryLinear, BinaryConv2d),
    "q4": (Q4Linear, Q4Conv2d),
    "q8": (Q8Linear, Q8Conv2d),
}


def bie_layers(model):
    """(qualified name, layer) of every bie layer in the model."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, BieLayer)]


def prepare_bie_layers(model, layers=None):
    """Calls prepare_params() on every bie layer and embedding (after construction or after loading
    float weights, before training or inference); `layers` (Bitorch Engine's argument) limits it to
    modules of those classes."""
    from .embedding import BinaryEmbeddingBag, BinaryEmbeddingCuda, Q4Embedding, Q8Embedding
    kinds = tuple(layers) if layers else (BieLayer, BinaryEmbeddingCuda, BinaryEmbeddingBag, Q4Embedding, Q8Embedding)
    for m in model.modules():
        if isinstance(m, kinds):
            m.prepare_params()
    return model


def pack_bie_layers(model, qweight_only=True, layers=None):
    """Packs the weights of every bie layer (generate_quantized_weight); with qweight_only the
    float weights are dropped, leaving an inference-only model whose state_dict holds the packed
    weights. `layers` (Bitorch Engine's argument) limits it to modules of those classes."""
    kinds = tuple(layers) if layers else (BieLayer,)
    for m in model.modules():
        if isinstance(m, kinds) and hasattr(m, "generate_quantized_weight"):
            m.generate_quantized_weight(qweight_only=qweight_only)
    return model


def replace_layers(model, kind="binary", *args, **kwargs):
    """Two signatures:
    - replace_layers(model, names_to_replace, class_, replace_fn, parent_name="") (Bitorch Engine's
      utils.convert.replace_layers, when the second argument is a collection of qualified names):
      see bie.compat.replace_layers;
    - replace_layers(model, kind="binary", linear=True, conv=True, exclude=(), latent_int8=False):
      converts by kind, see _replace_by_kind."""
    if "names_to_replace" in kwargs or not isinstance(kind, str):
        from .compat import replace_layers as by_name
        if "names_to_replace" in kwargs:
            if kind != "binary":
                args = (kind,) + args
            kind = kwargs.pop("names_to_replace")
        return by_name(model, kind, *args, **kwargs)
    return _replace_by_kind(model, kind, *args, **kwargs)


def _replace_by_kind(model, kind="binary", linear=True, conv=True, exclude=(), latent_int8=False):
    """Replaces the nn.Linear and nn.Conv2d layers of `model` (in place) by bie layers of `kind`
    ("binary", "q4" or "q8"), copying their weights (set_weight_data, which runs prepare_params)
    and keeping their output bias. Layers named in `exclude` (qualified names, e.g. the first and
    last layers, which are usually kept in float) are left alone, and so are convolutions bie
    cannot express (groups != 1, a padding mode other than zeros, string padding). Returns the
    list of replaced names."""
    if kind not in _KINDS:
        raise ValueError(f"bie: kind must be one of {sorted(_KINDS)}, got {kind!r}")
    lin_cls, conv_cls = _KINDS[kind]
    extra = {"latent_int8": True} if latent_int8 else {}
    if latent_int8 and kind != "binary":
        raise ValueError("bie: latent_int8 is for binary layers only")
    exclude = set(exclude)
    replaced = []
    for name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if full in exclude or isinstance(child, BieLayer):
                continue
            if linear and type(child) is nn.Linear:
                dev, dt = child.weight.device, child.weight.dtype
                new = lin_cls(child.in_features, child.out_features, device=dev, dtype=dt,
                              bias=child.bias is not None, **extra)
            elif conv and type(child) is nn.Conv2d:
                if child.groups != 1 or child.padding_mode != "zeros" or isinstance(child.padding, str):
                    continue
                dev, dt = child.weight.device, child.weight.dtype
                new = conv_cls(child.in_channels, child.out_channels, child.kernel_size, child.stride, child.padding,
                               child.dilation, device=dev, dtype=dt, bias=child.bias is not None, **extra)
            else:
                continue
            new.set_weight_data(child.weight.detach())
            if child.bias is not None:
                new.bias.data.copy_(child.bias.detach())
            new.train(child.training)
            setattr(parent, child_name, new)
            replaced.append(full)
    return replaced
