"""Collectives inside torch.compile over chorus: a DDP train step compiled with the eager,
aot_eager and inductor backends gives the same gradients as the eager step, and as Gloo's; and a
compiled function that calls functional collectives gives what eager gives.

Usage: test_compile.py [NRANKS] (default 2: sums of two floats are exact in any order, so the
comparisons are bitwise).
"""
import os
import sys

from harness import init, require_torch, spawn

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # two ranks compile at once on a small machine
torch, dist = require_torch()
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

BACKENDS = [b for b in os.environ.get("CHORUS_TEST_COMPILE_BACKENDS", "eager,aot_eager,inductor").split(",") if b]


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def grads_after_step(pg, compile_backend, rank):
    net = DDP(model(), process_group=pg)

    def step(x):
        net(x).sum().backward()

    if compile_backend:
        torch._dynamo.reset()
        step = torch.compile(step, backend=compile_backend)
    gen = torch.Generator().manual_seed(10 + rank)
    for _ in range(2):  # the second call runs the compiled code again
        net.zero_grad(set_to_none=True)
        step(torch.randn(4, 8, generator=gen))
    return [p.grad.clone() for p in net.parameters()]


def same(a, b, what):
    for i, (x, y) in enumerate(zip(a, b)):
        if not torch.equal(x, y):
            raise AssertionError(f"{what}: parameter {i} differs by {(x - y).abs().max().item():g}")


def body(rank, size, path):
    init(dist, rank, size, path)
    gloo = dist.new_group(backend="gloo")
    eager = grads_after_step(None, None, rank)
    same(grads_after_step(gloo, None, rank), eager, "eager DDP step: gloo against chorus")
    for b in BACKENDS:
        same(grads_after_step(None, b, rank), eager, f"DDP step compiled with {b}: chorus against eager")
        same(grads_after_step(gloo, b, rank), eager, f"DDP step compiled with {b}: gloo against eager chorus")
        if rank == 0:
            print(f"DDP step under torch.compile(backend={b!r}): equal to eager, and to gloo")

    # Functional collectives traced into the graph (the path of FSDP2, tensor parallelism).
    import torch.distributed._functional_collectives as fc

    def fn(x):
        y = fc.all_reduce(x * 2, "sum", dist.group.WORLD)
        return fc.all_gather_tensor(y + 1, 0, dist.group.WORLD)

    x = torch.arange(6, dtype=torch.float32) + rank
    want = fn(x)
    for b in BACKENDS:
        torch._dynamo.reset()
        got = torch.compile(fn, backend=b)(x)
        if not torch.equal(got, want):
            raise AssertionError(f"functional collectives under torch.compile(backend={b!r}): {got} != {want}")
    if rank == 0:
        print(f"functional collectives under torch.compile ({', '.join(BACKENDS)}): equal to eager")
    dist.destroy_process_group()


if __name__ == "__main__":
    spawn(body, int(sys.argv[1]) if len(sys.argv) > 1 else 2, timeout=580)
