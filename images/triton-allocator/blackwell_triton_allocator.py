"""Give Triton a torch-backed default allocator in every thread and process.

Since Triton 3.5, `triton.set_allocator` stores the allocator in a ContextVar:
a new thread, and every spawned process, sees the NullAllocator again, and
kernels that need global scratch (device-side tensor descriptors, TMA; vLLM's
FLA/GDN kernels on capability >= 9.0) fail with 'Kernel requires a runtime
memory allocation, but no allocator was set'.

This module is imported from a .pth line at interpreter start-up. It imports
nothing there beyond `os` and `sys` (both already loaded by `site`): it only registers an import hook.
When `triton.runtime._allocation` is first imported, the hook replaces that
module's ContextVar with one whose *default* allocates through torch, so the
fix holds in every context while an explicit `triton.set_allocator` still wins.
"""

import os
import sys

_MODULE = "triton.runtime._allocation"
INSTALLED_ATTR = "_blackwell_default_allocator"


class TorchAllocator:
    """Allocates Triton's scratch memory as a torch uint8 tensor on the current device."""

    def __call__(self, size, alignment, stream):
        import torch  # only when a kernel really needs scratch

        # torch's caching allocator aligns blocks to 512 bytes; over-allocate for larger requests.
        if alignment > 512:
            buf = torch.empty(size + alignment, dtype=torch.uint8, device="cuda")
            return _Offset(buf, (-buf.data_ptr()) % alignment)
        return torch.empty(size, dtype=torch.uint8, device="cuda")


class _Offset:
    def __init__(self, buf, offset):
        self._buf = buf  # keeps the memory alive as long as Triton holds this
        self._offset = offset

    def data_ptr(self):
        return self._buf.data_ptr() + self._offset


def _patch(module):
    from contextvars import ContextVar

    current = module._allocator
    if isinstance(getattr(module, INSTALLED_ATTR, None), TorchAllocator):
        return
    default = TorchAllocator()
    replacement = ContextVar("_allocator", default=default)
    # Keep an allocator that was set before we got here (same context).
    value = current.get()
    if not isinstance(value, module.NullAllocator):
        replacement.set(value)
    module._allocator = replacement
    setattr(module, INSTALLED_ATTR, default)


class _Loader:
    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        try:
            _patch(module)
        except Exception as exc:  # never break `import triton`; the qualification check reports it
            sys.stderr.write(f"blackwell_triton_allocator: could not install the default allocator: {exc}\n")


class _Finder:
    """A meta-path finder that only wraps the loader of Triton's allocation module."""

    def find_spec(self, name, path=None, target=None):
        if name != _MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader)
                return spec
        return None


def install():
    # An off switch, so qualification can show the failure this hook prevents.
    if os.environ.get("BLACKWELL_TRITON_ALLOCATOR") == "off":
        return
    if _MODULE in sys.modules:  # imported before us (unusual): patch in place
        _patch(sys.modules[_MODULE])
        return
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
