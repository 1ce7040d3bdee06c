# SPDX-License-Identifier: Apache-2.0
"""A model trained in PyTorch exports to the bie program's packed model file: libbie loads it and its
forward gives PyTorch's eval logits, and `bie eval` reports PyTorch's accuracy."""
import operator
import os
import re
import subprocess

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as Fn

import bie
from bie.model_import import _read
from model_files import ResBlock, bie_logits, bie_program, c_trained_model, write_idx

H = W = 12


def make_model():
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Hardtanh(),
        bie.BinaryConv2d(8, 16, 3, 1, 1), nn.BatchNorm2d(16), nn.MaxPool2d(2),
        bie.Q4Conv2d(16, 16, 3, 2, 1), nn.ReLU(),
        nn.Flatten(),
        bie.Q8Linear(16 * 3 * 3, 32), nn.BatchNorm1d(32), nn.ReLU(),
        bie.BinaryLinear(32, 24), nn.BatchNorm1d(24),
        nn.Linear(24, 10),
    )
    bie.prepare_bie_layers(model)
    return model


def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    protos = torch.rand(10, H, W, generator=torch.Generator().manual_seed(7))
    img = (protos[labels] * 180 + torch.rand(n, H, W, generator=g) * 75).clamp(0, 255).to(torch.uint8)
    return img, labels


def as_input(img):
    return (img.to(torch.float32) * torch.tensor(1.0 / 255.0, dtype=torch.float32)).unsqueeze(1)


def reference_outputs(model, n, seed):
    """The images and labels of data(n, seed), their input x and the PyTorch model's outputs on x."""
    img, labels = data(n, seed)
    x = as_input(img)
    with torch.no_grad():
        return img, labels, x, model(x)


def fit(model, opt, steps, n, seed):
    """`steps` full-batch steps on n images of data(n, seed); returns the model in eval mode."""
    img, labels = data(n, seed)
    x = as_input(img)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), labels).backward()
        opt.step()
    return model.eval()


def trained_model():
    torch.manual_seed(3)
    model = make_model()
    return fit(model, bie.DiodeMix(model.parameters(), lr=3e-3), 40, 256, 1)


def test_export_runs_in_libbie_and_bie_eval(tmp_path):
    model = trained_model()
    img, labels, x, want = reference_outputs(model, 200, 2)
    path = tmp_path / "model.safetensors"
    arch = bie.export_model(model, str(path), (1, H, W))
    assert arch.startswith("input 1 12 12; conv f32 8 3 1 1; bn; hardtanh; conv b1 16 3 1 1; bn; maxpool 2; "
                           "conv q4 16 3 2 1; relu; flatten; linear q8 32")
    got = bie_logits(path, x)
    # The low-bit layers are exact; the float layers differ by float rounding (OpenBLAS against
    # PyTorch), which can move an activation across a quantization boundary in a few samples.
    close = torch.isclose(got, want, rtol=1e-4, atol=1e-4).all(dim=1)
    assert close.float().mean() >= 0.95, f"only {int(close.sum())} of {len(close)} samples agree"
    assert (got.argmax(1) == want.argmax(1)).float().mean() >= 0.98
    acc_torch = float((want.argmax(1) == labels).float().mean())
    assert acc_torch > 0.5  # the model did learn

    cli = bie_program()
    if not cli:
        pytest.skip("no bie program beside the library")
    write_idx(tmp_path / "t10k-images-idx3-ubyte", img)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", labels)
    r = subprocess.run([cli, "eval", str(path), "--data", str(tmp_path), "--threads", "1"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    m = re.search(r"test accuracy ([0-9.]+)% \((\d+) images\)", r.stdout)
    assert m and int(m.group(2)) == 200, r.stdout
    correct_bie = round(float(m.group(1)) / 100 * 200)
    assert correct_bie == int((got.argmax(1) == labels).sum()), r.stdout  # the same model and inputs
    assert abs(correct_bie - int((want.argmax(1) == labels).sum())) <= 4, r.stdout


def test_export_rejects_what_the_format_lacks(tmp_path):
    m = nn.Sequential(bie.BinaryConv2d(1, 4, 3, 1, 1, pad_value=bie.PAD_MINUS_ONE))
    bie.prepare_bie_layers(m)
    m(torch.randn(2, 1, 6, 6))
    with pytest.raises(ValueError, match="pad with zeros"):
        bie.export_model(m, str(tmp_path / "a.safetensors"), (1, 6, 6))
    m = nn.Sequential(bie.Q4Linear(36, 4))
    with pytest.raises(ValueError, match="scale_a is not set"):
        bie.export_model(m, str(tmp_path / "b.safetensors"), (1, 6, 6))
    with pytest.raises(ValueError, match="no counterpart"):
        bie.export_model(nn.Sequential(nn.Sigmoid()), str(tmp_path / "c.safetensors"), (1, 6, 6))


def q8_shortcut(cin, cout):
    return bie.Q8Conv2d(cin, cout, 1, bias=True)


class GraphNet(nn.Module):
    """Every layer kind of the format, in module and functional forms."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 8, 3, padding=1)
        self.stem_bn = nn.BatchNorm2d(8)
        self.stem_act = nn.Hardtanh()
        self.pool = nn.MaxPool2d(3, 1, 1)
        self.block1 = ResBlock(8, 8, 1, q8_shortcut)
        self.block2 = ResBlock(8, 16, 2, q8_shortcut)  # an 8-bit 1x1 conv with its output bias
        self.q4 = bie.Q4Conv2d(16, 16, 3, 1, 1)
        self.drop = nn.Dropout(0.1)
        self.fc1 = bie.BinaryLinear(64, 32, bias=True)
        self.bn1 = nn.BatchNorm1d(32)
        self.act1 = nn.SiLU()
        self.slope = nn.PReLU()
        self.fc2 = bie.Q4Linear(32, 24)
        self.gelu = nn.GELU(approximate="tanh")
        self.fc3 = nn.Linear(24, 10)

    def forward(self, x):
        x = self.stem_act(self.stem_bn(self.stem(x)))
        x = self.pool(x)
        x = self.block1(x)
        x = self.block2(x)
        y = Fn.relu(self.q4(x))
        x = torch.add(x, torch.tanh(y))
        x = Fn.max_pool2d(Fn.gelu(x), 2, 1)
        x = Fn.adaptive_avg_pool2d(x, 2)
        x = torch.flatten(x, 1)
        x = self.drop(x)
        x = self.act1(self.bn1(self.fc1(x)))
        x = self.slope(x).view(x.size(0), -1)
        return self.fc3(self.gelu(self.fc2(x)))


def trained_graph_model():
    torch.manual_seed(5)
    model = GraphNet()
    bie.prepare_bie_layers(model)
    return fit(model, torch.optim.Adam(model.parameters(), lr=3e-3), 8, 128, 4)


def test_graph_model_exports_and_imports(tmp_path):
    model = trained_graph_model()
    _, _, x, want = reference_outputs(model, 160, 5)
    path = str(tmp_path / "graph.safetensors")
    arch = bie.export_model(model, path, (1, H, W))
    for item in ("conv f32 8 3 1 1", "maxpool 3 1 1", "prelu 8", "add @", "avgpool 2 2 0", "conv q8 16 1 1 0 bias",
                 "gelu", "adaptive_avgpool 2 2", "flatten", "linear b1 32 bias", "silu", "prelu 1", "gelu_tanh",
                 "tanh", "relu", "hardtanh", "linear f32 10"):
        assert item in arch, (item, arch)
    assert arch.count("flatten") == 1 and "dropout" not in arch
    # libbie: low-bit layers exact, float layers up to rounding (which may move a value across a
    # quantization step in a few samples).
    got = bie_logits(path, x)
    close = torch.isclose(got, want, rtol=1e-4, atol=1e-4).all(dim=1)
    assert close.float().mean() >= 0.95, f"only {int(close.sum())} of {len(close)} samples agree"
    assert (got.argmax(1) == want.argmax(1)).float().mean() >= 0.98
    # bie.import_model: the same modules' math on the file's tensors.
    imported = bie.import_model(path)
    assert imported.input_shape == (1, H, W) and imported.arch == arch
    with torch.no_grad():
        back = imported(x)
    assert torch.allclose(back, want, rtol=1e-5, atol=1e-5), (back - want).abs().max()
    # Exported again, the imported model gives the same file.
    path2 = str(tmp_path / "again.safetensors")
    assert bie.export_model(imported, path2, (1, H, W)) == arch
    a, _, ta = _read(path)
    b, _, tb = _read(path2)
    assert a == b and ta.keys() == tb.keys()
    for name in ta:
        assert torch.equal(ta[name], tb[name]), name


def test_import_of_models_trained_in_c(tmp_path):
    img, labels = data(32, 6)
    x = as_input(img)
    archs = [
        # version 1: a chain; the linear layer flattens its input itself
        "input 1 12 12; conv q4 5 3; maxpool 2; bn; relu; conv b1 6 3 2 1; bn; linear q8 16; bn; sign; linear f32 10",
        # version 2: a graph
        "input 1 12 12; conv f32 4 3; bn; prelu 4; conv b1 4 3 1 1; bn; add @2; avgpool 2; conv q4 6 1 1 0 bias;"
        " adaptive_avgpool 2; flatten; linear b1 8 bias; bn; gelu; add @12 @12; linear f32 10",
    ]
    for i, arch in enumerate(archs):
        path = str(tmp_path / f"c{i}.safetensors")
        c_trained_model(arch, path, x, labels)
        want = bie_logits(path, x)
        with torch.no_grad():
            got = bie.import_model(path)(x)
        close = torch.isclose(got, want, rtol=1e-4, atol=1e-4).all(dim=1)
        assert close.float().mean() >= 0.95, (arch, int(close.sum()))
        assert (got.argmax(1) == want.argmax(1)).float().mean() >= 0.95, arch


class _Twice(nn.Module):
    def forward(self, x, y):
        return x + y


def test_export_refuses_clearly(tmp_path):
    path = str(tmp_path / "x.safetensors")
    cases = [
        (nn.Sequential(nn.Conv2d(2, 4, 3, groups=2)), (2, 6, 6), "groups"),
        (nn.Sequential(nn.MaxPool2d(2, ceil_mode=True)), (1, 6, 6), "floor mode"),
        (nn.Sequential(nn.AvgPool2d(3, 1, 1, count_include_pad=False)), (1, 6, 6), "counts its padding"),
        (nn.Sequential(nn.Hardtanh(0, 6)), (1, 6, 6), "Hardtanh"),
        (nn.Sequential(nn.Flatten(), nn.Linear(36, 4), nn.Sigmoid()), (1, 6, 6), "no counterpart"),
        (nn.Sequential(nn.Linear(6, 4)), (1, 6, 6), "flatten it first"),
        (nn.Sequential(nn.BatchNorm1d(1)), (1, 6, 6), "BatchNorm1d"),
        (nn.Sequential(nn.BatchNorm2d(1, eps=1e-3)), (1, 6, 6), "eps"),
        (_Twice(), (1, 6, 6), "more than one input"),
    ]
    for model, shape, message in cases:
        with pytest.raises(ValueError, match=message):
            bie.export_model(model.eval(), path, shape)

    class Scaled(nn.Module):
        def forward(self, x):
            return x * 2

    with pytest.raises(ValueError, match="no counterpart"):
        bie.export_model(Scaled(), path, (1, 6, 6))

    class Untraceable(nn.Module):
        def forward(self, x):
            return x if x.sum() > 0 else -x

    with pytest.raises(ValueError, match="torch.fx cannot trace"):
        bie.export_model(Untraceable(), path, (1, 6, 6))
    assert operator.add  # (the add of two values is exported: see the graph test)
