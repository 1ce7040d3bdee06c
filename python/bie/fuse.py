# SPDX-License-Identifier: Apache-2.0
"""bie.fuse: a model whose bie convs take the BatchNorm after them, the residual add after that and
(binary convs) the sign-preserving activation before them into one libbie call at inference; whose
float convs followed by a BatchNorm, a ReLU or Hardtanh and a MaxPool2d (a stem) run as the conv and
one libbie pass for the rest (FoldedConvPool); and whose other float convs take the BatchNorm after
them into their weights (FoldedConv2d).

A binary network's blocks run conv -> BatchNorm -> add shortcut, each a full pass over the
activations in plain PyTorch. fuse(model) traces the model (torch.fx, bie layers as leaves) and
replaces each such chain by a FusedConv2d: in eval mode without autograd it is one libbie conv
whose output epilogue (bie_forward_args: out_mul, out_add, residual) applies the folded BatchNorm,
out_mul = gamma / sqrt(running_var + eps), out_add = beta - running_mean * out_mul (+ the conv's
bias * out_mul), and adds the shortcut:

    y = round_y(((f32(conv(x)) * out_mul[o]) + out_add[o]) + f32(shortcut))

A symmetric Hardtanh (a clamp to [-t, t]) whose only reader is a 4-bit or 8-bit conv goes into
that call (bie_forward_args x_clamp: the quantiser reads clamp(x, -t, t), with no pass of its own
over x). A Hardtanh (a clamp to [lo, hi]) whose only reader is a binary conv is dropped there when
lo < -bias_a[c] <= hi for every channel: the conv reads only the bits x + bias_a >= 0, and the
clamp keeps them (x >= -bias_a exactly when clamp(x, lo, hi) >= -bias_a for such a bias_a). When
such a conv reads the output of another FusedConv2d or of a FoldedConvPool, that one writes these
bits in the same pass (out_bits), and the binary conv takes them instead of packing its input. In
training, or with autograd on, the fused modules run the original ones (activation, conv,
BatchNorm, add, pool), so training and gradients are those of the model they came from; in a
training step on CUDA, a binary conv and its symmetric Hardtanh are one autograd node
(ClampedBinaryConv2dForward) that keeps bits of the Hardtanh's input instead of the input, with
the same numbers, and where a block qualifies its conv, BatchNorm and residual add are one BlockTrain
node, the Hardtanh before the conv in it too (a binary conv's as above; a symmetric one before a
4-bit or 8-bit conv as the conv's x_clamp, forward and backward). The fold is taken again whenever
a module enters eval mode (model.eval()).
"""
import math
import operator
import threading

import torch
import torch.fx as fx
import torch.nn as nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

from . import _plans
from . import functional as F
from .autograd import (BatchNormTrain, BlockRun, BlockTrain, ClampedBinaryConv2dForward, StemTrain, _exact_in,
                       clamp_saves_bits)
from .layers import BieLayer, BinaryConv2d, _Conv2d


class _Tracer(fx.Tracer):
    def is_leaf_module(self, m, qualname):
        return isinstance(m, BieLayer) or super().is_leaf_module(m, qualname)


def _clamp(m):
    """Whether m is a clamp to [min_val, max_val] that a binary conv may absorb."""
    return isinstance(m, nn.Hardtanh) and m.min_val < m.max_val


@torch.no_grad()
def _act_keeps_bits(act, bias_a):
    """Whether a binary conv with this bias_a reads the same bits from x as from act(x) (one host sync)."""
    if act is None:
        return True
    nb = -bias_a.detach().float()
    return bool(((nb > act.min_val) & (nb <= act.max_val)).all())


@torch.no_grad()
def _bn_affine(bn, bias, channels, device):
    """(mul, add), float32 [channels]: bn(v + bias) = v * mul + add for an inference BatchNorm2d
    (bn None: the identity) after a conv with this bias (or None)."""
    mul = torch.ones(channels, dtype=torch.float32, device=device)
    add = torch.zeros(channels, dtype=torch.float32, device=device)
    if bn is not None:
        if bn.running_var is None or bn.running_mean is None:
            raise ValueError("bie: a BatchNorm2d without running statistics cannot be folded")
        mul = torch.rsqrt(bn.running_var.float() + bn.eps)
        if bn.weight is not None:
            mul = mul * bn.weight.float()
        add = -bn.running_mean.float() * mul
        if bn.bias is not None:
            add = add + bn.bias.float()
    if bias is not None:
        add = add + bias.float() * mul
    return mul.contiguous(), add.contiguous()


def _bits_bias(nxt):
    """The out_bits_bias (float32 [C]) under which a layer writes the input bits of nxt, the binary
    FusedConv2d that reads its output, or None (no such reader, or one whose Hardtanh must stay)."""
    if nxt is None or not _act_keeps_bits(nxt.act, nxt.conv.bias_a):
        return None
    return nxt.conv.bias_a.detach().float().contiguous()


def _bn_trains(bn, y):
    """Whether libbie's training batch norm takes bn on y: a BatchNorm2d in training with affine terms,
    running statistics and a momentum, on a 4-D CUDA tensor."""
    return (bn.training and y.is_cuda and bn.weight is not None and bn.running_mean is not None
            and bn.momentum is not None and y.dim() == 4)


def _bn_train(bn, y, residual=None):
    """bn(y) (+ residual) for a BatchNorm2d in training on CUDA as libbie's batch norm
    (BatchNormTrain: statistics, normalisation and the add in two passes over y, the backward in two),
    the module's own numbers within f32 rounding; None where that does not apply (the CPU, eval mode,
    no affine or running statistics, a cumulative momentum, a residual of another dtype or shape)."""
    if not _bn_trains(bn, y) or (residual is not None and (residual.dtype != y.dtype or residual.shape != y.shape)):
        return None
    return BatchNormTrain.apply(y, bn.weight, bn.bias, residual, bn.running_mean, bn.running_var, bn.momentum, bn.eps,
                                bn.num_batches_tracked)


class FusedConv2d(nn.Module):
    """A bie conv (`conv`), optionally after a Hardtanh (`act`) and before a BatchNorm2d (`bn`), with
    an optional residual added to the result: forward(x, residual=None) = bn(conv(act(x))) +
    residual. At inference (eval mode, no autograd) it is one libbie call with the BatchNorm folded
    into its output epilogue, and a symmetric Hardtanh before an n-bit conv as its x_clamp."""

    def __init__(self, conv, bn=None, act=None):
        super().__init__()
        if not isinstance(conv, _Conv2d):
            raise TypeError(f"bie: FusedConv2d takes a bie conv layer, not {type(conv).__name__}")
        if act is not None and not _clamp(act):
            raise ValueError("bie: only a Hardtanh before a bie conv can be fused")
        if bn is not None and bn.num_features != conv.out_channels:
            raise ValueError(f"bie: BatchNorm2d of {bn.num_features} features after a conv of {conv.out_channels}")
        self.conv, self.bn, self.act = conv, bn, act
        self.register_buffer("out_mul", None, persistent=False)
        self.register_buffer("out_add", None, persistent=False)
        self.register_buffer("bits_bias", None, persistent=False)
        self._drop_act = False
        self._x_clamp = None  # t of a symmetric Hardtanh before an n-bit conv (the call's x_clamp)
        self.bits_for = None  # the FusedConv2d (binary) that reads this one's output, set by fuse()
        self.res_bias_from = None  # the FoldedConv2d whose bias this call adds to its residual (fuse())
        self.register_buffer("res_bias", None, persistent=False)
        self.register_buffer("out_add_res", None, persistent=False)
        # the conv's geometry as conv2d_forward takes it, and bits shapes by input shape
        self._geo = conv._geometry() + (conv.pad_value if isinstance(conv, BinaryConv2d) else F.PAD_ZERO,)
        self._bits_shapes = {}
        self._runs = _plans.Kept()  # the plans of earlier calls (forward())
        self._hot = None  # what every inference call reads, as plain references (_hot_state())
        self._train_runs = _plans.Cache()  # the BlockRuns of earlier training calls, or False (_block)
        self._fold()

    def extra_repr(self):
        return f"act={self.act is not None}, bn={self.bn is not None}"

    @torch.no_grad()
    def _fold(self):
        dev = self.conv.scale_w.device  # (a buffer every bie layer keeps, packed or not)
        o = self.conv.out_channels
        mul, add = _bn_affine(self.bn, self.conv.bias, o, dev)
        binary = isinstance(self.conv, BinaryConv2d)
        if self.act is not None and binary:  # (one host sync, when the module enters eval mode)
            self._drop_act = _act_keeps_bits(self.act, self.conv.bias_a)
        lo, hi = (float(self.act.min_val), float(self.act.max_val)) if self.act is not None else (0.0, 0.0)
        self._x_clamp = hi if not binary and 0.0 < hi == -lo and math.isfinite(hi) else None
        self.bits_bias = _bits_bias(self.bits_for)
        self.out_mul = None if self.bn is None else mul
        self.out_add = None if self.bn is None and self.conv.bias is None else add
        src = self.res_bias_from
        self.res_bias = None if src is None else _bn_affine(src.bn, src.conv.bias, o, dev)[1]
        self.out_add_res = None if src is None else (add + self.res_bias).contiguous()
        self._runs = _plans.Kept()
        self._hot = None
        self._train_runs = _plans.Cache()

    def _apply(self, fn, *args, **kwargs):
        # (.to(), .cuda(), .half() replace the buffers: the plans and references made for the old ones go)
        out = super()._apply(fn, *args, **kwargs)
        self._runs, self._hot, self._train_runs = _plans.Kept(), None, _plans.Cache()
        return out

    def _hot_state(self):
        """(conv, its parameter and buffer dicts, the activation applied before the conv or None,
        out_mul, out_add, out_add with the residual's bias, bits_bias, the call's x_clamp or None):
        read through nn.Module's attribute lookup once, not on every call (its fallback costs about a
        microsecond a name)."""
        conv, act = self.conv, self.act
        self._hot = (conv, conv._parameters, conv._buffers, act if act is not None and not self._drop_act else None,
                     self.out_mul, self.out_add, self.out_add_res, self.bits_bias, self._x_clamp)
        return self._hot

    def train(self, mode=True):
        super().train(mode)
        if not mode:
            self._fold()
        return self

    def _bits_out(self, x, bb):
        """A buffer for the bits this call writes for bits_for (uint8 [N, OH, OW, ceil(O/8)])."""
        n, _, h, w = x.shape
        shape = self._bits_shapes.get((n, h, w))
        if shape is None:
            c = self.conv
            oh, ow = F.conv2d_output_size(h, w, c.kernel_size, c.stride, c.padding, c.dilation)
            shape = self._bits_shapes[(n, h, w)] = (n, oh, ow, -(-c.out_channels // 8))
        return torch.empty(shape, dtype=torch.uint8, device=bb.device)

    def _slow(self, x, residual, res_bias):
        """The modules one by one (training, autograd on, or a residual of another batch); in a training
        step on CUDA the conv, BatchNorm and residual add as one BlockTrain node where it applies
        (_block), else a binary conv and its Hardtanh as one autograd node that keeps bits
        (_clamped_conv)."""
        if res_bias:
            residual = residual + self.res_bias.to(residual.dtype).view(1, -1, 1, 1)
        y = self._block(x, residual)
        if y is not None:
            return y
        y = self._clamped_conv(x)
        if y is None:
            y = self.conv(x if self.act is None else self.act(x))
        if self.bn is not None:
            z = _bn_train(self.bn, y, residual)
            if z is not None:
                return z
            y = self.bn(y)
        return y if residual is None else y + residual

    def _block(self, x, residual):
        """bn(conv(act(x))) + residual in a training step on CUDA as one BlockTrain node, or None where
        that does not apply (see _block_run)."""
        conv, bn = self.conv, self.bn
        identity = residual is x
        rkey = None if residual is None or identity else (residual.shape, residual.stride(), residual.dtype)
        key = (x.shape, x.stride(), x.dtype, x.get_device(), identity, rkey, torch.is_grad_enabled(), conv.training,
               bn is not None and bn.training, threading.get_ident())
        entry = self._train_runs.get(key)
        if entry is None:
            entry = self._block_run(x, residual)
            if len(self._train_runs) >= _plans._MAX_KEPT:
                self._train_runs = _plans.Cache()
            self._train_runs[key] = entry
        if entry is False:
            return None
        params, bp, bb = conv._parameters, bn._parameters, bn._buffers
        now = (params["weight"], conv._buffers["scale_w"], params["scale_a"], params.get("bias_a"), bp["weight"],
               bp["bias"], bb["running_mean"], bb["running_var"], bb.get("num_batches_tracked"), bn.momentum, bn.eps)
        for a, b in zip(now, entry[1]):
            if a is not b:  # (a parameter or buffer replaced, or a constant changed: the run is made again)
                self._train_runs[key] = entry = self._block_run(x, residual)
                if entry is False:
                    return None
                break
        run = entry[0]
        w, _, _, ba, bw, bbias = now[:6]
        if run.t is None:  # (a 4-bit or 8-bit conv: its Hardtanh first unless the node clamps x itself;
            # the 8-bit weight scale of the current weight is the node's first call)
            if self.act is not None and run.x_clamp is None:
                x = self.act(x)
            if not conv._scale_ready:  # (the lazy scale_a, from the conv's own input)
                with torch.no_grad():
                    conv._init_scale_a(x if self.act is None or run.x_clamp is None else self.act(x))
            identity = identity and run.x_clamp is not None
        y = BlockTrain.apply(x, w, now[2], ba, bw, bbias, None if identity else residual, run, identity,
                             conv._scale_a_factor())
        if run.scale is not None:
            conv._q8_scale_key = (id(w), w._version)  # (scale_w is that of this weight)
        return y

    def _block_run(self, x, residual):
        """(BlockRun, the operands it was made for) where a training call on x can be one BlockTrain node:
        a bie conv with a float weight and no bias, a training BatchNorm2d after it that libbie's batch
        norm takes (_bn_trains), a residual of y's dtype and shape; a binary conv after a symmetric
        Hardtanh in its bits-saving case (clamp_saves_bits) with bias_a, or a 4-bit or 8-bit conv (a
        symmetric Hardtanh whose bound is exact in x's dtype in the node, as the conv's x_clamp; any
        other Hardtanh before the node). False where not."""
        conv, bn, act = self.conv, self.bn, self.act
        if bn is None or conv.bias is not None or not torch.is_grad_enabled() or not conv.training:
            return False
        w = conv.opt_weight
        binary = isinstance(conv, BinaryConv2d)
        if not w.is_floating_point() or not x.is_cuda or x.dim() != 4:
            return False
        xc = None  # an n-bit conv's x_clamp: its symmetric Hardtanh in the node (a t exact in x's dtype)
        if binary:
            if act is None or conv.bias_a is None:
                return False
            t = float(act.max_val)
            if not clamp_saves_bits(x, float(act.min_val), t, w, conv.scale_a, conv.bias_a, conv.padding,
                                    conv.pad_value):
                return False
        else:
            t = None
            if act is not None and self._x_clamp is not None and _exact_in(self._x_clamp, x.dtype):
                xc = self._x_clamp
        conv._check_forward(x)
        oh, ow = F.conv2d_output_size(x.shape[2], x.shape[3], conv.kernel_size, conv.stride, conv.padding,
                                      conv.dilation)
        y_shape = (x.shape[0], conv.out_channels, oh, ow)
        if not _bn_trains(bn, x) or (residual is not None and (residual.dtype != x.dtype
                                                               or tuple(residual.shape) != y_shape)):
            return False
        with torch.no_grad():  # (h only sets the lazy scale_a and the conv's preparation: no graph)
            h = x if act is None else act(x)
            if not conv._scale_ready:  # (the lazy scale_a comes from the conv's own input)
                conv._init_scale_a(h)
        conv._prepare_forward(h)
        run = BlockRun(conv.quant, conv.scale_w, t, conv._geometry(), conv.in_channels, bn.running_mean,
                       bn.running_var, bn.num_batches_tracked, bn.momentum, bn.eps, xc)
        operands = (conv.weight, conv.scale_w, conv.scale_a, conv.bias_a, bn.weight, bn.bias, bn.running_mean,
                    bn.running_var, bn.num_batches_tracked, bn.momentum, bn.eps)  # (what _block compares by identity)
        return run, operands

    def _clamped_conv(self, x):
        """conv(act(x)) through ClampedBinaryConv2dForward (a training step keeps 3 bits of x instead of
        the Hardtanh's input and the conv's), or None where it does not apply."""
        conv, act = self.conv, self.act
        if act is None or not isinstance(conv, BinaryConv2d) or not (conv.training and torch.is_grad_enabled()):
            return None
        lo, hi = float(act.min_val), float(act.max_val)
        if not clamp_saves_bits(x, lo, hi, conv.opt_weight, conv.scale_a, conv.bias_a, conv.padding, conv.pad_value):
            return None  # (before any of the conv's own preparation, which its call then does)
        if not conv._scale_ready:  # (the lazy scale_a comes from the conv's own input)
            with torch.no_grad():
                conv._init_scale_a(act(x))
        conv._check_forward(x)
        w = conv._prepare_forward(x)
        y = ClampedBinaryConv2dForward.apply(x, w, conv._scale_a_arg(), conv.scale_w, hi, *conv._geometry(),
                                             conv.bias_a)
        return conv._output(y)

    def forward(self, x, residual=None):
        # a residual without its bias, which this call adds (FoldedConv2d.bias_to)
        res_bias = residual is not None and getattr(residual, "_bie_res_bias", None) is self
        hot = self._hot or self._hot_state()
        conv, params, buffers, act, mul, add, add_res, bb, xc = hot
        if (conv.training or torch.is_grad_enabled()
                or (residual is not None and (residual.dim() != 4 or residual.shape[0] != x.shape[0]))):
            return self._slow(x, residual, res_bias)
        if xc is not None and not (x.is_floating_point() and _exact_in(xc, x.dtype)):
            xc = None  # (libbie's f32 clamp is PyTorch's in x's dtype only for a t of that dtype)
        if act is not None and xc is None:
            x = act(x)
        w = conv._prepare_forward(x)
        if res_bias:
            add = add_res
        if residual is not None and residual.dtype != x.dtype:
            residual = residual.to(x.dtype)
        given = getattr(x, "_bie_bits", None)
        # the bits of x + bias_a that the conv before made for this one, if it did
        src = given[1] if given is not None and given[0] is self and act is None else None
        sa, ba, sw = params["scale_a"], params["bias_a"], buffers["scale_w"]
        key = (x.shape, x.stride(), x.dtype, x.get_device(), src is None, res_bias, id(w), id(sa), id(sw), id(ba),
               None if residual is None else (residual.shape, residual.stride(), residual.get_device()), xc)
        run = self._runs.get(key)
        if run is not None:  # a call like an earlier one: its plan, without rebuilding the plan's key,
            # replayed from a CUDA graph once its tensors' pointers repeat (_plans.Replay)
            plan, bits_shape, replay = run
            shape, ydt, fmt = plan.out
            y = torch.empty(shape, dtype=ydt, device=x.device, memory_format=fmt)
            bits = None if bb is None else torch.empty(bits_shape, dtype=torch.uint8, device=x.device)
            ts = (x, ba, w, sa, sw, y, mul, add, residual, bits, bb) if src is None else (
                src, None, w, sa, sw, y, mul, add, residual, bits, bb)
            _plans.run_replayed(plan, replay, x, ts)
        else:
            conv._check_forward(x)
            bits = None if bb is None else self._bits_out(x, bb)
            if src is None:
                y, plan = F._conv2d_forward_planned(conv.quant, x, w, sa, sw, ba, *self._geo, None, None, mul, add,
                                                    residual, bits, bb, xc)
            else:
                y, plan = F._conv2d_forward_planned(conv.quant, src, w, sa, sw, None, *self._geo, x.dtype,
                                                    conv.in_channels, mul, add, residual, bits, bb)
            if plan is not None:
                replay = _plans.replay_for((x, w, sa, sw, ba, y, mul, add, residual, bits, bb))
                self._runs.keep(key, (plan, None if bits is None else tuple(bits.shape), replay), w, (sa, sw, ba))
        if bits is not None:
            y._bie_bits = (self.bits_for, bits)
        return y


class FoldedConv2d(nn.Module):
    """A float nn.Conv2d and the BatchNorm2d after it: bn(conv(x)) in training (or with autograd
    on), and at inference one convolution whose weight and bias hold the BatchNorm (folded by
    torch.nn.utils.fusion.fuse_conv_bn_eval when the module enters eval mode). When its output is
    only the residual of a FusedConv2d (bias_to, set by fuse(): a downsample shortcut), it leaves
    the bias to that call's out_add and marks its output so (y._bie_res_bias = bias_to)."""

    def __init__(self, conv, bn):
        super().__init__()
        self.conv, self.bn = conv, bn
        self._folded = None
        self.bias_to = None

    def train(self, mode=True):
        super().train(mode)
        object.__setattr__(self, "_folded", None if mode else fuse_conv_bn_eval(self.conv, self.bn))
        return self

    def forward(self, x):
        if self.training or torch.is_grad_enabled() or self._folded is None:
            y = self.conv(x)
            z = _bn_train(self.bn, y)
            return self.bn(y) if z is None else z
        if self.bias_to is None:
            return self._folded(x)
        c = self._folded
        y = torch.nn.functional.conv2d(x, c.weight, None, c.stride, c.padding, c.dilation, c.groups)
        y._bie_res_bias = self.bias_to
        return y


class FoldedConvPool(nn.Module):
    """A float nn.Conv2d, the BatchNorm2d after it, an optional ReLU or Hardtanh and a MaxPool2d (a
    network's stem): pool(act(bn(conv(x)))) in training (or with autograd on), in training on CUDA
    with the BatchNorm, the clamp and the pool as one node (StemTrain: libbie's statistics, one pass
    that pools and keeps a byte of where each output came from, a gathering backward); at inference
    the convolution without bias followed by one libbie pass (bie_affine_maxpool2d_forward) that
    applies the folded BatchNorm, the clamp and the max-pool, and writes the bits of the binary conv
    that reads the result (bits_for), if any."""

    def __init__(self, conv, bn, act, pool):
        super().__init__()
        if type(conv) is not nn.Conv2d or conv.padding_mode != "zeros" or isinstance(conv.padding, str):
            raise ValueError("bie: FoldedConvPool takes an nn.Conv2d with numeric zero padding")
        if pool.dilation not in (1, (1, 1)) or pool.ceil_mode or pool.return_indices:
            raise ValueError("bie: FoldedConvPool takes a MaxPool2d without dilation, ceil_mode or indices")
        if act is not None and not isinstance(act, (nn.ReLU, nn.Hardtanh)):
            raise ValueError("bie: FoldedConvPool takes a ReLU or Hardtanh between the BatchNorm and the pool")
        self.conv, self.bn, self.act, self.pool = conv, bn, act, pool
        self.register_buffer("mul", None, persistent=False)
        self.register_buffer("add", None, persistent=False)
        self.register_buffer("bits_bias", None, persistent=False)
        self.bits_for = None  # the FusedConv2d (binary) that reads this one's output, set by fuse()
        self._lo, self._hi = ((-math.inf, math.inf) if act is None else (0.0, math.inf) if isinstance(act, nn.ReLU)
                              else (float(act.min_val), float(act.max_val)))
        self._bits_shapes = {}
        self._fold()

    @torch.no_grad()
    def _fold(self):
        self.mul, self.add = _bn_affine(self.bn, self.conv.bias, self.conv.out_channels, self.conv.weight.device)
        self.bits_bias = _bits_bias(self.bits_for)

    def train(self, mode=True):
        super().train(mode)
        if not mode:
            self._fold()
        return self

    def forward(self, x):
        if self.training or torch.is_grad_enabled():
            y = self.conv(x)
            p, bn = self.pool, self.bn
            k = F._pair(p.kernel_size)
            if _bn_trains(bn, y) and k[0] * k[1] <= 255:  # in training on CUDA: one node (StemTrain)
                return StemTrain.apply(y, bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.momentum, bn.eps,
                                       p.kernel_size, p.stride, p.padding, self._lo, self._hi, bn.num_batches_tracked)
            y = self.bn(y)
            return self.pool(y if self.act is None else self.act(y))
        c = self.conv
        y = torch.nn.functional.conv2d(x, c.weight, None, c.stride, c.padding, c.dilation, c.groups)
        bits, bb = None, self.bits_bias
        if bb is not None:
            n, _, h, w = y.shape
            shape = self._bits_shapes.get((n, h, w))
            if shape is None:
                p = self.pool
                oh, ow = F.conv2d_output_size(h, w, p.kernel_size, p.stride, p.padding)
                shape = self._bits_shapes[(n, h, w)] = (n, oh, ow, -(-c.out_channels // 8))
            bits = torch.empty(shape, dtype=torch.uint8, device=y.device)
        out = F.affine_maxpool2d(y, self.pool.kernel_size, self.pool.stride, self.pool.padding, self.mul, self.add,
                                 self._lo, self._hi, bits, bb)
        if bits is not None:
            out._bie_bits = (self.bits_for, bits)
        return out


def _only_user(node):
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def fuse(model):
    """A torch.fx GraphModule of `model` in which each bie conv followed by a BatchNorm2d (and by an
    add of another tensor after it, and preceded by a Hardtanh) is one
    FusedConv2d, and each float nn.Conv2d followed by a BatchNorm2d one FoldedConv2d. The model must be traceable by torch.fx (no data-dependent control flow in
    its forward); its parameters and buffers are shared, not copied."""
    gm = fx.GraphModule(model, _Tracer().trace(model))
    mods = dict(gm.named_modules())
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or not isinstance(mods.get(node.target), _Conv2d) or node.kwargs:
            continue
        conv = mods[node.target]
        bn_node = _only_user(node)
        if bn_node is None or bn_node.op != "call_module" or not isinstance(mods.get(bn_node.target), nn.BatchNorm2d):
            continue
        bn = mods[bn_node.target]
        if bn.num_features != conv.out_channels or bn.running_var is None:
            continue
        last, residual = bn_node, None
        add = _only_user(bn_node)
        if (add is not None and add.op == "call_function" and add.target in (operator.add, torch.add)
                and len(add.args) == 2 and not add.kwargs and all(isinstance(a, fx.Node) for a in add.args)
                and add.args[0] is not add.args[1]):
            residual = add.args[1] if add.args[0] is bn_node else add.args[0]
            last = add
        x_in, act_node, act = node.args[0], None, None
        if (isinstance(x_in, fx.Node) and x_in.op == "call_module" and _clamp(mods.get(x_in.target))
                and _only_user(x_in) is node):
            act_node, act = x_in, mods[x_in.target]
            x_in = act_node.args[0]
        name = f"fused_{count}"
        count += 1
        gm.add_submodule(name, FusedConv2d(conv, bn, act).train(model.training))
        with gm.graph.inserting_before(last):
            fused = gm.graph.call_module(name, (x_in,) if residual is None else (x_in, residual))
        last.replace_all_uses_with(fused)
        dead = [last] + ([bn_node] if last is not bn_node else []) + [node] + ([act_node] if act_node else [])
        for n in dead:  # readers before what they read
            gm.graph.erase_node(n)
    # float convs, their BatchNorms, activations and max-pools
    for node in list(gm.graph.nodes):
        conv = mods.get(node.target) if node.op == "call_module" else None
        if type(conv) is not nn.Conv2d or len(node.args) != 1 or node.kwargs:
            continue
        chain = [node]
        while len(chain) < 4 and _only_user(chain[-1]) is not None and _only_user(chain[-1]).op == "call_module":
            chain.append(_only_user(chain[-1]))
        ms = [mods.get(n.target) for n in chain]
        if len(ms) >= 3 and isinstance(ms[2], nn.MaxPool2d):  # no activation
            ms, chain = ms[:2] + [None, ms[2]], chain[:2] + [None, chain[2]]
        if (len(ms) < 4 or not isinstance(ms[1], nn.BatchNorm2d) or ms[1].running_var is None
                or ms[1].num_features != conv.out_channels or not isinstance(ms[3], nn.MaxPool2d)
                or not (ms[2] is None or type(ms[2]) in (nn.ReLU, nn.Hardtanh))):
            continue
        try:
            fused = FoldedConvPool(conv, ms[1], ms[2], ms[3]).train(model.training)
        except ValueError:
            continue
        name = f"folded_{count}"
        count += 1
        gm.add_submodule(name, fused)
        with gm.graph.inserting_before(chain[-1]):
            new = gm.graph.call_module(name, node.args)
        chain[-1].replace_all_uses_with(new)
        for n in reversed([n for n in chain if n is not None]):  # readers before what they read
            gm.graph.erase_node(n)
    mods = dict(gm.named_modules())
    for node in list(gm.graph.nodes):
        conv = mods.get(node.target) if node.op == "call_module" else None
        if type(conv) is not nn.Conv2d or len(node.args) != 1 or node.kwargs:
            continue
        bn_node = _only_user(node)
        bn = mods.get(bn_node.target) if bn_node is not None and bn_node.op == "call_module" else None
        if not isinstance(bn, nn.BatchNorm2d) or bn.running_var is None or bn.num_features != conv.out_channels:
            continue
        name = f"folded_{count}"
        count += 1
        gm.add_submodule(name, FoldedConv2d(conv, bn).train(model.training))
        with gm.graph.inserting_before(bn_node):
            folded = gm.graph.call_module(name, node.args)
        bn_node.replace_all_uses_with(folded)
        gm.graph.erase_node(bn_node)
        gm.graph.erase_node(node)
    # a FoldedConv2d read only as a FusedConv2d's residual leaves its bias to that call's out_add
    for node in gm.graph.nodes:
        m = gm.get_submodule(node.target) if node.op == "call_module" else None
        user = _only_user(node)
        if (not isinstance(m, FoldedConv2d) or user is None or user.op != "call_module" or len(user.args) != 2
                or user.args[1] is not node or user.args[0] is node):
            continue
        f = gm.get_submodule(user.target)
        if isinstance(f, FusedConv2d) and f.res_bias_from is None and f.conv.out_channels == m.conv.out_channels:
            object.__setattr__(m, "bias_to", f)  # (references, not submodules)
            object.__setattr__(f, "res_bias_from", m)
            f._fold()
    # a FusedConv2d whose output a binary one reads as its input writes that one's bits
    for node in gm.graph.nodes:
        m = gm.get_submodule(node.target) if node.op == "call_module" else None
        if isinstance(m, FusedConv2d) and isinstance(m.conv, BinaryConv2d) and isinstance(node.args[0], fx.Node):
            src = node.args[0]
            p = gm.get_submodule(src.target) if src.op == "call_module" else None
            if isinstance(p, (FusedConv2d, FoldedConvPool)) and p.bits_for is None:
                object.__setattr__(p, "bits_for", m)  # (a reference, not a submodule)
                p._fold()
    gm.graph.lint()
    gm.recompile()
    gm.delete_all_unused_submodules()
    return gm
