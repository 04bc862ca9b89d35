"""DDP under CHORUS_REPRODUCIBLE gives bitwise-identical parameters whatever NCCL_ALGO, NCCL_PROTO,
FIFO size and channel settings say (docs/REPRODUCIBLE.md).

Usage: test_repro.py [NRANKS]. For each level (order, exact) the same training (a small model, fp32
and a bf16 copy of its gradients reduced too, several DDP buckets) runs once per configuration, each a
fresh set of processes; rank 0 writes its final parameters' bytes, and every configuration must give
the same bytes as the first. The `off` level's runs are printed for comparison (not checked: their
bits may or may not differ on this model).
"""
import os
import sys
import tempfile

from harness import init, require_torch, spawn

torch, dist = require_torch()
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

STEPS = 20
CONFIGS = [
    {},
    {"NCCL_ALGO": "allreduce:Owner"},
    {"NCCL_PROTO": "LL128", "NCCL_BUFFSIZE": "65536"},
    {"NCCL_MAX_NCHANNELS": "1", "NCCL_BUFFSIZE": "131072"},
    {"NCCL_ALGO": "allreduce:^Direct", "NCCL_PROTO": "Simple"},
]
# off: NCCL's algorithms (Owner serves the reproducible levels only), to show what the levels prevent
OFF_CONFIGS = [{"NCCL_ALGO": "allreduce:Ring"}, {"NCCL_ALGO": "allreduce:RecDbl"}, {"NCCL_ALGO": "allreduce:Tree"}]
KEYS = ("CHORUS_REPRODUCIBLE", "NCCL_ALGO", "NCCL_PROTO", "NCCL_BUFFSIZE", "NCCL_MAX_NCHANNELS")


def body(rank, size, path, out):
    init(dist, rank, size, path)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                              torch.nn.Tanh(), torch.nn.Linear(64, 4))
    net = DDP(net, bucket_cap_mb=0.004)  # several buckets: calls of several sizes
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        x = torch.randn(8, 16, generator=gen) * 10.0 ** torch.randint(-3, 3, (8, 1), generator=gen)
        y = torch.randn(8, 4, generator=gen)
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
        opt.zero_grad()
    flat = torch.cat([p.detach().flatten() for p in net.parameters()])
    half = flat.to(torch.bfloat16)
    dist.all_reduce(half)  # a bf16 sum of inexact values, as a compression hook would do
    if rank == 0:
        with open(out, "wb") as f:
            # Raw bytes without numpy (torch may be installed without it): each tensor's bytes as uint8.
            f.write(bytes(flat.contiguous().view(torch.uint8).tolist()) +
                    bytes(half.contiguous().view(torch.uint8).tolist()))
    dist.destroy_process_group()


def run(level, cfg, size):
    for k in KEYS:
        os.environ.pop(k, None)
    os.environ["CHORUS_REPRODUCIBLE"] = level
    os.environ.update(cfg)
    fd, out = tempfile.mkstemp(prefix="chorus-repro-")
    os.close(fd)
    spawn(body, size, out, timeout=200)
    with open(out, "rb") as f:
        data = f.read()
    os.unlink(out)
    return data


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] else 3
    for level in ("order", "exact", "off"):
        ref = None
        for cfg in OFF_CONFIGS if level == "off" else CONFIGS:
            data = run(level, cfg, n)
            same = ref is None or data == ref
            print(f"test_repro: {n} ranks, {level}, {cfg or 'defaults'}: "
                  f"{'same bits' if same else 'DIFFERENT bits'}{' (reference)' if ref is None else ''}")
            if ref is None:
                ref = data
            elif not same and level != "off":
                raise SystemExit(f"FAIL: CHORUS_REPRODUCIBLE={level}: {cfg} changed the parameters' bits")
    print("PASS")
