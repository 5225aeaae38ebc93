"""`python -m qualify targets check|list|show|for-gpu`."""

from __future__ import annotations

import json
from pathlib import Path

from qualify.config import targets
from qualify.core import arch


def configure_parser(parser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    check = sub.add_parser("check", help="validate a targets file")
    check.add_argument("path", nargs="?", type=Path, default=targets.DEFAULT_TARGETS_FILE)
    lst = sub.add_parser("list", help="one line per target")
    lst.add_argument("--file", type=Path, default=targets.DEFAULT_TARGETS_FILE)
    lst.add_argument("--json", action="store_true")
    show = sub.add_parser("show", help="everything the loader resolved for one target")
    show.add_argument("target")
    show.add_argument("--file", type=Path, default=targets.DEFAULT_TARGETS_FILE)
    md = sub.add_parser("markdown", help="the target table of docs/build.md (generated, never edited by hand)")
    md.add_argument("--file", type=Path, default=targets.DEFAULT_TARGETS_FILE)
    gpu = sub.add_parser("for-gpu", help="the target for a device capability and CPU (start.sh)")
    gpu.add_argument("--capability", required=True)
    gpu.add_argument("--machine", required=True, help="uname -m of the host, e.g. x86_64")
    gpu.add_argument("--file", type=Path, default=targets.DEFAULT_TARGETS_FILE)


def target_dict(t: targets.Target, tf: targets.TargetsFile) -> dict:
    return {
        "name": t.name,
        "description": t.description,
        "gpus": list(t.gpus),
        "platform": t.platform,
        "accelerator": t.accelerator.value,
        "capability": t.capability_text,
        "cuda": t.cuda,
        "torch_cuda_arch_list": t.torch_cuda_arch_list,
        "gencode": arch.gencode_flags(t.torch_cuda_arch_list) if t.torch_cuda_arch_list else [],
        "support_level": t.support_level,
        "base": {"image": str(t.base.image), "python": t.base.python, "source": t.base.source, "pinned": t.base.pinned},
        "triton_env": t.triton_env,
        "runtime": {
            "gpu_memory_utilization": t.runtime.gpu_memory_utilization,
            "unified_memory": t.runtime.unified_memory,
            "min_gpu_memory_gib": t.runtime.min_gpu_memory_gib,
        },
        "locks": {
            f"{profile}/{kind}": str(t.lock_path(profile, t.python_for(kind, tf.hermetic)).relative_to(targets.REPO_ROOT))
            for profile in t.profiles
            for kind in targets.BASE_KINDS
        },
    }


def markdown_table(tf: targets.TargetsFile) -> str:
    rows = ["| target | GPUs | platform | capability | TORCH_CUDA_ARCH_LIST | intended level | GPU memory fraction |",
            "|---|---|---|---|---|---|---|"]
    for t in tf.targets.values():
        if t.is_cpu:
            rows.append(f"| `{t.name}` | none (vLLM's CPU build) | {t.platform} | {t.capability_text} | none "
                        f"| {t.support_level} | none (KV cache {t.runtime.kv_cache_gib} GiB of host memory) |")
            continue
        unified = " (unified memory)" if t.runtime.unified_memory else ""
        rows.append(f"| `{t.name}` | {', '.join(t.gpus)} | {t.platform} | {t.capability} | `{t.torch_cuda_arch_list}` "
                    f"| {t.support_level} | {t.runtime.gpu_memory_utilization:.2f}{unified} |")
    return "\n".join(rows)


def execute(args) -> int:
    if args.action == "check":
        tf = targets.load(args.path)
        print(f"{args.path}: OK ({len(tf.targets)} targets: {', '.join(tf.targets)})")
        return 0
    tf = targets.load(args.file)
    if args.action == "list":
        if args.json:
            print(json.dumps([target_dict(t, tf) for t in tf.targets.values()], indent=2, sort_keys=True))
            return 0
        print(f"{'target':<13} {'platform':<12} {'cap':<5} {'arch list':<12} {'level':<13} description")
        for t in tf.targets.values():
            print(f"{t.name:<13} {t.platform:<12} {t.capability_text:<5} {t.torch_cuda_arch_list or '-':<12} "
                  f"{t.support_level:<13} {t.description}")
        return 0
    if args.action == "markdown":
        print(markdown_table(tf))
        return 0
    if args.action == "show":
        print(json.dumps(target_dict(tf.get(args.target), tf), indent=2, sort_keys=True))
        return 0
    cap = arch.Capability.parse(args.capability)
    found = tf.for_capability(cap, args.machine)
    if found:
        print(found[0].name)
        return 0
    same_cap = tf.for_capability(cap)
    if same_cap:
        plats = ", ".join(f"{t.name} ({t.platform})" for t in same_cap)
        print(f"capability {cap} is supported only on: {plats}; this host is {args.machine}")
        return 3
    supported = ", ".join(f"{t.name} ({t.capability}, {t.platform})" for t in tf.targets.values() if not t.is_cpu)
    print(f"capability {cap} ({arch.describe(cap)}) is not one of our targets; supported: {supported}")
    return 2
