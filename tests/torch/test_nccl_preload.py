"""PyTorch's own NCCL backend on Chorus: `LD_PRELOAD=build/lib/libnccl.so.2` replaces the libnccl.so.2
that libtorch_cuda.so needs: a preloaded library comes first in the global symbol scope.

Checked here without a GPU: `import torch` succeeds with Chorus in NCCL's place (the dynamic linker
binds every nccl* symbol torch imports when it loads, so one missing symbol fails the import), each of
those symbols binds to Chorus, and torch reports NCCL as available. Creating a ProcessGroupNCCL needs a GPU ("no GPUs found" otherwise): that part runs on the
GPU machines. Skipped where torch has no CUDA build (the CPU wheel has no libtorch_cuda.so).
"""
import os
import subprocess
import sys

from harness import SKIP, require_torch

torch, dist = require_torch()
lib = os.environ.get("CHORUS_TEST_NCCL_LIBRARY")
if not lib or not os.path.exists(lib):
    print(f"SKIP: CHORUS_TEST_NCCL_LIBRARY ({lib}) is not a file")
    sys.exit(SKIP)
cuda_lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cuda.so")
if not os.path.exists(cuda_lib):
    print(f"SKIP: torch {torch.__version__} is a CPU build (no libtorch_cuda.so): it loads no NCCL")
    sys.exit(SKIP)

CHILD = r"""
import ctypes, sys
import torch, torch.distributed as dist
ours = ctypes.CDLL(sys.argv[1])
maps = open("/proc/self/maps").read()
assert sys.argv[1] in maps
# torch 2.15 also loads its wheel's libnccl.so.2 by path (_preload_cuda_deps), but a preloaded library
# comes first in the global scope, through which libtorch_cuda.so binds its nccl* references: every
# one of them must be Chorus's.
glob = ctypes.CDLL(None)
addr = lambda lib, name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
names = sys.argv[2].split()
assert names, "no nccl* imports listed"
wrong = [n for n in names if addr(glob, n) != addr(ours, n)]
assert not wrong, f"bound elsewhere: {wrong}"
assert dist.is_nccl_available()
v = ctypes.c_int()
assert glob.ncclGetVersion(ctypes.byref(v)) == 0
print("libtorch_cuda.so's", len(names), "nccl* imports bind to", sys.argv[1], "| ncclGetVersion", v.value,
      "| torch", torch.__version__, "built with NCCL", torch.cuda.nccl.version())
"""

# The nccl* symbols libtorch_cuda.so imports, from its dynamic symbol table (binutils' nm).
try:
    out = subprocess.run(["nm", "-D", "--undefined-only", cuda_lib], capture_output=True, text=True, check=True).stdout
except (OSError, subprocess.CalledProcessError) as e:
    print(f"SKIP: cannot list libtorch_cuda.so's imports with nm: {e}")
    sys.exit(SKIP)
imports = sorted({l.split()[-1].split("@")[0] for l in out.splitlines() if l.split()[-1].startswith("nccl")})

real = os.path.realpath(lib)
env = dict(os.environ, LD_PRELOAD=real)
r = subprocess.run([sys.executable, "-c", CHILD, real, " ".join(imports)], env=env, capture_output=True, text=True, timeout=120)
print(r.stdout, end="")
if r.returncode != 0:
    print(r.stderr[-3000:])
    sys.exit(1)
print("torch loads Chorus as libnccl.so.2: ok")
