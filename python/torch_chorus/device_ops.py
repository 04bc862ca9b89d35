"""The chorus backend's operations on device tensors (CUDA): ProcessGroupNCCL's rules, Chorus's calls.

Every call goes on the caller's current stream (device.py says why and what its Work means). Tensors
must be dense and contiguous and on one device, as ProcessGroupNCCL requires; lists of per-rank tensors
go through one scratch buffer from the device's allocator, filled and emptied by torch on the same
stream, or as grouped calls where sizes differ. PREMUL_SUM is Chorus's ncclRedOpCreatePreMulSum, made
and destroyed around each call (the library reads the factor when the call is made). Between
start_coalescing and end_coalescing (batch_isend_irecv) the calls are queued and issued as one NCCL
group.

Who touches what: like the CPU path, one Python thread per process group issues; `_dev_calls` is that
thread's queue while coalescing."""
import ctypes
import datetime
import threading
import time

import torch
import torch.distributed as dist

from . import _lib
from ._lib import lib
from .nccl_args import _dtype, _real, _redop, _reduce_op, alltoallv, check_blocks, list_layout, offsets, split_counts

_RED_SCALAR = {torch.float16: ctypes.c_uint16, torch.bfloat16: ctypes.c_uint16,
               torch.float32: ctypes.c_float, torch.float64: ctypes.c_double}


def _scalar(factor, dtype):
    """factor as a value of dtype, for ncclRedOpCreatePreMulSum's host-immediate scalar."""
    if dtype in (torch.float16, torch.bfloat16):
        bits = torch.tensor([factor], dtype=dtype).view(torch.int16).item() & 0xFFFF
        return ctypes.c_uint16(bits)
    return _RED_SCALAR[dtype](factor)


class _DeviceWork(dist.Work):
    """An asynchronous call on device tensors: wait() orders the caller's current stream after it (and
    raises a failure the communicator has recorded); with a timeout the host waits, up to it."""

    def __init__(self, engine, d, t, result, keep, what):
        super().__init__()
        self._engine, self._d, self._t, self._keep, self._what = engine, d, t, keep, what
        self._ev = d.record(t)
        self._fut = d.future(result, t)

    def wait(self, timeout=None):
        secs = timeout.total_seconds() if timeout is not None else 0
        if secs > 0:
            deadline, pause = time.monotonic() + secs, 0.0001
            while not self._d.query(self._ev):
                self._engine._dev_error(self._what)  # a failed call may never complete
                if time.monotonic() > deadline:
                    raise getattr(dist, "DistBackendError", RuntimeError)(
                        f"chorus: Work.wait: {self._what} did not complete within {secs:g} s "
                        "(it goes on in the background)")
                time.sleep(pause)
                pause = min(2 * pause, 0.01)
        self._d.block(self._ev, self._t)
        self._engine._dev_error(self._what)
        return True

    def _wait_ms(self, ms):
        """wait() as the C++ front calls it (HeldWork): a timeout in ms, 0 for none."""
        return self.wait(datetime.timedelta(milliseconds=ms) if ms > 0 else None)

    def synchronize(self):
        self._d.block(self._ev, self._t)

    def is_completed(self):
        return self._d.query(self._ev)

    def is_success(self):
        return self.is_completed() and self._engine._dev_failure() is None

    def exception(self):
        msg = self._engine._dev_failure()
        return RuntimeError(msg) if msg else None

    def get_future(self):
        return self._fut


class DeviceOps:
    """Mixed into ChorusBackend (backend.py), before ChorusEngine (_engine.py), whose methods it uses and
    extends: `_dev_<operation>(d, ...)` is that c10d operation on d's tensors, which ChorusBackend's
    operation hands it (backend.py, _c10d_call)."""

    _dev_calls = None  # (issue, post) queued while coalescing; a list once the first is queued
    # The group's device communicator and its device, made at the first device call (_dev_comm) by
    # the issuing thread; _dev_lock makes reading it (Works' failure checks, any thread) safe against
    # _destroy.
    _dcomm = None
    _ddevice = None
    _dev_lock = threading.Lock()

    # ---- shared steps ----

    def _dev_failure(self):
        """The device communicator's recorded failure (a dead peer, a mismatch the bridge found), or
        None; None too once the group is destroyed (its calls were let through then)."""
        with self._dev_lock:
            comm = self._dcomm
            if comm is None:
                return None
            st = ctypes.c_int(0)
            rc = lib.ncclCommGetAsyncError(comm, ctypes.byref(st))
            rc = rc or (st.value if st.value != _lib.ncclInProgress else 0)
            return None if rc == _lib.ncclSuccess else f"{_lib.error_string(rc)}: {_lib.last_error(comm)}"

    def _dev_error(self, what):
        msg = self._dev_failure()
        if msg is not None:
            raise RuntimeError(f"chorus: {what} failed on rank {self._rank}: {msg}")

    def _dev_check(self, d, t, tensors, what, any_dense=False):
        """Every tensor on t's device, dense, contiguous (any_dense: in any memory format, for the
        calls that treat a tensor as its elements in memory order, as ProcessGroupNCCL allows), of a
        supported dtype; returns the group's device communicator (made at the first device call)."""
        for x in tensors:
            if not d.claims(x) or x.device != t.device:
                raise RuntimeError(f"chorus: {what}: every tensor of a call must be on {t.device}, got one on {x.device}")
            if x.layout != torch.strided or not (x.is_contiguous() or any_dense and _dense(x)):
                raise RuntimeError(f"chorus: {what}: device tensors must be dense and contiguous (as with NCCL)")
            _dtype(_real(x))  # complex tensors travel as their real pairs
        return self._dev_comm(d, t)

    def _dev_comm(self, d, t):
        """The group's device communicator, split from its communicator by every rank at its first call
        on device tensors (as ProcessGroupNCCL makes its own lazily): under t's device, whose CUDA
        context it keeps, so a program that picks its device after init_process_group gets it, and
        device calls never queue behind the CPU calls' host stream. One device per group and process."""
        if self._dcomm is not None:
            if t.device != self._ddevice:
                raise RuntimeError(f"chorus: this process group runs its device calls on {self._ddevice}; a call on "
                                   f"{t.device} needs a process group of its own (one device per process, as with NCCL)")
            return self._dcomm
        with d.guard(t):
            comm = self._nccl_split(0, self._rank, counted=False)
        secs = self._timeout.total_seconds() if self._timeout is not None else 0
        if secs > 0:
            lib.chorusCommSetTimeout(comm, secs)
        wire = getattr(self, "_wire_format", None)  # torch_chorus.set_wire_format, before this split
        if wire is not None:
            _lib.set_wire_format(comm, wire)
        with self._dev_lock:
            self._dcomm, self._ddevice = comm, t.device
        self._drow, self._dbarrier = d, d.empty(1, torch.uint8, t)  # the barrier's byte
        return comm

    def _dev_issue(self, d, t, what, opts, issue, post=None, result=(), keep=None):
        """issue(stream) makes the C calls (one NCCL group) on t's current stream; post() then runs
        torch's copies out of scratch buffers, on the same stream. Returns the Work."""
        asynchronous = getattr(opts, "asyncOp", True)
        try:
            self._healthy()
            if self._batch:  # end_coalescing issues the queue as one group
                if self._dev_calls is None:
                    self._dev_calls = []
                self._dev_calls.append((d, t, issue, post, keep))
                return self._done_work
            self._check(issue(d.stream(t)), what, comm=self._dcomm)
            if post is not None:
                d.host_order(t)
                post()
        except RuntimeError as e:
            if asynchronous:  # reported through the Work: DDP's reducer would go on with a null future
                return self._failed_work(str(e))
            raise
        if not asynchronous:
            return self._done_work  # on the caller's stream already: nothing to wait for
        d.hold(list(_tensors(keep)), t)
        return _DeviceWork(self, d, t, result, keep, what)

    def _dev_barrier(self, opts):
        """dist.barrier once the group has made device calls (ProcessGroupNCCL's): a one-element
        all-reduce on the device communicator, on the current stream, which the host then waits for."""
        d, one = self._drow, self._dbarrier
        t, comm = one, self._dcomm
        self._check(lib.ncclAllReduce(one.data_ptr(), one.data_ptr(), 1, _lib.ncclUint8, _lib.ncclMax, comm,
                                      d.stream(t)), "barrier", comm=comm)
        d.synchronize(d.record(t))
        self._dev_error("barrier")
        return self._done_work

    def _dev_group(self, calls):
        """issue(stream) for a list of (nccl call maker) closures: one NCCL group."""

        def issue(s):
            lib.ncclGroupStart()
            rc = 0
            for fn in calls:
                rc = rc or fn(s)
            return lib.ncclGroupEnd() or rc

        return issue

    def _dev_reductions(self, opts, tensors):
        """(nccl op, PREMUL_SUM factor or None) per tensor, checked before anything is issued."""
        return [_redop(_reduce_op(opts), x) for x in tensors]

    def _dev_reduce_call(self, red, b, make):
        """make(op) with red's op; PREMUL_SUM's op made first and destroyed once the call is made."""
        op, factor = red
        comm = self._dcomm
        if factor is None:
            return lambda s: make(op, s)

        def call(s):
            made = ctypes.c_int()
            rc = lib.ncclRedOpCreatePreMulSum(ctypes.byref(made), ctypes.byref(_scalar(factor, b.dtype)), _dtype(b),
                                              _lib.ncclScalarHostImmediate, comm)
            if rc:
                return rc
            rc = make(made.value, s)
            lib.ncclRedOpDestroy(made.value, comm)
            return rc

        return call

    # ---- collectives ----

    def _dev_allreduce(self, d, tensors, opts=None, what="allreduce"):
        t = tensors[0]
        comm = self._dev_check(d, t, tensors, what, any_dense=True)
        reds = self._dev_reductions(opts, tensors)
        calls = []
        for x, red in zip(tensors, reds):
            b = _real(x)
            calls.append(self._dev_reduce_call(red, b, lambda op, s, b=b: lib.ncclAllReduce(
                b.data_ptr(), b.data_ptr(), b.numel(), _dtype(b), op, comm, s)))
        return self._dev_issue(d, t, what, opts, self._dev_group(calls), result=tensors, keep=tensors)

    def _dev_allreduce_coalesced(self, d, tensors, opts=None):
        return self._dev_allreduce(d, tensors, opts, "allreduce_coalesced")

    def _dev_broadcast(self, d, tensors, opts):
        t, root = tensors[0], opts.rootRank
        comm = self._dev_check(d, t, tensors, "broadcast", any_dense=True)
        bufs = [_real(x) for x in tensors]
        calls = [lambda s, b=b: lib.ncclBroadcast(b.data_ptr(), b.data_ptr(), b.numel(), _dtype(b), root, comm, s)
                 for b in bufs]
        return self._dev_issue(d, t, "broadcast", opts, self._dev_group(calls), result=tensors, keep=tensors)

    def _dev_reduce(self, d, tensors, opts):
        t, root = tensors[0], opts.rootRank
        comm = self._dev_check(d, t, tensors, "reduce", any_dense=True)
        calls = []
        for x, red in zip(tensors, self._dev_reductions(opts, tensors)):
            b = _real(x)
            calls.append(self._dev_reduce_call(red, b, lambda op, s, b=b: lib.ncclReduce(
                b.data_ptr(), b.data_ptr(), b.numel(), _dtype(b), op, root, comm, s)))
        return self._dev_issue(d, t, "reduce", opts, self._dev_group(calls), result=tensors, keep=tensors)

    def _dev_flat_out(self, d, inp, outputs, what):
        """A scratch buffer for len(outputs) blocks of inp's size, and the copy into outputs."""
        n = inp.numel()
        for o in outputs:
            if _real(o).numel() != n or _real(o).dtype != inp.dtype:
                raise RuntimeError(f"chorus: {what}: output tensors must have the input's size and dtype")
        flat = d.empty(n * len(outputs), inp.dtype, inp)

        def post():
            for i, o in enumerate(outputs):
                _real(o).copy_(flat[i * n:(i + 1) * n].view(_real(o).shape))

        return flat, post

    def _dev_flat_in(self, d, inputs, like):
        """One scratch buffer holding inputs side by side (copied in on the current stream)."""
        parts = [_real(i).reshape(-1) for i in inputs]
        flat = d.empty(sum(p.numel() for p in parts), parts[0].dtype, like)
        d.host_order(like)
        torch.cat(parts, out=flat)
        return flat

    def _dev_allgather(self, d, output_tensors, input_tensors, opts=None):
        if len(input_tensors) != 1 or len(output_tensors) != 1:
            raise RuntimeError("chorus: allgather takes one input tensor and one output list per process")
        t, outputs = input_tensors[0], output_tensors[0]
        if len(outputs) != self._size:
            raise RuntimeError(f"chorus: allgather needs {self._size} output tensors, got {len(outputs)}")
        comm = self._dev_check(d, t, [t] + list(outputs), "allgather")
        inp = _real(t)
        if any(_real(o).numel() != inp.numel() for o in outputs):  # uneven: a broadcast per rank, grouped
            outs = [_real(o) for o in outputs]
            if outs[self._rank].numel() != inp.numel() or any(o.dtype != inp.dtype for o in outs):
                raise RuntimeError("chorus: all_gather: output tensors must have the input's dtype, and this "
                                   "rank's output the input's size")
            calls = [lambda s, r=r, o=o: lib.ncclBroadcast(inp.data_ptr() if r == self._rank else None, o.data_ptr(),
                                                           o.numel(), _dtype(o), r, comm, s) for r, o in enumerate(outs)]
            return self._dev_issue(d, t, "allgather", opts, self._dev_group(calls), result=output_tensors,
                                   keep=(inp, outs))
        flat, post = self._dev_flat_out(d, inp, outputs, "allgather")
        n, dt = inp.numel(), _dtype(inp)
        return self._dev_issue(d, t, "allgather", opts,
                               lambda s: lib.ncclAllGather(inp.data_ptr(), flat.data_ptr(), n, dt, comm, s),
                               post, output_tensors, (inp, flat))

    def _dev_allgather_coalesced(self, d, output_lists, input_list, opts=None):
        works = [self._dev_allgather(d, [o], [i], opts) for o, i in zip(output_lists, input_list)]
        return works[-1] if works else self._done_work  # one stream: the last call's Work covers all

    def _dev_allgather_into(self, d, outputs, inputs, opts, what):
        t = inputs[0]
        comm = self._dev_check(d, t, list(inputs) + list(outputs), what)
        srcs, outs = [_real(i) for i in inputs], [_real(o) for o in outputs]
        check_blocks(what, srcs, outs, self._size, "output")
        calls = [lambda s, i=i, o=o: lib.ncclAllGather(i.data_ptr(), o.data_ptr(), i.numel(), _dtype(i), comm, s)
                 for i, o in zip(srcs, outs)]
        return self._dev_issue(d, t, what, opts, self._dev_group(calls), result=outputs, keep=(srcs, outs))

    def _dev__allgather_base(self, d, output, input, opts=None):
        return self._dev_allgather_into(d, [output], [input], opts, "allgather_into_tensor")

    def _dev_allgather_into_tensor_coalesced(self, d, outputs, inputs, opts=None):
        return self._dev_allgather_into(d, outputs, inputs, opts, "allgather_into_tensor_coalesced")

    def _dev_gather(self, d, output_tensors, input_tensors, opts):
        root, t = opts.rootRank, input_tensors[0]
        outputs = output_tensors[0] if self._rank == root else []
        if self._rank == root and len(outputs) != self._size:
            raise RuntimeError(f"chorus: gather needs {self._size} output tensors at the root")
        comm = self._dev_check(d, t, [t] + list(outputs), "gather")
        inp = _real(t)
        flat, post = self._dev_flat_out(d, inp, outputs, "gather") if outputs else (None, None)
        fp = flat.data_ptr() if flat is not None else None
        n, dt = inp.numel(), _dtype(inp)
        return self._dev_issue(d, t, "gather", opts, lambda s: lib.ncclGather(inp.data_ptr(), fp, n, dt, root, comm, s),
                               post, output_tensors, (inp, flat))

    def _dev_scatter(self, d, output_tensors, input_tensors, opts):
        root, t = opts.rootRank, output_tensors[0]
        inputs = input_tensors[0] if self._rank == root else []
        if self._rank == root and len(inputs) != self._size:
            raise RuntimeError(f"chorus: scatter needs {self._size} input tensors at the root")
        comm = self._dev_check(d, t, [t] + list(inputs), "scatter")
        out = _real(t)
        if any(_real(i).numel() != out.numel() for i in inputs):
            raise RuntimeError("chorus: scatter inputs must have the output's size")
        flat = self._dev_flat_in(d, inputs, t) if inputs else None
        fp = flat.data_ptr() if flat is not None else None
        n, dt = out.numel(), _dtype(out)
        return self._dev_issue(d, t, "scatter", opts, lambda s: lib.ncclScatter(fp, out.data_ptr(), n, dt, root, comm, s),
                               None, output_tensors, (out, flat))

    def _dev_reduce_scatter(self, d, output_tensors, input_tensors, opts):
        t, inputs = output_tensors[0], input_tensors[0]
        if len(inputs) != self._size:
            raise RuntimeError(f"chorus: reduce_scatter needs {self._size} input tensors")
        comm = self._dev_check(d, t, [t] + list(inputs), "reduce_scatter")
        out = _real(t)
        red = self._dev_reductions(opts, [t])[0]
        if any(_real(i).numel() != out.numel() for i in inputs):  # uneven: a reduce per rank, grouped
            srcs = [_real(i) for i in inputs]
            if srcs[self._rank].numel() != out.numel() or any(i.dtype != out.dtype for i in srcs):
                raise RuntimeError("chorus: reduce_scatter: inputs must have the output's dtype, and this "
                                   "rank's input the output's size")
            calls = [self._dev_reduce_call(red, out, lambda op, s, r=r, i=i: lib.ncclReduce(
                i.data_ptr(), out.data_ptr() if r == self._rank else None, i.numel(), _dtype(i), op, r, comm, s))
                for r, i in enumerate(srcs)]
            return self._dev_issue(d, t, "reduce_scatter", opts, self._dev_group(calls), result=output_tensors,
                                   keep=(out, srcs))
        flat = self._dev_flat_in(d, inputs, t)
        call = self._dev_reduce_call(red, out, lambda op, s: lib.ncclReduceScatter(
            flat.data_ptr(), out.data_ptr(), out.numel(), _dtype(out), op, comm, s))
        return self._dev_issue(d, t, "reduce_scatter", opts, call, None, output_tensors, (out, flat))

    def _dev_reduce_scatter_into(self, d, outputs, inputs, opts, what):
        t = outputs[0]
        comm = self._dev_check(d, t, list(inputs) + list(outputs), what)
        srcs, outs = [_real(i) for i in inputs], [_real(o) for o in outputs]
        check_blocks(what, outs, srcs, self._size, "input")
        calls = [self._dev_reduce_call(red, o, lambda op, s, i=i, o=o: lib.ncclReduceScatter(
            i.data_ptr(), o.data_ptr(), o.numel(), _dtype(o), op, comm, s))
            for i, o, red in zip(srcs, outs, self._dev_reductions(opts, outputs))]
        return self._dev_issue(d, t, what, opts, self._dev_group(calls), result=outputs, keep=(srcs, outs))

    def _dev__reduce_scatter_base(self, d, output, input, opts=None):
        return self._dev_reduce_scatter_into(d, [output], [input], opts, "reduce_scatter_tensor")

    def _dev_reduce_scatter_tensor_coalesced(self, d, outputs, inputs, opts=None):
        return self._dev_reduce_scatter_into(d, outputs, inputs, opts, "reduce_scatter_tensor_coalesced")

    def _dev_alltoall_base(self, d, output, input, output_split_sizes, input_split_sizes, opts=None):
        comm = self._dev_check(d, output, [input, output], "all_to_all_single")
        src, out, size = _real(input), _real(output), self._size
        dt = _dtype(src)
        if not output_split_sizes and not input_split_sizes:
            if src.numel() % size or out.numel() != src.numel():
                raise RuntimeError(f"chorus: all_to_all_single: tensors of {src.numel()} and {out.numel()} "
                                   f"elements do not split evenly over {size} ranks")
            n = src.numel() // size
            return self._dev_issue(d, output, "all_to_all_single", opts,
                                   lambda s: lib.ncclAlltoAll(src.data_ptr(), out.data_ptr(), n, dt, comm, s),
                                   None, [output], (src, out))
        scount = split_counts(src, input_split_sizes, size, "input")
        rcount = split_counts(out, output_split_sizes, size, "output")
        a2av = alltoallv(scount, offsets(scount), rcount, offsets(rcount), dt, comm)
        if a2av is not None:
            return self._dev_issue(d, output, "all_to_all_single", opts,
                                   lambda s: a2av(src.data_ptr(), out.data_ptr(), s), None, [output], (src, out))
        es = src.element_size()
        soff = [sum(scount[:p]) * es for p in range(size)]
        roff = [sum(rcount[:p]) * es for p in range(size)]
        calls = []
        for p in range(size):
            calls.append(lambda s, p=p: lib.ncclSend(src.data_ptr() + soff[p], scount[p], dt, p, comm, s))
            calls.append(lambda s, p=p: lib.ncclRecv(out.data_ptr() + roff[p], rcount[p], dt, p, comm, s))
        return self._dev_issue(d, output, "all_to_all_single", opts, self._dev_group(calls), None, [output], (src, out))

    def _dev_alltoall(self, d, output_tensors, input_tensors, opts=None):
        size = self._size
        if len(output_tensors) != size or len(input_tensors) != size:
            raise RuntimeError(f"chorus: all_to_all needs {size} input and {size} output tensors")
        t = output_tensors[0]
        comm = self._dev_check(d, t, list(input_tensors) + list(output_tensors), "all_to_all")
        srcs, outs = [_real(x) for x in input_tensors], [_real(x) for x in output_tensors]
        sl, rl = list_layout(srcs), list_layout(outs)
        same = all(x.dtype == srcs[0].dtype for x in srcs + outs) and sl is not None and rl is not None
        a2av = same and alltoallv([x.numel() for x in srcs], sl[1], [x.numel() for x in outs], rl[1],
                                  _dtype(srcs[0]), comm)
        if a2av:
            return self._dev_issue(d, t, "all_to_all", opts, lambda s: a2av(sl[0], rl[0], s), None, output_tensors,
                                   (srcs, outs))
        calls = []
        for p in range(size):
            calls.append(lambda s, i=srcs[p], p=p: lib.ncclSend(i.data_ptr(), i.numel(), _dtype(i), p, comm, s))
            calls.append(lambda s, o=outs[p], p=p: lib.ncclRecv(o.data_ptr(), o.numel(), _dtype(o), p, comm, s))
        return self._dev_issue(d, t, "all_to_all", opts, self._dev_group(calls), None, output_tensors, (srcs, outs))

    # ---- point to point: Works of their own, as ProcessGroupNCCL's isend/irecv ----

    def _dev_send(self, d, tensors, dst, tag):
        t = tensors[0]
        comm = self._dev_check(d, t, [t], "send", any_dense=True)
        b = _real(t)
        return self._dev_issue(d, t, "send", None, lambda s: lib.ncclSend(b.data_ptr(), b.numel(), _dtype(b), dst, comm, s),
                               None, tensors, b)

    def _dev_recv(self, d, tensors, src_rank, tag):
        t = tensors[0]
        comm = self._dev_check(d, t, [t], "recv", any_dense=True)
        b = _real(t)
        return self._dev_issue(d, t, "recv", None,
                               lambda s: lib.ncclRecv(b.data_ptr(), b.numel(), _dtype(b), src_rank, comm, s),
                               None, tensors, b)

    # ---- the C++ front, coalescing and lifetime: the engine's, extended to the device calls ----

    def _attach_front(self, front, make_work):
        super()._attach_front(front, make_work)
        front.set_held_type(_DeviceWork)  # held by the front as it is, not cast (HeldWork, _cbackend.cpp)

    def end_coalescing(self):
        calls = self._dev_calls if self._batch == 1 else None
        if calls:
            self._dev_calls = None
            if self._p2p:  # two communicators: no one group
                msg = (f"chorus: a coalescing block (batch_isend_irecv, _coalescing_manager) on rank {self._rank} "
                       "mixes CPU and device tensors: use one kind per block")
                super()._abandon_coalescing(msg)
                return self._failed_work(msg)
        work = super().end_coalescing()
        if not calls:
            return work
        d, t = calls[0][0], calls[0][1]
        issue = self._dev_group([c[2] for c in calls])
        posts = [c[3] for c in calls if c[3] is not None]
        try:
            return self._dev_issue(d, t, "coalesced calls", None, issue, (lambda: [p() for p in posts]) if posts else None,
                                   [], [c[4] for c in calls])
        except RuntimeError as e:
            return self._failed_work(str(e))

    def _destroy(self, abort):
        with self._dev_lock:
            comm, self._dcomm = self._dcomm, None
        if comm is not None:
            (lib.ncclCommAbort if abort else lib.ncclCommDestroy)(comm)
        super()._destroy(abort)

    def _abandon_coalescing(self, why):
        if self._batch == 1:
            self._dev_calls = None
        super()._abandon_coalescing(why)


def _dense(x):
    return any(x.is_contiguous(memory_format=f) for f in (torch.channels_last, torch.channels_last_3d)
               if x.dim() == (4 if f is torch.channels_last else 5))


def _tensors(keep):
    """The tensors in a nest of tuples and lists."""
    if isinstance(keep, torch.Tensor):
        yield keep
    elif isinstance(keep, (list, tuple)):
        for k in keep:
            yield from _tensors(k)
