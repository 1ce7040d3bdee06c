# SPDX-License-Identifier: Apache-2.0
"""MPQAdam: Bitorch Engine's update of low-bit LLM weights (its DiodeMix branch for
MPQWeightParameter, reference section 9), for bie.mpq layers, with AdamW on every float parameter.

For each MPQLinear's qweight (a parameter without autograd gradient), with g = qweight.privileged_grad
(x'^T grad_y, [K, N] in packed row order, accumulated by the layer's backward):
  w = dequantize(codes, scales, zeros)                        (f32)
  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2
  u = m / (sqrt(v) + eps) * lr * sqrt(1-b2^t) / (1-b1^t)     (Adam's bias-corrected step)
  every `zero_every` steps (5, as Bitorch Engine), the zero point of each group and column moves
  by the mean of u over the group: z += mean(u) / s (CODE) or z += mean(u) (OFFSET), so that W moves
  by -mean(u) with the codes held;
  codes = quantize(w - u) with the scales fixed (clamp(rne(w/s) + z) or clamp(rne((w + z)/s)))
and privileged_grad is cleared. No weight decay on this path, as in Bitorch Engine.
"""
import torch

from .mpq import ZERO_CODE, ZERO_OFFSET, ZERO_SYM, quantize_codes


class MPQAdam(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, zero_every=5):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, zero_every=zero_every))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                layer = getattr(p, "wq", None)
                g = getattr(p, "privileged_grad", None) if layer is not None else p.grad
                if g is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["m"] = torch.zeros(g.shape, dtype=torch.float32, device=g.device)
                    st["v"] = torch.zeros(g.shape, dtype=torch.float32, device=g.device)
                st["step"] += 1
                t = st["step"]
                gf = g.to(torch.float32)
                st["m"].mul_(b1).add_(gf, alpha=1 - b1)
                st["v"].mul_(b2).addcmul_(gf, gf, value=1 - b2)
                size = group["lr"] * (1 - b2 ** t) ** 0.5 / (1 - b1 ** t)
                u = st["m"] / (st["v"].sqrt() + group["eps"]) * size
                if layer is None:
                    if group["weight_decay"]:
                        p.mul_(1 - group["lr"] * group["weight_decay"])
                    p.sub_(u.to(p.dtype))
                    continue
                self._step_layer(layer, u, t % group["zero_every"] == 0)
                p.privileged_grad = None
        return loss

    @staticmethod
    def _step_layer(layer, u, move_zeros):
        w = layer.dequantize()
        K, N = w.shape
        gs = layer.group_size_eff
        G = (K + gs - 1) // gs
        if move_zeros and layer.zero_mode != ZERO_SYM:
            pad = G * gs - K
            ug = torch.nn.functional.pad(u, (0, 0, 0, pad)).view(G, gs, N).sum(1)
            cnt = torch.clamp(K - torch.arange(G, device=u.device) * gs, max=gs).to(torch.float32)[:, None]
            mean = ug / cnt
            z = layer.zeros.to(torch.float32)
            z = z + mean / layer.scales.to(torch.float32) if layer.zero_mode == ZERO_CODE else z + mean
            layer.zeros = z.to(layer.zeros.dtype)
        gb = layer.group_bits.tolist() if layer.mixed else None
        codes = quantize_codes(w - u, layer.scales, layer.zeros, 0 if layer.mixed else layer.w_bit, gs,
                               layer.zero_mode, gb)
        layer.set_quantized(codes, layer.scales)
