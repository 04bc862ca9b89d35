"""torch's shrink_group on the chorus backend (torch 2.10+; the C++ front answers supports_shrinking):
the survivors of a group shrink a rank away with one ncclCommShrink and go on, (1) a rank that is alive
and left out by agreement, (2) a rank killed (SIGKILL) in the middle of training-like all_reduces: the
survivors' call raises naming it, they shrink with SHRINK_ABORT and their next all_reduces are right.

Usage: test_shrink.py [NRANKS]   (NRANKS >= 3; the last rank is the one left out)
"""
import os
import signal
import sys
import time

from harness import SKIP, init, require_torch, spawn

torch, dist = require_torch()
import torch_chorus  # noqa: E402
from torch.distributed import distributed_c10d as c10d  # noqa: E402


def shrink_supported():
    if not hasattr(dist, "shrink_group"):
        return "this torch has no dist.shrink_group (torch 2.10+)"
    if torch_chorus.engine() != "c++":
        return "the C++ front is not loaded (shrinking is a C++ Backend virtual)"
    return None


def agreed(rank, size, path):
    init(dist, rank, size, path)
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    assert t[0].item() == size * (size + 1) / 2
    last = size - 1
    store = c10d._get_default_store()
    if rank == last:  # left out: stays until the others are done with the shrunk group
        store.wait(["shrunk-done"])
        os._exit(0)
    g = dist.shrink_group([last])
    assert g.size() == size - 1 and g.rank() == rank, (g.size(), g.rank())
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)  # the new default group
    want = (size - 1) * size / 2
    assert t[0].item() == want, f"after shrink: {t[0].item()} != {want}"
    if rank == 0:
        store.set("shrunk-done", "1")
    dist.destroy_process_group()


def killed(rank, size, path):
    init(dist, rank, size, path)
    last = size - 1
    t = torch.ones(1 << 16)
    for step in range(1000):
        if rank == last and step == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            dist.all_reduce(t.fill_(1.0))
        except RuntimeError as e:
            assert str(last) in str(e), f"the error does not name rank {last}: {e}"
            break
        assert t[0].item() == size
    else:
        raise AssertionError("the killed rank was never noticed")
    g = dist.shrink_group([last], shrink_flags=c10d.SHRINK_ABORT)
    assert g.size() == size - 1
    for _ in range(5):
        dist.all_reduce(t.fill_(2.0))
        assert t[0].item() == 2 * (size - 1), t[0].item()
    dist.destroy_process_group()


if __name__ == "__main__":
    why = shrink_supported()
    if why:
        print(f"SKIP: {why}")
        sys.exit(SKIP)
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    spawn(agreed, n)
    spawn(killed, n, expect={n - 1: -signal.SIGKILL})
    print("PASS")
