"""PyTorch's own NCCL backend on Chorus, on a GPU: N processes share cuda:0 (the case real NCCL refuses
before 2.30), `init_process_group("nccl")` with Chorus preloaded as libnccl.so.2, then collectives on
CUDA tensors against closed-form values and a few DDP steps against the same run over Gloo on CPU.

    LD_PRELOAD=$PWD/build/lib/libnccl.so.2 python3 tests/torch/gpu_nccl_smoke.py 2

With CHORUS_SMOKE_BACKEND=chorus (and build/python on PYTHONPATH) the same runs on torch_chorus's own
backend, which takes the CUDA tensors itself (issue 29 item 6): no preload, no ProcessGroupNCCL.

Needs torch with CUDA and a GPU; exits 77 (skipped) otherwise. Not registered in ctest: the GPU
session script (tools/device-session.sh gpu) runs it.
"""
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SKIP = 77


def collectives(rank, n, dev):
    t = torch.full((1 << 20,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    assert torch.all(t == n * (n + 1) / 2).item(), t[:4]
    b = torch.full((4096,), float(rank), device=dev)
    dist.broadcast(b, src=n - 1)
    assert torch.all(b == n - 1).item()
    out = torch.empty(n * 1000, device=dev)
    dist.all_gather_into_tensor(out, torch.full((1000,), float(rank), device=dev))
    assert torch.equal(out.view(n, 1000)[:, 0].cpu(), torch.arange(n, dtype=torch.float32))
    rs = torch.empty(1000, device=dev)
    dist.reduce_scatter_tensor(rs, torch.ones(n * 1000, device=dev))
    assert torch.all(rs == n).item()
    w = dist.all_reduce(torch.ones(8, device=dev), async_op=True)
    w.wait()
    # Point to point as pipeline parallelism uses it: a ring of batch_isend_irecv, then AlltoAll.
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    if n > 1:  # torch refuses a send to itself
        send, recv = torch.full((1000,), float(rank), device=dev), torch.empty(1000, device=dev)
        for r in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, recv, prv)]):
            r.wait()
        assert torch.all(recv == prv).item(), recv[:4]
    a2a = torch.empty(n * 100, device=dev)
    dist.all_to_all_single(a2a, torch.arange(n * 100, device=dev, dtype=torch.float32) + 1000 * rank)
    want = torch.cat([torch.arange(rank * 100, rank * 100 + 100, dtype=torch.float32) + 1000 * j for j in range(n)])
    assert torch.equal(a2a.cpu(), want), a2a[:4]
    torch.cuda.synchronize()


def p2p_us(rank, n, dev, numel, reps=200):
    """Time of one ring step of batch_isend_irecv (a pipeline stage's send and receive), in us."""
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    send, recv = torch.ones(numel, device=dev), torch.empty(numel, device=dev)
    ops = [dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, recv, prv)]
    for i in range(reps + 20):
        if i == 20:
            torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
        for r in dist.batch_isend_irecv(ops):
            r.wait()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e6


def allreduce_us(dev, numel, reps=500):
    """A synchronous all_reduce of numel floats on the current stream, issue to completion, in us."""
    t = torch.ones(numel, device=dev)
    for i in range(reps + 50):
        if i == 50:
            torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
        dist.all_reduce(t)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e6


def ddp_params(rank, dev, steps=20):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x = torch.randn(16, 64, generator=g).to(dev)
        loss = ddp(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return torch.cat([p.detach().flatten().cpu() for p in model.parameters()])


def transformer_ms(rank, dev, ddp, steps=10):
    """One training step of a 6-layer transformer encoder (d_model 768: 42.5 M parameters, batch 8 x
    256 tokens, SGD), in ms: with DDP over the process group, or each rank alone (the GPU shared all
    the same: what compute costs when every rank's kernels take turns)."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 6).to(dev)
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(8, 256, 768, device=dev)
    for i in range(steps + 3):
        if i == 3:
            torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps * 1e3


def graph_replays(rank, n, dev, reps=100):
    """An all_reduce captured into a CUDA graph (torch.cuda.graph), replayed with new inputs: issue 29."""
    t = torch.zeros(4096, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as torch asks
        for _ in range(3):
            dist.all_reduce(t)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        dist.all_reduce(t)
    for i in range(reps):
        t.fill_(float(rank + i))
        g.replay()
        torch.cuda.synchronize()
        want = n * (n - 1) / 2 + n * i
        assert torch.all(t == want).item(), (i, t[:4], want)


def run(rank, n, path):
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    backend = os.environ.get("CHORUS_SMOKE_BACKEND", "nccl")
    if backend == "chorus":
        import torch_chorus  # noqa: F401  registers "chorus" for CPU and CUDA tensors
    dist.init_process_group(backend, init_method=f"file://{path}.nccl", rank=rank, world_size=n)
    collectives(rank, n, dev)
    small = [allreduce_us(dev, numel) for numel in (2, 1 << 20)]
    if rank == 0:
        print(f"{n} ranks, {backend}: all_reduce {small[0]:.1f} us at 8 B, {small[1]:.1f} us at 4 MiB")
    p2p = [p2p_us(rank, n, dev, numel) for numel in (2, 1 << 20)] if n > 1 else None
    if rank == 0 and p2p:
        print(f"{n} ranks: batch_isend_irecv ring step {p2p[0]:.1f} us at 8 B, {p2p[1]:.1f} us at 4 MiB")
    if os.environ.get("CHORUS_SMOKE_GRAPH"):
        graph_replays(rank, n, dev)
        if rank == 0:
            print(f"{n} ranks: an all_reduce captured into a CUDA graph, replayed 100 times: right every time")
    if os.environ.get("CHORUS_SMOKE_TRANSFORMER"):
        alone, with_ddp = transformer_ms(rank, dev, False), transformer_ms(rank, dev, True)
        if rank == 0:
            print(f"{n} ranks: transformer step {with_ddp:.1f} ms with DDP, {alone:.1f} ms without "
                  f"(every rank computing at once, no gradient AllReduce)")
    t0 = time.perf_counter()
    p_nccl = ddp_params(rank, dev)
    step_ms = (time.perf_counter() - t0) / 20 * 1e3
    dist.destroy_process_group()
    dist.init_process_group("gloo", init_method=f"file://{path}.gloo", rank=rank, world_size=n)
    p_gloo = ddp_params(rank, torch.device("cpu"))
    dist.destroy_process_group()
    diff = (p_nccl - p_gloo).abs().max().item()
    if rank == 0:
        print(f"{n} ranks on one GPU: collectives ok; DDP step {step_ms:.2f} ms over {backend}; "
              f"parameters vs Gloo on CPU: max |diff| {diff:.2e}")
    assert diff < 1e-3, diff  # GPU and CPU matmuls round differently


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    if not torch.cuda.is_available():
        print("SKIP: torch sees no CUDA device")
        sys.exit(SKIP)
    if "libnccl.so.2" not in os.environ.get("LD_PRELOAD", "") and os.environ.get("CHORUS_SMOKE_BACKEND") != "chorus":
        print("note: Chorus is not preloaded (LD_PRELOAD=.../build/lib/libnccl.so.2): this runs torch's NCCL")
    mp.start_processes(run, args=(n, tempfile.mktemp()), nprocs=n, start_method="spawn")
