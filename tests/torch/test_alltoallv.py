"""Uneven all_to_all over the chorus backend is one ncclAllToAllv (issue 48): all_to_all_single with
split sizes (Zipf-like, zeros among them, a rank that sends nothing) and all_to_all with tensors of
different lengths (empty ones too), every dtype, complex included; the flight recorder shows each as one
AllToAllv call and no sends or receives. Values in closed form: rank r's element k for rank p is
(100 r + 10 p + k % 7).

Usage: test_alltoallv.py [NRANKS]
"""
import os
import shutil
import sys
import tempfile

# Before torch_chorus is imported (by the harness): it reads the dump folder once.
TMP = tempfile.mkdtemp(prefix="chorus-a2av-")
os.environ["CHORUS_DUMP_DIR"] = TMP

from harness import check_equal, init, require_torch, spawn  # noqa: E402

torch, dist = require_torch()

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int32, torch.int64,
          torch.uint8, torch.complex64]


def rows(r, p, size):
    """Rows rank r sends to rank p: a Zipf-like 12 / (1 + k) with k moving with (r, p), zero for some
    pairs, none at all from the last rank."""
    if r == size - 1:
        return 0
    k = (3 * r + 5 * p) % (size + 2)
    return 0 if k == 2 else 12 // (1 + k)


def block(r, p, n, width, dtype):
    v = (100 * r + 10 * p + torch.arange(n * width) % 7).reshape(n, width)
    return v.to(dtype) if not dtype.is_complex else torch.complex(v.float(), -v.float()).to(dtype)


def check_single(rank, size):
    width = 3
    for dtype in DTYPES:
        in_splits = [rows(rank, p, size) for p in range(size)]
        out_splits = [rows(p, rank, size) for p in range(size)]
        inp = torch.cat([block(rank, p, in_splits[p], width, dtype) for p in range(size)])
        out = torch.full((sum(out_splits), width), 9, dtype=dtype)
        dist.all_to_all_single(out, inp, out_splits, in_splits)
        want = torch.cat([block(p, rank, out_splits[p], width, dtype) for p in range(size)])
        check_equal(torch, out, want, f"all_to_all_single uneven {dtype}")


def check_lists(rank, size):
    for dtype in DTYPES:
        ins = [block(rank, p, rows(rank, p, size), 2, dtype) for p in range(size)]
        outs = [torch.full((rows(p, rank, size), 2), 9, dtype=dtype) for p in range(size)]
        dist.all_to_all(outs, ins)
        for p in range(size):
            check_equal(torch, outs[p], block(p, rank, rows(p, rank, size), 2, dtype), f"all_to_all {dtype} [{p}]")


def body(rank, size, path):
    import torch_chorus

    init(dist, rank, size, path)
    check_single(rank, size)
    check_lists(rank, size)
    dist.barrier()
    with open(torch_chorus.dump_flight_recorder()) as f:
        calls = [line.split() for line in f if line[:1].isdigit()]
    names = [c[2] for c in calls]
    assert names.count("AllToAllv") == 2 * len(DTYPES), f"rank {rank}: calls recorded: {names}"
    assert "Send" not in names and "Recv" not in names, f"rank {rank}: sends recorded: {names}"
    dist.destroy_process_group()


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] else 3
    try:
        spawn(body, n, timeout=200)
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
    print(f"test_alltoallv: {n} ranks: uneven all_to_all_single and all_to_all as one ncclAllToAllv each")
