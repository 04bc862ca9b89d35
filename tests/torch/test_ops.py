"""Every c10d operation x dtype x reduce op over the chorus backend, against closed-form values.

Usage: test_ops.py NRANKS. Rank r contributes (r + 1 + i % 3) at element i (bool: (r + i) % 2 == 0),
small integers, so every dtype, order and algorithm gives exactly the expected value.
"""
import sys
import time

from harness import check_equal, expect_error, init, require_torch, spawn

torch, dist = require_torch()

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int32, torch.int64,
          torch.uint8]
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
R = dist.ReduceOp
COUNTS = (1, 7, 1000)  # 1000: past the smallest protocol thresholds without costing time


def val(rank, n, dtype):
    i = torch.arange(n)
    if dtype == torch.bool:
        return (i + rank) % 2 == 0
    return (rank + 1 + i % 3).to(dtype)


def reduced(op, size, n, dtype):
    """The closed form of reducing val(r, n, dtype) over r < size."""
    k = torch.arange(n) % 3
    if dtype == torch.bool:
        per = [((torch.arange(n) + r) % 2 == 0) for r in range(size)]
        stack = torch.stack(per)
        if op in (R.SUM, R.MAX):
            return stack.any(0)
        return stack.all(0)  # PRODUCT, MIN
    if op == R.SUM:
        e = size * (size + 1) // 2 + size * k
    elif op == R.PRODUCT:
        e = torch.ones(n, dtype=torch.int64)
        for r in range(size):
            e = e * (r + 1 + k)
    elif op == R.MIN:
        e = 1 + k
    elif op == R.MAX:
        e = size + k
    elif op == R.AVG:
        s = size * (size + 1) // 2 + size * k
        if dtype in FLOATS:
            return (s.to(torch.float64) / size).to(dtype)
        e = s // size
    return e.to(dtype)


def ops_for(dtype):
    if dtype == torch.bool:
        return [R.SUM, R.PRODUCT, R.MIN, R.MAX]
    return [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.AVG]


def check_allreduce(rank, size):
    for dtype in DTYPES + [torch.bool]:
        for op in ops_for(dtype):
            for n in COUNTS:
                t = val(rank, n, dtype)
                dist.all_reduce(t, op=op)
                want = reduced(op, size, n, dtype)
                if op == R.AVG and dtype in FLOATS:  # sum * (1/n), as NCCL does: within 1 ulp-ish
                    tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6
                    if not torch.allclose(t.double(), want.double(), rtol=tol, atol=0):
                        raise AssertionError(f"all_reduce AVG {dtype} n={n}: {t[:6].tolist()} vs {want[:6].tolist()}")
                    continue
                check_equal(torch, t, want, f"all_reduce {dtype} {op} n={n}")
        # a column of a matrix: strided, not contiguous
        m = torch.stack([val(rank, 6, dtype)] * 4, 1).contiguous()  # [6, 4]
        col = m[:, 2]
        assert not col.is_contiguous()
        dist.all_reduce(col, op=R.MAX)
        check_equal(torch, m[:, 2], reduced(R.MAX, size, 6, dtype), f"all_reduce non-contiguous {dtype}")
        check_equal(torch, m[:, 1], val(rank, 6, dtype), f"all_reduce non-contiguous {dtype}: neighbours")
        # asynchronous, several in flight
        ts = [val(rank, 100, dtype) for _ in range(4)]
        works = [dist.all_reduce(t, op=R.MAX, async_op=True) for t in ts]
        for w, t in zip(works, ts):
            w.wait()
            check_equal(torch, t, reduced(R.MAX, size, 100, dtype), f"async all_reduce {dtype}")
    for dtype in FLOATS:
        t = val(rank, 10, dtype)
        premul = dist._make_nccl_premul_sum(2.0)
        if not hasattr(premul, "factor"):  # older torch keeps the factor out of Python's reach
            expect_error(lambda: dist.all_reduce(t, op=premul), ["PREMUL_SUM", "factor"], "PREMUL_SUM")
            continue
        dist.all_reduce(t, op=premul)
        check_equal(torch, t, (2 * reduced(R.SUM, size, 10, torch.int64)).to(dtype), f"PREMUL_SUM {dtype}")
        t = val(rank, 10, dtype)
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(3.0), async_op=True).wait()
        check_equal(torch, t, (3 * reduced(R.SUM, size, 10, torch.int64)).to(dtype), f"async PREMUL_SUM {dtype}")
        inp = torch.cat([val(rank, 4, dtype)] * size)
        out = torch.zeros(4, dtype=dtype)
        dist.reduce_scatter_tensor(out, inp, op=dist._make_nccl_premul_sum(2.0))
        check_equal(torch, out, (2 * reduced(R.SUM, size, 4, torch.int64)).to(dtype), f"PREMUL_SUM reduce_scatter {dtype}")
        check_equal(torch, inp, torch.cat([val(rank, 4, dtype)] * size), f"PREMUL_SUM leaves the input {dtype}")
    c = torch.complex(val(rank, 5, torch.float32), -val(rank, 5, torch.float32))
    dist.all_reduce(c)
    s = reduced(R.SUM, size, 5, torch.float32)
    check_equal(torch, c, torch.complex(s, -s), "all_reduce complex64")
    for op in (R.BAND, R.BOR, R.BXOR):
        expect_error(lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32), op=op), ["not supported"], f"{op}")
    expect_error(lambda: dist.all_reduce(torch.ones(4, dtype=torch.int16)), ["unsupported", "int16"], "int16")


def check_rooted(rank, size):
    for dtype in DTYPES + [torch.bool]:
        for root in range(size):
            t = val(rank, 50, dtype)
            dist.broadcast(t, root)
            check_equal(torch, t, val(root, 50, dtype), f"broadcast {dtype} root {root}")
        m = torch.stack([val(rank, 5, dtype)] * 3, 1).contiguous()
        dist.broadcast(m[:, 0], 0)
        check_equal(torch, m[:, 0], val(0, 5, dtype), f"broadcast non-contiguous {dtype}")
        check_equal(torch, m[:, 1], val(rank, 5, dtype), f"broadcast non-contiguous {dtype}: neighbours")
        for op in ops_for(dtype)[:4]:
            root = size - 1
            t = val(rank, 20, dtype)
            dist.reduce(t, root, op=op)
            want = reduced(op, size, 20, dtype) if rank == root else val(rank, 20, dtype)
            check_equal(torch, t, want, f"reduce {dtype} {op}")
        root = size // 2
        g = [torch.zeros(4, dtype=dtype) for _ in range(size)] if rank == root else None
        dist.gather(val(rank, 4, dtype), g, dst=root)
        if rank == root:
            for r in range(size):
                check_equal(torch, g[r], val(r, 4, dtype), f"gather {dtype} from {r}")
        out = torch.zeros(4, dtype=dtype)
        dist.scatter(out, [val(r, 4, dtype) for r in range(size)] if rank == root else None, src=root)
        check_equal(torch, out, val(rank, 4, dtype), f"scatter {dtype}")


def check_gather_scatter(rank, size):
    for dtype in DTYPES + [torch.bool]:
        n = 6
        outs = [torch.zeros(n, dtype=dtype) for _ in range(size)]
        dist.all_gather(outs, val(rank, n, dtype))
        for r in range(size):
            check_equal(torch, outs[r], val(r, n, dtype), f"all_gather {dtype} [{r}]")
        flat = torch.zeros(size * n, dtype=dtype)
        dist.all_gather_into_tensor(flat, val(rank, n, dtype))
        check_equal(torch, flat, torch.cat([val(r, n, dtype) for r in range(size)]), f"all_gather_into_tensor {dtype}")
        stacked = torch.zeros(size, n, dtype=dtype)
        dist.all_gather_into_tensor(stacked, val(rank, n, dtype))
        check_equal(torch, stacked, torch.stack([val(r, n, dtype) for r in range(size)]), f"all_gather stacked {dtype}")
        # non-contiguous output: a transposed [n, size] view of a [size, n] buffer
        buf = torch.zeros(n, size, dtype=dtype)
        dist.all_gather_into_tensor(buf.t(), val(rank, n, dtype)[None].expand(1, n)[0])
        check_equal(torch, buf.t(), torch.stack([val(r, n, dtype) for r in range(size)]), f"all_gather non-contig {dtype}")
        if dtype == torch.bool:
            continue
        for op in (R.SUM, R.MAX):
            out = torch.zeros(n, dtype=dtype)
            dist.reduce_scatter(out, [val(rank, n, dtype) + p for p in range(size)], op=op)
            want = reduced(op, size, n, torch.int64) + (size * rank if op == R.SUM else rank)
            check_equal(torch, out, want.to(dtype), f"reduce_scatter {dtype} {op}")
            inp = torch.cat([val(rank, n, dtype) + p for p in range(size)])
            out = torch.zeros(n, dtype=dtype)
            dist.reduce_scatter_tensor(out, inp, op=op)
            check_equal(torch, out, want.to(dtype), f"reduce_scatter_tensor {dtype} {op}")
    # uneven lists, as ProcessGroupNCCL takes them: rank r's part has r + 1 elements
    for dtype in (torch.float32, torch.int64):
        outs = [torch.zeros(r + 1, dtype=dtype) for r in range(size)]
        dist.all_gather(outs, torch.full((rank + 1,), 10 * rank + 1).to(dtype))
        for r in range(size):
            check_equal(torch, outs[r], torch.full((r + 1,), 10 * r + 1).to(dtype), f"uneven all_gather {dtype} [{r}]")
        for op in (R.SUM, R.MAX):
            out = torch.zeros(rank + 1, dtype=dtype)
            dist.reduce_scatter(out, [torch.full((p + 1,), 10 * rank + p).to(dtype) for p in range(size)], op=op)
            want = 10 * size * (size - 1) // 2 + size * rank if op == R.SUM else 10 * (size - 1) + rank
            check_equal(torch, out, torch.full((rank + 1,), want).to(dtype), f"uneven reduce_scatter {dtype} {op}")
    outs = [torch.zeros(r + 1, 2)[:, 1] for r in range(size)]
    w = dist.all_gather(outs, torch.full((rank + 1,), float(rank)), async_op=True)
    w.wait()
    for r in range(size):
        check_equal(torch, outs[r], torch.full((r + 1,), float(r)), f"uneven async all_gather, strided [{r}]")


def check_all_to_all(rank, size):
    for dtype in DTYPES:
        n = 3
        # rank r sends block p = (10 r + p) to rank p: rank p receives (10 r + p) from every r
        inp = torch.cat([torch.full((n,), 10 * rank + p) for p in range(size)]).to(dtype)
        out = torch.zeros(size * n, dtype=dtype)
        dist.all_to_all_single(out, inp)
        want = torch.cat([torch.full((n,), 10 * r + rank) for r in range(size)]).to(dtype)
        check_equal(torch, out, want, f"all_to_all_single {dtype}")
        # uneven: rank r sends p + 1 rows of width 2 to rank p, valued 10 r + p
        in_splits = [p + 1 for p in range(size)]
        out_splits = [rank + 1] * size
        inp = torch.cat([torch.full((p + 1, 2), 10 * rank + p) for p in range(size)]).to(dtype)
        out = torch.zeros(sum(out_splits), 2, dtype=dtype)
        dist.all_to_all_single(out, inp, out_splits, in_splits)
        want = torch.cat([torch.full((rank + 1, 2), 10 * r + rank) for r in range(size)]).to(dtype)
        check_equal(torch, out, want, f"all_to_all_single splits {dtype}")
        outs = [torch.zeros(r + 1, dtype=dtype) for r in range(size)]
        dist.all_to_all(outs, [torch.full((rank + 1,), 10 * rank + p).to(dtype) for p in range(size)])
        for r in range(size):
            check_equal(torch, outs[r], torch.full((r + 1,), 10 * r + rank).to(dtype), f"all_to_all {dtype} [{r}]")


def check_p2p(rank, size):
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    for dtype in DTYPES:
        if rank % 2 == 0:
            dist.send(val(rank, 9, dtype), nxt)
            t = torch.zeros(9, dtype=dtype)
            dist.recv(t, prv)
        else:
            t = torch.zeros(9, dtype=dtype)
            dist.recv(t, prv)
            dist.send(val(rank, 9, dtype), nxt)
        check_equal(torch, t, val(prv, 9, dtype), f"send/recv {dtype}")
    # both directions at once, large enough that unbatched sends would wait on each other
    n = 1 << 20
    a, b = torch.full((n,), float(rank)), torch.zeros(n)
    c, d = torch.full((n,), float(-rank)), torch.zeros(n)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, a, nxt), dist.P2POp(dist.irecv, b, prv),
                                   dist.P2POp(dist.isend, c, prv), dist.P2POp(dist.irecv, d, nxt)])
    for q in reqs:
        q.wait()
    check_equal(torch, b, torch.full((n,), float(prv)), "batch_isend_irecv forward")
    check_equal(torch, d, torch.full((n,), float(-nxt)), "batch_isend_irecv backward")
    t = torch.zeros(4)
    if rank == 0:
        works = [dist.isend(torch.full((4,), float(p)), p) for p in range(1, size)]
        for w in works:
            w.wait()
    else:
        dist.irecv(t, 0).wait()
        check_equal(torch, t, torch.full((4,), float(rank)), "isend/irecv")
    m = torch.zeros(4, 3)
    if rank == 0:
        dist.send(torch.arange(4.0), 1)
    elif rank == 1:
        dist.recv(m[:, 1], 0)
        check_equal(torch, m[:, 1], torch.arange(4.0), "recv into a non-contiguous tensor")
    expect_error(lambda: dist.recv(torch.zeros(1)), ["any source"], "recv from any source")


def check_coalesced_and_async(rank, size):
    ts = [val(rank, n, torch.float32) for n in (3, 5, 7)]
    dist.all_reduce_coalesced(ts)
    for t, n in zip(ts, (3, 5, 7)):
        check_equal(torch, t, reduced(R.SUM, size, n, torch.float32), "all_reduce_coalesced")
    ts = [val(rank, 4, torch.float64) for _ in range(3)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t, op=R.MAX)
    cm.wait()
    for t in ts:
        check_equal(torch, t, reduced(R.MAX, size, 4, torch.float64), "coalescing manager all_reduce")
    outs = [torch.zeros(size * 2) for _ in range(2)]
    with dist._coalescing_manager():
        for o in outs:
            dist.all_gather_into_tensor(o, val(rank, 2, torch.float32))
    for o in outs:
        check_equal(torch, o, torch.cat([val(r, 2, torch.float32) for r in range(size)]), "coalesced all_gather")
    # futures and their callbacks (what DDP's comm hooks use)
    t = val(rank, 8, torch.float32)
    fut = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    check_equal(torch, fut.wait(), 2 * reduced(R.SUM, size, 8, torch.float32), "future .then")
    # a synchronous call after asynchronous ones keeps the order
    a = val(rank, 1000, torch.float32)
    w = dist.all_reduce(a, async_op=True)
    b = a.clone()
    dist.broadcast(b, 0)
    w.wait()
    check_equal(torch, a, reduced(R.SUM, size, 1000, torch.float32), "async then sync")
    dist.barrier()
    dist.barrier(async_op=True).wait()
    # polling: Work.is_completed(), where torch forwards it to the backend's Work: ProcessGroup mode
    # (older torch) and the C++ Backend (_cbackend); only a bare Python Backend subclass gets torch's
    # wrapper, which answers False forever (CHORUS_TORCH_CPP=0 or no C++ build): poll its future there.
    w = dist.all_reduce(torch.ones(100), async_op=True)
    from torch_chorus import _engine as chorus_engine
    from torch_chorus import backend as chorus_backend
    polls = chorus_engine.AS_PROCESS_GROUP or chorus_backend._cext is not None
    done = (lambda: w.is_completed()) if polls else (lambda: w.get_future().done())
    deadline = time.monotonic() + 60
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError("an asynchronous all_reduce never completed")
        time.sleep(0.001)
    w.wait()


def check_subgroups(rank, size):
    ends = dist.new_group([0, size - 1])
    if rank in (0, size - 1):
        t = torch.full((3,), float(rank))
        dist.all_reduce(t, group=ends)
        check_equal(torch, t, torch.full((3,), float(size - 1)), "subgroup all_reduce")
        outs = [torch.zeros(1) for _ in range(2)]
        dist.all_gather(outs, torch.full((1,), float(rank)), group=ends)
        check_equal(torch, torch.cat(outs), torch.tensor([0.0, float(size - 1)]), "subgroup all_gather")
    evens = [r for r in range(size) if r % 2 == 0]
    groups = [dist.new_group(evens), dist.new_group([r for r in range(size) if r % 2])]
    mine = groups[rank % 2]
    t = torch.ones(2)
    dist.all_reduce(t, group=mine)
    check_equal(torch, t, torch.full((2,), float(len(evens) if rank % 2 == 0 else size - len(evens))), "split groups")
    t = torch.ones(2)
    dist.all_reduce(t)  # the world group still works after the subgroups
    check_equal(torch, t, torch.full((2,), float(size)), "world after subgroups")


def body(rank, size, path):
    init(dist, rank, size, path)
    assert dist.get_backend() == "chorus"
    for fn in (check_allreduce, check_rooted, check_gather_scatter, check_all_to_all, check_p2p,
               check_coalesced_and_async, check_subgroups):
        fn(rank, size)
        dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(f"test_ops: {size} ranks: all operations correct")


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    spawn(body, n)
    print("PASS")
