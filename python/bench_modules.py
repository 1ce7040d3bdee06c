#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""bie's modules against nn.Linear / nn.Conv2d, measured in the same run: fp16 on a CUDA device,
float32 on the CPU. For every shape it times the inference forward (bie: eval mode, packed
weights) and one training step (forward + backward, float latent weights) of each bie layer and of
the float layer, and prints a table with the ratio float time / bie time (> 1: bie is faster).
BinaryLinear's step is also timed the other way of keeping its input for the backward ("step,
bits": binarize_ste's bits, "step, x": the input itself; bie.autograd.SAVED_BITS_MIN picks).

Usage: python3 python/bench_modules.py [--device cpu|cuda] [--quick] [--budget SECONDS]
"""
import argparse
import time

import torch
import torch.nn as nn

import bie


def timer(device):
    if device.type == "cuda":
        def run(fn, budget):
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            n, total = 0, 0.0
            while total < budget * 1000 and n < 200:
                start.record()
                fn()
                end.record()
                end.synchronize()
                total += start.elapsed_time(end)
                n += 1
            return total / n
    else:
        def run(fn, budget):
            fn()
            n, t0 = 0, time.perf_counter()
            while True:
                fn()
                n += 1
                el = time.perf_counter() - t0
                if el > budget or n >= 200:
                    return el * 1000 / n
    return run


def bench_pair(make_float, make_bie, x, device, budget, run):
    rows = []
    fl = make_float()
    layers = {k: f() for k, f in make_bie.items()}
    for m in layers.values():
        bie.prepare_bie_layers(m)
    # inference forward
    with torch.no_grad():
        fl.eval()
        t_float = run(lambda: fl(x), budget)
        for name, m in layers.items():
            m.eval()
            m(x)  # packs the weight
            rows.append((name, "forward", t_float, run(lambda: m(x), budget)))
    # training step
    xg = x.detach().clone().requires_grad_()

    def step(m):
        def f():
            m.zero_grad(set_to_none=True)
            xg.grad = None
            m(xg).float().sum().backward()
        return f

    fl.train()
    t_float = run(step(fl), budget)
    for name, m in layers.items():
        m.train()
        rows.append((name, "train step", t_float, run(step(m), budget)))
        if isinstance(m, bie.BinaryLinear):  # the other way of keeping x for the backward
            default = bie.autograd.SAVED_BITS_MIN
            bits = x.numel() < default
            bie.autograd.SAVED_BITS_MIN = 0 if bits else 1 << 62
            try:
                rows.append((name, "step, bits" if bits else "step, x", t_float, run(step(m), budget)))
            finally:
                bie.autograd.SAVED_BITS_MIN = default
    return rows


def setup(doc):
    """The options every benchmark script takes: (args, device name, device, dtype, budget, run)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None)
    ap.add_argument("--quick", action="store_true", help="small shapes, short timings")
    ap.add_argument("--budget", type=float, default=None, help="seconds of timing per measurement")
    args = ap.parse_args()
    dev = args.device or ("cuda" if torch.cuda.is_available() and bie.cuda_available() else "cpu")
    device = torch.device(dev)
    dtype = torch.float16 if dev == "cuda" else torch.float32
    torch.manual_seed(0)
    return args, dev, device, dtype, args.budget or (0.2 if args.quick else 0.5), timer(device)


def main():
    args, dev, device, dtype, budget, run = setup(__doc__)
    if dev == "cuda":
        linear = [(4096, 4096, 4096), (8192, 8192, 8192)] if not args.quick else [(2048, 2048, 2048)]
        conv = [(64, 256, 28, 256, 3), (32, 512, 14, 512, 3)] if not args.quick else [(16, 128, 28, 128, 3)]
    else:
        linear = [(256, 1024, 1024), (64, 4096, 4096)] if not args.quick else [(64, 512, 512)]
        conv = [(8, 64, 28, 64, 3), (4, 128, 14, 128, 3)] if not args.quick else [(2, 32, 14, 32, 3)]
    fk = dict(device=device, dtype=dtype)
    print(f"# bie {bie.version()} ({bie.library_path()}), torch {torch.__version__}, device "
          f"{torch.cuda.get_device_name(device) if dev == 'cuda' else 'cpu'} ({torch.get_num_threads()} threads), "
          f"{str(dtype).replace('torch.', '')}")
    print(f"{'layer':<14} {'shape':<32} {'mode':<11} {'float ms':>10} {'bie ms':>10} {'float/bie':>10}")
    for m, k, n in linear:
        x = torch.randn(m, k, **fk)
        rows = bench_pair(lambda: nn.Linear(k, n, bias=False, **fk),
                          {"BinaryLinear": lambda: bie.BinaryLinear(k, n, **fk),
                           "Q4Linear": lambda: bie.Q4Linear(k, n, **fk),
                           "Q8Linear": lambda: bie.Q8Linear(k, n, **fk)}, x, device, budget, run)
        for name, mode, tf, tb in rows:
            print(f"{name:<14} {f'M={m} K={k} N={n}':<32} {mode:<11} {tf:>10.3f} {tb:>10.3f} {tf / tb:>10.2f}")
    for nb, c, hw, o, ks in conv:
        x = torch.randn(nb, c, hw, hw, **fk)
        rows = bench_pair(lambda: nn.Conv2d(c, o, ks, padding=1, bias=False, **fk),
                          {"BinaryConv2d": lambda: bie.BinaryConv2d(c, o, ks, 1, 1, **fk),
                           "Q4Conv2d": lambda: bie.Q4Conv2d(c, o, ks, 1, 1, **fk),
                           "Q8Conv2d": lambda: bie.Q8Conv2d(c, o, ks, 1, 1, **fk)}, x, device, budget, run)
        for name, mode, tf, tb in rows:
            shape = f"N={nb} C={c} {hw}x{hw} O={o} k{ks}"
            print(f"{name:<14} {shape:<32} {mode:<11} {tf:>10.3f} {tb:>10.3f} {tf / tb:>10.2f}")


if __name__ == "__main__":
    main()
