# SPDX-License-Identifier: Apache-2.0
"""Embeddings with packed tables, the lookup in libbie (bie_embedding_forward / _backward):

- ``BinaryEmbeddingCuda`` (alias ``BinaryEmbedding``): Bitorch Engine's binary embedding. The table
  is bit-packed (``qweight`` uint8 [V, ceil(D/8)], bit d of a row = sign of entry d) with a per-row
  scale ``scale_w`` [V, 1] = mean |row| (over the row padded to a multiple of 8 with -1, as Bitorch
  Engine computes it); a lookup returns scale * (+-1). It trains its bits directly with
  ``bie.DiodeMix`` (sign flips of the rows a batch read).
- ``BinaryEmbeddingBag``: Bitorch Engine's binary embedding bag: a bag [B, L] of indices votes
  per column, out = +1 where at least half of its rows have the bit set, else -1 (the sign of the
  sum of +-1 values, sign(0) = +1).
- ``Q4Embedding`` / ``Q8Embedding``: n-bit tables (no Bitorch Engine counterpart): a float latent
  table trained by any optimizer, quantized per row to clamp(rne(W / scale_w[r]), lo, hi) in the
  lookup, and packed (``qweight``: int8 nibbles / int8 codes) in eval mode.

Backward passes are sparse: libbie computes the gradient of the rows the indices read only (one row
per distinct index), which the binary tables keep in ``qweight.sparse_grads`` for DiodeMix (stock
PyTorch cannot give a uint8 parameter a gradient) and the n-bit tables return as a dense or
(``sparse=True``) sparse COO gradient, as ``nn.Embedding`` does.
"""
import ctypes

import torch
import torch.nn as nn

from . import _lib
from . import functional as F
from .functional import QUANT_BINARY, QUANT_INT4, QUANT_INT8, _Call, _check_float, _ptr, _view

__all__ = ["embedding_forward", "embedding_backward", "BinaryEmbeddingForward", "BinaryEmbeddingCuda",
           "BinaryEmbedding", "BinaryEmbeddingBag", "Q4Embedding", "Q8Embedding", "BinaryEmbeddingParameter"]


def _index_view(t, name):
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"bie: {name} must be int32 or int64 (torch.long), not {t.dtype}")
    return _view(t, _lib.DT_I64 if t.dtype == torch.int64 else _lib.DT_I32, tuple(t.shape), t.stride())


def _table_view(quant, table, dim):
    rows = table.shape[0]
    if table.dtype in (torch.float32, torch.float16, torch.bfloat16) or (table.dtype == torch.int8 and
                                                                         table.shape[1] == dim):
        if table.shape[1] != dim:
            raise ValueError(f"bie: table has {table.shape[1]} columns, embedding_dim is {dim}")
        return _view(table)
    return F._weight_view(quant, table, (rows, dim))


def embedding_forward(quant, indices, table, scale=None, bag=False, out_dtype=torch.float32, embedding_dim=None):
    """out[..., d] = scale[r] * code(table[r, d]) for r = indices[...] (bag: the sum over the last
    index dimension). table: float [V, D] (quantized on the fly), int8 codes [V, D], or packed
    (binary: uint8 [V, ceil(D/8)]; 4-bit: int8 [V, ceil(D/2)]; give embedding_dim = D)."""
    if table.dim() != 2:
        raise ValueError(f"bie: an embedding table is 2-D [num_embeddings, ...], has {table.dim()} dimensions")
    dim = int(embedding_dim) if embedding_dim is not None else table.shape[1]
    if bag and indices.dim() < 1:
        raise ValueError("bie: a bag needs indices with at least one dimension (the last holds a bag)")
    lead = tuple(indices.shape[:-1]) if bag else tuple(indices.shape)
    out = torch.empty((*lead, dim), dtype=out_dtype, device=table.device)
    if out.numel() == 0:
        return out
    if indices.numel() == 0:  # empty bags sum to zero
        return out.zero_()
    if indices.device != table.device:
        raise ValueError(f"bie: indices are on {indices.device}, the table on {table.device}")
    idx = indices.detach()
    keep = [_index_view(idx, "indices"), _table_view(quant, table.detach(), dim),
            _view(scale.detach().reshape(-1)) if scale is not None else None, _view(out)]
    desc = _lib.EmbeddingDesc(int(quant), 1 if bag else 0)
    args = _lib.EmbeddingArgs(*[_ptr(v) for v in keep])
    _Call(table)("bie_embedding_forward", ctypes.byref(desc), ctypes.byref(args))
    del keep
    return out


def embedding_backward(quant, indices, grad_out, rows, scale=None, bag=False, inverse=None, dtype=torch.float32):
    """grad_rows [rows, D] = for each slot u, the sum of grad_out * scale[indices] over the lookups
    whose slot (inverse, or the index itself) is u. Sparse: pass the distinct rows' inverse
    (torch.unique(indices, return_inverse=True)) and rows = their count."""
    _check_float(grad_out, "grad_out")
    dim = grad_out.shape[-1]
    g = torch.empty((int(rows), dim), dtype=dtype, device=grad_out.device)
    if g.numel() == 0:
        return g
    if indices.numel() == 0:
        return g.zero_()
    keep = [_index_view(indices.detach(), "indices"), _index_view(inverse.detach(), "inverse") if inverse is not None
            else None, _view(scale.detach().reshape(-1)) if scale is not None else None, _view(grad_out.detach()),
            _view(g)]
    desc = _lib.EmbeddingDesc(int(quant), 1 if bag else 0)
    args = _lib.EmbeddingBackwardArgs(*[_ptr(v) for v in keep])
    _Call(grad_out)("bie_embedding_backward", ctypes.byref(desc), ctypes.byref(args))
    del keep
    return g


def _sparse_rows(quant, indices, grad_out, scale, bag):
    """(distinct rows, their gradient rows) of a backward."""
    rows, inverse = torch.unique(indices.detach().reshape(-1), return_inverse=True)
    inverse = inverse.reshape(indices.shape)
    g = embedding_backward(quant, indices, grad_out, rows.numel(), scale, bag, inverse)
    return rows, g


class BinaryEmbeddingParameter(nn.Parameter):
    """A packed binary table (uint8). The lookups' backward appends (rows, grad_rows) to
    `sparse_grads` and sets `active_indices` (Bitorch Engine's name) to the rows read; DiodeMix
    consumes and clears them."""

    def __new__(cls, data=None, requires_grad=False, active_indices=None):
        p = super().__new__(cls, data, requires_grad=requires_grad)
        p.active_indices = active_indices
        p.sparse_grads = []
        return p


def _sink(qweight, rows, g):
    if not hasattr(qweight, "sparse_grads"):
        qweight.sparse_grads = []
    qweight.sparse_grads.append((rows, g))
    qweight.active_indices = rows


class BinaryEmbeddingForward(torch.autograd.Function):
    """BinaryEmbeddingForward.apply(input, qweight, embed_scale, ori_embedding_dim, is_train): the
    packed binary lookup scale[r] * (+-1) in embed_scale's dtype. Its backward gives qweight the
    gradient rows of the indices read (in qweight.sparse_grads), scaled by the row scales."""

    @staticmethod
    def forward(ctx, input, qweight, embed_scale, ori_embedding_dim, is_train=True):
        ctx.is_train = bool(is_train)
        ctx.qweight = qweight
        if is_train:
            ctx.save_for_backward(input, embed_scale)
        return embedding_forward(QUANT_BINARY, input, qweight, embed_scale, False, embed_scale.dtype,
                                 int(ori_embedding_dim))

    @staticmethod
    def backward(ctx, grad_out):
        if not ctx.is_train:
            raise RuntimeError("bie: backward through an embedding lookup made with is_train=False")
        input, scale = ctx.saved_tensors
        rows, g = _sparse_rows(QUANT_BINARY, input, grad_out, scale, False)
        _sink(ctx.qweight, rows, g)
        return None, None, None, None, None


class _BagForward(torch.autograd.Function):
    """The bag's vote: sign of the sum of the rows' +-1 values; the gradient passes straight
    through the sign to every lookup of the bag."""

    @staticmethod
    def forward(ctx, input, qweight, dim, out_dtype, is_train, anchor=None):
        ctx.qweight = qweight
        ctx.is_train = bool(is_train)
        if is_train:
            ctx.save_for_backward(input)
        s = embedding_forward(QUANT_BINARY, input, qweight, None, True, torch.float32, dim)
        return torch.where(s >= 0, 1.0, -1.0).to(out_dtype)

    @staticmethod
    def backward(ctx, grad_out):
        if not ctx.is_train:
            raise RuntimeError("bie: backward through an embedding bag made with is_train=False")
        (input,) = ctx.saved_tensors
        rows, g = _sparse_rows(QUANT_BINARY, input, grad_out, None, True)
        _sink(ctx.qweight, rows, g)
        return None, None, None, None, None, None


def _check_sizes(num_embeddings, embedding_dim, padding_idx):
    for name, v in (("num_embeddings", num_embeddings), ("embedding_dim", embedding_dim)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"bie: {name} must be a positive int, got {v!r}")
    if padding_idx is None:
        return None
    if isinstance(padding_idx, bool) or not isinstance(padding_idx, int) or \
            not -num_embeddings <= padding_idx < num_embeddings:
        raise ValueError(f"bie: padding_idx = {padding_idx!r} must be an int in [-{num_embeddings}, {num_embeddings})")
    return padding_idx % num_embeddings


def _positional(args, kwargs, cls):
    """Bitorch Engine's embeddings take num_embeddings and embedding_dim as keywords; positional
    values are accepted too."""
    names = ("num_embeddings", "embedding_dim")
    if len(args) > 2:
        raise TypeError(f"bie: {cls}() takes num_embeddings and embedding_dim, got {len(args)} positional values")
    for n, v in zip(names, args):
        if n in kwargs:
            raise TypeError(f"bie: {cls}() got {n} twice")
        kwargs[n] = v
    for n in names:
        if n not in kwargs:
            raise TypeError(f"bie: {cls}() needs {n}")
    return kwargs


def _check_indices(input, n):
    if not isinstance(input, torch.Tensor):
        raise TypeError("bie: an embedding takes a tensor of indices")
    if input.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"bie: indices must be int32 or int64 (torch.long), not {input.dtype}")
    if input.device.type == "cpu" and input.numel():
        lo, hi = int(input.min()), int(input.max())
        if lo < 0 or hi >= n:
            raise IndexError(f"bie: index {lo if lo < 0 else hi} is outside [0, {n}) (num_embeddings = {n})")


class _BinaryTable(nn.Module):
    """What the two binary embeddings share: the packed table as a parameter of DiodeMix."""

    def _packed(self, pm1):
        """uint8 rows of the signs of pm1 [V, D]."""
        return F.pack_weight(QUANT_BINARY, pm1)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        q = state_dict.get(prefix + "qweight")
        if q is not None and (q.dtype != torch.uint8 or tuple(q.shape) != tuple(self.qweight.shape)):
            error_msgs.append(f"{prefix}qweight: a {type(self).__name__} keeps a uint8 table of shape "
                              f"{tuple(self.qweight.shape)}, the checkpoint has {q.dtype} {tuple(q.shape)}")
            return
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)


class BinaryEmbeddingCuda(_BinaryTable):
    """Bitorch Engine's BinaryEmbeddingCuda(num_embeddings=, embedding_dim=, padding_idx=None,
    dtype=torch.float) on the CPU and CUDA devices. Call prepare_params() (bie.prepare_bie_layers)
    once after construction: it packs the float initial table into qweight and sets scale_w."""

    def __init__(self, *args, device=None, **kwargs):
        super().__init__()
        kw = _positional(args, kwargs, "BinaryEmbeddingCuda")
        self.num_embeddings, self.embedding_dim = kw.pop("num_embeddings"), kw.pop("embedding_dim")
        self.padding_idx = _check_sizes(self.num_embeddings, self.embedding_dim, kw.pop("padding_idx", None))
        self.dtype = kw.pop("dtype", torch.float)
        if kw:
            raise TypeError(f"bie: BinaryEmbeddingCuda() got unexpected keywords {sorted(kw)}")
        if not isinstance(self.dtype, torch.dtype) or not self.dtype.is_floating_point:
            raise TypeError(f"bie: dtype must be a floating-point torch.dtype, not {self.dtype!r}")
        v, d = self.num_embeddings, self.embedding_dim
        self.weight = nn.Parameter(torch.empty((v, d), device=device), requires_grad=False)
        nn.init.normal_(self.weight)
        self.qweight = BinaryEmbeddingParameter(torch.zeros((v, (d + 7) // 8), dtype=torch.uint8, device=device))
        self.qweight.embedding_dim = d
        self.register_buffer("scale_w", torch.zeros((v, 1), dtype=self.dtype, device=device))
        self._prepared = False

    def prepare_params(self):
        """Packs the (centred) float table into qweight with per-row scales, as Bitorch Engine's
        prepare_params (skipped when qweight and scale_w were loaded from a checkpoint)."""
        if self.weight is not None and (not bool(self.qweight.any()) or not bool(self.scale_w.any())):
            with torch.no_grad():
                w = self.weight.to(torch.float32) - self.weight.to(torch.float32).mean()
                if self.padding_idx is not None:
                    w[self.padding_idx] = 0
                pad = (-self.embedding_dim) % 8
                wp = torch.cat([w, -torch.ones((w.shape[0], pad), device=w.device)], dim=1) if pad else w
                self.scale_w.copy_((wp.abs().sum(dim=1, keepdim=True) / wp.shape[1]).to(self.dtype))
                self.qweight.data.copy_(self._packed(w))
        self.weight = None
        self._prepared = True

    def forward(self, input):
        _check_indices(input, self.num_embeddings)
        if not self._prepared:
            raise RuntimeError("bie: BinaryEmbeddingCuda has no packed table yet: call prepare_params() "
                               "(bie.prepare_bie_layers(model)) after construction or loading")
        # (a uint8 table cannot require a gradient in stock PyTorch: in training the scale is passed as
        # a leaf that does, so that the backward runs and gives the table its sparse rows)
        scale = self.scale_w.detach().requires_grad_() if self.training and torch.is_grad_enabled() else self.scale_w
        return BinaryEmbeddingForward.apply(input, self.qweight, scale, self.embedding_dim, self.training)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # a checkpoint of a prepared table holds qweight and scale_w only (prepare_params drops weight)
        packed_only = prefix + "qweight" in state_dict and prefix + "weight" not in state_dict
        if packed_only:
            self.weight = None
        n = len(error_msgs)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        if packed_only and len(error_msgs) == n:
            self._prepared = True

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}, padding_idx={self.padding_idx}"


BinaryEmbedding = BinaryEmbeddingCuda


class BinaryEmbeddingBag(_BinaryTable):
    """Bitorch Engine's BinaryEmbeddingBag(num_embeddings=, embedding_dim=, padding_idx=None) with a
    bit-packed table (qweight uint8; Bitorch Engine's bool `weight` loads into it). input [B, L]
    -> out [B, D]: +1 where at least ceil(L/2) of the bag's rows have the bit set, else -1, in
    `dtype` (default float32; Bitorch Engine returned the index dtype, which no gradient can pass)."""

    def __init__(self, *args, device=None, dtype=torch.float, **kwargs):
        super().__init__()
        kw = _positional(args, kwargs, "BinaryEmbeddingBag")
        self.num_embeddings, self.embedding_dim = kw.pop("num_embeddings"), kw.pop("embedding_dim")
        self.padding_idx = _check_sizes(self.num_embeddings, self.embedding_dim, kw.pop("padding_idx", None))
        if kw:
            raise TypeError(f"bie: BinaryEmbeddingBag() got unexpected keywords {sorted(kw)}")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"bie: dtype must be a floating-point torch.dtype, not {dtype!r}")
        self.dtype = dtype
        bits = torch.rand((self.num_embeddings, self.embedding_dim), device=device) > 0.5
        if self.padding_idx is not None:
            bits[self.padding_idx] = False
        self.qweight = BinaryEmbeddingParameter(self._packed(bits.float() * 2 - 1))
        self.qweight.embedding_dim = self.embedding_dim

    def prepare_params(self):
        """Nothing to prepare (the table is packed from the start); kept for the protocol."""

    def forward(self, input):
        _check_indices(input, self.num_embeddings)
        if input.dim() != 2:
            raise ValueError(f"bie: BinaryEmbeddingBag takes bags [batch, length] of indices, got {input.dim()}-D")
        anchor = torch.zeros((), requires_grad=True) if self.training and torch.is_grad_enabled() else None
        return _BagForward.apply(input, self.qweight, self.embedding_dim, self.dtype, self.training, anchor)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        w = state_dict.get(prefix + "weight")
        if w is not None and prefix + "qweight" not in state_dict:  # Bitorch Engine's bool table
            if w.dtype != torch.bool or tuple(w.shape) != (self.num_embeddings, self.embedding_dim):
                error_msgs.append(f"{prefix}weight: expected a bool table {(self.num_embeddings, self.embedding_dim)}")
                return
            state_dict = dict(state_dict)
            state_dict[prefix + "qweight"] = self._packed(w.to(self.qweight.device).float() * 2 - 1)
            del state_dict[prefix + "weight"]
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}, padding_idx={self.padding_idx}"


class _QEmbeddingForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, scale_w, quant, dim, is_train, sparse):
        ctx.is_train, ctx.sparse, ctx.quant, ctx.shape = bool(is_train), bool(sparse), quant, (scale_w.numel(), dim)
        if is_train:
            ctx.save_for_backward(input)
        return embedding_forward(quant, input, weight, scale_w, False, torch.float32 if weight.dtype in
                                 (torch.int8, torch.uint8) else weight.dtype, dim)

    @staticmethod
    def backward(ctx, grad_out):
        if not ctx.is_train:
            raise RuntimeError("bie: backward through an embedding lookup made with is_train=False")
        (input,) = ctx.saved_tensors
        if not ctx.needs_input_grad[1]:
            return (None,) * 7
        if ctx.sparse:
            rows, g = _sparse_rows(ctx.quant, input, grad_out, None, False)
            gw = torch.sparse_coo_tensor(rows.unsqueeze(0), g, ctx.shape)
        else:
            gw = embedding_backward(ctx.quant, input, grad_out, ctx.shape[0])
        return None, gw, None, None, None, None, None


class _QEmbedding(nn.Module):
    quant = None

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, dtype=torch.float, device=None, sparse=False,
                 w_bit=None):
        super().__init__()
        if w_bit is not None and w_bit != self.quant:
            raise ValueError(f"bie: this embedding is {self.quant}-bit (w_bit = {self.quant})")
        self.padding_idx = _check_sizes(num_embeddings, embedding_dim, padding_idx)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"bie: dtype must be a floating-point torch.dtype, not {dtype!r}")
        self.num_embeddings, self.embedding_dim, self.dtype, self.sparse = num_embeddings, embedding_dim, dtype, sparse
        self.w_bit = self.quant
        self.weight = nn.Parameter(torch.empty((num_embeddings, embedding_dim), dtype=dtype, device=device))
        nn.init.normal_(self.weight)
        if self.padding_idx is not None:
            with torch.no_grad():
                self.weight[self.padding_idx].fill_(0)
        self.register_buffer("scale_w", torch.ones((num_embeddings, 1), dtype=torch.float32, device=device))
        self.register_buffer("qweight", None)
        self._qkey = None

    def prepare_params(self):
        """Per-row scales from the float table: 4-bit max(2*mean|row|/5.6345, 1e-5), 8-bit
        max(2*mean|row|/11.269, 1e-5) (the layers' weight scales, per row)."""
        if self.weight is None:
            return
        div = 5.6345 if self.quant == QUANT_INT4 else 11.269
        with torch.no_grad():
            s = 2 * self.weight.detach().to(torch.float32).abs().mean(dim=1, keepdim=True) / div
            self.scale_w.copy_(s.clamp_min(1e-5))
        self._qkey = None

    def generate_quantized_weight(self, qweight_only=False):
        """Packs the table: 4-bit int8 nibbles [V, ceil(D/2)], 8-bit int8 codes [V, D]."""
        if self.weight is None:
            return
        w = self.weight.detach().to(torch.float32) / self.scale_w
        lo, hi = (-8, 7) if self.quant == QUANT_INT4 else (-128, 127)
        codes = torch.round(w).clamp_(lo, hi).to(torch.int8)
        one_column = self.embedding_dim == 1  # (its packed form would look like the codes)
        self.qweight = F.pack_weight(QUANT_INT4, codes) if self.quant == QUANT_INT4 and not one_column else codes
        self._qkey = (self.weight._version, self.scale_w._version)
        if qweight_only:
            self.weight = None

    def forward(self, input):
        _check_indices(input, self.num_embeddings)
        if self.weight is None or not self.training:
            if self.weight is not None and self._qkey != (self.weight._version, self.scale_w._version):
                self.generate_quantized_weight()
            return embedding_forward(self.quant, input, self.qweight, self.scale_w, False, self.dtype,
                                     self.embedding_dim)
        return _QEmbeddingForward.apply(input, self.weight, self.scale_w, self.quant, self.embedding_dim,
                                        self.training, self.sparse)

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}, padding_idx={self.padding_idx}, sparse={self.sparse}"


class Q4Embedding(_QEmbedding):
    """4-bit embedding: value = scale_w[r] * clamp(rne(W[r, d] / scale_w[r]), -8, 7)."""

    quant = QUANT_INT4


class Q8Embedding(_QEmbedding):
    """8-bit embedding: value = scale_w[r] * clamp(rne(W[r, d] / scale_w[r]), -128, 127)."""

    quant = QUANT_INT8
