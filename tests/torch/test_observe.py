"""The chorus backend seen from torch (docs/OBSERVE.md): its calls appear in torch.profiler traces as
"chorus::<call>" with their tensors' shapes (the C++ front, the default), and
torch_chorus.dump_flight_recorder writes the rank's flight recorder beside torch's own dumps
(CHORUS_DUMP_DIR, defaulting to TORCH_NCCL_DEBUG_INFO_TEMP_FILE's folder), where chorus-info --flight
reads it.

Usage: test_observe.py [NRANKS]
"""
import json
import os
import shutil
import sys
import tempfile

# Before torch_chorus is imported (by the harness): it reads these once, at import.
TMP = tempfile.mkdtemp(prefix="chorus-observe-")
os.environ.pop("CHORUS_DUMP_DIR", None)
os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = os.path.join(TMP, "nccl_trace_rank_")

from harness import init, require_torch, spawn  # noqa: E402

torch, dist = require_torch()


def body(rank, size, path, tmp):
    import torch_chorus

    init(dist, rank, size, path)
    t = torch.ones(1000)
    b = torch.zeros(300)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        dist.all_reduce(t)
        dist.broadcast(b, src=0)
    trace = os.path.join(tmp, f"prof-{rank}.json")
    prof.export_chrome_trace(trace)
    with open(trace) as f:
        events = json.load(f)["traceEvents"]
    names = [e.get("name") for e in events]
    backend_front = os.environ.get("CHORUS_TORCH_CPP", "1") != "0"
    if backend_front:
        for name, shape in (("chorus::allreduce", [1000]), ("chorus::broadcast", [300])):
            ev = [e for e in events if e.get("name") == name]
            assert ev, f"rank {rank}: no {name} in the profiler trace: {sorted(set(n for n in names if n))[:40]}"
            dims = ev[0].get("args", {}).get("Input Dims")
            assert dims and dims[0] == shape, f"rank {rank}: {name} has Input Dims {dims}, want [{shape}, ...]"
    path_fr = torch_chorus.dump_flight_recorder()
    assert os.path.dirname(path_fr) == tmp, f"rank {rank}: dump at {path_fr}, expected in {tmp}"
    with open(path_fr) as f:
        text = f.read()
    assert "\nreason request\n" in text and " AllReduce float32 sum -1 1000 " in text, text[:2000]
    dist.destroy_process_group()


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] else 2
    try:
        spawn(body, n, TMP, timeout=200)
        files = sorted(f for f in os.listdir(TMP) if f.startswith("chorus-fr-"))
        assert len(files) == n, files
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
    print(f"test_observe: {n} ranks: profiler events with shapes, flight recorder beside torch's dumps")
