#!/usr/bin/env python3
"""DDP time per step and final loss with compressed gradients: Chorus's wire formats (docs/WIRE.md)
against PyTorch's own DDP communication hooks (bf16 compression, PowerSGD) and Gloo, on the same links.

Run one rank per host of a netns cluster, e.g. with links shaped to 1 Gbit/s:
    tools/netns-cluster.sh up 2 --rate 1gbit
    tools/netns-cluster.sh run 2 env PYTHONPATH=build/python python3 tools/ddp_wire_bench.py VARIANT [STEPS]
VARIANT: off | bf16 | fp8e4m3 | mx8 (the chorus backend, torch_chorus.set_wire_format(V + "!")),
hook-bf16 (chorus, torch's bf16_compress_hook), hook-powersgd (chorus, PowerSGD rank 4), gloo.
Rank and size come from RANK / WORLD_SIZE, the rendezvous from NCCL_COMM_ID's host (port + 1).
Prints one line: variant, median seconds per step after 3 warm-up steps, the mean loss of the last 5.
"""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

WIDTH, DEPTH, BATCH = 1024, 4, 64  # 4 x 1 M float32 weights: 16 MiB of gradients a step


def main():
    variant = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    host, port = os.environ["NCCL_COMM_ID"].rsplit(":", 1)
    backend = "gloo" if variant == "gloo" else "chorus"
    if backend == "chorus":
        import torch_chorus  # noqa: F401  (registers the backend)
    dist.init_process_group(backend, init_method=f"tcp://{host}:{int(port) + 1}", rank=rank, world_size=size)
    if variant in ("bf16", "fp16", "fp8e4m3", "fp8e5m2", "mx8"):
        import torch_chorus

        torch_chorus.set_wire_format(variant + "!")
    torch.manual_seed(0)
    layers = []
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()]
    net = DDP(torch.nn.Sequential(*layers[:-1]), bucket_cap_mb=25)
    if variant == "hook-bf16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        net.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif variant == "hook-powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=4, start_powerSGD_iter=2)
        net.register_comm_hook(state, psgd.powerSGD_hook)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    teacher = torch.nn.Linear(WIDTH, WIDTH)
    gen = torch.Generator().manual_seed(10 + rank)
    times, losses = [], []
    for _ in range(steps):
        x = torch.randn(BATCH, WIDTH, generator=gen)
        with torch.no_grad():
            y = torch.tanh(teacher(x))
        t0 = time.perf_counter()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    if rank == 0:
        print(f"{variant:14s} {statistics.median(times[3:]):.3f} s/step  loss {sum(losses[-5:]) / 5:.5f} "
              f"(first {losses[0]:.5f}, {steps} steps, {size} ranks)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
