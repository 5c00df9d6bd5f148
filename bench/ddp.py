"""PyTorch DDP baseline for bench/ddp.sh: the W3-sized MLP SGD step (784-512-512-10, global
batch 256) data parallel over 2 processes of 1 thread each (torch.distributed, gloo), as
`mesh M[dp = 2]` runs it in msl. Prints the mean step time in ms over `long` steps after
`warm` steps (rank 0)."""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F


def worker(rank, world, warm, long, port):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    )
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 784, generator=g)
    y = torch.randint(0, 10, (256,), generator=g)
    rows = 256 // world
    xb, yb = x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(xb), yb)
        loss.backward()
        opt.step()
        return loss

    for _ in range(warm):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(long):
        loss = step()
    dist.barrier()
    ms = (time.perf_counter() - t0) * 1000 / long
    if rank == 0:
        print(f"{ms:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    warm, long, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    mp.spawn(worker, args=(2, warm, long, port), nprocs=2)
