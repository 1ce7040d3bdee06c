# SPDX-License-Identifier: Apache-2.0
"""Fuzzes the PyTorch binding with hypothesis: random quantizations, shapes (zero-sized ones too),
dtypes, layouts (contiguous, sliced, transposed), optional arguments and values (NaN, infinities,
huge) for every functional entry point. What must hold: a call returns tensors of the documented
shape and dtype, or raises the binding's documented exceptions (BieError for what libbie refuses,
TypeError / ValueError for what the binding refuses itself) — never another exception, never a
crash of the process; and a valid forward equals the pure-PyTorch reference (bie.reference)
exactly, as the binding's tests require on fixed cases.

BIE_FUZZ_SECONDS (default 10) sets the budget: about 15 examples a second per test.
"""
import math
import os

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bie
from bie import functional as F
from bie import reference as R

EXAMPLES = max(20, int(float(os.environ.get("BIE_FUZZ_SECONDS", "10")) * 15))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))
ALLOWED = (bie.BieError, TypeError, ValueError)
QUANTS = [bie.QUANT_BINARY, bie.QUANT_INT4, bie.QUANT_INT8]
FLOATS = [torch.float32, torch.float16, torch.bfloat16]


def values(draw, shape, dtype, special):
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(draw(st.integers(0, 2**31))))
    if special and t.numel():
        flat = t.view(-1)
        for _ in range(draw(st.integers(0, 3))):
            flat[draw(st.integers(0, flat.numel() - 1))] = draw(st.sampled_from([math.nan, math.inf, -math.inf, 3e38, 0.0]))
    return t.to(dtype)


def layout(draw, t):
    kind = draw(st.sampled_from(["contiguous", "slice", "transposed"]))
    if kind == "slice" and t.dim() >= 1:
        big = torch.zeros(*t.shape[:-1], t.shape[-1] * 2 + 1, dtype=t.dtype)
        v = big[..., 1::2]
        v.copy_(t)
        return v
    if kind == "transposed" and t.dim() == 2:
        return t.t().contiguous().t()
    return t


@st.composite
def linear_case(draw):
    quant = draw(st.sampled_from(QUANTS))
    lead = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=2)))
    k = draw(st.integers(0, 70))
    n = draw(st.integers(0, 9))
    dtype = draw(st.sampled_from(FLOATS))
    special = draw(st.booleans())
    x = layout(draw, values(draw, (*lead, k), dtype, special))
    w = values(draw, (n, k), draw(st.sampled_from(FLOATS)), special)
    bias = values(draw, (k,), dtype, False) * 0.3 if draw(st.booleans()) else None
    sa = torch.tensor(draw(st.sampled_from([1.0, 0.05, 0.0, -1.0, math.nan, 3e38])))
    sw = torch.tensor(draw(st.sampled_from([0.5, 0.01, 0.0, math.inf, 3e38])))
    out = draw(st.sampled_from([None, torch.int32, torch.float32]))
    return quant, x, w, bias, sa, sw, out


@SETTINGS
@given(linear_case())
def test_linear_forward(case):
    quant, x, w, bias, sa, sw, out = case
    try:
        y = F.linear_forward(quant, x, w, sa, sw, bias, out_dtype=out)
    except ALLOWED:
        return
    assert y.shape == (*x.shape[:-1], w.shape[0])
    assert y.dtype == (out or x.dtype)
    want = R.forward(quant, x, w, sa, sw, bias, out_dtype=out)
    assert torch.equal(y, want) or (y.isnan() == want.isnan()).all() and torch.equal(y.nan_to_num(), want.nan_to_num())


@SETTINGS
@given(linear_case(), st.tuples(st.booleans(), st.booleans(), st.booleans(), st.booleans()))
def test_linear_backward(case, needs):
    quant, x, w, bias, sa, sw, _ = case
    g = torch.randn(*x.shape[:-1], w.shape[0]).to(x.dtype)
    try:
        grads = F.linear_backward(quant, x, w, sa, sw, g, bias, needs=needs)
    except ALLOWED:
        return
    gx, gw, gs, gb = grads
    for t, want, shape in ((gx, needs[0], x.shape), (gw, needs[1], w.shape),
                           (gb, needs[3] and bias is not None, (x.shape[-1],))):
        assert (t is not None) == bool(want)
        if t is not None:
            assert t.shape == shape
    assert (gs is not None) == bool(needs[2])


@st.composite
def conv_case(draw):
    quant = draw(st.sampled_from(QUANTS))
    n, c, h, w_, o = (draw(st.integers(0, 3)), draw(st.integers(0, 9)), draw(st.integers(1, 8)),
                      draw(st.integers(1, 8)), draw(st.integers(1, 6)))
    ks = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    stride, pad, dil = draw(st.integers(0, 3)), draw(st.integers(-1, 2)), draw(st.integers(0, 2))
    pv = draw(st.sampled_from([bie.PAD_ZERO, bie.PAD_MINUS_ONE, bie.PAD_PLUS_ONE, 7]))
    dtype = draw(st.sampled_from(FLOATS))
    x = values(draw, (n, c, h, w_), dtype, draw(st.booleans()))
    if draw(st.booleans()):
        x = x.contiguous(memory_format=torch.channels_last)
    wt = values(draw, (o, c, *ks), draw(st.sampled_from(FLOATS)), False)
    return quant, x, wt, ks, stride, pad, dil, pv


@SETTINGS
@given(conv_case())
def test_conv2d(case):
    quant, x, wt, ks, stride, pad, dil, pv = case
    sa, sw = torch.tensor(1.0), torch.tensor(0.1)
    try:
        y = F.conv2d_forward(quant, x, wt, sa, sw, None, ks, stride, pad, dil, pv)
    except ALLOWED:
        return
    geo = R.Geometry(stride, pad, dil, pv)
    want = R.forward(quant, x, wt, sa, sw, None, geo, ks)
    assert y.dtype == x.dtype and y.shape == want.shape
    assert torch.equal(y, want) or torch.equal(y.nan_to_num(), want.nan_to_num())
    g = torch.randn(*y.shape).to(x.dtype)
    try:
        F.conv2d_backward(quant, x, wt, sa, sw, g, None, ks, stride, pad, dil, pv)
    except ALLOWED:
        pass


@SETTINGS
@given(st.sampled_from(QUANTS), st.integers(0, 6), st.integers(0, 40), st.sampled_from(FLOATS + [torch.int8]),
       st.booleans())
def test_pack_round_trip(quant, o, k, dtype, special):
    w = torch.randn(o, k)
    if special and w.numel():
        w.view(-1)[0] = math.nan
    w = w.to(dtype) if dtype != torch.int8 else torch.randint(-127, 128, (o, k), dtype=torch.int8)
    sw = torch.tensor(0.1) if quant != bie.QUANT_BINARY and dtype != torch.int8 else None
    try:
        p = F.pack_weight(quant, w, sw)
        back = F.unpack_weight(quant, p, (o, k), sw)
    except ALLOWED:
        return
    assert back.shape == (o, k)


@SETTINGS
@given(st.lists(st.integers(0, 5), min_size=0, max_size=2), st.integers(0, 40), st.sampled_from(FLOATS),
       st.booleans(), st.sampled_from([1.0, 0.0, -2.0, math.nan]))
def test_binarize_ste(lead, k, dtype, with_bias, scale):
    x = torch.randn(*lead, k).to(dtype)
    bias = torch.randn(k).to(dtype) if with_bias else None
    try:
        bits, mask = F.binarize_ste(x, torch.tensor(scale), bias)
    except ALLOWED:
        return
    assert bits.shape == (*lead, -(-k // 8)) and mask.shape == bits.shape


@SETTINGS
@given(st.sampled_from(QUANTS), st.integers(0, 5), st.integers(0, 30), st.booleans())
def test_scale_inits(quant, m, k, special):
    x = torch.randn(m, k)
    if special and x.numel():
        x.view(-1)[0] = math.inf
    for fn, args in ((F.activation_scale_init, (quant, x)), (F.weight_scale_init, (quant, x)),
                     (F.weight_to_latent_int8, (x,))):
        try:
            fn(*args)
        except ALLOWED:
            pass
