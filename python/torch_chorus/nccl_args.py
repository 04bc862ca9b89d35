"""How c10d's arguments become NCCL's, for the CPU operations (backend.py) and the device ones
(device_ops.py) alike: tensor dtypes, reduce ops, element counts and the checks on them."""
import ctypes

import torch
import torch.distributed as dist

from . import _lib

_R = dist.ReduceOp.RedOpType

_DTYPES = {
    torch.float32: _lib.ncclFloat32,
    torch.float64: _lib.ncclFloat64,
    torch.float16: _lib.ncclFloat16,
    torch.bfloat16: _lib.ncclBfloat16,
    torch.int8: _lib.ncclInt8,
    torch.uint8: _lib.ncclUint8,
    torch.int32: _lib.ncclInt32,
    torch.int64: _lib.ncclInt64,
    torch.bool: _lib.ncclUint8,
}
for _name, _code in (("float8_e4m3fn", _lib.ncclFloat8e4m3), ("float8_e5m2", _lib.ncclFloat8e5m2),
                     ("uint32", _lib.ncclUint32), ("uint64", _lib.ncclUint64)):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = _code

_OPS = {_R.SUM: _lib.ncclSum, _R.PRODUCT: _lib.ncclProd, _R.MIN: _lib.ncclMin,
        _R.MAX: _lib.ncclMax, _R.AVG: _lib.ncclAvg}
# bool tensors: SUM is a logical or, PRODUCT a logical and (what ProcessGroupNCCL does).
_BOOL_OPS = {_R.SUM: _lib.ncclMax, _R.PRODUCT: _lib.ncclMin, _R.MIN: _lib.ncclMin, _R.MAX: _lib.ncclMax}
_PREMUL_DTYPES = (torch.float16, torch.float32, torch.bfloat16, torch.float64)  # what ProcessGroupNCCL takes


def _dtype(t):
    try:
        return _DTYPES[t.dtype]
    except KeyError:
        raise RuntimeError(f"chorus: unsupported tensor dtype {t.dtype}") from None


def _reduce_op(opts):
    """Older torch calls some *_coalesced methods without options: SUM then."""
    return opts.reduceOp if opts is not None else dist.ReduceOp.SUM


def _redop(op, t):
    """The NCCL op for a c10d ReduceOp on t's dtype, and the factor to scale the inputs by first
    (PREMUL_SUM: each rank's input times the factor, then a sum, in t's dtype as NCCL does; done
    by the caller rather than with ncclRedOpCreatePreMulSum, whose op would have to outlive a background
    call and be created beside it on the communicator: the CPU path scales a copy, the device path
    makes the op around each call)."""
    kind = op.op if hasattr(op, "op") else op
    if t.dtype == torch.bool:
        if kind in _BOOL_OPS:
            return _BOOL_OPS[kind], None
    elif t.is_complex():
        if kind in (_R.SUM, _R.AVG):
            return _OPS[kind], None
    elif kind in _OPS:
        return _OPS[kind], None
    elif kind == _R.PREMUL_SUM:
        if t.dtype not in _PREMUL_DTYPES:  # the scaled copy would be float: refuse, on every rank alike
            raise TypeError(f"chorus: PREMUL_SUM needs a half, float, bfloat16 or double tensor, got {t.dtype}")
        factor = getattr(op, "factor", None)
        if factor is None:
            raise RuntimeError("chorus: PREMUL_SUM needs a torch whose ReduceOp exposes its factor "
                               f"(ReduceOp.factor); torch {torch.__version__} does not")
        if isinstance(factor, torch.Tensor):
            factor = factor.item()
        return _lib.ncclSum, factor
    name = getattr(kind, "name", str(kind))
    if kind in (_R.BAND, _R.BOR, _R.BXOR):
        raise RuntimeError(f"chorus: ReduceOp.{name} is not supported (NCCL has no bitwise reductions)")
    raise RuntimeError(f"chorus: ReduceOp.{name} is not supported for {t.dtype} tensors")


def _check_cpu(t):
    if t.device.type != "cpu":
        raise RuntimeError(f"chorus: only CPU tensors are supported, got a tensor on {t.device}")
    if t.layout != torch.strided:
        raise RuntimeError(f"chorus: only dense tensors are supported, got layout {t.layout}")


def _real(t):
    """Complex tensors travel as their real pairs (only for data movement and sums)."""
    return torch.view_as_real(t) if t.is_complex() else t


def split_counts(t, given, size, what):
    """all_to_all_single's element counts per rank: t's rows split as `given` says (evenly if empty)."""
    rows = t.shape[0] if t.dim() else 1
    row = t.numel() // rows if rows else 0
    if not given:
        if rows % size:
            raise RuntimeError(f"chorus: all_to_all_single: {what} has {rows} rows, not a multiple of {size}")
        given = [rows // size] * size
    if len(given) != size or sum(given) != rows:
        raise RuntimeError(f"chorus: all_to_all_single: {what} split sizes {list(given)} do not "
                           f"cover its {rows} rows over {size} ranks")
    return [g * row for g in given]


def check_blocks(what, parts, wholes, size, whole_name):
    """Each whole tensor holds world_size parts of its pair's elements and dtype (all_gather_into_tensor:
    the output; reduce_scatter_tensor: the input); whole_name says which, in the message."""
    part_name = "input" if whole_name == "output" else "output"
    for p, w in zip(parts, wholes):
        if w.numel() != p.numel() * size or w.dtype != p.dtype:
            raise RuntimeError(f"chorus: {what}: the {whole_name} must hold world_size ({size}) times the "
                               f"{part_name}'s {p.numel()} elements of {p.dtype}")


def alltoallv(scount, sdispl, rcount, rdispl, dt, comm):
    """issue(sendptr, recvptr, stream) making one ncclAllToAllv call (counts and displacements in
    elements per rank; the arrays live as long as the function), or None where this libchorus has no
    ncclAllToAllv: the caller then groups ncclSend/ncclRecv calls instead."""
    fn = _lib.optional.get("ncclAllToAllv")
    if fn is None:
        return None
    n = len(scount)
    arrays = [(ctypes.c_size_t * n)(*a) for a in (scount, sdispl, rcount, rdispl)]

    def issue(sp, rp, s):
        return fn(sp, arrays[0], arrays[1], rp, arrays[2], arrays[3], dt, comm, s)

    return issue


def offsets(counts):
    """Displacements of blocks laid end to end."""
    out, at = [], 0
    for c in counts:
        out.append(at)
        at += c
    return out


def list_layout(tensors):
    """Separate tensors of one dtype as blocks of one buffer, for ncclAllToAllv: (base address,
    displacements in elements from it), or None where a tensor does not lie a whole number of elements
    from the lowest one. Empty tensors take displacement 0 (their data_ptr may be 0)."""
    es = tensors[0].element_size() if tensors else 1
    ptrs = [t.data_ptr() for t in tensors if t.numel()]
    base = min(ptrs) if ptrs else 0
    displs = []
    for t in tensors:
        d = t.data_ptr() - base if t.numel() else 0
        if d % es:
            return None
        displs.append(d // es)
    return base, displs
