#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""bie's modules against nn.Linear / nn.Conv2d, measured in the same run: fp16 on a CUDA device,
float32 on the CPU. For every shape it times the inference forward (bie: eval mode, packed
weights) and one training step (forward + backward, float latent weights) of each bie layer and of
the float layer, and prints a table with the ratio float time / bie time (> 1: bie is faster).
A single call is timed on its own (its host time counts); on a CUDA device the forward and the step
are also timed queued ("forward, queued", "step, queued"): calls issued back to back and timed
together, as a network's layers run, so that a call's host time overlaps the GPU work before it.
BinaryLinear's step is also timed the other way of keeping its input for the backward ("step,
bits": binarize_ste's bits, "step, x": the input itself; bie.autograd.SAVED_BITS_MIN picks).
--json prints one JSON object per row instead of the table (the keys layer, shape, mode, bie_ms,
baseline, baseline_ms, speedup = baseline_ms / bie_ms, and the run's device, threads, dtype,
torch, bie_version and date), the input of scripts/perf-report.py.

Usage: python3 python/bench_modules.py [--device cpu|cuda] [--quick] [--budget SECONDS] [--json]
"""
import argparse
import datetime
import json
import platform
import time

import torch
import torch.nn as nn

import bie
import bench_networks  # (the ResNet block of the host-time row)


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


def queued_ms(fn, budget, runs=5):
    """Median milliseconds per call of fn() on a CUDA device over `runs` runs of n calls issued back to
    back between two events (n: as many as fit the budget, 10 to 100)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    n = int(max(10, min(100, budget * 1000 / runs / max(start.elapsed_time(end), 1e-3))))
    times = []
    for _ in range(runs):
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / n)
    times.sort()
    return times[len(times) // 2]


def bench_pair(make_float, make_bie, x, device, budget, run):
    rows = []
    fl = make_float()
    layers = {k: f() for k, f in make_bie.items()}
    for m in layers.values():
        bie.prepare_bie_layers(m)
    cuda = device.type == "cuda"
    # inference forward
    with torch.no_grad():
        fl.eval()
        t_float = run(lambda: fl(x), budget)
        q_float = queued_ms(lambda: fl(x), budget) if cuda else None
        for name, m in layers.items():
            m.eval()
            m(x)  # packs the weight
            rows.append((name, "forward", t_float, run(lambda: m(x), budget)))
            if cuda:
                rows.append((name, "forward, queued", q_float, queued_ms(lambda: m(x), budget)))
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
    q_float = queued_ms(step(fl), budget) if cuda else None
    for name, m in layers.items():
        m.train()
        rows.append((name, "train step", t_float, run(step(m), budget)))
        if cuda:
            rows.append((name, "step, queued", q_float, queued_ms(step(m), budget)))
        if isinstance(m, bie.BinaryLinear):  # the other way of keeping x for the backward
            default = bie.autograd.SAVED_BITS_MIN
            bits = x.numel() < default
            bie.autograd.SAVED_BITS_MIN = 0 if bits else 1 << 62
            try:
                rows.append((name, "step, bits" if bits else "step, x", t_float, run(step(m), budget)))
            finally:
                bie.autograd.SAVED_BITS_MIN = default
    return rows


def cpu_name():
    """The CPU's model name as /proc/cpuinfo gives it (else what the platform module knows)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and ":" in line:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def setup(doc, json_rows=False):
    """The options of the benchmark scripts: (args, device name, device, dtype, budget, run)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None)
    ap.add_argument("--quick", action="store_true", help="small shapes, short timings")
    ap.add_argument("--budget", type=float, default=None, help="seconds of timing per measurement")
    if json_rows:
        ap.add_argument("--json", action="store_true", help="one JSON object per row instead of the table")
    args = ap.parse_args()
    dev = args.device or ("cuda" if torch.cuda.is_available() and bie.cuda_available() else "cpu")
    device = torch.device(dev)
    dtype = torch.float16 if dev == "cuda" else torch.float32
    torch.manual_seed(0)
    return args, dev, device, dtype, args.budget or (0.2 if args.quick else 0.5), timer(device)


def main():
    args, dev, device, dtype, budget, run = setup(__doc__, json_rows=True)
    if dev == "cuda":
        linear = [(4096, 4096, 4096), (8192, 8192, 8192)] if not args.quick else [(2048, 2048, 2048)]
        conv = [(64, 256, 28, 256, 3), (32, 512, 14, 512, 3)] if not args.quick else [(16, 128, 28, 128, 3)]
    else:
        linear = [(256, 1024, 1024), (64, 4096, 4096)] if not args.quick else [(64, 512, 512)]
        conv = [(8, 64, 28, 64, 3), (4, 128, 14, 128, 3)] if not args.quick else [(2, 32, 14, 32, 3)]
    fk = dict(device=device, dtype=dtype)
    dname = torch.cuda.get_device_name(device) if dev == "cuda" else cpu_name()
    dtname = str(dtype).replace("torch.", "")
    run_info = {"device": dname, "threads": torch.get_num_threads(), "dtype": dtname, "torch": torch.__version__,
                "bie_version": bie.version(), "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")}

    def emit(name, shape, mode, tf, tb, baseline):
        if args.json:
            row = {"layer": name, "shape": shape, "mode": mode, "bie_ms": round(tb, 4), "baseline": baseline,
                   "baseline_ms": round(tf, 4), "speedup": round(tf / tb, 4)}
            row.update(run_info)
            print(json.dumps(row), flush=True)
        else:
            print(f"{name:<14} {shape:<32} {mode:<11} {tf:>10.3f} {tb:>10.3f} {tf / tb:>10.2f}", flush=True)

    if not args.json:
        print(f"# bie {bie.version()} ({bie.library_path()}), torch {torch.__version__}, device "
              f"{dname} ({torch.get_num_threads()} threads), {dtname}")
        print(f"{'layer':<14} {'shape':<32} {'mode':<11} {'float ms':>10} {'bie ms':>10} {'float/bie':>10}")
    for m, k, n in linear:
        x = torch.randn(m, k, **fk)
        rows = bench_pair(lambda: nn.Linear(k, n, bias=False, **fk),
                          {"BinaryLinear": lambda: bie.BinaryLinear(k, n, **fk),
                           "Q4Linear": lambda: bie.Q4Linear(k, n, **fk),
                           "Q8Linear": lambda: bie.Q8Linear(k, n, **fk)}, x, device, budget, run)
        for name, mode, tf, tb in rows:
            emit(name, f"M={m} K={k} N={n}", mode, tf, tb, f"nn.Linear {dtname}")
    # convolutions on a GPU in channels-last memory on both sides (what fp16 networks use there)
    fmt = torch.channels_last if dev == "cuda" else torch.contiguous_format
    for nb, c, hw, o, ks in conv:
        x = torch.randn(nb, c, hw, hw, **fk).contiguous(memory_format=fmt)
        rows = bench_pair(lambda: nn.Conv2d(c, o, ks, padding=1, bias=False, **fk).to(memory_format=fmt),
                          {"BinaryConv2d": lambda: bie.BinaryConv2d(c, o, ks, 1, 1, **fk).to(memory_format=fmt),
                           "Q4Conv2d": lambda: bie.Q4Conv2d(c, o, ks, 1, 1, **fk).to(memory_format=fmt),
                           "Q8Conv2d": lambda: bie.Q8Conv2d(c, o, ks, 1, 1, **fk).to(memory_format=fmt)},
                          x, device, budget, run)
        for name, mode, tf, tb in rows:
            emit(name, f"N={nb} C={c} {hw}x{hw} O={o} k{ks}" + (" NHWC" if dev == "cuda" else ""), mode, tf, tb,
                 f"nn.Conv2d {dtname}")
    # host time per module call (eval, tiny shapes: the kernels finish within the host's time)
    for name, fl, bl, x in host_cases(fk, fmt):
        tf, tb = host_us(fl, x, device), host_us(bl, x, device)
        base = "the float block" if isinstance(fl, bench_networks.Block) else type(fl).__name__
        emit(name, f"{tuple(x.shape)} host us/call", "host", tf * 1e-3, tb * 1e-3, f"{base} {dtname}")


def host_cases(fk, fmt):
    """(name, float module, bie module in eval mode with packed weights, input) of the host-time rows;
    the block row: bench_networks' ResNet basic block in float against the same block with binary
    3x3 convs after bie.fuse (two FusedConv2d calls)."""
    conv_f = nn.Conv2d(64, 64, 3, padding=1, bias=False, **fk).to(memory_format=fmt).eval()
    conv_b = bie.BinaryConv2d(64, 64, 3, 1, 1, **fk).to(memory_format=fmt).eval()
    lin_f = nn.Linear(1024, 1024, bias=False, **fk).eval()
    lin_b = bie.BinaryLinear(1024, 1024, **fk).eval()
    xc = torch.randn(1, 64, 8, 8, **fk).contiguous(memory_format=fmt)
    xl = torch.randn(16, 1024, **fk)
    blk_f = bench_networks.Block(64, 64, 1).to(**fk, memory_format=fmt).eval()
    blk_b = bench_networks.Block(64, 64, 1)
    bie.replace_layers(blk_b, "binary", linear=False)
    blk_b = bie.fuse(blk_b.to(**fk, memory_format=fmt)).eval()
    for m, x in ((conv_b, xc), (lin_b, xl), (blk_b, xc)):
        bie.prepare_bie_layers(m)
        with torch.no_grad():
            m(x)
    return [("BinaryConv2d", conv_f, conv_b, xc), ("BinaryLinear", lin_f, lin_b, xl),
            ("fused ResNet block", blk_f, blk_b, xc)]


def host_us(module, x, device, calls=200, runs=11):
    """Median microseconds of host time per module(x) call: `calls` calls queued without a
    synchronisation (fewer than the GPU's launch queue holds), `runs` times."""
    times = []
    with torch.no_grad():
        for _ in range(20):
            module(x)
        for _ in range(runs):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                module(x)
            times.append((time.perf_counter() - t0) * 1e6 / calls)
    times.sort()
    return times[len(times) // 2]


if __name__ == "__main__":
    main()
