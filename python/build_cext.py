"""Build torch_chorus's C++ Backend (_cbackend.cpp) against the torch of this interpreter.

    python3 python/build_cext.py OUT_DIR

Compiles with the C++ compiler (CXX, else c++) using torch's include directories and libraries, the
way torch.utils.cpp_extension does, into OUT_DIR/_cbackend<EXT_SUFFIX>, and records the torch version
it was built for in the module. Never fails the build: without torch, a compiler or Python's headers it
says why, removes any module left from before and exits 0, and torch_chorus then registers its
Python engine directly.

The build runs this on every `make`, so it first decides, without importing torch (seconds), whether
there is anything to do: a fingerprint of what the outcome depends on (this interpreter, where torch
is and its version.py and libraries' size and time, the compiler, Python.h, the hashes of
_cbackend.cpp and of this script) is compared with the one recorded in OUT_DIR/_cbackend.fingerprint
by the last run. When they match and the module is there as recorded, it exits at once, silently.
Otherwise it rebuilds (or removes the module), and records the fingerprint only after an outcome that
the fingerprint determines: a module built, or no module because there is no usable torch, no compiler
or no Python.h. After a failed compile nothing is recorded, so the next build tries again.
"""
import glob
import hashlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig

_HERE = os.path.dirname(os.path.abspath(__file__))
# In python/ the source is in the package; in an installed package (torch_chorus/_build_cext.py, which
# `python -m torch_chorus.build_front` runs) beside this script.
SRC = (os.path.join(_HERE, "_cbackend.cpp") if os.path.isfile(os.path.join(_HERE, "_cbackend.cpp"))
       else os.path.join(_HERE, "torch_chorus", "_cbackend.cpp"))
FINGERPRINT = "_cbackend.fingerprint"


def _digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _stat(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def _torch_location():
    """torch's package directory, found without importing it (None where there is none)."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        return None  # absent, or a namespace package (what an uninstall can leave behind)
    return os.path.dirname(os.path.abspath(spec.origin))


def fingerprint():
    """What the outcome depends on, cheaply (no torch import)."""
    cxx = os.environ.get("CXX", "c++")
    cxx_path = shutil.which((shlex.split(cxx) or [""])[-1])  # the compiler of "ccache g++"
    py_inc = sysconfig.get_paths()["include"]
    fp = {
        "python": sys.executable,
        "python_version": sys.version,
        "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
        "python_h": os.path.exists(os.path.join(py_inc, "Python.h")),
        "cxx": cxx,
        "cxx_path": cxx_path and os.path.realpath(cxx_path),
        "cxx_stat": cxx_path and _stat(cxx_path),
        "source": _digest(SRC),
        "script": _digest(os.path.abspath(__file__)),
        "torch": None,
    }
    tdir = _torch_location()
    if tdir is not None:
        try:
            with open(os.path.join(tdir, "version.py")) as f:
                version_py = f.read()
        except OSError:
            version_py = None
        m = re.search(r"""^__version__\s*=\s*['"]([^'"]*)['"]""", version_py or "", re.M)
        fp["torch"] = {
            "dir": tdir,
            "version": m and m.group(1),
            "version_py": version_py and hashlib.sha256(version_py.encode()).hexdigest(),
            "files": {name: _stat(os.path.join(tdir, name))
                      for name in ("__init__.py", "lib/libc10.so", "lib/libtorch.so", "lib/libtorch_cpu.so",
                                   "lib/libtorch_python.so")},
        }
    return fp


def _remove_modules(out_dir, keep=None):
    """Remove _cbackend modules (any interpreter's) and partial outputs, but `keep`."""
    for p in glob.glob(os.path.join(out_dir, "_cbackend*.so")) + glob.glob(os.path.join(out_dir, "_cbackend*.tmp")):
        if p != keep:
            try:
                os.remove(p)
            except OSError:
                pass


def _record(out_dir, fp, built, note):
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, FINGERPRINT)
    with open(path + ".tmp", "w") as f:
        json.dump({"fingerprint": fp, "built": built, "note": note}, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(path + ".tmp", path)


def _not_built(out_dir, fp, note, definite):
    """No module: say why, remove any left from before, and record the outcome where it is definite."""
    print(f"note: torch_chorus C++ backend not built ({note}): the Python engine is used")
    _remove_modules(out_dir)
    if definite:
        _record(out_dir, fp, False, note)


def build(out_dir, fp, target):
    if fp["torch"] is None:
        return _not_built(out_dir, fp, "no torch for this interpreter", True)
    try:
        import torch
        from torch.utils import cpp_extension
        from torch._C._distributed_c10d import Backend

        class _Probe(Backend):
            pass

        _Probe(0, 1)  # only where Python may subclass Backend (torch >= 2.12 or so) is the wrapper used
    except Exception as e:  # a broken torch, no distributed, or an older torch (ProcessGroup path)
        # Determined by torch's files, which the fingerprint covers: not tried again on every build.
        return _not_built(out_dir, fp, f"{e.__class__.__name__}: {e}", True)
    py_inc = sysconfig.get_paths()["include"]
    if not fp["python_h"]:
        return _not_built(out_dir, fp, f"no Python.h in {py_inc} (python3-dev)", True)
    if not fp["cxx_path"]:
        return _not_built(out_dir, fp, f"no C++ compiler {fp['cxx']!r} (set CXX)", True)
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    flags = ["-O2", "-fPIC", "-shared", "-DTORCH_EXTENSION_NAME=_cbackend", "-DTORCH_API_INCLUDE_EXTENSION_H",
             f'-DCHORUS_TORCH_VERSION="{torch.__version__}"']
    flags += [f"-isystem{p}" for p in cpp_extension.include_paths()] + [f"-isystem{py_inc}"]
    libs = [f"-L{torch_lib}", "-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python"]
    cxx = shlex.split(fp["cxx"])  # CXX="ccache g++" is a command
    os.makedirs(out_dir, exist_ok=True)
    tmp = target + ".tmp"
    err, killed = "", False
    for std in ("-std=c++20", "-std=c++17"):
        r = subprocess.run([*cxx, std, *flags, SRC, "-o", tmp, *libs], capture_output=True, text=True)
        if r.returncode == 0:
            os.replace(tmp, target)
            _remove_modules(out_dir, keep=target)  # another interpreter's, from before
            _record(out_dir, fp, True, f"built for torch {torch.__version__}")
            print(f"torch_chorus C++ backend built for torch {torch.__version__}: {target}")
            return
        err, killed = r.stderr, r.returncode < 0
    # A compiler killed by a signal (out of memory, say) may pass next time: not recorded, so the next
    # build tries again. One that reports errors fails the same way until an input changes: recorded,
    # so an unchanged make does not spend a minute failing again.
    _not_built(out_dir, fp, f"{fp['cxx']} failed", not killed)
    print(err[-2000:])


def main():
    out_dir = sys.argv[1]
    target = os.path.join(out_dir, "_cbackend" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
    record = os.path.join(out_dir, FINGERPRINT)
    fp = fingerprint()
    try:
        with open(record) as f:
            last = json.load(f)
        if last["fingerprint"] == fp and os.path.exists(target) == bool(last["built"]):
            return  # nothing changed
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        os.remove(record)  # until this run's outcome is known
    except OSError:
        pass
    build(out_dir, fp, target)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # never fail the build over an optional part
        print(f"note: torch_chorus C++ backend not built ({e.__class__.__name__}: {e}): the Python engine is used")
        try:
            _remove_modules(sys.argv[1])
            os.remove(os.path.join(sys.argv[1], FINGERPRINT))
        except Exception:
            pass
