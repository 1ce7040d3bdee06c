# SPDX-License-Identifier: Apache-2.0
"""A layer with K = 0 input features (or in_features=0 for saved bits) is refused with BieError,
as the C library refuses it, not with a torch error from reshaping an empty tensor."""
import pytest
import torch

import bie
from bie import functional as F


@pytest.mark.parametrize("quant", [F.QUANT_BINARY, F.QUANT_INT4, F.QUANT_INT8])
def test_zero_features(quant):
    x, w, g = torch.randn(3, 0), torch.randn(5, 0), torch.randn(3, 5)
    sa, sw = torch.tensor(1.0), torch.tensor(0.5)
    with pytest.raises(bie.BieError, match="K >= 1"):
        F.linear_forward(quant, x, w, sa, sw)
    with pytest.raises(bie.BieError, match="K >= 1"):
        F.linear_backward(quant, x, w, sa, sw, g)
    with pytest.raises(bie.BieError, match="K >= 1"):
        F.binarize_ste(x, sa)


def test_zero_in_features_of_saved_bits():
    bits = torch.zeros(2, 1, dtype=torch.uint8)
    with pytest.raises(bie.BieError, match="K >= 1"):
        F.linear_forward(F.QUANT_BINARY, bits, torch.randn(3, 0), torch.tensor(1.0), torch.tensor(1.0), in_features=0)


def test_zero_outputs_and_channels():
    sa, sw = torch.tensor(1.0), torch.tensor(0.5)
    with pytest.raises(bie.BieError, match="N >= 1"):
        F.linear_backward(F.QUANT_BINARY, torch.randn(1), torch.randn(0, 1), sa, sw, torch.randn(0))
    with pytest.raises(bie.BieError, match="C >= 1"):  # an empty batch is no reason to skip the check
        F.conv2d_forward(F.QUANT_BINARY, torch.randn(0, 0, 1, 1), torch.randn(1, 0, 1, 1), sa, sw)
    with pytest.raises(bie.BieError, match="stride"):
        F.conv2d_output_size(4, 4, 3, stride=0)
    with pytest.raises(bie.BieError, match="pad_value"):
        F.conv2d_forward(F.QUANT_BINARY, torch.randn(0, 1, 1, 1), torch.randn(1, 1, 1, 1), sa, sw, pad_value=7)
    with pytest.raises(bie.BieError, match="pad_value"):
        F.conv2d_backward(F.QUANT_INT8, torch.randn(0, 1, 3, 3), torch.randn(1, 1, 1, 1), sa, sw, torch.randn(0, 1, 3, 3),
                          pad_value=bie.PAD_MINUS_ONE)
