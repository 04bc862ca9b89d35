"""The engine of the "chorus" c10d Backend (ChorusEngine, the base of backend.py's ChorusBackend):
communicator setup through the store, and how calls run.

(Not engine.py: torch_chorus.engine() is the public function that says which engine runs.)

Execution model. An operation the caller waits for at once (opts.asyncOp False: what
`dist.all_reduce(t)` sends) runs on the calling thread with the NULL stream and returns a finished
Work: no thread hand-off on the latency path. An asynchronous one (async_op=True, DDP's buckets) is
issued on the backend's chorus host stream, which runs calls in issue order in the background, and
returns the backend's own Work over a torch Future (wait() raises when the operation failed and
honours a timeout; torch's future-wrapping Work does neither); a watcher thread waits for the stream
(chorusStreamSynchronize, GIL released) and completes the futures. A synchronous call made while
asynchronous ones are queued goes on the stream too, so a communicator never runs calls from two
threads at once. A call that stages a copy of a tensor (non-contiguous, PREMUL_SUM scaling) first lets
what was issued before it finish and copy back (`_drain`), so the copy holds what issue order says.

Point-to-point calls carry no asyncOp flag: each goes on the stream at once (as with ProcessGroupNCCL,
an isend/irecv exchange of large messages posted one by one can wait on itself). Between
start_coalescing and end_coalescing (batch_isend_irecv, _coalescing_manager) calls are queued and
issued as one NCCL group (ncclGroupStart/End), so they progress together.

Who touches what: `_lock` guards the issue/complete bookkeeping (`_issued`, `_done_upto`, `_pending`,
`_unsettled`, `_p2p`, `_batch`, `_first_bad`, `_error`, each _Op's `claimed`) and is the watcher's
condition lock; `_sync_lock` serialises chorusStreamSynchronize calls so that an error it reports (and
then clears) is attributed to the right range of operations. One Python thread per process group issues operations (as with every backend).
"""
import atexit
import ctypes
import threading
import time
import weakref

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _CBackend
from torch._C._distributed_c10d import _create_work_from_future

from . import _lib, device
from ._lib import lib

class _Failure:
    """What an operation's raw future carries when it failed (see _Op)."""

    __slots__ = ("msg",)

    def __init__(self, msg):
        self.msg = msg


def _unwrap(raw):
    v = raw.value()
    if isinstance(v, _Failure):
        raise RuntimeError(v.msg)
    return v


class _Op:
    """An asynchronous operation between issue and completion (owned by the backend's _pending).

    Its public future `fut` is `raw.then(_unwrap)`: a failure becomes an error raised by a callback,
    which torch stores as a C++ error. An error set with Future.set_exception instead crashes DDP's
    reducer (torch 2.15 dereferences it in parseCppCommHookResult: measured, SIGSEGV). `raw` is done
    once the copy-backs have run; `claimed` says a thread has begun settling it (_settle)."""

    __slots__ = ("seq", "raw", "fut", "post", "keep", "result", "what", "claimed")

    def __init__(self, post, keep, result, what=""):
        self.raw = torch.futures.Future()
        self.fut = self.raw.then(_unwrap)
        self.seq, self.post, self.keep, self.result, self.what, self.claimed = 0, post, keep, result, what, False

    def fail(self, msg):
        self.raw.set_result(_Failure(msg))


_TimeoutError = getattr(dist, "DistBackendError", RuntimeError)


def _wait_op(op, timeout=None):
    """Wait for op (timeout: a timedelta, zero or None = no limit); raise if it failed or time ran out."""
    secs = timeout.total_seconds() if timeout is not None else 0
    if not op.raw.done():
        if secs <= 0:
            op.raw.wait()
        else:
            done = threading.Event()
            op.raw.add_done_callback(lambda _: done.set())
            if not done.wait(secs):
                raise _TimeoutError(f"chorus: Work.wait: {op.what or 'the operation'} did not complete within "
                                    f"{secs:g} s (it goes on in the background)")
    v = op.raw.value()
    if isinstance(v, _Failure):
        raise RuntimeError(v.msg)


class _Work(dist.Work):
    """What an asynchronous call returns with the Python engine registered directly (the C++ front
    returns its ChorusWork, _cbackend.cpp): torch's future-wrapping Work neither raises a failure from
    wait() nor takes a timeout. torch forwards wait() and get_future() to a Python Work (ProcessGroup
    mode calls it directly, is_completed() too)."""

    def __init__(self, op):
        super().__init__()
        self._op = op

    def wait(self, timeout=None):
        _wait_op(self._op, timeout)
        return True

    def get_future(self):
        return self._op.fut

    def is_completed(self):
        return self._op.raw.done()

    def is_success(self):
        return self._op.raw.done() and not isinstance(self._op.raw.value(), _Failure)

    def exception(self):
        v = self._op.raw.value() if self._op.raw.done() else None
        return RuntimeError(v.msg) if isinstance(v, _Failure) else None


class _AsyncOpts:
    asyncOp = True


_ASYNC = _AsyncOpts()

_live = weakref.WeakSet()  # backends alive in this process


@atexit.register
def _stop_all_threads():
    for b in list(_live):
        b._stop_threads(2.0)


def _pick_base():
    """Newer torch lets Python subclass c10d's Backend (one device of a process group: "cpu:chorus,
    cuda:nccl" works). Older 2.x (2.11 measured) has no such trampoline: there the backend is a whole
    ProcessGroup subclass, which torch's Python collectives call directly (CPU only)."""

    class _Probe(_CBackend):
        pass

    try:
        _Probe(0, 1)
        return _CBackend, False
    except TypeError:
        return dist.ProcessGroup, True


_BASE, AS_PROCESS_GROUP = _pick_base()


class ChorusEngine(_BASE):
    def __init__(self, store, rank, size, timeout, group_name="", split_from=None, color=0, shrink=None):
        """A communicator of `size` ranks: made from a unique id passed through `store`, or (split_from:
        the parent engine; every rank of the parent calls alike) by ncclCommSplit of the parent's with
        `color` and this rank's position `rank` as key."""
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._sync_lock = threading.Lock()
        self._stream = None
        self._issued = 0  # stream batches issued (seq numbers 1.._issued)
        self._done_upto = 0  # every seq <= this has completed
        self._first_bad = None  # seq of the first batch that may have failed
        self._error = None  # that failure's message
        self._pending = []  # _Op issued, not yet completed (they hold the buffers alive)
        self._unsettled = set()  # _Op issued whose copy-backs and futures are not done yet
        self._sync_call = False  # the issuing thread is in a synchronous call (backend.py's _c10d_call): _drain may wait
        self._p2p = []  # calls queued while coalescing: (what, issue, _Op)
        self._batch = 0  # >0 between start_ and end_coalescing: calls are queued, then issued as one group
        self._watcher = None
        self._settle_q = []  # completed _Ops waiting for a settler thread
        self._settle_cv = threading.Condition(self._lock)
        self._settlers_idle = 0
        self._settlers = []  # settler threads started (joined at shutdown)
        self._closed = False
        self._name = group_name
        self._front = None  # the C++ Backend torch holds, when it runs the fast all_reduce (_cbackend.cpp)
        self._make_work = _Work  # _Op -> the Work an asynchronous call returns (the front's ChorusWork)
        _live.add(self)
        self._comm = ctypes.c_void_p()
        # What synchronous calls return: one finished C++ Work, so torch's wait() on it never re-enters
        # Python (about 1 us a call less than a Python Work).
        done = torch.futures.Future()
        done.set_result([])
        self._done_work = _from_future(done)
        self._store = store
        self._timeout = timeout
        self._nsplits = 0  # children split from this group (torch's comm_split_count)
        self._mb_seq = 0  # monitored barriers so far (their store keys)
        secs = timeout.total_seconds() if timeout is not None else 0
        if split_from is not None:
            if shrink is not None:  # (ranks to exclude, flags): ncclCommShrink of the parent's
                self._shrink_comm(split_from, shrink[0], shrink[1], rank, size)
            else:
                self._split_comm(split_from, color, rank, size)
            if secs > 0:
                self._check(lib.chorusCommSetTimeout(self._comm, secs), "chorusCommSetTimeout")
            return
        uid = _lib.UniqueId()
        key = "torch_chorus/unique_id"
        if rank == 0:
            self._check(lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId", comm=None)
            store.set(key, bytes(uid).hex())  # hex: the store API takes text
        else:
            try:
                raw = bytes.fromhex(store.get(key).decode())
            except ValueError:
                raw = b""
            if len(raw) != _lib.NCCL_UNIQUE_ID_BYTES:
                raise RuntimeError(f"chorus: bad unique id in the store ({len(raw)} bytes)")
            ctypes.memmove(ctypes.byref(uid), raw, len(raw))
        self._init_comm(uid, secs)
        if secs > 0:
            self._check(lib.chorusCommSetTimeout(self._comm, secs), "chorusCommSetTimeout")

    def _nccl_split(self, color, key, counted=True):
        """ncclCommSplit of this group's communicator: every rank of the group calls it, in the same
        order as its other calls (queued calls finish first); NOCOLOR gives a rank no communicator.
        counted: a split torch sees (comm_split_count), not the group's own device communicator."""
        self._sync()
        self._healthy()
        comm = ctypes.c_void_p()
        rc = lib.ncclCommSplit(self._comm, color, key, ctypes.byref(comm), None)
        if rc != _lib.ncclSuccess:
            raise RuntimeError(f"chorus: ncclCommSplit failed on rank {self._rank}: {_lib.error_string(rc)}: "
                               f"{_lib.last_error(self._comm)}")
        self._nsplits += counted
        return comm

    def _split_comm(self, parent, color, key, size):
        """This engine's communicator: parent's split with color, this rank's position as key."""
        comm = self._comm = parent._nccl_split(color, key)
        # The ranks of a split agree on its members only if they passed the same list: check what
        # NCCL made against what torch will assume (a rank list that overlaps another splits apart).
        n, r = ctypes.c_int(), ctypes.c_int()
        lib.ncclCommCount(comm, ctypes.byref(n))
        lib.ncclCommUserRank(comm, ctypes.byref(r))
        if (n.value, r.value) != (size, key):
            lib.ncclCommDestroy(comm)
            self._comm = None
            raise RuntimeError(f"chorus: split_group: this rank (parent rank {parent._rank}) expected to be rank {key} "
                               f"of {size} in its new group, but the ranks that named the same group make "
                               f"{n.value} (this one rank {r.value}): every rank must pass the same, "
                               "non-overlapping split_ranks")

    def _shrink_comm(self, parent, exclude, flags, rank, size):
        """This engine's communicator: parent's without the ranks of exclude (ncclCommShrink, every
        survivor alike). With NCCL_SHRINK_ABORT the parent's calls in flight are aborted first (a dead
        rank's group), so the parent is neither synchronised nor checked for health."""
        fn = _lib.optional.get("ncclCommShrink")
        if fn is None:
            raise RuntimeError("chorus: shrink_group: this libchorus has no ncclCommShrink")
        if not flags & 1:
            parent._sync()
            parent._healthy()
        arr = (ctypes.c_int * max(1, len(exclude)))(*exclude)
        comm = ctypes.c_void_p()
        rc = fn(parent._comm, arr, len(exclude), ctypes.byref(comm), None, int(flags))
        if rc != _lib.ncclSuccess:
            raise RuntimeError(f"chorus: ncclCommShrink failed on rank {parent._rank}: {_lib.error_string(rc)}: "
                               f"{_lib.last_error(parent._comm)}")
        self._comm = comm
        n, r = ctypes.c_int(), ctypes.c_int()
        lib.ncclCommCount(comm, ctypes.byref(n))
        lib.ncclCommUserRank(comm, ctypes.byref(r))
        if (n.value, r.value) != (size, rank):
            raise RuntimeError(f"chorus: shrink_group: expected rank {rank} of {size}, ncclCommShrink made rank "
                               f"{r.value} of {n.value}")

    def _init_comm(self, uid, secs):
        """ncclCommInitRank within the process group's timeout: nonblocking (in Chorus that changes
        init only), polled, aborted when the time is up. The library has no per-call init timeout
        (CHORUS_INIT_TIMEOUT, read once per process, still bounds it too)."""
        cfg = _lib.Config(blocking=0)
        rc = lib.ncclCommInitRankConfig(ctypes.byref(self._comm), self._size, uid, self._rank, ctypes.byref(cfg))
        if rc not in (_lib.ncclSuccess, _lib.ncclInProgress):
            self._check(rc, "ncclCommInitRank", comm=None)
        deadline = time.monotonic() + secs if secs > 0 else None
        state, pause = ctypes.c_int(rc), 0.0005
        while True:
            rc = lib.ncclCommGetAsyncError(self._comm, ctypes.byref(state))
            if rc != _lib.ncclSuccess or state.value != _lib.ncclInProgress:
                break
            if deadline is not None and time.monotonic() > deadline:
                lib.ncclCommAbort(self._comm)
                self._comm = None
                group = f" (group {self._name})" if self._name and self._name != "0" else ""
                raise RuntimeError(f"chorus: ncclCommInitRank on rank {self._rank}{group} did not complete within "
                                   f"the process group's timeout ({secs:g} s): not every rank of the group joined")
            time.sleep(pause)
            pause = min(2 * pause, 0.02)
        rc = rc or state.value
        if rc != _lib.ncclSuccess:
            msg = f"chorus: ncclCommInitRank failed on rank {self._rank}: {_lib.error_string(rc)}: " \
                  f"{_lib.last_error(self._comm) or _lib.last_error(None)}"
            lib.ncclCommAbort(self._comm)
            self._comm = None
            raise RuntimeError(msg)

    # ---- the C++ front (_cbackend.cpp) ----

    def _attach_front(self, front, make_work):
        """front runs synchronous all_reduces itself while nothing is queued here (_fast_update);
        make_work(future) makes its ChorusWork, a C++ Work whose wait() torch calls without Python."""
        self._front = front
        self._make_work = lambda op: make_work(op.fut)
        done = torch.futures.Future()
        done.set_result([])
        self._done_work = make_work(done)
        front.set_done_work(self._done_work)
        front.set_fast(ctypes.cast(lib.ncclAllReduce, ctypes.c_void_p).value, self._comm.value, False)
        self._fast_update()

    def _fast_update(self):
        """Tell the front whether a synchronous call may bypass this engine: nothing issued and not
        completed or not settled (copied back), not coalescing, no failure to report. Called where any
        of those changes (the issuing thread, or the watcher and the settlers with _lock held)."""
        front = self._front
        if front is not None:
            # Not while a completed call's results are still being copied back (a settler's _Out): a
            # call over the same memory must see them (torch_work's column-then-matrix case).
            # Not where a device row takes CPU tensors (the stand-in's tests): the front would run them here.
            front.set_allowed(self._done_upto == self._issued and not self._batch and self._first_bad is None
                              and not self._unsettled and not device.host_claims)

    # ---- issuing ----

    def _check(self, rc, what, comm=0):
        if rc != _lib.ncclSuccess:
            c = self._comm if comm == 0 else comm
            group = f" (group {self._name})" if self._name and self._name != "0" else ""
            raise RuntimeError(f"chorus: {what} failed on rank {self._rank}{group}: "
                               f"{_lib.error_string(rc)}: {_lib.last_error(c)}")

    def _get_stream(self):
        if self._stream is None:
            s = ctypes.c_void_p()
            self._check(lib.chorusStreamCreate(ctypes.byref(s)), "chorusStreamCreate")
            self._stream = s
            self._watcher = threading.Thread(target=self._watch_main, name="chorus-watcher", daemon=True)
            self._watcher.start()
        return self._stream

    def _healthy(self):
        if self._first_bad is not None:
            raise RuntimeError(self._error)
        if self._closed:
            raise RuntimeError("chorus: the process group was destroyed")

    def _run(self, what, opts, issue, result, post=None, keep=None):
        """issue(stream) makes the C calls and returns ncclResult_t; `post` runs after completion
        (copy-backs), `keep` holds buffers alive until then. Returns the operation's Work. An
        asynchronous call reports failure through its Work, never by raising: DDP's reducer, which
        issues from an autograd hook, would go on with a null future."""
        if getattr(opts, "asyncOp", True):
            try:
                return self._run_async(what, issue, result, post, keep)
            except RuntimeError as e:
                return self._failed_work(str(e))
        self._healthy()
        if self._batch:  # a synchronous call inside coalescing: torch would wait on it, so it stands in
            self._p2p.append((what, issue, _Op(post, keep, result, what)))
            return self._done_work
        if any(op.post is not None for op in list(self._unsettled)):
            self._drain()  # an earlier result still to be copied back may land in what this call reads
        if self._done_upto == self._issued:
            self._check(issue(None), what)
            if post is not None:
                try:
                    post()
                except Exception as e:
                    raise RuntimeError(f"chorus: {what} on rank {self._rank}: copying the result back failed: {e}") from e
            return self._done_work
        op = _Op(post, keep, result, what)
        with self._lock:
            self._issue(what, issue, [op])
        self._wait_seq(op.seq)
        _wait_op(op)  # the copy-backs have run (by whichever thread settled it); raises if it failed
        return self._done_work

    def _run_async(self, what, issue, result, post, keep):
        self._healthy()
        op = _Op(post, keep, result, what)
        if self._batch:  # completes with the group end_coalescing issues
            self._p2p.append((what, issue, op))
            return self._make_work(op)
        with self._lock:
            self._issue(what, issue, [op])
        return self._make_work(op)

    def _failed_work(self, msg):
        op = _Op(None, None, None)
        op.fail(msg)
        return self._make_work(op)

    def _drain(self):
        """Before a synchronous call stages a copy of a tensor (a non-contiguous input or output, a
        PREMUL_SUM scaling) or is issued behind calls with copy-backs pending: let what was issued
        before it complete and copy back, so that it sees what issue order says (the stream would run
        it in order, but on a stale copy, or before an earlier result is copied back). A synchronous
        call waits for those calls anyway. An asynchronous one does not wait here: it would block its
        caller, and ranks that issue calls on two groups in different orders (valid with NCCL) would
        wait for each other; it stages at call time (docs/PYTORCH.md). Ops no thread has begun to
        settle are settled here (this may be a settler, inside a callback)."""
        if not self._sync_call or not self._unsettled:
            return
        target = self._issued
        self._wait_seq(target)
        with self._lock:
            ops = [op for op in self._unsettled if op.seq <= target]
        self._settle(ops)
        for op in ops:
            op.raw.wait()

    def _issue(self, what, issue, ops):
        """With _lock held: put one batch on the stream for the given _Ops."""
        rc = issue(self._get_stream())
        if rc != _lib.ncclSuccess:
            err = RuntimeError(f"chorus: {what} failed on rank {self._rank}: {_lib.error_string(rc)}: "
                               f"{_lib.last_error(self._comm)}")
            for op in ops:
                op.fail(str(err))
            raise err
        self._issued += 1
        self._fast_update()
        for op in ops:
            op.seq = self._issued
            self._pending.append(op)
            self._unsettled.add(op)
        self._cv.notify()

    def start_coalescing(self):
        self._batch += 1
        self._fast_update()

    def end_coalescing(self):
        self._batch -= 1
        self._fast_update()
        if self._batch or not self._p2p:
            return self._done_work
        calls, self._p2p = self._p2p, []
        what = "coalesced " + "+".join(sorted({w for w, _, _ in calls}))

        def issue(s):
            lib.ncclGroupStart()
            rc = 0
            for _, fn, _ in calls:
                rc = rc or fn(s)
            return lib.ncclGroupEnd() or rc

        group = _Op(None, None, [], what)
        try:
            self._healthy()
            with self._lock:
                self._issue(what, issue, [op for _, _, op in calls] + [group])
        except RuntimeError as e:
            for _, _, op in calls:
                if not op.raw.done():
                    op.fail(str(e))
            return self._failed_work(str(e))
        return self._make_work(group)

    def _abandon_coalescing(self, why):
        """The body of a coalescing block raised, and torch's _coalescing_manager then never ends it
        (no try/finally): leave coalescing, so later calls run, and fail the calls queued in the
        block, which never will (__init__._wrap_coalescing_manager calls this)."""
        if not self._batch:
            return
        self._batch -= 1
        self._fast_update()
        if self._batch:
            return
        calls, self._p2p = self._p2p, []
        for what, _, op in calls:
            op.fail(f"chorus: {what} on rank {self._rank} was not run: its coalescing block raised: {why}")

    # The names torch's Python code calls on a ProcessGroup (older torch, AS_PROCESS_GROUP).
    def _start_coalescing(self, device=None):
        self.start_coalescing()

    def _end_coalescing(self, device=None):
        return self.end_coalescing()

    # ---- completion ----

    def _sync(self, settle_here=True):
        """Wait for the stream to drain; complete (or fail) what it ran, or return it to complete."""
        with self._sync_lock:
            with self._lock:
                target = self._issued
            rc = lib.chorusStreamSynchronize(self._stream) if self._stream is not None else 0
            with self._lock:
                if rc != _lib.ncclSuccess and self._first_bad is None:
                    self._first_bad = self._done_upto + 1
                    # The stream thread recorded the cause: on the communicator, or as the last error.
                    why = _lib.last_error(self._comm) or _lib.last_error(None)
                    self._error = f"chorus: an operation failed on rank {self._rank}: {_lib.error_string(rc)}: {why}"
                self._done_upto = max(self._done_upto, target)
                self._fast_update()
                done = [op for op in self._pending if op.seq <= target]
                self._pending = [op for op in self._pending if op.seq > target]
        if settle_here:
            self._settle(done)
        return done

    def _settle(self, done):
        """Copy back and complete the futures, without _lock: their callbacks may issue operations.
        Each op once, by the first thread to claim it (a settler, the watcher's hand-over, or _drain).
        A copy-back that raises fails its own op only: the thread and the rest of `done` go on."""
        for op in done:
            with self._lock:
                if op.claimed:
                    continue
                op.claimed = True
            bad = self._first_bad is not None and op.seq >= self._first_bad
            msg = self._error if bad else None
            if not bad and op.post is not None:
                try:
                    op.post()
                except Exception as e:
                    msg = f"chorus: {op.what or 'an operation'} on rank {self._rank}: copying the result back failed: {e}"
            op.keep = None
            try:
                if msg is not None:
                    op.fail(msg)
                else:
                    op.raw.set_result(op.result)
            except Exception:  # a done-callback that raised: the op is complete all the same
                pass
            with self._lock:
                self._unsettled.discard(op)
                if not self._unsettled:
                    self._fast_update()

    def _hand_over(self, done):
        """Watcher: have a settler thread complete `done`. A callback may block waiting for a later
        operation (PowerSGD's hook does), which only the watcher can see finish: so the watcher never
        runs callbacks itself, and a new settler starts whenever none is idle."""
        with self._lock:
            self._settle_q.extend(done)
            if self._settlers_idle:
                self._settle_cv.notify()
                return
            t = threading.Thread(target=self._settler_main, name="chorus-settler", daemon=True)
            self._settlers = [x for x in self._settlers if x.is_alive()] + [t]
        t.start()

    def _settler_main(self):
        while True:
            with self._lock:
                if not self._settle_q and self._closed:
                    return
                if not self._settle_q:
                    self._settlers_idle += 1
                    self._settle_cv.wait(timeout=None if self._settlers_idle == 1 else 1.0)
                    self._settlers_idle -= 1
                    if not self._settle_q:
                        if self._closed or self._settlers_idle:
                            return  # a spare (or the last, at shutdown) settler leaves
                        continue
                done, self._settle_q = self._settle_q, []
            self._settle(done)

    def _wait_seq(self, seq):
        while seq > self._done_upto:
            self._sync()

    def _watch_main(self):
        while True:
            with self._lock:
                while not self._closed and self._done_upto == self._issued:
                    self._cv.wait()
                if self._closed and self._done_upto == self._issued:
                    return
            done = self._sync(settle_here=False)
            if done:
                self._hand_over(done)

    # ---- lifetime ----

    def getBackendName(self):
        return "chorus"

    def _get_backend_name(self):
        return "chorus"

    def _stop_threads(self, timeout):
        """Let the watcher and the settlers finish and wait for them (up to timeout seconds): a daemon
        thread still inside torch's C++ code when the interpreter finalises aborts the process."""
        with self._lock:
            self._closed = True
            self._cv.notify_all()
            self._settle_cv.notify_all()
            threads = [self._watcher] + self._settlers
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in threads:
            if t is not None and t is not threading.current_thread():
                t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def _destroy(self, abort):
        if self._comm is None:
            return
        front, self._front = self._front, None  # the C++ side stops using the comm first (and the cycle breaks)
        if front is not None:
            front.set_fast(0, 0, False)
        if not abort and not self._closed:
            try:
                self._sync()
            except Exception:
                pass
        if abort:
            lib.ncclCommAbort(self._comm)  # wakes a watcher blocked on the stream
        self._stop_threads(None if not abort else 5)
        if self._stream is not None:
            lib.chorusStreamDestroy(self._stream)
            self._stream = None
        if not abort:
            lib.ncclCommDestroy(self._comm)
        self._comm = None  # later calls fail with "invalid argument" rather than touch freed memory

    def shutdown(self):
        self._destroy(abort=False)

    def abort(self):
        self._destroy(abort=True)


def _from_future(fut):
    return _create_work_from_future(fut)
