"""`python -m qualify probe-bundle --python 3.12 --out DIR`: what a bare GPU host's Python needs beside the probe.

scripts/gpu-evidence.sh runs the probe with a GPU host's own python3 (torch and Triton, nothing of the
toolkit). This stages, for that interpreter, what the image side imports when present: pyelftools (the
census), the ZSTD and LZ4 decoders (compressed fatbins), cryptography and PyNaCl (signing with the host's
cosign key): `DIR/cpython-312-x86_64/`, from wheels checked against the probe's locks (qualify/probe/*.lock).
Copy DIR to the GPU host and run `QUALIFY_STAGED=DIR scripts/gpu-evidence.sh OUT`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from qualify.core.errors import ConfigError

PLATFORMS = ("linux/amd64", "linux/arm64")


def configure_parser(parser) -> None:
    parser.add_argument("--python", required=True, help="the GPU host's Python, MAJOR.MINOR (python3 --version)")
    parser.add_argument("--platform", choices=PLATFORMS, default="linux/amd64", help="the GPU host's platform")
    parser.add_argument("--out", type=Path, required=True, help="the folder to write (made; an earlier bundle "
                        "for the same interpreter there is replaced)")


def execute(args) -> int:
    from qualify.core import fsutil
    from qualify.qualification import staging

    major, _, minor = args.python.partition(".")
    if major != "3" or not minor.isdigit():
        raise ConfigError(f"--python {args.python!r}: give MAJOR.MINOR, as the GPU host's `python3 --version` says")
    machine = next(m for m, p in staging.MACHINES.items() if p == args.platform)
    tag = f"cpython-3{minor}-{machine}"
    staged = staging.stage(tag)
    if staged is None:
        raise ConfigError(f"no staged wheels for Python {args.python} ({tag}): the probe's locks cover "
                          f"3.{min(staging.LOCKS[0][1])}-3.{max(staging.LOCKS[0][1])}")
    dest = args.out.absolute() / tag
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(staged, dest, symlinks=True)
    shutil.copytree(staging.elftools_folder(), dest / "elftools", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    fsutil.readable_by_all(dest)
    print(f"wrote {dest}: {', '.join(sorted(p.name for p in dest.iterdir() if p.is_dir()))}")
    print(f"on the GPU host: QUALIFY_STAGED={args.out.absolute()} scripts/gpu-evidence.sh OUT_DIR")
    return 0
