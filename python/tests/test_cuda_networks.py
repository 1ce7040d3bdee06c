# SPDX-License-Identifier: Apache-2.0
"""Whole models with bie layers on a GPU: CUDA graph capture equals eager, torch.compile runs,
plans are reused (no new plan per call), the conv's saved bits give the float input's gradients.
Skipped without a CUDA device and a CUDA build of libbie."""
import copy

import pytest
import torch
import torch.nn as nn

import bie
from bie import _plans

cuda = pytest.mark.skipif(not (torch.cuda.is_available() and bie.cuda_available()),
                          reason="needs a CUDA device and libbie's CUDA backend")


def small_bnn(kind="binary"):
    """A small Bi-Real-style CNN: float stem, two low-bit 3x3 convs with shortcuts, float head."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64))
            self.c1 = nn.Conv2d(64, 64, 3, 1, 1, bias=False)
            self.b1 = nn.BatchNorm2d(64)
            self.c2 = nn.Conv2d(64, 64, 3, 2, 1, bias=False)
            self.b2 = nn.BatchNorm2d(64)
            self.act = nn.Hardtanh()
            self.head = nn.Linear(64, 10)

        def forward(self, x):
            x = self.stem(x)
            x = self.b1(self.c1(self.act(x))) + x
            x = self.b2(self.c2(self.act(x))) + nn.functional.avg_pool2d(x, 2)
            return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

    torch.manual_seed(0)
    m = Net()
    bie.replace_layers(m, kind, linear=False, exclude=["stem.0"])
    return m


def cuda_model(kind="binary"):
    m = small_bnn(kind).to("cuda", torch.float16).to(memory_format=torch.channels_last)
    bie.prepare_bie_layers(m)
    return m


def batch(n=8):
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(n, 3, 16, 16, device="cuda", dtype=torch.float16, generator=g)
    return x.contiguous(memory_format=torch.channels_last), torch.randint(0, 10, (n,), device="cuda", generator=g)


def captured(fn):
    """fn() captured in a CUDA graph after 3 calls on a side stream: (the graph, fn's result)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


@cuda
@pytest.mark.parametrize("kind", ["binary", "q4", "q8"])
def test_graph_replay_equals_eager_inference(kind):
    m = cuda_model(kind).eval()
    x, _ = batch()
    with torch.no_grad():
        eager = m(x).clone()
        static_x = x.clone()
        g, out = captured(lambda: m(static_x))
        static_x.copy_(x)
        g.replay()
        torch.cuda.synchronize()
    assert torch.equal(out, eager)


@cuda
def test_graph_replay_after_the_workspace_grew():
    """A graph captured at a small batch still replays right after eager calls of a larger batch
    have grown libbie's workspace (the captured arena is kept, not freed)."""
    m = cuda_model().eval()
    x, _ = batch(2)
    with torch.no_grad():
        static_x = x.clone()
        g, out = captured(lambda: m(static_x))
        big, _ = batch(1024)
        m(big)  # (larger calls: the workspace grows)
        x2, _ = batch(2)
        x2 = x2 * 0.5 + 0.25
        static_x.copy_(x2)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, m(x2))


@cuda
def test_graph_replay_equals_eager_training_step():
    """A whole training step (forward, backward, SGD) captured and replayed equals the same steps
    run eagerly from the same start."""
    m_eager = cuda_model()
    m_graph = copy.deepcopy(m_eager)
    x, y = batch()
    loss_fn = nn.CrossEntropyLoss()

    def make_step(m):
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)

        def step():
            opt.zero_grad(set_to_none=False)
            loss_fn(m(x).float(), y).backward()
            opt.step()
        return step

    e_step, g_step = make_step(m_eager), make_step(m_graph)
    for _ in range(3):  # warm-up (sets the lazy scale_a, plans, cuDNN's algorithms) on both
        e_step()
    graph, _ = captured(g_step)
    for _ in range(4):
        e_step()
        graph.replay()
    torch.cuda.synchronize()
    for (n, a), b in zip(m_eager.named_parameters(), m_graph.parameters()):
        assert torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-3), n


def replay_model(kind):
    """A model whose training calls go through the bie autograd Functions (no bie.fuse): the small
    CNN, or two BinaryLinear layers ("linear"; "linear-bits" keeps their inputs as bits)."""
    if kind.startswith("linear"):
        torch.manual_seed(0)
        m = nn.Sequential(bie.BinaryLinear(64, 64), nn.Hardtanh(), bie.BinaryLinear(64, 10)).to("cuda", torch.float16)
        bie.prepare_bie_layers(m)
        return m, torch.randn(32, 64, device="cuda", dtype=torch.float16)
    return cuda_model(kind), batch()[0]


@cuda
@pytest.mark.parametrize("kind", ["binary", "q4", "linear", "linear-bits"])
def test_module_training_calls_replay_with_their_numbers(kind, monkeypatch):
    """Outside bie.fuse, a bie module's training calls (its autograd Function's forward and backward)
    replay from CUDA graphs of their plans once a step's tensors' pointers repeat the last's
    (_plans.run_kept), with the numbers of the same calls made one by one: outputs and every
    gradient to the bit over six SGD steps on inputs that change."""
    from bie import autograd
    if kind == "linear-bits":
        monkeypatch.setattr(autograd, "SAVED_BITS_MIN", 0)
    recorded = []
    record = _plans.Replay._record
    monkeypatch.setattr(_plans.Replay, "_record", lambda *a: recorded.append(record(*a)) or recorded[-1])
    base, x = replay_model(kind)
    results = []
    for replayed in (True, False):
        if not replayed:
            assert recorded and all(recorded), recorded
            monkeypatch.setattr(_plans, "run_kept", lambda call, ref, tensors: call.run(ref, tensors))
        m = copy.deepcopy(base).train()
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        steps = []
        for i in range(6):  # (copies to the host: each step's device allocations repeat the last's)
            opt.zero_grad(set_to_none=True)
            y = m(x * (1 + i / 8))
            y.float().square().mean().backward()
            steps.append([("y", y.detach().cpu())] + [(n, p.grad.cpu()) for n, p in m.named_parameters()
                                                      if p.grad is not None])
            opt.step()
        results.append(steps)
    for step, (a, b) in enumerate(zip(*results)):
        assert [n for n, _ in a] == [n for n, _ in b]
        for (n, u), (_, v) in zip(a, b):
            assert torch.equal(u, v), (kind, step, n)


@cuda
def test_torch_compile_runs():
    if not hasattr(torch, "compile"):
        pytest.skip("this PyTorch has no torch.compile")
    m = cuda_model().eval()
    x, _ = batch()
    with torch.no_grad():
        eager = m(x)
        compiled = torch.compile(m)
        out = compiled(x)
    assert torch.allclose(out.float(), eager.float(), rtol=1e-2, atol=1e-2)


@cuda
def test_plans_are_reused():
    m = cuda_model().train()
    x, y = batch()
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(2):
        loss_fn(m(x).float(), y).backward()
    n = len(_plans.cache())
    for _ in range(3):
        loss_fn(m(x).float(), y).backward()
    assert len(_plans.cache()) == n


@cuda
def test_conv_saved_bits_equal_float_input():
    """The binary conv's training forward keeps bits and mask of its channels-last input; its
    gradients equal those of the float input kept as it is (the NCHW input takes that path)."""
    torch.manual_seed(3)
    layer = bie.BinaryConv2d(64, 32, 3, 1, 1, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    bie.prepare_bie_layers(layer)
    x = torch.randn(4, 64, 9, 9, device="cuda", dtype=torch.float16)
    g = torch.randn(4, 32, 9, 9, device="cuda", dtype=torch.float16)
    grads = []
    for xin in (x.contiguous(memory_format=torch.channels_last), x.contiguous()):
        xin = xin.detach().requires_grad_()
        layer.zero_grad(set_to_none=True)
        out = layer(xin)
        out.backward(g.contiguous(memory_format=torch.channels_last) if out.is_contiguous(
            memory_format=torch.channels_last) else g)
        grads.append((out.detach().float(), xin.grad.float(), layer.weight.grad.float(), layer.scale_a.grad.float(),
                      layer.bias_a.grad.float()))
    names = ("y", "grad_x", "grad_weight", "grad_scale_a", "grad_bias_a")
    for name, a, b in zip(names, *grads):
        # each side within the f16 tolerance of the exact gradient (2^-9 of the largest magnitude)
        assert float((a - b).abs().max()) <= 2 ** -8 * float(b.abs().max()), name
