# SPDX-License-Identifier: Apache-2.0
"""Shared helpers of the model-file tests: libbie's C model API through ctypes (load a file and run
its forward, or create, train and save a model from an architecture string), IDX files, and the
`bie` program beside the library."""
import ctypes
import os
import struct

import torch
import torch.nn as nn

import bie
from bie import _lib
from bie.functional import _view

_TP = ctypes.POINTER(_lib.Tensor)


class _ForwardDesc(ctypes.Structure):  # struct bie_model_forward_desc
    _fields_ = [("training", ctypes.c_int32), ("float_layers", ctypes.c_int32)]


class _ForwardArgs(ctypes.Structure):  # struct bie_model_forward_args
    _fields_ = [("x", _TP), ("logits", _TP)]


class _BackwardArgs(ctypes.Structure):  # struct bie_model_backward_args
    _fields_ = [("grad_logits", _TP)]


class _StepDesc(ctypes.Structure):  # struct bie_model_step_desc
    _fields_ = [("lr", ctypes.c_float), ("weight_decay", ctypes.c_float), ("diode_lr", ctypes.c_float)]


def model_api():
    lib = _lib.library()
    p = ctypes.c_void_p
    lib.bie_model_load.restype = ctypes.c_int
    lib.bie_model_load.argtypes = [p, ctypes.c_char_p, ctypes.POINTER(p), p]
    lib.bie_model_create.restype = ctypes.c_int
    lib.bie_model_create.argtypes = [p, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint64, ctypes.POINTER(p)]
    lib.bie_model_forward.restype = ctypes.c_int
    lib.bie_model_forward.argtypes = [p, p, ctypes.POINTER(_ForwardDesc), ctypes.POINTER(_ForwardArgs)]
    lib.bie_model_backward.restype = ctypes.c_int
    lib.bie_model_backward.argtypes = [p, p, ctypes.POINTER(_BackwardArgs)]
    lib.bie_model_step.restype = ctypes.c_int
    lib.bie_model_step.argtypes = [p, p, ctypes.POINTER(_StepDesc)]
    lib.bie_model_save.restype = ctypes.c_int
    lib.bie_model_save.argtypes = [p, p, ctypes.c_char_p, ctypes.c_int, p, ctypes.c_size_t]
    lib.bie_model_destroy.argtypes = [p]
    lib.bie_model_num_outputs.restype = ctypes.c_int64
    lib.bie_model_num_outputs.argtypes = [p]
    return lib


def _forward(lib, ctx, m, x, training=0):
    x = x.contiguous().to(torch.float32)
    out = torch.empty(x.shape[0], lib.bie_model_num_outputs(m), dtype=torch.float32)
    xv, ov = _view(x), _view(out)
    args = _ForwardArgs(ctypes.pointer(xv), ctypes.pointer(ov))
    ctx.check("bie_model_forward", lib.bie_model_forward(ctx.handle, m, ctypes.byref(_ForwardDesc(training, 0)),
                                                          ctypes.byref(args)))
    return out


def bie_logits(path, x):
    """The logits of libbie's forward (eval) of the model file at path on x [N, C, H, W]."""
    lib = model_api()
    ctx = _lib.context()
    m = ctypes.c_void_p()
    ctx.check("bie_model_load", lib.bie_model_load(ctx.handle, os.fsencode(path), ctypes.byref(m), None))
    try:
        return _forward(lib, ctx, m, x)
    finally:
        lib.bie_model_destroy(m)


def c_trained_model(arch, path, x, labels, steps=3, seed=1):
    """Creates a model in C from arch, takes `steps` training steps on (x, labels) with libbie's
    optimizer, and saves it packed at path."""
    lib = model_api()
    ctx = _lib.context()
    m = ctypes.c_void_p()
    ctx.check("bie_model_create", lib.bie_model_create(ctx.handle, arch.encode(), 0, seed, ctypes.byref(m)))
    try:
        for _ in range(steps):
            z = _forward(lib, ctx, m, x, training=1)
            grad = (torch.softmax(z.double(), 1) - torch.nn.functional.one_hot(labels, z.shape[1])) / z.shape[0]
            grad = grad.to(torch.float32).contiguous()
            gv = _view(grad)
            ctx.check("bie_model_backward",
                      lib.bie_model_backward(ctx.handle, m, ctypes.byref(_BackwardArgs(ctypes.pointer(gv)))))
            ctx.check("bie_model_step", lib.bie_model_step(ctx.handle, m, ctypes.byref(_StepDesc(0.01, 0.0, 0.05))))
        ctx.check("bie_model_save", lib.bie_model_save(ctx.handle, m, os.fsencode(path), 0, None, 0))
    finally:
        lib.bie_model_destroy(m)


def write_idx(path, t):
    t = t.to(torch.uint8).contiguous()
    with open(path, "wb") as f:
        f.write(bytes([0, 0, 0x08, t.dim()]))
        for n in t.shape:
            f.write(struct.pack(">I", n))
        f.write(t.numpy().tobytes())


def bie_program():
    """The `bie` program beside the library, or None."""
    cli = os.path.join(os.path.dirname(_lib.library_path()), "bie")
    return cli if os.access(cli, os.X_OK) else None


class ResBlock(nn.Module):
    """A residual block of a binary ResNet: binary 3x3 conv, batch norm, the shortcut added,
    PReLU. A block that changes the shape has the shortcut avgpool -> shortcut_conv(cin, cout)
    (a 1x1 conv) -> batch norm."""

    def __init__(self, cin, cout, stride, shortcut_conv):
        super().__init__()
        self.conv = bie.BinaryConv2d(cin, cout, 3, stride, 1)
        self.bn = nn.BatchNorm2d(cout)
        self.act = nn.PReLU(cout)
        if stride == 1 and cin == cout:
            self.shortcut = nn.Identity()
        else:
            self.shortcut = nn.Sequential(nn.AvgPool2d(stride), shortcut_conv(cin, cout), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.bn(self.conv(x))
        out += self.shortcut(x)
        return self.act(out)
