"""Failures become RuntimeErrors with Chorus's message, never hangs.

- a rank that does not join a collective: the others fail after init_process_group(timeout=...);
- a rank killed (SIGKILL) in the middle of DDP training: the others raise, naming it;
- a collective whose size differs between ranks does not hang (see mismatch_body for what is not caught).
"""
import datetime
import os
import signal
import time

from harness import expect_error, init, require_torch, spawn

torch, dist = require_torch()
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def timeout_body(rank, size, path):
    init(dist, rank, size, path, timeout=datetime.timedelta(seconds=2))
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 1:
        time.sleep(8)  # never joins the next collective
        os._exit(0)
    start = time.monotonic()
    msg = expect_error(lambda: dist.all_reduce(t), ["chorus"], "all_reduce with a missing rank")
    took = time.monotonic() - start
    print(f"test_fault: rank 0 raised after {took:.1f} s (timeout 2 s): {msg.splitlines()[0][:200]}")
    if took > 7:
        raise AssertionError(f"the timeout of 2 s took {took:.1f} s to fire")
    os._exit(0)  # the group is broken: skip destroy_process_group


def killed_body(rank, size, path):
    init(dist, rank, size, path)
    torch.manual_seed(0)
    net = DDP(torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)),
              bucket_cap_mb=0.01)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    start = None
    try:
        for step in range(100000):
            if rank == 1 and step == 20:
                os.kill(os.getpid(), signal.SIGKILL)
            if step == 20:
                start = time.monotonic()
            net(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
    except RuntimeError as e:
        took = time.monotonic() - (start or time.monotonic())
        msg = str(e)
        print(f"test_fault: rank {rank} raised {took:.1f} s after rank 1 died: {msg.splitlines()[0][:200]}")
        if "rank 1" not in msg:
            raise AssertionError(f"the error does not name the dead rank: {msg}") from e
        # Stay a while: a survivor that left at once would be the first dead rank the other survivor
        # finds (seen under a load average of 375: "rank 0 has exited while rank 2 was waiting").
        time.sleep(3)
        os._exit(0)
    raise AssertionError("training went on without rank 1")


def mismatch_body(rank, size, path):
    """Ranks disagree on the count. Chorus does not compare counts across ranks (neither does NCCL):
    what this checks is that nobody hangs. Known gap, reported: the rank with the larger count may
    return without an error and with its data not reduced (measured with libchorus 0.1.0)."""
    init(dist, rank, size, path, timeout=datetime.timedelta(seconds=3))
    t = torch.ones(10 if rank == 0 else 20)
    start = time.monotonic()
    try:
        dist.all_reduce(t)
    except RuntimeError as e:
        print(f"test_fault: size mismatch: rank {rank} raised after {time.monotonic() - start:.1f} s: "
              f"{str(e).splitlines()[0][:200]}")
        os._exit(0)
    print(f"test_fault: size mismatch: rank {rank} returned without an error, data {t[:3].tolist()} "
          f"(known gap: counts are not compared across ranks)")
    time.sleep(1)  # let the other rank see this one leave
    os._exit(0)


if __name__ == "__main__":
    spawn(timeout_body, 2, timeout=60)
    spawn(killed_body, 3, timeout=90, expect={1: -signal.SIGKILL})
    spawn(mismatch_body, 2, timeout=60)
    print("PASS")
