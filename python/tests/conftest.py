# SPDX-License-Identifier: Apache-2.0
import os
import sys
import zlib

import pytest
import torch

# The package of this checkout, unless the tests run against an installed bie (make test-wheel).
if not os.environ.get("BIE_TEST_INSTALLED"):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import bie  # noqa: E402


def pytest_report_header(config):
    return f"bie: package {os.path.dirname(bie.__file__)}, libbie {bie.library_path()}"


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
    # one fixed seed per test (from its id), shown in the report of a failure
    seed = zlib.crc32(request.node.nodeid.encode()) ^ int(os.environ.get("BIE_TEST_SEED", "0"))
    torch.manual_seed(seed)
    yield
    if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
        print(f"seed {seed} (BIE_TEST_SEED={os.environ.get('BIE_TEST_SEED', '0')})")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)
