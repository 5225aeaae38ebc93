"""Is Triton's default allocator installed, in this interpreter, a new thread
and a spawned process? And did nothing heavy load at start-up?

usage: triton_allocator.py startup | check
`startup` must run in a fresh interpreter: it only looks at sys.modules.
"""

import json
import sys


def startup():
    print(json.dumps({
        "triton_loaded": "triton" in sys.modules,
        "torch_loaded": "torch" in sys.modules,
        "hook_loaded": "blackwell_triton_allocator" in sys.modules,
        "hook_on_meta_path": any(type(f).__name__ == "_Finder" and type(f).__module__ == "blackwell_triton_allocator"
                                 for f in sys.meta_path),
    }))


def _describe():
    from triton.runtime import _allocation

    allocator = _allocation._allocator.get()
    return {"type": type(allocator).__module__ + "." + type(allocator).__name__,
            "is_null": isinstance(allocator, _allocation.NullAllocator)}


def _in_thread():
    import threading

    box = {}
    thread = threading.Thread(target=lambda: box.update(_describe()))
    thread.start()
    thread.join()
    return box


def check():
    import multiprocessing

    import triton

    result = {"triton": triton.__version__, "main": _describe(), "thread": _in_thread()}
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        result["spawned"] = pool.apply(_describe)
    # An explicit set_allocator must still win over the default.
    marker = type("ExplicitAllocator", (), {"__call__": lambda self, size, align, stream: None})()
    triton.set_allocator(marker)
    result["explicit_wins"] = _describe()["type"].endswith("ExplicitAllocator")
    print(json.dumps(result))


if __name__ == "__main__":
    {"startup": startup, "check": check}[sys.argv[1]]()
