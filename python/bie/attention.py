# SPDX-License-Identifier: Apache-2.0
"""Binary multi-head attention (Bitorch Engine's BMHA) on bie's binary linear layers and matmuls.

    q, k, v = BinaryLinear projections of hidden_states, split into heads [bs, heads, T, head_dim]
    scores  = score_matmul(q + bias_q, k + bias_k) / sqrt(head_dim)      [bs, heads, T, T]
    probs   = dropout(softmax(scores, with -1e9 where mask == 0))
              (mask [bs, T] masks keys; [bs, T, T] and [bs, heads, T, T] masks are taken too)
    context = context_matmul(probs, (v + bias_v)^T)                      [bs, heads, T, head_dim]
    output  = BinaryLinear(context merged back to [bs, T, hidden_dim])
    returns (output, probs)

score_matmul and context_matmul are "binary" (BinaryMatMul), "q4" (Q4MatMul), "q8" (Q8MatMul) or
"float" (torch.matmul, the path Bitorch Engine's BMHA runs). The defaults, a binary score matmul and
an 8-bit context matmul, keep every product of the attention low-bit: the attention probabilities
are non-negative, so their sign codes would all be +1 and a binary context matmul would average
the values' signs regardless of the scores (Bitorch Engine's commented-out binary variant).
"""
import math

import torch
import torch.nn as nn

from .layers import BinaryLinear
from .matmul import BinaryMatMul, Q4MatMul, Q8MatMul

__all__ = ["BMHA", "LearnableBias"]

_MATMULS = {"binary": BinaryMatMul, "q4": Q4MatMul, "q8": Q8MatMul, "float": None}


class LearnableBias(nn.Module):
    """x + bias, with a learnable bias [out_chn] (zeros) along the last dimension."""

    def __init__(self, out_chn):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(out_chn))

    def forward(self, x):
        return x + self.bias.expand_as(x)


class _FloatMatMul(nn.Module):
    def forward(self, x, y):
        return torch.matmul(x, y.transpose(-1, -2))


def _matmul(kind, dtype):
    if kind not in _MATMULS:
        raise ValueError(f"bie: a BMHA matmul is one of {sorted(_MATMULS)}, not {kind!r}")
    cls = _MATMULS[kind]
    return _FloatMatMul() if cls is None else cls(dtype=dtype)


class BMHA(nn.Module):
    """BMHA(input_dim, hidden_dim, num_heads, dtype=torch.float, score_matmul="binary",
    context_matmul="q8", dropout=0.1): Bitorch Engine's binary multi-head attention. The binary
    linear layers follow the usual protocol (bie.prepare_bie_layers(model) once)."""

    def __init__(self, input_dim, hidden_dim, num_heads, dtype=torch.float, score_matmul="binary",
                 context_matmul="q8", dropout=0.1, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name, v in (("input_dim", input_dim), ("hidden_dim", hidden_dim), ("num_heads", num_heads)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"bie: {name} must be a positive int, got {v!r}")
        if hidden_dim % num_heads != 0:
            raise ValueError(f"The hidden size ({hidden_dim}) is not a multiple of the number of attention heads "
                             f"({num_heads})")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"bie: dropout must be in [0, 1), got {dropout!r}")
        self.dtype = dtype
        self.num_heads = num_heads
        self.head_dim = hidden_dim // num_heads
        self.hidden_dim = hidden_dim
        self.input_dim = input_dim
        self.q_linear = BinaryLinear(input_dim, hidden_dim, dtype=dtype)
        self.v_linear = BinaryLinear(input_dim, hidden_dim, dtype=dtype)
        self.k_linear = BinaryLinear(input_dim, hidden_dim, dtype=dtype)
        self.dropout = nn.Dropout(dropout)
        self.out = BinaryLinear(hidden_dim, input_dim, dtype=dtype)
        self.move_q = LearnableBias(self.head_dim)
        self.move_k = LearnableBias(self.head_dim)
        self.move_v = LearnableBias(self.head_dim)
        self.score_matmul = _matmul(score_matmul, dtype)
        self.context_matmul = _matmul(context_matmul, dtype)

    def _heads(self, t, bs):
        return t.view(bs, -1, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, hidden_states, mask=None):
        if hidden_states.dim() != 3 or hidden_states.shape[-1] != self.input_dim:
            raise ValueError(f"bie: BMHA takes hidden_states [batch, length, {self.input_dim}], got "
                             f"{tuple(hidden_states.shape)}")
        bs = hidden_states.size(0)
        q = self.move_q(self._heads(self.q_linear(hidden_states), bs))
        k = self.move_k(self._heads(self.k_linear(hidden_states), bs))
        v = self.move_v(self._heads(self.v_linear(hidden_states), bs))
        scores = self.score_matmul(q, k) / math.sqrt(self.head_dim)
        if mask is not None:  # [bs, T] (keys), [bs, T, T] or [bs, heads, T, T]
            mask = mask[:, None, None, :] if mask.dim() == 2 else mask.unsqueeze(1) if mask.dim() == 3 else mask
            scores = scores.masked_fill(mask == 0, -1e9)
        probs = self.dropout(nn.functional.softmax(scores, dim=-1))
        context = self.context_matmul(probs, v.transpose(-1, -2))
        context = context.transpose(1, 2).contiguous().view(bs, -1, self.hidden_dim)
        return self.out(context), probs
