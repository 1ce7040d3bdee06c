# SPDX-License-Identifier: Apache-2.0
"""safetensors export and import of bie.mpq layers, in GPTQ's checkpoint format (per layer
`<name>.qweight` int32 [K*b/32, N], `<name>.qzeros` int32 [G, N*b/32] holding zero - 1, `<name>.scales`
[G, N], `<name>.g_idx` int32 [K], `<name>.bias`), read and written by libbie's safetensors code
(bie_safetensors_read / bie_safetensors_write). Metadata: bie.wq.bits and bie.wq.group_size."""
import ctypes
import os

import torch

from . import _lib
from .export import StTensor
from .mpq import MPQLinear

__all__ = ["save_gptq", "load_gptq", "read_safetensors"]

_DT = {torch.float32: _lib.DT_F32, torch.float16: _lib.DT_F16, torch.bfloat16: _lib.DT_BF16, torch.int32: _lib.DT_I32,
       torch.int8: _lib.DT_I8, torch.uint8: _lib.DT_U8, torch.float64: _lib.DT_F64}
_TD = {v: k for k, v in _DT.items()}


def _lib_st():
    lib = _lib.library()
    P = ctypes.POINTER(StTensor)
    for name, res, args in (("bie_safetensors_write", ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, P, ctypes.c_size_t,
                                                                    ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t]),
                            ("bie_safetensors_read", ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p,
                                                                   ctypes.POINTER(ctypes.c_void_p)]),
                            ("bie_safetensors_count", ctypes.c_size_t, [ctypes.c_void_p]),
                            ("bie_safetensors_at", P, [ctypes.c_void_p, ctypes.c_size_t]),
                            ("bie_safetensors_metadata", ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_char_p]),
                            ("bie_safetensors_free", None, [ctypes.c_void_p])):
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    return lib


def write_safetensors(path, tensors, metadata=None):
    lib = _lib_st()
    items = [(k, v.detach().cpu().contiguous()) for k, v in tensors.items()]
    arr = (StTensor * len(items))()
    keep = []
    for j, (name, t) in enumerate(items):
        nb = name.encode()
        keep += [t, nb]
        arr[j].name, arr[j].dtype, arr[j].ndim = nb, _DT[t.dtype], t.dim()
        for d, n in enumerate(t.shape):
            arr[j].shape[d] = n
        arr[j].data, arr[j].nbytes = t.data_ptr(), t.numel() * t.element_size()
    flat = [s.encode() for kv in (metadata or {}).items() for s in kv]
    mv = (ctypes.c_char_p * max(1, len(flat)))(*flat)
    ctx = _lib.context()
    ctx.check("bie_safetensors_write", lib.bie_safetensors_write(ctx.handle, os.fsencode(path), arr, len(items), mv,
                                                                 len(flat) // 2))


def read_safetensors(path):
    """({name: tensor (a copy)}, {metadata key: value})."""
    lib = _lib_st()
    ctx = _lib.context()
    h = ctypes.c_void_p()
    ctx.check("bie_safetensors_read", lib.bie_safetensors_read(ctx.handle, os.fsencode(path), ctypes.byref(h)))
    try:
        out = {}
        for i in range(lib.bie_safetensors_count(h)):
            t = lib.bie_safetensors_at(h, i).contents
            shape = [t.shape[d] for d in range(t.ndim)]
            buf = (ctypes.c_uint8 * t.nbytes).from_address(t.data) if t.nbytes else bytearray()
            out[t.name.decode()] = torch.frombuffer(bytearray(buf), dtype=_TD[t.dtype]).reshape(shape).clone() \
                if t.nbytes else torch.empty(shape, dtype=_TD[t.dtype])
        meta = {}
        for k in ("bie.wq.bits", "bie.wq.group_size"):
            v = lib.bie_safetensors_metadata(h, k.encode())
            if v is not None:
                meta[k] = v.decode()
        return out, meta
    finally:
        lib.bie_safetensors_free(h)


def save_gptq(model, path):
    """Every uniform asymmetric MPQLinear of model in GPTQ's format."""
    tensors, bits, gsz = {}, set(), set()
    for name, m in model.named_modules():
        if isinstance(m, MPQLinear):
            for k, v in m.gptq_state().items():
                tensors[f"{name}.{k}"] = v
            bits.add(m.w_bit)
            gsz.add(m.group_size)
    meta = {"bie.wq.bits": ",".join(map(str, sorted(bits))), "bie.wq.group_size": ",".join(map(str, sorted(gsz)))}
    write_safetensors(path, tensors, meta)


def load_gptq(model, path, zeros_offset=1):
    """Loads GPTQ tensors into the model's MPQLinear layers of the same names (zeros_offset: 1 for
    GPTQ v1 checkpoints, which store zero - 1; 0 for v2)."""
    t, _ = read_safetensors(path)
    for name, m in model.named_modules():
        if isinstance(m, MPQLinear) and f"{name}.qweight" in t:
            m.load_gptq(t[f"{name}.qweight"], t[f"{name}.qzeros"], t[f"{name}.scales"], t.get(f"{name}.g_idx"),
                        t.get(f"{name}.bias"), zeros_offset)
