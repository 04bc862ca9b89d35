"""Shared pieces of the torch_chorus tests: skip when torch is missing, start ranks, compare.

Ranks are forked processes (torch is imported once, before the fork, and no thread runs yet), each
joining a process group through a file:// rendezvous. A rank that fails prints its traceback and exits
non-zero; the parent then stops the others and fails. Exit status 77 means "skipped" to ctest.
"""
import multiprocessing
import os
import sys
import tempfile
import traceback

SKIP = 77


def require_torch():
    """Import torch and torch_chorus, or exit 77 saying why."""
    try:
        import torch  # noqa: F401
        import torch.distributed as dist
    except Exception as e:  # ImportError, or a broken install's OSError
        print(f"SKIP: torch is not importable ({e.__class__.__name__}: {e}); "
              "`pip install torch` to run the torch_chorus tests")
        sys.exit(SKIP)
    if not dist.is_available():
        print("SKIP: this torch build has no torch.distributed")
        sys.exit(SKIP)
    try:
        import torch_chorus  # noqa: F401
    except ImportError as e:
        if "supports PyTorch" in str(e):
            print(f"SKIP: {e}")
            sys.exit(SKIP)
        raise
    return torch, dist


def _child(fn, rank, nranks, path, args):
    try:
        fn(rank, nranks, path, *args)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)


def spawn(fn, nranks, *args, timeout=180, expect=None):
    """Run fn(rank, nranks, init_file, *args) in nranks forked processes. `expect` maps a rank to the
    exit code it must end with (default 0); returns the exit codes."""
    ctx = multiprocessing.get_context("fork")
    fd, path = tempfile.mkstemp(prefix="chorus-torch-")
    os.close(fd)
    os.unlink(path)  # file:// wants a path that does not exist yet
    procs = [ctx.Process(target=_child, args=(fn, r, nranks, path, args)) for r in range(nranks)]
    for p in procs:
        p.start()
    import time

    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
    codes = []
    for r, p in enumerate(procs):
        if p.is_alive():
            print(f"FAIL: rank {r} still running after {timeout} s (hang): killing it")
            p.kill()
            p.join()
            codes.append(None)
        else:
            codes.append(p.exitcode)
    try:
        os.unlink(path)
    except OSError:
        pass
    want = [(expect or {}).get(r, 0) for r in range(nranks)]
    if codes != want:
        raise SystemExit(f"FAIL: rank exit codes {codes}, expected {want}")
    return codes


def init(dist, rank, nranks, path, backend="chorus", **kw):
    dist.init_process_group(backend, init_method="file://" + path, rank=rank, world_size=nranks, **kw)


def check_equal(torch, got, want, what):
    """Exact equality (the inputs are small integers: every dtype and order gives the same result)."""
    if got.dtype != want.dtype:
        want = want.to(got.dtype)
    if not torch.equal(got, want):
        raise AssertionError(f"{what}: got {got.flatten()[:8].tolist()}... expected {want.flatten()[:8].tolist()}...")


def expect_error(fn, words, what):
    try:
        fn()
    except RuntimeError as e:
        msg = str(e)
        if not all(w in msg for w in words):
            raise AssertionError(f"{what}: RuntimeError without {words}: {msg}") from e
        return msg
    raise AssertionError(f"{what}: no RuntimeError")
