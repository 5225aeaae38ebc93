"""`python -m qualify deploy ACTION`: the deploy (start), status, stop and verify.

`./start.sh` and `scripts/{status,stop,verify}.sh` hand over to `start`,
`status`, `stop` and `verify` here; the work runs in this one process. The
other actions (memory, port, compose, url and the API checks) are the
same steps one at a time, for people debugging a host. The trust gate has
no such action: it runs only inside `start`, on the release it read once.
"""

from __future__ import annotations

import errno
from pathlib import Path

from qualify.deploy import api, ops, run, settings
from qualify.deploy.ui import EX_HOST, EX_TRUST, EX_USAGE, Stop, Ui

CHECKS = {
    "health": lambda url, model: api.health(url),
    "models": api.models,
    "canary": api.canary,
    "determinism": api.determinism,
    "tool-call": api.tool_call,
}
SCRIPTS = ("start", "status", "stop", "verify")
SEED_HELP = ("record a known release in this host's anti-rollback state before the first deploy (RELEASE_TAG and "
             "RELEASE_KEY_FINGERPRINT must be set): every target of it, verified with the pinned key")


def _script_parsers(sub) -> None:
    for name in SCRIPTS:
        p = sub.add_parser(name, help=f"what ./{'start.sh' if name == 'start' else f'scripts/{name}.sh'} does")
        p.add_argument("--env-file", type=Path, default=None,
                       help="settings file (default: .env; a file named here must exist and be readable)")
        p.add_argument("--prog", default=name, help="the name messages carry (the script that handed over)")
    start = sub.choices["start"]
    start.add_argument("--dry-run", action="store_true")
    start.add_argument("--allow-unqualified", action="store_true")
    start.add_argument("--allow-no-gpu-runtime", action="store_true")
    start.add_argument("--probe", action="store_true", help="run the GPU checks here even for a baseline release")
    start.add_argument("--allow-downgrade", action="store_true",
                       help="with RELEASE_TAG: deploy a release older than one this host accepted before")
    sub.choices["stop"].add_argument("--purge-cache", action="store_true")
    sub.choices["verify"].add_argument("--level", choices=("smoke", "full"), default="smoke")


def configure_parser(parser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    _script_parsers(sub)
    seed = sub.add_parser("seed", help=SEED_HELP)
    seed.add_argument("--env-file", type=Path, default=None)
    seed.add_argument("--prog", default="seed")

    for name in CHECKS:
        chk = sub.add_parser(name, help=f"API check: {name}")
        chk.add_argument("--base-url", required=True)
        chk.add_argument("--model", default="")
        chk.add_argument("--quiet", action="store_true", help="no output, exit status only")


def _check(args) -> int:
    result = CHECKS[args.action](args.base_url.rstrip("/"), args.model)
    if not args.quiet:
        print(f"{args.action}: {'ok' if result.ok else 'FAILED'}: {result.detail}")
    return 0 if result.ok else 1


def _script(args) -> int:
    """One of the user's commands, in this process; a Stop prints its message and fixes and sets the exit code."""
    ui = Ui(args.prog)
    s = None
    explicit = args.env_file is not None
    env_file = args.env_file if explicit else settings.REPO / ".env"
    args.env_file = env_file
    try:
        if args.action == "start":
            settings.first_run(env_file, ui, explicit)
        s = settings.load(env_file, ui, explicit=explicit)
        if args.action == "start":
            if args.allow_downgrade and not s.release_tag:
                raise Stop(EX_USAGE, "--allow-downgrade goes back to one release on purpose: set RELEASE_TAG to it",
                           f"set RELEASE_TAG in {args.env_file} to the release to deploy")
            opts = run.Options(dry_run=args.dry_run, allow_unqualified=args.allow_unqualified,
                               allow_no_gpu_runtime=args.allow_no_gpu_runtime, probe=args.probe,
                               allow_downgrade=args.allow_downgrade)
            return run.Deploy(s, opts, ui).main()
        if args.action == "seed":
            return _seed(s, ui)
        if args.action == "status":
            return ops.status(s, ui)
        if args.action == "stop":
            return ops.stop(s, ui, args.purge_cache)
        return ops.verify(s, ui, args.level)
    except Stop as stop:
        return ui.error(stop)
    except OSError as exc:  # the host said no: which file, and what to do on a deploy host
        if exc.errno not in HOST_REFUSALS:
            raise
        return ui.error(host_refused(exc, s, args))


HOST_REFUSALS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EROFS})


def host_refused(exc: OSError, s, args) -> Stop:
    """A full disk, a permission or a read-only file system met while deploying: the path, and the fixes of a
    deploy host (the build host's `nox -s clean` has nothing to free here)."""
    where = Path(exc.filename) if exc.filename else (s.deploy_dir if s is not None else args.env_file.parent)
    folder = where if where.is_dir() else where.parent
    again = f"then run ./{'start.sh' if args.action == 'start' else f'scripts/{args.action}.sh'} again: it picks up " \
            "from what is already done"
    stop_hint = s.hint("stop") if s is not None else "scripts/stop.sh"
    fixes = {
        errno.ENOSPC: (f"free space on the file system holding {folder} (df -h {folder}); the deploy's own files are "
                       "small: `docker system df` shows what the engine's images, containers and volumes hold, and "
                       f"`{stop_hint} --purge-cache` removes this deploy's model cache", again),
        errno.EDQUOT: (f"free space within your disk quota on {folder}", again),
        errno.EACCES: (f"run as a user who may write {folder}, or set DEPLOY_DIR in {args.env_file} to a folder you "
                       "may write", again),
        errno.EROFS: (f"{folder} is on a read-only file system: set DEPLOY_DIR in {args.env_file} to a writable "
                      "folder", again),
    }.get(exc.errno, ("see the message above", again))
    return Stop(EX_HOST, f"{exc.strerror or exc}: {where}", *fixes)


def _seed(s: settings.Settings, ui: Ui) -> int:
    from qualify.core.errors import QualifyError
    from qualify.deploy import state
    from qualify.trust.folder import read_release
    from qualify.trust.verify import KeyAnchor

    if not (s.release_tag and s.release_key_fingerprint):
        raise Stop(EX_USAGE, "seed records a known release: set RELEASE_TAG and RELEASE_KEY_FINGERPRINT (the tag and "
                   f"the fingerprint announced with it) in {s.env_file}", "then run it again")
    try:
        release = read_release(s.manifests_dir / s.release_tag, KeyAnchor(pinned=s.release_key_fingerprint))
        notes = state.seed(s.deploy_dir, release)
    except QualifyError as exc:
        raise Stop.because(EX_TRUST, f"seed: REFUSED: release {s.release_tag}", exc) from None
    for note in notes:
        ui.say(f"seed: {note}")
    ui.say(f"seed: {state.state_path(s.deploy_dir)} now holds release {release.tag} (sequence "
           f"{release.index.sequence}) for {', '.join(t.target for t in release.targets)}")
    return 0


def execute(args) -> int:
    if args.action in SCRIPTS or args.action == "seed":
        return _script(args)
    if args.action in CHECKS:
        return _check(args)
    raise AssertionError(f"deploy {args.action}")  # argparse admits only the actions above
