"""A PEP 517 build backend that needs nothing but the standard library, so that
`pip install ./python` works without a network (pip's isolated build has nothing to download).

The wheel holds the torch_chorus package and, when one is found, a copy of libchorus in
torch_chorus/lib/ (then the wheel is tagged for this platform): $CHORUS_LIBRARY, else the library
`make` built in this checkout (build/lib). Without one, torch_chorus loads the installed libchorus
(`make install`) through the dynamic loader at import time.
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
    lib = _library()
    tag = "py3-none-" + (sysconfig.get_platform().replace("-", "_").replace(".", "_") if lib else "any")
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
    wheel = (f"Wheel-Version: 1.0\nGenerator: chorus_wheel\nRoot-Is-Purelib: {'false' if lib else 'true'}\n"
             f"Tag: {tag}\n")
    files.append((f"{distinfo}/METADATA", _metadata(version).encode()))
    files.append((f"{distinfo}/WHEEL", wheel.encode()))
    files.append((f"{distinfo}/top_level.txt", f"{PKG}\n".encode()))
    record = [_record_line(n, d) for n, d in files] + [f"{distinfo}/RECORD,,"]
    files.append((f"{distinfo}/RECORD", ("\n".join(record) + "\n").encode()))
    os.makedirs(wheel_directory, exist_ok=True)
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files:
            info = zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if n.endswith(".so.0") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, d)
    return name
