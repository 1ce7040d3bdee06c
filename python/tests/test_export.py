# SPDX-License-Identifier: Apache-2.0
"""A model trained in PyTorch exports to the bie program's packed model file: libbie loads it and its
forward gives PyTorch's eval logits, and `bie eval` reports PyTorch's accuracy."""
import ctypes
import os
import re
import struct
import subprocess

import pytest
import torch
import torch.nn as nn

import bie
from bie import _lib

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


def trained_model():
    torch.manual_seed(3)
    model = make_model()
    img, labels = data(256, 1)
    x = as_input(img)
    opt = bie.DiodeMix(model.parameters(), lr=3e-3)
    for _ in range(40):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), labels).backward()
        opt.step()
    return model.eval()


def _model_api():
    lib = _lib.library()
    lib.bie_model_load.restype = ctypes.c_int
    lib.bie_model_load.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    lib.bie_model_forward.restype = ctypes.c_int
    lib.bie_model_forward.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int,
                                      ctypes.c_int, ctypes.POINTER(ctypes.POINTER(ctypes.c_float))]
    lib.bie_model_destroy.argtypes = [ctypes.c_void_p]
    lib.bie_model_num_outputs.restype = ctypes.c_int64
    lib.bie_model_num_outputs.argtypes = [ctypes.c_void_p]
    return lib


def bie_logits(path, x):
    lib = _model_api()
    ctx = _lib.context()
    m = ctypes.c_void_p()
    ctx.check("bie_model_load", lib.bie_model_load(ctx.handle, os.fsencode(path), ctypes.byref(m), None))
    try:
        x = x.contiguous()
        out = ctypes.POINTER(ctypes.c_float)()
        ctx.check("bie_model_forward", lib.bie_model_forward(ctx.handle, m, x.data_ptr(), x.shape[0], 0, 0,
                                                              ctypes.byref(out)))
        k = lib.bie_model_num_outputs(m)
        return torch.tensor([out[i] for i in range(x.shape[0] * k)]).reshape(x.shape[0], k)
    finally:
        lib.bie_model_destroy(m)


def write_idx(path, t):
    t = t.to(torch.uint8).contiguous()
    with open(path, "wb") as f:
        f.write(bytes([0, 0, 0x08, t.dim()]))
        for n in t.shape:
            f.write(struct.pack(">I", n))
        f.write(t.numpy().tobytes())


def test_export_runs_in_libbie_and_bie_eval(tmp_path):
    model = trained_model()
    img, labels = data(200, 2)
    x = as_input(img)
    with torch.no_grad():
        want = model(x)
    path = tmp_path / "model.safetensors"
    arch = bie.export_model(model, str(path), (1, H, W))
    assert arch.startswith("input 1 12 12; conv f32 8 3 1 1; bn; hardtanh; conv b1 16 3 1 1; bn; maxpool 2; "
                           "conv q4 16 3 2 1; relu; linear q8 32")
    got = bie_logits(path, x)
    # The low-bit layers are exact; the float layers differ by float rounding (OpenBLAS against
    # PyTorch), which can move an activation across a quantization boundary in a few samples.
    close = torch.isclose(got, want, rtol=1e-4, atol=1e-4).all(dim=1)
    assert close.float().mean() >= 0.95, f"only {int(close.sum())} of {len(close)} samples agree"
    assert (got.argmax(1) == want.argmax(1)).float().mean() >= 0.98
    acc_torch = float((want.argmax(1) == labels).float().mean())
    assert acc_torch > 0.5  # the model did learn

    cli = os.path.join(os.path.dirname(_lib.library_path()), "bie")
    if not os.access(cli, os.X_OK):
        pytest.skip(f"no bie program beside {_lib.library_path()}")
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
