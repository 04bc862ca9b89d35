"""ctypes bindings to libchorus (the NCCL host API plus chorus.h).

The library is searched in this order, the first that loads wins:
  1. $CHORUS_LIBRARY (a path to libchorus.so),
  2. the copy bundled into the package by `pip install ./python` (torch_chorus/lib/),
  3. the library of the build tree that produced this package (`_build_config.py`, written by CMake),
  4. the dynamic loader's search path (`make install`, ldconfig, LD_LIBRARY_PATH).
CDLL (not PyDLL) releases the GIL for the duration of every call, so background Python threads and
other ranks' work in this process go on while a collective runs.
"""
import ctypes
import ctypes.util
import os

NCCL_UNIQUE_ID_BYTES = 128

ncclSuccess = 0
ncclInProgress = 7

# ncclDataType_t
ncclInt8, ncclUint8, ncclInt32, ncclUint32, ncclInt64, ncclUint64 = 0, 1, 2, 3, 4, 5
ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16 = 6, 7, 8, 9
ncclFloat8e4m3, ncclFloat8e5m2 = 10, 11

# ncclRedOp_t
ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg = 0, 1, 2, 3, 4

ncclScalarHostImmediate = 1


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * NCCL_UNIQUE_ID_BYTES)]


class Config(ctypes.Structure):
    """The head of ncclConfig_t: the library takes a shorter struct from older headers and keeps its
    defaults for the fields it lacks."""

    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint),
                ("blocking", ctypes.c_int)]

    def __init__(self, blocking):
        # size: the bytes up to blocking's end, not sizeof (its tail padding would read as cgaClusterSize)
        super().__init__(Config.blocking.offset + ctypes.sizeof(ctypes.c_int), 0xCAFEBEEF, 23102,
                         blocking)  # NCCL_VERSION(2, 31, 2)


_P = ctypes.c_void_p
_I = ctypes.c_int
_Z = ctypes.c_size_t

# name: (argtypes); every function returns ncclResult_t except where restype is given below.
_PROTOS = {
    "ncclGetVersion": [ctypes.POINTER(_I)],
    "chorusGetVersion": [ctypes.POINTER(_I)],
    "ncclGetUniqueId": [ctypes.POINTER(UniqueId)],
    "ncclCommInitRank": [ctypes.POINTER(_P), _I, UniqueId, _I],
    "ncclCommInitRankConfig": [ctypes.POINTER(_P), _I, UniqueId, _I, ctypes.POINTER(Config)],
    "ncclCommSplit": [_P, _I, _I, ctypes.POINTER(_P), ctypes.POINTER(Config)],
    "ncclCommCount": [_P, ctypes.POINTER(_I)],
    "ncclCommUserRank": [_P, ctypes.POINTER(_I)],
    "ncclCommDestroy": [_P],
    "ncclCommAbort": [_P],
    "ncclCommGetAsyncError": [_P, ctypes.POINTER(_I)],
    "chorusCommSetTimeout": [_P, ctypes.c_double],
    "ncclRedOpCreatePreMulSum": [ctypes.POINTER(_I), _P, _I, _I, _P],
    "ncclRedOpDestroy": [_I, _P],
    "ncclAllReduce": [_P, _P, _Z, _I, _I, _P, _P],
    "ncclBroadcast": [_P, _P, _Z, _I, _I, _P, _P],
    "ncclReduce": [_P, _P, _Z, _I, _I, _I, _P, _P],
    "ncclAllGather": [_P, _P, _Z, _I, _P, _P],
    "ncclReduceScatter": [_P, _P, _Z, _I, _I, _P, _P],
    "ncclAlltoAll": [_P, _P, _Z, _I, _P, _P],
    "ncclGather": [_P, _P, _Z, _I, _I, _P, _P],
    "ncclScatter": [_P, _P, _Z, _I, _I, _P, _P],
    "ncclSend": [_P, _Z, _I, _I, _P, _P],
    "ncclRecv": [_P, _Z, _I, _I, _P, _P],
    "ncclGroupStart": [],
    "ncclGroupEnd": [],
    "chorusStreamCreate": [ctypes.POINTER(_P)],
    "chorusStreamSynchronize": [_P],
    "chorusStreamQuery": [_P],
    "chorusStreamDestroy": [_P],
    "ncclGetErrorString": [_I],
    "ncclGetLastError": [_P],
}
_STRING_RESULT = ("ncclGetErrorString", "ncclGetLastError")
# Bound where the library has them (a libchorus older than this package lacks them): None otherwise.
_OPTIONAL = {
    "chorusCommStallReport": [_P, ctypes.c_char_p, _Z, ctypes.POINTER(_Z)],
    "chorusCommDumpFlightRecorder": [_P, ctypes.c_char_p, _Z],
    "chorusCommSetWireFormat": [_P, ctypes.c_char_p],
    "ncclCommShrink": [_P, ctypes.POINTER(_I), _I, ctypes.POINTER(_P), ctypes.POINTER(Config), _I],
    # RCCL's and NCCLX's call, a Chorus extension (include/chorus.h): counts and displacements per rank
    "ncclAllToAllv": [_P, ctypes.POINTER(_Z), ctypes.POINTER(_Z), _P, ctypes.POINTER(_Z), ctypes.POINTER(_Z), _I,
                      _P, _P],
}
NCCL_SPLIT_NOCOLOR = -1


def _candidates():
    env = os.environ.get("CHORUS_LIBRARY")
    if env:
        yield env
        return  # an explicit choice is never silently replaced by another library
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "lib", "libchorus.so.0")
    try:
        from ._build_config import LIBCHORUS  # written by python/CMakeLists.txt

        yield LIBCHORUS
    except ImportError:
        pass
    yield "libchorus.so.0"
    found = ctypes.util.find_library("chorus")
    if found:
        yield found


def _load():
    tried = []
    for cand in _candidates():
        if os.path.isabs(cand) and not os.path.exists(cand):
            tried.append(f"{cand} (missing)")
            continue
        try:
            lib = ctypes.CDLL(cand)
        except OSError as e:
            tried.append(f"{cand} ({e})")
            continue
        if not hasattr(lib, "chorusStreamCreate"):
            tried.append(f"{cand} (not libchorus: no chorusStreamCreate)")
            continue
        for name, args in _PROTOS.items():
            fn = getattr(lib, name)
            fn.argtypes = args
            fn.restype = ctypes.c_char_p if name in _STRING_RESULT else ctypes.c_int
        for name, args in _OPTIONAL.items():
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.argtypes, fn.restype = args, ctypes.c_int
            optional[name] = fn
        return lib, cand
    raise ImportError(
        "torch_chorus: cannot load libchorus; set CHORUS_LIBRARY=/path/to/libchorus.so. Tried: "
        + "; ".join(tried)
    )


optional = {}
lib, library_path = _load()


def set_wire_format(comm, fmt):
    """chorusCommSetWireFormat (docs/WIRE.md); raises RuntimeError with the library's reason."""
    fn = optional.get("chorusCommSetWireFormat")
    if fn is None:
        raise RuntimeError("torch_chorus: this libchorus has no wire formats (chorusCommSetWireFormat)")
    rc = fn(comm, str(fmt).encode())
    if rc != 0:
        raise RuntimeError(f"torch_chorus.set_wire_format({fmt!r}): {error_string(rc)}: {last_error(comm)}")


def dump_flight_recorder(comm):
    """chorusCommDumpFlightRecorder: the dump's path; raises RuntimeError with the library's reason."""
    fn = optional.get("chorusCommDumpFlightRecorder")
    if fn is None:
        raise RuntimeError("torch_chorus: this libchorus has no flight recorder (chorusCommDumpFlightRecorder)")
    buf = ctypes.create_string_buffer(4096)
    rc = fn(comm, buf, len(buf))
    if rc != ncclSuccess:
        raise RuntimeError(f"chorus: writing the flight recorder failed: {error_string(rc)}: {last_error(comm)}")
    return buf.value.decode()


def stall_report(comm):
    """The job-wide stall report of comm's ranks (chorusCommStallReport), or "" where the library has
    no such call or it fails."""
    fn = optional.get("chorusCommStallReport")
    if fn is None or not comm:
        return ""
    need = _Z(0)
    buf = ctypes.create_string_buffer(16384)
    if fn(comm, buf, len(buf), ctypes.byref(need)) != ncclSuccess:
        return ""
    if need.value >= len(buf):  # a large job's report: ask again with room for all of it
        buf = ctypes.create_string_buffer(need.value + 4096)
        if fn(comm, buf, len(buf), ctypes.byref(need)) != ncclSuccess:
            return ""
    return buf.value.decode(errors="replace")


def error_string(rc):
    s = lib.ncclGetErrorString(rc)
    return s.decode(errors="replace") if s else f"error {rc}"


def last_error(comm):
    s = lib.ncclGetLastError(comm)
    return s.decode(errors="replace") if s else ""


def version():
    v = ctypes.c_int()
    lib.chorusGetVersion(ctypes.byref(v))
    return v.value
