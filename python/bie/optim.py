# SPDX-License-Identifier: Apache-2.0
"""DiodeMix: Bitorch Engine's optimizer (Guo et al., "Diode: Reinventing Binary Neural Networks
Training with Sign Descent Optimization", 2024) for stock PyTorch.

- int8 latent binary weights (a parameter of dtype int8 with a float `privileged_grad`, as the
  bie binary layers set up with latent_int8=True): sign descent by sign flips.
      m <- b1*m + (1-b1)*grad;  v = sign(m)*lr;  s <- b2*s + (1-b2)*v;  u = -sign(s) (0 -> +1)
      w <- -w where u != sign(w)        (magnitudes never change; state: m = 0, s = -sign(w)*U(0, 1e-3))
  The gradient buffer is averaged over the ranks of an initialised torch.distributed group (the
  buffer is not a .grad, so DistributedDataParallel does not reduce it) and zeroed after the step.
- every other parameter (float weights, scales, biases): AdamW (bias-corrected; decoupled weight
  decay applied after the step).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Optional, Tuple

import torch
from torch.optim import Optimizer

__all__ = ["DiodeMix"]


def _sign(t):
    return torch.where(t >= 0, 1.0, -1.0).to(t.dtype)


class DiodeMix(Optimizer):
    def __init__(self, params: Iterable[Any], lr: float = 1e-4, betas: Tuple[float, float] = (0.99, 0.9999),
                 eps: float = 1e-6, weight_decay: float = 0.0, correct_bias: bool = True,
                 dtype: torch.dtype = torch.float32) -> None:
        if lr < 0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"Invalid betas: {betas}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, correct_bias=correct_bias)
        self.state_dtype = dtype
        super().__init__(params, defaults)

    @staticmethod
    def _is_latent(p):
        return p.dtype == torch.int8 and getattr(p, "privileged_grad", None) is not None

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none=set_to_none)
        for group in self.param_groups:
            for p in group["params"]:
                if self._is_latent(p):
                    p.privileged_grad.zero_()

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            b1, b2 = group["betas"]
            lr = group["lr"]
            for p in group["params"]:
                if self._is_latent(p):
                    self._binary_step(p, lr, b1, b2)
                elif p.grad is not None:
                    self._adamw_step(p, group, lr, b1, b2)
        return loss

    def _binary_step(self, p, lr, b1, b2):
        grad = p.privileged_grad
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(grad)
            grad.div_(dist.get_world_size())
        state = self.state[p]
        if not state:
            state["step"] = 0
            state["exp_avg_l"] = torch.zeros(p.shape, dtype=self.state_dtype, device=p.device)
            u = torch.rand(p.shape, dtype=self.state_dtype, device=p.device) * 1e-3
            state["exp_avg_s"] = -_sign(p.to(self.state_dtype)) * u
        state["step"] += 1
        m, s = state["exp_avg_l"], state["exp_avg_s"]
        m.mul_(b1).add_(grad.to(m.dtype), alpha=1 - b1)
        s.mul_(b2).add_(torch.sign(m) * lr, alpha=1 - b2)
        u = -_sign(s)
        flip = u != _sign(p.to(self.state_dtype))
        p.copy_(torch.where(flip, -p, p))
        grad.zero_()

    def _adamw_step(self, p, group, lr, b1, b2):
        grad = p.grad
        state = self.state[p]
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["step"] += 1
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.mul_(b1).add_(grad, alpha=1 - b1)
        v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        step_size = lr
        if group["correct_bias"]:
            step_size = lr * math.sqrt(1 - b2 ** state["step"]) / (1 - b1 ** state["step"])
        p.addcdiv_(m, v.sqrt().add_(group["eps"]), value=-step_size)
        if group["weight_decay"] > 0:
            p.add_(p, alpha=-lr * group["weight_decay"])
