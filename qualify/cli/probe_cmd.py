"""`python -m qualify probe`: run the qualification checks here.

Inside an image (the qualification container mounts this package read-only)
or directly on a host with a GPU. Standard library + pyelftools only.

Exit status: 0 when the verdict is pass or warn, 1 on fail, 3 when a
required check did not run (incomplete), 2 on usage errors.
"""

from __future__ import annotations

import hashlib
import json
import socket
import sys

from .. import fsutil, manifest
from ..probe import runner

EXIT = {"pass": 0, "warn": 0, "fail": 1, "incomplete": 3}


def configure_parser(parser) -> None:
    who = parser.add_mutually_exclusive_group(required=True)
    who.add_argument("--target", help="a target of images/targets.toml (needs Python 3.11+ for tomllib)")
    who.add_argument("--target-json", help="the target as JSON (what the qualification container is given)")
    parser.add_argument("--file", default=None, help="targets file (with --target)")
    parser.add_argument("--profile", choices=("smoke", "vllm"), default=None)
    parser.add_argument("--only", choices=runner.SCOPES, default="all", help="static, gpu, or all checks")
    parser.add_argument("--cross-compile", default="", help="extra capabilities to compile a Triton kernel for, e.g. 10.0,12.1")
    parser.add_argument("--path", action="append", default=[], help="extra directory for the census (repeatable)")
    parser.add_argument("--out", help="write the manifest (or predicate) here, atomically")
    parser.add_argument("--predicate-only", action="store_true", help="write only the predicate (the host wraps it)")
    parser.add_argument("--subject", help="image name@sha256:... the manifest is about (default: this host's environment)")


def _target(args) -> runner.ProbeTarget:
    if args.target_json:
        t = runner.ProbeTarget.from_json(args.target_json)
    else:
        from .. import targets  # tomllib: host only

        tf = targets.load(args.file)
        x = tf.get(args.target)
        t = runner.ProbeTarget(
            name=x.name, capability=str(x.capability), platform=x.platform,
            torch_cuda_arch_list=x.torch_cuda_arch_list, triton_env=x.triton.env(),
            intended_support_level=x.support_level, unified_memory=x.runtime.unified_memory,
            gpu_memory_utilization=x.runtime.gpu_memory_utilization, min_gpu_memory_gib=x.runtime.min_gpu_memory_gib)
    if args.profile:
        t.profile = args.profile
    if args.cross_compile:
        t.cross_compile = [c.strip() for c in args.cross_compile.split(",") if c.strip()]
    return t


def host_subject(predicate: dict) -> tuple:
    """A host has no image digest: the subject is the digest of its recorded environment."""
    env = {"versions": predicate.get("versions"), "gpu": predicate.get("gpu"), "host": predicate.get("host")}
    digest = "sha256:" + hashlib.sha256(fsutil.canonical_json(env)).hexdigest()
    return f"host:{socket.gethostname()}", digest


def execute(args) -> int:
    predicate = runner.run(_target(args), scope=args.only, extra_paths=args.path)
    if args.predicate_only:
        doc = predicate
    else:
        if args.subject:
            name, digest = args.subject.split("@", 1)
        else:
            name, digest = host_subject(predicate)
        doc = manifest.statement(name, digest, predicate)
    if args.out:
        fsutil.write_json(args.out, doc)
        print(f"[probe] wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(fsutil.canonical_json(doc).decode())
    print(json.dumps({"verdict": predicate["verdict"], "support_level": predicate["support_level"]}), file=sys.stderr)
    return EXIT[predicate["verdict"]]
