# SPDX-License-Identifier: Apache-2.0
"""Bitorch Engine's BMM enum (the binary GEMM kernel of its CUDA binary linear layer) and what bie
does with each value: libbie has one binary GEMM per device, exact for every shape, so

- BMM.ADAPTIVE (the default; None too): libbie chooses, as Bitorch Engine's ADAPTIVE does;
- BMM.BTC32 (bit tensor cores): honoured on CUDA tensors, where libbie's binary GEMM runs on the
  tensor cores (AND-popcount) for every shape (Bitorch Engine's BTC needed m, n % 8 and k % 128);
  refused for CPU tensors, which have no tensor cores;
- BMM.BSTC32 (Bitorch Engine's software-popcount CUDA kernel): refused, since libbie has no such
  kernel (its tensor-core GEMM gives the same integers).
"""
import enum

__all__ = ["BMM", "check_bmm_type"]


class BMM(enum.Enum):
    BSTC32 = 1
    BTC32 = 2
    ADAPTIVE = 3


def check_bmm_type(bmm_type, device=None):
    """The BMM value for bmm_type (a BMM, its int value, or None for ADAPTIVE); raises when bie
    cannot honour it (for tensors on `device`, when given)."""
    if bmm_type is None:
        return BMM.ADAPTIVE
    if not isinstance(bmm_type, BMM):
        try:
            bmm_type = BMM(int(bmm_type))
        except (TypeError, ValueError):
            raise ValueError(f"bie: bmm_type must be a bie.BMM (BSTC32, BTC32 or ADAPTIVE), got {bmm_type!r}") from None
    if bmm_type is BMM.BSTC32:
        raise ValueError("bie: BMM.BSTC32 (a software-popcount CUDA kernel) does not exist in libbie, whose "
                         "tensor-core binary GEMM gives the same integers for every shape: use BMM.ADAPTIVE or "
                         "BMM.BTC32")
    if bmm_type is BMM.BTC32 and device is not None and getattr(device, "type", device) != "cuda":
        raise ValueError(f"bie: BMM.BTC32 runs on the bit tensor cores of a CUDA device; the input is on {device} "
                         "(use BMM.ADAPTIVE there)")
    return bmm_type
