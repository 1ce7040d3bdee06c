#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Whole networks through bie's PyTorch modules against the same network in plain PyTorch, in one
process: a ResNet-18 built the usual BNN way (a Bi-Real shortcut around each 3x3 conv, Hardtanh
before it; the stem 7x7 conv, the 1x1 downsample convs and the classifier stay float), 224x224
images, 1000 classes. Its 16 block 3x3 convs are replaced by bie's binary, 4-bit or 8-bit convs
(bie.replace_layers). On a CUDA device everything runs in fp16, channels_last, with
cudnn.benchmark on; on the CPU in float32.

For each batch size it measures, for the float network and each bie network:
  - inference: eval mode, packed weights, no autograd (median of timed iterations);
  - fused inference: the same after bie.fuse (each block's Hardtanh, conv, BatchNorm and shortcut
    add one libbie call; the stem's BatchNorm, ReLU and max-pool one libbie pass after its conv),
    against the plain float network; the float network with torch.fx's conv-BN fold is printed
    beside it (row field baseline_folded_ms);
  - training step: forward, backward, SGD with momentum (median of timed iterations), of the network
    as built and (bie networks) after bie.fuse, whose binary blocks train as one node that keeps
    bits of its input; the gradients are set to None before each step (PyTorch's default), or
    zeroed in place with --graphs;
  - peak memory of the training step (torch.cuda.max_memory_allocated, MiB; for bie plus its
    workspaces: the device memory PyTorch does not hold that appeared since the float network's
    first measurement, after which PyTorch's own libraries are loaded).
--graphs captures each side's inference forward and training step in a CUDA graph and times the
replays (both sides alike). --rounds R measures every network R times, the float network and the
bie networks taking turns, and reports each figure's median over the rounds (a host's speed drifts
over minutes). --profile MODEL prints torch.profiler's table of one network's step.

Usage: python3 python/bench_networks.py [--device cuda|cpu] [--batch 16,128,256] [--models binary,q4,q8]
                                      [--graphs] [--budget SECONDS] [--rounds R] [--json FILE]
                                      [--profile binary]
"""
import argparse
import datetime
import gc
import json
import statistics
import sys
import time

import torch
import torch.nn as nn

import bie


class Block(nn.Module):
    """ResNet basic block with a Bi-Real shortcut around each 3x3 conv:
    out = bn1(conv1(act(x))) + shortcut(x);  y = bn2(conv2(act(out))) + out."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.act1 = nn.Hardtanh()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.act2 = nn.Hardtanh()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        sc = x if self.downsample is None else self.downsample(x)
        out = self.bn1(self.conv1(self.act1(x))) + sc
        return self.bn2(self.conv2(self.act2(out))) + out


class ResNet18(nn.Module):
    def __init__(self, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, 2, 1))
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))


def float_only(model):
    """The layers that stay float: the stem conv, the downsample convs and the classifier."""
    return [n for n, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))
            and (n.startswith("stem") or "downsample" in n or n == "fc")]


def build(kind, device, dtype, seed=0):
    torch.manual_seed(seed)
    model = ResNet18()
    if kind != "float":
        bie.replace_layers(model, kind, linear=False, exclude=float_only(model))
    model = model.to(device=device, dtype=dtype)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    bie.prepare_bie_layers(model)
    return model


def time_it(fn, device, budget, min_iters=10, max_iters=200):
    """Median milliseconds of fn() over timed iterations (after warm-up)."""
    for _ in range(3):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        total = 0.0
        while len(times) < min_iters or (total < budget * 1000 and len(times) < max_iters):
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
            total += times[-1]
    else:
        t0 = time.perf_counter()
        while len(times) < min_iters or (time.perf_counter() - t0 < budget and len(times) < max_iters):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


_SIDE = {}  # device: the side stream of every warm-up and capture


def graphed(fn, device, warmup=3):
    """fn captured in a CUDA graph (`warmup` calls on a side stream first, the capture on it too);
    returns the replay. Every capture uses the same side stream: PyTorch keeps a cuBLAS workspace for
    each stream that ran a cuBLAS call, allocated while the process lives, so a new stream for each
    measurement would add one to every later peak."""
    s = _SIDE.get(device)
    if s is None:
        s = _SIDE[device] = torch.cuda.Stream(device)
    s.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream(device).wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        fn()
    return g.replay


def outside_torch_mib(device):
    """Device memory in use that PyTorch's allocator does not hold (libbie's workspaces, which only
    grow, and the CUDA context), in MiB."""
    free, total = torch.cuda.mem_get_info(device)
    return (total - free - torch.cuda.memory_reserved(device)) / 2**20


_OUTSIDE0 = 0.0  # outside_torch_mib() after the first float measurement (main sets it)


def train_step(model, x, labels, keep_grads=False):
    """One training step of model on (x, labels): forward, cross-entropy, backward, SGD with momentum.
    The gradients are set to None before each step (PyTorch's default), or zeroed in place with
    keep_grads (a step captured in a CUDA graph replays into the same gradient tensors)."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=not keep_grads)
        loss_fn(model(x).float(), labels).backward()
        opt.step()

    return step


def training_setup(kind, batch, device, dtype, keep_grads=False):
    """The network of `kind`, a random batch of images (channels-last on a GPU), random labels and the
    network's training step (train_step)."""
    model = build(kind, device, dtype)
    x = torch.randn(batch, 3, 224, 224, device=device, dtype=dtype)
    if device.type == "cuda":
        x = x.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (batch,), device=device)
    return model, x, labels, train_step(model, x, labels, keep_grads)


def step_time_and_peak(kind, step, device, budget, graphs):
    """Median ms of the training step and its peak memory (MiB; nan on the CPU): PyTorch's, plus for
    bie libbie's workspaces as they stand (they only grow: with the batches measured in increasing
    order, at least this measurement's, perhaps an earlier model's). Objects of earlier measurements
    that only the garbage collector frees (a torch.fx GraphModule, which bie.fuse and the float fold
    return, holds reference cycles) are freed first, so that neither side's peak counts them."""
    gc.collect()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    run = graphed(step, device) if graphs else step
    t_step = time_it(run, device, budget)
    peak = float("nan")
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 2**20
        if kind != "float":
            peak += max(0.0, outside_torch_mib(device) - _OUTSIDE0)
    return t_step, peak


def measure(kind, batch, device, dtype, budget, graphs):
    """(inference, fused inference, training step, its peak, fused training step, its peak); the
    fused figures of the float network are torch.fx's conv-BN fold at inference and None in training."""
    model, x, labels, step = training_setup(kind, batch, device, dtype, graphs)
    # training step (first: the lazy scale_a of the bie layers is set from this batch)
    model.train()
    t_step, peak = step_time_and_peak(kind, step, device, budget, graphs)
    del step  # (its optimizer's momentum buffers)
    t_fstep = fpeak = None
    if kind != "float":  # the same network after bie.fuse, in training
        fused = bie.fuse(model).train()
        t_fstep, fpeak = step_time_and_peak(kind, train_step(fused, x, labels, graphs), device, budget, graphs)
        del fused
    # inference
    model.eval()
    with torch.no_grad():
        def infer():
            model(x)

        infer()  # packs the weights
        run = graphed(infer, device) if graphs else infer
        t_inf = time_it(run, device, budget)
        del run
        # the same network with its BatchNorms folded: bie.fuse for bie's (the block chains of
        # Hardtanh, conv, BatchNorm and shortcut add as one call each), torch.fx's conv-BN fold for
        # the float network (its convs' BatchNorms into their weights)
        if kind == "float":
            from torch.fx.experimental.optimization import fuse as torch_fuse
            folded = torch_fuse(model)
        else:
            folded = bie.fuse(model)
        folded.eval()

        def infer_folded():
            folded(x)

        infer_folded()
        run = graphed(infer_folded, device) if graphs else infer_folded
        t_fold = time_it(run, device, budget)
    del model, run, folded
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return t_inf, t_fold, t_step, peak, t_fstep, fpeak


def profile(kind, batch, device, dtype):
    from torch.profiler import ProfilerActivity, profile as tprofile
    model, x, _, step = training_setup(kind, batch, device, dtype)

    def infer():
        with torch.no_grad():
            model(x)

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for mode, fn in (("train", step), ("eval", infer)):
        model.train(mode == "train")
        for _ in range(3):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        with tprofile(activities=acts) as prof:
            for _ in range(5):
                fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
        keys = ["self_cuda_time_total", "self_cpu_time_total"] if device.type == "cuda" else ["self_cpu_time_total"]
        for key in keys:
            print(f"\n--- {kind} {mode}, batch {batch}: 5 iterations, by {key} ---")
            print(prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=60))


def device_name(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def medians(results):
    """Each field's median over the results of measure() in several rounds (None where absent)."""
    return tuple(None if f[0] is None else statistics.median(f) for f in zip(*results))


def main():
    global _OUTSIDE0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", default="16,128,256")
    ap.add_argument("--models", default="binary,q4,q8")
    ap.add_argument("--graphs", action="store_true", help="time CUDA graph replays (both sides)")
    ap.add_argument("--budget", type=float, default=2.0, help="seconds of timed iterations per measurement")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of measurements (medians reported)")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    ap.add_argument("--profile", metavar="MODEL", help="print a torch.profiler table of MODEL's step and inference")
    args = ap.parse_args()
    device = torch.device(args.device)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    batches = sorted(int(b) for b in args.batch.split(","))
    if args.profile:
        for b in batches:
            profile(args.profile, b, device, dtype)
        return 0
    name = device_name(device)
    date = datetime.date.today().isoformat()
    rows = []
    print(f"# ResNet-18 BNN on {name}, {dtype}, {'channels_last, ' if device.type == 'cuda' else ''}"
          f"{'CUDA graphs' if args.graphs else 'eager'}; bie {bie.version()}, torch {torch.__version__}")
    print(f"{'batch':>5} {'model':>6} {'infer ms':>9} {'float':>8} {'ratio':>6} {'fused ms':>9} {'ratio':>6} "
          f"{'step ms':>8} {'float':>8} {'ratio':>6} {'peak MiB':>9} {'float':>8} {'mem':>5}")
    kinds = args.models.split(",")
    for b in batches:
        runs = {k: [] for k in ["float"] + kinds}  # each network's measure() results, one a round
        for _ in range(max(1, args.rounds)):
            for kind in runs:
                runs[kind].append(measure(kind, b, device, dtype, args.budget, args.graphs))
                if kind == "float" and device.type == "cuda" and not _OUTSIDE0:
                    _OUTSIDE0 = outside_torch_mib(device)  # (PyTorch's cuBLAS and cuDNN are loaded by now)
        fi, ff, fs, fp, _, _ = medians(runs["float"])
        print(f"{b:>5} {'float':>6} {fi:9.3f} {'':>8} {'':>6} {ff:9.3f} (torch.fx conv-BN fold)", flush=True)
        for kind in kinds:
            bi, bf, bs, bp, bfs, bfp = medians(runs[kind])
            print(f"{b:>5} {kind:>6} {bi:9.3f} {fi:8.3f} {fi / bi:5.2f}x {bf:9.3f} {fi / bf:5.2f}x {bs:8.3f} {fs:8.3f} "
                  f"{fs / bs:5.2f}x {bp:9.0f} {fp:8.0f} {bp / fp:5.2f}", flush=True)
            print(f"{b:>5} {kind:>6} fused training step {bfs:8.3f} ms, {fs / bfs:5.2f}x; peak {bfp:9.0f} MiB, "
                  f"{bfp / fp:5.2f}", flush=True)
            cuda = device.type == "cuda"
            for mode, ours, base, peak in (("inference", bi, fi, None), ("inference fused", bf, fi, None),
                                           ("train step", bs, fs, bp), ("train step fused", bfs, fs, bfp)):
                rows.append({"network": "resnet18-bnn", "model": kind, "batch": b, "mode": mode,
                             "graphs": args.graphs, "bie_ms": round(ours, 4), "baseline": "torch fp16" if
                             cuda else "torch f32", "baseline_ms": round(base, 4),
                             "ratio": round(base / ours, 3), "device": name, "date": date,
                             **({"rounds": args.rounds} if args.rounds > 1 else {}),
                             **({"baseline_folded_ms": round(ff, 4)} if mode == "inference fused" else {}),
                             **({"peak_mib": round(peak, 1), "baseline_peak_mib": round(fp, 1)}
                                if peak is not None and cuda else {})})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
