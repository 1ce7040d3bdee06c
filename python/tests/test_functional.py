# SPDX-License-Identifier: Apache-2.0
"""libbie's layer calls against the pure-PyTorch reference (bie.reference): forward exactly, backward
within one rounding of the output dtype; the reference's backward against finite differences of its
surrogate (gradcheck in float64)."""
import math

import pytest
import torch

import bie
from bie import functional as F
from bie import reference as R
from bie_testutil import check_backward as _check_backward

QUANTS = [bie.QUANT_BINARY, bie.QUANT_INT4, bie.QUANT_INT8]
FLOATS = [torch.float32, torch.float16, torch.bfloat16]
LINEAR_SHAPES = [((1,), 1, 1), ((3,), 7, 5), ((2, 3), 65, 9), ((17,), 130, 33), ((4,), 8, 1)]
CONV_SHAPES = [  # N, C, H, W, O, kernel, stride, padding, dilation
    (1, 1, 5, 5, 1, (3, 3), 1, 0, 1),
    (2, 3, 7, 6, 4, (3, 2), (2, 1), (1, 2), 1),
    (1, 9, 6, 7, 5, (3, 3), 1, 1, (2, 1)),
    (3, 17, 4, 5, 3, (1, 1), 2, 0, 1),
    (2, 4, 9, 8, 6, (5, 3), (1, 2), 2, 1),
]


def scales(quant, x, device, dtype=torch.float32):
    if quant == bie.QUANT_BINARY:
        sa = 2 * x.float().abs().mean()
        sw = torch.tensor(0.37)
    else:
        hi = 7 if quant == bie.QUANT_INT4 else 127
        sa = x.float().abs().max() / hi * 0.8  # some inputs clip
        sw = torch.tensor(1.5 / hi)
    return sa.to(device, dtype).reshape(()), sw.to(device, dtype)


def weight_forms(quant, w, sw):
    """The float weight and the other forms a layer accepts, with the same codes."""
    forms = [("float", w)]
    if quant == bie.QUANT_BINARY:
        forms.append(("int8", torch.randint(-127, 128, w.shape, dtype=torch.int8, device=w.device)))
        forms.append(("packed", F.pack_weight(quant, w)))
    else:
        forms.append(("codes", F.quantize_int8(w, sw)))
        if quant == bie.QUANT_INT4 and F.packed_shape(quant, tuple(w.shape)) != tuple(w.shape):
            forms.append(("packed", F.pack_weight(quant, w, sw)))
    return forms


def strided(t, kind):
    """A copy of t with other strides: a transposed layout, or a slice of a larger tensor."""
    if kind == "contiguous":
        return t.contiguous()
    if kind == "slice":
        big = torch.empty(*t.shape[:-1], t.shape[-1] * 2 + 1, dtype=t.dtype, device=t.device)
        v = big[..., 1::2]
        v.copy_(t)
        return v
    if kind == "channels_last":
        return t.contiguous(memory_format=torch.channels_last)
    if kind == "transposed":  # linear [M, K]: stored as [K, M]
        return t.t().contiguous().t() if t.dim() == 2 else t
    raise ValueError(kind)


def linear_operands(device, quant, lead, k, n, dtype):
    """x [*lead, k], weight [n, k], bias_a [k] and the scales of a linear case."""
    x = torch.randn(*lead, k, device=device).to(dtype)
    w = torch.randn(n, k, device=device).to(dtype)
    bias = (torch.randn(k, device=device) * 0.3).to(dtype)
    sa, sw = scales(quant, x, device)
    return x, w, bias, sa, sw


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("lead,k,n", LINEAR_SHAPES)
def test_linear_forward_exact(device, quant, lead, k, n):
    for dtype in FLOATS:
        x, w, bias, sa, sw = linear_operands(device, quant, lead, k, n, dtype)
        for name, wf in weight_forms(quant, w, sw):
            for b in (None, bias):
                for layout in ("contiguous", "slice", "transposed"):
                    xs = strided(x, layout)
                    y = F.linear_forward(quant, xs, wf, sa, sw, b)
                    want = R.forward(quant, x, wf, sa, sw, b)
                    assert y.dtype == dtype and y.shape == (*lead, n)
                    assert torch.equal(y.cpu(), want.cpu()), f"{name} weight, {layout} x, {dtype}, bias {b is not None}"
            acc = F.linear_forward(quant, x, wf, sa, sw, bias, out_dtype=torch.int32)
            assert torch.equal(acc.cpu(), R.forward(quant, x, wf, sa, sw, bias, out_dtype=torch.int32).cpu())


def conv_operands(device, quant, shape, dtype):
    """x, weight, bias_a and the scales of a conv case, and the pad values its layer takes."""
    n, c, h, w_, o, ks = shape[:6]
    pads = [bie.PAD_ZERO, bie.PAD_MINUS_ONE, bie.PAD_PLUS_ONE] if quant == bie.QUANT_BINARY else [bie.PAD_ZERO]
    x = torch.randn(n, c, h, w_, device=device).to(dtype)
    wt = torch.randn(o, c, *ks, device=device).to(dtype)
    bias = (torch.randn(c, device=device) * 0.3).to(dtype)
    sa, sw = scales(quant, x, device)
    return x, wt, bias, sa, sw, pads


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("shape", CONV_SHAPES)
def test_conv2d_forward_exact(device, quant, shape):
    ks, st, pd, dl = shape[5:]
    for dtype in FLOATS:
        x, wt, bias, sa, sw, pads = conv_operands(device, quant, shape, dtype)
        for name, wf in weight_forms(quant, wt, sw):
            for pv in pads:
                geo = R.Geometry(st, pd, dl, pv)
                want = R.forward(quant, x, wf, sa, sw, bias, geo, ks)
                for layout in ("contiguous", "channels_last"):
                    y = F.conv2d_forward(quant, strided(x, layout), wf, sa, sw, bias, ks, st, pd, dl, pv)
                    assert y.dtype == dtype
                    assert torch.equal(y.cpu(), want.cpu()), f"{name} weight, {layout}, pad {pv}, {dtype}"


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("lead,k,n", LINEAR_SHAPES)
def test_linear_backward(device, quant, lead, k, n):
    for dtype in FLOATS:
        x, w, bias, sa, sw = linear_operands(device, quant, lead, k, n, dtype)
        g = torch.randn(*lead, n, device=device).to(dtype)
        for name, wf in weight_forms(quant, w, sw):
            _check_backward(quant, strided(x, "slice"), wf, sa, sw, bias, g)
        _check_backward(quant, x, w, sa, sw, None, strided(g, "transposed"))


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("shape", CONV_SHAPES)
def test_conv2d_backward(device, quant, shape):
    n, c, h, w_, o, ks, st, pd, dl = shape
    for dtype in FLOATS:
        x, wt, bias, sa, sw, pads = conv_operands(device, quant, shape, dtype)
        oh, ow = F.conv2d_output_size(h, w_, ks, st, pd, dl)
        g = torch.randn(n, o, oh, ow, device=device).to(dtype)
        for pv in pads:
            geo = R.Geometry(st, pd, dl, pv)
            for name, wf in weight_forms(quant, wt, sw):
                _check_backward(quant, strided(x, "channels_last"), wf, sa, sw, bias, g, geo, ks)
        _check_backward(quant, x, wt, sa, sw, None, strided(g, "channels_last"), R.Geometry(st, pd, dl), ks)


@pytest.mark.parametrize("quant", QUANTS)
def test_conv2d_grad_weight_takes_the_weights_layout(device, quant):
    # a channels-last float weight gets a channels-last grad_weight, with the contiguous weight's values
    shape = CONV_SHAPES[2]
    n, c, h, w_, o, ks, st, pd, dl = shape
    x, wt, bias, sa, sw, _ = conv_operands(device, quant, shape, torch.float32)
    oh, ow = F.conv2d_output_size(h, w_, ks, st, pd, dl)
    g = torch.randn(n, o, oh, ow, device=device)
    wl = strided(wt, "channels_last")
    assert not wl.is_contiguous()
    got = F.conv2d_backward(quant, x, wl, sa, sw, g, bias, ks, st, pd, dl)[1]
    want = F.conv2d_backward(quant, x, wt, sa, sw, g, bias, ks, st, pd, dl)[1]
    assert got.is_contiguous(memory_format=torch.channels_last) and not got.is_contiguous()
    assert want.is_contiguous()
    assert torch.equal(got, want)


def _gradcheck(quant, x, b, w, sa, sw, geo=None, ks=None):
    anchors = tuple(t.detach().clone() for t in (x, b, w, sa))
    ins = [t.detach().clone().requires_grad_() for t in (x, b, w, sa)]
    f = lambda x_, b_, w_, s_: R.surrogate(quant, x_, b_, w_, s_, sw, anchors, geo, ks)
    assert torch.autograd.gradcheck(f, ins, eps=1e-6, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("quant", QUANTS)
def test_gradcheck_surrogate(quant):
    d = torch.float64
    for lead, k, n in LINEAR_SHAPES[:4]:
        x = torch.randn(*lead, k, dtype=d)
        sa, sw = scales(quant, x, "cpu", d)
        _gradcheck(quant, x, torch.randn(k, dtype=d) * 0.3, torch.randn(n, k, dtype=d), sa, sw)
    pads = [bie.PAD_ZERO, bie.PAD_MINUS_ONE, bie.PAD_PLUS_ONE] if quant == bie.QUANT_BINARY else [bie.PAD_ZERO]
    for (n, c, h, w_, o, ks, st, pd, dl), pv in zip(CONV_SHAPES[1:4], pads * 3):
        x = torch.randn(n, c, h, w_, dtype=d)
        sa, sw = scales(quant, x, "cpu", d)
        _gradcheck(quant, x, torch.randn(c, dtype=d) * 0.3, torch.randn(o, c, *ks, dtype=d), sa, sw,
                   R.Geometry(st, pd, dl, pv), ks)


@pytest.mark.parametrize("which", range(4))
def test_gradcheck_catches_a_wrong_formula(monkeypatch, which):
    """The gradcheck above can fail: it does when one of the four hand-written gradients is off
    (a factor 1.01 on grad_x, grad_bias_a, grad_weight or grad_scale_a)."""
    real = R.backward

    def wrong(*args, **kwargs):
        out = list(real(*args, **kwargs))
        out[which] = out[which] * 1.01
        return tuple(out)

    monkeypatch.setattr(R, "backward", wrong)
    x = torch.randn(4, 9, dtype=torch.float64)
    sa, sw = scales(bie.QUANT_INT4, x, "cpu", torch.float64)
    with pytest.raises(RuntimeError, match="Jacobian mismatch"):
        _gradcheck(bie.QUANT_INT4, x, torch.randn(9, dtype=torch.float64), torch.randn(3, 9, dtype=torch.float64),
                   sa, sw)


def test_pack_round_trip(device):
    for quant in (bie.QUANT_BINARY, bie.QUANT_INT4):
        for shape in [(5, 13), (3, 4, 3, 2), (2, 1), (4, 9, 1, 1)]:
            w = torch.randn(*shape, device=device)
            sw = torch.tensor(0.3)
            p = F.pack_weight(quant, w, sw)
            assert tuple(p.shape) == F.packed_shape(quant, shape)
            unpack = R.unpack_bits if quant == bie.QUANT_BINARY else R.unpack_nibbles
            k = shape[1]
            codes = unpack(p.cpu(), k) if len(shape) == 2 else unpack(p.cpu(), k).permute(0, 3, 1, 2)
            assert torch.equal(codes.cpu(), R.weight_codes(quant, w, sw, shape).cpu())
            back = F.unpack_weight(quant, p, shape, sw if quant == bie.QUANT_INT4 else None)
            want = codes * (0.3 if quant == bie.QUANT_INT4 else 1.0)
            assert torch.allclose(back.double().cpu(), want.cpu(), rtol=1e-6, atol=0)


def test_errors_carry_the_c_message():
    x = torch.randn(3, 8)
    w = torch.randn(4, 8)
    with pytest.raises(bie.BieError, match="scale_a"):
        F.linear_forward(bie.QUANT_BINARY, x, w, torch.tensor(-1.0), torch.tensor(1.0))
    with pytest.raises(bie.BieError, match="pad_value"):
        F.conv2d_forward(bie.QUANT_INT4, torch.randn(1, 2, 4, 4), torch.randn(3, 2, 3, 3), torch.tensor(1.0),
                         torch.tensor(1.0), None, 3, 1, 1, 1, bie.PAD_MINUS_ONE)
    with pytest.raises(TypeError):
        F.linear_forward(bie.QUANT_BINARY, x.double(), w, torch.tensor(1.0), torch.tensor(1.0))


def test_ctypes_args_mirror_the_header():
    """The args structs of the ctypes binding list the C members in order (a missing trailing
    member would let libbie read past the Python struct)."""
    import os
    import re
    from bie import _lib
    header = os.path.join(os.path.dirname(__file__), "..", "..", "include", "bie.h")
    if not os.path.exists(header):
        pytest.skip("include/bie.h is not beside this checkout of the binding")
    text = open(header).read()
    for c_name, mirror in (("bie_forward_args", _lib.ForwardArgs), ("bie_backward_args", _lib.BackwardArgs)):
        body = re.search(r"struct %s \{(.*?)\};" % c_name, text, re.S).group(1)
        members = re.findall(r"(\w+);", body)
        assert [f[0] for f in mirror._fields_] == members, c_name


def test_cuda_tensor_without_cuda_backend():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if bie.cuda_available():
        pytest.skip("libbie has the CUDA backend")
    x = torch.randn(3, 8, device="cuda")
    with pytest.raises(bie.BieError, match="without the CUDA backend"):
        F.linear_forward(bie.QUANT_BINARY, x, torch.randn(4, 8, device="cuda"), torch.tensor(1.0), torch.tensor(1.0))


@pytest.mark.parametrize("lead,k,n", [((7,), 300, 19), ((2, 3), 64, 5), ((1,), 9, 4)])
def test_saved_bits_give_the_float_results(device, lead, k, n):
    """binarize_ste's bits and mask: the bits are x' >= 0 and the mask |x'| <= scale_a, and the
    forward from the bits and the backward from bits and mask give the float x's results to the bit."""
    dtypes = [torch.float32, torch.bfloat16] + ([torch.float16] if device.type == "cuda" else [])
    for dtype in dtypes:
        x = torch.randn(*lead, k, device=device).to(dtype)
        x.view(-1)[:3] = torch.tensor([0.0, -0.0, float("nan")], dtype=dtype)
        w = torch.randn(n, k, device=device).to(dtype)
        bias = (torch.randn(k, device=device) * 0.3).to(dtype)
        sa, sw = torch.tensor(0.8, device=device), torch.tensor(1.3, device=device)
        for b in (bias, None):
            bits, mask = F.binarize_ste(x, sa, b)
            assert bits.dtype == torch.uint8 and bits.shape == (*lead, (k + 7) // 8) and mask.shape == bits.shape
            xp = x.float() + (b.float() if b is not None else 0)
            weights = 1 << torch.arange(8, device=device)
            unpack = lambda t: ((t.long().unsqueeze(-1) & weights) != 0).flatten(-2)[..., :k]  # noqa: E731
            assert torch.equal(unpack(bits), xp >= 0), dtype
            assert torch.equal(unpack(mask), xp.abs() <= 0.8), dtype
            y = F.linear_forward(bie.QUANT_BINARY, x, w, sa, sw, b)
            yb = F.linear_forward(bie.QUANT_BINARY, bits, w, sa, sw, out_dtype=dtype, in_features=k)
            assert torch.equal(y, yb), dtype
            g = torch.randn_like(y)
            want = F.linear_backward(bie.QUANT_BINARY, x, w, sa, sw, g, b)
            got = F.linear_backward(bie.QUANT_BINARY, bits, w, sa, sw, g, b, x_mask=mask, in_features=k,
                                    grad_x_dtype=dtype)
            for gt, wt, name in zip(got, want, ("x", "weight", "scale_a", "bias_a")):
                assert (gt is None) == (wt is None) and (gt is None or torch.equal(gt, wt)), f"{name} {dtype} {b is None}"


def test_saved_bits_bad_input():
    x = torch.randn(4, 20)
    w = torch.randn(3, 20)
    one = torch.tensor(1.0)
    bits, mask = F.binarize_ste(x, one)
    with pytest.raises(ValueError, match="bias_a"):
        F.linear_forward(bie.QUANT_BINARY, bits, w, one, one, torch.zeros(20), in_features=20)
    with pytest.raises(ValueError, match="bytes"):
        F.linear_forward(bie.QUANT_BINARY, bits, w, one, one, in_features=30)
    with pytest.raises(TypeError, match="binary"):
        F.linear_forward(bie.QUANT_INT4, bits, w, one, one, in_features=20)
    with pytest.raises(ValueError, match="x_mask"):
        F.linear_backward(bie.QUANT_BINARY, bits, w, one, one, torch.randn(4, 3), x_mask=mask[:2], in_features=20)
    with pytest.raises(ValueError, match="x_mask"):
        F.linear_backward(bie.QUANT_BINARY, x, w, one, one, torch.randn(4, 3), x_mask=mask)
    with pytest.raises(bie.BieError, match="x_mask"):  # libbie's rule: grad_x from bits needs the mask
        F.linear_backward(bie.QUANT_BINARY, bits, w, one, one, torch.randn(4, 3), in_features=20)
    with pytest.raises(TypeError):
        F.binarize_ste(x.double(), one)


@pytest.mark.parametrize("res", [False, True])
def test_batch_norm_train_is_torchs(device, res):
    """F.batch_norm_train / batch_norm_backward (libbie's bie_batchnorm_*) against torch's
    training batch norm (+ the residual add): y, running statistics, grad_x, grad_weight and
    grad_bias within f32 rounding, and the batch count (num_batches_tracked) one up like the
    module's; channels-last on CUDA, dense NCHW on the CPU (its only form)."""
    torch.manual_seed(11)
    x = torch.randn(4, 24, 5, 7, device=device) * 3 + torch.linspace(-20, 20, 24, device=device).view(1, -1, 1, 1)
    if device.type == "cuda":
        x = x.contiguous(memory_format=torch.channels_last)
    r = torch.randn_like(x) if res else None
    w, b = torch.rand(24, device=device) + 0.5, torch.randn(24, device=device)
    rm, rv = torch.randn(24, device=device), torch.rand(24, device=device) + 0.5
    rm2, rv2 = rm.clone(), rv.clone()
    count = torch.tensor(5, dtype=torch.long, device=device)
    y, mean, invstd = F.batch_norm_train(x, w, b, rm, rv, 0.1, 1e-5, r, num_batches=count)
    assert count.item() == 6
    xx, ww, bb = (t.clone().requires_grad_() for t in (x, w, b))
    ref = torch.nn.functional.batch_norm(xx, rm2, rv2, ww, bb, True, 0.1, 1e-5)
    g = torch.randn_like(x)
    ref.backward(g)
    ref = ref.detach() + (0 if r is None else r)

    def close(a, b_):
        return torch.allclose(a, b_, rtol=1e-5, atol=1e-5 * b_.abs().max().item())

    assert close(y, ref) and close(rm, rm2) and close(rv, rv2)
    gx, gw, gb = F.batch_norm_backward(x, w, mean, invstd, g)
    assert close(gx, xx.grad) and close(gw, ww.grad) and close(gb, bb.grad)
    assert y.is_contiguous(memory_format=torch.channels_last) == (device.type == "cuda")


def test_batch_norm_train_refuses_what_the_cpu_cannot_take():
    x = torch.randn(2, 3, 4, 4, dtype=torch.float16)
    v = torch.ones(3)
    with pytest.raises(bie.BieError, match="dtype"):
        F.batch_norm_train(x, v, v, v.clone(), v.clone())
    with pytest.raises(bie.BieError, match="stride"):
        F.batch_norm_train(torch.randn(2, 3, 4, 4).contiguous(memory_format=torch.channels_last), v, v, v.clone(),
                           v.clone())
    with pytest.raises(bie.BieError, match="num_batches"):
        F.batch_norm_train(torch.randn(2, 3, 4, 4), v, v, v.clone(), v.clone(), num_batches=torch.zeros(2).long())


@pytest.mark.parametrize("lo,hi", [(0.0, math.inf), (-1.0, 1.0), (-math.inf, math.inf)])
def test_affine_maxpool2d_backward_is_torchs(device, lo, hi):
    """affine_maxpool2d with argmax and affine_maxpool2d_backward against torch's gradient of
    max_pool2d(clamp(z, lo, hi)) to z = x * mul + add (3x3 windows, stride 2, padding 1: the
    ResNet stem's; distinct values, so both pick the same maxima)."""
    torch.manual_seed(4)
    n, c, h, w = 2, 16, 11, 9
    x = torch.randperm(n * c * h * w, device=device).float().view(n, c, h, w) / (n * c * h * w) * 4 - 2
    if device.type == "cuda":
        x = x.contiguous(memory_format=torch.channels_last)
    mul = torch.rand(c, device=device) + 0.5
    add = torch.randn(c, device=device) * 0.3
    argmax = torch.empty((n, c, 6, 5), dtype=torch.uint8, device=device)
    y = F.affine_maxpool2d(x, 3, 2, 1, mul, add, lo, hi, argmax=argmax)
    z = (x * mul.view(1, -1, 1, 1) + add.view(1, -1, 1, 1)).requires_grad_()
    ref = torch.nn.functional.max_pool2d(z.clamp(lo, hi), 3, 2, 1)
    assert torch.allclose(y, ref, rtol=1e-6, atol=1e-6)
    g = torch.randn_like(ref)
    ref.backward(g)
    gz = F.affine_maxpool2d_backward(argmax, g, (h, w), 3, 2, 1)
    assert torch.allclose(gz, z.grad, rtol=1e-6, atol=1e-6)
    assert bool((argmax == 255).any()) == (lo > -math.inf)
