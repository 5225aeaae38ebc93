"""`python -m qualify deploy ACTION`: the deploy (start), status, stop and verify.

`./start.sh` and `scripts/{status,stop,verify}.sh` hand over to `start`,
`status`, `stop` and `verify` here; the work runs in this one process. The
other actions (memory, port, compose, url and the API checks) are the
same steps one at a time, for people debugging a host. The trust gate has
no such action: it runs only inside `start`, on the release it read once.
"""

from __future__ import annotations

import sys
from pathlib import Path

from qualify.config import targets
from qualify.core.errors import ConfigError
from qualify.deploy import api, compose, memory, netcheck, ops, run, settings
from qualify.deploy.errors import DeployError
from qualify.deploy.ui import EX_USAGE, Stop, Ui

CHECKS = {
    "health": lambda url, model: api.health(url),
    "models": api.models,
    "canary": api.canary,
    "determinism": api.determinism,
    "tool-call": api.tool_call,
}
SCRIPTS = ("start", "status", "stop", "verify")


def _script_parsers(sub) -> None:
    for name in SCRIPTS:
        p = sub.add_parser(name, help=f"what ./{'start.sh' if name == 'start' else f'scripts/{name}.sh'} does")
        p.add_argument("--env-file", type=Path, default=settings.REPO / ".env")
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

    mem = sub.add_parser("memory", help="does the server fit this GPU, and with which memory fraction")
    mem.add_argument("--target", required=True)
    mem.add_argument("--memory-total", required=True, help="nvidia-smi's memory.total, e.g. '32607 MiB' or '[N/A]'")
    mem.add_argument("--meminfo", type=Path, default=Path("/proc/meminfo"))
    mem.add_argument("--fraction", type=float, help="GPU_MEMORY_UTILIZATION from .env (default: the target's)")
    mem.add_argument("--file", type=Path, default=targets.DEFAULT_TARGETS_FILE)

    port = sub.add_parser("port", help="exit 0 when ADDRESS:PORT is free")
    port.add_argument("--address", required=True)
    port.add_argument("--port", type=int, required=True)

    comp = sub.add_parser("compose", help="print the compose project as JSON")
    comp.add_argument("--image", required=True)
    comp.add_argument("--target", required=True)
    comp.add_argument("--model", required=True)
    comp.add_argument("--revision", required=True)
    comp.add_argument("--served-model-name", required=True)
    comp.add_argument("--gpu-memory-utilization", type=float, required=True)
    comp.add_argument("--max-model-len", type=int, required=True)
    comp.add_argument("--gpu-runtime", choices=compose.GPU_RUNTIMES, required=True)
    comp.add_argument("--gpu-device", default="0")
    comp.add_argument("--selinux-label-disable", action="store_true")
    comp.add_argument("--bind-address", default="127.0.0.1")
    comp.add_argument("--port", type=int, default=8000)
    comp.add_argument("--shm-size", default="8g")
    comp.add_argument("--tool-call-parser", default="")
    comp.add_argument("--extra-arg", action="append", default=[], help="one more server argument (repeatable)")
    comp.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="container variable")
    comp.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="container label")
    comp.add_argument("--health-start-period", type=int, default=1800)

    url = sub.add_parser("url", help="where this host reaches the API")
    url.add_argument("--bind-address", required=True)
    url.add_argument("--port", type=int, required=True)

    for name in CHECKS:
        chk = sub.add_parser(name, help=f"API check: {name}")
        chk.add_argument("--base-url", required=True)
        chk.add_argument("--model", default="")
        chk.add_argument("--quiet", action="store_true", help="no output, exit status only")


def _pairs(items, what: str):
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{what} {item!r}: write KEY=VALUE")
        out.append((key, value))
    return tuple(out)


def _memory(args) -> int:
    target = targets.load(args.file).get(args.target)
    meminfo = args.meminfo.read_text() if args.meminfo.is_file() else None
    fit = memory.memory_fit(target.runtime, args.memory_total, meminfo, args.fraction)
    for note in fit.notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"gpu_memory_utilization={fit.gpu_memory_utilization:g}")
    print(f"pool_gib={fit.pool_gib:g}")
    print(f"unified={'true' if fit.unified else 'false'}")
    print(f"source={fit.source}")
    return 0


def _port(args) -> int:
    problem = netcheck.port_problem(args.address, args.port)
    if problem:
        raise DeployError(problem, hint=f"see what holds it: ss -ltnp 'sport = :{args.port}'; "
                                 "or set API_PORT (and BIND_ADDRESS) in .env")
    return 0


def _compose(args) -> int:
    spec = compose.ComposeSpec(
        image=args.image, target=args.target, model=args.model, revision=args.revision,
        served_model_name=args.served_model_name, gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=args.max_model_len, gpu_runtime=args.gpu_runtime, gpu_device=args.gpu_device,
        selinux_label_disable=args.selinux_label_disable, bind_address=args.bind_address,
        port=args.port, shm_size=args.shm_size, tool_call_parser=args.tool_call_parser,
        extra_args=tuple(args.extra_arg), extra_env=_pairs(args.env, "--env"),
        health_start_period_s=args.health_start_period, labels=_pairs(args.label, "--label"),
    )
    sys.stdout.write(compose.compose_json(spec))
    return 0


def _check(args) -> int:
    result = CHECKS[args.action](args.base_url.rstrip("/"), args.model)
    if not args.quiet:
        print(f"{args.action}: {'ok' if result.ok else 'FAILED'}: {result.detail}")
    return 0 if result.ok else 1


def _script(args) -> int:
    """One of the user's commands, in this process; a Stop prints its message and fixes and sets the exit code."""
    ui = Ui(args.prog)
    try:
        if args.action == "start":
            settings.first_run(args.env_file, ui)
        s = settings.load(args.env_file, ui)
        if args.action == "start":
            if args.allow_downgrade and not s.release_tag:
                raise Stop(EX_USAGE, "--allow-downgrade goes back to one release on purpose: set RELEASE_TAG to it",
                           f"set RELEASE_TAG in {args.env_file} to the release to deploy")
            opts = run.Options(dry_run=args.dry_run, allow_unqualified=args.allow_unqualified,
                               allow_no_gpu_runtime=args.allow_no_gpu_runtime, probe=args.probe,
                               allow_downgrade=args.allow_downgrade)
            return run.Deploy(s, opts, ui).main()
        if args.action == "status":
            return ops.status(s, ui)
        if args.action == "stop":
            return ops.stop(s, ui, args.purge_cache)
        return ops.verify(s, ui, args.level)
    except Stop as stop:
        return ui.error(stop)


def execute(args) -> int:
    if args.action in SCRIPTS:
        return _script(args)
    if args.action in CHECKS:
        return _check(args)
    if args.action == "url":
        print(api.api_url(args.bind_address, args.port))
        return 0
    actions = {"memory": _memory, "port": _port, "compose": _compose}
    return actions[args.action](args)
