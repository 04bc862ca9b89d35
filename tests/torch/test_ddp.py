"""DDP over chorus ends with the same parameters as DDP over Gloo, with and without comm hooks.

Usage: test_ddp.py [NRANKS]. In one process group per rank (default backend chorus, plus a Gloo
subgroup of all ranks), two copies of one small model train side by side on the same synthetic data:
one DDP over chorus, one over Gloo. Variants: plain, no_sync() accumulation, fp16_compress_hook,
bf16_compress_hook, powerSGD_hook. Plain and no_sync must match bitwise on 2 ranks (a + b is the same
in any order); otherwise the tolerance is stated below.
"""
import sys

from harness import init, require_torch, spawn

torch, dist = require_torch()
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

STEPS = 200
try:
    import numpy  # noqa: F401  (PowerSGD's hook draws its seeds with numpy)

    VARIANTS = ("plain", "no_sync", "fp16", "bf16", "powerSGD")
except ImportError:
    print("test_ddp: numpy is not installed: the PowerSGD variant is skipped (`pip install numpy`)")
    VARIANTS = ("plain", "no_sync", "fp16", "bf16")
# Compressed hooks round to 16 bits at every step: the two backends may round a sum differently
# (Gloo adds in the 16-bit type, Chorus rounds each pair's sum), so their runs drift apart by a few
# 16-bit ulps of the gradients, scaled by the learning rate, over the steps.
TOL = {"plain": 0.0, "no_sync": 0.0, "fp16": 2e-3, "bf16": 2e-2, "powerSGD": 1e-4}
# From 3 ranks on, the two backends add in different orders: last-bit differences, which PowerSGD's
# orthogonalisation amplifies (measured: 6e-8 plain, 4e-6 fp16, 4e-5 bf16, 2e-3 PowerSGD on 3 ranks,
# against parameter moves of 0.14).
TOL3 = {"plain": 1e-5, "no_sync": 1e-5, "fp16": 2e-3, "bf16": 2e-2, "powerSGD": 2e-2}


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32),
                               torch.nn.Tanh(), torch.nn.Linear(32, 4))


def train(rank, size, variant, pg):
    # Several buckets (overlap, order), except for PowerSGD: its hook issues collectives from future
    # callbacks, whose order across buckets differs between ranks on every backend.
    net = DDP(model(), process_group=pg, bucket_cap_mb=25 if variant == "powerSGD" else 0.002)
    if variant == "fp16":
        net.register_comm_hook(pg, default_hooks.fp16_compress_hook)
    elif variant == "bf16":
        net.register_comm_hook(pg, default_hooks.bf16_compress_hook)
    elif variant == "powerSGD":
        state = powerSGD_hook.PowerSGDState(process_group=pg, matrix_approximation_rank=2,
                                            start_powerSGD_iter=5, random_seed=7)
        net.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + rank)
    for step in range(STEPS):
        x = torch.randn(8, 16, generator=gen)
        y = torch.randn(8, 4, generator=gen)
        if variant == "no_sync" and step % 4 != 3:
            with net.no_sync():
                torch.nn.functional.mse_loss(net(x), y).backward()
            continue
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in net.parameters()]


def body(rank, size, path):
    init(dist, rank, size, path)
    gloo = dist.new_group(backend="gloo")
    chorus = dist.group.WORLD
    for variant in VARIANTS:
        a = train(rank, size, variant, chorus)
        b = train(rank, size, variant, gloo)
        worst = max((x - y).abs().max().item() for x, y in zip(a, b))
        tol = TOL[variant] if size == 2 else TOL3[variant]
        moved = max((x - y).abs().max().item() for x, y in zip(a, model().parameters()))
        if rank == 0:
            print(f"test_ddp: {size} ranks, {variant}: largest difference to Gloo {worst:.3g} "
                  f"(allowed {tol:g}; parameters moved by up to {moved:.3g})")
        if worst > tol:
            raise AssertionError(f"DDP {variant}: chorus and Gloo differ by {worst} > {tol}")
        if moved < 1e-3:
            raise AssertionError(f"DDP {variant}: the parameters did not train")
        # every rank ends with the same parameters
        flat = torch.cat([p.flatten() for p in a])
        ref = flat.clone()
        dist.broadcast(ref, 0)
        if not torch.equal(flat, ref):
            raise AssertionError(f"DDP {variant}: ranks disagree")
    dist.destroy_process_group()


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] else 2
    spawn(body, n, timeout=220)
    print("PASS")
