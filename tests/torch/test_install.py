"""`pip install ./python` works offline and the installed package finds its libchorus.

In a throwaway virtual environment that sees the system's torch (--system-site-packages), install
with --no-index (no network), then, from outside the source tree and without PYTHONPATH, import
torch_chorus and run a 2-rank all_reduce with the library it bundled.
"""
import os
import subprocess
import sys
import tempfile

from harness import SKIP, require_torch

require_torch()
SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "python")
CHILD = r"""
import sys, tempfile, torch, torch.distributed as dist, torch.multiprocessing as mp
import torch_chorus
def run(rank, path):
    dist.init_process_group("chorus", init_method="file://" + path, rank=rank, world_size=2)
    t = torch.ones(4); dist.all_reduce(t); assert t.tolist() == [2.0] * 4, t
    dist.destroy_process_group()
if __name__ == "__main__":
    print("library:", torch_chorus.library_path)
    assert torch_chorus.library_path.startswith(sys.prefix), torch_chorus.library_path
    mp.start_processes(run, args=(tempfile.mktemp(),), nprocs=2, start_method="fork")
    print("installed package: ok")
"""

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
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-index", SRC], env=env, check=True, timeout=120)
    env.pop("CHORUS_LIBRARY", None)
    with open(os.path.join(d, "child.py"), "w") as f:
        f.write(CHILD)
    subprocess.run([py, os.path.join(d, "child.py")], env=env, cwd=d, check=True, timeout=120)
print("PASS")
