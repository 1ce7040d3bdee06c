# SPDX-License-Identifier: Apache-2.0
"""bie.mpq (weight-only n-bit layers), bie.gptq and bie.mpq_optim against torch references."""
import os
import tempfile

import pytest
import torch
import torch.nn as nn

from bie import mpq
from bie.gptq import HessianCollector, gptq_quantize_weight, quantize_model
from bie.mpq_io import load_gptq, save_gptq
from bie.mpq_optim import MPQAdam


def _torch_weight(m):
    """W [K, N] in feature order (the inverse of perm applied) from the layer's codes and statistics."""
    codes = m.codes().to(torch.float32)
    K = m.in_channels
    g = torch.arange(K, device=codes.device) // m.group_size_eff
    s = m.scales.to(torch.float32)[g]
    if m.zero_mode == mpq.ZERO_SYM:
        b = torch.tensor([m.w_bit] * K, device=codes.device) if not m.mixed else m.group_bits.long().to(codes.device)[g]
        w = s * (codes - (2.0 ** (b - 1))[:, None])
    elif m.zero_mode == mpq.ZERO_CODE:
        w = s * (codes - m.zeros.to(torch.float32)[g])
    else:
        w = s * codes - m.zeros.to(torch.float32)[g]
    if m.has_perm:
        out = torch.empty_like(w)
        out[m.q_perm.long()] = w
        w = out
    if m.has_channel_scale:
        w = w * m.channel_scale.to(torch.float32)[:, None]
    return w


@pytest.mark.parametrize("bits", [2, 3, 4, 8, 0])
def test_pack_matches_libbie(bits):
    K, N, gs = 100, 7, 32
    gb = [2, 4, 8, 3] if bits == 0 else None
    if bits == 0:
        K = 128
    layer = mpq.MPQLinear(K, N, w_bit=bits or 4, group_size=gs, group_bits=gb, dtype=torch.float32)
    b_rows = torch.tensor([bits] * K) if bits else torch.tensor(gb).repeat_interleave(gs)[:K]
    codes = (torch.rand(K, N) * (2.0 ** b_rows[:, None])).floor().to(torch.int32)
    qw = mpq.pack_codes(codes, bits, gs, gb)
    assert torch.equal(mpq.unpack_codes(qw, K, bits, gs, gb), codes)
    layer.set_quantized(codes, torch.rand(layer.scales.shape) + 0.1)
    assert torch.equal(layer.qweight, qw)
    # libbie's own unpacker reads the same codes back (bie_wq_unpack through dequantize)
    w = layer.dequantize()
    assert torch.allclose(w, _torch_weight(layer), rtol=1e-6, atol=1e-6)


def test_rtn_matches_bie_quantize():
    K, N = 96, 24
    w = torch.randn(K, N) * 0.1
    for sym in (False, True):
        s, z = mpq.rtn_params(w, 4, 32, sym, stat_dtype=torch.float16)
        codes = mpq.quantize_codes(w, s, z, 4, 32, mpq.ZERO_SYM if sym else mpq.ZERO_CODE)
        layer = mpq.MPQLinear(K, N, w_bit=4, group_size=32, dtype=torch.float16, use_gba_quant=sym, asym=not sym)
        layer.quantize_from(w.t())
        assert torch.equal(layer.codes(), codes)
        assert torch.equal(layer.scales, s)
        err = (layer.dequantize() - w).abs()
        assert bool((err <= 0.5 * s.to(torch.float32).repeat_interleave(32, 0) * 1.01 + 1e-6).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("zero", ["gptq", "sym", "gba"])
@pytest.mark.parametrize("N", [45, 48])
def test_forward_backward(dtype, zero, N, device):
    if dtype == torch.float16 and device.type == "cpu":
        pytest.skip("float16 matmuls of the torch reference need a GPU")
    torch.manual_seed(0)
    K, M = 256, 5
    kw = dict(gptq=dict(use_gba_quant=False), sym=dict(use_gba_quant=True, asym=False),
              gba=dict(use_gba_quant=True, asym=False))[zero]
    m = mpq.MPQLinear(K, N, w_bit=4, group_size=64, dtype=dtype, disable_bias=False, device=device, **kw)
    lin = nn.Linear(K, N).to(device)
    perm = torch.randperm(K).to(torch.int32).to(device)
    m.quantize_from(lin.weight, perm=perm)
    if zero == "sym":
        m.zero_mode = mpq.ZERO_SYM
        m.quantize_from(lin.weight, perm=perm)
    m.bias = nn.Parameter(lin.bias.detach().to(dtype))
    W = _torch_weight(m)
    x = torch.randn(2, M, K, dtype=dtype, device=device, requires_grad=True)
    y = m(x)
    want = x.detach().to(torch.float32) @ W + m.bias.detach().to(torch.float32)
    tol = {torch.bfloat16: 2e-2, torch.float16: 4e-3}.get(dtype, 1e-4)
    assert torch.allclose(y.to(torch.float32), want, rtol=tol, atol=tol)
    g = torch.randn_like(y)
    m.train()
    y.backward(g)
    gx_want = g.to(torch.float32) @ W.t()
    assert torch.allclose(x.grad.to(torch.float32), gx_want, rtol=tol, atol=tol * 10)
    xp = x.detach().reshape(-1, K).to(torch.float32)[:, perm.long()]
    pg_want = xp.t() @ g.reshape(-1, N).to(torch.float32)
    assert torch.allclose(m.qweight.privileged_grad, pg_want, rtol=tol, atol=tol * 10)
    assert torch.allclose(m.bias.grad.to(torch.float32), g.reshape(-1, N).sum(0).to(torch.float32), rtol=tol, atol=tol)


def test_cached_weight_views_follow_the_layer():
    """The layer reuses its weight struct across calls: in-place changes, replaced tensors and a new
    bias must all show in the next call, with and without autograd."""
    torch.manual_seed(3)
    m = mpq.MPQLinear(96, 40, w_bit=4, group_size=32, dtype=torch.float32, use_gba_quant=False, disable_bias=False)
    m.quantize_from(torch.randn(40, 96) * 0.1)
    x = torch.randn(3, 96)

    def want():
        return x @ _torch_weight(m) + m.bias.detach()

    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            assert torch.allclose(m(x), want(), atol=1e-4)
            with torch.no_grad():
                m.scales.mul_(2.0)  # in place: same address
            assert torch.allclose(m(x), want(), atol=1e-4)
            m.quantize_from(torch.randn(40, 96) * 0.1)  # new qweight, scales and zeros tensors
            assert torch.allclose(m(x), want(), atol=1e-4)
            m.bias = nn.Parameter(torch.randn(40))
            assert torch.allclose(m(x), want(), atol=1e-4)
            m.scales = m.scales.t().contiguous().t()  # a non-contiguous tensor takes the uncached path
            assert torch.allclose(m(x), want(), atol=1e-4)
            m.scales = m.scales.contiguous()


def test_int8_activations_close():
    m = mpq.MPQLinear(256, 64, w_bit=4, group_size=128, dtype=torch.float16, use_gba_quant=False)
    m.quantize_from(torch.randn(64, 256) * 0.05)
    x = torch.randn(1, 256)
    y = m(x)
    m.int8_activations = True
    y8 = m(x)
    assert (y - y8).abs().max() <= 0.02 * y.abs().max() + 1e-3


def test_gptq_beats_rtn_and_act_order_is_exact():
    torch.manual_seed(1)
    K, N, n = 128, 32, 512
    base = torch.randn(n, K) @ (torch.randn(K, K) * 0.2 + torch.eye(K))  # correlated inputs
    lin = nn.Linear(K, N, bias=False)
    col = HessianCollector({"l": lin})
    lin(base)
    col.remove()
    for act_order in (False, True):
        codes, s, z, perm = gptq_quantize_weight(lin.weight, col.H["l"], 3, 32, act_order=act_order,
                                                 stat_dtype=torch.float32)
        q = mpq.MPQLinear(K, N, w_bit=3, group_size=32, dtype=torch.float32, use_gba_quant=False)
        q.set_quantized(codes, s, z, perm)
        r = mpq.MPQLinear(K, N, w_bit=3, group_size=32, dtype=torch.float32, use_gba_quant=False)
        r.quantize_from(lin.weight)
        ref = lin(base).detach()
        e_gptq = (q(base) - ref).pow(2).mean()
        e_rtn = (r(base) - ref).pow(2).mean()
        assert e_gptq < 0.8 * e_rtn, (act_order, float(e_gptq), float(e_rtn))
        # GPTQ's checkpoint form (v1 qzeros, g_idx) round-trips exactly through save/load
        with tempfile.TemporaryDirectory() as d:
            model = nn.Sequential(q)
            path = os.path.join(d, "q.safetensors")
            save_gptq(model, path)
            fresh = nn.Sequential(mpq.MPQLinear(K, N, w_bit=3, group_size=32, dtype=torch.float32, use_gba_quant=False))
            load_gptq(fresh, path)
            assert torch.equal(_torch_weight(fresh[0]), _torch_weight(q))


def test_quantize_model_and_optimizer_step():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 16))
    data = torch.randn(256, 64)
    target = torch.randn(256, 16)
    quantize_model(model, lambda mdl: mdl(data), w_bit=4, group_size=32)
    assert all(isinstance(model[i], mpq.MPQLinear) for i in (0, 2))
    model.train()
    opt = MPQAdam(model.parameters(), lr=1e-2)
    before = [m.codes().clone() for m in mpq.wq_layers(model)]
    losses = []
    for _ in range(10):
        loss = (model(data) - target).pow(2).mean()
        losses.append(float(loss))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert any(not torch.equal(b, m.codes()) for b, m in zip(before, mpq.wq_layers(model)))
    assert losses[-1] < losses[0]


def test_lora_adapter_trains_with_frozen_low_bit_weight():
    torch.manual_seed(3)
    base = mpq.MPQLinear(32, 8, w_bit=4, group_size=32, dtype=torch.float32, use_gba_quant=False)
    base.quantize_from(torch.randn(8, 32) * 0.1)
    lora = mpq.LoRALinear(base, r=4)
    x = torch.randn(64, 32, requires_grad=True)
    t = torch.randn(64, 8)
    opt = torch.optim.Adam([lora.lora_A.weight, lora.lora_B.weight], lr=1e-2)
    codes = base.codes().clone()
    l0 = None
    for _ in range(20):
        loss = (lora(x) - t).pow(2).mean()
        l0 = l0 if l0 is not None else float(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss) < l0
    assert torch.equal(codes, base.codes())
    assert x.grad is not None and getattr(base.qweight, "privileged_grad", None) is None


def test_gba_and_exl2_mappings():
    G, N, K = 2, 8, 64
    m = mpq.MPQLinear(K, N, w_bit=4, group_size=32, dtype=torch.float32, use_gba_quant=True, asym=False)
    codes = torch.randint(0, 16, (K, N), dtype=torch.int32)
    qw = mpq.pack_codes(codes, 4, 32)
    stat = torch.randint(0, 256, (G, N // 4, 4), dtype=torch.uint8)
    sz, ss = torch.rand(G, N // 4, 1), torch.rand(G, N // 4, 1) * 0.01
    zz, zs = torch.rand(G, N // 4, 1), torch.rand(G, N // 4, 1) * 0.01
    m.load_gba(qw, None, sz, ss, qstatistic=stat, qzeros_zeros=zz, qzeros_scales=zs)
    scale = ((stat.to(torch.int32) >> 4).float() - sz) * ss
    zero = ((stat.to(torch.int32) & 15).float() - zz) * zs
    g = torch.arange(K) // 32
    want = scale.reshape(G, N)[g] * codes.float() - zero.reshape(G, N)[g]
    assert torch.allclose(m.dequantize(), want, rtol=1e-6, atol=1e-7)
    e = mpq.MBWQLinear(K, N, w_bit=4, group_size=32, dtype=torch.float32, use_mbw=True, group_bits=[4, 2])
    bits = [4, 2]
    codes = torch.cat([torch.randint(0, 16, (32, N)), torch.randint(0, 4, (32, N))]).to(torch.int32)
    qw = mpq.pack_codes(codes, 0, 32, bits)
    q_groups = torch.tensor([4, 0, 2, 4], dtype=torch.int16)
    qs = torch.randint(0, 16, (G, N), dtype=torch.int32)
    q_scale = mpq.pack_codes(qs.t().contiguous(), 4, N).t().contiguous()
    smax = torch.rand(G)
    e.load_exl2(qw, q_groups, q_scale, smax)
    scale = (qs.float() + 1) ** 2 * smax[:, None] / 256
    want = scale[g] * (codes.float() - torch.tensor([8.0] * 32 + [2.0] * 32)[:, None])
    assert torch.allclose(e.dequantize(), want, rtol=1e-6, atol=1e-7)
