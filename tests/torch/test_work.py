"""The backend's Work and its edge cases, on 2 ranks (each case its own process group: some break it).

- a failed operation raises from Work.wait(), and so from a blocking dist.recv;
- Work.wait(timeout=...) raises when time runs out and waits when it is enough;
- PREMUL_SUM on a non-floating tensor is refused on every rank (TypeError naming the dtype);
- an exception inside batch_isend_irecv or a _coalescing_manager leaves later calls running;
- a copy-back that fails fails its own Work, the others complete;
- copies of inputs (non-contiguous, PREMUL_SUM) follow issue order after asynchronous calls;
- creating a group's communicator honours the group's timeout.
Run with and without the C++ front (CHORUS_TORCH_CPP=0): both return the backend's own Work.
"""
import datetime
import os
import threading
import time

from harness import check_equal, expect_error, init, require_torch, spawn

torch, dist = require_torch()
SEC = datetime.timedelta(seconds=1)


def warm_up():
    t = torch.ones(2)
    dist.all_reduce(t)  # connects the ranks: later calls wait only on the peer


def failed_wait_body(rank, size, path):
    init(dist, rank, size, path, timeout=3 * SEC)
    warm_up()
    if rank == 1:
        time.sleep(10)  # alive but silent: never sends
        os._exit(0)
    t = torch.full((4,), -7.0)
    start = time.monotonic()
    expect_error(lambda: dist.recv(t, src=1), ["chorus"], "blocking recv from a silent peer")
    took = time.monotonic() - start
    if took > 9:
        raise AssertionError(f"recv raised after {took:.1f} s with a 3 s timeout")
    w = dist.all_reduce(torch.ones(4), async_op=True)
    expect_error(w.wait, ["chorus"], "wait() of an async all_reduce on a failed group")
    print(f"test_work: a failed recv raised after {took:.1f} s; wait() of a failed Work raises")
    os._exit(0)


def wait_timeout_body(rank, size, path):
    init(dist, rank, size, path)
    warm_up()
    if rank == 1:
        time.sleep(2)  # joins late
    t = torch.ones(8)
    w = dist.all_reduce(t, async_op=True)
    if rank == 0:
        start = time.monotonic()
        expect_error(lambda: w.wait(timeout=datetime.timedelta(milliseconds=300)), ["did not complete"],
                     "wait(timeout) before the peer joins")
        took = time.monotonic() - start
        if not 0.2 < took < 1.5:
            raise AssertionError(f"wait(timeout=0.3 s) raised after {took:.2f} s")
    if w.wait(timeout=60 * SEC) is not True:
        raise AssertionError("wait(timeout) of a completed Work did not return True")
    check_equal(torch, t, torch.full((8,), 2.0), "all_reduce after a timed-out wait")
    if dist.all_reduce(torch.ones(1), async_op=True).wait(timeout=30 * SEC) is not True:
        raise AssertionError("wait(timeout) did not return True")
    dist.destroy_process_group()


def premul_body(rank, size, path):
    init(dist, rank, size, path)
    for dtype in (torch.int8, torch.uint8, torch.int32, torch.int64):
        t = torch.full((4,), rank + 1, dtype=dtype)
        op = dist._make_nccl_premul_sum(2.0)
        for what, fn in (("all_reduce", lambda: dist.all_reduce(t, op=op)),
                         ("async all_reduce", lambda: dist.all_reduce(t, op=op, async_op=True)),
                         ("reduce", lambda: dist.reduce(t, 0, op=op)),
                         ("reduce_scatter_tensor",
                          lambda: dist.reduce_scatter_tensor(t[:2], t, op=op))):
            try:
                fn()
            except TypeError as e:
                if str(dtype) not in str(e):
                    raise AssertionError(f"PREMUL_SUM {what} {dtype}: the error does not name it: {e}") from e
                continue
            raise AssertionError(f"PREMUL_SUM {what} {dtype}: not refused, got {t.tolist()}")
        check_equal(torch, t, torch.full((4,), rank + 1, dtype=dtype), f"PREMUL_SUM {dtype} left the tensor")
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0))
    check_equal(torch, t, torch.full((4,), 6.0), "PREMUL_SUM float32 after the refusals")
    dist.destroy_process_group()


def check_group_runs(rank, what):
    t = torch.ones(3)
    dist.all_reduce(t)
    check_equal(torch, t, torch.full((3,), 2.0), f"all_reduce after {what}")
    x = torch.full((2,), float(rank))
    dist.broadcast(x, src=1)
    check_equal(torch, x, torch.ones(2), f"broadcast after {what}")
    dist.barrier()


def batch_raise_body(rank, size, path):
    init(dist, rank, size, path, timeout=10 * SEC)
    peer = 1 - rank
    s, r = torch.ones(4, dtype=torch.int16), torch.zeros(4, dtype=torch.int16)
    expect_error(lambda: dist.batch_isend_irecv([dist.P2POp(dist.isend, s, peer), dist.P2POp(dist.irecv, r, peer)]),
                 ["int16"], "batch_isend_irecv of int16")
    check_group_runs(rank, "a batch_isend_irecv that raised")
    # a batch whose second op raises: the first, queued, never runs, and says so
    ok, bad = torch.ones(4), torch.zeros(4, dtype=torch.int16)
    expect_error(lambda: dist.batch_isend_irecv([dist.P2POp(dist.isend, ok, peer), dist.P2POp(dist.irecv, bad, peer)]),
                 ["int16"], "batch_isend_irecv whose second op is int16")
    check_group_runs(rank, "a half-queued batch that raised")
    try:
        with dist._coalescing_manager(device=torch.device("cpu")):
            dist.broadcast(torch.zeros(2), src=0)
            raise ValueError("user code")
    except ValueError:
        pass
    check_group_runs(rank, "a _coalescing_manager body that raised")
    t = torch.ones(2)
    try:
        with dist._coalescing_manager():  # torch's fast-path coalescing (no device)
            dist.all_reduce(t)
            raise ValueError("user code")
    except ValueError:
        pass
    check_group_runs(rank, "a fast-path _coalescing_manager body that raised")
    # and a batch still works
    a, b = torch.full((4,), float(rank)), torch.zeros(4)
    for q in dist.batch_isend_irecv([dist.P2POp(dist.isend, a, peer), dist.P2POp(dist.irecv, b, peer)]):
        q.wait()
    check_equal(torch, b, torch.full((4,), float(peer)), "batch_isend_irecv after the failures")
    dist.destroy_process_group()


def copyback_body(rank, size, path):
    init(dist, rank, size, path)
    warm_up()
    w = dist.all_reduce(torch.ones(1).expand(4), async_op=True)  # overlapping: the copy-back cannot write it
    t2 = torch.ones(4)
    w2 = dist.all_reduce(t2, async_op=True)
    out = []

    def waiter():
        try:
            w.wait()
            out.append("returned")
        except RuntimeError as e:
            out.append(str(e))

    th = threading.Thread(target=waiter, daemon=True)
    th.start()
    th.join(30)
    if not out:
        raise AssertionError("wait() of a Work whose copy-back failed hangs")
    if "copying the result back failed" not in out[0]:
        raise AssertionError(f"wait() of a Work whose copy-back failed: {out[0]}")
    w2.wait()
    check_equal(torch, t2, torch.full((4,), 2.0), "the Work after a failed copy-back")
    expect_error(lambda: dist.all_reduce(torch.ones(1).expand(4)), ["copy"], "synchronous expanded all_reduce")
    check_group_runs(rank, "failed copy-backs")
    dist.destroy_process_group()


def order_body(rank, size, path):
    init(dist, rank, size, path)
    n = 1 << 20
    m = torch.ones(n, 2)
    col = m[:, 0]
    w = dist.all_reduce(col, async_op=True)
    dist.all_reduce(col)  # reads col after the first: 4, not 2
    w.wait()
    check_equal(torch, col, torch.full((n,), 4.0), "async then sync all_reduce of a non-contiguous column")
    check_equal(torch, m[:, 1], torch.ones(n), "the column's neighbours")
    x = torch.ones(n)
    w = dist.all_reduce(x, async_op=True)
    dist.all_reduce(x, op=dist._make_nccl_premul_sum(1.0))
    w.wait()
    check_equal(torch, x, torch.full((n,), 4.0), "async all_reduce then PREMUL_SUM")
    m = torch.ones(n, 2)
    col = m[:, 0]
    w = dist.all_reduce(col, async_op=True)  # its result is copied back on completion
    dist.all_reduce(m)  # a contiguous call over the same memory runs after that copy-back: 4, not 2
    w.wait()
    check_equal(torch, m[:, 0], torch.full((n,), 4.0), "async all_reduce of a column, then sync of its matrix")
    m = torch.ones(n, 2)
    w = dist.all_reduce(m, async_op=True)
    outs = [torch.zeros(n) for _ in range(size)]
    dist.all_gather(outs, m[:, 1])  # a non-contiguous input, written by the pending all_reduce
    w.wait()
    for o in outs:
        check_equal(torch, o, torch.full((n,), 2.0), "all_gather of a column after an async all_reduce")
    dist.destroy_process_group()


def cross_group_body(rank, size, path):
    """Asynchronous calls never wait for earlier ones: rank 0 queues two on the world group (the second
    stages a copy of a column) before a synchronous call on group B, which rank 1 makes first. When
    the staging waited for the first call, rank 0 waited for rank 1 and rank 1 for rank 0 (NCCL runs
    this program)."""
    init(dist, rank, size, path)
    b = dist.new_group([0, 1])
    warm_up()  # a communicator's first call connects it, on the calling thread: both before the test
    dist.all_reduce(torch.ones(1), group=b)
    n = 1 << 16
    m = torch.ones(n, 2)
    y = torch.ones(4)
    t0 = time.monotonic()
    if rank == 0:
        w1 = dist.all_reduce(m, async_op=True)
        w2 = dist.all_reduce(m[:, 1], async_op=True)
        dist.all_reduce(y, group=b)
    else:
        dist.all_reduce(y, group=b)
        w1 = dist.all_reduce(m, async_op=True)
        w2 = dist.all_reduce(m[:, 1], async_op=True)
    w1.wait()
    w2.wait()
    took = time.monotonic() - t0
    if took > 3:
        raise AssertionError(f"rank {rank}: the calls took {took:.1f} s: an asynchronous call waited")
    check_equal(torch, y, torch.full((4,), 2.0), "group B's all_reduce")
    check_equal(torch, m[:, 0], torch.full((n,), 2.0), "the matrix's first column")
    dist.destroy_process_group()


def init_timeout_body(rank, size, path):
    init(dist, rank, size, path)
    warm_up()
    if rank == 1:
        time.sleep(8)  # never joins the new group
        os._exit(0)
    start = time.monotonic()
    expect_error(lambda: dist.new_group([0, 1], timeout=2 * SEC), ["timeout"], "new_group without rank 1")
    took = time.monotonic() - start
    print(f"test_work: new_group(timeout=2 s) without a member raised after {took:.1f} s")
    if took > 6:
        raise AssertionError(f"new_group(timeout=2 s) raised after {took:.1f} s")
    os._exit(0)


if __name__ == "__main__":
    for body in (failed_wait_body, wait_timeout_body, premul_body, batch_raise_body, copyback_body, order_body,
                 cross_group_body,
                 init_timeout_body):
        spawn(body, 2, timeout=90)
    print("PASS")
