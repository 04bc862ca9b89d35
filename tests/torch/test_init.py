"""Every way torch starts a process group reaches chorus through the store it hands the backend.

env://, tcp://, file://, store=, torchrun (which sets the environment), mixed device backends
("cpu:chorus,cuda:nccl" with CUDA, "cpu:chorus,cuda:gloo" without), destroy and init again.
"""
import os
import socket
import subprocess
import sys

from harness import check_equal, require_torch, spawn

torch, dist = require_torch()


def free_port():
    # Below the kernel's ephemeral range (32768-60999): a port the kernel hands out for another
    # socket's implicit bind (our own bootstrap's, a parallel test's) cannot take it between this
    # check and rank 0's listen, as one from bind(0) could (seen in CI: EADDRINUSE).
    import random
    for _ in range(200):
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32000")


def check_world(rank, size, how):
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    check_equal(torch, t, torch.full((5,), float(size * (size + 1) // 2)), f"all_reduce after {how}")
    sub = dist.new_group([0, size - 1])
    if rank in (0, size - 1):
        t = torch.ones(2)
        dist.all_reduce(t, group=sub)
        check_equal(torch, t, torch.full((2,), 2.0), f"subgroup after {how}")
    dist.barrier()


def body(rank, size, path, how, port):
    if how == "env":
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size))
        dist.init_process_group("chorus", init_method="env://")
    elif how == "tcp":
        dist.init_process_group("chorus", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    elif how == "file":
        dist.init_process_group("chorus", init_method="file://" + path, rank=rank, world_size=size)
    elif how == "store":
        store = dist.TCPStore("127.0.0.1", port, size, is_master=(rank == 0))
        dist.init_process_group("chorus", store=store, rank=rank, world_size=size)
    elif how == "mixed":
        cuda = torch.cuda.is_available() and torch.cuda.device_count() >= size
        backend = "cpu:chorus,cuda:nccl" if cuda else "cpu:chorus,cuda:gloo"
        dist.init_process_group(backend, init_method="file://" + path, rank=rank, world_size=size)
        assert dist.get_backend() == backend, dist.get_backend()
        if cuda:
            torch.cuda.set_device(rank)
            g = torch.ones(3, device="cuda")
            dist.all_reduce(g)
            check_equal(torch, g.cpu(), torch.full((3,), float(size)), "cuda all_reduce beside chorus")
        if rank == 0:
            print(f"test_init: {backend}: CPU tensors on chorus" + (", CUDA tensors on NCCL" if cuda else ""))
    check_world(rank, size, how)
    dist.destroy_process_group()
    if how == "file":  # and once more, in the same process
        dist.init_process_group("chorus", init_method="file://" + path + ".2", rank=rank, world_size=size)
        check_world(rank, size, "init after destroy")
        dist.destroy_process_group()


EXIT_CHILD = r"""
import sys, tempfile, torch, torch.distributed as dist, torch_chorus
dist.init_process_group("chorus", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
t = torch.ones(4)
for _ in range(300):
    dist.all_reduce(t, async_op=True).wait()
    dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()).wait()
print("exiting without destroy_process_group")
"""


def exit_without_destroy():
    """Asynchronous work, then exit without destroy_process_group: the process must exit 0. Threads
    left inside torch's C++ code at interpreter finalisation aborted it ("terminate called without an
    active exception", 1 run in 3 of a longer loop under load); this is not a reliable reproducer."""
    for i in range(3):
        r = subprocess.run([sys.executable, "-c", EXIT_CHILD], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise SystemExit(f"FAIL: exit without destroy_process_group: status {r.returncode}: {r.stderr[-500:]}")
    print("test_init: exit without destroy_process_group: ok")


def torchrun_child():
    dist.init_process_group("chorus")  # torchrun's environment: env://
    rank, size = dist.get_rank(), dist.get_world_size()
    check_world(rank, size, "torchrun")
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--torchrun-child"]:
        torchrun_child()
        sys.exit(0)
    n = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] else 2
    for how in ("env", "tcp", "file", "store", "mixed"):
        spawn(body, n, how, free_port(), timeout=120)
        print(f"test_init: {how}: ok")
    exit_without_destroy()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
                        os.path.abspath(__file__), "--torchrun-child"], env=env, timeout=180)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: torchrun exited with {r.returncode}")
    print("test_init: torchrun: ok")
    print("PASS")
