"""What the chorus backend needs from a device whose tensors it takes (CUDA), in one place.

A call on device tensors runs on the caller's current stream (ProcessGroupNCCL's synchronous calls do
the same since torch 2.8): the library queues it there, so it is ordered after whatever the caller
queued before on that stream and before what it queues next, with no host wait and no stream of our
own. Its Work's wait() makes the caller's current stream wait for the call (the host does not block),
is_completed() asks the event recorded after it, and its future is stream-aware: callbacks and
consumers on other streams see the results only after the call (torch's Future with devices).

A device row answers: does it own this tensor, which stream is current, how to make a scratch tensor,
how to record and wait for an event, and how to make the future. `register` puts a row before CUDA's:
the tests use one over the stand-in driver, whose "device memory" is host memory the library sees as
device memory (tests/torch/test_device.py)."""
import contextlib

import torch


class CudaDevice:
    """torch.cuda's current stream, caching allocator, events and stream-aware futures."""

    host_memory = False  # its tensors are not CPU tensors: the CPU paths never see them

    @staticmethod
    def claims(t):
        return t.is_cuda

    @staticmethod
    def stream(t):
        return torch.cuda.current_stream(t.device).cuda_stream

    @staticmethod
    def empty(n, dtype, like):
        return torch.empty(n, dtype=dtype, device=like.device)

    @staticmethod
    @contextlib.contextmanager
    def guard(t):
        """While the group's device communicator is made (device_ops.py): t's device current, with its
        CUDA context created and current on this thread, which the communicator then keeps."""
        with torch.cuda.device(t.device):
            torch.cuda.synchronize(t.device)  # makes the primary context current on this thread
            yield

    @staticmethod
    def hold(tensors, t):
        """An asynchronous call's tensors: the caching allocator reuses their memory only once the
        current stream gets past the call, whichever stream they were made on (as ProcessGroupNCCL
        records them)."""
        s = torch.cuda.current_stream(t.device)
        for x in tensors:
            x.record_stream(s)

    @staticmethod
    def host_order(t):
        """Before torch itself reads or writes t's memory around a call: nothing, since torch's own
        operations on t go on the same current stream, in order."""

    @staticmethod
    def record(t):
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(t.device))
        return ev

    @staticmethod
    def query(ev):
        return ev.query()

    @staticmethod
    def block(ev, t):
        """The current stream waits for ev (the host does not)."""
        torch.cuda.current_stream(t.device).wait_event(ev)

    @staticmethod
    def synchronize(ev):
        ev.synchronize()

    @staticmethod
    def future(value, t):
        fut = torch.futures.Future(devices=[t.device])
        fut.set_result(value)  # records an event on the current stream: users of the value wait for it
        return fut


_rows = [CudaDevice]
host_claims = False  # some registered row takes CPU tensors (the stand-in): the CPU fast paths must ask


def register(row):
    """Put a device row first (tests: the stand-in driver's)."""
    global host_claims
    _rows.insert(0, row)
    host_claims = any(r.host_memory for r in _rows)


def unregister(row):
    global host_claims
    _rows.remove(row)
    host_claims = any(r.host_memory for r in _rows)


def of(t):
    """The device row that owns tensor t, or None for a CPU tensor."""
    if t.is_cpu and not host_claims:
        return None
    for r in _rows:
        if r.claims(t):
            return r
    return None
