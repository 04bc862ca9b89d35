"""Build torch_chorus's C++ front (the faster engine) into this installed package, for the torch this
interpreter imports:

    python -m torch_chorus.build_front

Needs a C++ compiler (CXX, else c++) and Python's headers; about 30 s. `pip install ./python` bundles
the front that `make` built in the checkout, when there is one; this is for an installation without
it, or after torch was upgraded. A copy of torch_chorus that `make` put in build/python is rebuilt by
`make` instead.
"""
import os
import sys


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        from . import _build_cext  # the wheel's copy of python/build_cext.py
    except ImportError:
        print("torch_chorus.build_front: this copy of torch_chorus was not installed from a wheel; "
              "`make` builds its C++ front", file=sys.stderr)
        return 2
    target = os.path.join(here, "_cbackend" + (_build_cext.sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
    if not os.access(here, os.W_OK):
        print(f"torch_chorus.build_front: cannot write to {here}", file=sys.stderr)
        return 1
    _build_cext.build(here, _build_cext.fingerprint(), target)
    if not os.path.exists(target):
        return 1
    print("torch_chorus.build_front: done; a new process uses the C++ front (torch_chorus.engine() == 'c++')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
