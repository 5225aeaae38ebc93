"""The serving-path gate (issue 50): the paths the model takes (deploy/modelpaths.py, from its config.json)
judged by the verified manifest's `serving_paths` (core/servingpaths.py), after the trust gate and before
anything is pulled, so a model whose quantized path has no kernels for this GPU in this image ("No compiled
cutlass_scaled_mm for CUDA device capability: 120", vllm-project/vllm#32109) is refused here, not at the
server's first kernel launch.

Only the verified manifest counts (the trust gate's, from the release folder or the registry attestation),
never a checkout's targets file. Per path: `present` serves; `fallback` serves and is warned about (slower);
`missing` and `none` are refused, naming the path, vLLM's pick, the report class and the fix (the fallback's
override flag from the manifest, or another image or target); `unknown` is refused too (never a pass).
`--allow-unqualified` overrides a refusal, loudly, as every gate refusal. The exit code is preflight's (3): like
the driver check against the verified manifest (preflight.check_verified_image), it is a fact of this host's GPU
and the model, judged before the pull. What the manifest does not describe (a manifest from before issue 50, a
path it does not list, a quantization no path names, a backend EXTRA_SERVE_ARGS chose instead of vLLM's pick, a
hub model whose config.json is not here yet) is said to be not checked: never a silent pass.

A hub model whose config.json is not cached here is read after the pull, before the server starts: a one-shot
container of the verified image fetches config.json (and ModelOpt's legacy hf_quant_config.json) with the
image's own huggingface_hub into the container's own temporary folder, prints it, and is removed; nothing is
kept, and the same judgement follows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, List, Optional, Protocol, Tuple

from qualify.core.enums import ValueEnum
from qualify.core.errors import ConfigError
from qualify.core.readlimit import strict_json
from qualify.core.servingpaths import PathVerdict, ServingPath, ServingPaths
from qualify.deploy import heads, modelpaths
from qualify.deploy.modelpaths import ModelPaths, serve_option
from qualify.deploy.preflight import HostPlan
from qualify.deploy.settings import Settings
from qualify.deploy.ui import EX_PREFLIGHT, Stop, Ui
from qualify.host import cmd

FETCH_TIMEOUT_S = 300
# The issues that report the class of failure a missing path is (owner/repo#N).
SM12X_REPORTS = "vllm-project/vllm#24921, #32109, #41738"


class Action(ValueEnum):
    SERVES = "serves"
    SLOWER = "slower"  # serves on a slower fallback: a warning
    REFUSE = "refuse"
    NOT_CHECKED = "not-checked"  # the manifest does not judge it: said, never a pass


@dataclass(frozen=True)
class Row:
    path: str  # "" for what no manifest path describes
    action: Action
    text: str
    fixes: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Judgement:
    rows: Tuple[Row, ...]

    @property
    def refused(self) -> Tuple[Row, ...]:
        return tuple(r for r in self.rows if r.action is Action.REFUSE)


def _name(value: Optional[str]) -> str:
    """A provider's name as vLLM's flags spell it: FLASH_ATTN(FA2) and flash-attn are flash_attn."""
    return (value or "").split("(", 1)[0].strip().lower().replace("-", "_")


def report_class(path: str, capability: str) -> str:
    """Which class of upstream report a path without kernels on this GPU is."""
    quantized = not path.endswith(".bf16") and path != "attention.mla"
    if capability.split(".", 1)[0] == "12":
        return f"{'quantized ' if quantized else ''}kernel families absent on sm_12x: {SM12X_REPORTS}"
    return (f"kernel families absent for capability {capability} in this image: vLLM's pick fails at its first kernel "
            "launch (vllm-project/vllm#32109 is that failure on sm_120)")


def _cli(cli: str) -> Tuple[str, str]:
    """The fallback's override as (flag, value): "--moe-backend marlin" and "--moe-backend=marlin" alike."""
    tokens = cli.split()
    flag = tokens[0].split("=", 1)[0] if tokens else ""
    return flag, _name(serve_option(tokens, flag)) if flag else ""


def _setting(cli: str, env_file: str) -> str:
    """Where the settings file takes the override: a vLLM flag in EXTRA_SERVE_ARGS, an environment variable as
    CONTAINER_ENV_<NAME>."""
    if cli.startswith("-"):
        return f"EXTRA_SERVE_ARGS={cli} in {env_file} (added to what it holds)"
    name, eq, value = cli.partition("=")
    return f"CONTAINER_ENV_{name}={value} in {env_file}" if eq and name.isidentifier() else f"{cli} (in {env_file})"


def _fallback_fix(sp: ServingPath, env_file: str) -> Tuple[str, ...]:
    fb = sp.fallback
    other = f"or deploy an image or target whose verified manifest marks {sp.path} present (RELEASE_TAG, GPU_DEVICE)"
    if fb is None or not fb.cli:
        return (f"no override selects a provider of {sp.path} that runs here: deploy an image or target whose verified "
                f"manifest marks it present (RELEASE_TAG, GPU_DEVICE)",)
    slower = f"slower: {fb.note}" if fb.note else "slower"
    return (f"{_setting(fb.cli, env_file)}: vLLM then runs {fb.provider}, whose kernels run here ({slower})", other)


def _judge_one(sp: ServingPath, capability: str, env_file: str) -> Row:
    head = f"{sp.path} ({sp.title})"
    if not sp.known or sp.verdict == PathVerdict.UNKNOWN:
        return Row(sp.path, Action.REFUSE, f"{head}: the qualification could not read its kernel families (verdict "
                   f"{sp.verdict or 'missing'}: {sp.reason}): unknown is never a pass",
                   (f"deploy a release whose manifest read {sp.path}'s kernels (RELEASE_TAG)",))
    if sp.verdict == PathVerdict.PRESENT:
        return Row(sp.path, Action.SERVES, f"{sp.path}: {sp.line()}")
    if sp.verdict == PathVerdict.FALLBACK:
        return Row(sp.path, Action.SLOWER, f"{sp.path}: {sp.line()}: it serves, slower than a native kernel "
                   f"({sp.reason})" if sp.reason else f"{sp.path}: {sp.line()}: it serves, slower than a native kernel")
    if sp.verdict == PathVerdict.MISSING:
        text = (f"{head}: vLLM's pick {sp.provider or '(none)'} has no kernels for this GPU in this image, so the server "
                f"would stop at its first kernel launch ({sp.reason}); {report_class(sp.path, capability)}")
        return Row(sp.path, Action.REFUSE, text, _fallback_fix(sp, env_file))
    text = (f"{head}: no provider of this path can run on this GPU in this image ({sp.reason}); "
            f"{report_class(sp.path, capability)}")
    return Row(sp.path, Action.REFUSE, text, _fallback_fix(sp, env_file))


def _with_override(sp: ServingPath, flag: str, value: str, capability: str, env_file: str) -> Row:
    """EXTRA_SERVE_ARGS chose the provider of this path's kind: the manifest judged vLLM's default pick, so only
    a choice it names (its fallback, the provider that runs, or the pick itself) is judged; any other is not."""
    said = f"EXTRA_SERVE_ARGS {flag} {value}"
    fb = sp.fallback
    if fb is not None and (_cli(fb.cli) == (flag, _name(value)) or _name(fb.provider) == _name(value)):
        note = f"; slower: {fb.note}" if fb.note else ""
        return Row(sp.path, Action.SLOWER if fb.note or sp.verdict != PathVerdict.PRESENT else Action.SERVES,
                   f"{sp.path}: {said} selects {fb.provider}, which the manifest names as this path's fallback, whose "
                   f"kernels run here (vLLM's own pick {sp.provider or '(none)'} is {sp.verdict}){note}")
    if _name(value) == _name(sp.provider):
        row = _judge_one(sp, capability, env_file)
        return replace(row, text=f"{said} selects vLLM's own pick: {row.text}")
    if sp.runs and _name(value) == _name(sp.runs):
        return Row(sp.path, Action.SERVES, f"{sp.path}: {said} selects {sp.runs}, whose kernels the manifest found "
                   f"run here (vLLM's own pick {sp.provider or '(none)'} is {sp.verdict})")
    return Row(sp.path, Action.NOT_CHECKED, f"{sp.path}: not checked: {said} replaces vLLM's default pick, and the "
               f"manifest judged that pick ({sp.provider or 'none'}: {sp.verdict}), not {value}")


def judge(model: ModelPaths, paths: ServingPaths, capability: str, env_file: str) -> Judgement:
    """Each path the model takes, by the manifest's verdict; then what no manifest path describes."""
    rows: List[Row] = []
    for need in model.needs:
        sp = paths.get(need.path)
        if sp is None:
            rows.append(Row(need.path, Action.NOT_CHECKED, f"{need.path}: not checked: the manifest's serving_paths "
                            "do not list it"))
            continue
        override = model.override(need.kind)
        rows.append(_with_override(sp, override.flag, override.value, capability, env_file) if override else
                    _judge_one(sp, capability, env_file))
    rows += [Row("", Action.NOT_CHECKED, f"not checked: {what}: not described by the manifest")
             for what in model.undescribed]
    return Judgement(tuple(rows))


# --- on the deploy host ---------------------------------------------------------------------------------------


class Deploying(Protocol):
    """What the gate needs of run.Deploy."""

    s: Settings
    plan: HostPlan
    opts: Any  # run.Options: allow_unqualified
    ui: Ui
    target: str

    def pull(self, image: str) -> None: ...


def _config_here(s: Settings, plan: HostPlan) -> Any:
    """config.json's path on this host (MODEL_PATH, else a cached hub copy: heads.py's finder), or None."""
    return plan.model.path / "config.json" if plan.model else heads.cached_config(s, plan.engine.cli)


def _show(model: ModelPaths, ui: Ui) -> None:
    ui.say(f"model paths: {model.source}: {model.describe()}")
    for need in model.needs:
        ui.say(f"  {need.path}: {need.why}")
    for note in model.notes:
        ui.say(f"  note: {note}")


def _read_here(s: Settings, plan: HostPlan, ui: Ui) -> Optional[ModelPaths]:
    path = _config_here(s, plan)
    if path is None:
        return None
    try:
        model = modelpaths.read(path, s.extra_serve_args)
    except ConfigError as exc:
        raise Stop.because(EX_PREFLIGHT, "serving paths: the model's config", exc) from None
    _show(model, ui)
    return model


def _recorded(d: Deploying, trust: Any) -> Optional[ServingPaths]:
    """The verified manifest's serving paths, or None (said) where there are none to judge by."""
    if trust.manifest is None:
        d.ui.warn("serving paths: not checked: no verified manifest vouches for the image (--allow-unqualified "
                  "without a release)")
        return None
    paths = ServingPaths.of(trust.manifest)
    if not paths.recorded:
        d.ui.warn(f"serving paths: not checked: the verified manifest of {d.target} (release {trust.tag or 'none'}) "
                  "was qualified before serving paths were recorded (no predicate.serving_paths), so the model's "
                  "quantized paths were not checked against this image")
        return None
    return paths


def decide(d: Deploying, trust: Any, model: ModelPaths, paths: ServingPaths, when: str) -> Any:
    """Say each row; warn on slower and not-checked ones; refuse (exit 3) or, with --allow-unqualified, go on
    loudly. `when`: what has happened so far ("nothing was pulled")."""
    ui, where = d.ui, f"the verified manifest of {d.target}, release {trust.tag or '(registry attestation)'}"
    if paths.problems:
        rows: Tuple[Row, ...] = (Row("", Action.REFUSE, f"its serving_paths cannot be read ({'; '.join(paths.problems)})"
                                     ": unknown is never a pass", ("deploy a release whose manifest is whole",)),)
    else:
        rows = judge(model, paths, d.plan.target.capability_text, str(d.s.env_file)).rows
    for row in rows:
        if row.action is Action.SERVES:
            ui.say(f"serving path {row.text}")
        elif row.action is Action.SLOWER:
            ui.warn(f"serving path {row.text}")
        elif row.action is Action.NOT_CHECKED:
            ui.warn(f"serving path {row.text}")
    refused = tuple(r for r in rows if r.action is Action.REFUSE)
    if not refused:
        ui.say(f"serving paths: checked against {where}: "
               + ("every path the model takes serves here" if all(r.action is Action.SERVES for r in rows)
                  else "none is refused (the warnings above say what is slower or not checked)"))
        return trust
    reason = f"serving paths: {'; '.join(r.text for r in refused)} ({where})"
    if not d.opts.allow_unqualified:
        fixes = list(dict.fromkeys(f for r in refused for f in r.fixes))
        raise Stop(EX_PREFLIGHT, f"{reason}; {when}", *fixes,
                   "or, at your own risk: ./start.sh --allow-unqualified (vLLM is then expected to stop at the path's "
                   "first kernel launch)")
    ui.banner(["--allow-unqualified: SERVING A MODEL WHOSE PATH THE VERIFIED MANIFEST REFUSES ON THIS GPU",
               *[f"refused: {r.text}" for r in refused], "vLLM is expected to stop at that path's first kernel launch."])
    return replace(trust, reason=f"{trust.reason}; UNQUALIFIED (--allow-unqualified): "
                   + "; ".join(f"serving path {r.path or '(manifest)'} refused" for r in refused))


def check(d: Deploying, trust: Any) -> Any:
    """After the trust gate, before the pull: the model's config (MODEL_PATH, or a cached hub copy) against the
    verified manifest's serving paths. A hub model whose config is not here is said, and read after the pull."""
    model = _read_here(d.s, d.plan, d.ui)
    paths = _recorded(d, trust)
    if model is None:
        if paths is not None:
            d.ui.warn(f"serving paths: {d.s.model_id}'s config.json is not on this host yet: its quantized paths are "
                      "not checked before the image is pulled" + (" (a dry run pulls nothing; a real run reads it from "
                      "the hub through the image after the pull, before the server starts)" if d.opts.dry_run else
                      "; it is read from the hub through the image after the pull, before the server starts"))
        return trust
    if paths is None:
        return trust
    return decide(d, trust, model, paths, "nothing was pulled")


# --- a hub model: its config.json through the image, after the pull -------------------------------------------

FETCH = r'''
import json, sys
from huggingface_hub import hf_hub_download
try:
    from huggingface_hub.errors import EntryNotFoundError
except ImportError:  # huggingface_hub before 0.23
    from huggingface_hub.utils import EntryNotFoundError
repo, revision, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
out = {}
for name in ("config.json", "hf_quant_config.json"):
    if name != "config.json" and "quantization_config" in json.loads(out["config.json"]):
        break  # vLLM reads the legacy ModelOpt file only where config.json has no quantization_config
    try:
        path = hf_hub_download(repo, name, revision=revision)
    except EntryNotFoundError as exc:
        # Absent from the repository is an answer; a failed look-up (LocalEntryNotFoundError: no network) is not.
        if name == "config.json" or any(c.__name__ == "LocalEntryNotFoundError" for c in type(exc).__mro__):
            raise
        break
    with open(path, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        sys.exit(name + ": larger than %d bytes" % limit)
    out[name] = data.decode("utf-8")
print("QUALIFY-MODEL-CONFIG " + json.dumps(out))
'''
MARK = "QUALIFY-MODEL-CONFIG "


def fetch_config(d: Deploying, image: str) -> Tuple[Optional[ModelPaths], str]:
    """(the model's paths from the hub's config.json at MODEL_REVISION, fetched by a one-shot container of the
    verified image; or None and why not). Nothing is kept: the download goes to the container's own /tmp."""
    s, plan = d.s, d.plan
    names = ["HF_TOKEN"] if s.hf_token else []
    names += [k for k, _ in s.container_env]  # what the server gets (an HF_ENDPOINT mirror, say), by name only
    argv = [plan.engine.cli, "run", "--rm", "--entrypoint", "python3", "-e", "HF_HOME=/tmp/hf-config",
            *[a for n in names for a in ("-e", n)], image, "-c", FETCH, s.model_id, s.model_revision,
            str(heads.CONFIG_LIMIT)]
    env = {"HF_TOKEN": s.hf_token, **dict(s.container_env)}  # through the environment: never on a command line
    d.ui.say(f"serving paths: reading {s.model_id}'s config.json at {s.model_revision} from the hub with the image's "
             "huggingface_hub (a one-shot container; nothing is kept)")
    done = cmd.ask(argv, timeout=FETCH_TIMEOUT_S, env=env)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()
        return None, f"the one-shot container exited {done.returncode}: {last[-1][:300] if last else 'no output'}"
    line = next((x for x in reversed(done.stdout.splitlines()) if x.startswith(MARK)), "")
    if not line or len(line) > 3 * heads.CONFIG_LIMIT:
        return None, "the one-shot container printed no config (or one too large)"
    try:
        files = strict_json(line[len(MARK):], "the one-shot container's output", ConfigError)
    except ConfigError as exc:
        return None, exc.message
    text = files.get("config.json") if isinstance(files, dict) else None
    if not isinstance(text, str):
        return None, "the one-shot container printed no config.json"
    where = f"{s.model_id}'s config.json (the hub, at {s.model_revision})"
    try:
        config = strict_json(text, where, ConfigError)
        legacy = strict_json(files["hf_quant_config.json"], f"{s.model_id}'s {modelpaths.LEGACY_MODELOPT_FILE}",
                             ConfigError) if isinstance(files.get("hf_quant_config.json"), str) else None
        source = where + (f" and {modelpaths.LEGACY_MODELOPT_FILE}" if legacy is not None else "")
        return modelpaths.of_config(config, s.extra_serve_args, source, legacy), ""
    except ConfigError as exc:
        raise Stop.because(EX_PREFLIGHT, "serving paths: the model's config", exc) from None


def pull_and_check(d: Deploying, trust: Any) -> Any:
    """The pull; then, for a hub model whose config was not on this host before it, the same judgement from
    the hub's config.json, before the server starts."""
    d.pull(trust.image)
    if d.plan.model is not None or not d.s.model_id or _config_here(d.s, d.plan) is not None:
        return trust  # judged before the pull (or MODEL_PATH, which check() read)
    if trust.manifest is None or not ServingPaths.of(trust.manifest).recorded:
        return trust  # check() said why nothing is judged
    paths = ServingPaths.of(trust.manifest)
    model, why = fetch_config(d, trust.image)
    if model is None:
        d.ui.warn(f"serving paths: not checked: {d.s.model_id}'s config.json could not be read through the image "
                  f"({why}); vLLM reads it at start-up")
        return trust
    _show(model, d.ui)
    return decide(d, trust, model, paths, "the image was pulled; the server was not started")
