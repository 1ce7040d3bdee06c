# SPDX-License-Identifier: Apache-2.0
"""Loading libbie and declaring its C API for ctypes.

The library is found, in this order, through
  1. the environment variable BIE_LIBRARY (a path to libbie.so),
  2. package data (libbie.so, built and installed next to this file by ``pip install ./python``),
  3. the build directory of a source checkout (``build/libbie.so`` beside ``python/``),
  4. the system's library path (``ctypes.util.find_library("bie")``).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from typing import Optional

BIE_MAX_DIMS = 8

# enum bie_status
STATUS_OK = 0
STATUS_INVALID_ARGUMENT = 1
STATUS_UNSUPPORTED = 2

# enum bie_dtype
DT_F32, DT_F16, DT_BF16, DT_I8, DT_U8, DT_I32, DT_B1, DT_S4, DT_F64, DT_I64 = range(10)

# enum bie_device_type
DEV_CPU, DEV_CUDA = 0, 1

# enum bie_quant
QUANT_BINARY, QUANT_INT4, QUANT_INT8 = 1, 4, 8

# enum bie_pad_value
PAD_ZERO, PAD_MINUS_ONE, PAD_PLUS_ONE = 0, 1, 2

# enum bie_backend
BACKEND_AUTO, BACKEND_REF, BACKEND_CPU, BACKEND_CUDA = 0, 1, 2, 3


class BieError(RuntimeError):
    """A libbie call failed. ``status`` is the C status code; the message is the library's own
    (bie_context_last_error), prefixed with the C function's name."""

    def __init__(self, function, status, message):
        self.function = function
        self.status = status
        super().__init__(f"{function}: {message}")


class Tensor(ctypes.Structure):
    """struct bie_tensor: a non-owning view; strides in elements (bits for B1, nibbles for S4)."""
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * BIE_MAX_DIMS),
        ("stride", ctypes.c_int64 * BIE_MAX_DIMS),
        ("device_type", ctypes.c_int),
        ("device_index", ctypes.c_int32),
    ]


class ContextParams(ctypes.Structure):
    _fields_ = [("backend", ctypes.c_int), ("num_threads", ctypes.c_int32), ("max_isa", ctypes.c_int)]


class LinearDesc(ctypes.Structure):
    _fields_ = [("quant", ctypes.c_int), ("in_features", ctypes.c_int64), ("out_features", ctypes.c_int64)]


class Conv2dDesc(ctypes.Structure):
    _fields_ = [
        ("quant", ctypes.c_int),
        ("in_channels", ctypes.c_int64),
        ("out_channels", ctypes.c_int64),
        ("kernel", ctypes.c_int32 * 2),
        ("stride", ctypes.c_int32 * 2),
        ("padding", ctypes.c_int32 * 2),
        ("dilation", ctypes.c_int32 * 2),
        ("groups", ctypes.c_int32),
        ("pad_value", ctypes.c_int),
    ]


_TP = ctypes.POINTER(Tensor)


class ForwardArgs(ctypes.Structure):
    _fields_ = [("x", _TP), ("bias_a", _TP), ("weight", _TP), ("scale_a", _TP), ("scale_w", _TP), ("y", _TP),
                ("out_mul", _TP), ("out_add", _TP), ("residual", _TP), ("out_bits", _TP), ("out_bits_bias", _TP),
                ("x_clamp", ctypes.c_float)]


class BackwardArgs(ctypes.Structure):
    """struct bie_backward_args, every field in the C order."""
    _fields_ = [
        ("x", _TP), ("bias_a", _TP), ("weight", _TP), ("scale_a", _TP), ("scale_w", _TP), ("grad_y", _TP),
        ("grad_x", _TP), ("grad_weight", _TP), ("grad_scale_a", _TP), ("grad_bias_a", _TP), ("x_mask", _TP),
        ("grad_x_mask", _TP), ("grad_x_add", _TP), ("x_clamp", ctypes.c_float),
    ]


class MatmulDesc(ctypes.Structure):
    _fields_ = [("quant", ctypes.c_int)]


class MatmulArgs(ctypes.Structure):
    _fields_ = [("x", _TP), ("y", _TP), ("x_clip", _TP), ("y_clip", _TP), ("out", _TP)]


class MatmulBackwardArgs(ctypes.Structure):
    _fields_ = [("x", _TP), ("y", _TP), ("x_clip", _TP), ("y_clip", _TP), ("grad_out", _TP), ("grad_x", _TP),
                ("grad_y", _TP), ("grad_x_clip", _TP), ("grad_y_clip", _TP)]


class EmbeddingDesc(ctypes.Structure):
    _fields_ = [("quant", ctypes.c_int), ("bag", ctypes.c_int32)]


class EmbeddingArgs(ctypes.Structure):
    _fields_ = [("indices", _TP), ("table", _TP), ("scale", _TP), ("out", _TP)]


class EmbeddingBackwardArgs(ctypes.Structure):
    _fields_ = [("indices", _TP), ("inverse", _TP), ("scale", _TP), ("grad_out", _TP), ("grad_rows", _TP)]


class AffineMaxpool2dDesc(ctypes.Structure):
    _fields_ = [("kernel_h", ctypes.c_int32), ("kernel_w", ctypes.c_int32), ("stride_h", ctypes.c_int32),
                ("stride_w", ctypes.c_int32), ("pad_h", ctypes.c_int32), ("pad_w", ctypes.c_int32),
                ("lo", ctypes.c_float), ("hi", ctypes.c_float)]


class AffineMaxpool2dArgs(ctypes.Structure):
    _fields_ = [("x", _TP), ("mul", _TP), ("add", _TP), ("y", _TP), ("out_bits", _TP), ("out_bits_bias", _TP),
                ("argmax", _TP)]


class AffineMaxpool2dBackwardArgs(ctypes.Structure):
    _fields_ = [("argmax", _TP), ("grad_y", _TP), ("grad_z", _TP)]


class BatchnormDesc(ctypes.Structure):
    _fields_ = [("momentum", ctypes.c_float), ("eps", ctypes.c_float), ("training", ctypes.c_int32)]


class BatchnormArgs(ctypes.Structure):
    _fields_ = [(n, _TP) for n in ("x", "gamma", "beta", "running_mean", "running_var", "saved_mean", "saved_invstd",
                                   "y", "residual", "num_batches")]


class BatchnormBackwardArgs(ctypes.Structure):
    _fields_ = [(n, _TP) for n in ("x", "gamma", "saved_mean", "saved_invstd", "grad_y", "grad_x", "grad_gamma",
                                   "grad_beta")]


# The ctypes declarations of the C structs, checked against the loaded library (bie_abi_layout).
_STRUCTS = {
    "bie_tensor": Tensor, "bie_context_params": ContextParams, "bie_linear_desc": LinearDesc,
    "bie_conv2d_desc": Conv2dDesc, "bie_forward_args": ForwardArgs, "bie_backward_args": BackwardArgs,
    "bie_matmul_desc": MatmulDesc, "bie_matmul_args": MatmulArgs, "bie_matmul_backward_args": MatmulBackwardArgs,
    "bie_embedding_desc": EmbeddingDesc, "bie_embedding_args": EmbeddingArgs,
    "bie_embedding_backward_args": EmbeddingBackwardArgs, "bie_affine_maxpool2d_desc": AffineMaxpool2dDesc,
    "bie_affine_maxpool2d_args": AffineMaxpool2dArgs,
    "bie_affine_maxpool2d_backward_args": AffineMaxpool2dBackwardArgs, "bie_batchnorm_desc": BatchnormDesc,
    "bie_batchnorm_args": BatchnormArgs, "bie_batchnorm_backward_args": BatchnormBackwardArgs,
}


def _abi_mismatches(lib):
    """What differs between the ctypes declarations above and the library's structs (a list of
    strings; empty when they agree)."""
    if not hasattr(lib, "bie_abi_layout"):
        return ["the library does not export bie_abi_layout (it is older than this binding)"]
    f = lib.bie_abi_layout
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64)]
    off, size = ctypes.c_int64(), ctypes.c_int64()
    bad = []
    for cname, cls in _STRUCTS.items():
        if f(cname.encode(), None, ctypes.byref(off), ctypes.byref(size)) != STATUS_OK:
            bad.append(f"struct {cname} is unknown to the library")
            continue
        if size.value != ctypes.sizeof(cls):
            bad.append(f"sizeof(struct {cname}) is {size.value} in the library, {ctypes.sizeof(cls)} here")
        for field, _ in cls._fields_:
            d = getattr(cls, field)
            if f(cname.encode(), field.encode(), ctypes.byref(off), ctypes.byref(size)) != STATUS_OK:
                bad.append(f"struct {cname} has no field {field} in the library")
            elif (off.value, size.value) != (d.offset, d.size):
                bad.append(f"{cname}.{field} is at offset {off.value} size {size.value} in the library, "
                           f"offset {d.offset} size {d.size} here")
    return bad


def _candidates():
    env = os.environ.get("BIE_LIBRARY")
    if env:
        yield env
        return  # an explicit choice is never second-guessed
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "libbie.so")
    root = os.path.dirname(os.path.dirname(here))  # python/bie -> repository root
    yield os.path.join(root, "build", "libbie.so")
    found = ctypes.util.find_library("bie")
    if found:
        yield found


def _declare(lib):
    c_int, c_void_p, c_char_p = ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p
    sigs = {
        "bie_status_string": (c_char_p, [c_int]),
        "bie_version_string": (c_char_p, []),
        "bie_context_params_default": (None, [ctypes.POINTER(ContextParams)]),
        "bie_context_create": (c_int, [ctypes.POINTER(ContextParams), ctypes.POINTER(c_void_p)]),
        "bie_context_destroy": (None, [c_void_p]),
        "bie_context_last_error": (c_char_p, [c_void_p]),
        "bie_context_set_backend": (c_int, [c_void_p, c_int]),
        "bie_context_set_num_threads": (c_int, [c_void_p, ctypes.c_int32]),
        "bie_backend_available": (c_int, [c_int]),
        "bie_linear_forward": (c_int, [c_void_p, ctypes.POINTER(LinearDesc), ctypes.POINTER(ForwardArgs)]),
        "bie_linear_backward": (c_int, [c_void_p, ctypes.POINTER(LinearDesc), ctypes.POINTER(BackwardArgs)]),
        "bie_conv2d_forward": (c_int, [c_void_p, ctypes.POINTER(Conv2dDesc), ctypes.POINTER(ForwardArgs)]),
        "bie_conv2d_backward": (c_int, [c_void_p, ctypes.POINTER(Conv2dDesc), ctypes.POINTER(BackwardArgs)]),
        "bie_conv2d_output_size": (c_int, [ctypes.POINTER(Conv2dDesc), ctypes.c_int64, ctypes.c_int64,
                                           ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64)]),
        "bie_pack": (c_int, [c_void_p, _TP, _TP, _TP]),
        "bie_binarize_ste": (c_int, [c_void_p, _TP, _TP, _TP, _TP, _TP]),
        "bie_binarize_ste_clamped": (c_int, [c_void_p, _TP, ctypes.c_float, _TP, _TP, _TP, _TP, _TP]),
        "bie_unpack": (c_int, [c_void_p, _TP, _TP, _TP]),
        "bie_activation_scale_init": (c_int, [c_void_p, c_int, c_int, _TP, _TP]),
        "bie_weight_scale_init": (c_int, [c_void_p, c_int, _TP, _TP]),
        "bie_weight_to_latent_int8": (c_int, [c_void_p, _TP, _TP]),
        "bie_plan_linear_forward": (c_int, [c_void_p, ctypes.POINTER(LinearDesc), ctypes.POINTER(ForwardArgs),
                                            ctypes.POINTER(c_void_p)]),
        "bie_plan_conv2d_forward": (c_int, [c_void_p, ctypes.POINTER(Conv2dDesc), ctypes.POINTER(ForwardArgs),
                                            ctypes.POINTER(c_void_p)]),
        "bie_plan_linear_backward": (c_int, [c_void_p, ctypes.POINTER(LinearDesc), ctypes.POINTER(BackwardArgs),
                                             ctypes.POINTER(c_void_p)]),
        "bie_plan_conv2d_backward": (c_int, [c_void_p, ctypes.POINTER(Conv2dDesc), ctypes.POINTER(BackwardArgs),
                                             ctypes.POINTER(c_void_p)]),
        "bie_plan_forward": (c_int, [c_void_p, c_void_p, ctypes.POINTER(ForwardArgs)]),
        "bie_plan_backward": (c_int, [c_void_p, c_void_p, ctypes.POINTER(BackwardArgs)]),
        "bie_plan_describe": (c_char_p, [c_void_p]),
        "bie_plan_workspace_size": (ctypes.c_size_t, [c_void_p]),
        "bie_plan_destroy": (None, [c_void_p]),
        "bie_matmul_forward": (c_int, [c_void_p, ctypes.POINTER(MatmulDesc), ctypes.POINTER(MatmulArgs)]),
        "bie_matmul_backward": (c_int, [c_void_p, ctypes.POINTER(MatmulDesc), ctypes.POINTER(MatmulBackwardArgs)]),
        "bie_embedding_forward": (c_int, [c_void_p, ctypes.POINTER(EmbeddingDesc), ctypes.POINTER(EmbeddingArgs)]),
        "bie_affine_maxpool2d_forward": (c_int, [c_void_p, ctypes.POINTER(AffineMaxpool2dDesc),
                                                 ctypes.POINTER(AffineMaxpool2dArgs)]),
        "bie_embedding_backward": (c_int, [c_void_p, ctypes.POINTER(EmbeddingDesc),
                                           ctypes.POINTER(EmbeddingBackwardArgs)]),
        "bie_affine_maxpool2d_backward": (c_int, [c_void_p, ctypes.POINTER(AffineMaxpool2dDesc),
                                                  ctypes.POINTER(AffineMaxpool2dBackwardArgs)]),
        "bie_batchnorm_forward": (c_int, [c_void_p, ctypes.POINTER(BatchnormDesc), ctypes.POINTER(BatchnormArgs)]),
        "bie_batchnorm_backward": (c_int, [c_void_p, ctypes.POINTER(BatchnormBackwardArgs)]),
    }
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args
    # include/bie-cuda.h (in every build; UNSUPPORTED without the CUDA backend).
    if hasattr(lib, "bie_context_set_cuda_stream"):
        lib.bie_context_set_cuda_stream.restype = c_int
        lib.bie_context_set_cuda_stream.argtypes = [c_void_p, c_void_p]
    if hasattr(lib, "bie_cuda_record_begin"):
        lib.bie_cuda_record_begin.restype = c_int
        lib.bie_cuda_record_begin.argtypes = [c_void_p]
        lib.bie_cuda_record_end.restype = c_int
        lib.bie_cuda_record_end.argtypes = [c_void_p, ctypes.POINTER(c_void_p)]
        lib.bie_cuda_replay.restype = c_int
        lib.bie_cuda_replay.argtypes = [c_void_p, c_void_p]
        lib.bie_cuda_graph_destroy.restype = None
        lib.bie_cuda_graph_destroy.argtypes = [c_void_p]
    if hasattr(lib, "bie_backend_unavailable_reason"):
        lib.bie_backend_unavailable_reason.restype = c_char_p
        lib.bie_backend_unavailable_reason.argtypes = [c_int]


_lib = None
_lib_lock = threading.Lock()


def library() -> ctypes.CDLL:
    """The loaded libbie (ctypes.CDLL), loading it on first use."""
    global _lib
    if _lib is not None:
        return _lib
    with _lib_lock:
        if _lib is None:
            tried = []
            for path in _candidates():
                if os.path.sep in path and not os.path.exists(path):
                    tried.append(path + " (missing)")
                    continue
                try:
                    lib = ctypes.CDLL(path)
                except OSError as e:
                    tried.append(f"{path} ({e})")
                    continue
                bad = _abi_mismatches(lib)
                if bad:
                    tried.append(f"{path} (its structs do not match this binding: " + "; ".join(bad) +
                                 "; rebuild libbie from the same sources as the binding)")
                    continue
                _declare(lib)
                setattr(lib, "bie_path", path)  # (library_path())
                _lib = lib
                break
            if _lib is None:
                raise ImportError("bie: no usable libbie.so was found; build it (make build) or set BIE_LIBRARY "
                                  "to its path. Tried: " + "; ".join(tried))
    return _lib


def library_path() -> str:
    """The path of the libbie that was loaded."""
    return str(getattr(library(), "bie_path"))


_cuda = None


def cuda_available() -> bool:
    """True when libbie's CUDA backend is present (its plugin, libbie-cuda.so, and the CUDA
    libraries it needs) and sees a GPU; cuda_unavailable_reason() says why not."""
    global _cuda
    if _cuda is None:
        lib = library()
        _cuda = hasattr(lib, "bie_context_set_cuda_stream") and lib.bie_backend_available(BACKEND_CUDA) == 1
    return _cuda


def cuda_unavailable_reason() -> Optional[str]:
    """Why CUDA tensors cannot be used (libbie's words: the plugin is not installed, a CUDA library
    is missing, no GPU), or None when they can."""
    lib = library()
    if not hasattr(lib, "bie_backend_unavailable_reason"):
        return None if cuda_available() else "this libbie predates the CUDA plugin and has no CUDA backend"
    why = lib.bie_backend_unavailable_reason(BACKEND_CUDA)
    return why.decode(errors="replace") if why else None


class _Context:
    """One bie_context per thread (a context is not thread-safe; autograd runs CUDA backward
    passes on its own threads)."""

    def __init__(self):
        lib = library()
        self.lib = lib
        params = ContextParams()
        lib.bie_context_params_default(ctypes.byref(params))
        backend = os.environ.get("BIE_BACKEND", "").lower()
        params.backend = {"ref": BACKEND_REF, "cpu": BACKEND_CPU}.get(backend, BACKEND_AUTO)
        try:
            import torch
            params.num_threads = torch.get_num_threads()
        except Exception:  # pragma: no cover
            params.num_threads = 0
        self.num_threads = params.num_threads
        h = ctypes.c_void_p()
        s = lib.bie_context_create(ctypes.byref(params), ctypes.byref(h))
        if s != STATUS_OK or not h.value:
            raise BieError("bie_context_create", s, lib.bie_status_string(s).decode())
        self.handle = h
        self.stream = None

    def __del__(self):
        if getattr(self, "handle", None) is not None and self.handle.value:
            self.lib.bie_context_destroy(self.handle)
            self.handle = None

    def check(self, function, status):
        if status != STATUS_OK:
            msg = self.lib.bie_context_last_error(self.handle).decode(errors="replace")
            if not msg:
                msg = self.lib.bie_status_string(status).decode()
            raise BieError(function, status, msg)

    def call(self, function, *args):
        self.check(function, getattr(self.lib, function)(self.handle, *args))


_raw_stream = None


def bind_stream(ctx, device):
    """Points this thread's context at the current CUDA stream of `device` (no synchronisation)."""
    if device.index is None:
        import torch
        bind_stream_index(ctx, torch.cuda.current_device())
    else:
        bind_stream_index(ctx, device.index)


def bind_stream_index(ctx, index):
    """bind_stream for the CUDA device of this index."""
    global _raw_stream
    if _raw_stream is None:
        import torch
        # torch's own accessor of the raw stream handle (a few hundred nanoseconds) where it has
        # one; else the public one, which builds a Stream object per call
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        _raw_stream = raw if raw else (lambda i: torch.cuda.current_stream(i).cuda_stream)
    stream = _raw_stream(index)
    if ctx.stream != stream:
        ctx.call("bie_context_set_cuda_stream", ctypes.c_void_p(stream))
        ctx.stream = stream


_tls = threading.local()


def context() -> "_Context":
    """This thread's context; its thread count follows torch.get_num_threads()."""
    ctx = getattr(_tls, "ctx", None)
    if ctx is None:
        ctx = _tls.ctx = _Context()
    else:
        import torch
        n = torch.get_num_threads()
        if n != ctx.num_threads:
            ctx.call("bie_context_set_num_threads", n)
            ctx.num_threads = n
    return ctx


def version() -> str:
    """libbie's version ("0.1.0")."""
    return library().bie_version_string().decode()


# --- weight-only n-bit layers (include/bie.h "weight-only n-bit linear layers"; python/bie/mpq.py) ---
WQ_ZERO_SYM, WQ_ZERO_CODE, WQ_ZERO_OFFSET = 0, 1, 2
WQ_ACT_FLOAT, WQ_ACT_INT8 = 0, 1


class WqDesc(ctypes.Structure):
    _fields_ = [("in_features", ctypes.c_int64), ("out_features", ctypes.c_int64), ("bits", ctypes.c_int32),
                ("group_size", ctypes.c_int32), ("zero", ctypes.c_int), ("act", ctypes.c_int)]


class WqWeight(ctypes.Structure):
    _fields_ = [(n, _TP) for n in ("qweight", "scales", "zeros", "group_bits", "perm", "channel_scale", "bias")]


_STRUCTS.update({"bie_wq_desc": WqDesc, "bie_wq_weight": WqWeight})  # (checked at load time with the others)


def _declare_wq(lib):
    c_int, c_void_p, D, W = ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(WqDesc), ctypes.POINTER(WqWeight)
    sigs = {
        "bie_wq_linear_forward": [c_void_p, D, W, _TP, _TP],
        "bie_wq_linear_backward": [c_void_p, D, W, _TP, _TP, _TP, _TP],
        "bie_wq_dequantize": [c_void_p, D, W, _TP],
        "bie_wq_pack": [c_void_p, D, _TP, _TP, _TP],
        "bie_wq_unpack": [c_void_p, D, _TP, _TP, _TP],
        "bie_wq_quantize": [c_void_p, D, _TP, W],
    }
    for name, args in sigs.items():
        f = getattr(lib, name)
        f.restype = c_int
        f.argtypes = args


_declare_base = _declare


def _declare(lib):  # noqa: F811 (the base declarations, then the weight-only layer's)
    _declare_base(lib)
    _declare_wq(lib)
