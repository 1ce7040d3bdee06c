# SPDX-License-Identifier: Apache-2.0
"""bie.fuse: which chains it fuses (float conv + BatchNorm too); at inference a FusedConv2d is, to the bit, the conv followed by
the epilogue ((y * out_mul) + out_add) + residual in float32 (libbie's contract), and the fused
model matches the original within the rounding of the folded BatchNorm; in training it is the
original model, gradients included: exactly on the CPU, within the rounding of libbie's batch norm
on CUDA (whose own numbers are checked against nn.BatchNorm2d); a bias_a outside the Hardtanh's
range keeps it."""
import copy
import math

import pytest
import torch
import torch.nn as nn

import bie
from bie import functional as F


class Block(nn.Module):
    def __init__(self, c, stride=1):
        super().__init__()
        self.act = nn.Hardtanh()
        self.conv = nn.Conv2d(c, c, 3, stride, 1, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.pool = nn.AvgPool2d(2) if stride == 2 else nn.Identity()

    def forward(self, x):
        return self.bn(self.conv(self.act(x))) + self.pool(x)


class Net(nn.Module):
    def __init__(self, c=24):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, 1, 1)
        self.stem_bn = nn.BatchNorm2d(c)
        self.b1, self.b2 = Block(c), Block(c, 2)
        self.conv3 = nn.Conv2d(c, c, 3, 1, 1, bias=True)  # BatchNorm, no residual
        self.bn3 = nn.BatchNorm2d(c)
        self.head = nn.Linear(c, 5)

    def forward(self, x):
        x = self.b2(self.b1(self.stem_bn(self.stem(x))))
        x = self.bn3(self.conv3(x))
        return self.head(x.mean((2, 3)))


def prepared(m, kind, device, dtype, exclude, gamma=(0.5, 1.5)):
    """m with its convs but `exclude` made bie layers of `kind`, on device in dtype (channels-last on
    CUDA), and BatchNorms with random statistics and affine terms (gamma drawn from `gamma`)."""
    bie.replace_layers(m, kind, linear=False, exclude=exclude)
    m = m.to(device=device, dtype=dtype)
    if device.type == "cuda":
        m = m.to(memory_format=torch.channels_last)
    with torch.no_grad():
        for bn in (mm for mm in m.modules() if isinstance(mm, nn.BatchNorm2d)):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(*gamma)
            bn.bias.uniform_(-0.3, 0.3)
    bie.prepare_bie_layers(m)
    return m


def model(kind, device, dtype):
    torch.manual_seed(0)
    return prepared(Net(), kind, device, dtype, ["stem"])


def inputs(device, dtype, n=3):
    x = torch.randn(n, 3, 10, 12, device=device, dtype=dtype)
    return x.contiguous(memory_format=torch.channels_last) if device.type == "cuda" else x


def dtypes(device):
    return [torch.float32, torch.float16] if device.type == "cuda" else [torch.float32]


@pytest.mark.parametrize("kind", ["binary", "q4", "q8"])
def test_fuse_finds_the_chains(device, kind):
    g = bie.fuse(model(kind, device, torch.float32))
    fused = [m for m in g.modules() if isinstance(m, bie.FusedConv2d)]
    assert len(fused) == 3
    assert sum(m.act is not None for m in fused) == 2
    calls = [g.get_submodule(n.target) for n in g.graph.nodes if n.op == "call_module"]
    assert not any(isinstance(c, (nn.BatchNorm2d, bie.BieLayer)) for c in calls)
    assert sum(isinstance(c, bie.FoldedConv2d) for c in calls) == 1  # the float stem and its BatchNorm
    assert not any(isinstance(c, nn.Hardtanh) for c in calls)  # (in the bie calls: dropped, or x_clamp)


@pytest.mark.parametrize("kind", ["binary", "q4", "q8"])
def test_fused_inference_matches_model(device, kind):
    for dt in dtypes(device):
        m = model(kind, device, dt).eval()
        g = bie.fuse(m).eval()
        x = inputs(device, dt)
        with torch.no_grad():
            a, b = m(x), g(x)
        tol = 1e-4 if dt == torch.float32 else 3e-2
        assert torch.allclose(a.float(), b.float(), rtol=tol, atol=tol * a.abs().max().item()), (kind, dt)


@pytest.mark.parametrize("kind", ["binary", "q4", "q8"])
def test_fused_conv_is_conv_then_epilogue(device, kind):
    for dt in dtypes(device):
        m = model(kind, device, dt).eval()
        g = bie.fuse(m).eval()
        f = g.fused_0
        x = inputs(device, dt)
        x = m.stem_bn(m.stem(x))
        res = torch.randn_like(x)
        with torch.no_grad():
            got = f(x, res)
            c = f.conv
            extra = (c.pad_value,) if kind == "binary" else ()
            assert f.act is not None and (f._drop_act if kind == "binary" else f._x_clamp == 1.0)
            x = x if kind == "binary" else f.act(x)  # (an n-bit call's x_clamp is the Hardtanh)
            y = F.conv2d_forward(c.quant, x, c.opt_weight, c.scale_a, c.scale_w, c.bias_a, *c._geometry(), *extra)
            shape = (1, -1, 1, 1)
            want = ((y.float() * f.out_mul.view(shape)) + f.out_add.view(shape)) + res.float()
        assert torch.equal(got, want.to(dt)), (kind, dt)


@pytest.mark.parametrize("quant", [F.QUANT_BINARY, F.QUANT_INT4, F.QUANT_INT8])
def test_x_clamp_is_hardtanh_then_conv(device, quant):
    """conv2d_forward with x_clamp=t is, to the bit, the conv of Hardtanh(-t, t)(x): values past t,
    exactly +-t, NaN (NaN stays NaN through both), with and without bias_a."""
    torch.manual_seed(1)
    for dt in dtypes(device):
        for with_bias in (False, True):
            x = (torch.randn(2, 16, 6, 7, device=device) * 2).to(dt)
            x.view(-1)[:4] = torch.tensor([float("nan"), 0.75, -0.75, 9.0])
            if device.type == "cuda":
                x = x.contiguous(memory_format=torch.channels_last)
            w = torch.randn(5, 16, 3, 3, device=device, dtype=dt)
            sa = torch.tensor(0.1, device=device, dtype=dt)
            sw = torch.tensor(0.05, device=device, dtype=dt)
            ba = (torch.rand(16, device=device, dtype=dt) - 0.5) if with_bias else None
            geo = (3, 1, 1, 1)
            got = F.conv2d_forward(quant, x, w, sa, sw, ba, *geo, x_clamp=0.75)
            want = F.conv2d_forward(quant, nn.functional.hardtanh(x, -0.75, 0.75), w, sa, sw, ba, *geo)
            assert torch.equal(got, want), (quant, dt, with_bias)
            with pytest.raises(bie.BieError, match="x_clamp"):
                F.conv2d_forward(quant, x, w, sa, sw, ba, *geo, x_clamp=-1.0)


@pytest.mark.parametrize("quant", [F.QUANT_BINARY, F.QUANT_INT4, F.QUANT_INT8])
def test_x_clamp_backward_is_hardtanh_backward(device, quant):
    """conv2d_backward with x_clamp=t gives the gradients of conv(Hardtanh(-t, t)(x)): the conv's
    backward on the clamped x, then its grad_x through the Hardtanh's backward (0 at +-t and past
    it), with and without bias_a, in both memory formats on CUDA; with grad_x_add, grad_x is that
    plus grad_x_add, as torch adds them. To the bit, but grad_scale_a (its
    partial sums meet in atomic adds on CUDA) and a float32 grad_weight (cuDNN's float32 algorithm
    varies in its last bits from run to run)."""
    torch.manual_seed(2)
    formats = [torch.contiguous_format] + ([torch.channels_last] if device.type == "cuda" else [])
    for dt in dtypes(device):
        for fmt in formats:
            for with_bias in (False, True):
                x = (torch.randn(2, 16, 6, 7, device=device) * 2).to(dt)
                x.view(-1)[:3] = torch.tensor([0.75, -0.75, 9.0])
                x = x.contiguous(memory_format=fmt)
                w = torch.randn(5, 16, 3, 3, device=device, dtype=dt)
                sa = torch.tensor(0.1 if quant != F.QUANT_BINARY else 0.5, device=device, dtype=dt)
                sw = torch.tensor(0.05, device=device, dtype=dt)
                ba = (torch.rand(16, device=device, dtype=dt) - 0.5) if with_bias else None
                gy = torch.randn(2, 5, 6, 7, device=device, dtype=dt).contiguous(memory_format=fmt)
                geo = (3, 1, 1, 1)
                got = F.conv2d_backward(quant, x, w, sa, sw, gy, ba, *geo, x_clamp=0.75)
                want = list(F.conv2d_backward(quant, nn.functional.hardtanh(x, -0.75, 0.75), w, sa, sw, gy, ba, *geo))
                want[0] = torch.ops.aten.hardtanh_backward(want[0], x, -0.75, 0.75)
                for i, (u, v) in enumerate(zip(got, want)):
                    if v is None:
                        assert u is None
                    elif i == 2 or (i == 1 and dt == torch.float32 and device.type == "cuda"):
                        assert torch.allclose(u.float(), v.float(), rtol=1e-3, atol=1e-6 * v.abs().max().item())
                    else:
                        assert torch.equal(u, v), (quant, dt, fmt, with_bias, i)
                add = torch.randn_like(x)  # (a shortcut's gradient: added last, as torch's add of the two)
                with_add = F.conv2d_backward(quant, x, w, sa, sw, gy, ba, *geo, x_clamp=0.75, grad_x_add=add)
                assert torch.equal(with_add[0], got[0] + add), (quant, dt, fmt, with_bias)
                with pytest.raises(bie.BieError, match="x_clamp"):
                    F.conv2d_backward(quant, x, w, sa, sw, gy, ba, *geo, x_clamp=float("inf"))


def close(a, b, device, rel=1e-4, floor=0.0):
    """a equals b on the CPU (PyTorch's batch norm on both sides); on CUDA within rel of b's largest
    element, or of floor where that is larger (libbie's batch norm rounds once where PyTorch's norm
    and add round twice)."""
    if device.type != "cuda":
        return torch.equal(a, b)
    return torch.allclose(a.float(), b.float(), rtol=rel, atol=rel * max(b.abs().max().item(), floor, 1e-30))


def test_training_is_the_original_model(device):
    m = model("binary", device, torch.float32).train()
    m2 = copy.deepcopy(m)
    g = bie.fuse(m2).train()
    x = inputs(device, torch.float32)
    a, b = m(x), g(x)
    assert close(b, a, device)
    a.square().sum().backward()
    b.square().sum().backward()
    # (a conv bias before a BatchNorm has a zero gradient but for rounding: the floor)
    top = max(p.grad.abs().max().item() for p in m.parameters() if p.grad is not None)
    for (n1, p1), (n2, p2) in zip(m.named_parameters(), m2.named_parameters()):
        assert n1 == n2 and (p1.grad is None) == (p2.grad is None), n1
        if p1.grad is not None:
            assert close(p2.grad, p1.grad, device, 1e-3, 1e-3 * top), n1
    for (n1, b1), (n2, b2) in zip(m.named_buffers(), m2.named_buffers()):
        assert close(b2, b1, device), n1


@pytest.mark.skipif(not (torch.cuda.is_available() and bie.cuda_available()), reason="needs CUDA")
@pytest.mark.parametrize("dt", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["channels_last", "nchw"])
@pytest.mark.parametrize("res", [False, True])
def test_batch_norm_train_is_the_module(dt, layout, res):
    """BatchNormTrain (libbie's training batch norm and add on CUDA) against nn.BatchNorm2d + add:
    y, the input, weight, bias and residual gradients and the running statistics, within the
    rounding of dt; a mean far from zero against the spread in some channels."""
    from bie.fuse import _bn_train
    dev = torch.device("cuda")
    torch.manual_seed(5)
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    x = (torch.randn(3, 40, 9, 7, device=dev) * 2 + torch.linspace(-30, 30, 40, device=dev).view(1, -1, 1, 1))
    x = x.to(dt).contiguous(memory_format=fmt)
    r = torch.randn(3, 40, 9, 7, device=dev).to(dt).contiguous(memory_format=fmt) if res else None
    gy = torch.randn(3, 40, 9, 7, device=dev).to(dt).contiguous(memory_format=fmt)
    outs = []
    for ours in (False, True):
        torch.manual_seed(6)
        bn = nn.BatchNorm2d(40).to(dev, dt).train()
        with torch.no_grad():
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-1, 1)
        xs = x.detach().clone().requires_grad_()
        rs = r.detach().clone().requires_grad_() if res else None
        y = _bn_train(bn, xs, rs) if ours else (bn(xs) if rs is None else bn(xs) + rs)
        y.backward(gy)
        outs.append([y.detach(), xs.grad, bn.weight.grad, bn.bias.grad, bn.running_mean, bn.running_var,
                     bn.num_batches_tracked] + ([rs.grad] if res else []))
    u = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dt]
    names = ["y", "grad_x", "grad_weight", "grad_bias", "running_mean", "running_var", "batches", "grad_residual"]
    for n, a, b in zip(names, outs[1], outs[0]):
        assert torch.allclose(a.float(), b.float(), rtol=2 * u, atol=2 * u * b.float().abs().max().item()), n
    assert outs[1][0].is_contiguous(memory_format=fmt) and outs[1][1].is_contiguous(memory_format=fmt)


@pytest.mark.parametrize("t", [1.0, 0.75])
def test_clamped_binary_conv_node(device, t):
    """ClampedBinaryConv2dForward (a clamp to [-t, t] and a binary conv as one node keeping bits) gives
    the numbers of Hardtanh + BinaryConv2dForward: the same on CUDA (both read bits), within rounding
    on the CPU (where the module path keeps the float x). x holds values at and beyond +-t."""
    from bie.autograd import BinaryConv2dForward, ClampedBinaryConv2dForward
    dt = torch.float16 if device.type == "cuda" else torch.float32
    torch.manual_seed(3)
    x = (torch.randn(2, 32, 7, 6, device=device) * 1.5).to(dt)
    x.view(-1)[::11] = t
    x.view(-1)[5::13] = -t
    x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(40, 32, 3, 3, device=device, dtype=dt)
    sa = torch.tensor(0.9, device=device, dtype=dt)
    sw = torch.tensor(0.3, device=device, dtype=dt)
    ba = (torch.randn(32, device=device) * 0.2).to(dt)
    geo = (3, 1, 1, 1)
    g = torch.randn(2, 40, 7, 6, device=device, dtype=dt).contiguous(memory_format=torch.channels_last)
    outs = []
    for fused in (False, True):
        xs, ws, sas, bas = (v.detach().clone().requires_grad_() for v in (x, w, sa, ba))
        if fused:
            y = ClampedBinaryConv2dForward.apply(xs, ws, sas, sw, t, *geo, bas)
        else:
            y = BinaryConv2dForward.apply(nn.functional.hardtanh(xs, -t, t), ws, sas, sw, True, *geo, bas)
        y.backward(g)
        outs.append([y.detach(), xs.grad, ws.grad, sas.grad, bas.grad])
    names = ["y", "grad_x", "grad_weight", "grad_scale_a", "grad_bias_a"]
    for n, a, b in zip(names, *outs):
        if device.type == "cuda":
            assert torch.equal(a, b), n
        else:
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-4 * a.abs().max().item()), n
    assert (outs[1][1] == 0).sum() > 0  # the clamp stopped some gradients


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_training_keeps_bits_and_equals_the_model():
    """In training on CUDA (f16, channels-last), bie.fuse's binary convs and their Hardtanh are one
    node that keeps bits, and its BatchNorms libbie's: the step's numbers are the original model's
    within rounding, and it keeps fewer bytes."""
    dev = torch.device("cuda")
    torch.manual_seed(0)
    m = prepared(Net(32), "binary", dev, torch.float16, ["stem"]).train()
    m2 = copy.deepcopy(m)
    g = bie.fuse(m2).train()
    x = inputs(dev, torch.float16, n=4)
    kept = []
    for net in (m, g):
        seen = {}

        def pack(t):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = net(x)
        kept.append(sum(seen.values()))
        y.float().square().sum().backward()
    assert kept[1] < kept[0], kept
    # within f16 rounding of the batch norms (a rounding can flip a sign that a binary conv reads,
    # so the bound is on the whole gradient, not element by element)
    top = max(p.grad.float().norm().item() for p in m.parameters() if p.grad is not None)
    for (n1, p1), (n2, p2) in zip(m.named_parameters(), m2.named_parameters()):
        assert n1 == n2 and (p1.grad is None) == (p2.grad is None), n1
        if p1.grad is not None:  # (a conv bias before a BatchNorm: a zero gradient but for rounding)
            d = (p1.grad.float() - p2.grad.float()).norm() / max(p1.grad.float().norm().item(), 1e-3 * top)
            assert d < 5e-2, (n1, d.item())
    for (n1, b1), (n2, b2) in zip(m.named_buffers(), m2.named_buffers()):
        assert torch.allclose(b1.float(), b2.float(), rtol=4e-3, atol=4e-3), n1


def node_names(fn):
    """The class names of the autograd nodes reachable from fn."""
    seen, todo, names = set(), [fn], set()
    while todo:
        f = todo.pop()
        if f is None or f in seen:
            continue
        seen.add(f)
        names.add(type(f).__name__)
        todo.extend(n for n, _ in f.next_functions)
    return names


@pytest.mark.skipif(not (torch.cuda.is_available() and bie.cuda_available()), reason="needs CUDA")
@pytest.mark.parametrize("kind,dt,factor", [("binary", torch.float16, None), ("binary", torch.bfloat16, None),
                                            ("q4", torch.float16, None), ("q8", torch.bfloat16, None),
                                            ("q4", torch.float32, None), ("binary", torch.float16, 2 ** -0.5),
                                            ("q8", torch.float16, 2 ** -0.5)])
def test_block_node_is_the_per_module_path(kind, dt, factor, monkeypatch):
    """A fused block in a CUDA training step is one BlockTrain node (conv, BatchNorm and the residual
    add; the Hardtanh before it inside it (a 4-bit or 8-bit conv's as its x_clamp), an identity
    shortcut's gradient added in place) with the numbers of the nodes per module it replaces
    (ClampedBinaryConv2dForward, or Hardtanh and the n-bit conv's, then BatchNormTrain), to the bit: outputs, every gradient and the running statistics, over six
    SGD steps on inputs that change (the first makes the node's calls, the second reuses them, and
    once a step's allocations repeat the last's, a step records the calls and the later ones replay
    them, _plans.Replay). In float32 the weight gradient of a 4-bit or 8-bit conv comes from cuDNN's
    float32 algorithm, whose last bits vary from run to run on either path: those compare within
    1e-6 of their largest element. factor: grad_scale_a's factor under data parallelism
    (set_data_parallel), which the node applies and the per-module path takes from _GradScale."""
    from bie import _plans
    from bie.fuse import FusedConv2d
    from bie.layers import BieLayer
    if factor is not None:
        monkeypatch.setattr(BieLayer, "_scale_a_factor", lambda self: factor if self.training else None)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    base = prepared(Net(32), kind, dev, dt, ["stem"]).train()
    x = inputs(dev, dt, n=4)
    recorded = []
    record = _plans.Replay._record
    monkeypatch.setattr(_plans.Replay, "_record", lambda *a: recorded.append(record(*a)) or recorded[-1])
    results = []
    for whole in (True, False):
        if not whole:
            monkeypatch.setattr(FusedConv2d, "_block", lambda self, x, residual: None)
        g = bie.fuse(copy.deepcopy(base)).train()
        opt = torch.optim.SGD(g.parameters(), lr=0.05, momentum=0.9)
        nodes = []
        for mod in g.modules():
            if isinstance(mod, FusedConv2d):
                mod.register_forward_hook(lambda mod, args, y: nodes.append(type(y.grad_fn).__name__))
        steps = []
        for i in range(6):  # (copies to the host: each step's device allocations repeat the last's)
            opt.zero_grad(set_to_none=True)
            y = g(x * (1 + i / 8))
            if i == 0:
                graph = node_names(y.grad_fn)
                assert ("HardtanhBackward0" in graph) == (not whole and kind != "binary"), graph
            y.float().square().mean().backward()
            steps.append([("y", y.detach().cpu())] + [(n, p.grad.cpu()) for n, p in g.named_parameters()
                                                      if p.grad is not None] +
                         [(n, b.cpu()) for n, b in g.named_buffers()])
            opt.step()
        results.append(steps)
        assert ("BlockTrainBackward" in nodes) == whole, nodes
    assert recorded and all(recorded), recorded  # (the forward's and the backward's calls, replayed)
    for step, (a, b) in enumerate(zip(*results)):
        assert [n for n, _ in a] == [n for n, _ in b]
        for (n, u), (_, v) in zip(a, b):
            if dt == torch.float32 and kind != "binary" and n.endswith("conv.weight"):
                assert torch.allclose(u, v, rtol=0, atol=1e-6 * v.abs().max().item()), (step, n)
            else:
                assert torch.equal(u, v), (step, n)


def test_activation_kept_where_bias_a_leaves_its_range(device):
    m = model("binary", device, torch.float32).eval()
    with torch.no_grad():
        m.b1.conv.bias_a[3] = -1.5  # -bias_a = 1.5 > max_val: the clamp changes this channel's bits
    g = bie.fuse(m).eval()
    assert not g.fused_0._drop_act and g.fused_1._drop_act
    x = inputs(device, torch.float32) * 4
    with torch.no_grad():
        a, b = m(x), g(x)
    assert torch.allclose(a, b, rtol=1e-4, atol=1e-4 * a.abs().max().item())


def test_fuse_rejects_what_it_cannot_fold():
    with pytest.raises(TypeError):
        bie.FusedConv2d(nn.Conv2d(3, 3, 3))
    with pytest.raises(ValueError):
        bie.FusedConv2d(bie.Q8Conv2d(4, 4, 3), act=nn.ReLU())
    with pytest.raises(ValueError):
        bie.FusedConv2d(bie.BinaryConv2d(4, 4, 3), bn=nn.BatchNorm2d(5))


@pytest.mark.skipif(not (torch.cuda.is_available() and bie.cuda_available()),
                    reason="needs a CUDA device and libbie's CUDA backend")
def test_fused_model_in_a_cuda_graph():
    dev = torch.device("cuda")
    g = bie.fuse(model("binary", dev, torch.float16).eval()).eval()
    x = inputs(dev, torch.float16, n=8)
    with torch.no_grad():
        want = g(x)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            g(x)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = g(x)
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(out, want)


def test_bits_handed_to_the_next_binary_conv(device):
    """The bits a FusedConv2d writes for the binary one after it give that one's output exactly."""
    for dt in dtypes(device):
        m = model("binary", device, dt).eval()
        x = inputs(device, dt)
        with torch.no_grad():
            m(x)  # (the lazy scale_a)
        g = bie.fuse(m).eval()
        assert g.fused_0.bits_for is g.fused_1 and g.fused_0.bits_bias is not None
        with torch.no_grad():
            s = g.folded_3(x)
            y0 = g.fused_0(s, s)
            assert y0._bie_bits[0] is g.fused_1
            res = g.b2.pool(y0)
            with_bits = g.fused_1(y0, res)
            without = g.fused_1(y0.clone(), res)
        assert torch.equal(with_bits, without), dt


class StemNet(nn.Module):
    """A ResNet-style stem (conv, BatchNorm, activation, max-pool) before a binary block."""

    def __init__(self, act, c=16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, 1, 1, bias=True), nn.BatchNorm2d(c), *act,
                                  nn.MaxPool2d(3, 2, 1))
        self.b1 = Block(c)

    def forward(self, x):
        return self.b1(self.stem(x))


def stem_model(device, dtype, act):
    torch.manual_seed(1)
    # negative BatchNorm scales too: the pool takes the min of x there
    return prepared(StemNet(act), "binary", device, dtype, ["stem.0"], gamma=(-1.5, 1.5))


@pytest.mark.parametrize("act", [[nn.ReLU()], [nn.Hardtanh(-0.5, 0.75)], []], ids=["relu", "hardtanh", "none"])
def test_stem_is_one_pool_pass(device, act):
    for dt in dtypes(device):
        m = stem_model(device, dt, act).eval()
        x = inputs(device, dt, n=2)
        with torch.no_grad():
            m(x)
        g = bie.fuse(m).eval()
        calls = [g.get_submodule(n.target) for n in g.graph.nodes if n.op == "call_module"]
        stems = [c for c in calls if isinstance(c, bie.FoldedConvPool)]
        assert len(stems) == 1 and not any(isinstance(c, (nn.MaxPool2d, nn.BatchNorm2d, nn.ReLU)) for c in calls)
        assert stems[0].bits_for is g.fused_0
        with torch.no_grad():
            a, b = m(x), g(x)
            # the pass alone: the conv, then clamp(y * mul + add) in f32, max-pooled, rounded once
            s = stems[0]
            y = torch.nn.functional.conv2d(x, s.conv.weight, None, 1, 1)
            t = (y.float() * s.mul.view(1, -1, 1, 1)) + s.add.view(1, -1, 1, 1)
            want = torch.nn.functional.max_pool2d(t.clamp(s._lo, s._hi), 3, 2, 1).to(dt)
            got = s(x)
        assert torch.equal(got, want), dt
        tol = 1e-4 if dt == torch.float32 else 3e-2
        assert torch.allclose(a.float(), b.float(), rtol=tol, atol=tol * a.abs().max().item()), dt


def test_stem_bits_are_the_next_convs(device):
    """The bits the stem's pass writes give the binary conv after it its output exactly."""
    for dt in dtypes(device):
        m = stem_model(device, dt, [nn.ReLU()]).eval()
        x = inputs(device, dt, n=2)
        with torch.no_grad():
            m(x)
        g = bie.fuse(m).eval()
        s = next(c for c in g.modules() if isinstance(c, bie.FoldedConvPool))
        with torch.no_grad():
            y = s(x)
            assert y._bie_bits[0] is g.fused_0
            assert torch.equal(g.fused_0(y, y), g.fused_0(y.clone(), y)), dt


def test_stem_training_is_the_original(device):
    m = stem_model(device, torch.float32, [nn.ReLU()]).train()
    g = bie.fuse(copy.deepcopy(m)).train()
    x = inputs(device, torch.float32, n=2)
    assert close(g(x), m(x), device)


def test_affine_maxpool2d_refuses_bad_windows(device):
    x = torch.randn(1, 8, 4, 4, device=device)
    with pytest.raises(ValueError):
        F.affine_maxpool2d(x, 3, 1, 2)  # padding over half the window
    with pytest.raises(ValueError):
        F.affine_maxpool2d(x, 5)  # larger than the input
    with pytest.raises(bie.BieError):
        F.affine_maxpool2d(x, 2, mul=torch.ones(7, device=device))  # not [C]
    with pytest.raises(bie.BieError):
        F.affine_maxpool2d(x, 2, lo=1.0, hi=0.0)


def test_affine_maxpool2d_kept_calls_follow_their_arguments(device):
    """affine_maxpool2d keeps its libbie call per tensor metadata and window: calls that differ in
    the clamp, the affine terms, the argmax or the window give their own results, in any order."""
    x = torch.randn(2, 8, 9, 7, device=device)
    mul, add = torch.rand(8, device=device) + 0.5, torch.randn(8, device=device)

    def want(lo, hi, k, s, p, affine):
        t = x * mul.view(1, -1, 1, 1) + add.view(1, -1, 1, 1) if affine else x
        return torch.nn.functional.max_pool2d(t.clamp(lo, hi), k, s, p)
    cases = [(-math.inf, math.inf, 3, 2, 1, True), (0.0, math.inf, 3, 2, 1, True), (-0.5, 0.5, 3, 2, 1, True),
             (-math.inf, math.inf, 3, 2, 1, False), (0.0, math.inf, 2, 2, 0, True)]
    for lo, hi, k, s, p, affine in cases * 2:
        a, b = (mul, add) if affine else (None, None)
        got = F.affine_maxpool2d(x, k, s, p, a, b, lo, hi)
        assert torch.allclose(got, want(lo, hi, k, s, p, affine), rtol=1e-6, atol=1e-6), (lo, hi, k, affine)
    am = torch.empty(2, 8, 5, 4, dtype=torch.uint8, device=device)
    got = F.affine_maxpool2d(x, 3, 2, 1, mul, add, 0.0, math.inf, argmax=am)
    assert torch.allclose(got, want(0.0, math.inf, 3, 2, 1, True), rtol=1e-6, atol=1e-6)
    # each output's position in its 3x3 window (PyTorch's index of the max of z), 255 where the ReLU's
    # clamp stops the gradient (y not above 0)
    z = x * mul.view(1, -1, 1, 1) + add.view(1, -1, 1, 1)
    _, idx = torch.nn.functional.max_pool2d(z, 3, 2, 1, return_indices=True)
    i = torch.arange(idx.shape[2], device=device).view(1, 1, -1, 1)
    j = torch.arange(idx.shape[3], device=device).view(1, 1, 1, -1)
    pos = (idx // x.shape[3] - (2 * i - 1)) * 3 + (idx % x.shape[3] - (2 * j - 1))
    pos[got <= 0] = 255
    assert torch.equal(am.long(), pos), (am, pos)


def test_saved_parts_are_their_addresses():
    """A fused block's saved tensor (autograd._Saved): each part's view is where its address says,
    at a multiple of 256 bytes, in the strides the part was made with, and the parts do not overlap."""
    from bie.autograd import _Saved
    z = torch.empty(2, 5, 3, 7, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    for planes in ((3, 2, 3, 7, 1), None):
        lay = _Saved(planes, z, 5)
        saved = lay.new(torch.device("cpu"))
        p, zv, st = lay.views(saved)
        (x, mk, gk), za, mean, invstd = lay.addresses(saved)
        assert zv.shape == z.shape and zv.stride() == z.stride() and zv.dtype == z.dtype
        assert (za, mean, invstd) == (zv.data_ptr(), st[0].data_ptr(), st[1].data_ptr())
        assert all((a - saved.data_ptr()) % 256 == 0 for a in (za, mean))
        if planes is None:
            assert p is None and (x, mk, gk) == (0, 0, 0)
        else:
            assert p.shape == planes and (x, mk, gk) == tuple(r.data_ptr() for r in p.unbind(0))
            p.fill_(7)
        zv.fill_(-2.0)
        st.fill_(3.0)
        assert bool((zv == -2.0).all()) and bool((st == 3.0).all())
        assert planes is None or bool((p == 7).all())


def test_repeated_calls_reuse_their_plans(device):
    """Later calls (the module's own plan cache) give what the first gave, across batch sizes, with
    and without the bits of the conv before, and after the operands change (a new eval fold)."""
    for dt in dtypes(device):
        m = model("binary", device, dt).eval()
        xs = [inputs(device, dt, n) for n in (3, 5)]
        with torch.no_grad():
            m(xs[0])
        g = bie.fuse(m).eval()
        with torch.no_grad():
            first = [g(x) for x in xs]
            for _ in range(2):
                for x, want in zip(xs, first):
                    assert torch.equal(g(x), want), dt
            assert len(g.fused_1._runs) == 2
            m.b1.bn.running_mean.add_(0.25)
            g.eval()
            assert not g.fused_0._runs
            assert not torch.equal(g(xs[0]), first[0])


def kept_graphs(m):
    """How many CUDA graphs the kept inference calls of m's modules recorded (_plans.Replay)."""
    n = 0
    for mod in m.modules():
        kept = getattr(mod, "_runs", None)
        for value, _ in (kept.runs.values() if kept is not None else ()):
            replay = value[-1]
            n += 0 if replay is None else sum(1 for g in replay.graphs.values() if g)
    return n


@pytest.mark.parametrize("fused", [True, False])
def test_inference_calls_replay(fused, monkeypatch):
    """At inference each kept call of a FusedConv2d (fused) or of a bie layer (the model as built)
    replays from a CUDA graph of its own once its tensors' pointers repeat, with the bits of the
    calls made one by one, on inputs whose values change in one buffer."""
    from bie import _plans
    if not torch.cuda.is_available() or not bie.cuda_available():
        pytest.skip("needs CUDA")
    dev = torch.device("cuda")
    m = model("binary", dev, torch.float16).eval()
    first = bie.fuse(m).eval() if fused else m
    second = copy.deepcopy(first)  # (without the kept calls of the first)
    xs = [inputs(dev, torch.float16, 4) for _ in range(6)]
    xb = torch.empty_like(xs[0])
    outs = []
    for g, replays in ((first, False), (second, True)):
        monkeypatch.setattr(_plans, "_REPLAY", replays)
        got = []
        with torch.no_grad():
            for x in xs:
                xb.copy_(x)
                got.append(g(xb).cpu())
        outs.append(got)
    assert kept_graphs(first) == 0 and kept_graphs(second) > 0
    for i, (a, b) in enumerate(zip(*outs)):
        assert torch.equal(a, b), f"call {i}"


def test_calls_follow_replaced_tensors(device):
    """After nn.Module._apply replaced the tensors (as .to() does), calls read the new ones: an
    out_add changed in the new buffer moves the result, and no plan of the old tensors is kept."""
    m = model("q8", device, torch.float32).eval()
    g = bie.fuse(m).eval()
    f = g.fused_0
    with torch.no_grad():
        x = m.stem_bn(m.stem(inputs(device, torch.float32)))
        want = f(x)
        g._apply(lambda t: t.clone())
        assert not f._runs
        assert torch.equal(f(x), want)
        f.out_add.add_(1.0)
        assert torch.allclose(f(x), want + 1.0, rtol=0, atol=1e-5 * (1 + want.abs().max().item()))


class DownBlock(nn.Module):
    """A block whose shortcut is a strided 1x1 conv and its BatchNorm (a ResNet downsample)."""

    def __init__(self, c):
        super().__init__()
        self.act = nn.Hardtanh()
        self.conv = nn.Conv2d(c, 2 * c, 3, 2, 1, bias=False)
        self.bn = nn.BatchNorm2d(2 * c)
        self.down = nn.Sequential(nn.Conv2d(c, 2 * c, 1, 2, bias=False), nn.BatchNorm2d(2 * c))

    def forward(self, x):
        return self.bn(self.conv(self.act(x))) + self.down(x)


def test_downsample_bias_goes_to_the_fused_call(device):
    """The downsample's folded bias is added in the fused conv's epilogue (out_add), not by a pass of
    its own: the result matches the model within the folds' rounding, eval or not."""
    for dt in dtypes(device):
        torch.manual_seed(2)
        m = prepared(nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1), nn.BatchNorm2d(8), DownBlock(8)), "binary", device, dt,
                     ["0", "2.down.0"]).eval()
        x = inputs(device, dt)
        with torch.no_grad():
            m(x)
        g = bie.fuse(m).eval()
        folded = [c for c in g.modules() if isinstance(c, bie.FoldedConv2d)]
        fused = [c for c in g.modules() if isinstance(c, bie.FusedConv2d)]
        assert len(fused) == 1 and [f.bias_to for f in folded].count(fused[0]) == 1
        assert fused[0].res_bias_from is not None and fused[0].out_add_res is not None
        with torch.no_grad():
            a, b = m(x), g(x)
        tol = 1e-4 if dt == torch.float32 else 3e-2
        assert torch.allclose(a.float(), b.float(), rtol=tol, atol=tol * a.abs().max().item()), dt
        assert close(g.train()(x), m.train()(x), device, 4e-3 if dt == torch.float16 else 1e-4)  # the original's
        m.eval(), g.eval()


@pytest.mark.skipif(not (torch.cuda.is_available() and bie.cuda_available()), reason="needs CUDA")
@pytest.mark.parametrize("dt", [torch.float32, torch.float16])
def test_stem_train_is_the_modules(dt):
    """A stem's BatchNorm, ReLU and MaxPool2d in training through StemTrain (a FoldedConvPool on CUDA)
    against the modules: output, the conv's and the BatchNorm's gradients and the running statistics,
    within rounding (f16: a rounding can move a window's maximum, so the gradients are compared as a
    whole)."""
    dev = torch.device("cuda")
    m = stem_model(dev, dt, [nn.ReLU()]).train()
    m2 = copy.deepcopy(m)
    g = bie.fuse(m2).train()  # (which shares m2's modules)
    assert any(isinstance(mm, bie.FoldedConvPool) for mm in g.modules())
    torch.manual_seed(8)
    x = torch.randn(4, 3, 20, 18, device=dev, dtype=dt).contiguous(memory_format=torch.channels_last)
    a, b = m(x), g(x)
    rel = 1e-4 if dt == torch.float32 else 4e-3
    assert torch.allclose(b.float(), a.float(), rtol=rel, atol=rel * a.abs().max().item())
    gy = torch.randn_like(a)
    a.backward(gy)
    b.backward(gy)
    top = max(p.grad.float().norm().item() for p in m.parameters() if p.grad is not None)
    for (n1, p1), (n2, p2) in zip(m.named_parameters(), m2.named_parameters()):
        assert n1 == n2 and (p1.grad is None) == (p2.grad is None), n1
        if p1.grad is None:
            continue
        d = (p1.grad.float() - p2.grad.float()).norm() / max(p1.grad.float().norm().item(), 1e-3 * top)
        assert d < (1e-3 if dt == torch.float32 else 5e-2), (n1, d.item())
    for (n1, b1), (n2, b2) in zip(m.named_buffers(), m2.named_buffers()):
        assert torch.allclose(b1.float(), b2.float(), rtol=rel, atol=rel), n1
