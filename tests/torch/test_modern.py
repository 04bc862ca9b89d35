"""torch's newer process-group surface over chorus: split_group, new_group with
use_local_synchronization, and monitored_barrier, each beside Gloo where Gloo runs it.

Usage: test_modern.py [NRANKS] (at least 3: one rank stays away from a monitored barrier while two come).
Values are small integers, so every sum is exact and compared bit for bit.
"""
import datetime
import os
import sys
import time

from harness import check_equal, init, require_torch, spawn

torch, dist = require_torch()


def summed(group_ranks, n=5):
    """all_reduce(SUM) of (rank + 1 + i) over the global ranks of a group."""
    return sum(torch.arange(n, dtype=torch.float32) + r + 1 for r in group_ranks)


def check_group(pg, global_ranks, rank, what):
    t = torch.arange(5, dtype=torch.float32) + rank + 1
    dist.all_reduce(t, group=pg)
    check_equal(torch, t, summed(global_ranks), what)
    # The order: group rank i is global_ranks[i].
    got = [torch.zeros(1, dtype=torch.int64) for _ in global_ranks]
    dist.all_gather(got, torch.tensor([rank]), group=pg)
    if [int(g) for g in got] != list(global_ranks):
        raise AssertionError(f"{what}: the group's ranks in order are {[int(g) for g in got]}, expected {global_ranks}")
    if dist.get_world_size(pg) != len(global_ranks) or dist.get_rank(pg) != global_ranks.index(rank):
        raise AssertionError(f"{what}: group rank {dist.get_rank(pg)} of {dist.get_world_size(pg)}, expected "
                             f"{global_ranks.index(rank)} of {len(global_ranks)}")


def splits(rank, size, path):
    init(dist, rank, size, path)
    gloo = dist.new_group(backend="gloo")
    if not dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu")).supports_splitting:
        raise AssertionError("chorus does not say it supports splitting")
    # Singletons: each rank alone, with a timeout of their own (torch hands it in the backend's options).
    single = dist.split_group(split_ranks=[[r] for r in range(size)], timeout=datetime.timedelta(seconds=77))
    check_group(single, [rank], rank, "split_group into singletons")
    got = single._get_backend(torch.device("cpu")).options._timeout
    if got != datetime.timedelta(seconds=77):
        raise AssertionError(f"split_group(timeout=77 s): the child's timeout is {got}")
    # One group of every rank, in reverse order (split_group keeps the order given: group rank = position).
    every = list(reversed(range(size)))
    whole = dist.split_group(split_ranks=[every])
    check_group(whole, every, rank, "split_group into one group of all ranks")
    # Two groups, and a rank in none (it gets no group and takes part in the split all the same). Only
    # torch_chorus's C++ front can tell torch "no group": torch 2.15's trampoline for a Python Backend
    # crashes on it, so the Python engine refuses that case with a message (checked below).
    front = type(dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))).__name__ == "ChorusCBackend"
    groups = [[0, 1], list(range(2, size - 1))] if size > 3 else [[0, 1]]
    if not front:
        groups = [list(range(size // 2)), list(range(size // 2, size))]
    part = dist.split_group(split_ranks=groups)
    mine = next((g for g in groups if rank in g), None)
    if mine is None:
        if part is not dist.GroupMember.NON_GROUP_MEMBER and part is not None:
            raise AssertionError("a rank in no split group got a group")
    else:
        check_group(part, mine, rank, f"split_group {groups}")
    # A child of a child.
    grand = dist.split_group(parent_pg=whole, split_ranks=[[0], list(range(1, size))])
    check_group(grand, [every[0]] if rank == every[0] else every[1:], rank, "split of a split group")
    # The parent still works after its splits, and each child is independent of the others.
    check_group(None, list(range(size)), rank, "the parent after its splits")
    # The same sums over a Gloo group, as the reference.
    t = torch.arange(5, dtype=torch.float32) + rank + 1
    dist.all_reduce(t, group=gloo)
    check_equal(torch, t, summed(range(size)), "gloo all_reduce beside chorus")
    # new_group with use_local_synchronization: only the members call it (last: the ranks' group
    # counts differ afterwards, so no group is made on every rank after it).
    if rank in (0, size - 1):
        local = dist.new_group([0, size - 1], use_local_synchronization=True)
        check_group(local, [0, size - 1], rank, "new_group(use_local_synchronization=True)")
    dist.barrier()
    dist.destroy_process_group()


def bound(rank, size, path):
    """A default group bound to a device (init_process_group(device_id=...)) makes torch create new
    groups by splitting it, and ask the ranks outside a new group to take part (perform_nocolor_split)."""
    init(dist, rank, size, path, device_id=torch.device("cpu", 0))
    g = dist.new_group([0, 1])
    if rank in (0, 1):
        check_group(g, [0, 1], rank, "new_group([0, 1]) of a device-bound default group")
    check_group(None, list(range(size)), rank, "the device-bound default group")
    dist.destroy_process_group()


def barriers(rank, size, path, backend):
    init(dist, rank, size, path, backend=backend)
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))  # everyone present
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30), wait_all_ranks=True)
    absent = list(range(2, size))  # ranks 0 and 1 come; the others stay away
    timeout = datetime.timedelta(seconds=3)
    verdicts = []
    for wait_all in (False, True):
        if rank in absent:
            time.sleep(timeout.total_seconds() + 2)  # stays away from this barrier
        else:
            t0 = time.monotonic()
            try:
                dist.monitored_barrier(timeout=timeout, wait_all_ranks=wait_all)
            except RuntimeError as e:
                took = time.monotonic() - t0
                msg = str(e)
                if rank == 0:
                    named = absent if wait_all else absent[:1]
                    if any(str(r) not in msg for r in named) or took > timeout.total_seconds() + 5:
                        raise AssertionError(f"{backend}: rank 0 raised after {took:.1f} s: {msg}")
                    if backend == "chorus":
                        who = f"rank {named[0]}" if len(named) == 1 else "ranks " + ", ".join(map(str, named))
                        if who not in msg or "stall report" not in msg:
                            raise AssertionError(f"chorus: rank 0's error does not name {who} with its state: {msg}")
                    print(f"{backend} rank 0 (wait_all_ranks={wait_all}): {msg}")
                elif backend == "chorus" and (f"{absent[0]}" not in msg or "did not arrive" not in msg):
                    # The ranks that came raise rank 0's verdict, not a timeout of their own.
                    raise AssertionError(f"chorus: rank {rank} raised something else than rank 0's verdict: {msg}")
                verdicts.append(msg)
            else:
                if rank == 0:
                    raise AssertionError(f"{backend}: monitored_barrier passed with ranks {absent} absent")
        if backend != "chorus":
            # Gloo's group is broken after a failed monitored barrier (its pairs close): its rank 0 has
            # raised naming the absent rank, which is what it is compared for; leave without teardown.
            sys.stdout.flush()
            os._exit(0)
        # Chorus's communicator is untouched by the failed barrier: it works on.
        check_group(None, list(range(size)), rank, "all_reduce after a failed monitored barrier")
    if backend == "chorus":
        # Barriers are matched by count: the absent ranks' two late calls get the two verdicts at once,
        # and then a barrier of everyone passes.
        if rank in absent:
            for k in range(2):
                t0 = time.monotonic()
                try:
                    dist.monitored_barrier(timeout=timeout)
                except RuntimeError as e:
                    if "did not arrive" not in str(e) or time.monotonic() - t0 > 2:
                        raise AssertionError(f"late call {k}: {e}")
                else:
                    raise AssertionError(f"late call {k} to a failed monitored barrier passed")
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=30), wait_all_ranks=True)
    dist.destroy_process_group()


def main():
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    if size < 3:
        raise SystemExit("test_modern.py needs 3 ranks or more")
    spawn(splits, size)
    spawn(bound, size)
    print(f"split_group and new_group(use_local_synchronization) on {size} ranks: OK")
    spawn(barriers, size, "gloo", timeout=60)
    spawn(barriers, size, "chorus")
    print(f"monitored_barrier on {size} ranks, beside gloo's: OK")


if __name__ == "__main__":
    main()
