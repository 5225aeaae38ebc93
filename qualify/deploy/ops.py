"""scripts/status.sh, stop.sh and verify.sh: what the deployment start.sh made is doing, stopping it, checking it."""

from __future__ import annotations

import shutil
from typing import Any, Dict, List

from qualify.core import nvsmi
from qualify.core.readlimit import read_json
from qualify.core.report import emit
from qualify.deploy import api, preflight, settings
from qualify.deploy.errors import DeployError
from qualify.deploy.servecheck import needs
from qualify.deploy.settings import Settings
from qualify.deploy.ui import EX_CHECK, EX_DEPLOY, EX_INCOMPLETE, Stop, Ui
from qualify.host import cmd

LABEL = "com.docker.compose.project"


def _compose(engine: preflight.EngineChoice, s: Settings, *args: str) -> cmd.Result:
    return cmd.watched([*engine.compose, "-p", s.compose_project, "-f", str(s.compose_file), *args])


def _show(result: cmd.Result) -> None:
    """What a tool answered, on the streams it used (status prints it for people)."""
    print(result.stdout, end="", flush=True)
    if result.stderr:
        emit(result.stderr, escape=False, end="")


def _section(title: str) -> None:
    print(f"\n== {title}", flush=True)


def _ids(engine: preflight.EngineChoice, *argv: str) -> List[str]:
    return cmd.ask([engine.cli, *argv]).stdout.split()


DEPLOYMENT_FILE = "deployment.json"  # deploy/run.py writes it beside the compose file
MAX_RECORD_BYTES = 1 << 16


def deployment(s: Settings) -> Dict[str, Any]:
    """What start.sh recorded about this deployment ({} when nothing, or not a record)."""
    try:
        doc = read_json(s.compose_file.with_name(DEPLOYMENT_FILE), MAX_RECORD_BYTES, "deployment record", DeployError)
    except DeployError:
        return {}
    return doc if isinstance(doc, dict) else {}


def status(s: Settings, ui: Ui) -> int:
    engine = preflight.detect_engine(s)
    url = api.api_url(s.bind_address, s.api_port)
    record = deployment(s)
    if record:
        _section("deployment")
        model = record.get("model") or {}
        served = model.get("path") and f"{model['path']} (MODEL_PATH, offline)" or \
            f"{model.get('id')} ({model.get('revision')})"
        print(f"target: {record.get('target')} ({record.get('accelerator')})\nimage:  {record.get('image')}\n"
              f"model:  {served} as {record.get('served_model_name')}\ntrust:  {record.get('trust')}", flush=True)
    _section(f"containers (project {s.compose_project})")
    if s.compose_file.is_file():
        _show(cmd.ask([*engine.compose, "-p", s.compose_project, "-f", str(s.compose_file), "ps"], timeout=120))
    else:
        print(f"no deployment: {s.compose_file} does not exist (./start.sh makes it)")
    _section(f"API {url}")
    health = api.health(url)
    print(f"health: {'ok' if health.ok else 'FAILED'}: {health.detail}", flush=True)
    if health.ok:
        routed = api.models(url, s.served_model_name)
        print(f"models: {'ok' if routed.ok else 'FAILED'}: {routed.detail}", flush=True)
    _section(f"GPU {s.gpu_device}")
    if record.get("accelerator") == "cpu":
        print("none: the cpu target serves on the CPU")
    elif shutil.which("nvidia-smi"):
        _show(cmd.ask(["nvidia-smi", *nvsmi.query_args(nvsmi.STATUS_FIELDS, header=True),
                       *(["-i", s.gpu_device] if settings.gpu_devices(s.gpu_device) else [])], timeout=30))
    else:
        print("nvidia-smi not found")
    _section("caches (named volumes)")
    volumes = _ids(engine, "volume", "ls", "-q", "--filter", f"label={LABEL}={s.compose_project}")
    for vol in volumes:
        mount = cmd.ask([engine.cli, "volume", "inspect", "--format", "{{.Mountpoint}}", vol]).stdout.strip()
        size = cmd.ask(["du", "-sh", mount], timeout=120).stdout.split("\t")[0] if mount else ""
        print(f"{vol:<40} {size.strip() or 'size unknown'}")
    if not volumes:
        print("none (removed, or never started)")
    return 0 if health.ok else 1


def stop(s: Settings, ui: Ui, purge: bool) -> int:
    engine = preflight.detect_engine(s)
    project = s.compose_project
    if s.compose_file.is_file():
        args = ["down", "--remove-orphans"] + (["--volumes"] if purge else [])
        if _compose(engine, s, *args).returncode != 0:
            raise Stop(EX_DEPLOY, f"compose could not stop {project} (see above)",
                       f"retry; or remove its containers: {engine.cli} ps -a --filter label={LABEL}={project}")
    else:
        # Without start.sh's compose file, remove what carries the project's label.
        ui.say(f"no compose file at {s.compose_file}; removing what is labelled {LABEL}={project}")
        for ls, rm in ((["ps", "-aq"], ["rm", "-f"]), (["network", "ls", "-q"], ["network", "rm"])) + (
                ((["volume", "ls", "-q"], ["volume", "rm"]),) if purge else ()):
            ids = _ids(engine, *ls, "--filter", f"label={LABEL}={project}")
            if ids:
                cmd.ask([engine.cli, *rm, *ids], timeout=300)
    ui.say(f"stopped {project} and removed its caches" if purge else
           f"stopped {project} (caches kept; --purge-cache removes them)")
    return 0


def verify(s: Settings, ui: Ui, level: str) -> int:
    url, model = api.api_url(s.bind_address, s.api_port), s.served_model_name
    skipped: List[str] = []  # the serving matrix's ids of what did not run
    checks = {"health": lambda: api.health(url), "models": lambda: api.models(url, model),
              "canary": lambda: api.canary(url, model)}
    if level == "full":
        checks["determinism"] = lambda: api.determinism(url, model)
        if s.tool_call_parser:
            checks["tool-call"] = lambda: api.tool_call(url, model)
        else:
            ui.say("tool-call: skipped (TOOL_CALL_PARSER is empty)")
            skipped.append("serve.tools")
        checks["throughput"] = lambda: api.throughput_check(url, model)
    ui.say(f"{level} checks against {url} ({model})")
    passed = failed = 0
    for name, check in checks.items():
        result = check()
        print(f"{name}: {'ok' if result.ok else 'FAILED'}: {result.detail}", flush=True)
        if result.ok:
            passed += 1
            continue
        failed += 1
        if name == "health":
            break  # nothing else can answer
    ui.say(f"{level}: {passed} of {len(checks)} checks passed")
    if failed:
        raise Stop(EX_CHECK, f"{failed} check(s) failed against {url}",
                   f"look at the server: {s.hint('status')}, or the engine's logs for project {s.compose_project}")
    if skipped:
        record = deployment(s)
        release = str(record.get("release") or "")
        required = needs.needs(s.manifests_dir / release if release else None, s.release_key_fingerprint,
                               str(record.get("target") or s.deploy_target or ""))
        missing = required.missing(skipped)
        if missing:
            raise Stop(EX_INCOMPLETE, f"{', '.join(missing)} did not run, and {required.source}: never a pass",
                       "set TOOL_CALL_PARSER in the settings file (e.g. hermes) and ./start.sh again")
    return 0
