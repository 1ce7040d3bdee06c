# SPDX-License-Identifier: Apache-2.0
"""The modules: packed (eval) path equals the training path exactly, gradients reach weight, bias_a
and scale_a as the reference says, state_dict round trips, the int8 latent form with DiodeMix, layer
replacement, and a small model that learns."""
import copy
import io
import pickle

import pytest
import torch
import torch.nn as nn

import bie
from bie import reference as R
from bie_testutil import assert_grad_close, term_bounds

LINEARS = [bie.BinaryLinear, bie.Q4Linear, bie.Q8Linear]
CONVS = [bie.BinaryConv2d, bie.Q4Conv2d, bie.Q8Conv2d]


def make(cls, device, dtype=torch.float32, **kw):
    if cls in LINEARS:
        m = cls(37, 11, device=device, dtype=dtype, **kw)
        x = torch.randn(5, 3, 37, device=device, dtype=dtype)
    else:
        m = cls(5, 7, 3, 2, 1, 1, device=device, dtype=dtype, **kw)
        x = torch.randn(3, 5, 9, 8, device=device, dtype=dtype)
    with torch.no_grad():
        m.bias_a.normal_(0, 0.2)
    bie.prepare_bie_layers(m)
    return m, x


def geometry(m):
    if not m.is_conv:
        return None, None
    return R.Geometry(m.stride, m.padding, m.dilation, getattr(m, "pad_value", bie.PAD_ZERO)), m.kernel_size


@pytest.mark.parametrize("cls", LINEARS + CONVS)
def test_eval_packed_equals_training(device, cls):
    dtypes = [torch.float32] + ([torch.float16, torch.bfloat16] if device.type == "cuda" else [torch.bfloat16])
    for dtype in dtypes:
        for latent in ([False, True] if cls in (bie.BinaryLinear, bie.BinaryConv2d) else [False]):
            m, x = make(cls, device, dtype, **({"latent_int8": True} if latent else {}))
            m.train()
            y_train = m(x)
            m.eval()
            y_eval = m(x)
            assert m.qweight is not None and m.qweight.dtype in (torch.uint8, torch.int8)
            assert torch.equal(y_train, y_eval), f"{cls.__name__} {dtype} latent_int8={latent}"
            m.generate_quantized_weight(qweight_only=True)
            assert m.weight is None
            assert torch.equal(m(x), y_train)


@pytest.mark.parametrize("cls", LINEARS + CONVS)
def test_eval_calls_follow_changes(device, cls):
    """Repeated inference calls (a plan the module keeps per input and operands) follow a weight, a
    scale_a and a bias_a changed in place, another batch size and a dtype conversion of the module;
    a repacked weight lets the plans kept with the old one go."""
    m, x = make(cls, device)
    x = x.reshape(-1, x.shape[-1]) if cls in LINEARS else x  # (2-D rows: the linear's kept plans)

    def both(m, x):
        with torch.no_grad():
            m.train()
            want = m(x)
            m.eval()
            return m(x), want

    for change in ("none", "weight", "scale_a", "bias_a", "batch", "bfloat16"):
        if change == "weight":
            with torch.no_grad():
                m.weight.mul_(-1.5)
        elif change == "scale_a":
            with torch.no_grad():
                m.scale_a.mul_(0.5)
        elif change == "bias_a":
            with torch.no_grad():
                m.bias_a.add_(0.3)
        elif change == "batch":
            x = torch.cat([x, x[:1] * -1])
        elif change == "bfloat16":
            m = m.to(torch.bfloat16)
            x = x.to(torch.bfloat16)
        got, want = both(m, x)
        again, _ = both(m, x)
        assert torch.equal(got, want) and torch.equal(again, want), f"{cls.__name__} after {change}"
        if change == "weight":  # (a new qweight: the plans kept with the old one are let go)
            assert len(m._runs) == 1, f"{cls.__name__}: {len(m._runs)} kept plans"


@pytest.mark.parametrize("cls", LINEARS + CONVS)
def test_module_gradients_match_reference(device, cls):
    m, x = make(cls, device)
    x.requires_grad_()
    y = m(x)
    g = torch.randn_like(y)
    y.backward(g)
    geo, ks = geometry(m)
    want_y = R.forward(m.quant, x, m.weight, m.scale_a, m.scale_w, m.bias_a, geo, ks)
    assert torch.equal(y.detach(), want_y)
    want = R.backward(m.quant, x, m.weight, m.scale_a, m.scale_w, g, m.bias_a, geo, ks)
    bounds = term_bounds(m.quant, x, m.weight, m.scale_a, m.scale_w, g, m.bias_a, geo, ks)
    for got, wt, (bd, nt), name in zip((x.grad, m.weight.grad, m.scale_a.grad, m.bias_a.grad), want, bounds,
                                       ("x", "weight", "scale_a", "bias_a")):
        assert got is not None, name
        assert_grad_close(got, wt, torch.float32, name, bd, nt)


def test_seed_signatures_bias_applied_before():
    """Bitorch Engine's call style: set_activation adds bias_a, then Function.apply with the seed
    signature; gradients still reach bias_a and scale_a."""
    m, x = make(bie.BinaryLinear, "cpu")
    xs = m.set_activation(x)
    y = bie.BinaryLinearForward.apply(xs, m.opt_weight, m.scale_a, m.scale_w, 3, True)
    y.sum().backward()
    g = torch.ones_like(y)
    rx, rw, rs, rb = R.backward(m.quant, x, m.weight, m.scale_a, m.scale_w, g, m.bias_a)
    bx, bw, bs, bb = term_bounds(m.quant, x, m.weight, m.scale_a, m.scale_w, g, m.bias_a, None, None)
    assert_grad_close(m.bias_a.grad, rb, torch.float32, "bias_a", *bb)
    assert_grad_close(m.scale_a.grad, rs, torch.float32, "scale_a", *bs)
    assert_grad_close(m.weight.grad, rw, torch.float32, "weight", *bw)
    for fn in (bie.Q4Conv2dForward, bie.Q4Conv2dCutlassForward, bie.BinaryConv2dForward, bie.Q8Conv2dForward):
        c = bie.Q4Conv2d(4, 6, 3, 1, 1, 1)
        bie.prepare_bie_layers(c)
        xi = torch.randn(2, 4, 5, 5)
        xs = c.set_activation(xi)
        out = fn.apply(xs, c.opt_weight, c.scale_a, c.scale_w, True, 3, 1, 1, 1)
        out.square().sum().backward()
        assert out.shape == (2, 6, 5, 5) and c.bias_a.grad is not None and c.scale_a.grad is not None
    lin = bie.Q8Linear(9, 4)
    bie.prepare_bie_layers(lin)
    xs = lin.set_activation(torch.randn(3, 9))
    bie.Q8LinearForward.apply(xs, lin.opt_weight, lin.scale_a, lin.scale_w, True).sum().backward()
    assert lin.scale_a.grad is not None and lin.bias_a.grad is not None
    lin = bie.Q4Linear(9, 4)
    bie.prepare_bie_layers(lin)
    xs = lin.set_activation(torch.randn(3, 9))
    out = bie.Q4LinearForward.apply(xs, lin.opt_weight, lin.scale_a, lin.scale_w, False)
    with pytest.raises(RuntimeError, match="is_train=False"):
        out.sum().backward()


def _roundtrip(module_factory, m):
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    fresh = module_factory()
    fresh.load_state_dict(torch.load(buf))
    return fresh


@pytest.mark.parametrize("cls", LINEARS + CONVS)
def test_state_dict_round_trip(device, cls):
    m, x = make(cls, device)
    m.train()
    y_train = m(x)  # sets scale_a
    factory = lambda: make(cls, device)[0]
    # float weights, then packed weights kept beside them, then packed only
    for qweight_only in (None, False, True):
        if qweight_only is not None:
            m.generate_quantized_weight(qweight_only=qweight_only)
        fresh = _roundtrip(factory, m)
        fresh.eval()
        assert (fresh.weight is None) == bool(qweight_only)
        assert torch.equal(fresh.scale_a, m.scale_a) and torch.equal(fresh.scale_w, m.scale_w)
        if qweight_only is not None:
            assert torch.equal(fresh.qweight, m.qweight)
        assert torch.equal(fresh(x), y_train), f"qweight_only={qweight_only}"


@pytest.mark.parametrize("cls", LINEARS + CONVS)
def test_copy_and_pickle_after_calls(device, cls):
    """A layer that kept plans of its calls (and, on CUDA, their recorded graphs) copies, pickles and
    saves whole: the copies start without them and compute the same."""
    m, x = make(cls, device)
    if cls in LINEARS:  # (rows: the kept calls' form)
        x = x.flatten(0, -2)
    m.train()
    m(x).float().sum().backward()
    m.eval()
    with torch.no_grad():
        for _ in range(3):  # (the third call replays where it can)
            y = m(x)
        assert len(m._runs) >= 1
        buf = io.BytesIO()
        torch.save(m, buf)
        buf.seek(0)
        for c in (copy.deepcopy(m), pickle.loads(pickle.dumps(m)), torch.load(buf, weights_only=False)):
            assert len(c._runs) == 0
            assert torch.equal(c(x), y) and torch.equal(c(x), y), f"{cls.__name__}: a copy computes otherwise"


def test_state_dict_int8_latent_into_float_module():
    m, x = make(bie.BinaryConv2d, "cpu", latent_int8=True)
    assert m.weight.dtype == torch.int8 and not m.weight.requires_grad
    y = m(x)
    fresh = _roundtrip(lambda: make(bie.BinaryConv2d, "cpu")[0], m)
    assert fresh.weight.dtype == torch.int8 and torch.equal(fresh.weight, m.weight)
    assert torch.equal(fresh(x), y)


def test_int8_latent_gradient_and_diode():
    """The int8 latent weight's gradient lands in its float buffer (equal to the float-weight
    gradient of the same codes), and DiodeMix flips signs by its rule."""
    m, x = make(bie.BinaryLinear, "cpu", latent_int8=True)
    w0 = m.weight.detach().clone()
    assert set(w0.abs().unique().tolist()) <= set(range(1, 128))
    y = m(x)
    g = torch.randn_like(y)
    y.backward(g)
    _, rw, _, _ = R.backward(m.quant, x, m.weight, m.scale_a, m.scale_w, g, m.bias_a)
    _, bw, _, _ = term_bounds(m.quant, x, m.weight, m.scale_a, m.scale_w, g, m.bias_a, None, None)
    assert_grad_close(m.weight_grad, rw, torch.float32, "weight_grad", *bw)
    grad = m.weight_grad.clone()
    # with (1 - beta2)*lr far above the 1e-3 of the initial state, one step sets
    # sign(w) = -sign(grad) wherever grad != 0
    opt = bie.DiodeMix([m.weight], lr=100.0)
    opt.step()
    assert m.weight_grad.abs().sum() == 0  # consumed
    assert torch.equal(m.weight.abs(), w0.abs())  # magnitudes never change
    nz = grad != 0
    assert torch.equal(torch.sign(m.weight.float())[nz], -torch.sign(grad)[nz])
    assert torch.equal(m.weight[~nz], w0[~nz])
    assert (torch.sign(m.weight.float()) != torch.sign(w0.float())).any()
    # gradient accumulation: two backward passes add up, zero_grad clears
    opt.zero_grad()
    for _ in range(2):
        m(x).backward(g)
    _, rw, _, _ = R.backward(m.quant, x, m.weight, m.scale_a, m.scale_w, g, m.bias_a)
    assert_grad_close(m.weight_grad, 2 * rw, torch.float32, "accumulated weight_grad", 2 * bw[0], bw[1] + 1)
    opt.zero_grad()
    assert m.weight_grad.abs().sum() == 0


def test_replace_layers():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, groups=2, padding=1),
                          nn.Conv2d(8, 8, 3, stride=2, bias=False), nn.Flatten(), nn.Linear(8 * 3 * 3, 16),
                          nn.ReLU(), nn.Linear(16, 4))
    ref = [model[0].weight.detach().clone(), model[5].bias.detach().clone()]
    names = bie.replace_layers(model, "q4", exclude=("0", "7"))
    assert names == ["3", "5"]
    assert isinstance(model[3], bie.Q4Conv2d) and isinstance(model[5], bie.Q4Linear)
    assert type(model[2]) is nn.Conv2d and type(model[0]) is nn.Conv2d and type(model[7]) is nn.Linear
    assert torch.equal(model[0].weight, ref[0]) and torch.equal(model[5].bias, ref[1])
    assert float(model[3].scale_w) > 0
    out = model(torch.randn(2, 3, 8, 8))
    out.sum().backward()
    assert out.shape == (2, 4) and model[3].scale_a.grad is not None


@pytest.mark.parametrize("kind", ["binary", "q4", "q8"])
def test_small_model_loss_falls(kind):
    torch.manual_seed(0)
    n, d, classes = 256, 32, 4
    centres = torch.randn(classes, d) * 2
    labels = torch.randint(0, classes, (n,))
    data = centres[labels] + torch.randn(n, d) * 0.5
    # every trainable parameter belongs to a bie layer
    model = nn.Sequential(nn.Linear(d, 64), nn.BatchNorm1d(64, affine=False), nn.Linear(64, classes),
                          nn.BatchNorm1d(classes, affine=False))
    assert bie.replace_layers(model, kind) == ["0", "2"]
    opt = bie.DiodeMix(model.parameters(), lr=1e-2)
    lossf = nn.CrossEntropyLoss()
    losses = []
    for step in range(40):
        opt.zero_grad()
        loss = lossf(model(data), labels)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5, losses


@pytest.mark.parametrize("cls", LINEARS + CONVS)
def test_cuda_no_host_sync_and_side_stream(cls, monkeypatch):
    """On a CUDA device, after the one-off set-up (scale_a from the first batch, the packed weight),
    training and eval calls make no host synchronisation that PyTorch can see, and calls on a side
    stream give the default stream's results (a binary linear layer from saved bits, whatever the
    input's size)."""
    monkeypatch.setattr(bie.autograd, "SAVED_BITS_MIN", 0)
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if not bie.cuda_available():
        pytest.skip("libbie has no CUDA backend")
    m, x = make(cls, "cuda", torch.float16)
    m.train()
    m(x).float().sum().backward()
    m.eval()
    y_eval = m(x)
    m.train()
    y_train = m(x)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        m.zero_grad()
        m(x).float().sum().backward()
        m.eval()
        m(x)
        m.train()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ys = m(x)
        m.eval()
        ye = m(x)
        m.train()
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(ys, y_train) and torch.equal(ye, y_eval)


def test_bitorch_engine_style_checkpoint():
    """A Bitorch Engine binary-layer state_dict (int8 latent weight, no eps buffer) loads strictly."""
    m, x = make(bie.BinaryLinear, "cpu", latent_int8=True)
    y = m(x)
    sd = {k: v for k, v in m.state_dict().items() if k != "eps"}
    fresh = bie.BinaryLinear(37, 11)
    fresh.load_state_dict(sd)
    assert fresh.weight.dtype == torch.int8
    assert torch.equal(fresh(x), y)


def test_binary_linear_trains_from_saved_bits(device, monkeypatch):
    """BinaryLinear in training keeps binarize_ste's 2 bits per element of its input (from
    SAVED_BITS_MIN elements on), with the outputs and gradients of the float input to the bit."""
    dtypes = [torch.float32, torch.bfloat16] + ([torch.float16] if device.type == "cuda" else [])
    for dtype in dtypes:
        m, x = make(bie.BinaryLinear, device, dtype)
        results = []
        for threshold in (0, 1 << 62):
            monkeypatch.setattr(bie.autograd, "SAVED_BITS_MIN", threshold)
            m.zero_grad()
            xr = x.clone().requires_grad_()
            y = m(xr)
            saved = y.grad_fn.saved_tensors[0] if threshold == 0 else None
            y.backward(torch.ones_like(y))
            results.append([y.detach(), xr.grad, m.weight.grad.clone(), m.scale_a.grad.clone(), m.bias_a.grad.clone()])
            if threshold == 0:
                assert saved.dtype == torch.uint8 and saved.shape == (*x.shape[:-1], (x.shape[-1] + 7) // 8)
        for a, b, name in zip(*results, ("y", "x", "weight", "scale_a", "bias_a")):
            assert torch.equal(a, b), f"{name} {dtype}"
