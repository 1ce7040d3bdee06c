# SPDX-License-Identifier: Apache-2.0
"""Bitorch Engine's MNIST example recipe (its examples/mnist/train_mnist.py, model "q_mlp"), written
with bie's modules under Bitorch Engine's names, on Fashion-MNIST (Debian's dataset-fashion-mnist;
MNIST itself is not packaged).

The recipe: BinaryMLP = Flatten -> Linear(784, 1024) -> PReLU -> BatchNorm1d -> BinaryLinearCuda
(1024, 1024) (or Q4LinearCutlass / Q8LinearCutlass with --bits 4 / 8) -> PReLU -> BatchNorm1d ->
Linear(1024, 10) -> log_softmax; prepare_bie_layers(model) (int8 latent weights for the binary
layer); DiodeMix over all parameters with lr 1e-5 for 1 bit (else --lr, 1e-4); cosine annealing
over the epochs (or step: every 3 epochs times --gamma); batch 64, test batch 128, 14 epochs; NLL
loss. --float runs the same script with a plain nn.Linear in place of the low-bit layer.

    PYTHONPATH=python python3 python/examples/train_mnist.py --epochs 3
    PYTHONPATH=python python3 python/examples/train_mnist.py --epochs 3 --float
"""
import argparse
import gzip
import os
import struct
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.lr_scheduler import CosineAnnealingLR, StepLR

from bie import BinaryLinearCuda, DiodeMix, Q4LinearCutlass, Q8LinearCutlass, prepare_bie_layers

FASHION_MEAN, FASHION_STD = 0.2860, 0.3530  # of the Fashion-MNIST training images, in [0, 1]


def read_idx(path):
    """An IDX file (optionally gzip-compressed) as a uint8 tensor."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 8:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    ndim = raw[3]
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    data = raw[4 + 4 * ndim:]
    n = 1
    for d in dims:
        n *= d
    if len(data) != n:
        raise ValueError(f"{path}: {len(data)} bytes of data for shape {dims}")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).reshape(dims)


def load(data_dir, split):
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
    x = (images.float().div_(255.0).sub_(FASHION_MEAN).div_(FASHION_STD)).unsqueeze(1)
    return torch.utils.data.TensorDataset(x, labels.long())


class BinaryMLP(nn.Module):
    def __init__(self, num_hidden_units_1=1024, num_hidden_units_2=1024, bits=1, float_layers=False):
        super().__init__()
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(784, num_hidden_units_1)
        self.act1 = nn.PReLU()
        self.bn1 = nn.BatchNorm1d(num_hidden_units_1)
        if float_layers:
            self.fc2 = nn.Linear(num_hidden_units_1, num_hidden_units_2)
        elif bits == 1:
            self.fc2 = BinaryLinearCuda(num_hidden_units_1, num_hidden_units_2)
        elif bits == 4:
            self.fc2 = Q4LinearCutlass(num_hidden_units_1, num_hidden_units_2)
        else:
            self.fc2 = Q8LinearCutlass(num_hidden_units_1, num_hidden_units_2)
        self.act2 = nn.PReLU()
        self.bn2 = nn.BatchNorm1d(num_hidden_units_2)
        self.fc3 = nn.Linear(num_hidden_units_2, 10)

    def forward(self, x):
        x = self.bn1(self.act1(self.fc1(self.flatten(x))))
        x = self.bn2(self.act2(self.fc2(x)))
        return F.log_softmax(self.fc3(x), dim=1)


def train(args, model, device, loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        if args.log_interval and batch_idx % args.log_interval == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(loader.dataset)}]\tLoss: {loss.item():.6f}",
                  flush=True)


def test(model, device, loader):
    model.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            out = model(data)
            loss += F.nll_loss(out, target, reduction="sum").item()
            correct += (out.argmax(dim=1) == target).sum().item()
    n = len(loader.dataset)
    return loss / n, 100.0 * correct / n


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="directory of the IDX .gz files")
    p.add_argument("--float", action="store_true", help="a plain nn.Linear instead of the low-bit layer")
    p.add_argument("--bits", type=int, choices=[1, 4, 8], default=1)
    p.add_argument("--scheduler", choices=["step", "cosine"], default="cosine")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--test-batch-size", type=int, default=128)
    p.add_argument("--epochs", type=int, default=14)
    p.add_argument("--lr", type=float, default=1e-4, help="learning rate of 4/8-bit runs (1-bit runs use 1e-5)")
    p.add_argument("--gamma", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--log-interval", type=int, default=0, help="batches between loss lines (0: none)")
    p.add_argument("--no-cuda", action="store_true")
    p.add_argument("--save-model", help="path for the trained model's state_dict")
    args = p.parse_args()
    if args.epochs < 1 or args.batch_size < 1 or args.test_batch_size < 1:
        p.error("--epochs, --batch-size and --test-batch-size must be >= 1")

    torch.manual_seed(args.seed)
    device = torch.device("cuda:0" if torch.cuda.is_available() and not args.no_cuda else "cpu")
    train_set, test_set = load(args.data, "train"), load(args.data, "test")
    gen = torch.Generator().manual_seed(args.seed)
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, shuffle=True, generator=gen)
    test_loader = torch.utils.data.DataLoader(test_set, batch_size=args.test_batch_size)

    lr = 1e-5 if args.bits == 1 else args.lr  # Bitorch Engine's recipe: 1-bit needs the smaller rate
    model = BinaryMLP(bits=args.bits, float_layers=args.float).to(device)
    prepare_bie_layers(model)
    optimizer = DiodeMix(model.parameters(), lr=lr, dtype=torch.float)
    if args.scheduler == "step":
        scheduler = StepLR(optimizer, step_size=3, gamma=args.gamma)
    else:
        scheduler = CosineAnnealingLR(optimizer, T_max=args.epochs)

    latent = model.fc2.weight if model.fc2.weight.dtype == torch.int8 else None
    signs0 = latent.detach().clone() if latent is not None else None  # (DiodeMix flips the int8 latent signs)
    kind = "float" if args.float else f"{args.bits}-bit"
    print(f"model q_mlp ({kind} fc2), DiodeMix lr {lr:g}, {args.scheduler}, {args.epochs} epochs, batch "
          f"{args.batch_size}, {device}, {torch.get_num_threads()} threads", flush=True)
    t0 = time.time()
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch)
        loss, acc = test(model, device, test_loader)
        flips = "" if signs0 is None else \
            f", {100.0 * (latent.detach() != signs0).float().mean().item():.3f}% of fc2's signs flipped"
        print(f"epoch {epoch}: test loss {loss:.4f}, accuracy {acc:.2f}% ({time.time() - t0:.0f} s){flips}", flush=True)
        scheduler.step()
    print(f"final: {kind} fc2, test accuracy {acc:.2f}% after {args.epochs} epochs, {time.time() - t0:.0f} s")
    if args.save_model:
        torch.save(model.state_dict(), args.save_model)


if __name__ == "__main__":
    main()
