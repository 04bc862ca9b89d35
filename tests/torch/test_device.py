"""The chorus backend on device tensors, without a GPU: the stand-in driver's device memory as tensors.

The backend's CUDA row (torch_chorus/device.py) takes torch.cuda's tensors; this machine has none, so
a row over the stand-in driver (tests/cuda_stub) takes its place: CPU tensors over memory the driver
allocated, which libchorus sees as device memory, and the driver's streams and events. Every c10d
operation then goes through the device path (device_ops.py) into libchorus's GPU path (kernels on the
stand-in's streams), as a CUDA tensor's would. Checked on 2 and 3 processes:
- every collective, send/recv and batch_isend_irecv, values in closed form;
- an asynchronous call is queued on the current stream and returns at once: is_completed() is false
  while the stream is held, wait() makes another stream wait for it, and the results are right;
- what ProcessGroupNCCL refuses is refused with a message: non-contiguous tensors, a CPU tensor
  beside a device tensor.
What needs a real GPU (torch.cuda's streams and events, DDP on CUDA tensors) runs in
tests/torch/gpu_chorus_smoke.py on the device machine.
"""
import ctypes
import os
import sys

from harness import SKIP, check_equal, expect_error, init, require_torch, spawn

FAKE = os.environ.get("CHORUS_TEST_FAKE_CUDA")
if not FAKE or not os.path.exists(FAKE):
    print(f"SKIP: CHORUS_TEST_FAKE_CUDA ({FAKE}) is not the stand-in driver")
    sys.exit(SKIP)
os.environ["CHORUS_CUDA_LIBRARY"] = FAKE
torch, dist = require_torch()
import torch_chorus  # noqa: E402
from torch_chorus import backend, device  # noqa: E402


class StandIn:
    """A device row over the stand-in driver (device.py's interface). `current` is the stream calls go
    on, as torch.cuda.current_stream() would be."""

    host_memory = True

    def __init__(self):
        cu = self.cu = ctypes.CDLL(FAKE)  # the same handle libchorus opens: one driver state
        assert cu.cuInit(0) == 0
        ctx = ctypes.c_void_p()
        assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0 and cu.cuCtxSetCurrent(ctx) == 0
        self.ranges = []
        self.keep = []  # scratch buffers stay until the test ends (the stand-in has no stream-ordered free)
        self.current = self.new_stream()

    def new_stream(self):
        s = ctypes.c_void_p()
        assert self.cu.cuStreamCreate(ctypes.byref(s), 0) == 0
        return s

    def claims(self, t):
        p = t.data_ptr()
        return any(lo <= p < hi for lo, hi in self.ranges)

    def stream(self, t):
        return self.current.value

    def empty(self, n, dtype, like=None):
        size = torch.empty(0, dtype=dtype).element_size()
        p = ctypes.c_uint64()
        assert self.cu.cuMemAlloc_v2(ctypes.byref(p), max(1, n * size)) == 0
        self.ranges.append((p.value, p.value + max(1, n * size)))
        buf = (ctypes.c_char * max(size, n * size)).from_address(p.value)
        t = torch.frombuffer(buf, dtype=dtype)[:n]
        self.keep.append(t)
        return t

    def tensor(self, values, dtype=torch.float32):
        src = torch.as_tensor(values, dtype=dtype)
        t = self.empty(src.numel(), dtype).view(src.shape)
        t.copy_(src)
        return t

    def guard(self, t):
        import contextlib
        return contextlib.nullcontext()  # the stand-in's one context is current on this thread already

    def hold(self, tensors, t):
        pass  # scratch buffers are kept until the test ends

    def host_order(self, t=None):
        assert self.cu.cuStreamSynchronize(self.current) == 0

    def record(self, t):
        ev = ctypes.c_void_p()
        assert self.cu.cuEventCreate(ctypes.byref(ev), 0) == 0
        assert self.cu.cuEventRecord(ev, self.current) == 0
        return ev

    def query(self, ev):
        return self.cu.cuEventQuery(ev) == 0

    def block(self, ev, t):
        assert self.cu.cuStreamWaitEvent(self.current, ev, 0) == 0

    def synchronize(self, ev):
        self.cu.cuEventSynchronize(ev)

    def future(self, value, t):
        fut = torch.futures.Future()  # torch's stream-aware Future needs a real device
        fut.set_result(value)
        return fut


def collectives(rank, size, path):
    d = StandIn()
    device.register(d)
    init(dist, rank, size, path)
    r1, tri = rank + 1, size * (size + 1) // 2  # sum over ranks of (rank + 1)
    kernels0 = d.cu.fake_cuda_kernels()

    def done(t):
        d.host_order()
        return t

    t = d.tensor([r1] * 5)
    dist.all_reduce(t)
    check_equal(torch, done(t), torch.full((5,), float(tri)), "all_reduce sum")
    t = d.tensor([r1] * 3, torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    check_equal(torch, done(t), torch.full((3,), size), "all_reduce max int64")
    t = d.tensor([2.0 * r1] * 4)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    check_equal(torch, done(t), torch.full((4,), 2.0 * tri / size), "all_reduce avg")
    t = d.tensor([r1] * 4, torch.float64)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0))
    check_equal(torch, done(t), torch.full((4,), 2.0 * tri, dtype=torch.float64), "all_reduce premul_sum")
    t = d.empty(6, torch.float32).view(torch.complex64)  # complex: as its real pairs (SUM)
    t.copy_(torch.full((3,), complex(r1, -r1)))
    dist.all_reduce(t)
    check_equal(torch, done(t), torch.full((3,), complex(tri, -tri), dtype=torch.complex64), "all_reduce complex")
    t = d.tensor([rank == 1] * 3, torch.bool)
    dist.all_reduce(t)  # SUM of bools is a logical or
    check_equal(torch, done(t), torch.ones(3, dtype=torch.bool), "all_reduce of bools")

    t = d.tensor([r1] * 6)
    dist.broadcast(t, src=size - 1)
    check_equal(torch, done(t), torch.full((6,), float(size)), "broadcast")
    t = d.tensor([r1] * 6)
    dist.reduce(t, dst=0)
    if rank == 0:
        check_equal(torch, done(t), torch.full((6,), float(tri)), "reduce")

    outs = [d.empty(3, torch.float32) for _ in range(size)]
    dist.all_gather(outs, d.tensor([r1] * 3))
    for r, o in enumerate(outs):
        check_equal(torch, done(o), torch.full((3,), r + 1.0), f"all_gather block {r}")
    outs = [d.empty(r + 1, torch.float32) for r in range(size)]  # uneven: a broadcast per rank
    dist.all_gather(outs, d.tensor([r1] * r1))
    for r, o in enumerate(outs):
        check_equal(torch, done(o), torch.full((r + 1,), r + 1.0), f"uneven all_gather block {r}")
    big = d.empty(2 * size, torch.float32)
    dist.all_gather_into_tensor(big, d.tensor([r1, -r1]))
    check_equal(torch, done(big), torch.tensor([v for r in range(size) for v in (r + 1, -r - 1)]),
                "all_gather_into_tensor")

    out = d.empty(2, torch.float32)
    dist.reduce_scatter(out, [d.tensor([r1 * (b + 1)] * 2) for b in range(size)])
    check_equal(torch, done(out), torch.full((2,), float(tri * (rank + 1))), "reduce_scatter")
    out = d.empty(3, torch.float32)
    dist.reduce_scatter_tensor(out, d.tensor([r1] * (3 * size)))
    check_equal(torch, done(out), torch.full((3,), float(tri)), "reduce_scatter_tensor")

    out = d.empty(size, torch.int32)
    dist.all_to_all_single(out, d.tensor([10 * r1 + p for p in range(size)], torch.int32))
    check_equal(torch, done(out), torch.tensor([10 * (p + 1) + rank for p in range(size)], dtype=torch.int32),
                "all_to_all_single")
    # Uneven: rank p sends p+1 rows to every rank; each receives (p+1) rows from p.
    inp = d.tensor([float(r1)] * (r1 * size))
    out = d.empty(tri, torch.float32)
    dist.all_to_all_single(out, inp, output_split_sizes=[p + 1 for p in range(size)],
                           input_split_sizes=[r1] * size)
    check_equal(torch, done(out), torch.tensor([float(p + 1) for p in range(size) for _ in range(p + 1)]),
                "uneven all_to_all_single")
    outs = [d.empty(1, torch.float32) for _ in range(size)]
    dist.all_to_all(outs, [d.tensor([100 * r1 + p]) for p in range(size)])
    for p, o in enumerate(outs):
        check_equal(torch, done(o), torch.tensor([100.0 * (p + 1) + rank]), f"all_to_all from {p}")

    outs = [d.empty(2, torch.float32) for _ in range(size)] if rank == 0 else None
    dist.gather(d.tensor([r1, r1]), outs, dst=0)
    if rank == 0:
        for r, o in enumerate(outs):
            check_equal(torch, done(o), torch.full((2,), r + 1.0), f"gather block {r}")
    out = d.empty(2, torch.float32)
    dist.scatter(out, [d.tensor([7 * (r + 1)] * 2) for r in range(size)] if rank == 0 else None, src=0)
    check_equal(torch, done(out), torch.full((2,), 7.0 * r1), "scatter")

    # Point to point: a ring, as isend/irecv and as one batch.
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    got = d.empty(4, torch.float32)
    ws = [dist.isend(d.tensor([r1] * 4), nxt), dist.irecv(got, prv)] if rank % 2 == 0 else \
        [dist.irecv(got, prv), dist.isend(d.tensor([r1] * 4), nxt)]
    for w in ws:
        w.wait()
    check_equal(torch, done(got), torch.full((4,), prv + 1.0), "isend/irecv ring")
    got = d.empty(4, torch.float32)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, d.tensor([2.0 * r1] * 4), nxt),
                                   dist.P2POp(dist.irecv, got, prv)])
    for w in reqs:
        w.wait()
    check_equal(torch, done(got), torch.full((4,), 2.0 * (prv + 1)), "batch_isend_irecv ring")

    # A channels_last tensor: dense in another memory format, taken by the element-wise calls.
    m = d.empty(16, torch.float32).view(1, 2, 2, 4).permute(0, 3, 1, 2)
    m.copy_(torch.full((1, 4, 2, 2), float(r1)))
    dist.all_reduce(m)
    check_equal(torch, done(m).contiguous(), torch.full((1, 4, 2, 2), float(tri)), "all_reduce, channels_last")
    # The device calls run on a communicator of their own, split at the first one; CPU calls on the
    # same group keep theirs.
    eng = torch_chorus._chorus_engine(dist.group.WORLD, None)
    if eng._dcomm is None or eng._dcomm.value == eng._comm.value:
        raise AssertionError("device calls did not get a communicator of their own")
    c = torch.full((3,), float(r1))
    dist.all_reduce(c)
    check_equal(torch, c, torch.full((3,), float(tri)), "a CPU all_reduce beside device calls")
    if eng.comm_split_count() != 0:
        raise AssertionError("the device communicator counted as a split torch made")

    if d.cu.fake_cuda_kernels() == kernels0 and d.cu.fake_cuda_copies() == 0:
        raise AssertionError("no call reached the library's GPU path (no kernel, no device copy)")
    dist.barrier()
    print(f"test_device: rank {rank}/{size}: every collective, p2p and batch on stand-in device tensors")
    dist.destroy_process_group()


def async_order(rank, size, path):
    d = StandIn()
    device.register(d)
    init(dist, rank, size, path)
    t = d.tensor([rank + 1.0] * 8)
    dist.all_reduce(t)  # connects the ranks
    d.host_order()
    # Hold the current stream: the call queues behind the hold and returns at once.
    release = ctypes.c_int(0)
    assert d.cu.fake_cuda_hold(d.current, ctypes.byref(release)) == 0
    t = d.tensor([rank + 1.0] * 8)
    w = dist.all_reduce(t, async_op=True)
    # With the Python engine registered directly, torch 2.15 answers is_completed() itself (always false).
    front = backend._cext is not None
    if front and w.is_completed():
        raise AssertionError("is_completed() is true while the stream is held")
    # Another stream made current waits for the call through wait(): a copy queued after it sees the sum.
    first = d.current
    d.current = d.new_stream()
    w.wait()
    seen = d.empty(8, torch.float32)
    assert d.cu.fake_cuda_copy(d.current, ctypes.c_void_p(seen.data_ptr()), ctypes.c_void_p(t.data_ptr()),
                               ctypes.c_size_t(32)) == 0
    release.value = 1
    d.host_order()
    want = torch.full((8,), float(size * (size + 1) // 2))
    check_equal(torch, seen, want, "a copy on another stream after wait()")
    d.current = first
    d.host_order()
    if front and not w.is_completed():
        raise AssertionError("is_completed() is false after the stream ran the call")
    check_equal(torch, w.get_future().wait()[0], want, "the future's value")

    # What ProcessGroupNCCL refuses.
    m = d.empty(16, torch.float32).view(4, 4)
    expect_error(lambda: dist.all_reduce(m.t()), ["contiguous"], "a non-contiguous device tensor")
    outs = [d.empty(2, torch.float32) for _ in range(size - 1)] + [torch.zeros(2)]
    expect_error(lambda: dist.all_gather(outs, d.tensor([1.0, 2.0])), ["every tensor"], "a CPU output beside device ones")
    expect_error(lambda: dist.all_gather_into_tensor(d.empty(size + 1, torch.float32), d.tensor([1.0])),
                 ["output must hold world_size"], "an all_gather_into_tensor output of the wrong size")
    expect_error(lambda: dist.all_gather_into_tensor(torch.zeros(size + 1), torch.ones(1)),
                 ["output must hold world_size"], "the same on CPU tensors")
    dist.barrier()
    print(f"test_device: rank {rank}/{size}: async call on the current stream, wait() orders another stream, refusals")
    dist.destroy_process_group()


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    spawn(collectives, n, timeout=120)
    spawn(async_order, n, timeout=60)
