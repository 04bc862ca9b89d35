"""torch_chorus: a torch.distributed backend named "chorus" for CPU tensors, running on libchorus.

    import torch_chorus                  # registers the backend
    import torch.distributed as dist
    dist.init_process_group("chorus")    # or "cpu:chorus,cuda:nccl"; env://, tcp://, file://, store=
"""
import torch

__version__ = "0.1.0"
MIN_TORCH = (2, 1)


def _torch_version():
    parts = []
    for p in torch.__version__.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


if _torch_version() < MIN_TORCH:
    raise ImportError(
        f"torch_chorus supports PyTorch {MIN_TORCH[0]}.{MIN_TORCH[1]} and newer (the c10d Backend API of "
        f"2.x); this is PyTorch {torch.__version__}"
    )

import torch.distributed as dist  # noqa: E402

if not dist.is_available():
    raise ImportError("torch_chorus: this PyTorch build has no torch.distributed")

from . import _lib  # noqa: E402
from .ops import ChorusBackend, create_backend_ext  # noqa: E402,F401

library_path = _lib.library_path
chorus_version = _lib.version()

if "CHORUS" not in dist.Backend._plugins if hasattr(dist.Backend, "_plugins") else True:
    dist.Backend.register_backend("chorus", create_backend_ext, extended_api=True, devices=["cpu"])

