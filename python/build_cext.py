"""Build torch_chorus's C++ Backend (_cbackend.cpp) against the torch of this interpreter.

    python3 python/build_cext.py OUT_DIR

Compiles with the C++ compiler (CXX, else c++) using torch's include directories and libraries, the
way torch.utils.cpp_extension does, into OUT_DIR/_cbackend<EXT_SUFFIX>, and records the torch version
it was built for beside it. Never fails the build: without torch, a compiler or Python's headers it
says why and exits 0, and torch_chorus then registers its Python engine directly.
"""
import os
import subprocess
import sys
import sysconfig


def main():
    out_dir = sys.argv[1]
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_chorus", "_cbackend.cpp")
    target = os.path.join(out_dir, "_cbackend" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
    try:
        import torch
        from torch.utils import cpp_extension
        from torch._C._distributed_c10d import Backend

        class _Probe(Backend):
            pass

        _Probe(0, 1)  # only where Python may subclass Backend (torch >= 2.12 or so) is the wrapper used
    except Exception as e:  # no torch, no distributed, or an older torch (ProcessGroup path)
        print(f"note: torch_chorus C++ backend not built ({e.__class__.__name__}: {e}): the Python engine is used")
        return
    py_inc = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(py_inc, "Python.h")):
        print(f"note: torch_chorus C++ backend not built: no Python.h in {py_inc} (python3-dev)")
        return
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    flags = ["-O2", "-fPIC", "-shared", "-DTORCH_EXTENSION_NAME=_cbackend", "-DTORCH_API_INCLUDE_EXTENSION_H",
             f'-DCHORUS_TORCH_VERSION="{torch.__version__}"']
    flags += [f"-isystem{p}" for p in cpp_extension.include_paths()] + [f"-isystem{py_inc}"]
    libs = [f"-L{torch_lib}", "-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python"]
    cxx = os.environ.get("CXX", "c++")
    os.makedirs(out_dir, exist_ok=True)
    tmp = target + ".tmp"
    err = ""
    for std in ("-std=c++20", "-std=c++17"):
        r = subprocess.run([cxx, std, *flags, src, "-o", tmp, *libs], capture_output=True, text=True)
        if r.returncode == 0:
            os.replace(tmp, target)
            print(f"torch_chorus C++ backend built for torch {torch.__version__}: {target}")
            return
        err = r.stderr
    print(f"note: torch_chorus C++ backend not built ({cxx} failed): the Python engine is used\n{err[-2000:]}")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # never fail the build over an optional part
        print(f"note: torch_chorus C++ backend not built ({e.__class__.__name__}: {e}): the Python engine is used")
