#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The ResNet-18 BNN of bench_networks.py trained with PyTorch DistributedDataParallel (NCCL), one
process per GPU, against the same training on one GPU. Run through torchrun (scripts/ddp-check.sh):

    torchrun --nproc_per_node=2 python/bench_ddp.py [--batch 128] [--json FILE]

1. Equality: from the same initial weights, one SGD step (learning rate 1, no momentum: the update
   is minus the gradient) in float32 on a global batch split over the ranks (SyncBatchNorm, so batch
   statistics are those of the whole batch), against the same step on one GPU with the whole batch;
   prints the relative L2 difference of all updates and of the farthest parameter's. Beside it, the
   same difference on one GPU between cuDNN's autotuned and deterministic algorithms: the binary
   activations turn rounding differences near their thresholds into sign flips, so rounding alone
   moves this update, and the DDP difference is to be read against that spread. (Steps after the
   first are not compared: a binary layer's output jumps wherever a latent weight's sign flips.)
2. Speed: the fp16 channels-last training step with `--batch` images per GPU, timed on one GPU
   alone (rank 0, the others waiting) and with every rank in DDP, in alternating rounds of 10 steps
   (the step is bound by the host, whose speed drifts); medians of each, and for DDP the slowest
   rank's; scaling = world * (one-GPU step time) / (DDP step time), the throughput of all GPUs
   over one GPU's. DistributedDataParallel takes PyTorch's defaults unless options say otherwise.
   --graphs: each side's step is captured in a CUDA graph and replayed (both sides alike), which
   takes the host out of the step; DDP is built on a side stream and runs 11 eager steps before
   its capture, and NCCL's asynchronous error handling is off, as PyTorch's CUDA graph notes ask.
   --fused: both sides train the network after bie.fuse (each block's conv, BatchNorm and shortcut
   one node whose libbie calls replay from CUDA graphs of their own).
   --comm-hook allreduce: DDP reduces each bucket through PyTorch's default all-reduce hook, which
   divides the whole bucket by the world size once; without a hook DDP divides each gradient on its
   own, a kernel launch per parameter on the host's side of every step.
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


def differences(got, ref):
    """(largest relative L2 difference of a parameter's update, that parameter, its norm in ref) and
    the relative L2 difference of all updates together, of `got` against `ref`."""
    worst, num, den = (0.0, "", 0.0), 0.0, 0.0
    for n, r in ref.items():
        d = got["module." + n] if "module." + n in got else got[n]
        e, rn = float((d - r).norm()), float(r.norm())
        worst = max(worst, (e / max(rn, 1e-30), n, rn))
        num, den = num + e * e, den + rn * rn
    return worst, (num / max(den, 1e-60)) ** 0.5


def one_gpu_update(dev, x, y, deterministic):
    """The first update on one GPU, the whole batch, plain batch norm (the statistics SyncBatchNorm
    gives), with cuDNN's deterministic algorithms or the autotuned ones."""
    bench, det = torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = not deterministic, deterministic
    bie.set_data_parallel(False)
    try:
        return updates(bench_networks.build("binary", dev, torch.float32, seed=0), x.to(dev), y.to(dev))
    finally:
        bie.set_data_parallel(None)
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = bench, det


def equality(rank, world, dev, per_gpu):
    """On rank 0: the differences (see differences()) of the first update under DDP on `world`
    GPUs against one GPU, and the global difference on one GPU between cuDNN's autotuned and
    deterministic algorithms: how far rounding alone moves this update (the binarisation turns
    rounding differences near its thresholds into whole sign flips)."""
    x, y = global_batch(per_gpu * world, 64, torch.float32, seed=1)
    ref = spread = None
    if rank == 0:
        ref = one_gpu_update(dev, x, y, deterministic=False)
        spread = differences(one_gpu_update(dev, x, y, deterministic=True), ref)[1]
    dist.barrier()
    model = bench_networks.build("binary", dev, torch.float32, seed=0)
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
    lo, hi = rank * per_gpu, (rank + 1) * per_gpu
    got = updates(ddp, x[lo:hi].to(dev), y[lo:hi].to(dev))
    return (differences(got, ref) + (spread,)) if rank == 0 else None


def step_times(step, dev, iters):
    """Milliseconds of each of `iters` calls of step(), each waited for."""
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize(dev)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


DDP_DEFAULTS = {"broadcast_buffers": True, "static_graph": False, "gradient_as_bucket_view": False,
                "bucket_cap_mb": 25.0}  # (PyTorch's; a row's mode names the options that differ)


def network(dev, fused):
    """The fp16 binary network of bench_networks, after bie.fuse (in training) where fused."""
    model = bench_networks.build("binary", dev, torch.float16)
    return bie.fuse(model).train() if fused else model


def speed(rank, world, dev, batch, ddp_options, graphs=False, fused=False, comm_hook=None, rounds=6, iters=10):
    """Median step times (ms) on one GPU (rank 0 alone, the others waiting) and under DDP (the
    slowest rank's median), timed in alternating rounds so that both see the same host; with graphs,
    of each side's step replayed from a CUDA graph, the one-GPU graph's rounds all first (replays
    of a graph captured before DDP's capture failed with an illegal address once DDP's was made)."""
    x, y = global_batch(batch, 224, torch.float16, seed=2 + rank)
    x = x.to(dev).contiguous(memory_format=torch.channels_last)
    y = y.to(dev)
    one_step, one = None, []
    if rank == 0:
        bie.set_data_parallel(False)
        one_step = SGDStep(network(dev, fused), x, y, lr=1e-3, momentum=0.9, set_to_none=False)
        step_times(one_step, dev, 5)
        if graphs:
            replay = bench_networks.graphed(one_step, dev)
            one = step_times(replay, dev, rounds * iters)
            del replay, one_step
            one_step = None
        bie.set_data_parallel(None)
    dist.barrier()

    def build():
        ddp = nn.parallel.DistributedDataParallel(network(dev, fused), device_ids=[dev.index], **ddp_options)
        if comm_hook == "allreduce":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        return ddp

    if graphs:  # DDP is built on a side stream, where its later capture runs
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            ddp = build()
        torch.cuda.current_stream(dev).wait_stream(side)
    else:  # on the stream its steps run on: its gradient accumulators take the stream they are made on
        ddp = build()
    ddp_step = SGDStep(ddp, x, y, lr=1e-3, momentum=0.9, set_to_none=False)
    step_times(ddp_step, dev, 5)
    if graphs:
        ddp_step = bench_networks.graphed(ddp_step, dev, warmup=11)
    mine = []
    for _ in range(rounds):
        if rank == 0 and one_step is not None:
            bie.set_data_parallel(False)
            one += step_times(one_step, dev, iters)
            bie.set_data_parallel(None)
        dist.barrier()
        mine += step_times(ddp_step, dev, iters)
    ts = [None] * world
    dist.all_gather_object(ts, statistics.median(mine))
    return (statistics.median(one) if one else None), max(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=128, help="images per GPU in the speed test")
    ap.add_argument("--json", help="rank 0 writes the result rows here")
    ap.add_argument("--static-graph", action="store_true", help="DistributedDataParallel(static_graph=True)")
    ap.add_argument("--bucket-view", action="store_true",
                    help="DistributedDataParallel(gradient_as_bucket_view=True): gradients live in the buckets")
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="DistributedDataParallel's bucket_cap_mb")
    ap.add_argument("--graphs", action="store_true", help="time CUDA graph replays of each side's step")
    ap.add_argument("--fused", action="store_true", help="time the network after bie.fuse (both sides)")
    ap.add_argument("--no-broadcast-buffers", action="store_true",
                    help="DistributedDataParallel(broadcast_buffers=False): no copy of rank 0's buffers (BatchNorm "
                         "statistics, scale_w) to every rank before each forward")
    ap.add_argument("--comm-hook", choices=["none", "allreduce"], default="none",
                    help="allreduce: DDP's buckets through PyTorch's default all-reduce hook (one division a "
                         "bucket instead of one a gradient); eager steps only")
    args = ap.parse_args()
    if args.graphs and args.comm_hook != "none":
        ap.error("--comm-hook is for eager steps (the CUDA graph rows time DDP's own reduction)")
    ddp_options = {"broadcast_buffers": not args.no_broadcast_buffers, "static_graph": args.static_graph,
                   "gradient_as_bucket_view": args.bucket_view, "bucket_cap_mb": args.bucket_mb}
    if args.graphs:  # (PyTorch's condition for NCCL collectives inside a captured graph)
        os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(dev)
    torch.backends.cudnn.benchmark = True
    eq = equality(rank, world, dev, per_gpu=16)
    hook = None if args.comm_hook == "none" else args.comm_hook
    one, ddp = speed(rank, world, dev, args.batch, ddp_options, args.graphs, args.fused, hook)
    if rank == 0:
        scaling = world * one / ddp
        name = torch.cuda.get_device_name(dev)
        print(f"# ResNet-18 BNN, DDP over {world} x {name} (NCCL), bie {bie.version()}, torch {torch.__version__}")
        (w_rel, w_name, w_norm), total, spread = eq
        print(f"equality of the first float32 step (global batch {16 * world}) against one GPU: all updates "
              f"{total:.3g} apart (relative L2), the farthest parameter's {w_rel:.3g} ({w_name}, norm {w_norm:.3g}); "
              f"on one GPU, cuDNN's deterministic against its autotuned algorithms: {spread:.3g}")
        print(f"DistributedDataParallel options: {ddp_options}, comm hook: {args.comm_hook}")
        print(f"fp16 step{' (CUDA graphs)' if args.graphs else ''}{', after bie.fuse' if args.fused else ''}, "
              f"{args.batch} images per GPU: one GPU {one:.3f} ms, "
              f"{world} GPUs {ddp:.3f} ms, scaling {scaling:.2f}x")
        if args.json:
            changed = [f"{k}={v}" for k, v in ddp_options.items() if v != DDP_DEFAULTS[k]]
            changed += [f"comm_hook={hook}"] if hook else []
            mode = (f"ddp x{world} step" + (", fused" if args.fused else "") + (", CUDA graphs" if args.graphs else "")
                    + (f" ({', '.join(changed)})" if changed else ""))
            row = {"network": "resnet18-bnn", "model": "binary", "batch": args.batch, "mode": mode,
                   "graphs": args.graphs,
                   "bie_ms": round(ddp, 4), "baseline": "one GPU", "baseline_ms": round(one, 4),
                   "ratio": round(scaling, 3), "update_diff": total, "max_rel_update_diff": w_rel,
                   "max_rel_update_param": w_name, "one_gpu_rounding_spread": spread, "ddp_options": ddp_options,
                   "comm_hook": args.comm_hook,
                   "device": name,
                   "date": datetime.date.today().isoformat()}
            with open(args.json, "w") as f:
                json.dump([row], f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
