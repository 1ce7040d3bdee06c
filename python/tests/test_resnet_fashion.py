# SPDX-License-Identifier: Apache-2.0
"""A ResNet-style binary network trained in PyTorch evaluates in `bie eval` with PyTorch's accuracy.

The network (binary 3x3 convolutions with batch norm, shortcuts added, PReLU; strided blocks with
an average-pooled float 1x1 shortcut; a float stem and classifier; AdaptiveAvgPool2d) trains for a
bounded time (BIE_TEST_TRAIN_SECONDS, default 45) on the first 10,000 training images of Debian's
Fashion-MNIST, is exported with bie.export_model, and is evaluated by `bie eval` on the first 2,000
test images. The accuracy `bie eval` prints must be PyTorch's, the logits libbie computes must be
PyTorch's up to float rounding, and bie.import_model must give back the same network."""
import gzip
import math
import os
import re
import subprocess
import time

import pytest
import torch
import torch.nn as nn

import bie
from model_files import ResBlock, bie_logits, bie_program

DATA = "/usr/share/datasets/fashion-mnist"
TRAIN_SECONDS = float(os.environ.get("BIE_TEST_TRAIN_SECONDS", "45"))
N_TRAIN, N_TEST = 10000, 2000


def read_idx(path, n):
    with gzip.open(path) as f:
        raw = f.read()
    nd = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(nd)]
    return torch.frombuffer(bytearray(raw[4 + 4 * nd:]), dtype=torch.uint8).reshape(dims)[:n].clone()


def as_input(img):
    # what `bie eval` feeds the model: byte * (1/255) in float32
    return (img.to(torch.float32) * torch.tensor(1.0 / 255.0, dtype=torch.float32)).unsqueeze(1)


def float_shortcut(cin, cout):
    return nn.Conv2d(cin, cout, 1, bias=False)


class BinaryResNet(nn.Module):
    def __init__(self, c=16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, c, 3, padding=1, bias=False), nn.BatchNorm2d(c))
        self.blocks = nn.Sequential(*(ResBlock(a, b, s, float_shortcut)
                                      for a, b, s in ((c, c, 1), (c, 2 * c, 2), (2 * c, 2 * c, 1), (2 * c, 4 * c, 2))))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4 * c, 10)

    def forward(self, x):
        x = self.pool(self.blocks(self.stem(x)))
        return self.fc(torch.flatten(x, 1))


def train(model, x, y, seconds):
    """Adam with a cosine schedule over the time budget; then the batch norm statistics are
    recomputed over 2,560 images with the final weights (the running averages lag behind fast
    binary-weight changes)."""
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    g = torch.Generator().manual_seed(0)
    t0 = time.monotonic()
    steps = 0
    while time.monotonic() - t0 < seconds:
        frac = (time.monotonic() - t0) / seconds
        for group in opt.param_groups:
            group["lr"] = 5e-3 * 0.5 * (1 + math.cos(math.pi * frac))
        i = torch.randint(0, len(x), (128,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x[i]), y[i]).backward()
        opt.step()
        steps += 1
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None  # a cumulative average
    with torch.no_grad():
        for k in range(10):
            model(x[k * 256:(k + 1) * 256])
    return steps


@pytest.mark.skipif(not os.path.exists(os.path.join(DATA, "t10k-images-idx3-ubyte.gz")),
                    reason="Debian's dataset-fashion-mnist is not installed")
def test_binary_resnet_accuracy_in_bie_eval(tmp_path):
    cli = bie_program()
    if not cli:
        pytest.skip("no bie program beside the library")
    torch.manual_seed(0)
    x = as_input(read_idx(os.path.join(DATA, "train-images-idx3-ubyte.gz"), N_TRAIN))
    y = read_idx(os.path.join(DATA, "train-labels-idx1-ubyte.gz"), N_TRAIN).long()
    tx = as_input(read_idx(os.path.join(DATA, "t10k-images-idx3-ubyte.gz"), N_TEST))
    ty = read_idx(os.path.join(DATA, "t10k-labels-idx1-ubyte.gz"), N_TEST).long()
    model = BinaryResNet()
    bie.prepare_bie_layers(model)
    steps = train(model, x, y, TRAIN_SECONDS)
    model.eval()
    with torch.no_grad():
        want = model(tx)
    correct_torch = int((want.argmax(1) == ty).sum())
    assert correct_torch > N_TEST // 2, f"the network did not learn: {correct_torch}/{N_TEST} after {steps} steps"

    path = str(tmp_path / "resnet.safetensors")
    arch = bie.export_model(model, path, (1, 28, 28))
    assert arch.count("add @") == 4 and "adaptive_avgpool 1 1" in arch and "prelu 64" in arch, arch
    r = subprocess.run([cli, "eval", path, "--data", DATA, "--limit", str(N_TEST), "--threads", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    m = re.search(r"test accuracy ([0-9.]+)% \((\d+) images\)", r.stdout)
    assert m and int(m.group(2)) == N_TEST, r.stdout
    correct_bie = round(float(m.group(1)) / 100 * N_TEST)

    # libbie's logits: binary layers exact; the float stem, shortcuts and classifier round
    # differently (OpenBLAS against PyTorch), which can flip the sign of a value that is almost 0
    # before a binary layer in a few images.
    got = bie_logits(path, tx)
    close = torch.isclose(got, want, rtol=1e-3, atol=1e-3).all(dim=1)
    assert close.float().mean() >= 0.97, f"only {int(close.sum())} of {N_TEST} images have PyTorch's logits"
    assert correct_bie == int((got.argmax(1) == ty).sum()), r.stdout  # bie eval runs what libbie computes
    assert abs(correct_bie - correct_torch) <= N_TEST // 400, \
        f"bie eval: {correct_bie}/{N_TEST}, PyTorch: {correct_torch}/{N_TEST} ({r.stdout.strip()})"
    print(f"{steps} steps: PyTorch {100 * correct_torch / N_TEST:.2f}%, bie eval {m.group(1)}%")

    # And back: the imported network computes PyTorch's logits.
    with torch.no_grad():
        back = bie.import_model(path)(tx)
    assert torch.allclose(back, want, rtol=1e-4, atol=1e-4), (back - want).abs().max()
