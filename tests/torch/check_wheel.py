"""The wheel that `pip install ./python` builds (python/build_backend/chorus_wheel.py), checked without
torch: it bundles the C++ front it is given (or finds in build/python) and leaves it out when told, it
ships what `python -m torch_chorus.build_front` needs, and, installed with pip into a virtual
environment, it declares the "torch.backends" entry point whose function only warns where torch_chorus
cannot be imported (here: no torch), since torch turns an exception there into a failed `import torch`.
"""
import os
import subprocess
import sys
import tempfile
import zipfile

PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "python")
sys.path.insert(0, os.path.join(PY, "build_backend"))
import chorus_wheel  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def build(out, front):
    os.environ["CHORUS_TORCH_FRONT"] = front
    name = chorus_wheel.build_wheel(out)
    with zipfile.ZipFile(os.path.join(out, name)) as z:
        return name, {n: z.read(n) for n in z.namelist()}


with tempfile.TemporaryDirectory() as d:
    fake = os.path.join(d, "_cbackend.cpython-399-fake.so")
    with open(fake, "wb") as f:
        f.write(b"not a module")
    name, files = build(os.path.join(d, "w1"), fake)
    check(files.get("torch_chorus/_cbackend.cpython-399-fake.so") == b"not a module", "the given front is bundled")
    check("-none-any" not in name, f"a wheel with a front is tagged for a platform: {name}")
    for n in ("torch_chorus/_build_cext.py", "torch_chorus/_cbackend.cpp", "torch_chorus/build_front.py",
              "torch_autoload_chorus.py", "torch_chorus/__init__.py"):
        check(n in files, f"{n} is in the wheel")
    ep = next((v.decode() for n, v in files.items() if n.endswith(".dist-info/entry_points.txt")), "")
    check("[torch.backends]" in ep and "chorus = torch_autoload_chorus:autoload" in ep, f"entry point: {ep!r}")
    record = next((v.decode() for n, v in files.items() if n.endswith(".dist-info/RECORD")), "")
    check(all(n in record for n in files), "RECORD lists every file")
    _, files = build(os.path.join(d, "w2"), "none")
    check(not [n for n in files if "_cbackend" in n and n.endswith(".so")], "CHORUS_TORCH_FRONT=none leaves it out")
    os.environ.pop("CHORUS_TORCH_FRONT")

    # Installed: the entry point is found where torch looks for it, and without torch it only warns.
    venv = os.path.join(d, "venv")
    r = subprocess.run([sys.executable, "-m", "venv", venv], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"note: no virtual environment (python3-venv missing?), install not checked: {r.stderr.strip()[-200:]}")
    else:
        py = os.path.join(venv, "bin", "python")
        env = dict(os.environ, CHORUS_TORCH_FRONT="none")
        env.pop("PYTHONPATH", None)
        r = subprocess.run([py, "-m", "pip", "install", "-q", "--no-index", os.path.join(d, "w2", os.listdir(
            os.path.join(d, "w2"))[0])], env=env, capture_output=True, text=True, timeout=300)
        check(r.returncode == 0, f"pip install: {r.stdout[-500:]}{r.stderr[-500:]}")
        probe = ("import warnings, importlib.metadata as m\n"
                 "eps = [e for e in m.entry_points(group='torch.backends') if e.name == 'chorus']\n"
                 "assert len(eps) == 1 and eps[0].value == 'torch_autoload_chorus:autoload', eps\n"
                 "with warnings.catch_warnings(record=True) as w:\n"
                 "    warnings.simplefilter('always')\n"
                 "    eps[0].load()()\n"
                 "assert any('chorus' in str(x.message) for x in w), [str(x.message) for x in w]\n"
                 "print('entry point ok')\n")
        r = subprocess.run([py, "-c", probe], env=env, cwd=d, capture_output=True, text=True, timeout=120)
        check(r.returncode == 0 and "entry point ok" in r.stdout, f"entry point: {r.stdout}{r.stderr[-1500:]}")

print("check_wheel: ok" if not failures else f"check_wheel: {len(failures)} checks failed")
sys.exit(1 if failures else 0)
