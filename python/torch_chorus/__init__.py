"""torch_chorus: a torch.distributed backend named "chorus" for CPU and CUDA tensors, running on libchorus.

    import torch_chorus                  # registers the backend
    import torch.distributed as dist
    dist.init_process_group("chorus")    # or "cpu:chorus,cuda:nccl"; env://, tcp://, file://, store=
"""
import torch

__version__ = "0.1.0"
MIN_TORCH = (2, 1)


def _torch_version():
    parts = []
    for p in torch.__version__.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


if _torch_version() < MIN_TORCH:
    raise ImportError(
        f"torch_chorus supports PyTorch {MIN_TORCH[0]}.{MIN_TORCH[1]} and newer (the c10d Backend API of "
        f"2.x); this is PyTorch {torch.__version__}"
    )

import torch.distributed as dist  # noqa: E402

if not dist.is_available():
    raise ImportError("torch_chorus: this PyTorch build has no torch.distributed")

import os  # noqa: E402

# Flight recorder dumps (docs/OBSERVE.md) go beside torch's own (TORCH_NCCL_DEBUG_INFO_TEMP_FILE's folder,
# /tmp by default) unless CHORUS_DUMP_DIR says otherwise: set before the library reads its parameters.
os.environ.setdefault("CHORUS_DUMP_DIR", os.path.dirname(os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") or
                                                         "/tmp/nccl_trace_rank_") or ".")

from . import _lib  # noqa: E402
from . import _engine, backend  # noqa: E402
from .backend import ChorusBackend, create_backend_ext  # noqa: E402,F401

library_path = _lib.library_path
chorus_version = _lib.version()


def engine():
    """Which engine serves this process's chorus groups: "c++" (the C++ front, _cbackend.cpp, with the
    Python engine behind it: a small all_reduce takes about half the time) or "python" (the Python
    engine alone: CHORUS_TORCH_CPP=0, an older torch, or a front that is missing or for another torch)."""
    return "c++" if backend._cext is not None else "python"


def _say_engine():
    """Once per process, where the faster engine could run but is missing: what is missing and how to
    get it. Not where the Python engine was chosen (CHORUS_TORCH_CPP=0) or is the only one this torch
    can take (older torch: the backend is a whole ProcessGroup)."""
    why = backend.cext_missing
    if why is None or _engine.AS_PROCESS_GROUP or os.environ.get("LOCAL_RANK", "0") != "0":
        return  # the same on every rank of a host: said by its first
    import warnings

    warnings.warn(f"torch_chorus: the C++ front is not loaded ({why}): the slower Python engine is used (a "
                  "small all_reduce takes about twice as long). To get it: `python -m torch_chorus.build_front` "
                  "(a C++ compiler and Python's headers), or `make` in the Chorus checkout where this python3 "
                  "sees this torch, then `pip install ./python` again. CHORUS_TORCH_CPP=0 chooses the Python "
                  "engine and silences this.", RuntimeWarning, stacklevel=3)


_say_engine()



def _devices():
    """The device types the backend serves: CHORUS_TORCH_DEVICES ("cpu" or "cpu,cuda"), else cuda too
    where this torch is a CUDA build and the machine has a GPU. Asked through NVML (or the driver's
    device node), not the CUDA runtime: initialising CUDA here would break the ranks a launcher forks
    after `import torch_chorus`. One backend object serves both; its device calls run on a communicator
    of their own (device_ops.py)."""
    given = os.environ.get("CHORUS_TORCH_DEVICES")
    if given:
        return [d.strip() for d in given.split(",") if d.strip()]
    if torch.version.cuda is None:
        return ["cpu"]
    count = getattr(torch.cuda, "_device_count_nvml", None)
    try:
        gpus = count() > 0 if count is not None else os.path.exists("/dev/nvidiactl")
    except Exception:
        gpus = os.path.exists("/dev/nvidiactl")
    return ["cpu", "cuda"] if gpus else ["cpu"]


devices = _devices()
if "CHORUS" not in dist.Backend._plugins if hasattr(dist.Backend, "_plugins") else True:
    dist.Backend.register_backend("chorus", create_backend_ext, extended_api=True, devices=devices)



def _wrap_batch_isend_irecv():
    """Where the backend is a whole ProcessGroup (older torch), torch's batch_isend_irecv does not
    coalesce a Python group: mark the batch so that its sends and receives go out as one NCCL group
    (posted one by one, an exchange of large messages would wait on itself)."""
    import functools

    c10d = dist.distributed_c10d
    orig = c10d.batch_isend_irecv
    if getattr(orig, "_chorus_wrapped", False):
        return

    @functools.wraps(orig)
    def batch_isend_irecv(p2p_op_list):
        groups = []
        for op in p2p_op_list:
            g = op.group if op.group is not None else c10d._get_default_group()
            if isinstance(g, ChorusBackend) and not any(x is g for x in groups):
                groups.append(g)
        for g in groups:
            g.start_coalescing()
        try:
            works = orig(p2p_op_list)
        except BaseException as e:  # nothing of the batch is issued: fail what was queued
            for g in groups:
                g._abandon_coalescing(e)
            raise
        for g in groups:
            g.end_coalescing()
        return works

    batch_isend_irecv._chorus_wrapped = True
    c10d.batch_isend_irecv = batch_isend_irecv
    dist.batch_isend_irecv = batch_isend_irecv


def _chorus_engine(group, device):
    """The chorus engine serving group's device, or None."""
    if isinstance(group, ChorusBackend):
        return group
    try:
        b = group._get_backend(torch.device(device) if device is not None else torch.device("cpu"))
    except Exception:  # no backend for that device, or not a ProcessGroup
        return None
    b = getattr(b, "engine", b)  # the C++ front holds the engine
    return b if isinstance(b, ChorusBackend) else None


def _wrap_coalescing_manager():
    """torch's _coalescing_manager (batch_isend_irecv uses it) has no try/finally: when its body raises
    (an unsupported dtype in a batch, say), the group stays in torch's coalescing state (later
    all_reduces are only recorded) and the backend stays coalescing (later calls are only queued), and
    every later call on the group returns as if it ran. For chorus groups, undo both, then re-raise."""
    import contextlib
    import functools

    c10d = dist.distributed_c10d
    orig = getattr(c10d, "_coalescing_manager", None)
    if orig is None or getattr(orig, "_chorus_wrapped", False):
        return

    @functools.wraps(orig)
    @contextlib.contextmanager
    def _coalescing_manager(*args, **kwargs):
        # torch's own parameters pass through as given (a later torch may add some); only these two
        # are read, by name or position as torch 2.x declares them: (group=None, device=None, ...)
        group = kwargs.get("group", args[0] if args else None)
        device = kwargs.get("device", args[1] if len(args) > 1 else None)
        entered = False
        try:
            with orig(*args, **kwargs) as cm:
                entered = True
                yield cm
        except BaseException as e:
            g = (group if group is not None else c10d._get_default_group()) if entered else None
            engine = _chorus_engine(g, device) if g is not None else None
            if engine is not None:
                state = getattr(getattr(c10d, "_world", None), "pg_coalesce_state", None)
                if state is not None:
                    state.pop(g, None)
                if device:  # the manager started the backend's coalescing
                    engine._abandon_coalescing(e)
            raise

    _coalescing_manager._chorus_wrapped = True
    c10d._coalescing_manager = _coalescing_manager
    if hasattr(dist, "_coalescing_manager"):
        dist._coalescing_manager = _coalescing_manager


_wrap_coalescing_manager()
if _engine.AS_PROCESS_GROUP:
    _wrap_batch_isend_irecv()


def _hide_from_dynamo():
    """torch.compile's Dynamo intercepts every Python frame that starts while a compiled function runs,
    the backend's own included: a collective issued from a compiled step (DDP's hooks under compiled
    autograd, functional collectives) reaches this package's methods through torch's C++ dispatch,
    Dynamo then traces them, guards on objects that are new at every call (the ReduceOp) and fails a
    guard on the frame it just made. Gloo has no Python frames. Every code object of this package is
    marked to run as is, it and everything it calls (the flag torch's own markers use: no per-call
    cost, and torch._dynamo, slow to import, is not imported)."""
    import types

    import os

    ef = getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None)
    set_strategy = getattr(ef, "set_code_exec_strategy", None)
    if set_strategy is not None:
        skip = ef._FrameExecStrategy(ef._FrameAction.SKIP, ef._FrameAction.SKIP)
        mark = lambda code: set_strategy(code, skip)  # noqa: E731
    elif getattr(ef, "skip_code", None) is not None:  # older torch: not recursive, but every frame of ours is marked
        mark = ef.skip_code
    else:
        return
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    seen = set()

    def visit_code(code):
        # Only code written in this package (a decorator's shared wrapper, contextlib's say, is not ours).
        if code in seen or not os.path.abspath(code.co_filename).startswith(here):
            return
        seen.add(code)
        mark(code)
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                visit_code(c)

    def visit(obj, depth=0):
        fn = getattr(obj, "__func__", obj)  # methods, staticmethod, classmethod
        fn = getattr(fn, "__wrapped__", fn) if not hasattr(fn, "__code__") else fn
        if isinstance(fn, types.FunctionType) and fn.__module__.startswith(__name__):
            visit_code(fn.__code__)
            wrapped = getattr(fn, "__wrapped__", None)  # functools.wraps wrappers: the original too
            if isinstance(wrapped, types.FunctionType):
                visit_code(wrapped.__code__)
        elif isinstance(obj, property):
            for f in (obj.fget, obj.fset, obj.fdel):
                if f is not None:
                    visit(f, depth)
        elif isinstance(obj, type) and obj.__module__.startswith(__name__) and depth == 0:
            for v in vars(obj).values():
                visit(v, 1)

    import sys

    for name, mod in list(sys.modules.items()):
        if mod is not None and (name == __name__ or name.startswith(__name__ + ".")):
            for v in list(vars(mod).values()):
                visit(v)
    c10d = dist.distributed_c10d  # this package's wrappers installed there
    for name in ("batch_isend_irecv", "_coalescing_manager"):
        visit(getattr(c10d, name, None))


try:
    _hide_from_dynamo()
except Exception as e:  # private torch API: a torch that changed it still imports the package
    import warnings

    warnings.warn(f"torch_chorus: collectives inside torch.compile may fail on this torch ({e.__class__.__name__}: {e})")


def set_wire_format(fmt, group=None):
    """Compress `group`'s (default: the default group's) float32 and bfloat16 collectives on their network
    hops from now on: "off", "bf16", "fp16", "fp8e4m3", "fp8e5m2" or "mx8", a trailing "!" to use it even
    where the cost model says the link is fast (docs/WIRE.md). Every rank calls it alike, between calls
    (queued calls finish first); CHORUS_WIRE_FORMAT sets it for every group instead. CPU and CUDA tensors."""
    if group is None:
        group = dist.distributed_c10d._get_default_group()
    engine = _chorus_engine(group, None)
    if engine is None:
        raise RuntimeError("torch_chorus.set_wire_format: the group has no chorus backend")
    engine._sync()
    _lib.set_wire_format(engine._comm, fmt)
    engine._wire_format = fmt  # for the device communicator, split at the first call on CUDA tensors
    dcomm = getattr(engine, "_dcomm", None)
    if dcomm is not None:
        _lib.set_wire_format(dcomm, fmt)


def dump_flight_recorder(group=None):
    """Write this rank's flight recorder for `group` (default: the default group) now, as torch's
    _dump_nccl_trace does for NCCL: CHORUS_DUMP_DIR/chorus-fr-<comm>-r<rank>.txt, which
    `chorus-info --flight DIR` reads with the other ranks' files. Returns the file's path."""
    if group is None:
        group = dist.distributed_c10d._get_default_group()
    engine = _chorus_engine(group, None)
    if engine is None:
        raise RuntimeError("torch_chorus.dump_flight_recorder: the group has no chorus backend for CPU tensors")
    return _lib.dump_flight_recorder(engine._comm)
