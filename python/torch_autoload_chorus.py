"""The "torch.backends" entry point of the installed torch_chorus (torch 2.5 and newer load these at
`import torch`): imports torch_chorus, which registers the "chorus" backend, so that
dist.init_process_group("chorus") works without `import torch_chorus`. A top-level module, not the
package, so that a torch_chorus that fails to import costs a warning, not `import torch` itself
(torch turns an entry point's exception into a RuntimeError). TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns
all such loading off.
"""


def autoload():
    try:
        import torch_chorus  # noqa: F401
    except Exception as e:
        import warnings

        warnings.warn(f"torch_chorus did not load, so the \"chorus\" backend is not registered "
                      f"({e.__class__.__name__}: {e})", RuntimeWarning)
