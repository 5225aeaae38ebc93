"""`python -m qualify <command>`: one module per command, imported only when chosen.

Each command module has `configure_parser(parser)` and `execute(args) -> int`.
Lazy imports keep the in-image probe free of host-only dependencies.
"""

from __future__ import annotations

import importlib
import sys

from qualify.core.errors import QualifyError

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing is not imported at run time (the census's start-up)
    from typing import List, Optional

# name -> (module, one-line help)
COMMANDS = {
    "targets": ("targets_cmd", "check, list or show images/targets.toml"),
    "arch": ("arch_cmd", "CUDA architecture names and compatibility"),
    "inspect": ("inspect_cmd", "census of compiled GPU architectures in libraries and cubins"),
    "probe": ("probe_cmd", "run the qualification checks here (inside an image or on a host)"),
    "build": ("build_cmd", "build a target's image"),
    "qualify": ("qualify_cmd", "qualify a built image (or any image: --image) in a container and write its manifest"),
    "pin": ("pin_cmd", "re-resolve base image tags to digests in targets.toml"),
    "lock": ("lock_cmd", "regenerate a target's hash-locked requirements"),
    "show": ("show_cmd", "print a readable summary of a manifest"),
    "diff": ("diff_cmd", "compare two manifests"),
    "compare": ("compare_cmd", "images side by side: verdicts, checks, providers, library classes for one target"),
    "sign": ("sign_cmd", "sign a manifest (cosign or the built-in signer)"),
    "verify": ("verify_cmd", "verify a signed manifest against an image"),
    "verify-image": ("verify_image_cmd", "verify an image's attestation from its registry (no local manifest)"),
    "publish": ("publish_cmd", "publish a release's images and attestations to a registry"),
    "release": ("release_cmd", "sign manifests and release them to a git tag"),
    "sums": ("sums_cmd", "write or check SHA256SUMS of the release inputs"),
    "repro": ("repro_cmd", "build twice and compare image digests"),
    "clean": ("clean_cmd", "remove what the toolkit made on this host (images, registry blobs, state) and nothing else"),
    "deploy": ("deploy_cmd", "the deploy start.sh hands over to, and its steps one at a time"),
    "promote": ("promote_cmd", "promote a release's targets by GPU evidence (the Blackwell support RFC's rule)"),
    "hosts": ("hosts_cmd", "enroll the hosts whose signed GPU evidence promote counts"),
    "bake": ("bake_cmd", "write or check docker-bake.json; stage and record bake builds"),
    "workflow": ("workflow_cmd", "write or check the GitHub Actions release workflow"),
    "k8s": ("k8s_cmd", "a Kubernetes Job running a published image's GPU checks on a GPU node"),
    "gpu-evidence": ("gpu_evidence_cmd", "GPU checks of a published image on this host, as a manifest"),
    "merge": ("merge_cmd", "gather evidence from many hosts into the input of `qualify promote`"),
    "serve-check": ("serve_check_cmd", "the serving correctness matrix against a running server, as a signed record"),
    "probe-bundle": ("probe_bundle_cmd", "stage what a bare GPU host's Python needs beside the probe (gpu-evidence.sh)"),
    "tiny-model": ("tiny_model_cmd", "write the small local model that answers the deploy's checks (no download)"),
}


def _load(name: str):
    module, _ = COMMANDS[name]
    return importlib.import_module(f"{__package__}.{module}")


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:  # the list of commands is built only when it is shown
        import argparse

        parser = argparse.ArgumentParser(prog="python -m qualify", description=__doc__.splitlines()[0])
        sub = parser.add_subparsers(dest="command", metavar="COMMAND")
        for name, (_, help_text) in COMMANDS.items():
            sub.add_parser(name, help=help_text, add_help=False)
        parser.parse_args(argv or ["--help"])
        return 2
    if argv[0] not in STDLIB_ONLY:
        lacking = _lacking_dependency()
        if lacking:
            return _missing_dependency(lacking, argv)
    try:
        module = _load(argv[0])
    except ModuleNotFoundError as exc:
        return _missing_dependency(exc.name or "a dependency", argv)
    args = _arguments(argv[0], module, argv[1:])
    try:
        return int(module.execute(args) or 0)
    except QualifyError as exc:
        _say(f"error: {exc}")
        return exc.exit_code
    except ModuleNotFoundError as exc:  # a lazy import of a host dependency, under an interpreter without it
        if (exc.name or "").partition(".")[0] == "qualify":
            raise
        return _missing_dependency(exc.name or "a dependency", argv)
    except KeyboardInterrupt:
        _say("interrupted")
        return 130
    except BrokenPipeError:  # `... | head`: the reader went away; say nothing more to it
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as exc:  # the host said no (a full disk, a permission): what, where, and what to do
        return _host_error(exc)


def _say(text: str) -> None:
    """To stderr through the Reporter's writer (imported here: the census's start-up never needs it)."""
    from qualify.core.report import emit

    emit(text)


def _arguments(name: str, module, argv: List[str]):
    """The command's parsed arguments: its plain forms without argparse where the command asks for it
    (`SIMPLE_ARGV`: cli/simple_args.py says why), argparse for everything else."""
    if getattr(module, "SIMPLE_ARGV", False):
        from qualify.cli import simple_args

        args = simple_args.parse(module.configure_parser, argv)
        if args is not None:
            return args
    import argparse

    parser = argparse.ArgumentParser(prog=f"python -m qualify {name}", description=COMMANDS[name][1])
    module.configure_parser(parser)
    return parser.parse_args(argv)


# Commands that need only the standard library (and what is staged beside it): inside images, and for `sums`
# in git's pre-commit hook before any venv exists.
STDLIB_ONLY = frozenset({"probe", "inspect", "arch", "targets", "sums", "tiny-model", "show"})
# One module of each host dependency a command may import late (inside execute): looked up, not imported.
HOST_DEPENDENCIES = ("python_on_whales", "tomlkit", "elftools", "cryptography", "jsonschema")


def _lacking_dependency() -> Optional[str]:
    from importlib.util import find_spec

    return next((name for name in HOST_DEPENDENCIES if find_spec(name) is None), None)


def _missing_dependency(missing: str, argv: List[str]) -> int:
    """A command whose dependencies this interpreter lacks (the host's python3, not the toolkit's): run it in
    the toolkit's venv when there is one, else say the one command that makes it. Never a traceback."""
    from pathlib import Path

    from qualify import toolenv

    venv_python = toolenv.python()
    # By prefix, not by executable: a venv's python is a symlink to the interpreter it was made from, so the
    # host's python3 and the venv's resolve to the same file.
    if venv_python.exists() and Path(sys.prefix).resolve() != toolenv.VENV.resolve():
        from qualify.host import cmd

        cmd.replace_process([str(venv_python), "-m", "qualify", *argv])
    _say(f"error: `{argv[0]}` needs the toolkit's dependencies, and this Python ({sys.executable}) lacks "
         f"{missing}\n  hint: run `bash scripts/setup-host.sh` once in {toolenv.REPO} (it makes {toolenv.VENV}, "
         "which `python3 -m qualify` then uses), or activate a venv where `pip install -e .` ran")
    return 2


def _host_error(exc: OSError) -> int:
    import errno

    from qualify.core.errors import printable

    where = f" ({exc.filename})" if exc.filename else ""
    hint = {errno.ENOSPC: "free disk space (nox -s clean -- --dry-run lists what the toolkit can free), then run "
                          "the same command again: it keeps what is done",
            errno.EDQUOT: "free space within your disk quota, then run the same command again",
            errno.EACCES: "run as a user who may write there (the toolkit's state folder is QUALIFY_STATE_DIR)",
            errno.EROFS: "the file system is read-only: point QUALIFY_STATE_DIR (or the output) elsewhere"}.get(
        exc.errno, "see the message above; run the same command again once it is fixed")
    _say(f"error: {printable(exc.strerror or str(exc))}{printable(where)}\n  hint: {hint}")
    return 12  # the table's "the host refused"
