# SPDX-License-Identifier: Apache-2.0
"""Bitorch Engine's call signatures and protocol as a user of it writes them (bie.compat): layer
keywords, utils.convert and utils.model_helper, the BMM enum, the CPP layers, DiodeMix's state names
and GaLore, the binding's ABI check, and bad input refused with messages that name it."""
import ctypes
import io
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import bie
from bie import _lib


# --- the binding's ABI check ------------------------------------------------------------------

def test_abi_layout_matches():
    assert _lib._abi_mismatches(_lib.library()) == []


def test_abi_mismatch_is_named(monkeypatch):
    class WrongDesc(ctypes.Structure):
        _fields_ = [("quant", ctypes.c_int), ("in_features", ctypes.c_int32), ("out_features", ctypes.c_int64)]

    monkeypatch.setitem(_lib._STRUCTS, "bie_linear_desc", WrongDesc)
    bad = _lib._abi_mismatches(_lib.library())
    assert any("bie_linear_desc.in_features" in b for b in bad), bad


def test_library_without_abi_layout_is_refused(tmp_path):
    """A library that does not export bie_abi_layout (libc here) is refused with a message saying why."""
    env = dict(os.environ, BIE_LIBRARY="libc.so.6", PYTHONPATH=os.path.dirname(os.path.dirname(bie.__file__)))
    code = "import bie\ntry:\n    bie.library_path()\nexcept ImportError as e:\n    print(e)\n"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120).stdout
    assert "bie_abi_layout" in out and "libc.so.6" in out, out


# --- constructors -----------------------------------------------------------------------------

def test_bitorch_engine_keywords():
    m = bie.BinaryLinear(input_features=24, out_features=7, device="cpu", dtype=torch.float, symmetric=True)
    assert (m.input_features, m.output_features, m.in_features, m.bits_binary_word) == (24, 7, 24, 8)
    m = bie.BinaryLinearCuda(24, 7, None, torch.float, True, bmm_type=bie.BMM.ADAPTIVE)
    assert m.latent_int8 and m.bmm_type is bie.BMM.ADAPTIVE
    m.set_bits_binary_word(8)
    with pytest.raises(ValueError, match="bits_binary_word"):
        m.set_bits_binary_word(32)
    with pytest.raises(ValueError, match="bits_binary_word"):
        bie.BinaryLinear(16, 4, bits_binary_word=32)
    q = bie.Q4LinearCutlass(in_channels=32, out_channels=8, a_bit=4, w_bit=4, device="cpu")
    assert (q.a_bit, q.w_bit) == (4, 4)
    assert (bie.Q8Linear(32, 8).a_bit, bie.Q8Conv2d(8, 4, 3).w_bit) == (8, 8)
    with pytest.raises(ValueError, match="a_bit"):
        bie.Q4Linear(32, 8, a_bit=8)
    c = bie.BinaryConv2dCutlass(8, 4, 3, 1, 1, 1, None, torch.float, True)
    assert c.latent_int8


@pytest.mark.parametrize("make,match", [
    (lambda: bie.BinaryConv2d(8, 4, 3, 0, 1), "stride"),
    (lambda: bie.BinaryConv2d(8, 4, 3, 1, -1), "padding"),
    (lambda: bie.Q4Conv2d(8, 4, 0), "kernel_size"),
    (lambda: bie.Q8Conv2d(8, 4, 3, dilation=0), "dilation"),
    (lambda: bie.BinaryConv2d(0, 4, 3), "in_channels"),
    (lambda: bie.BinaryConv2d(8, 4, (3, 3, 3)), "kernel_size"),
    (lambda: bie.BinaryConv2d(8, 4, 3, padding="same"), "padding"),
    (lambda: bie.BinaryConv2d(8, 4, 3, pad_value=7), "pad_value"),
    (lambda: bie.BinaryLinear(0, 4), "in_features"),
    (lambda: bie.BinaryLinear(4, 2.5), "out_features"),
    (lambda: bie.BinaryLinear(4, 4, dtype=torch.int8), "dtype"),
    (lambda: bie.BinaryLinear(4, 4, in_features=4), "in_features"),
    (lambda: bie.BinaryLinear(4, 4, input_features=4), "input_features"),
    (lambda: bie.BinaryLinear(4, 4, bmm_type=bie.BMM.BSTC32), "BSTC32"),
    (lambda: bie.BinaryLinear(4, 4, bmm_type=9), "bmm_type"),
    (lambda: bie.BMHA(16, 30, 4), "multiple"),
    (lambda: bie.BMHA(16, 32, 4, score_matmul="int2"), "matmul"),
    (lambda: bie.BinaryMatMul(dtype=torch.int32), "dtype"),
    (lambda: bie.BinaryEmbeddingCuda(num_embeddings=0, embedding_dim=4), "num_embeddings"),
    (lambda: bie.BinaryEmbeddingCuda(num_embeddings=5, embedding_dim=4, padding_idx=5), "padding_idx"),
    (lambda: bie.Q4Embedding(5, 4, w_bit=8), "w_bit"),
    (lambda: bie.DiodeMix([nn.Parameter(torch.zeros(2))], lr=-1), "learning rate"),
    (lambda: bie.DiodeMix([nn.Parameter(torch.zeros(2))], betas=(1.0, 0.9)), "betas"),
    (lambda: bie.DiodeMix([{"params": [nn.Parameter(torch.zeros(3))], "rank": 2}]), "GaLore"),
    (lambda: bie.DiodeMix([{"params": [nn.Parameter(torch.zeros(3, 3))], "rank": 2, "proj_type": "x"}]), "proj_type"),
])
def test_bad_arguments_are_named(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


# --- bmm_type --------------------------------------------------------------------------------

def test_bmm_type_honoured_or_refused():
    m = bie.BinaryLinear(16, 4)
    x = torch.randn(3, 16)
    y = m(x, bmm_type=bie.BMM.ADAPTIVE)
    assert torch.equal(m(x, bmm_type=3), y)
    with pytest.raises(ValueError, match="BTC32"):
        m(x, bmm_type=bie.BMM.BTC32)  # bit tensor cores on a CPU tensor
    with pytest.raises(ValueError, match="BSTC32"):
        m(x, bmm_type=bie.BMM.BSTC32)
    if torch.cuda.is_available() and bie.cuda_available():
        mc = bie.BinaryLinear(16, 4).cuda()
        mc(x.cuda(), bmm_type=bie.BMM.BTC32)


# --- utils.convert / model_helper ---------------------------------------------------------------

def _mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def test_replace_layers_bitorch_engine_signature():
    model = _mlp()
    fn = lambda old: bie.BinaryLinear(old.in_features, old.out_features)  # noqa: E731
    new = bie.replace_layers(model, ["2"], bie.BinaryLinear, fn)
    assert len(new) == 1 and isinstance(model[2], bie.BinaryLinear) and model[2] is new[0]
    assert isinstance(model[0], nn.Linear) and isinstance(model[4], nn.Linear)
    assert model(torch.randn(5, 16)).shape == (5, 4)
    names = bie.collect_layers(model)
    assert sorted(names) == ["0", "4"]
    with pytest.raises(TypeError, match="replace_fn returned"):
        bie.replace_layers(model, ["0"], bie.BinaryLinear, lambda old: nn.Linear(16, 32))
    nested = nn.Sequential(nn.Sequential(nn.Linear(8, 8)), nn.Linear(8, 2))
    new = bie.compat.replace_layers(nested, bie.collect_layers(nested), bie.Q4Linear,
                                    lambda old: bie.Q4Linear(old.in_features, old.out_features))
    assert len(new) == 2 and isinstance(nested[0][0], bie.Q4Linear)
    assert bie.replace_layers(_mlp(), names_to_replace=["4"], class_=bie.BinaryLinear, replace_fn=fn)


def test_quantize_linear_helpers():
    model = _mlp()
    assert len(bie.quantize_linear_with_binary_linear_cuda(model, ["2"])) == 1
    assert isinstance(model[2], bie.BinaryLinearCuda)
    assert len(bie.quantize_linear_with_q4_linear_cutlass(model, ["4"])) == 1
    assert isinstance(model[4], bie.Q4LinearCutlass)
    with pytest.raises(NotImplementedError, match="MPQ"):
        bie.quantize_linear_with_mpq_linear_cuda(model, ["0"])
    model = _mlp()
    assert bie.replace_layers(model, "q8", exclude=("0", "4")) == ["2"]


def test_checkpoint_helpers(tmp_path):
    model = _mlp()
    bie.replace_layers(model, "binary", exclude=("0", "4"))
    x = torch.randn(6, 16)
    model(x)
    model.eval()
    y = model(x)
    path = str(tmp_path / "ckpt.pth")
    bie.save_checkpoint(model, path)
    fresh = _mlp()
    bie.replace_layers(fresh, "binary", exclude=("0", "4"))
    bie.load_checkpoint(fresh, path)
    fresh.eval()
    assert torch.equal(fresh(x), y)
    flat, shape = bie.flatten_x(torch.randn(2, 3, 5))
    assert flat.shape == (6, 5) and bie.unflatten_x(flat, shape).shape == (2, 3, 5)
    w = torch.randn(5, 7)
    q, s = bie.init_weight(w)
    assert q.dtype == torch.int8 and torch.allclose(s, w.abs().mean())
    assert bie.pad_embedding_dim(torch.zeros(2, 13)).shape == (2, 16)


def test_set_quantized_weight_data():
    m = bie.BinaryLinear(20, 6)
    x = torch.randn(4, 20)
    packed = bie.functional.pack_weight(bie.QUANT_BINARY, -m.weight.detach())
    m.set_quantized_weight_data(packed)
    m.eval()
    assert torch.equal(m(x), -bie.functional.linear_forward(bie.QUANT_BINARY, x, m.weight, m.scale_a, m.scale_w,
                                                             m.bias_a))
    with pytest.raises(ValueError, match="qweight"):
        m.set_quantized_weight_data(torch.zeros(6, 20, dtype=torch.int8))


# --- state_dicts of another kind, empty batches -------------------------------------------------

def test_state_dict_of_another_kind_is_refused():
    q4 = bie.Q4Linear(16, 8)
    with pytest.raises(RuntimeError, match="4-bit linear"):
        bie.BinaryLinear(16, 8).load_state_dict(q4.state_dict())
    conv = bie.BinaryConv2d(4, 4, 1)
    with pytest.raises(RuntimeError, match="conv2d"):
        bie.BinaryLinear(4, 4).load_state_dict({k: v.reshape(4, 4) if k == "weight" else v
                                               for k, v in conv.state_dict().items()})
    with pytest.raises(RuntimeError, match="shape"):
        bie.BinaryLinear(16, 9).load_state_dict(bie.BinaryLinear(16, 8).state_dict())
    # Bitorch Engine's binary layer (int8 latent weight, no eps, no kind) into a 4-bit layer
    b = bie.BinaryLinear(16, 8, latent_int8=True)
    b.prepare_params()
    sd = {k: v for k, v in b.state_dict().items() if k not in ("eps", "_extra_state")}
    with pytest.raises(RuntimeError, match="binary"):
        bie.Q4Linear(16, 8).load_state_dict(sd)
    packed = bie.Q4Linear(16, 8)
    packed.generate_quantized_weight()
    sd = {k: v for k, v in packed.state_dict().items() if k != "_extra_state"}
    with pytest.raises(RuntimeError, match="qweight"):
        bie.BinaryLinear(16, 8).load_state_dict(sd)


def test_empty_first_batch():
    for m in (bie.BinaryLinear(12, 5), bie.Q8Conv2d(3, 4, 3, padding=1)):
        x = torch.randn(0, 12) if not m.is_conv else torch.randn(0, 3, 5, 5)
        y = m(x)
        assert y.shape[0] == 0 and float(m.scale_a) == 0.0
        x = torch.randn(2, 12) if not m.is_conv else torch.randn(2, 3, 5, 5)
        m(x).sum().backward()
        assert float(m.scale_a) > 0
    mm = bie.BinaryMatMul()
    with pytest.raises(ValueError, match="empty"):
        mm(torch.randn(0, 3, 4), torch.randn(0, 5, 4))


def test_cpp_layers_are_inference_only():
    m = bie.BinaryLinearCPP(8, 3)
    y = m(torch.randn(2, 8, requires_grad=True))
    with pytest.raises(RuntimeError, match="inference-only"):
        y.sum().backward()


# --- DiodeMix: Bitorch Engine's state names, checkpoints, GaLore -------------------------------

def test_diodemix_state_names_and_bitorch_engine_checkpoint():
    torch.manual_seed(0)
    lin = nn.Linear(6, 3)
    opt = bie.DiodeMix(lin.parameters(), lr=1e-2)
    lin(torch.randn(4, 6)).sum().backward()
    opt.step()
    st = opt.state_dict()["state"][0]
    assert set(st) == {"step", "exp_avg_l", "exp_avg_s"} and float(st["step"]) == 1
    # a Bitorch Engine DiodeMix checkpoint: the same names, step a float tensor [1]
    be = {"state": {i: {"step": torch.tensor([5.0]), "exp_avg_l": torch.full_like(p, 0.1),
                        "exp_avg_s": torch.full_like(p, 0.01)} for i, p in enumerate(lin.parameters())},
          "param_groups": [dict(opt.state_dict()["param_groups"][0])]}
    opt2 = bie.DiodeMix(lin.parameters(), lr=1e-2)
    opt2.load_state_dict(be)
    w0 = lin.weight.detach().clone()
    lin.zero_grad()
    lin(torch.randn(4, 6)).sum().backward()
    g = lin.weight.grad.clone()
    opt2.step()
    m = 0.99 * 0.1 + 0.01 * g
    v = 0.9999 * 0.01 + 0.0001 * g * g
    step = 1e-2 * math.sqrt(1 - 0.9999 ** 6) / (1 - 0.99 ** 6)
    assert torch.allclose(lin.weight.detach(), w0 - step * m / (v.sqrt() + 1e-6), atol=1e-7)
    assert float(opt2.state[lin.weight]["step"]) == 6
    # bie's earlier names load as well
    zeros = torch.zeros_like(lin.weight)
    old = {"state": {0: {"step": 2, "exp_avg": zeros, "exp_avg_sq": zeros.clone()}},
           "param_groups": be["param_groups"]}
    opt3 = bie.DiodeMix(lin.parameters(), lr=1e-2)
    opt3.load_state_dict(old)
    lin(torch.randn(4, 6)).sum().backward()
    opt3.step()
    assert "exp_avg_l" in opt3.state[lin.weight] and opt3.state[lin.weight]["step"] == 3


def test_diodemix_galore_projected_update():
    torch.manual_seed(1)
    w = nn.Parameter(torch.randn(8, 5))
    opt = bie.DiodeMix([{"params": [w], "rank": 2, "update_proj_gap": 10, "scale": 0.5, "proj_type": "std"}], lr=0.1)
    g = torch.randn(8, 5)
    w.grad = g.clone()
    w0 = w.detach().clone()
    opt.step()
    _, _, vh = torch.linalg.svd(g, full_matrices=False)
    p = vh[:2]                      # rows >= cols: the right projection
    low = g @ p.t()
    m, v = 0.01 * low, 0.0001 * low * low
    step = 0.1 * math.sqrt(1 - 0.9999) / (1 - 0.99)
    want = w0 - step * 0.5 * ((m / (v.sqrt() + 1e-6)) @ p)
    assert torch.allclose(w.detach(), want, atol=1e-5)
    assert opt.state[w]["exp_avg_l"].shape == (8, 2)


def test_diodemix_binary_embedding_descends():
    """A row whose gradient stays positive turns to -1 (sign descent; Bitorch Engine's embedding
    update set the bits to the gradient's sign, an ascent)."""
    e = bie.BinaryEmbeddingCuda(num_embeddings=4, embedding_dim=10)
    bie.prepare_bie_layers(e)
    opt = bie.DiodeMix(e.parameters(), lr=1.0, betas=(0.9, 0.5))
    idx = torch.tensor([1, 1, 2])
    untouched = e.qweight.detach()[[0, 3]].clone()
    for _ in range(3):
        opt.zero_grad()
        e(idx).sum().backward()  # d loss / d value = +1 everywhere
        opt.step()
    vals = e(torch.tensor([1, 2]))
    assert torch.all(vals < 0), vals
    assert torch.equal(e.qweight.detach()[[0, 3]], untouched)


def test_mnist_recipe_layers_use_int8_latents_and_flip_signs():
    """Bitorch Engine's MNIST recipe as its users write it: BinaryLinearCuda + prepare_bie_layers +
    DiodeMix(lr=1e-5) trains int8 latent weights by sign flips."""
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(20, 32), nn.PReLU(), nn.BatchNorm1d(32), bie.BinaryLinearCuda(32, 32), nn.PReLU(),
                          nn.BatchNorm1d(32), nn.Linear(32, 3))
    bie.prepare_bie_layers(model)
    assert model[3].weight.dtype == torch.int8
    opt = bie.DiodeMix(model.parameters(), lr=1e-2)
    before = model[3].weight.detach().clone()
    for _ in range(30):
        opt.zero_grad()
        nn.functional.cross_entropy(model(torch.randn(16, 20)), torch.randint(0, 3, (16,))).backward()
        opt.step()
    after = model[3].weight.detach()
    assert after.dtype == torch.int8 and torch.equal(after.abs(), before.abs()) and not torch.equal(after, before)


# --- embeddings' bad input ----------------------------------------------------------------------

def test_embedding_bad_indices():
    e = bie.BinaryEmbeddingCuda(num_embeddings=5, embedding_dim=4)
    with pytest.raises(RuntimeError, match="prepare_params"):
        e(torch.tensor([1]))
    bie.prepare_bie_layers(e)
    with pytest.raises(IndexError, match="outside"):
        e(torch.tensor([5]))
    with pytest.raises(TypeError, match="int32 or int64"):
        e(torch.tensor([1.0]))
    assert e(torch.zeros(0, dtype=torch.long)).shape == (0, 4)
    bag = bie.BinaryEmbeddingBag(num_embeddings=5, embedding_dim=4)
    with pytest.raises(ValueError, match="bags"):
        bag(torch.tensor([1, 2]))


def test_embedding_state_dicts():
    e = bie.BinaryEmbeddingCuda(num_embeddings=6, embedding_dim=9)
    bie.prepare_bie_layers(e)
    buf = io.BytesIO()
    torch.save(e.state_dict(), buf)
    buf.seek(0)
    fresh = bie.BinaryEmbeddingCuda(num_embeddings=6, embedding_dim=9)
    fresh.load_state_dict(torch.load(buf))
    idx = torch.tensor([[0, 5, 2]])
    assert torch.equal(fresh(idx), e(idx))
    with pytest.raises(RuntimeError, match="qweight"):
        bie.BinaryEmbeddingCuda(num_embeddings=6, embedding_dim=17).load_state_dict(e.state_dict())
    bag = bie.BinaryEmbeddingBag(num_embeddings=6, embedding_dim=9)
    w = torch.rand(6, 9) > 0.5  # Bitorch Engine's bool table
    bag.load_state_dict({"weight": w})
    out = bag(torch.tensor([[1]]))
    assert torch.equal(out, torch.where(w[1], 1.0, -1.0)[None])
