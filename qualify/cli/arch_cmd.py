"""`python -m qualify arch compat|describe|gencode`."""

from __future__ import annotations

import json

from qualify.core import arch
from qualify.core.errors import ConfigError


def configure_parser(parser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    compat = sub.add_parser("compat", help="can CODE (sm_120a, compute_80, ...) run on a device?")
    compat.add_argument("code", help="sm_XY[a|f] or compute_XY[a|f]")
    compat.add_argument("--device", required=True, help="device capability, e.g. 12.1")
    compat.add_argument("--json", action="store_true")
    desc = sub.add_parser("describe", help="family and status of a capability")
    desc.add_argument("capability")
    gen = sub.add_parser("gencode", help="nvcc -gencode flags for a TORCH_CUDA_ARCH_LIST")
    gen.add_argument("arch_list")


def execute(args) -> int:
    try:
        if args.action == "compat":
            code = arch.CodeTarget.parse(args.code)
            device = arch.Capability.parse(args.device)
            result = arch.compatibility(code, device)
            if args.json:
                print(json.dumps({"code": str(code), "device": str(device), "class": result.value,
                                  "cross_generation": arch.is_cross_generation(code, device)}, sort_keys=True))
            else:
                print(result.value)
            return 0
        if args.action == "describe":
            print(arch.describe(arch.Capability.parse(args.capability)))
            return 0
        print(" ".join(arch.gencode_flags(args.arch_list)))
        return 0
    except arch.ArchError as exc:
        raise ConfigError(str(exc)) from None
