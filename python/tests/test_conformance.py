# SPDX-License-Identifier: Apache-2.0
"""Conformance: every bie module against a plain-PyTorch restatement of Bitorch Engine's formulas
(reference/bitorch-engine.md, restated below in float64 from its layers' Python code), on random
shapes, forward and backward. Where bie deliberately differs from Bitorch Engine (docs/semantics.md,
"Differences from Bitorch Engine"), the restatement follows the documented bie form, and the test
says which difference it uses:
  - sign(0) = +1 in the backward too (difference 4);
  - n-bit grad_scale_a: the LSQ clip terms use the unmasked gradient (difference 1); Q8 has no
    extra scale_a in grad_x (difference 2);
  - the matmuls' backward is the layers' STE on each operand, with each operand's own code range
    (Bitorch Engine's Q4MatMul backward quantized the gradient to 4 bits and mixed scales);
  - the binary embedding's update direction (tested in test_compat.py).
Forward results are compared exactly (integer sums times the scale product, one rounding), the
gradients within f32 accumulation error."""
import math

import pytest
import torch

import bie

D64 = torch.float64


def sgn(t):
    return torch.where(t >= 0, 1.0, -1.0).to(D64)


def qcodes(t, s, lo, hi):
    return torch.clamp(torch.round(t.to(torch.float32) / s.to(torch.float32)), lo, hi).to(D64)


def codes(quant, t, s):
    """The activation / weight codes of t under scale s (binary: the sign)."""
    t = t.detach()
    return sgn(t) if quant == bie.QUANT_BINARY else qcodes(t, s, *RANGES[quant])


def ste(quant, v, clip, g_full, code):
    """The straight-through gradient of an operand v (its unmasked gradient g_full, its codes) and
    of its clip: binary mask |v/clip| <= 1 and sum(grad * code)/sqrt(numel); n-bit LSQ."""
    r = (v.detach().to(torch.float32) / clip.detach().to(torch.float32)).to(D64)
    if quant == bie.QUANT_BINARY:
        gv = g_full * (r.abs() <= 1)
        return gv, (gv * code).sum() / math.sqrt(v.numel())
    lo, hi = RANGES[quant]
    mid = (r >= lo) & (r <= hi)
    fac = torch.where(r < lo, float(lo), torch.where(r > hi, float(hi), torch.round(r) - r)).to(D64)
    return g_full * mid, (g_full * fac).sum() / math.sqrt(v.numel() * hi)


def close(got, want, what, rel=1e-5):
    got, want = got.detach().to(D64).cpu(), want.detach().to(D64).cpu()
    tol = rel * (want.abs().max().item() if want.numel() else 0.0) + 1e-6
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} vs {tuple(want.shape)}"
    diff = (got - want).abs().max().item() if got.numel() else 0.0
    assert diff <= tol, f"{what}: max |diff| {diff} > {tol}"


def scale_product(a, b):
    """The scale product, once in f32 (the contract's output rounding: f32(acc) * s, in f32)."""
    return a.detach().to(torch.float32) * b.detach().to(torch.float32)


def scaled(acc, s):
    return (acc.to(torch.float32) * s.to(acc.device)).to(D64)


RANGES = {bie.QUANT_INT4: (-8, 7), bie.QUANT_INT8: (-128, 127)}


# --- linear layers -----------------------------------------------------------------------------

def be_linear(quant, x, w, sa, sw, bias_a, g):
    """(y, grad_x, grad_w, grad_scale_a, grad_bias_a): Bitorch Engine's BinaryLinearCuda /
    Q4LinearCutlass / Q8LinearCutlass forward and backward restated."""
    xp = (x.detach().to(torch.float32) + bias_a.detach().to(torch.float32)).to(D64)
    x2 = xp.reshape(-1, xp.shape[-1])
    g2 = g.to(D64).reshape(-1, w.shape[0])
    s = scale_product(sa, sw)
    a, wc = codes(quant, x2, sa), codes(quant, w, sw)
    y = scaled(a @ wc.t(), s)
    gi, gsa = ste(quant, x2, sa, g2 @ (wc * float(sw)), a)
    gw = g2.t() @ (a * float(sa))
    return (y.reshape(*x.shape[:-1], -1), gi.reshape(x.shape), gw, gsa, gi.sum(dim=0))


@pytest.mark.parametrize("cls,quant", [(bie.BinaryLinear, bie.QUANT_BINARY), (bie.BinaryLinearCuda, bie.QUANT_BINARY),
                                       (bie.Q4Linear, bie.QUANT_INT4), (bie.Q8Linear, bie.QUANT_INT8)])
def test_linear(device, cls, quant):
    for _ in range(3):
        k, n = int(torch.randint(1, 70, ())), int(torch.randint(1, 40, ()))
        lead = tuple(torch.randint(1, 5, (2,)).tolist())
        m = cls(k, n).to(device)
        latent = getattr(m, "latent_int8", False)
        bie.prepare_bie_layers(m)
        with torch.no_grad():
            m.bias_a.uniform_(-0.2, 0.2)
        x = (torch.randn(*lead, k) * 2).to(device).requires_grad_()
        y = m(x)
        g = torch.randn_like(y)
        y.backward(g)
        w = m.weight.detach().to(torch.float32)
        want = be_linear(quant, x, w, m.scale_a, m.scale_w, m.bias_a, g)
        assert torch.equal(y.detach().to(D64).cpu(), want[0].cpu()), f"{cls.__name__} forward"
        close(x.grad, want[1], f"{cls.__name__} grad_x")
        gw = m.weight_grad if latent else m.weight.grad
        close(gw, want[2], f"{cls.__name__} grad_weight")
        close(m.scale_a.grad, want[3], f"{cls.__name__} grad_scale_a", 1e-4)
        close(m.bias_a.grad, want[4], f"{cls.__name__} grad_bias_a")


def test_binary_linear_cpp_is_unscaled(device):
    """BinaryLinearCPP returns Bitorch Engine's raw +-1 dot products sign(x) . sign(W)^T."""
    m = bie.BinaryLinearCPP(45, 13).to(device)
    x = torch.randn(7, 45, device=device)
    want = sgn(x) @ sgn(m.weight.detach()).t()
    assert torch.equal(m(x).to(D64), want)
    m.eval()
    assert torch.equal(m(x).to(D64), want)


# --- convolutions ------------------------------------------------------------------------------

def be_conv(quant, x, w, sa, sw, bias_a, g, stride, padding, dilation, pad_value):
    """Bitorch Engine's binary / 4-bit conv restated as a true NCHW cross-correlation (difference 5)
    with the padding value of the layer (0, or -1 as its CPU conv), and its PyTorch backward."""
    tnn = torch.nn.grad
    xp = (x.detach().to(torch.float32) + bias_a.detach().to(torch.float32).view(1, -1, 1, 1)).to(D64)
    s = scale_product(sa, sw)
    a, wc = codes(quant, xp, sa), codes(quant, w, sw)
    ph, pw = padding
    pad_val = -1.0 if pad_value == bie.PAD_MINUS_ONE else 0.0
    ap = torch.nn.functional.pad(a, (pw, pw, ph, ph), value=pad_val)
    y = scaled(torch.nn.functional.conv2d(ap, wc, stride=stride, dilation=dilation), s)
    g = g.to(D64)
    gi_full = tnn.conv2d_input(x.shape, wc * float(sw), g, stride=stride, padding=padding, dilation=dilation)
    gw = tnn.conv2d_weight(ap * float(sa), w.shape, g, stride=stride, dilation=dilation)
    gi, gsa = ste(quant, xp, sa, gi_full, a)
    return y, gi, gw, gsa, gi.sum(dim=(0, 2, 3))


@pytest.mark.parametrize("cls,quant,pad_value", [(bie.BinaryConv2d, bie.QUANT_BINARY, bie.PAD_ZERO),
                                                 (bie.BinaryConv2dCutlass, bie.QUANT_BINARY, bie.PAD_ZERO),
                                                 (bie.BinaryConv2d, bie.QUANT_BINARY, bie.PAD_MINUS_ONE),
                                                 (bie.Q4Conv2d, bie.QUANT_INT4, bie.PAD_ZERO),
                                                 (bie.Q8Conv2d, bie.QUANT_INT8, bie.PAD_ZERO)])
def test_conv(device, cls, quant, pad_value):
    for _ in range(2):
        c, o = int(torch.randint(1, 12, ())), int(torch.randint(1, 9, ()))
        k = int(torch.randint(1, 4, ()))
        stride, padding = int(torch.randint(1, 3, ())), int(torch.randint(0, 2, ()))
        dilation = int(torch.randint(1, 3, ()))
        kw = {"pad_value": pad_value} if quant == bie.QUANT_BINARY else {}
        m = cls(c, o, k, stride, padding, dilation, **kw).to(device)
        bie.prepare_bie_layers(m)
        with torch.no_grad():
            m.bias_a.uniform_(-0.2, 0.2)
        hw = dilation * (k - 1) + 1 + int(torch.randint(0, 6, ()))
        x = torch.randn(2, c, hw, hw + 1, device=device).requires_grad_()
        y = m(x)
        g = torch.randn_like(y)
        y.backward(g)
        latent = getattr(m, "latent_int8", False)
        want = be_conv(quant, x, m.weight.detach().to(torch.float32), m.scale_a, m.scale_w, m.bias_a, g,
                       (stride, stride), (padding, padding), (dilation, dilation), pad_value)
        assert torch.equal(y.detach().to(D64).cpu(), want[0].cpu()), f"{cls.__name__} forward"
        close(x.grad, want[1], f"{cls.__name__} grad_x")
        close(m.weight_grad if latent else m.weight.grad, want[2], f"{cls.__name__} grad_weight")
        close(m.scale_a.grad, want[3], f"{cls.__name__} grad_scale_a", 1e-4)
        close(m.bias_a.grad, want[4], f"{cls.__name__} grad_bias_a")


def test_binary_conv_cpp_is_unscaled(device):
    """BinaryConv2dCPP: the raw +-1 cross-correlation, padded with -1 (Bitorch Engine's im2col)."""
    m = bie.BinaryConv2dCPP(5, 3, 3, 1, 1).to(device)
    x = torch.randn(2, 5, 6, 7, device=device)
    xp = torch.nn.functional.pad(sgn(x), (1, 1, 1, 1), value=-1.0)
    want = torch.nn.functional.conv2d(xp, sgn(m.weight.detach()))
    assert torch.equal(m(x).to(D64), want)


# --- matmuls ----------------------------------------------------------------------------------

def be_matmul(quant, x, y, xc, yc, g):
    """BinaryMatMulFunction restated (forward and backward); Q4/Q8: the same STE with n-bit codes."""
    x, y, g = x.detach(), y.detach(), g.to(D64)
    s = scale_product(xc, yc)
    a, b = codes(quant, x, xc), codes(quant, y, yc)
    out = scaled(a @ b.transpose(-1, -2), s)
    gx, gxc = ste(quant, x, xc, g @ (b * float(yc)), a)
    gy, gyc = ste(quant, y, yc, g.transpose(-1, -2) @ (a * float(xc)), b)
    return out, gx, gy, gxc, gyc


@pytest.mark.parametrize("cls,quant", [(bie.BinaryMatMul, bie.QUANT_BINARY), (bie.Q4MatMul, bie.QUANT_INT4),
                                       (bie.Q8MatMul, bie.QUANT_INT8)])
def test_matmul(device, cls, quant):
    for _ in range(3):
        lead = tuple(torch.randint(1, 4, (int(torch.randint(0, 3, ())),)).tolist())
        mm, n, k = (int(v) for v in torch.randint(1, 40, (3,)))
        mod = cls().to(device)
        x = torch.randn(*lead, mm, k, device=device).requires_grad_()
        y = (torch.randn(*lead, k, n, device=device) * 3).transpose(-1, -2).requires_grad_()  # a transposed view
        if x.dim() < 2:
            continue
        out = mod(x, y)
        g = torch.randn_like(out)
        out.backward(g)
        want = be_matmul(quant, x, y, mod.x_clip, mod.y_clip, g)
        assert torch.equal(out.detach().to(D64).cpu(), want[0].cpu()), f"{cls.__name__} forward"
        close(x.grad, want[1], f"{cls.__name__} grad_x")
        close(y.grad, want[2], f"{cls.__name__} grad_y")
        close(mod.x_clip.grad, want[3], f"{cls.__name__} grad_x_clip", 1e-4)
        close(mod.y_clip.grad, want[4], f"{cls.__name__} grad_y_clip", 1e-4)


def test_matmul_clip_init(device):
    """Clips start at 2*mean|x| (binary) and 2*mean|v|/11.269 (n-bit), each from its own operand."""
    x, y = torch.randn(3, 4, 9, device=device), torch.randn(3, 5, 9, device=device) * 7
    for cls, div in ((bie.BinaryMatMul, 1.0), (bie.Q4MatMul, 11.269), (bie.Q8MatMul, 11.269)):
        m = cls().to(device)
        m(x, y)
        close(m.x_clip, 2 * x.abs().mean() / div, cls.__name__ + " x_clip", 1e-6)
        close(m.y_clip, 2 * y.abs().mean() / div, cls.__name__ + " y_clip", 1e-6)


# --- attention --------------------------------------------------------------------------------

def test_bmha(device):
    """BMHA against its formulas restated with the binary linear and matmul restatements."""
    torch.manual_seed(3)
    a = bie.BMHA(24, 32, 4, dropout=0.0).to(device)
    bie.prepare_bie_layers(a)
    h = torch.randn(2, 5, 24, device=device)
    mask = torch.ones(2, 5, device=device)
    mask[1, 3:] = 0
    out, probs = a(h, mask)

    def lin(layer, x):
        return be_linear(bie.QUANT_BINARY, x, layer.weight.detach().to(torch.float32), layer.scale_a, layer.scale_w,
                         layer.bias_a, torch.zeros(*x.shape[:-1], layer.out_features))[0]

    def heads(t):
        return t.view(2, -1, 4, 8).transpose(1, 2)

    q = heads(lin(a.q_linear, h)) + a.move_q.bias.to(D64)
    k = heads(lin(a.k_linear, h)) + a.move_k.bias.to(D64)
    v = heads(lin(a.v_linear, h)) + a.move_v.bias.to(D64)
    sm = a.score_matmul
    scores = be_matmul(bie.QUANT_BINARY, q.float(), k.float(), sm.x_clip, sm.y_clip, torch.zeros(2, 4, 5, 5))[0]
    scores = scores / math.sqrt(8)
    scores = scores.masked_fill(mask[:, None, None, :].to(D64).cpu() == 0, -1e9)
    p = torch.softmax(scores, dim=-1)
    close(probs, p, "BMHA probabilities", 1e-5)
    cm = a.context_matmul
    ctx = be_matmul(bie.QUANT_INT8, probs.detach().double(), v.transpose(-1, -2).float(), cm.x_clip, cm.y_clip,
                    torch.zeros(2, 4, 5, 8))[0]
    ctx = ctx.transpose(1, 2).reshape(2, 5, 32)
    want = lin(a.out, ctx.float())
    close(out, want, "BMHA output", 1e-4)


# --- embeddings -------------------------------------------------------------------------------

def test_binary_embedding(device):
    """BinaryEmbeddingCuda: Bitorch Engine's prepare_params (centred table, padding row 0, rows
    padded with -1 to a multiple of 8, scale = L1 / padded length) and lookup scale * sign; the
    backward's rows: index_add of grad_out * scale."""
    v, d = 37, 21
    torch.manual_seed(5)
    e = bie.BinaryEmbeddingCuda(num_embeddings=v, embedding_dim=d, padding_idx=3).to(device)
    w0 = e.weight.detach().clone().double()
    bie.prepare_bie_layers(e)
    wc = w0 - w0.mean()
    wc[3] = 0
    wp = torch.cat([wc, -torch.ones(v, 3, dtype=D64, device=device)], dim=1)
    scale = wp.abs().sum(dim=1, keepdim=True) / wp.shape[1]
    close(e.scale_w, scale, "scale_w", 1e-6)
    idx = torch.randint(0, v, (4, 9), device=device)
    out = e(idx)
    s = e.scale_w.detach().double()
    want = s[idx] * sgn(wc)[idx]
    assert torch.equal(out.double(), want)
    g = torch.randn_like(out)
    out.backward(g)
    rows, grad = e.qweight.sparse_grads[-1]
    dense = torch.zeros(v, d, dtype=D64, device=device)
    dense.index_add_(0, idx.reshape(-1), (g.double() * s[idx]).reshape(-1, d))
    assert torch.equal(rows, torch.unique(idx))
    close(grad, dense[rows], "embedding grad rows")


def test_binary_embedding_bag(device):
    """BinaryEmbeddingBag: +1 where at least ceil(L/2) of the bag's rows have the bit, else -1."""
    bag = bie.BinaryEmbeddingBag(num_embeddings=20, embedding_dim=11).to(device)
    bits = bie.reference.unpack_bits(bag.qweight.detach(), 11) > 0
    for length in (1, 4, 5):
        idx = torch.randint(0, 20, (6, length), device=device)
        out = bag(idx)
        ones = bits[idx].sum(dim=1)
        want = torch.where(ones >= math.ceil(length / 2), 1.0, -1.0)
        assert torch.equal(out, want)


@pytest.mark.parametrize("cls,quant", [(bie.Q4Embedding, bie.QUANT_INT4), (bie.Q8Embedding, bie.QUANT_INT8)])
def test_nbit_embedding(device, cls, quant):
    e = cls(30, 19, padding_idx=0).to(device)
    bie.prepare_bie_layers(e)
    idx = torch.randint(0, 30, (3, 7), device=device)
    out = e(idx)
    lo, hi = RANGES[quant]
    s = e.scale_w.detach()
    want = (s[idx].to(torch.float32) * qcodes(e.weight.detach()[idx], s[idx], lo, hi).to(torch.float32)).double()
    assert torch.equal(out.double(), want)
    g = torch.randn_like(out)
    out.backward(g)
    dense = torch.zeros(30, 19, dtype=D64, device=device).index_add_(0, idx.reshape(-1), g.double().reshape(-1, 19))
    close(e.weight.grad, dense, "n-bit embedding grad")
    e.eval()
    assert torch.equal(e(idx), out.detach())
