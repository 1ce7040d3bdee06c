# SPDX-License-Identifier: Apache-2.0
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import bie  # noqa: E402


def devices():
    out = ["cpu"]
    if torch.cuda.is_available():
        out.append("cuda")
    return out


def skip_if_no_bie_cuda(device):
    if device == "cuda" and not bie.cuda_available():
        pytest.skip("libbie has no CUDA backend (a CPU-only build); see test_cuda_tensor_without_cuda_backend")


@pytest.fixture(params=devices())
def device(request):
    skip_if_no_bie_cuda(request.param)
    return torch.device(request.param)


@pytest.fixture(autouse=True)
def _seed(request):
    # one seed per test, printed on failure by pytest's report of the test id
    seed = abs(hash(request.node.nodeid)) % (2 ** 31)
    torch.manual_seed(seed)
    request.node.user_properties.append(("seed", seed))
    yield
