# SPDX-License-Identifier: Apache-2.0
"""bie.mpq.MPQLinear (4-bit g128 GPTQ form; 2-bit at M <= 16) against PyTorch's dense layer on the
same shapes, in the same process: LLaMA-7B/70B layer shapes (in x out = 4096x4096, 4096x11008,
11008x4096, 8192x28672) and M = 1, 4, 16, 256, 4096 rows. On CUDA the baseline is F.linear in fp16
(cuBLAS) and activations are fp16; on the CPU it is F.linear in float32 (PyTorch's BLAS). Each row
gives the medians, the ratio, bie's achieved weight bandwidth and its ratio to the memory bandwidth
measured in the same run (a copy of a 1 GiB (GPU) or 512 MiB (CPU) tensor, read + write bytes).
A timing is --calls consecutive calls (20 on CUDA, 1 on the CPU) between two synchronisations,
divided by the calls: the host queues calls ahead of the GPU as a model's forward does, so a row
shows the larger of the host's and the GPU's time a call. One layer is called repeatedly, so
weights that fit in the caches (the GPU's 50 MB L2 holds a 4-bit 4096x4096 weight) run from there;
`bie bench --llm` rotates weight copies and is the reference for the kernels.

    BIE_LIBRARY=build/libbie.so PYTHONPATH=python python3 python/bench_llm.py [--device cuda] [--rows 1,16]
"""
import argparse
import time

import torch
import torch.nn.functional as F

from bie import mpq

SHAPES = [(4096, 4096), (4096, 11008), (11008, 4096), (8192, 28672)]


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def median_ms(fn, dev, reps, calls=1):
    """Median over reps of the time of `calls` consecutive calls, per call."""
    fn()
    sync(dev)
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync(dev)
        t.append((time.perf_counter() - t0) / calls)
    return sorted(t)[len(t) // 2] * 1e3


def copy_gbs(dev):
    n = (1 << 30) if dev.type == "cuda" else (512 << 20)
    a = torch.empty(n, dtype=torch.uint8, device=dev).fill_(1)
    b = torch.empty_like(a)
    ms = median_ms(lambda: b.copy_(a), dev, 7)
    return 2 * n / (ms * 1e6)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rows", default="1,4,16,256,4096")
    ap.add_argument("--shapes", default=None, help="e.g. 4096x4096,8192x28672")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--calls", type=int, default=None, help="calls a timing (20 on CUDA, 1 on the CPU)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    calls = args.calls or (20 if dev.type == "cuda" else 1)
    shapes = SHAPES if not args.shapes else [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    adt = torch.float16 if dev.type == "cuda" else torch.float32
    bw = copy_gbs(dev)
    print(f"device {dev} ({torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}), copy bandwidth "
          f"{bw:.1f} GB/s (read + write), threads {torch.get_num_threads()}, {calls} calls a timing")
    print(f"{'case':<30} {'bie ms':>9} {'torch ms':>9} {'speedup':>8} {'GB/s':>8} {'of copy':>8}")
    for K, N in shapes:
        w = torch.randn(N, K, device=dev, dtype=adt) * 0.02
        for bits in (4, 2):
            layer = mpq.MPQLinear(K, N, w_bit=bits, group_size=128, dtype=torch.float16, use_gba_quant=False,
                                  device=dev)
            layer.quantize_from(w)
            layer.eval()
            wbytes = layer.qweight.numel() * 4 + (layer.scales.numel() + layer.zeros.numel()) * 2
            for M in [int(m) for m in args.rows.split(",")]:
                if bits == 2 and M > 16:
                    continue
                if dev.type == "cpu" and M >= 4096 and K * N > 4096 * 11008:
                    continue  # minutes per row on a small CPU
                x = torch.randn(M, K, device=dev, dtype=adt)
                with torch.no_grad():
                    t_bie = median_ms(lambda: layer(x), dev, args.reps, calls)
                    t_ref = median_ms(lambda: F.linear(x, w), dev, args.reps, calls)
                gbs = wbytes / (t_bie * 1e6)
                print(f"{f'wq{bits}-g128 {K}x{N} M={M}':<30} {t_bie:>9.3f} {t_ref:>9.3f} {t_ref / t_bie:>7.2f}x "
                      f"{gbs:>8.1f} {100 * gbs / bw:>7.0f}%")


if __name__ == "__main__":
    main()
