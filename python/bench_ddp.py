#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The ResNet-18 BNN of bench_networks.py trained with PyTorch DistributedDataParallel (NCCL), one
process per GPU, against the same training on one GPU. Run through torchrun (scripts/ddp-check.sh):

    torchrun --nproc_per_node=2 python/bench_ddp.py [--batch 128] [--json FILE]

1. Equality: from the same initial weights, one SGD step (learning rate 1, no momentum: the update
   is minus the gradient) in float32 on a global batch split over the ranks (SyncBatchNorm, so batch
   statistics are those of the whole batch), against the same step on one GPU with the whole batch;
   prints the largest relative L2 difference of any parameter's update. (Steps after the first are
   not compared: a binary layer's output jumps wherever a latent weight's sign flips, so rounding
   differences of the first step can grow without bound.)
2. Speed: the fp16 channels-last training step with `--batch` images per GPU, timed on one GPU
   alone (rank 0, the others waiting) and with every rank in DDP; scaling = world * (one-GPU step
   time) / (DDP step time), the throughput of all GPUs over one GPU's.
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_networks  # noqa: E402  (the network and its bie variants)

import bie  # noqa: E402


def global_batch(n, size, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, size, size, generator=g).to(dtype)
    y = torch.randint(0, 1000, (n,), generator=g)
    return x, y


class SGDStep:
    """A training step of model on (x, y) when called: the cross-entropy of the float logits,
    backward, and an SGD step of its own optimizer (gradients zeroed first, set to None or not)."""

    def __init__(self, model, x, y, lr, momentum, set_to_none):
        self.opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
        self.loss_fn = nn.CrossEntropyLoss()
        self.model, self.x, self.y, self.set_to_none = model, x, y, set_to_none

    def __call__(self):
        self.opt.zero_grad(set_to_none=self.set_to_none)
        self.loss_fn(self.model(self.x).float(), self.y).backward()
        self.opt.step()


def updates(model, x, y):
    """Each parameter's change in one SGD step of learning rate 1 (minus its gradient)."""
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    SGDStep(model, x, y, lr=1.0, momentum=0.0, set_to_none=True)()
    return {n: p.detach() - before[n] for n, p in model.named_parameters()}


def equality(rank, world, dev, per_gpu):
    """Largest relative L2 difference of a parameter's first update between DDP on `world` GPUs
    and one GPU (computed on rank 0)."""
    x, y = global_batch(per_gpu * world, 64, torch.float32, seed=1)
    ref = None
    if rank == 0:  # one GPU, the whole batch, plain batch norm (the same statistics as SyncBatchNorm)
        bie.set_data_parallel(False)
        ref = updates(bench_networks.build("binary", dev, torch.float32, seed=0), x.to(dev), y.to(dev))
        bie.set_data_parallel(None)
    dist.barrier()
    model = bench_networks.build("binary", dev, torch.float32, seed=0)
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
    lo, hi = rank * per_gpu, (rank + 1) * per_gpu
    got = updates(ddp, x[lo:hi].to(dev), y[lo:hi].to(dev))
    worst = 0.0
    if rank == 0:
        for n, r in ref.items():
            d = got["module." + n] if "module." + n in got else got[n]
            worst = max(worst, float((d - r).norm() / r.norm().clamp_min(1e-30)))
    return worst


def step_time(model, x, y, dev, iters=20):
    step = SGDStep(model, x, y, lr=1e-3, momentum=0.9, set_to_none=False)
    for _ in range(5):
        step()
    torch.cuda.synchronize(dev)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize(dev)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def speed(rank, world, dev, batch):
    x, y = global_batch(batch, 224, torch.float16, seed=2 + rank)
    x = x.to(dev).contiguous(memory_format=torch.channels_last)
    y = y.to(dev)
    one = None
    if rank == 0:
        bie.set_data_parallel(False)
        one = step_time(bench_networks.build("binary", dev, torch.float16), x, y, dev)
        bie.set_data_parallel(None)
    dist.barrier()
    model = bench_networks.build("binary", dev, torch.float16)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
    t = step_time(ddp, x, y, dev)
    ts = [None] * world
    dist.all_gather_object(ts, t)
    return one, max(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=128, help="images per GPU in the speed test")
    ap.add_argument("--json", help="rank 0 writes the result rows here")
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(dev)
    torch.backends.cudnn.benchmark = True
    worst = equality(rank, world, dev, per_gpu=16)
    one, ddp = speed(rank, world, dev, args.batch)
    if rank == 0:
        scaling = world * one / ddp
        name = torch.cuda.get_device_name(dev)
        print(f"# ResNet-18 BNN, DDP over {world} x {name} (NCCL), bie {bie.version()}, torch {torch.__version__}")
        print(f"equality of the first float32 step (global batch {16 * world}): largest relative L2 difference "
              f"of a parameter's update {worst:.3g}")
        print(f"fp16 step, {args.batch} images per GPU: one GPU {one:.3f} ms, {world} GPUs {ddp:.3f} ms, "
              f"scaling {scaling:.2f}x")
        if args.json:
            row = {"network": "resnet18-bnn", "model": "binary", "batch": args.batch, "mode": f"ddp x{world} step",
                   "bie_ms": round(ddp, 4), "baseline": "one GPU", "baseline_ms": round(one, 4),
                   "ratio": round(scaling, 3), "max_rel_update_diff": worst, "device": name,
                   "date": datetime.date.today().isoformat()}
            with open(args.json, "w") as f:
                json.dump([row], f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
