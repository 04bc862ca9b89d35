"""A PEP 517 build backend that needs nothing but the standard library, so that
`pip install ./python` works without a network (pip's isolated build has nothing to download).

The wheel holds the torch_chorus package and, when one is found, a copy of libchorus in
torch_chorus/lib/ (then the wheel is tagged for this platform): $CHORUS_LIBRARY, else the library
`make` built in this checkout (build/lib). Without one, torch_chorus loads the installed libchorus
(`make install`) through the dynamic loader at import time.

It also bundles the C++ front (the faster engine) that `make` built for the torch python3 sees
(build/python/torch_chorus/_cbackend*.so), or $CHORUS_TORCH_FRONT ("none": leave it out); it loads only
under the torch it was built for. Without it the installed package warns on import and says how to
build it in place: `python -m torch_chorus.build_front`, which uses the _build_cext.py and
_cbackend.cpp shipped for that. The "torch.backends" entry point (torch_autoload_chorus.py) makes torch
import torch_chorus, so that init_process_group("chorus") needs no `import torch_chorus`.
"""
import base64
import hashlib
import os
import re
import sysconfig
import zipfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
PKG = "torch_chorus"
DIST = "torch_chorus"
# torch (2.5+) calls each "torch.backends" entry point at the end of `import torch`.
ENTRY_POINTS = "[torch.backends]\nchorus = torch_autoload_chorus:autoload\n"


def _version():
    with open(os.path.join(HERE, PKG, "__init__.py")) as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


def _library():
    env = os.environ.get("CHORUS_LIBRARY")
    if env:
        if not os.path.isfile(env):
            raise RuntimeError(f"CHORUS_LIBRARY={env} is not a file")
        return os.path.realpath(env)
    built = os.path.join(HERE, os.pardir, "build", "lib", "libchorus.so.0")
    return os.path.realpath(built) if os.path.isfile(built) else None


def _front():
    """(name in the package, path) of the C++ front to bundle, or None."""
    env = os.environ.get("CHORUS_TORCH_FRONT")
    if env == "none":
        return None
    if env:
        if not os.path.isfile(env):
            raise RuntimeError(f"CHORUS_TORCH_FRONT={env} is not a file")
        name = os.path.basename(env)
        return (name if name.startswith("_cbackend") else "_cbackend" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"),
                env)
    built = os.path.join(HERE, os.pardir, "build", "python", PKG)
    found = sorted(f for f in os.listdir(built) if f.startswith("_cbackend") and f.endswith(".so")) \
        if os.path.isdir(built) else []
    return (found[0], os.path.join(built, found[0])) if found else None


def _metadata(version):
    return (f"Metadata-Version: 2.1\nName: torch-chorus\nVersion: {version}\n"
            "Summary: A torch.distributed backend (\"chorus\") for CPU tensors over the Chorus library\n"
            "Requires-Python: >=3.8\nLicense: see the Chorus repository\n\n"
            "Needs PyTorch 2.1 or newer (not listed as a dependency, so that installing this never "
            "fetches or replaces torch).\n")


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = _version()
    lib, front = _library(), _front()
    binary = bool(lib or front)
    tag = "py3-none-" + (sysconfig.get_platform().replace("-", "_").replace(".", "_") if binary else "any")
    name = f"{DIST}-{version}-{tag}.whl"
    distinfo = f"{DIST}-{version}.dist-info"
    files = []
    for fn in sorted(os.listdir(os.path.join(HERE, PKG))):
        if fn.endswith(".py") and fn != "_build_config.py":
            with open(os.path.join(HERE, PKG, fn), "rb") as f:
                files.append((f"{PKG}/{fn}", f.read()))
    if lib:
        with open(lib, "rb") as f:
            files.append((f"{PKG}/lib/libchorus.so.0", f.read()))
    if front:
        with open(front[1], "rb") as f:
            files.append((f"{PKG}/{front[0]}", f.read()))
    # what `python -m torch_chorus.build_front` builds the front with
    for src, dst in (("build_cext.py", f"{PKG}/_build_cext.py"), (f"{PKG}/_cbackend.cpp", f"{PKG}/_cbackend.cpp"),
                     ("torch_autoload_chorus.py", "torch_autoload_chorus.py")):
        with open(os.path.join(HERE, src), "rb") as f:
            files.append((dst, f.read()))
    wheel = (f"Wheel-Version: 1.0\nGenerator: chorus_wheel\nRoot-Is-Purelib: {'false' if binary else 'true'}\n"
             f"Tag: {tag}\n")
    files.append((f"{distinfo}/METADATA", _metadata(version).encode()))
    files.append((f"{distinfo}/WHEEL", wheel.encode()))
    files.append((f"{distinfo}/top_level.txt", f"{PKG}\ntorch_autoload_chorus\n".encode()))
    files.append((f"{distinfo}/entry_points.txt", ENTRY_POINTS.encode()))
    record = [_record_line(n, d) for n, d in files] + [f"{distinfo}/RECORD,,"]
    files.append((f"{distinfo}/RECORD", ("\n".join(record) + "\n").encode()))
    os.makedirs(wheel_directory, exist_ok=True)
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files:
            info = zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if n.endswith((".so.0", ".so")) else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, d)
    return name
