# SPDX-License-Identifier: Apache-2.0
"""GPTQ (Frantar et al., "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
Transformers", 2022) for bie.mpq layers, written with torch ops: the Hessian H = 2/n * sum x x^T of a
layer's calibration inputs, then the columns of W (input features) quantised one by one, each
one's rounding error spread over the columns not yet quantised through the Cholesky factor of H^-1,
in blocks of 128 columns (lazy batch updates). act_order quantises the columns by decreasing
diag(H), which becomes the layer's q_perm (its groups are runs of group_size columns in that order,
as GPTQ's g_idx). Group statistics are taken when a group starts, from the error-updated weights,
with the round-to-nearest quantiser (bie.mpq.rtn_params), and rounded to the layer's dtype before
use, so the codes are exactly what the layer dequantises.
"""
import torch
import torch.nn as nn

from .mpq import MPQLinear, ZERO_OFFSET, rtn_params

__all__ = ["HessianCollector", "gptq_quantize_weight", "quantize_model"]


class HessianCollector:
    """Forward hooks on nn.Linear layers that accumulate H = 2/n * sum x x^T over their inputs."""

    def __init__(self, layers):
        self.H, self.n, self.handles = {}, {}, []
        for name, lin in layers.items():
            self.H[name] = torch.zeros(lin.in_features, lin.in_features, dtype=torch.float64)
            self.n[name] = 0
            self.handles.append(lin.register_forward_hook(self._hook(name)))

    def _hook(self, name):
        def hook(mod, inputs, output):
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).to(torch.float64).cpu()
            n = x.shape[0]
            self.H[name] *= self.n[name] / (self.n[name] + n)
            self.n[name] += n
            self.H[name] += (2.0 / self.n[name]) * (x.t() @ x)
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []


def gptq_quantize_weight(weight, H, bits, group_size, sym=False, act_order=False, blocksize=128, percdamp=0.01,
                         stat_dtype=torch.float16):
    """GPTQ of weight [out, in] (nn.Linear's layout) with Hessian H [in, in]. Returns codes [K, N] in
    packed row order, scales [G, N], zeros [G, N] (integer codes, 2^(b-1) when sym) and perm [K]
    (int32, None without act_order)."""
    W = weight.detach().to(torch.float32).clone()
    N, K = W.shape
    H = H.to(torch.float32).clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    perm = None
    if act_order:
        perm = torch.argsort(torch.diag(H), descending=True)
        W, H = W[:, perm], H[perm][:, perm]
    H += percdamp * torch.mean(torch.diag(H)) * torch.eye(K)
    Hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    gs = min(group_size, K)
    G = (K + gs - 1) // gs
    codes = torch.zeros(K, N, dtype=torch.int32)
    scales = torch.zeros(G, N, dtype=stat_dtype)
    zeros = torch.zeros(G, N, dtype=stat_dtype)
    maxq = float((1 << bits) - 1)
    s = z = None
    for i1 in range(0, K, blocksize):
        i2 = min(i1 + blocksize, K)
        W1 = W[:, i1:i2].clone()
        E1 = torch.zeros_like(W1)
        Hi = Hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if col % gs == 0:
                grp = torch.cat([W1[:, i:], W[:, i2:]], 1)[:, :gs] if col + gs > i2 else W1[:, i:i + gs]
                sg, zg = rtn_params(grp.t().contiguous(), bits, gs, sym, stat_dtype=stat_dtype)
                scales[col // gs], zeros[col // gs] = sg[0], zg[0]
                s, z = sg[0].to(torch.float32), zg[0].to(torch.float32)
            w = W1[:, i]
            q = torch.clamp(torch.round(w / s) + z, 0.0, maxq)
            codes[col] = q.to(torch.int32)
            err = (w - s * (q - z)) / Hi[i, i]
            W1[:, i:] -= err[:, None] * Hi[i, i:][None, :]
            E1[:, i] = err
        W[:, i2:] -= E1 @ Hinv[i1:i2, i2:]
    return codes, scales, zeros, (perm.to(torch.int32) if perm is not None else None)


def quantize_model(model, calibrate, w_bit=4, group_size=128, asym=True, act_order=False, skip=(), dtype=None):
    """Replaces every nn.Linear of model (not named in skip) by a GPTQ-quantised MPQLinear.
    calibrate(model) runs the calibration data through the float model (its inputs feed the
    Hessians). Returns {name: layer}."""
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and n not in skip}
    col = HessianCollector(linears)
    with torch.no_grad():
        calibrate(model)
    col.remove()
    out = {}
    for name, lin in linears.items():
        dt = dtype or lin.weight.dtype
        q = MPQLinear(lin.in_features, lin.out_features, 16, w_bit, dt, group_size, use_gba_quant=not asym,
                      disable_bias=lin.bias is None, asym=asym, device=lin.weight.device)
        codes, s, z, perm = gptq_quantize_weight(lin.weight.cpu(), col.H[name], w_bit, group_size, sym=not asym,
                                                 act_order=act_order, stat_dtype=dt)
        if q.zero_mode == ZERO_OFFSET:
            z = (s.to(torch.float32) * z.to(torch.float32)).to(dt)
        q.set_quantized(codes, s, z if q.zero_mode != 0 else None, perm)
        if lin.bias is not None:
            q.bias = nn.Parameter(lin.bias.detach().to(dt).clone())
        parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        setattr(parent, name.rsplit(".", 1)[-1], q)
        out[name] = q
    return out
