"""`pip install ./python` works offline and the installed package finds its libchorus.

In a throwaway virtual environment that sees the system's torch (--system-site-packages), install
with --no-index (no network), then, from outside the source tree and without PYTHONPATH, run a 2-rank
all_reduce with the library it bundled, the backend found through the wheel's "torch.backends" entry
point (torch 2.5+: no `import torch_chorus` before init_process_group). The installed package runs the
engine the build tree runs (the C++ front, bundled, where `make` built one) and says nothing about it;
installed again without the front, it warns once, naming `python -m torch_chorus.build_front`, and
reports the Python engine; after that command (where the build tree has a front, so a compiler is
here) it runs the C++ front without a word.
"""
import os
import subprocess
import sys
import tempfile

from harness import SKIP, require_torch

require_torch()
SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "python")
CHILD = r"""
import os, sys, tempfile, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch, torch.distributed as dist, torch.multiprocessing as mp
    autoloaded = "torch_chorus" in sys.modules
    import torch_chorus
said = [str(w.message) for w in caught if "torch_chorus" in str(w.message)]
def run(rank, path):
    dist.init_process_group("chorus", init_method="file://" + path, rank=rank, world_size=2)
    t = torch.ones(4); dist.all_reduce(t); assert t.tolist() == [2.0] * 4, t
    dist.destroy_process_group()
if __name__ == "__main__":
    print("library:", torch_chorus.library_path, "engine:", torch_chorus.engine(), "warnings:", said)
    assert torch_chorus.library_path.startswith(sys.prefix), torch_chorus.library_path
    if torch_chorus._torch_version() >= (2, 5):
        assert autoloaded, "the torch.backends entry point did not import torch_chorus"
    assert torch_chorus.engine() == os.environ["WANT_ENGINE"], torch_chorus.engine()
    if os.environ["WANT_WARNING"] == "1":
        assert len(said) == 1 and "build_front" in said[0], said
    else:
        assert not said, said
    mp.start_processes(run, args=(tempfile.mktemp(),), nprocs=2, start_method="fork")
    print("installed package: ok")
"""

import torch_chorus  # noqa: E402  the build tree's (PYTHONPATH): the engine the installed one must match
from torch_chorus import _engine  # noqa: E402

BUILT_ENGINE = torch_chorus.engine()
FRONT_POSSIBLE = not _engine.AS_PROCESS_GROUP and os.environ.get("CHORUS_TORCH_CPP", "1") != "0"

with tempfile.TemporaryDirectory() as d:
    venv = os.path.join(d, "venv")
    r = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"SKIP: cannot create a virtual environment (python3-venv missing?): {r.stderr.strip()[-300:]}")
        sys.exit(SKIP)
    py = os.path.join(venv, "bin", "python")
    # Let it see this interpreter's torch even when this interpreter is itself a venv (whose packages
    # --system-site-packages would not reach): a .pth naming torch's site directory.
    import torch

    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site, "parent-torch.pth"), "w") as f:
        f.write(os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__))) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CHORUS_LIBRARY")}
    env["CHORUS_LIBRARY"] = os.environ.get("CHORUS_TEST_LIBRARY", "")  # the library under test, if given
    if not env["CHORUS_LIBRARY"]:
        del env["CHORUS_LIBRARY"]
    with open(os.path.join(d, "child.py"), "w") as f:
        f.write(CHILD)
    env.pop("LOCAL_RANK", None)
    # As built (the front bundled where `make` built one), then without the front.
    for front, want, warn in ((None, BUILT_ENGINE, "0"), ("none", "python", "1" if FRONT_POSSIBLE else "0")):
        e = dict(env)
        if front:
            e["CHORUS_TORCH_FRONT"] = front
        subprocess.run([py, "-m", "pip", "install", "-q", "--no-index", "--force-reinstall", "--no-deps", SRC], env=e,
                       check=True, timeout=120)
        e.pop("CHORUS_LIBRARY", None)
        e.pop("CHORUS_TORCH_FRONT", None)
        e.update(WANT_ENGINE=want, WANT_WARNING=warn)
        subprocess.run([py, os.path.join(d, "child.py")], env=e, cwd=d, check=True, timeout=120)
    if BUILT_ENGINE == "c++":  # a compiler is here: the remedy the warning names builds the front in place
        e = dict(env, WANT_ENGINE="c++", WANT_WARNING="0")
        e.pop("CHORUS_LIBRARY", None)
        subprocess.run([py, "-W", "ignore", "-m", "torch_chorus.build_front"], env=e, cwd=d, check=True, timeout=400)
        subprocess.run([py, os.path.join(d, "child.py")], env=e, cwd=d, check=True, timeout=120)
print("PASS")
