# SPDX-License-Identifier: Apache-2.0
"""DistributedDataParallel (2 processes, gloo, localhost) trains a model with bie layers: both ranks
end with identical parameters, equal (within float tolerance) to one process trained on the
combined batch."""
import datetime
import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

import bie

STEPS = 6
WORLD = 2
TIME_LIMIT_S = 120


def build_model():
    torch.manual_seed(1234)
    model = nn.Sequential(
        bie.BinaryConv2d(3, 8, 3, 1, 1),
        nn.ReLU(),
        bie.Q8Conv2d(8, 8, 3, 2, 1),
        nn.Flatten(),
        bie.Q4Linear(8 * 4 * 4, 16, bias=True),
        nn.ReLU(),
        bie.BinaryLinear(16, 5),
    )
    bie.prepare_bie_layers(model)
    return model


def data():
    g = torch.Generator().manual_seed(99)
    x = torch.randn(8, 3, 8, 8, generator=g)
    y = torch.randint(0, 5, (8,), generator=g)
    return x, y


def train(model, x, y):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for _ in range(STEPS):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    return model


def _worker(rank, port, outdir):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    try:
        model = nn.parallel.DistributedDataParallel(build_model())
        x, y = data()
        per = x.shape[0] // WORLD
        train(model, x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per])
        torch.save({k: v.detach().clone() for k, v in model.module.state_dict().items()},
                   os.path.join(outdir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_two_processes_gloo(tmp_path):
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    ctx = mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD, join=False)
    deadline = time.monotonic() + TIME_LIMIT_S
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            pytest.fail(f"DDP run did not finish within {TIME_LIMIT_S} s")
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]

    torch.set_num_threads(1)
    x, y = data()
    single = train(build_model(), x, y).state_dict()

    assert ranks[0].keys() == ranks[1].keys() == single.keys()
    for k in single:
        assert torch.equal(ranks[0][k], ranks[1][k]), f"{k} differs between the ranks"
        torch.testing.assert_close(ranks[0][k], single[k], rtol=1e-4, atol=1e-5, msg=f"{k}: DDP vs one process")
    # the run did train: the weights moved
    assert not torch.equal(single["4.weight"], build_model().state_dict()["4.weight"])
