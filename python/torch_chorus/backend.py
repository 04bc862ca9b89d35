"""The "chorus" c10d Backend, ChorusBackend: the engine (_engine.py) with the c10d operations. Each maps
a c10d call on CPU tensors to NCCL calls here, or hands a call on device tensors to its device
version (device_ops.py): `_c10d_call`, written at each operation, says which wrapping it gets.

Layout rules: NCCL takes one contiguous buffer per call, so non-contiguous tensors are read through
a contiguous copy and written through a contiguous stand-in copied back on completion (`_Out`); lists of
per-rank tensors go through one flat buffer. Copies of what a call reads are made through `_src`,
`_out`, `_scaled` and `_stage`, which in a synchronous call first let earlier calls finish (`_drain`): issue
order. Complex tensors travel as their real pairs. Uneven
all_to_all (split sizes, or a list of tensors) is one ncclAllToAllv (Chorus's, RCCL's and NCCLX's call),
or grouped ncclSend/ncclRecv calls with a libchorus that lacks it; other lists of tensors are grouped calls.
"""

import datetime
import functools
import os
import time

import torch
import torch.distributed as dist

from . import _lib
from ._lib import lib
from . import device
from ._engine import _ASYNC, ChorusEngine, _CBackend
from .device_ops import DeviceOps
from .nccl_args import (_DTYPES, _OPS, _check_cpu, _dtype, _real, _redop, _reduce_op, alltoallv, check_blocks,
                        list_layout, offsets, split_counts)

_DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)  # torch's default for a group without one

_FAST_DTYPES = {k: v for k, v in _DTYPES.items() if k is not torch.bool}
_STRIDED = torch.strided
_ncclAllReduce = lib.ncclAllReduce


def _missing_ranks_doing(report, ranks):
    """The lines of a stall report (chorusCommStallReport) about `ranks`: what each was last doing."""
    want = set(ranks)
    lines = []
    for line in report.splitlines()[1:]:
        words = line.strip().split()
        if len(words) >= 2 and words[0] == "rank" and words[1].rstrip(":,").isdigit() and int(words[1].rstrip(":,")) in want:
            lines.append(line.strip())
    return lines


class _Out:
    """Where an operation writes: the tensor itself, or a contiguous stand-in copied back at the end."""

    __slots__ = ("dst", "buf")

    def __init__(self, t, need_values=True):
        _check_cpu(t)
        self.dst = t
        r = _real(t)
        if r.is_contiguous():
            self.buf = r
        else:
            self.buf = r.contiguous() if need_values else torch.empty(r.shape, dtype=r.dtype)

    def finish(self):
        if self.buf is not _real(self.dst):
            _real(self.dst).copy_(self.buf)


def _first_tensor(args):
    for a in args:
        while isinstance(a, (list, tuple)) and a:
            a = a[0]
        if isinstance(a, torch.Tensor):
            return a
    return None


def _c10d_call(sync):
    """The wrapping of a c10d operation of ChorusBackend (allreduce, say), written at its definition:

    - A call whose tensors are a device's (device.of: CUDA, or the tests' stand-in) goes to the
      operation's device version, DeviceOps._dev_<name>(d, ...) (device_ops.py: _dev_allreduce); CPU
      tensors go on to the method itself, at the cost of one check.
    - sync=True: on the CPU path the call is marked synchronous while it runs (opts.asyncOp False:
      the engine's _sync_call) for _drain, which only such calls may wait in: an asynchronous call
      must never block its caller on earlier calls. One operation may call another
      (allgather_coalesced): the outer mark is restored after it.
    """

    def wrap(f):
        dev = getattr(DeviceOps, "_dev_" + f.__name__)

        @functools.wraps(f)
        def call(self, *args, **kwargs):
            t = _first_tensor(args)
            d = device.of(t) if t is not None else None
            if d is not None:
                return dev(self, d, *args, **kwargs)
            if not sync:
                return f(self, *args, **kwargs)
            opts = kwargs.get("opts", args[-1] if args else None)
            outer = self._sync_call
            self._sync_call = opts is not None and hasattr(opts, "asyncOp") and not opts.asyncOp
            try:
                return f(self, *args, **kwargs)
            finally:
                self._sync_call = outer

        return call

    return wrap


class ChorusBackend(DeviceOps, ChorusEngine):
    """The "chorus" c10d Backend (or ProcessGroup, older torch: _engine.AS_PROCESS_GROUP): how calls run
    is ChorusEngine's; the operations on CPU tensors are below, those on device tensors DeviceOps's."""

    def _scaled(self, buf, scale):
        """What a reduction sends: buf, or a scaled copy of it (PREMUL_SUM)."""
        if scale is None:
            return buf
        self._drain()
        return buf * scale

    def _src(self, t):
        """A contiguous tensor with t's values, for reading (a copy made in issue order)."""
        _check_cpu(t)
        t = _real(t)
        if t.is_contiguous():
            return t
        self._drain()
        return t.contiguous()

    def _out(self, t, need_values=True):
        """_Out(t), whose stand-in copy of t's values (if any) is made in issue order."""
        if need_values and t.device.type == "cpu" and not _real(t).is_contiguous():
            self._drain()
        return _Out(t, need_values)

    def _stage(self, tensors):
        """One flat copy of tensors (made in issue order)."""
        self._drain()
        return torch.cat([_real(i).reshape(-1) for i in tensors])

    @staticmethod
    def _finishers(outs):
        """The copy-back of the outputs that went through a stand-in, or None."""
        outs = [o for o in outs if o.buf is not _real(o.dst)]
        return (lambda: [o.finish() for o in outs]) if outs else None

    # ---- collectives ----

    @_c10d_call(sync=True)
    def allreduce(self, tensors, opts=None):
        # The latency path (dist.all_reduce of one contiguous tensor, nothing queued) in few steps.
        if (len(tensors) == 1 and opts is not None and not opts.asyncOp and self._done_upto == self._issued
                and not self._batch and self._first_bad is None and not self._unsettled):
            t = tensors[0]
            dt = _FAST_DTYPES.get(t.dtype)
            if dt is not None and t.is_cpu and t.layout is _STRIDED and t.is_contiguous():
                op = _OPS.get(_reduce_op(opts).op)
                if op is not None:
                    p = t.data_ptr()
                    rc = _ncclAllReduce(p, p, t.numel(), dt, op, self._comm, None)
                    if rc:
                        self._check(rc, "allreduce")
                    return self._done_work
        return self._allreduce_list(tensors, opts, "allreduce")

    @_c10d_call(sync=True)
    def allreduce_coalesced(self, tensors, opts=None):
        return self._allreduce_list(tensors, opts, "allreduce_coalesced")

    def _allreduce_list(self, tensors, opts, what):
        if len(tensors) == 1:
            t = tensors[0]
            if t.is_contiguous() and t.device.type == "cpu" and not t.is_complex() and t.layout == torch.strided:
                op, scale = _redop(_reduce_op(opts), t)
                src = self._scaled(t, scale)
                ps, p, n, dt, comm = src.data_ptr(), t.data_ptr(), t.numel(), _dtype(t), self._comm
                return self._run(what, opts, lambda s: lib.ncclAllReduce(ps, p, n, dt, op, comm, s), tensors,
                                 None, (t, src))
        outs = [self._out(t) for t in tensors]
        ops = [_redop(_reduce_op(opts), t) for t in tensors]
        srcs = [self._scaled(o.buf, scale) for o, (_, scale) in zip(outs, ops)]
        comm = self._comm

        def issue(s):
            lib.ncclGroupStart()
            rc = 0
            for o, src, (op, _) in zip(outs, srcs, ops):
                b = o.buf
                rc = rc or lib.ncclAllReduce(src.data_ptr(), b.data_ptr(), b.numel(), _dtype(b), op, comm, s)
            return lib.ncclGroupEnd() or rc

        return self._run(what, opts, issue, tensors, self._finishers(outs), (outs, srcs))

    @_c10d_call(sync=True)
    def broadcast(self, tensors, opts=None):
        root, comm = opts.rootRank, self._comm
        outs = [self._out(t, need_values=(self._rank == root)) for t in tensors]

        def issue(s):
            lib.ncclGroupStart()
            rc = 0
            for o in outs:
                b = o.buf
                rc = rc or lib.ncclBroadcast(b.data_ptr(), b.data_ptr(), b.numel(), _dtype(b), root, comm, s)
            return lib.ncclGroupEnd() or rc

        post = self._finishers(outs) if self._rank != root else None
        return self._run("broadcast", opts, issue, tensors, post, outs)

    @_c10d_call(sync=True)
    def reduce(self, tensors, opts=None):
        root, comm = opts.rootRank, self._comm
        outs = [self._out(t) for t in tensors]
        ops = [_redop(_reduce_op(opts), t) for t in tensors]
        srcs = [self._scaled(o.buf, scale) for o, (_, scale) in zip(outs, ops)]

        def issue(s):
            lib.ncclGroupStart()
            rc = 0
            for o, src, (op, _) in zip(outs, srcs, ops):
                b = o.buf
                rc = rc or lib.ncclReduce(src.data_ptr(), b.data_ptr(), b.numel(), _dtype(b), op, root, comm, s)
            return lib.ncclGroupEnd() or rc

        post = self._finishers(outs) if self._rank == root else None
        return self._run("reduce", opts, issue, tensors, post, (outs, srcs))

    def _gather_flat(self, outputs, inp):
        """A flat receive buffer for a list of per-rank outputs, and the copy-out that fills them."""
        n = inp.numel()
        for o in outputs:
            _check_cpu(o)
            if _real(o).numel() != n or o.dtype != inp.dtype and _real(o).dtype != inp.dtype:
                raise RuntimeError("chorus: output tensors must have the input's size and dtype")
        flat = torch.empty(n * len(outputs), dtype=inp.dtype)

        def post():
            for i, o in enumerate(outputs):
                _real(o).copy_(flat[i * n:(i + 1) * n].view(_real(o).shape))

        return flat, post

    @_c10d_call(sync=True)
    def allgather(self, output_tensors, input_tensors, opts=None):
        if len(input_tensors) != 1 or len(output_tensors) != 1:
            raise RuntimeError("chorus: allgather takes one input tensor and one output list per process")
        inp = self._src(input_tensors[0])
        outputs = output_tensors[0]
        if len(outputs) != self._size:
            raise RuntimeError(f"chorus: allgather needs {self._size} output tensors, got {len(outputs)}")
        if any(_real(o).numel() != inp.numel() for o in outputs):
            return self._allgather_uneven(output_tensors, inp, opts)
        flat, post = self._gather_flat(outputs, inp)
        n, dt, comm = inp.numel(), _dtype(inp), self._comm
        return self._run("allgather", opts,
                         lambda s: lib.ncclAllGather(inp.data_ptr(), flat.data_ptr(), n, dt, comm, s),
                         output_tensors, post, (inp, flat))

    def _allgather_uneven(self, output_tensors, inp, opts):
        """Outputs of different sizes (ProcessGroupNCCL takes them too): one broadcast per rank, grouped."""
        outs = [self._out(o, need_values=False) for o in output_tensors[0]]
        if outs[self._rank].buf.numel() != inp.numel() or any(o.buf.dtype != inp.dtype for o in outs):
            raise RuntimeError("chorus: all_gather: output tensors must have the input's dtype, and this rank's "
                               "output the input's size")
        me, dt, comm = self._rank, _dtype(inp), self._comm

        def issue(s):
            lib.ncclGroupStart()
            rc = 0
            for r, o in enumerate(outs):
                send = inp.data_ptr() if r == me else None
                rc = rc or lib.ncclBroadcast(send, o.buf.data_ptr(), o.buf.numel(), dt, r, comm, s)
            return lib.ncclGroupEnd() or rc

        return self._run("allgather", opts, issue, output_tensors, self._finishers(outs), (inp, outs))

    @_c10d_call(sync=True)
    def allgather_coalesced(self, output_lists, input_list, opts=None):
        works = [self.allgather([o], [i], opts) for o, i in zip(output_lists, input_list)]
        return works[-1] if works else self.barrier(dist.BarrierOptions())

    @_c10d_call(sync=True)  # a synchronous call waits for earlier ones before copying its input (PYTORCH.md)
    def _allgather_base(self, output, input, opts=None):
        return self._allgather_into([output], [input], opts, "allgather_into_tensor")

    @_c10d_call(sync=True)
    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        return self._allgather_into(outputs, inputs, opts, "allgather_into_tensor_coalesced")

    def _allgather_into(self, outputs, inputs, opts, what):
        srcs = [self._src(i) for i in inputs]
        outs = [self._out(o, need_values=False) for o in outputs]
        check_blocks(what, srcs, [o.buf for o in outs], self._size, "output")
        comm = self._comm

        def issue(s):
            lib.ncclGroupStart()
            rc = 0
            for i, o in zip(srcs, outs):
                rc = rc or lib.ncclAllGather(i.data_ptr(), o.buf.data_ptr(), i.numel(), _dtype(i), comm, s)
            return lib.ncclGroupEnd() or rc

        return self._run(what, opts, issue, outputs, self._finishers(outs), (srcs, outs))

    @_c10d_call(sync=True)
    def gather(self, output_tensors, input_tensors, opts=None):
        root, comm = opts.rootRank, self._comm
        inp = self._src(input_tensors[0])
        flat, post = None, None
        if self._rank == root:
            outputs = output_tensors[0]
            if len(outputs) != self._size:
                raise RuntimeError(f"chorus: gather needs {self._size} output tensors at the root")
            flat, post = self._gather_flat(outputs, inp)
        fp = flat.data_ptr() if flat is not None else None
        n, dt = inp.numel(), _dtype(inp)
        return self._run("gather", opts, lambda s: lib.ncclGather(inp.data_ptr(), fp, n, dt, root, comm, s),
                         output_tensors, post, (inp, flat))

    @_c10d_call(sync=True)
    def scatter(self, output_tensors, input_tensors, opts=None):
        root, comm = opts.rootRank, self._comm
        out = self._out(output_tensors[0], need_values=False)
        flat = None
        if self._rank == root:
            inputs = input_tensors[0]
            if len(inputs) != self._size:
                raise RuntimeError(f"chorus: scatter needs {self._size} input tensors at the root")
            for i in inputs:
                _check_cpu(i)
                if _real(i).numel() != out.buf.numel():
                    raise RuntimeError("chorus: scatter inputs must have the output's size")
            flat = self._stage(inputs)
        fp = flat.data_ptr() if flat is not None else None
        n, dt = out.buf.numel(), _dtype(out.buf)
        return self._run("scatter", opts,
                         lambda s: lib.ncclScatter(fp, out.buf.data_ptr(), n, dt, root, comm, s),
                         output_tensors, self._finishers([out]), (out, flat))

    @_c10d_call(sync=True)
    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        out = self._out(output_tensors[0], need_values=False)
        inputs = input_tensors[0]
        if len(inputs) != self._size:
            raise RuntimeError(f"chorus: reduce_scatter needs {self._size} input tensors")
        for i in inputs:
            _check_cpu(i)
        if any(_real(i).numel() != out.buf.numel() for i in inputs):
            return self._reduce_scatter_uneven(out, output_tensors, inputs, opts)
        flat = self._stage(inputs)
        op, scale = _redop(_reduce_op(opts), output_tensors[0])
        if scale is not None:
            flat.mul_(scale)  # a copy already
        n, dt, comm = out.buf.numel(), _dtype(out.buf), self._comm
        return self._run("reduce_scatter", opts,
                         lambda s: lib.ncclReduceScatter(flat.data_ptr(), out.buf.data_ptr(), n, dt, op, comm, s),
                         output_tensors, self._finishers([out]), (out, flat))

    def _reduce_scatter_uneven(self, out, output_tensors, inputs, opts):
        """Inputs of different sizes (ProcessGroupNCCL takes them too): one reduce per rank, grouped."""
        if _real(inputs[self._rank]).numel() != out.buf.numel():
            raise RuntimeError("chorus: reduce_scatter: this rank's input must have the output's size")
        op, scale = _redop(_reduce_op(opts), output_tensors[0])
        srcs = [self._scaled(self._src(i), scale) for i in inputs]
        if any(i.dtype != out.buf.dtype for i in srcs):
            raise RuntimeError("chorus: reduce_scatter inputs must have the output's dtype")
        me, dt, comm = self._rank, _dtype(out.buf), self._comm

        def issue(s):
            lib.ncclGroupStart()
            rc = 0
            for r, i in enumerate(srcs):
                recv = out.buf.data_ptr() if r == me else None
                rc = rc or lib.ncclReduce(i.data_ptr(), recv, i.numel(), dt, op, r, comm, s)
            return lib.ncclGroupEnd() or rc

        return self._run("reduce_scatter", opts, issue, output_tensors, self._finishers([out]), (out, srcs))

    @_c10d_call(sync=True)
    def _reduce_scatter_base(self, output, input, opts=None):
        return self._reduce_scatter_into([output], [input], opts, "reduce_scatter_tensor")

    @_c10d_call(sync=True)
    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        return self._reduce_scatter_into(outputs, inputs, opts, "reduce_scatter_tensor_coalesced")

    def _reduce_scatter_into(self, outputs, inputs, opts, what):
        srcs = [self._src(i) for i in inputs]
        outs = [self._out(o, need_values=False) for o in outputs]
        check_blocks(what, [o.buf for o in outs], srcs, self._size, "input")
        ops = [_redop(_reduce_op(opts), o) for o in outputs]
        srcs = [self._scaled(i, scale) for i, (_, scale) in zip(srcs, ops)]
        comm = self._comm

        def issue(s):
            lib.ncclGroupStart()
            rc = 0
            for i, o, (op, _) in zip(srcs, outs, ops):
                rc = rc or lib.ncclReduceScatter(i.data_ptr(), o.buf.data_ptr(), o.buf.numel(), _dtype(i), op,
                                                 comm, s)
            return lib.ncclGroupEnd() or rc

        return self._run(what, opts, issue, outputs, self._finishers(outs), (srcs, outs))

    @_c10d_call(sync=True)
    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        src = self._src(input)
        out = self._out(output, need_values=False)
        size, comm, dt = self._size, self._comm, _dtype(src)
        if not output_split_sizes and not input_split_sizes:
            if src.numel() % size or out.buf.numel() != src.numel():
                raise RuntimeError(f"chorus: all_to_all_single: tensors of {src.numel()} and {out.buf.numel()} "
                                   f"elements do not split evenly over {size} ranks")
            n = src.numel() // size
            return self._run("all_to_all_single", opts,
                             lambda s: lib.ncclAlltoAll(src.data_ptr(), out.buf.data_ptr(), n, dt, comm, s),
                             output, self._finishers([out]), (src, out))

        scount = split_counts(src, input_split_sizes, size, "input")
        rcount = split_counts(out.buf, output_split_sizes, size, "output")
        a2av = alltoallv(scount, offsets(scount), rcount, offsets(rcount), dt, comm)
        if a2av is not None:
            return self._run("all_to_all_single", opts, lambda s: a2av(src.data_ptr(), out.buf.data_ptr(), s),
                             output, self._finishers([out]), (src, out))
        es = src.element_size()
        soff = [sum(scount[:p]) * es for p in range(size)]
        roff = [sum(rcount[:p]) * es for p in range(size)]

        def issue(s):
            sp, rp = src.data_ptr(), out.buf.data_ptr()
            lib.ncclGroupStart()
            rc = 0
            for p in range(size):
                rc = rc or lib.ncclSend(sp + soff[p], scount[p], dt, p, comm, s)
                rc = rc or lib.ncclRecv(rp + roff[p], rcount[p], dt, p, comm, s)
            return lib.ncclGroupEnd() or rc

        return self._run("all_to_all_single", opts, issue, output, self._finishers([out]), (src, out))

    @_c10d_call(sync=True)
    def alltoall(self, output_tensors, input_tensors, opts=None):
        size, comm = self._size, self._comm
        if len(output_tensors) != size or len(input_tensors) != size:
            raise RuntimeError(f"chorus: all_to_all needs {size} input and {size} output tensors")
        srcs = [self._src(t) for t in input_tensors]
        outs = [self._out(t, need_values=False) for t in output_tensors]
        for o in outs:
            _dtype(o.buf)
        a2av = self._alltoallv_lists(srcs, [o.buf for o in outs])
        if a2av is not None:
            return self._run("all_to_all", opts, a2av, output_tensors, self._finishers(outs), (srcs, outs))

        def issue(s):
            lib.ncclGroupStart()
            rc = 0
            for p in range(size):
                rc = rc or lib.ncclSend(srcs[p].data_ptr(), srcs[p].numel(), _dtype(srcs[p]), p, comm, s)
                rc = rc or lib.ncclRecv(outs[p].buf.data_ptr(), outs[p].buf.numel(), _dtype(outs[p].buf), p, comm, s)
            return lib.ncclGroupEnd() or rc

        return self._run("all_to_all", opts, issue, output_tensors, self._finishers(outs), (srcs, outs))

    def _alltoallv_lists(self, srcs, outs):
        """all_to_all's tensors as one ncclAllToAllv (each list the blocks of one buffer at its lowest
        tensor), or None: tensors of several dtypes, or a libchorus without the call."""
        if any(t.dtype != srcs[0].dtype for t in srcs + outs):
            return None
        sl, rl = list_layout(srcs), list_layout(outs)
        if sl is None or rl is None:
            return None
        a2av = alltoallv([t.numel() for t in srcs], sl[1], [t.numel() for t in outs], rl[1],
                         _dtype(srcs[0]), self._comm)
        return None if a2av is None else (lambda s: a2av(sl[0], rl[0], s))

    def barrier(self, opts=None):
        if self._dcomm is not None:  # the group's device calls are in order before it too
            return self._dev_barrier(opts)
        one, comm = torch.zeros(1, dtype=torch.uint8), self._comm
        return self._run("barrier", opts,
                         lambda s: lib.ncclAllReduce(one.data_ptr(), one.data_ptr(), 1, _lib.ncclUint8,
                                                     _lib.ncclMax, comm, s), [], None, one)

    # ---- point to point (tags are accepted and ignored: messages between two ranks match in order) ----

    @_c10d_call(sync=False)
    def send(self, tensors, dst, tag):
        src = self._src(tensors[0])
        n, dt, comm = src.numel(), _dtype(src), self._comm
        return self._run("send", _ASYNC, lambda s: lib.ncclSend(src.data_ptr(), n, dt, dst, comm, s),
                               tensors, None, src)

    @_c10d_call(sync=False)
    def recv(self, tensors, src_rank, tag):
        out = self._out(tensors[0], need_values=False)
        n, dt, comm = out.buf.numel(), _dtype(out.buf), self._comm
        return self._run("recv", _ASYNC, lambda s: lib.ncclRecv(out.buf.data_ptr(), n, dt, src_rank, comm, s),
                               tensors, self._finishers([out]), out)

    def recv_anysource(self, tensors, tag):
        raise RuntimeError("chorus: recv from any source is not supported (NCCL has no wildcard receive); "
                           "pass src=")

    # ---- groups made from this one (dist.split_group), and the monitored barrier ----

    # Plain attributes: the binding reads them through Python (the inherited descriptors would recurse).
    supports_coalescing = True
    supports_splitting = True

    def comm_split_count(self):
        return self._nsplits

    @property
    def options(self):
        """The group's Backend.Options (torch's splitGroup copies them for a child)."""
        o = _CBackend.Options("chorus", self._timeout or _DEFAULT_TIMEOUT)
        o.group_name = self._name or ""
        return o

    def split(self, store, ranks, opts=None):
        """torch's split_group: every rank of this group calls it with the ranks (of this group, in
        the new group's order) of its new group; a rank in none passes some other group's. One
        ncclCommSplit, as ProcessGroupNCCL does: the members of a new group share its lowest rank as
        color (the groups of one split do not overlap) and take their position as key. None for a
        rank in no new group."""
        ranks = [int(r) for r in ranks]
        if self._rank not in ranks:
            self._nccl_split(_lib.NCCL_SPLIT_NOCOLOR, 0)  # the members' split needs every rank
            if self._front is None:
                # torch's trampoline for a Python Backend dereferences the None that means "no group"
                # (torch 2.15: PyBackend::split, initSlotAndCast): only the C++ front can answer it.
                raise RuntimeError(f"chorus: split_group: rank {self._rank} is in none of the new groups, which "
                                   "this torch lets only torch_chorus's C++ front answer (it is not loaded: "
                                   "rebuild with a C++ compiler, or leave CHORUS_TORCH_CPP unset)")
            return None
        # torch's Backend.Options spells it _timeout (split_group's timeout, else the parent's).
        timeout = (getattr(opts, "_timeout", None) or getattr(opts, "timeout", None)) if opts is not None else None
        name = str(getattr(opts, "group_name", "") or "") if opts is not None else ""
        return type(self)(store, ranks.index(self._rank), len(ranks), timeout or self._timeout, name,
                          split_from=self, color=min(ranks))

    def _split_front(self, store, ranks, opts=None):
        """split for the C++ front (_cbackend.cpp), which turns None into "no group": the child engine
        behind a front of its own."""
        child = self.split(store, ranks, opts)
        if child is None or self._front is None or _cext is None:
            return child
        front = _cext.ChorusCBackend(child, child._rank, child._size)
        child._attach_front(front, _cext.make_work)
        return front

    def shrink(self, ranks_to_exclude, shrink_flags=0):
        """torch's shrink_group (the C++ front's Backend::shrink): every surviving rank calls it with the
        same ranks to leave out (of this group); one ncclCommShrink, NCCL_SHRINK_ABORT (torch's
        SHRINK_ABORT, 1) aborting what the parent had in flight. The survivors keep their order."""
        exclude = sorted({int(r) for r in ranks_to_exclude})
        if self._rank in exclude:
            raise RuntimeError(f"chorus: shrink_group: rank {self._rank} is among the ranks to exclude {exclude}")
        self._nshrinks = getattr(self, "_nshrinks", 0) + 1
        store = dist.PrefixStore(f"torch_chorus/shrink{self._nshrinks}/", self._store)  # its own keys
        rank = self._rank - sum(1 for r in exclude if r < self._rank)
        return type(self)(store, rank, self._size - len(exclude), self._timeout, self._name, split_from=self,
                          shrink=(exclude, int(shrink_flags)))

    def _shrink_front(self, ranks_to_exclude, shrink_flags=0):
        """shrink for the C++ front (_cbackend.cpp): the new engine behind a front of its own."""
        child = self.shrink(ranks_to_exclude, shrink_flags)
        if self._front is None or _cext is None:
            return child
        front = _cext.ChorusCBackend(child, child._rank, child._size)
        child._attach_front(front, _cext.make_work)
        return front

    def perform_nocolor_split(self, device=None):
        """torch's new_group asks ranks outside a new group to take part in a split of the default
        group; chorus makes new groups from the store among their members (create_backend_ext), which
        never involves the others: nothing to do."""

    def monitored_barrier(self, opts=None, wait_all_ranks=False):
        """dist.monitored_barrier: every rank says it arrived through the group's store; rank 0 waits
        for each within the timeout and raises naming the first rank that did not come (every one with
        wait_all_ranks), with what the stall report says that rank is doing; the others wait for rank
        0's verdict (the timeout plus the time the report takes) and raise it when it is a failure.
        Barriers are matched by count, like collectives: a rank that comes late to one that failed gets
        its verdict at once. The communicator is not used, so a missing rank leaves it healthy (a
        barrier over NCCL calls would time the whole group out)."""
        timeout = getattr(opts, "timeout", None) if opts is not None else None
        if isinstance(opts, datetime.timedelta):  # older torch calls a ProcessGroup with the timeout itself
            timeout = opts
        if not isinstance(timeout, datetime.timedelta) or timeout.total_seconds() <= 0:
            timeout = self._timeout if isinstance(self._timeout, datetime.timedelta) else _DEFAULT_TIMEOUT
        secs = timeout.total_seconds()
        self._mb_seq += 1
        prefix = f"torch_chorus/monitored_barrier/{self._mb_seq}/"
        store = self._store
        store.set(prefix + str(self._rank), "1")
        if self._rank != 0:
            # Rank 0 answers once every rank came, or after its timeout plus the stall report's gathering
            # (at most about 2 s): wait for that, with room to spare on a loaded machine.
            grace = 15.0
            try:
                store.wait([prefix + "verdict"], datetime.timedelta(seconds=secs + grace))
            except Exception:
                came = store.check([prefix + "0"])
                raise RuntimeError(f"chorus: monitored_barrier: rank {self._rank} had no verdict from rank 0 within "
                                   f"{secs + grace:g} s: " + ("rank 0 arrived but did not answer (is it alive?)" if came
                                                             else "rank 0 did not call monitored_barrier"))
            verdict = store.get(prefix + "verdict").decode(errors="replace")
            if verdict != "ok":
                raise RuntimeError(verdict)
            return
        deadline = time.monotonic() + secs
        missing = []
        for r in range(1, self._size):
            left = deadline - time.monotonic()
            key = prefix + str(r)
            if left > 0:
                try:
                    store.wait([key], datetime.timedelta(seconds=left))
                    continue
                except Exception:
                    pass
            if not store.check([key]):  # past the deadline: only ask, so a rank that came is never named
                missing.append(r)
                if not wait_all_ranks:
                    break
        if not missing:
            store.set(prefix + "verdict", "ok")
            return
        who = f"rank {missing[0]}" if len(missing) == 1 else "ranks " + ", ".join(map(str, missing))
        msg = (f"chorus: monitored_barrier: {who} of {self._size} did not arrive within {secs:g} s"
               f"{'' if wait_all_ranks or self._size == 2 else ' (the first missing; wait_all_ranks=True names every one)'}")
        doing = _missing_ranks_doing(_lib.stall_report(self._comm), missing)
        if doing:
            msg += "; the stall report: " + "; ".join(doing)
        store.set(prefix + "verdict", msg)
        raise RuntimeError(msg)

    # torch 2.x names the single-tensor variants differently across releases: answer to both.
    all_gather_single = _allgather_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced
    reduce_scatter_single = _reduce_scatter_base
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced
    all_to_all_single = alltoall_base


def create_backend(store, rank, size, timeout):
    """register_backend's plain creator (store, rank, size, timeout)."""
    return ChorusBackend(store, rank, size, timeout)


def create_backend_ext(opts, backend_options=None):
    """register_backend's extended creator (_DistributedBackendOptions)."""
    engine = ChorusBackend(opts.store, opts.group_rank, opts.group_size, opts.timeout, str(opts.group_id or ""))
    if _cext is None:
        return engine
    front = _cext.ChorusCBackend(engine, opts.group_rank, opts.group_size)
    engine._attach_front(front, _cext.make_work)
    return front


def _load_cext():
    """The C++ Backend (_cbackend.cpp, built by python/build_cext.py for one torch version), if it was
    built for this torch and CHORUS_TORCH_CPP is not 0; else None (the Python engine is registered).
    Also returns why not, for torch_chorus's warning: None where nothing is missed (chosen, or a torch
    whose c10d cannot take a C++ front from Python)."""
    if os.environ.get("CHORUS_TORCH_CPP", "1") == "0":
        return None, None
    try:
        from . import _cbackend
    except ImportError as e:  # not built, or built for another interpreter or torch (undefined symbols)
        here = os.path.dirname(os.path.abspath(__file__))
        found = [f for f in os.listdir(here) if f.startswith("_cbackend") and f.endswith(".so")]
        if found:
            return None, f"its module {found[0]} does not load ({e})"
        try:  # the build tree's copy: why `make` did not build it (python/build_cext.py records it)
            import json

            with open(os.path.join(here, "_cbackend.fingerprint")) as f:
                return None, "make did not build it: " + json.load(f)["note"]
        except (OSError, ValueError, KeyError, TypeError):
            return None, "it is not in this installation"
    if _cbackend.TORCH_VERSION != torch.__version__:
        return None, f"it was built for torch {_cbackend.TORCH_VERSION}, this is torch {torch.__version__}"
    return _cbackend, None


_cext, cext_missing = _load_cext()
