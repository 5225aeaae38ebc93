"""`python -m qualify gpu-evidence TARGET --image REPO@sha256:... --out FILE`: GPU evidence on this host.

The probe's GPU checks in a container of the published image with this
host's GPUs (container.run_probe, the one way the host runs the probe),
written as a probe manifest about that image: the input of `qualify merge`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from qualify.config import targets
from qualify.config.imageref import parse_pinned
from qualify.core import manifest
from qualify.core.enums import Verdict
from qualify.core.errors import ConfigError


def configure_parser(parser) -> None:
    parser.add_argument("target", help="a target of images/targets.toml, e.g. sm120")
    parser.add_argument("--image", required=True, help="the published image, repository@sha256:<digest>")
    parser.add_argument("--profile", choices=targets.PROFILES, default=None)
    parser.add_argument("--gpus", default="all",
                        help="GPUs for the container (docker --gpus; default all). `none` runs without a GPU, to "
                        "rehearse the evidence path on a host that has none: the GPU checks are then not-run and "
                        "`promote` counts the record as infrastructure, never as a pass")
    parser.add_argument("--engine", choices=("docker", "podman"), default="docker")
    parser.add_argument("--file", default=None, help="targets file (default images/targets.toml)")
    parser.add_argument("--out", type=Path, required=True, help="the manifest to write")
    parser.add_argument("--sign-key", type=Path, default=None,
                        help="this host's cosign key: OUT.sig and OUT.sigstore.json beside it, so that `promote` "
                        "counts it once the host is enrolled (password from COSIGN_PASSWORD or the terminal)")


def execute(args) -> int:
    from qualify.host.engine import Engine
    from qualify.qualification.container import probe_target, run_probe

    ref = parse_pinned(args.image, "--image", ConfigError, hint="give repository@sha256:<digest>")
    target = targets.load(args.file).get(args.target)
    run = run_probe(Engine(args.engine).check(), ref.by_digest, probe_target(target, args.profile),
                    scope="gpu", gpus=None if args.gpus == "none" else args.gpus)
    # The evidence names the probe that ran: the digest of the copy the host staged privately and mounted.
    predicate = {**run.predicate, "toolkit": {**run.predicate.get("toolkit", {}), "probe_sha256": run.probe_sha256}}
    doc = manifest.statement(ref.name, ref.digest, predicate)
    manifest.write(args.out, doc)
    done = manifest.Manifest.from_statement(doc, str(args.out))
    print(f"{args.out}: verdict {done.verdict}, support level {done.support_level}", file=sys.stderr)
    if args.sign_key is not None:
        from qualify.release import evidence

        print(f"{evidence.sign(args.out, args.sign_key)}: signed with this host's key", file=sys.stderr)
    else:
        print("note: not signed (--sign-key): `qualify promote` counts only evidence an enrolled host signed",
              file=sys.stderr)
    return 1 if done.verdict == Verdict.FAIL else 0
