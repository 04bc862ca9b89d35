#!/usr/bin/env python3
"""torch.distributed backends side by side, in one sitting: chorus, gloo (and mpi where torch has it).

For each rank count, each backend: all_reduce (sum, in place), all_gather_into_tensor and
reduce_scatter_tensor (out of place) of float32 from --min to --max bytes, printed in the columns of
nccl-tests (size count type redop root time algbw busbw #wrong; time in us, bandwidths in GB/s, the
slowest rank's average), then the step times of a DDP model and of an FSDP2 (fully_shard) tiny
transformer. `chorus-c` is libchorus called directly through ctypes on the chorus backend's
communicator: the difference to `chorus` at 8 B is what the torch/Python layer adds per call.

    PYTHONPATH=build/python python3 bench/torch_bench.py -n 2,4,8 -b 8 -e 256M
    PYTHONPATH=build/python python3 bench/torch_bench.py -n 2 -b 8 -e 64K --ops all_reduce --no-ddp  # quick

Ranks are forked local processes (file:// rendezvous); each uses cores/nranks intra-op threads.
"""
import argparse
import multiprocessing
import os
import sys
import tempfile
import time

BUSBW = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
         "reduce_scatter": lambda n: (n - 1) / n}


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper().rstrip("B")
    return int(float(s[:-1]) * mult[s[-1]]) if s and s[-1] in mult else int(s)


def sizes(lo, hi, factor):
    s = lo
    while s <= hi:
        yield s
        s *= factor


def run_op(torch, dist, op, nbytes, size, rank, raw=None):
    """(seconds per call, wrong count) for one operation and size on the current default group."""
    count = max(1, nbytes // 4)
    if op == "all_reduce":
        buf = torch.ones(count)
        if raw is not None:
            lib, comm = raw
            p = buf.data_ptr()
            call = lambda: lib.ncclAllReduce(p, p, count, 7, 0, comm, None)  # noqa: E731
        else:
            call = lambda: dist.all_reduce(buf)  # noqa: E731
    elif op == "all_gather":
        count = max(1, count // size)
        inp, out = torch.full((count,), float(rank)), torch.empty(count * size)
        call = lambda: dist.all_gather_into_tensor(out, inp)  # noqa: E731
    else:
        count = max(1, count // size)
        inp, out = torch.ones(count * size), torch.empty(count)
        call = lambda: dist.reduce_scatter_tensor(out, inp)  # noqa: E731
    for _ in range(3):
        call()
    dist.barrier()
    t0 = time.perf_counter()
    call()
    one = time.perf_counter() - t0
    iters = int(max(5, min(2000, 0.25 / max(one, 1e-7))))
    t = torch.tensor([float(iters)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the same count everywhere
    iters = int(t.item())
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    dt = torch.tensor([(time.perf_counter() - t0) / iters])
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
    wrong = 0
    if op == "all_gather":
        buf = torch.empty(count * size)
        dist.all_gather_into_tensor(buf, torch.full((count,), float(rank)))
        wrong = int((buf != torch.arange(size).repeat_interleave(count).float()).sum())
    elif op == "reduce_scatter":
        out = torch.empty(count)
        dist.reduce_scatter_tensor(out, torch.ones(count * size))
        wrong = int((out != size).sum())
    elif raw is None:
        b = torch.ones(count)
        dist.all_reduce(b)
        wrong = int((b != size).sum())
    return dt.item(), wrong, count


def time_steps(torch, dist, step, steps):
    """Seconds per call of step() after 3 warm-up calls, the slowest rank's."""
    for _ in range(3):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    dt = torch.tensor([(time.perf_counter() - t0) / steps])
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
    return dt.item()


def ddp_step(torch, dist, steps):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(1024, 1024), torch.nn.ReLU()]
    net = DDP(torch.nn.Sequential(*layers, torch.nn.Linear(1024, 10)))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x, y = torch.randn(32, 1024), torch.randint(0, 10, (32,))

    def step():
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        opt.zero_grad()

    return time_steps(torch, dist, step, steps), sum(p.numel() for p in net.parameters())


def fsdp2_step(torch, dist, steps):
    """One FSDP2 (fully_shard) training step of a tiny transformer: its all-gathers of parameters and
    reduce-scatters of gradients are many small and medium collectives."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    d, vocab = 128, 1000
    layers = [torch.nn.TransformerEncoderLayer(d, 4, 256, dropout=0.0, batch_first=True) for _ in range(2)]
    net = torch.nn.Sequential(torch.nn.Embedding(vocab, d), *layers, torch.nn.Linear(d, vocab))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randint(0, vocab, (8, 32), generator=gen)

    def step():
        torch.nn.functional.cross_entropy(net(x).flatten(0, 1), x.flatten()).backward()
        opt.step()
        opt.zero_grad()

    return time_steps(torch, dist, step, steps), sum(p.numel() for p in net.parameters())  # DTensors: global


def rank_main(rank, size, path, backend, args, q):
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // size))
    import torch.distributed as dist

    import torch_chorus  # noqa: F401

    real = "chorus" if backend == "chorus-c" else backend
    dist.init_process_group(real, init_method="file://" + path, rank=rank, world_size=size)
    raw = None
    if backend == "chorus-c":
        from torch_chorus._lib import lib

        be = dist.group.WORLD._get_backend(torch.device("cpu"))
        be = getattr(be, "engine", be)  # the C++ Backend holds the Python engine, which has the comm
        raw = (lib, be._comm)
    rows = []
    ops = ["all_reduce"] if raw else args.ops
    for op in ops:
        for nbytes in sizes(args.min, args.max, args.factor):
            t, wrong, count = run_op(torch, dist, op, nbytes, size, rank, raw)
            rows.append((op, count * 4 * (size if op != "all_reduce" else 1), count, t, wrong))
    ddp = ddp_step(torch, dist, args.ddp_steps) if args.ddp and not raw else None
    fsdp = None
    if args.fsdp2 and not raw:
        try:
            fsdp = fsdp2_step(torch, dist, args.ddp_steps)
        except Exception as e:  # an older torch (no fully_shard), a backend without reduce_scatter
            if rank == 0:
                print(f"# FSDP2 step on {backend}: {e.__class__.__name__}: {e}", flush=True)
    if rank == 0:
        q.put((rows, ddp, fsdp))
    dist.destroy_process_group()


def run_backend(backend, size, args):
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    path = tempfile.mktemp(prefix="torch-bench-")
    procs = [ctx.Process(target=rank_main, args=(r, size, path, backend, args, q)) for r in range(size)]
    for p in procs:
        p.start()
    try:
        result = q.get(timeout=args.timeout)
    except Exception:
        result = None
    for p in procs:
        p.join(30)
        if p.is_alive():
            p.kill()
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--nranks", default="2", help="rank counts, comma separated (default 2)")
    ap.add_argument("-b", "--min", default="8", help="smallest size in bytes (default 8)")
    ap.add_argument("-e", "--max", default="256M", help="largest size (default 256M)")
    ap.add_argument("-f", "--factor", type=int, default=4, help="size multiplier (default 4)")
    ap.add_argument("--backends", default="chorus,chorus-c,gloo,mpi")
    ap.add_argument("--ops", default="all_reduce,all_gather,reduce_scatter")
    ap.add_argument("--no-ddp", dest="ddp", action="store_false")
    ap.add_argument("--ddp-steps", type=int, default=20, help="timed steps of the DDP and FSDP2 models")
    ap.add_argument("--no-fsdp2", dest="fsdp2", action="store_false", help="skip the FSDP2 step")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per backend and rank count")
    args = ap.parse_args()
    args.min, args.max = parse_size(args.min), parse_size(args.max)
    args.ops = args.ops.split(",")
    import torch
    import torch.distributed as dist

    import torch_chorus

    print(f"# torch {torch.__version__}, libchorus {torch_chorus.library_path}, {os.cpu_count()} cores")
    backends = []
    for b in args.backends.split(","):
        if b == "mpi" and not dist.is_mpi_available():
            print("# mpi: this torch build has no MPI backend: skipped")
            continue
        backends.append(b)
    for size in [int(x) for x in args.nranks.split(",")]:
        results = {}
        for b in backends:
            results[b] = run_backend(b, size, args)
            if results[b] is None:
                print(f"# {b} on {size} ranks: failed or timed out")
        for op in args.ops:
            print(f"\n# {op}, float32, {size} ranks" + (", sum" if op != "all_gather" else ""))
            print(f"# {'backend':>9} {'size':>12} {'count':>11} {'type':>6} {'redop':>6} {'root':>5} "
                  f"{'time':>9} {'algbw':>7} {'busbw':>7} {'#wrong':>6}")
            for b in backends:
                if not results.get(b):
                    continue
                for (rop, nbytes, count, t, wrong) in results[b][0]:
                    if rop != op:
                        continue
                    alg = nbytes / t / 1e9
                    print(f"  {b:>9} {nbytes:>12} {count:>11} {'float':>6} "
                          f"{'sum' if op != 'all_gather' else 'none':>6} {-1:>5} {t * 1e6:>9.2f} {alg:>7.2f} "
                          f"{alg * BUSBW[op](size):>7.2f} {wrong:>6}")
        if args.ddp:
            print(f"\n# DDP step (4 x Linear(1024) + head, batch 32, SGD), {size} ranks")
            for b in backends:
                r = results.get(b)
                if r and r[1]:
                    print(f"  {b:>9} {r[1][0] * 1e3:9.2f} ms/step  ({r[1][1]} parameters)")
        if args.fsdp2:
            print(f"\n# FSDP2 step (fully_shard: embedding 1000x128, 2 transformer layers d=128, head; "
                  f"batch 8 x 32 tokens, AdamW), {size} ranks")
            for b in backends:
                r = results.get(b)
                if r and len(r) > 2 and r[2]:
                    print(f"  {b:>9} {r[2][0] * 1e3:9.2f} ms/step")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
