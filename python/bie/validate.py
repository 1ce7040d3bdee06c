# SPDX-License-Identifier: Apache-2.0
"""Argument checks of the modules' constructors and calls: every argument is checked when the
module is made, with a message that names it, instead of failing later inside a forward."""
import torch

__all__ = ["positive_int", "pair", "float_dtype", "check_conv_args", "check_bits"]


def positive_int(name, v, minimum=1):
    if isinstance(v, bool) or not isinstance(v, int):
        try:
            import numpy as np
            if isinstance(v, np.integer):
                v = int(v)
        except ImportError:  # pragma: no cover
            pass
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f"bie: {name} must be an int >= {minimum}, got {v!r}")
    return v


def pair(name, v, minimum):
    """(a, b) from an int or a pair of ints, each >= minimum."""
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ValueError(f"bie: {name} must be an int or a pair of ints, got {v!r}")
        return positive_int(f"{name}[0]", v[0], minimum), positive_int(f"{name}[1]", v[1], minimum)
    if isinstance(v, str):
        raise ValueError(f"bie: {name} = {v!r}: string values (such as padding='same') are not supported")
    a = positive_int(name, v, minimum)
    return a, a


def float_dtype(dtype):
    if not isinstance(dtype, torch.dtype) or dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise TypeError(f"bie: dtype must be torch.float32, torch.float16 or torch.bfloat16, got {dtype!r}")
    return dtype


def check_conv_args(in_channels, out_channels, kernel_size, stride, padding, dilation):
    positive_int("in_channels", in_channels)
    positive_int("out_channels", out_channels)
    pair("kernel_size", kernel_size, 1)
    pair("stride", stride, 1)
    pair("padding", padding, 0)
    pair("dilation", dilation, 1)


def check_bits(a_bit, w_bit, bits):
    for name, v in (("a_bit", a_bit), ("w_bit", w_bit)):
        if v is not None and v != bits:
            raise ValueError(f"bie: this layer is {bits}-bit ({name} must be {bits} or left out, got {v!r})")

