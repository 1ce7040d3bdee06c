# SPDX-License-Identifier: Apache-2.0
"""DiodeMix: Bitorch Engine's optimizer (Guo et al., "Diode: Reinventing Binary Neural Networks
Training with Sign Descent Optimization", 2024) for stock PyTorch. Its state has Bitorch Engine's
names for every parameter (step, exp_avg_l, exp_avg_s), so an optimizer checkpoint of Bitorch
Engine's DiodeMix resumes here (and bie's earlier exp_avg / exp_avg_sq names are read too).

- int8 latent binary weights (a parameter of dtype int8 with a float `privileged_grad`, as the
  bie binary layers set up with latent_int8=True): sign descent by sign flips.
      m <- b1*m + (1-b1)*grad;  v = sign(m)*lr;  s <- b2*s + (1-b2)*v;  u = -sign(s) (0 -> +1)
      w <- -w where u != sign(w)        (magnitudes never change; state: m = 0, s = -sign(w)*U(0, 1e-3))
  The gradient buffer is averaged over the ranks of an initialised torch.distributed group (the
  buffer is not a .grad, so DistributedDataParallel does not reduce it) and zeroed after the step.
- packed binary embedding tables (bie.BinaryEmbeddingCuda / BinaryEmbeddingBag: uint8 bits with
  the sparse gradient rows of the last backward in `sparse_grads`): Bitorch Engine's embedding rule
  on the rows read only: s[rows] <- b2*s[rows] + (1-b2)*sign(grad)*lr (sign(0) = +1), and the rows'
  bits become u = -sign(s) (0 -> +1) (s: [V, D], initialised -sign(w)*U(0, 1e-3)).
- every other parameter (float weights, scales, biases): AdamW (bias-corrected; decoupled weight
  decay applied after the step), exp_avg_l and exp_avg_s being its two moments. A sparse gradient
  (an n-bit embedding with sparse=True) is made dense first.
- GaLore (a param group with `rank`, and update_proj_gap (default 200), scale (1.0) and proj_type
  ("std", "reverse_std", "left", "right", "full")): the AdamW moments of the group's 2-D float
  parameters live in the projected space: g' = project(grad) (the projection refreshed from an SVD
  of the gradient every update_proj_gap steps), the update is scale * project_back(m/(sqrt(v)+eps)).
  A GaLore group holding anything else (1-D or binary parameters) is refused.
"""
import math

import torch
from torch.optim import Optimizer

__all__ = ["DiodeMix"]

_GALORE_KEYS = ("rank", "update_proj_gap", "scale", "proj_type")
_PROJ_TYPES = ("std", "reverse_std", "left", "right", "full")


def _sign(t):
    return torch.where(t >= 0, 1.0, -1.0).to(t.dtype)


def _step_count(state):
    """Increments and returns the step (a float tensor [1] as Bitorch Engine keeps it, or an int)."""
    st = state["step"]
    if isinstance(st, torch.Tensor):
        st.add_(1)
        return int(st.item())
    state["step"] = st + 1
    return state["step"]


class DiodeMix(Optimizer):
    def __init__(self, params, lr=1e-4, betas=(0.99, 0.9999), eps=1e-6, weight_decay=0.0, correct_bias=True,
                 dtype=torch.float32):
        if not lr >= 0:
            raise ValueError(f"Invalid learning rate: {lr} - should be >= 0.0")
        if len(betas) != 2 or not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"Invalid betas: {betas} - each should be in [0.0, 1.0)")
        if not eps >= 0:
            raise ValueError(f"Invalid epsilon value: {eps} - should be >= 0.0")
        if not weight_decay >= 0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay} - should be >= 0.0")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"bie: dtype must be a floating-point torch.dtype, got {dtype!r}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, correct_bias=correct_bias)
        self.state_dtype = dtype
        self.dtype = dtype  # Bitorch Engine's attribute name
        super().__init__(params, defaults)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        self._check_galore(self.param_groups[-1])

    @staticmethod
    def _check_galore(group):
        keys = [k for k in _GALORE_KEYS if k in group]
        if not keys:
            return
        if "rank" not in group:
            raise ValueError(f"bie: DiodeMix: GaLore keys {keys} without `rank` (the projection's rank)")
        rank = group["rank"]
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"bie: DiodeMix: GaLore rank must be an int >= 1, got {rank!r}")
        group.setdefault("update_proj_gap", 200)
        group.setdefault("scale", 1.0)
        group.setdefault("proj_type", "std")
        gap = group["update_proj_gap"]
        if isinstance(gap, bool) or not isinstance(gap, int) or gap < 1:
            raise ValueError(f"bie: DiodeMix: update_proj_gap must be an int >= 1, got {gap!r}")
        if group["proj_type"] not in _PROJ_TYPES:
            raise ValueError(f"bie: DiodeMix: proj_type must be one of {_PROJ_TYPES}, got {group['proj_type']!r}")
        for p in group["params"]:
            if not p.dtype.is_floating_point or p.dim() != 2:
                raise ValueError(f"bie: DiodeMix: GaLore projects 2-D float parameters; a {p.dtype} parameter of "
                                 f"shape {tuple(p.shape)} is in the GaLore group (put it in a group without rank)")

    @staticmethod
    def _is_latent(p):
        return p.dtype == torch.int8 and getattr(p, "privileged_grad", None) is not None

    @staticmethod
    def _is_table(p):
        return p.dtype == torch.uint8 and hasattr(p, "sparse_grads")

    def zero_grad(self, set_to_none=True):
        super().zero_grad(set_to_none=set_to_none)
        for group in self.param_groups:
            for p in group["params"]:
                if self._is_latent(p):
                    p.privileged_grad.zero_()
                elif self._is_table(p):
                    p.sparse_grads.clear()

    @torch.no_grad()
    def step(self, closure=None):
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
                elif self._is_table(p):
                    if p.sparse_grads:
                        self._table_step(p, lr, b2)
                elif p.grad is not None:
                    self._adamw_step(p, group, lr, b1, b2)
        return loss

    def _state(self, p):
        """p's state, with bie's earlier moment names renamed to Bitorch Engine's."""
        state = self.state[p]
        for old, new in (("exp_avg", "exp_avg_l"), ("exp_avg_sq", "exp_avg_s")):
            if old in state and new not in state:
                state[new] = state.pop(old)
        return state

    def _binary_step(self, p, lr, b1, b2):
        grad = p.privileged_grad
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(grad)
            grad.div_(dist.get_world_size())
        state = self._state(p)
        if "exp_avg_s" not in state:
            state["step"] = torch.zeros(1)
            state["exp_avg_l"] = torch.zeros(p.shape, dtype=self.state_dtype, device=p.device)
            u = torch.rand(p.shape, dtype=self.state_dtype, device=p.device) * 1e-3
            state["exp_avg_s"] = -_sign(p.to(self.state_dtype)) * u
        state.setdefault("step", torch.zeros(1))
        _step_count(state)
        m, s = state["exp_avg_l"], state["exp_avg_s"]
        m.mul_(b1).add_(grad.to(m.dtype), alpha=1 - b1)
        s.mul_(b2).add_(torch.sign(m) * lr, alpha=1 - b2)
        u = -_sign(s)
        flip = u != _sign(p.to(self.state_dtype))
        p.copy_(torch.where(flip, -p, p))
        grad.zero_()

    def _table_step(self, p, lr, b2):
        from . import functional as F
        from .functional import QUANT_BINARY
        dim = getattr(p, "embedding_dim", None) or p.shape[1] * 8
        rows = torch.cat([r for r, _ in p.sparse_grads])
        grads = torch.cat([g for _, g in p.sparse_grads]).to(self.state_dtype)
        p.sparse_grads.clear()
        rows, inv = torch.unique(rows, return_inverse=True)
        g = torch.zeros((rows.numel(), grads.shape[1]), dtype=grads.dtype, device=grads.device)
        g.index_add_(0, inv, grads)
        state = self._state(p)
        if "exp_avg_s" not in state:
            w = F.unpack_weight(QUANT_BINARY, p.detach(), (p.shape[0], dim), dtype=self.state_dtype)
            state["step"] = torch.zeros(1)
            state["exp_avg_s"] = -_sign(w) * torch.rand(w.shape, dtype=self.state_dtype, device=w.device) * 1e-3
        _step_count(state)
        s = state["exp_avg_s"]
        sr = s[rows].mul_(b2).add_(_sign(g[:, :s.shape[1]]) * lr, alpha=1 - b2)
        s[rows] = sr
        p[rows] = F.pack_weight(QUANT_BINARY, -_sign(sr))

    def _adamw_step(self, p, group, lr, b1, b2):
        grad = p.grad
        if grad.is_sparse:
            grad = grad.coalesce().to_dense()
        state = self._state(p)
        galore = "rank" in group
        if galore:
            grad = self._project(state, group, grad)
        if "exp_avg_s" not in state:
            state["step"] = torch.zeros(1)
            state["exp_avg_l"] = torch.zeros_like(grad, memory_format=torch.preserve_format)
            state["exp_avg_s"] = torch.zeros_like(grad, memory_format=torch.preserve_format)
        step = _step_count(state)
        m, v = state["exp_avg_l"], state["exp_avg_s"]
        m.mul_(b1).add_(grad, alpha=1 - b1)
        v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        step_size = lr
        if group["correct_bias"]:
            step_size = lr * math.sqrt(1 - b2 ** step) / (1 - b1 ** step)
        norm = m / v.sqrt().add_(group["eps"])
        if galore:
            norm = self._project_back(state, group, norm)
        p.add_(norm.to(p.dtype), alpha=-step_size)
        if group["weight_decay"] > 0:
            p.add_(p, alpha=-lr * group["weight_decay"])

    # --- GaLore --------------------------------------------------------------------------------

    @staticmethod
    def _project(state, group, grad):
        """The low-rank gradient; the projection is refreshed from an SVD of the gradient at the
        first step and every update_proj_gap steps."""
        st = state.get("step", 0)
        it = int(st.item()) if isinstance(st, torch.Tensor) else int(st)
        rows, cols = grad.shape
        kind = group["proj_type"]
        if kind == "std":
            side = "right" if rows >= cols else "left"
        elif kind == "reverse_std":
            side = "left" if rows >= cols else "right"
        else:
            side = kind
        if "galore_u" not in state or it % group["update_proj_gap"] == 0:
            U, _, Vh = torch.linalg.svd(grad.detach().to(torch.float32), full_matrices=False)
            r = group["rank"]
            state["galore_side"] = side
            state["galore_u"] = U[:, :r].to(grad.dtype)
            state["galore_vh"] = Vh[:r].to(grad.dtype)
        side, u, vh = state["galore_side"], state["galore_u"], state["galore_vh"]
        if side == "right":
            return grad @ vh.t()
        if side == "left":
            return u.t() @ grad
        return u.t() @ grad @ vh.t()

    @staticmethod
    def _project_back(state, group, low):
        side, u, vh = state["galore_side"], state["galore_u"], state["galore_vh"]
        if side == "right":
            full = low @ vh
        elif side == "left":
            full = u @ low
        else:
            full = u @ low @ vh
        return full * group["scale"]
