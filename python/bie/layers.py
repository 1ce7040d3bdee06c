# SPDX-License-Identifier: Apache-2.0
"""Drop-in modules mirroring Bitorch Engine's layers, with all the math in libbie.

Every layer has
  weight      float latent weight [out, in] / [O, C, kh, kw] (binary layers can hold Bitorch
              Engine's int8 latent form instead: latent_int8=True, see prepare_params)
  bias_a      learnable input shift [in] / [C] (zeros), added to x before quantization
  scale_a     learnable activation scale (a Parameter; 0 until the first forward sets it from
              that input: binary 2*mean|x|, or 4*mean|x| with symmetric=False; n-bit
              2*mean|x|/11.269)
  scale_w     weight scale (a buffer, not trained): binary mean|W|, 4-bit
              max(2*mean|W|/5.6345, eps), 8-bit 2*mean|W|/11.269 (refreshed from the weight on
              every training forward and before packing, as Bitorch Engine's Q8 layer does)
  eps         1e-5
  qweight     the packed weight (binary: uint8 bits; 4-bit: int8 nibbles; 8-bit: int8 codes),
              made by generate_quantized_weight() or, in eval mode, on first use
and the protocol: prepare_params() (call it once after construction or after loading float
weights: prepare_bie_layers does it for a model), generate_quantized_weight(qweight_only=False),
set_activation(x), set_weight_data(x), and opt_weight (the float/latent weight in training mode,
qweight in eval mode). `bias=True` adds a float output bias (not in Bitorch Engine; kept when
replacing an nn.Linear / nn.Conv2d that has one).
"""
import math

import torch
import torch.nn as nn

from . import _plans
from . import functional as F
from .autograd import (BinaryConv2dForward, BinaryLinearForward, Q4Conv2dForward, Q4LinearForward,
                       Q8Conv2dForward, Q8LinearForward)
from .functional import PAD_ZERO, QUANT_BINARY, QUANT_INT4, QUANT_INT8
from . import validate as V
from .bmm import check_bmm_type

__all__ = ["BinaryLinear", "Q4Linear", "Q8Linear", "BinaryConv2d", "Q4Conv2d", "Q8Conv2d", "BieLayer",
           "set_data_parallel"]


_data_parallel = None  # None: automatic (torch.distributed initialised); True / False: forced


def set_data_parallel(enabled=None):
    """Whether training-mode layers take part in data parallelism over the default
    torch.distributed group (None, the default: whenever it is initialised). Then
    - the lazy initial scale_a is the average over the ranks of each rank's first-batch scale, so
      every rank starts alike, as from the combined batch;
    - grad_scale_a, whose straight-through formula divides by sqrt(numel(x)), is rescaled by
      1/sqrt(world_size): after DistributedDataParallel averages it, it equals the gradient of
      one process on the combined batch (the other gradients are linear in the batch already)."""
    global _data_parallel
    _data_parallel = enabled


def _world():
    import torch.distributed as dist
    if _data_parallel is False or not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size()


class _GradScale(torch.autograd.Function):
    """Identity whose gradient is multiplied by `factor`."""

    @staticmethod
    def forward(ctx, t, factor):
        ctx.factor = factor
        return t.view_as(t)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.factor, None


def _dist_mean(t, device):
    """Average of a scalar over the ranks of the data-parallel group (else t)."""
    import torch.distributed as dist
    if _world() == 1:
        return t
    u = t.to(device if dist.get_backend() == "nccl" else "cpu", torch.float64)
    dist.all_reduce(u)
    return (u / dist.get_world_size()).to(torch.float32)


class BieLayer(nn.Module):
    """Common base of the bie layers (not used directly)."""

    quant = None
    is_conv = False

    def _init_common(self, in_size, out_size, device, dtype, symmetric, bias, latent_int8):
        factory = dict(device=device, dtype=dtype)
        self.dtype = dtype
        self.symmetric = symmetric
        self.latent_int8 = bool(latent_int8)
        if self.latent_int8 and self.quant != QUANT_BINARY:
            raise ValueError("bie: the int8 latent weight form is for binary layers only")
        self.bias_a = nn.Parameter(torch.zeros(in_size, **factory))
        self.scale_a = nn.Parameter(torch.tensor(0.0, **factory))
        self.register_buffer("scale_w", torch.tensor(1.0, dtype=torch.float32, device=device))
        self.register_buffer("eps", torch.tensor(1e-5, **factory))
        self.register_buffer("qweight", None)
        self.register_buffer("weight_grad", None, persistent=False)  # int8 latent weight's float gradient
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_size, **factory))
        else:
            self.register_parameter("bias", None)
        self._scale_ready = False
        self._qweight_key = None
        self._runs = _plans.Kept()  # the inference calls' plans (_infer)

    def reset_parameters(self):
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    # --- protocol ---------------------------------------------------------------------------

    def prepare_params(self):
        """Sets scale_w from the float weight; with latent_int8, replaces the float weight by
        Bitorch Engine's int8 latent weight (centred, max-abs scaled to [-127, 127], zeros made
        +-1; its gradient then lives in the float buffer weight_grad). Call it after construction
        and after loading float weights, before training or inference."""
        w = self.weight
        if w is None:
            return
        if self.quant == QUANT_INT8:
            self._q8_scale_key = None
            self._refresh_q8_scale()
        elif w.dtype.is_floating_point:
            s = F.weight_scale_init(self.quant, w)
            with torch.no_grad():
                self.scale_w.copy_(s)
        if self.latent_int8 and w.dtype != torch.int8:
            self.weight = nn.Parameter(F.weight_to_latent_int8(w), requires_grad=False)
        self._qweight_key = None

    def _refresh_q8_scale(self):
        """8-bit layers: scale_w = 2*mean|W|/11.269 of the current weight (recomputed only when the
        weight changed, so that an unchanged weight keeps its packed form)."""
        key = (id(self.weight), self.weight._version)
        if getattr(self, "_q8_scale_key", None) != key:
            F.weight_scale_init(QUANT_INT8, self.weight, out=self.scale_w)  # (on the weight's device, no sync)
            self._q8_scale_key = key

    def _weight_key(self):
        # (the parameter and buffer dicts directly: nn.Module's attribute lookup is slow on a hot path)
        w, sw = self._parameters["weight"], self._buffers["scale_w"]
        return (id(w), w._version, sw._version, sw.data_ptr())

    def generate_quantized_weight(self, qweight_only=False):
        """Packs the weight into qweight (binary: uint8 bits, 4-bit: int8 nibbles, 8-bit: int8
        codes; conv weights OHWI for the packed forms). qweight_only=True drops the float weight."""
        w = self.weight
        if w is None:
            if self.qweight is None:
                raise RuntimeError("bie: this layer has neither a weight nor a qweight")
            return
        if self.quant == QUANT_INT8:
            self._refresh_q8_scale()
            qw = F.quantize_int8(w, self.scale_w)
        elif self.quant == QUANT_INT4 and F.packed_shape(QUANT_INT4, tuple(w.shape)) == tuple(w.shape):
            qw = F.quantize_int8(w, self.scale_w)  # one channel: codes (the packed form would look alike)
        else:
            qw = F.pack_weight(self.quant, w, self.scale_w)
        self.qweight = qw
        self._qweight_key = self._weight_key()
        if qweight_only:
            self.weight = None
            self.weight_grad = None

    @property
    def opt_weight(self):
        """The weight the forward uses: the float (or int8 latent) weight in training mode,
        qweight in eval mode (generated on first use, and again after the weight changed)."""
        w, q = self._parameters.get("weight"), self._buffers.get("qweight")
        if w is None:
            if q is None:
                raise RuntimeError("bie: this layer has neither a weight nor a qweight")
            return q
        if self.training:
            return w
        if q is None or self._qweight_key != self._weight_key():
            self.generate_quantized_weight()
            q = self._buffers["qweight"]
        return q

    def set_weight_data(self, x):
        """Sets the weight from a (pre-trained) tensor and re-runs prepare_params."""
        x = x.detach()
        if self.weight is not None and self.weight.shape == x.shape and self.weight.dtype.is_floating_point:
            with torch.no_grad():
                self.weight.copy_(x)
        else:
            dev = self.scale_w.device
            self.weight = nn.Parameter(x.to(dev, self.dtype).clone())
        self.prepare_params()

    def _channel_view(self, t):
        return t.view(1, -1, 1, 1) if self.is_conv else t

    def set_activation(self, x):
        """Initialises scale_a from x if it is still 0, and returns x + bias_a (the forward adds
        bias_a inside the libbie call instead)."""
        self._init_scale_a(x)
        return x + self._channel_view(self.bias_a)

    def _init_scale_a(self, x):
        if self._scale_ready or x.numel() == 0:  # (an empty batch leaves the scale to the next one)
            return
        if float(self.scale_a.detach()) == 0.0:  # a one-off synchronisation
            s = F.activation_scale_init(self.quant, x, self.symmetric)
            if self.training:  # under data parallelism, every rank starts from the same scale
                s = _dist_mean(s, x.device)
            with torch.no_grad():
                self.scale_a.copy_(s)
        self._scale_ready = True

    def _latent_grad_sink(self, w):
        """For an int8 latent weight: its float gradient buffer, attached for the autograd call."""
        if w.dtype != torch.int8 or self.quant != QUANT_BINARY or w is not self.weight:
            return
        if self.weight_grad is None or self.weight_grad.shape != w.shape or self.weight_grad.device != w.device:
            self.weight_grad = torch.zeros(w.shape, dtype=torch.float32, device=w.device)
        w.privileged_grad = self.weight_grad

    def _scale_a_factor(self):
        """The factor on grad_scale_a in this call (see set_data_parallel), or None."""
        if self.training:
            world = _world()
            if world > 1:
                return 1.0 / math.sqrt(world)
        return None

    def _scale_a_arg(self):
        """scale_a as passed to the layer call (see set_data_parallel)."""
        f = self._scale_a_factor()
        return self.scale_a if f is None else _GradScale.apply(self.scale_a, f)

    def _inference(self):
        """Eval mode without autograd: the layer call goes straight to libbie (no autograd node)."""
        return not self.training and not torch.is_grad_enabled()

    def _infer(self, x, w):
        """The inference call on x with the weight w (from _prepare_forward). A call like an earlier one
        (x's metadata, the same operand tensors) runs that call's plan, kept here with its operands,
        without rebuilding the plan's key in functional; others go through functional, which plans."""
        p, b = self._parameters, self._buffers
        sa, sw, ba = p["scale_a"], b["scale_w"], p["bias_a"]
        conv = self.is_conv
        if not conv and x.dim() != 2:
            return F.linear_forward(self.quant, x, w, sa, sw, ba)
        key = (x.shape, x.stride(), x.dtype, x.get_device(), id(w), w.dtype, w.shape, id(sa), sa.dtype, id(sw),
               id(ba), ba.dtype)
        runs = self.__dict__.get("_runs")
        if runs is None:  # (a layer unpickled from an older version)
            runs = self.__dict__["_runs"] = _plans.Kept()
        run = runs.get(key)
        if run is not None:  # (replayed from a CUDA graph once its tensors' pointers repeat: _plans.Replay)
            plan, replay = run
            if conv:
                shape, ydt, fmt = plan.out
                y = torch.empty(shape, dtype=ydt, device=x.device, memory_format=fmt)
                _plans.run_replayed(plan, replay, x, (x, ba, w, sa, sw, y, None, None, None, None, None))
            else:
                y = torch.empty((x.shape[0], plan.out[0]), dtype=plan.out[1], device=x.device)
                _plans.run_replayed(plan, replay, x, (x, ba, w, sa, sw, y))
            return y
        if conv:
            y, plan = F._conv2d_forward_planned(self.quant, x, w, sa, sw, ba, *self._geometry(),
                                                getattr(self, "pad_value", F.PAD_ZERO), None, None, None, None,
                                                None, None, None)
        else:
            y, plan = F._linear_forward_planned(self.quant, x, w, sa, sw, ba)
        if plan is not None:
            runs.keep(key, (plan, _plans.replay_for((x, w, sa, sw, ba, y))), w, (sa, sw, ba))
        return y

    def _apply(self, fn, *args, **kwargs):
        # (.to(), .cuda(), .half() replace the tensors: the plans kept for the old ones go)
        out = super()._apply(fn, *args, **kwargs)
        self.__dict__["_runs"] = _plans.Kept()
        return out

    def forward(self, x):
        self._check_forward(x)
        w = self._prepare_forward(x)
        if self._inference():
            return self._output(self._infer(x, w))
        return self._output(self._train_call(x, w))

    def _train_call(self, x, w):
        """The layer's autograd Function applied to x and the weight w (training, or autograd on)."""
        raise NotImplementedError

    def _output(self, y):
        if self.bias is not None:
            y = y + (self.bias.view(1, -1, 1, 1) if self.is_conv else self.bias)
        return y

    def _prepare_forward(self, x):
        self._init_scale_a(x)
        if self.quant == QUANT_INT8 and self.training and self.weight is not None:
            self._refresh_q8_scale()
        w = self.opt_weight
        if self.training:
            self._latent_grad_sink(w)
        return w

    # --- state_dict ---------------------------------------------------------------------------

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        from .compat import state_dict_kind_error
        err = state_dict_kind_error(self, state_dict, prefix)
        if err:
            error_msgs.append(err)
            return
        qk, wk = prefix + "qweight", prefix + "weight"
        dev = self.scale_w.device
        if qk in state_dict:
            q = state_dict[qk]
            if self.qweight is None or self.qweight.shape != q.shape or self.qweight.dtype != q.dtype:
                self.qweight = torch.empty(q.shape, dtype=q.dtype, device=dev)
        else:
            self.qweight = None
        if wk in state_dict:
            w = state_dict[wk]
            if self.weight is None or self.weight.dtype != w.dtype or self.weight.shape != w.shape:
                self.weight = nn.Parameter(torch.empty(w.shape, dtype=w.dtype, device=dev),
                                           requires_grad=w.dtype.is_floating_point)
        elif qk in state_dict:
            self.weight = None  # a packed-only checkpoint
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        for k in ("eps", "_extra_state"):  # Bitorch Engine's binary layers have no eps buffer; no layer kind
            if prefix + k in missing_keys:
                missing_keys.remove(prefix + k)
        self._scale_ready = False
        self._qweight_key = None
        self._q8_scale_key = None
        if self.qweight is not None and self.weight is not None:
            self._qweight_key = self._weight_key()  # checkpointed together: consistent

    # --- Bitorch Engine's protocol, and the layer kind kept in the state_dict ---------------------

    bits_binary_word = 8

    def get_extra_state(self):
        """The layer kind, saved beside the weights, so that a state_dict of another kind is refused."""
        return torch.tensor([int(self.quant), int(self.is_conv)], dtype=torch.int32)

    def set_extra_state(self, state):
        pass  # checked before loading (compat.state_dict_kind_error)

    def set_quantized_weight_data(self, x):
        """Sets qweight, the packed weight that eval mode uses (Bitorch Engine's protocol), from a
        tensor in this layer's packed form (the float weight, if any, is left as it is)."""
        from .compat import check_qweight
        check_qweight(self, x)
        self.qweight = x.detach().to(self.scale_w.device)
        self._qweight_key = self._weight_key() if self.weight is not None else None

    def set_bits_binary_word(self, num_bit):
        """Bitorch Engine's word size of packed bits: libbie packs bits in bytes, so only 8 is accepted."""
        if num_bit != 8:
            raise ValueError(f"bie: binary weights are packed in bytes (bits_binary_word = 8), got {num_bit!r}")
        self.bits_binary_word = 8


class _Linear(BieLayer):
    def __init__(self, in_features=None, out_features=None, device=None, dtype=torch.float, symmetric=True, bias=False,
                 latent_int8=False, *, input_features=None, bits_binary_word=8):
        super().__init__()
        if input_features is not None:  # Bitorch Engine's keyword for in_features
            if in_features is not None:
                raise TypeError("bie: give in_features or input_features, not both")
            in_features = input_features
        self.in_features = V.positive_int("in_features", in_features)
        self.out_features = V.positive_int("out_features", out_features)
        self.input_features, self.output_features = self.in_features, self.out_features  # Bitorch Engine's names
        V.float_dtype(dtype)
        self.set_bits_binary_word(bits_binary_word)
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        self._init_common(in_features, out_features, device, dtype, symmetric, bias, latent_int8)
        self.reset_parameters()

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

    def _check_forward(self, x):
        if x.shape[-1] != self.in_features:
            raise ValueError(f"bie: input has {x.shape[-1]} features, the layer expects {self.in_features}")


class BinaryLinear(_Linear):
    """Binary linear layer: y = scale_a*scale_w * sign(x + bias_a) . sign(W)^T (Bitorch Engine's
    BinaryLinearCuda / BinaryLinearCutlass). gemm_kernel_id is kept for compatibility."""

    quant = QUANT_BINARY

    def __init__(self, *args, bmm_type=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.gemm_kernel_id = 3
        self.bmm_type = check_bmm_type(bmm_type)

    def forward(self, x, bmm_type=None):
        if bmm_type is not None:
            self.bmm_type = check_bmm_type(bmm_type)
        check_bmm_type(self.bmm_type, x.device)
        return super().forward(x)

    def _train_call(self, x, w):
        return BinaryLinearForward.apply(x, w, self._scale_a_arg(), self.scale_w, self.gemm_kernel_id, self.training,
                                         self.bias_a)


_check_bits = V.check_bits


class _NbitLinear(_Linear):
    """What Q4Linear and Q8Linear share: _nbits-bit codes of x and the weight, trained through the
    autograd function _function."""

    _nbits = _function = None

    def __init__(self, in_channels, out_channels, a_bit=None, w_bit=None, device=None, dtype=torch.float, bias=False):
        _check_bits(a_bit, w_bit, self._nbits)
        super().__init__(in_channels, out_channels, device=device, dtype=dtype, bias=bias)
        self.a_bit = self.w_bit = self._nbits

    def _train_call(self, x, w):
        return self._function.apply(x, w, self._scale_a_arg(), self.scale_w, self.training, self.bias_a)


class Q4Linear(_NbitLinear):
    """4-bit linear layer (Bitorch Engine's Q4LinearCutlass): codes clamp(rne(v/scale), -8, 7)."""

    quant, _nbits, _function = QUANT_INT4, 4, Q4LinearForward


class Q8Linear(_NbitLinear):
    """8-bit linear layer (Bitorch Engine's Q8LinearCutlass): codes clamp(rne(v/scale), -128, 127)."""

    quant, _nbits, _function = QUANT_INT8, 8, Q8LinearForward


def _pair(v):
    return tuple(int(t) for t in v) if isinstance(v, (tuple, list)) else (int(v), int(v))


class _Conv2d(BieLayer):
    is_conv = True

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, device=None,
                 dtype=torch.float, symmetric=True, bias=False, latent_int8=False):
        super().__init__()
        V.check_conv_args(in_channels, out_channels, kernel_size, stride, padding, dilation)
        V.float_dtype(dtype)
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size, self.stride = _pair(kernel_size), _pair(stride)
        self.padding, self.dilation = _pair(padding), _pair(dilation)
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, *self.kernel_size, device=device,
                                               dtype=dtype))
        self._init_common(in_channels, out_channels, device, dtype, symmetric, bias, latent_int8)
        self.reset_parameters()

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, bias={self.bias is not None}")

    def _check_forward(self, x):
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"bie: input of shape {tuple(x.shape)} is not [N, {self.in_channels}, H, W]")

    def _geometry(self):
        return self.kernel_size, self.stride, self.padding, self.dilation


class BinaryConv2d(_Conv2d):
    """Binary conv2d (Bitorch Engine's BinaryConv2dCutlass, as a true cross-correlation).
    pad_value: the value of the spatial padding taps: bie.PAD_ZERO (default: the float
    convolution of the +-1 tensors, as in libbie and the bie model format), bie.PAD_MINUS_ONE
    (Bitorch Engine's CPU convolution and bitorch's default) or bie.PAD_PLUS_ONE."""

    quant = QUANT_BINARY

    def __init__(self, *args, pad_value=PAD_ZERO, **kwargs):
        super().__init__(*args, **kwargs)
        if pad_value not in (0, 1, 2):
            raise ValueError(f"bie: pad_value must be bie.PAD_ZERO, PAD_MINUS_ONE or PAD_PLUS_ONE, got {pad_value!r}")
        self.pad_value = int(pad_value)

    def _train_call(self, x, w):
        return BinaryConv2dForward.apply(x, w, self._scale_a_arg(), self.scale_w, self.training, *self._geometry(),
                                         self.bias_a, self.pad_value)


class _NbitConv2d(_Conv2d):
    """What Q4Conv2d and Q8Conv2d share: _nbits-bit codes of x and the weight, trained through the
    autograd function _function."""

    _nbits = _function = None

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, a_bit=None,
                 w_bit=None, device=None, dtype=torch.float, bias=False):
        _check_bits(a_bit, w_bit, self._nbits)
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, device=device, dtype=dtype,
                         bias=bias)
        self.a_bit = self.w_bit = self._nbits

    def _train_call(self, x, w):
        return self._function.apply(x, w, self._scale_a_arg(), self.scale_w, self.training, *self._geometry(),
                                    self.bias_a)


class Q4Conv2d(_NbitConv2d):
    """4-bit conv2d (Bitorch Engine's Q4Conv2dCutlass, as a true NCHW cross-correlation)."""

    quant, _nbits, _function = QUANT_INT4, 4, Q4Conv2dForward


class Q8Conv2d(_NbitConv2d):
    """8-bit conv2d."""

    quant, _nbits, _function = QUANT_INT8, 8, Q8Conv2dForward
