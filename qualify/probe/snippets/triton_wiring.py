"""Which ptxas would Triton use for a capability? Asked through Triton's own code.

usage: triton_wiring.py CAPABILITY_NUMBER   (e.g. 121)
Triton 3.6-3.8 pick `ptxas-blackwell` for capability >= 100 (3.9: >= 90);
3.5 has one ptxas. A configured path that fails `--version` is silently
replaced by the bundled binary, so the answer must come from Triton itself.
"""

import inspect
import json
import os
import sys


def main():
    arch = int(sys.argv[1])
    out = {"arch": arch}
    import triton

    out["triton"] = triton.__version__
    from triton.backends.nvidia import compiler

    get_ptxas = getattr(compiler, "get_ptxas", None)
    tool = None
    if get_ptxas is not None:
        params = inspect.signature(get_ptxas).parameters
        tool = get_ptxas(arch) if params else get_ptxas()
        out["selector"] = "compiler.get_ptxas(arch)" if params else "compiler.get_ptxas()"
    else:  # older Triton: one ptxas path function
        from triton.common.backend import path_to_ptxas  # pragma: no cover (Triton < 3.0)

        path, version = path_to_ptxas()
        tool = type("Tool", (), {"path": path, "version": version})()
        out["selector"] = "path_to_ptxas()"
    out["ptxas_path"] = tool.path
    out["ptxas_version"] = tool.version
    try:
        from triton import knobs

        names = ["ptxas", "ptxas_blackwell"]
        out["knobs"] = {}
        for name in names:
            descriptor = type(knobs.nvidia).__dict__.get(name)
            if descriptor is None:
                continue
            out["knobs"][name] = {"env": descriptor.key, "env_value": os.environ.get(descriptor.key),
                                  "bundled": descriptor.default_path}
    except ImportError:
        out["knobs"] = {}
    bundled_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    out["bundled_dir"] = bundled_dir
    out["uses_bundled"] = os.path.realpath(tool.path).startswith(os.path.realpath(bundled_dir) + os.sep)
    print(json.dumps(out))


main()
