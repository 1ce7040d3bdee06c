# SPDX-License-Identifier: Apache-2.0
"""bie: PyTorch modules for binary, 4-bit and 8-bit linear and conv2d layers, with the math in
libbie (a C library) reached through ctypes. See python/README.md."""
from ._lib import BieError, library_path, version, cuda_available, cuda_unavailable_reason
from .functional import PAD_MINUS_ONE, PAD_PLUS_ONE, PAD_ZERO, QUANT_BINARY, QUANT_INT4, QUANT_INT8
from .autograd import (BinaryConv2dForward, BinaryLinearForward, Q4Conv2dCutlassForward, Q4Conv2dForward,
                       Q4LinearForward, Q8Conv2dForward, Q8LinearForward)
from .layers import BieLayer, BinaryConv2d, BinaryLinear, Q4Conv2d, Q4Linear, Q8Conv2d, Q8Linear, set_data_parallel
from .fuse import FoldedConv2d, FoldedConvPool, FusedConv2d, fuse
from .model_helper import bie_layers, pack_bie_layers, prepare_bie_layers, replace_layers
from .optim import DiodeMix
from .export import export_model
from .model_import import import_model
from . import functional, reference
from .bmm import BMM
from .matmul import BinaryMatMul, BinaryMatMulFunction, Q4MatMul, Q4MatMulFunction, Q8MatMul, Q8MatMulFunction
from .attention import BMHA, LearnableBias
from .embedding import (BinaryEmbedding, BinaryEmbeddingBag, BinaryEmbeddingCuda, BinaryEmbeddingForward,
                        Q4Embedding, Q8Embedding)
from .compat import (BinaryConv2dCPP, BinaryConv2dCutlass, BinaryLinearCPP, BinaryLinearCuda, BinaryLinearCutlass,
                     Q4Conv2dCutlass, Q4LinearCutlass, Q8LinearCutlass, collect_layers, flatten_x, init_weight,
                     load_checkpoint, pad_embedding_dim, quantize_linear_with_binary_linear_cuda,
                     quantize_linear_with_mpq_linear_cuda, quantize_linear_with_q4_linear_cutlass, save_checkpoint,
                     unflatten_x)
from . import compat

__version__ = "0.1.0"

__all__ = [
    "BieError", "library_path", "version", "cuda_available", "cuda_unavailable_reason",
    "PAD_ZERO", "PAD_MINUS_ONE", "PAD_PLUS_ONE", "QUANT_BINARY", "QUANT_INT4", "QUANT_INT8",
    "BinaryLinearForward", "Q4LinearForward", "Q8LinearForward", "BinaryConv2dForward", "Q4Conv2dForward",
    "Q4Conv2dCutlassForward", "Q8Conv2dForward",
    "BieLayer", "BinaryLinear", "BinaryConv2d", "Q4Linear", "Q4Conv2d", "Q8Linear", "Q8Conv2d",
    "fuse", "FusedConv2d", "FoldedConv2d", "FoldedConvPool", "prepare_bie_layers", "pack_bie_layers", "bie_layers", "replace_layers", "DiodeMix", "set_data_parallel", "export_model",
    "import_model",
    "functional", "reference",
    # Bitorch Engine's other layers and names (bie.compat)
    "BMM", "BinaryMatMul", "BinaryMatMulFunction", "Q4MatMul", "Q4MatMulFunction", "Q8MatMul", "Q8MatMulFunction",
    "BMHA", "LearnableBias", "BinaryEmbedding", "BinaryEmbeddingBag", "BinaryEmbeddingCuda", "BinaryEmbeddingForward",
    "Q4Embedding", "Q8Embedding", "BinaryConv2dCPP", "BinaryConv2dCutlass", "BinaryLinearCPP", "BinaryLinearCuda",
    "BinaryLinearCutlass", "Q4Conv2dCutlass", "Q4LinearCutlass", "Q8LinearCutlass", "collect_layers", "flatten_x",
    "init_weight", "load_checkpoint", "pad_embedding_dim", "quantize_linear_with_binary_linear_cuda",
    "quantize_linear_with_mpq_linear_cuda", "quantize_linear_with_q4_linear_cutlass", "save_checkpoint",
    "unflatten_x", "compat",
]
