"""python/build_cext.py builds the C++ Backend when what it depends on changes, and only then.

The build runs build_cext.py on every `make`; it must notice torch appearing, disappearing or changing
(it records a fingerprint beside the module) and otherwise return at once without importing torch.
With a copy of build_cext.py and _cbackend.cpp (so that edits to the tree meanwhile do not count) and a
temporary output directory, with this interpreter:
  1. torch hidden (sys.path entries holding it removed before build_cext.py runs): no module, a note why;
     run again: silent and quick;
  2. torch visible (it "appeared"): the module is built, imports, and says it is for this torch;
  3. again: quick, silent, not rebuilt;
  4. the recorded fingerprint says another torch version: rebuilt;
  5. torch hidden again (it "disappeared"): the module is removed, with a note why.
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

SKIP = 77
try:
    import torch  # noqa: F401  (only whether it is there)
except Exception as e:  # ImportError, or a broken install's OSError
    print(f"SKIP: torch is not importable ({e.__class__.__name__}: {e})")
    sys.exit(SKIP)

PYDIR = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "python"))
# Runs build_cext.py in this interpreter with every sys.path entry that holds torch removed.
HIDDEN = r"""
import importlib.util, os, runpy, sys
script, out = sys.argv[1], sys.argv[2]
sys.path[:] = [p for p in sys.path if not os.path.exists(os.path.join(p or os.curdir, "torch"))]
if importlib.util.find_spec("torch") is not None:
    sys.exit("torch could not be hidden")
sys.argv = [script, out]
runpy.run_path(script, run_name="__main__")
"""
BUILT_NOTE = "torch_chorus C++ backend built for torch"


def run(out, hidden=False):
    script = os.path.join(os.path.dirname(out), "python", "build_cext.py")  # the copy
    cmd = [sys.executable, "-c", HIDDEN, script, out] if hidden else [sys.executable, script, out]
    t = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=200)
    dt = time.monotonic() - t
    print(f"  {'hidden' if hidden else 'normal'}: rc {r.returncode}, {dt:.2f} s, stdout {r.stdout.strip()[:300]!r}")
    assert r.returncode == 0, (r.stdout, r.stderr)
    return r.stdout, dt


def modules(out):
    return glob.glob(os.path.join(out, "_cbackend*.so"))


with tempfile.TemporaryDirectory() as tmp:
    os.makedirs(os.path.join(tmp, "python", "torch_chorus"))
    for f in ("build_cext.py", "torch_chorus/_cbackend.cpp"):
        shutil.copy2(os.path.join(PYDIR, f), os.path.join(tmp, "python", f))
    out = os.path.join(tmp, "out")
    record = os.path.join(out, "_cbackend.fingerprint")

    print("1. torch hidden")
    stdout, _ = run(out, hidden=True)
    assert "not built" in stdout and "no torch" in stdout, stdout
    assert not modules(out), modules(out)
    with open(record) as f:
        assert json.load(f)["built"] is False
    stdout, dt = run(out, hidden=True)
    assert stdout == "" and dt < 5, (stdout, dt)

    print("2. torch visible: built")
    stdout, _ = run(out)
    if BUILT_NOTE not in stdout and "not built" in stdout:  # no compiler or no Python.h here: nothing to test
        print(f"SKIP: build_cext.py cannot build the front on this machine: {stdout.strip()}")
        sys.exit(SKIP)
    assert BUILT_NOTE in stdout, stdout
    (module,) = modules(out)
    check = ("import sys; sys.path.insert(0, sys.argv[1]); import torch, _cbackend; "
             "assert _cbackend.TORCH_VERSION == torch.__version__, (_cbackend.TORCH_VERSION, torch.__version__); "
             "print(_cbackend.TORCH_VERSION)")
    r = subprocess.run([sys.executable, "-c", check, out], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    print(f"  module imports, TORCH_VERSION {r.stdout.strip()}")
    mtime = os.stat(module).st_mtime_ns

    print("3. nothing changed: quick, silent, not rebuilt")
    stdout, dt = run(out)
    assert stdout == "" and dt < 5, (stdout, dt)
    assert modules(out) == [module] and os.stat(module).st_mtime_ns == mtime

    print("4. recorded for another torch version: rebuilt")
    with open(record) as f:
        rec = json.load(f)
    rec["fingerprint"]["torch"]["version"] = "0.0.1"
    with open(record, "w") as f:
        json.dump(rec, f)
    time.sleep(0.01)
    stdout, _ = run(out)
    assert BUILT_NOTE in stdout, stdout
    assert modules(out) == [module] and os.stat(module).st_mtime_ns != mtime
    stdout, dt = run(out)
    assert stdout == "" and dt < 5, (stdout, dt)

    print("5. torch hidden again: the module is removed")
    stdout, _ = run(out, hidden=True)
    assert "not built" in stdout and "no torch" in stdout, stdout
    assert not modules(out), modules(out)
print("PASS")
