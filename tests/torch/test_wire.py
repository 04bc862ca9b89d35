"""Compressed wire formats under the chorus backend (docs/WIRE.md): torch_chorus.set_wire_format on a
process group whose ranks talk over TCP (NCCL_SHM_DISABLE=1), float32 all_reduce within bf16's bound and
the same bits on every rank, off again exact, a bad format refused, and DDP training with mx8 hops.

Usage: test_wire.py [NRANKS]
"""
import os
import sys

os.environ["NCCL_SHM_DISABLE"] = "1"  # the ranks' hops go over TCP loopback: the network hops
from harness import expect_error, init, require_torch, spawn  # noqa: E402

torch, dist = require_torch()
import torch_chorus  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def body(rank, size, path):
    init(dist, rank, size, path)
    n = 10000
    gen = torch.Generator().manual_seed(7 + rank)
    x = torch.randn(n, generator=gen)
    xs = [torch.randn(n, generator=torch.Generator().manual_seed(7 + r)) for r in range(size)]
    exact = torch.stack([v.double() for v in xs]).sum(0)
    bound = (1 + 2.0 ** -8) ** size - 1
    scale = torch.stack([v.double().abs() for v in xs]).sum(0)

    torch_chorus.set_wire_format("bf16!")
    y = x.clone()
    dist.all_reduce(y)
    err = (y.double() - exact).abs()
    if not bool((err <= bound * scale + size * 2.0 ** -23 * scale).all()):
        raise AssertionError(f"bf16 all_reduce: error {err.max().item()} beyond the bound")
    if bool((err <= 2.0 ** -20 * scale).all()):
        raise AssertionError("bf16 all_reduce: exact to float32 precision, so nothing was compressed")
    # the same bits everywhere: gather the results' bit patterns (integers travel exact)
    bits = y.view(torch.int32)
    got = [torch.empty_like(bits) for _ in range(size)]
    dist.all_gather(got, bits)
    if not all(torch.equal(g, bits) for g in got):
        raise AssertionError("bf16 all_reduce: the ranks' results differ")

    expect_error(lambda: torch_chorus.set_wire_format("fp4"), ["set_wire_format", "fp4"], "a bad format")

    torch_chorus.set_wire_format("off")
    y = x.clone()
    dist.all_reduce(y)
    if not bool(((y.double() - exact).abs() <= size * 2.0 ** -23 * scale).all()):
        raise AssertionError("off: all_reduce not float32-exact")

    # DDP with 8-bit hops still trains a small regression
    torch_chorus.set_wire_format("mx8!")
    torch.manual_seed(0)
    net = DDP(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    w = torch.randn(8, 1, generator=torch.Generator().manual_seed(3))
    losses = []
    for step in range(60):
        xb = torch.randn(32, 8, generator=gen)
        loss = torch.nn.functional.mse_loss(net(xb), xb @ w)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    if not losses[-1] < 0.5 * losses[0]:
        raise AssertionError(f"DDP with mx8 hops did not train: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    spawn(body, int(sys.argv[1]) if len(sys.argv) > 1 else 3)
    print("PASS")
