#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""bie's matmul, attention and embedding modules against the float op a user would otherwise call,
measured in the same run: fp16 on a CUDA device, float32 on the CPU.

  BinaryMatMul / Q4MatMul / Q8MatMul   vs torch.matmul(x, y.transpose(-1, -2))
  BMHA (binary score, 8-bit context)   vs nn.MultiheadAttention (batch_first, same width and heads)
  BinaryEmbeddingCuda / Q4 / Q8        vs nn.Embedding (forward: the lookup; step: lookup + backward)

Each row: the float op's time, bie's, and float / bie (> 1: bie is faster), for the forward (bie in
eval mode) and one training step (forward + backward). The embedding rows add the lookup's output
bandwidth (GB/s written).

Usage: python3 python/bench_compat.py [--device cpu|cuda] [--quick] [--budget SECONDS]
"""
import torch
import torch.nn as nn

import bie
from bench_modules import setup


def pair_rows(name, shape, float_fwd, bie_fwd, float_step, bie_step, budget, run, out_bytes=None):
    rows = []
    with torch.no_grad():
        tf, tb = run(float_fwd, budget), run(bie_fwd, budget)
    extra = f"{out_bytes / (tb * 1e-3) / 1e9:9.1f} GB/s" if out_bytes else ""
    rows.append((name, shape, "forward", tf, tb, extra))
    tf, tb = run(float_step, budget), run(bie_step, budget)
    rows.append((name, shape, "train step", tf, tb, ""))
    for r in rows:
        print(f"{r[0]:<20} {r[1]:<30} {r[2]:<11} {r[3]:>10.3f} {r[4]:>10.3f} {r[3] / r[4]:>10.2f} {r[5]}", flush=True)


def step_fn(fn, params):
    def f():
        for p in params:
            p.grad = None
        out = fn()
        (out[0] if isinstance(out, tuple) else out).float().sum().backward()
    return f


def bench_matmul(shapes, fk, budget, run):
    for b, m, n, k in shapes:
        x = torch.randn(b, m, k, **fk).requires_grad_()
        y = torch.randn(b, n, k, **fk).requires_grad_()
        for cls in (bie.BinaryMatMul, bie.Q4MatMul, bie.Q8MatMul):
            mod = cls(dtype=fk["dtype"], device=fk["device"])
            mod(x.detach(), y.detach())  # sets the clips
            mod.eval()
            fwd_f = lambda: torch.matmul(x, y.transpose(-1, -2))  # noqa: E731
            fwd_b = lambda: mod(x, y)  # noqa: E731
            mod_t = cls(dtype=fk["dtype"], device=fk["device"])
            mod_t(x.detach(), y.detach())
            pair_rows(cls.__name__, f"B={b} M={m} N={n} K={k}", fwd_f, fwd_b,
                      step_fn(fwd_f, [x, y]), step_fn(lambda: mod_t(x, y), [x, y] + list(mod_t.parameters())),
                      budget, run)


def bench_attention(shapes, fk, budget, run):
    for bs, t, d, heads in shapes:
        h = torch.randn(bs, t, d, **fk)
        ref = nn.MultiheadAttention(d, heads, batch_first=True, **fk)
        att = bie.BMHA(d, d, heads, dtype=fk["dtype"], dropout=0.0).to(fk["device"])
        bie.prepare_bie_layers(att)
        att(h)  # sets the lazy scales
        hg = h.detach().clone().requires_grad_()
        ref.eval()
        att.eval()
        with torch.no_grad():
            tf = run(lambda: ref(h, h, h, need_weights=False), budget)
            tb = run(lambda: att(h), budget)
        ref.train()
        att.train()
        sf = run(step_fn(lambda: ref(hg, hg, hg, need_weights=False), [hg] + list(ref.parameters())), budget)
        sb = run(step_fn(lambda: att(hg), [hg] + list(att.parameters())), budget)
        shape = f"batch={bs} T={t} dim={d} heads={heads}"
        print(f"{'BMHA':<20} {shape:<30} {'forward':<11} {tf:>10.3f} {tb:>10.3f} {tf / tb:>10.2f}")
        print(f"{'BMHA':<20} {shape:<30} {'train step':<11} {sf:>10.3f} {sb:>10.3f} {sf / sb:>10.2f}", flush=True)


def bench_embedding(shapes, fk, budget, run):
    for v, d, n in shapes:
        idx = torch.randint(0, v, (n,), device=fk["device"])
        ref = nn.Embedding(v, d, **fk)
        for cls in (bie.BinaryEmbeddingCuda, bie.Q4Embedding, bie.Q8Embedding):
            if cls is bie.BinaryEmbeddingCuda:
                emb = cls(num_embeddings=v, embedding_dim=d, dtype=fk["dtype"], device=fk["device"])
            else:
                emb = cls(v, d, dtype=fk["dtype"], device=fk["device"])
            bie.prepare_bie_layers(emb)
            emb.eval()
            emb(idx)  # packs an n-bit table
            ref.eval()
            with torch.no_grad():
                tf, tb = run(lambda: ref(idx), budget), run(lambda: emb(idx), budget)
            emb.train()
            ref.train()
            sf = run(step_fn(lambda: ref(idx), list(ref.parameters())), budget)
            sb = run(step_fn(lambda: emb(idx), [p for p in emb.parameters() if p.dtype.is_floating_point]), budget)
            shape = f"V={v} D={d} lookups={n}"
            gbs = n * d * torch.empty((), dtype=fk["dtype"]).element_size() / (tb * 1e-3) / 1e9
            print(f"{cls.__name__:<20} {shape:<30} {'forward':<11} {tf:>10.3f} {tb:>10.3f} {tf / tb:>10.2f} "
                  f"{gbs:7.1f} GB/s written")
            print(f"{cls.__name__:<20} {shape:<30} {'train step':<11} {sf:>10.3f} {sb:>10.3f} {sf / sb:>10.2f}",
                  flush=True)
            if hasattr(emb.qweight, "sparse_grads"):
                emb.qweight.sparse_grads.clear()


def main():
    args, dev, device, dtype, budget, run = setup(__doc__)
    fk = dict(device=device, dtype=dtype)
    if dev == "cuda":
        mm = [(8, 4096, 4096, 4096), (384, 128, 128, 64)] if not args.quick else [(4, 1024, 1024, 1024)]
        att = [(32, 128, 768, 12)] if not args.quick else [(8, 64, 256, 4)]
        emb = [(50257, 1024, 65536)] if not args.quick else [(10000, 512, 8192)]
    else:
        mm = [(8, 512, 512, 512), (48, 128, 128, 64)] if not args.quick else [(4, 128, 128, 128)]
        att = [(4, 128, 256, 4)] if not args.quick else [(2, 32, 64, 4)]
        emb = [(30000, 256, 8192)] if not args.quick else [(1000, 64, 1024)]
    print(f"# bie {bie.version()} ({bie.library_path()}), torch {torch.__version__}, device "
          f"{torch.cuda.get_device_name(device) if dev == 'cuda' else 'cpu'} ({torch.get_num_threads()} threads), "
          f"{str(dtype).replace('torch.', '')}")
    print(f"{'module':<20} {'shape':<30} {'mode':<11} {'float ms':>10} {'bie ms':>10} {'float/bie':>10}")
    bench_matmul(mm, fk, budget, run)
    bench_attention(att, fk, budget, run)
    bench_embedding(emb, fk, budget, run)


if __name__ == "__main__":
    main()
