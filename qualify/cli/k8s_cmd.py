"""`python -m qualify k8s TARGET --image REPO@sha256:... [--probe-image REF] [--namespace NS] [--out FILE]`.

Prints (or writes) a NetworkPolicy and a Job that run the probe's GPU checks
of the published image on a GPU node of the target's capability.
"""

from __future__ import annotations

import sys
from pathlib import Path

from qualify.config import targets
from qualify.core.fsutil import write_atomic
from qualify.core.report import emit
from qualify.scaleout import k8s


def configure_parser(parser) -> None:
    parser.add_argument("target", help="a target of images/targets.toml, e.g. sm120")
    parser.add_argument("--image", required=True, help="the published image, repository@sha256:<digest>")
    parser.add_argument("--probe-image", help="the probe bundle image (default: bake's probe-<target> tag beside --image)")
    parser.add_argument("--profile", choices=targets.PROFILES, default=None, help="the image's profile, if known")
    parser.add_argument("--namespace", help="namespace for both objects (default: kubectl's current)")
    parser.add_argument("--file", default=None, help="targets file (default images/targets.toml)")
    parser.add_argument("--out", type=Path, help="write here instead of standard output")


def execute(args) -> int:
    from qualify.qualification.container import probe_sources_digest

    tf = targets.load(args.file)
    job = k8s.job_for(tf.get(args.target), args.image, probe_sources_digest(), args.probe_image,
                      args.profile, args.namespace)
    text = k8s.dumps(job)
    if args.out:
        write_atomic(args.out, text)
        emit(f"[k8s] wrote {args.out}")
    else:
        sys.stdout.write(text)
    return 0
