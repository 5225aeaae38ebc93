"""`python3 -m qualify.probe`: run the qualification checks here.

Inside an image (the qualification container and the deploy's GPU gate mount
only `qualify/core` and `qualify/probe`) or directly on a host with a GPU.
Standard library + pyelftools only; the target comes as JSON from the host.

Exit status: 0 when the verdict is pass or warn, 1 on fail, 3 when a
required check did not run (incomplete), 2 on usage errors.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import socket
import sys
from typing import List, Optional

from qualify.core import fsutil, manifest
from qualify.core.enums import Profile, Verdict
from qualify.core.errors import QualifyError
from qualify.core.report import Reporter, emit
from qualify.probe import runner, staged

REPORT = Reporter("probe")

EXIT = {Verdict.PASS: 0, Verdict.WARN: 0, Verdict.FAIL: 1, Verdict.INCOMPLETE: 3}


def configure_parser(parser: argparse.ArgumentParser, target_required: bool = True) -> None:
    parser.add_argument("--target-json", required=target_required,
                        help="the target as JSON (what the host passes into the container)")
    parser.add_argument("--profile", choices=Profile.values(), default=None)
    parser.add_argument("--only", choices=runner.SCOPES, default="all", help="static, gpu, or all checks")
    parser.add_argument("--tensor-parallel-size", type=int, default=None, metavar="N",
                        help="the all-reduce's world size: exactly N GPUs must be visible (default: every visible GPU)")
    parser.add_argument("--cross-compile", default="", help="extra capabilities to compile a Triton kernel for, e.g. 10.0,12.1")
    parser.add_argument("--path", action="append", default=[], help="extra directory for the census (repeatable)")
    parser.add_argument("--out", help="write the manifest (or predicate) here, atomically")
    parser.add_argument("--predicate-only", action="store_true", help="write only the predicate (the host wraps it)")
    parser.add_argument("--subject", help="image name@sha256:... the manifest is about (default: this host's environment)")
    parser.add_argument("--origin", choices=runner.ORIGINS, default="built",
                        help="built: an image of this toolkit (its wiring is expected); external: an image built "
                        "elsewhere, judged by what it holds (default: built)")


def probe_target(args) -> runner.ProbeTarget:
    t = runner.ProbeTarget.from_json(args.target_json)
    if args.profile:
        t = dataclasses.replace(t, profile=args.profile)
    if getattr(args, "tensor_parallel_size", None) is not None:
        t = dataclasses.replace(t, tensor_parallel_size=args.tensor_parallel_size)
    if args.cross_compile:
        t = dataclasses.replace(t, cross_compile=[c.strip() for c in args.cross_compile.split(",") if c.strip()])
    return t


def host_subject(predicate: dict) -> tuple:
    """A host has no image digest: the subject is the digest of its recorded environment."""
    env = {"versions": predicate.get("versions"), "gpu": predicate.get("gpu"), "host": predicate.get("host")}
    digest = "sha256:" + hashlib.sha256(fsutil.canonical_json(env)).hexdigest()
    return f"host:{socket.gethostname()}", digest


def execute(args, target: runner.ProbeTarget) -> int:
    predicate = runner.run(target, scope=args.only, extra_paths=args.path, origin=getattr(args, "origin", "built"))
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
        REPORT.say(f"wrote {args.out}")
    else:
        sys.stdout.write(fsutil.canonical_json(doc).decode())
    emit(json.dumps({"verdict": predicate["verdict"], "support_level": predicate["support_level"]}))
    return EXIT[predicate["verdict"]]


def main(argv: Optional[List[str]] = None) -> int:
    staged.activate()  # the decoders the host staged for this interpreter, before the census imports them
    parser = argparse.ArgumentParser(prog="python3 -m qualify.probe", description=__doc__.splitlines()[0])
    configure_parser(parser)
    args = parser.parse_args(argv)
    try:
        target = probe_target(args)
    except (ValueError, TypeError) as exc:
        emit(f"error: --target-json: {exc}")
        return 2
    try:
        return execute(args, target)
    except QualifyError as exc:
        emit(f"error: {exc}")
        return exc.exit_code
