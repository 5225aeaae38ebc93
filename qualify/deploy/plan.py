"""The data-shaped half of `./start.sh`: memory fit, release selection, the
trust-gate decision, the compose document, and the OpenAI API checks.

start.sh (bash) runs the host checks and the engine; everything here is pure
functions over values it passes in, so it is unit-tested without a GPU.
Standard library only at import time: start.sh's preflight may run on a
system python3 without the toolkit's dependencies.
"""

from __future__ import annotations

import errno
import json
import re
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from qualify.config.imageref import ImageRef, ImageRefError
from qualify.core import manifest as mf
from qualify.core.errors import QualifyError

CONTAINER_PORT = 8000
SERVICE = "vllm"
# The OpenAI-compatible server, named as a module so the image's ENTRYPOINT does not matter.
SERVE_ENTRYPOINT = ("python3", "-m", "vllm.entrypoints.openai.api_server")
HF_HOME = "/root/.cache/huggingface"
VLLM_CACHE = "/root/.cache/vllm"
TRITON_HOME = "/root/.triton"
VOLUMES = {"hf-cache": HF_HOME, "vllm-cache": VLLM_CACHE, "triton-cache": TRITON_HOME}
GPU_RUNTIMES = ("nvidia", "cdi", "none")
LABEL_PREFIX = "dev.blackwell-qualify"
CANARY_PROMPT = "What is 19 times 23?"
CANARY_ANSWER = "437"
# Headroom left to the host when the unified pool has to be shared (GB10).
UNIFIED_HEADROOM = 0.90


class DeployError(QualifyError):
    """start.sh cannot go on; the message says what to change."""

    exit_code = 1


class NoReleaseError(DeployError):
    """No released manifest for this target: --allow-unqualified with IMAGE may still deploy."""

    exit_code = 20


# --- memory -------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryFit:
    gpu_memory_utilization: float
    pool_gib: float  # what vLLM will see as the device's total memory
    unified: bool
    source: str  # "nvml" or "/proc/meminfo"
    notes: Tuple[str, ...] = ()


def parse_nvml_mib(text: str) -> Optional[float]:
    """`32607 MiB` or `32607` -> 32607.0; `[N/A]`, `[Not Supported]` (GB10) -> None."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(?:MiB)?\s*", text or "")
    return float(m.group(1)) if m else None


def parse_meminfo(text: str) -> Dict[str, int]:
    """/proc/meminfo as {key: bytes}."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"(\w+):\s+(\d+)(?:\s+kB)?", line)
        if m:
            out[m.group(1)] = int(m.group(2)) * 1024
    return out


def _check_fraction(fraction: float) -> float:
    if not 0.05 <= fraction <= 0.98:
        raise DeployError(f"GPU_MEMORY_UTILIZATION={fraction} is outside 0.05..0.98",
                          hint="leave it empty to use the target's value from images/targets.toml")
    return fraction


def memory_fit(runtime, nvml_memory: str, meminfo_text: Optional[str] = None,
               fraction: Optional[float] = None) -> MemoryFit:
    """Whether the model server fits this GPU, and with which memory fraction.

    `runtime` is the target's runtime table (targets.Runtime). A discrete GPU
    needs at least `min_gpu_memory_gib`. On a unified-memory GPU NVML reports
    no size; the pool is the host's memory, which the host also uses, so the
    fraction is lowered when less is free than it would ask for (seed 003:
    0.9 of 119.6 GB was refused with 39.9 GB free).
    """
    explicit = fraction is not None
    want = _check_fraction(fraction if explicit else runtime.gpu_memory_utilization)
    mib = parse_nvml_mib(nvml_memory)
    if mib is not None:
        total = mib / 1024
        if total < runtime.min_gpu_memory_gib:
            raise DeployError(f"the GPU has {total:.1f} GiB of memory; this target needs at least "
                              f"{runtime.min_gpu_memory_gib} GiB",
                              hint="choose a larger GPU with GPU_DEVICE in .env")
        return MemoryFit(want, round(total, 1), False, "nvml")
    if not runtime.unified_memory:
        raise DeployError(f"the GPU reports no memory size ({nvml_memory.strip()!r}) and its target is not a "
                          "unified-memory target",
                          hint="check the driver with `nvidia-smi -q -d MEMORY`")
    if meminfo_text is None:
        raise DeployError("unified-memory GPU: /proc/meminfo is needed to size the shared pool")
    return _unified_fit(runtime, parse_meminfo(meminfo_text), want, explicit)


def _unified_fit(runtime, info: Mapping[str, int], want: float, explicit: bool) -> MemoryFit:
    gib = 1024 ** 3
    if "MemTotal" not in info or "MemAvailable" not in info:
        raise DeployError("/proc/meminfo has no MemTotal/MemAvailable; cannot size the unified memory pool")
    pool, available, free = info["MemTotal"] / gib, info["MemAvailable"] / gib, info.get("MemFree", 0) / gib
    notes = [f"unified memory: NVML reports no size; pool {pool:.1f} GiB from /proc/meminfo, "
             f"{available:.1f} GiB available"]
    fraction = want
    if want * pool > available * UNIFIED_HEADROOM:
        if explicit:
            raise DeployError(f"GPU_MEMORY_UTILIZATION={want} asks for {want * pool:.1f} GiB of the unified pool, "
                              f"but only {available:.1f} GiB is available",
                              hint="lower GPU_MEMORY_UTILIZATION in .env, or stop other programs first")
        fraction = int(available * UNIFIED_HEADROOM / pool * 100) / 100
        notes.append(f"lowered gpu_memory_utilization from {want} to {fraction} to fit the available memory")
    if fraction * pool < runtime.min_gpu_memory_gib:
        raise DeployError(f"only {fraction * pool:.1f} GiB of the unified pool can go to the model server; "
                          f"this target needs at least {runtime.min_gpu_memory_gib} GiB",
                          hint="stop other programs, or drop the page cache: sync; echo 3 | sudo tee "
                          "/proc/sys/vm/drop_caches")
    if fraction * pool > free:
        notes.append(f"page cache holds memory the GPU needs ({free:.1f} GiB free now); if the server "
                     "fails to allocate, run: sync; echo 3 | sudo tee /proc/sys/vm/drop_caches")
    return MemoryFit(_check_fraction(fraction), round(pool, 1), True, "/proc/meminfo", tuple(notes))


# --- port ---------------------------------------------------------------------


def port_problem(address: str, port: int) -> Optional[str]:
    """None when `address:port` can be bound now, else what is wrong."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((address, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} on {address} is already in use"
            if exc.errno == errno.EADDRNOTAVAIL:
                return f"{address} is not an address of this host"
            if exc.errno == errno.EACCES:
                return f"port {port} needs privileges to bind"
            return f"cannot bind {address}:{port}: {exc.strerror}"
    return None


# --- release ------------------------------------------------------------------


@dataclass(frozen=True)
class ReleaseFiles:
    tag: str
    manifest: Path
    signature: Path
    public_key: Path

    @property
    def directory(self) -> Path:
        return self.manifest.parent


def _version_key(tag: str) -> List[Any]:
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", tag) if p]


def release_tags(manifests_dir: Path, target: str) -> List[str]:
    """Release tags under manifests/ that carry a manifest for `target`, oldest first."""
    if not manifests_dir.is_dir():
        return []
    tags = [d.name for d in manifests_dir.iterdir() if (d / f"{target}.json").is_file()]
    return sorted(tags, key=_version_key)


def release_files(manifests_dir: Path, target: str, tag: str = "") -> ReleaseFiles:
    """The manifest, signature and public key of `tag` (the newest release when empty)."""
    tags = release_tags(manifests_dir, target)
    known = ", ".join(tags) or "none"
    if not tag:
        if not tags:
            raise NoReleaseError(f"no release under {manifests_dir} has a manifest for target {target}",
                                 hint="update this checkout (git pull --tags), or point MANIFESTS_DIR at a release")
        tag = tags[-1]
    folder = manifests_dir / tag
    manifest = folder / f"{target}.json"
    if not manifest.is_file():
        raise NoReleaseError(f"release {tag} has no manifest for target {target} ({manifest} not found); "
                             f"releases with one: {known}",
                             hint="set RELEASE_TAG in .env to one of those, or leave it empty for the newest")
    files = ReleaseFiles(tag, manifest, manifest.with_name(manifest.name + ".sig"), folder / "cosign.pub")
    for path, what in ((files.signature, "signature"), (files.public_key, "public key")):
        if not path.is_file():
            raise DeployError(f"release {tag}: the {what} {path} is missing, so {manifest} cannot be verified",
                              hint="restore the release folder from the release tag or its assets")
    return files


def check_key_fingerprint(public_key: Path, pinned: str) -> str:
    """The release key's fingerprint; it must be `pinned` when one is pinned.

    The key travels in the release folder beside the manifest, so whoever can
    rewrite the manifest can swap the key too; a fingerprint pinned in .env
    (from the release announcement) closes that.
    """
    from qualify.signing import keys as cosign_keys  # needs `cryptography`; the trust gate has it, preflight need not

    actual = cosign_keys.fingerprint(cosign_keys.load_public_key(public_key.read_bytes(), what=str(public_key)))
    if pinned and pinned != actual:
        raise DeployError(f"the release key {public_key} is {actual}, not the pinned RELEASE_KEY_FINGERPRINT {pinned}",
                          hint="the release folder holds a key you did not pin: restore it from the release tag, "
                          "or pin the key of the release you mean to trust")
    return actual


def _digest_ref(text: str, what: str) -> ImageRef:
    try:
        ref = ImageRef.parse(text)
    except ImageRefError as exc:
        raise DeployError(f"{what}: {exc}") from None
    if not ref.pinned:
        raise DeployError(f"{what} {text!r} is not pinned by digest",
                          hint="write it as registry/name@sha256:<digest>")
    return ref


def image_to_deploy(stmt: Mapping[str, Any], target: str, override: str = "") -> str:
    """The manifest's `predicate.image.reference`, or IMAGE when it is the same digest.

    Also refuses a manifest made for another target. Called before the
    signature is checked, so everything it reads is checked again by verify.
    """
    named = (mf.predicate(stmt).get("target") or {}).get("name")
    if named != target:
        raise DeployError(f"the manifest is for target {named!r}, not {target!r}",
                          hint="restore the release folder: each <target>.json must describe that target")
    subject = mf.subject_digest(stmt)
    if override:
        ref = _digest_ref(override, "IMAGE")
        if ref.digest != subject:
            raise DeployError(f"IMAGE={override} is not the image the manifest qualified ({subject})",
                              hint="remove IMAGE from .env to deploy the released image, or qualify this one")
        return str(ref)
    text = (mf.predicate(stmt).get("image") or {}).get("reference") or ""
    ref = _digest_ref(text, "the manifest's predicate.image.reference")
    if ref.digest != subject:
        raise DeployError(f"the manifest is inconsistent: its reference {text} is not its subject {subject}")
    return str(ref)


# --- trust gate ---------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    action: str  # deploy | probe | refuse
    reason: str


def gate_decision(result: Mapping[str, Any], require_pass_ok: bool) -> Decision:
    """What start.sh does with a manifest whose signature and digest verified.

    `result` is `qualify verify --json` (without --require-pass); the second
    verify run, with --require-pass, says whether any check failed.
    """
    level, verdict = result.get("support_level"), result.get("verdict")
    failing = ", ".join(result.get("failing_checks") or [])
    if not require_pass_ok or verdict == "fail":
        detail = f" (failing checks: {failing})" if failing else ""
        return Decision("refuse", f"the manifest's verdict is {verdict}{detail}")
    if level == "unsupported" or level not in mf.LEVELS:
        return Decision("refuse", f"the manifest's support level is {level or 'missing'}")
    if level == "unverified" or verdict == "incomplete":
        return Decision("probe", f"qualified only statically (support level {level}, verdict {verdict}): "
                        "the GPU checks must pass on this host first")
    return Decision("deploy", f"support level {level}, verdict {verdict}")


# --- compose ------------------------------------------------------------------


@dataclass(frozen=True)
class ComposeSpec:
    image: str
    target: str
    model: str
    revision: str
    served_model_name: str
    gpu_memory_utilization: float
    max_model_len: int
    gpu_runtime: str = "nvidia"
    gpu_device: str = "0"  # UUID for the nvidia runtime, CDI device name for cdi
    selinux_label_disable: bool = False
    bind_address: str = "127.0.0.1"
    port: int = 8000
    shm_size: str = "8g"
    tool_call_parser: str = ""
    extra_args: Tuple[str, ...] = ()
    extra_env: Tuple[Tuple[str, str], ...] = ()
    health_start_period_s: int = 1800
    labels: Tuple[Tuple[str, str], ...] = field(default_factory=tuple)

    def validate(self) -> None:
        if self.gpu_runtime not in GPU_RUNTIMES:
            raise DeployError(f"GPU_RUNTIME={self.gpu_runtime!r}: use one of {', '.join(GPU_RUNTIMES)}")
        if not 1 <= self.port <= 65535:
            raise DeployError(f"API_PORT={self.port} is not a port number")


def _escape(value: str) -> str:
    """Compose interpolates `$`; our values are literal."""
    return value.replace("$", "$$")


def serve_args(s: ComposeSpec) -> List[str]:
    args = ["--model", s.model, "--revision", s.revision, "--tokenizer-revision", s.revision,
            "--served-model-name", s.served_model_name, "--host", "0.0.0.0", "--port", str(CONTAINER_PORT),
            "--gpu-memory-utilization", f"{s.gpu_memory_utilization:g}", "--max-model-len", str(s.max_model_len)]
    if s.tool_call_parser:
        args += ["--enable-auto-tool-choice", "--tool-call-parser", s.tool_call_parser]
    return args + list(s.extra_args)


def _environment(s: ComposeSpec) -> Dict[str, str]:
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "HF_HOME": HF_HOME, "HF_HUB_OFFLINE": "0",
           "VLLM_CACHE_ROOT": VLLM_CACHE, "TRITON_CACHE_DIR": f"{TRITON_HOME}/cache"}
    if s.gpu_runtime == "nvidia":
        env["NVIDIA_VISIBLE_DEVICES"] = s.gpu_device
    env.update({k: _escape(v) for k, v in s.extra_env})
    # Taken from start.sh's environment when compose runs; never written into the file.
    env["HF_TOKEN"] = "${HF_TOKEN:-}"
    return env


def _healthcheck(s: ComposeSpec) -> Dict[str, Any]:
    probe = f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{CONTAINER_PORT}/health', timeout=5)"
    return {"test": ["CMD", "python3", "-c", probe], "interval": "15s", "timeout": "10s", "retries": 3,
            "start_period": f"{s.health_start_period_s}s"}


def _publish(s: ComposeSpec) -> str:
    host = f"[{s.bind_address}]" if ":" in s.bind_address else s.bind_address
    return f"{host}:{s.port}:{CONTAINER_PORT}"


def compose_document(s: ComposeSpec) -> Dict[str, Any]:
    """The compose project as a dict (written as JSON, which is valid YAML)."""
    s.validate()
    service: Dict[str, Any] = {
        "image": s.image,
        "entrypoint": list(SERVE_ENTRYPOINT),
        "command": [_escape(a) for a in serve_args(s)],
        "restart": "unless-stopped",
        "shm_size": s.shm_size,
        "ports": [_publish(s)],
        "environment": _environment(s),
        "volumes": [f"{name}:{path}" for name, path in VOLUMES.items()],
        "healthcheck": _healthcheck(s),
        "labels": {f"{LABEL_PREFIX}.target": s.target, **{k: _escape(v) for k, v in s.labels}},
    }
    if s.gpu_runtime == "nvidia":
        service["deploy"] = {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "device_ids": [s.gpu_device], "capabilities": ["gpu"]}]}}}
    elif s.gpu_runtime == "cdi":
        service["devices"] = [f"nvidia.com/gpu={s.gpu_device}"]
    if s.selinux_label_disable:
        # Podman on an SELinux-enforcing host: without it NVML reports 'Insufficient Permissions' (seed 003).
        service["security_opt"] = ["label=disable"]
    return {"services": {SERVICE: service}, "volumes": {name: {} for name in VOLUMES}}


def compose_json(s: ComposeSpec) -> str:
    return json.dumps(compose_document(s), indent=2, sort_keys=True) + "\n"


# --- the OpenAI-compatible API ------------------------------------------------


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    detail: str


def api_url(bind_address: str, port: int) -> str:
    """Where this host reaches the server: loopback when it listens on every address."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(bind_address, bind_address)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def http_json(url: str, payload: Optional[Mapping[str, Any]] = None, timeout: float = 30.0) -> Tuple[int, Any]:
    """(status, decoded JSON or text); status 0 when nothing answered."""
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, body = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(getattr(exc, "reason", exc))
    text = body.decode("utf-8", errors="replace")
    try:
        return status, json.loads(text) if text.strip() else None
    except json.JSONDecodeError:
        return status, text


def health(base_url: str, timeout: float = 5.0) -> CheckResult:
    status, body = http_json(f"{base_url}/health", timeout=timeout)
    return CheckResult(status == 200, f"/health: HTTP {status}" if status else f"/health: no answer ({body})")


def models(base_url: str, model: str) -> CheckResult:
    status, body = http_json(f"{base_url}/v1/models")
    ids = [m.get("id") for m in (body or {}).get("data", [])] if isinstance(body, dict) else []
    if status != 200:
        return CheckResult(False, f"/v1/models: HTTP {status}: {body}")
    return CheckResult(model in ids, f"/v1/models serves {ids}" + ("" if model in ids else f", not {model!r}"))


def chat(base_url: str, model: str, messages: Sequence[Mapping[str, Any]], timeout: float = 120.0,
         **params: Any) -> Mapping[str, Any]:
    payload = {"model": model, "messages": list(messages), **params}
    status, body = http_json(f"{base_url}/v1/chat/completions", payload, timeout=timeout)
    if status != 200 or not isinstance(body, dict) or not body.get("choices"):
        raise DeployError(f"/v1/chat/completions: HTTP {status}: {str(body)[:500]}")
    return body


def _message(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return body["choices"][0].get("message") or {}


def canary(base_url: str, model: str) -> CheckResult:
    """A deterministic arithmetic question whose answer we know."""
    try:
        body = chat(base_url, model, [{"role": "user", "content": CANARY_PROMPT}], temperature=0, max_tokens=64)
    except DeployError as exc:
        return CheckResult(False, str(exc))
    answer = (_message(body).get("content") or "").strip()
    ok = CANARY_ANSWER in answer
    return CheckResult(ok, f"{CANARY_PROMPT!r} -> {answer[:200]!r}" + ("" if ok else f" (expected {CANARY_ANSWER})"))


LONG_PROMPT = "Write a numbered list of forty short, plain facts about the number seven."


def determinism(base_url: str, model: str, max_tokens: int = 512) -> CheckResult:
    """A long greedy decode, twice: the texts must be identical."""
    texts = []
    try:
        for _ in range(2):
            body = chat(base_url, model, [{"role": "user", "content": LONG_PROMPT}], temperature=0, seed=0,
                        max_tokens=max_tokens)
            texts.append(_message(body).get("content") or "")
    except DeployError as exc:
        return CheckResult(False, str(exc))
    if not texts[0].strip():
        return CheckResult(False, "greedy decode returned no text")
    if texts[0] != texts[1]:
        at = next((i for i, (a, b) in enumerate(zip(texts[0], texts[1])) if a != b), min(map(len, texts)))
        return CheckResult(False, f"two greedy decodes differ from character {at}: "
                           f"{texts[0][at:at + 40]!r} vs {texts[1][at:at + 40]!r}")
    return CheckResult(True, f"two greedy decodes of up to {max_tokens} tokens are identical ({len(texts[0])} chars)")


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def tool_call(base_url: str, model: str) -> CheckResult:
    """The server must answer with a well-formed call of the one tool offered."""
    messages = [{"role": "user", "content": "What is the weather in Paris right now? Use the tool."}]
    try:
        body = chat(base_url, model, messages, tools=[WEATHER_TOOL], tool_choice="auto", temperature=0,
                    max_tokens=128)
    except DeployError as exc:
        return CheckResult(False, str(exc))
    calls = _message(body).get("tool_calls") or []
    if not calls:
        return CheckResult(False, f"no tool call in the answer: {str(_message(body))[:300]}")
    function = calls[0].get("function") or {}
    try:
        arguments = json.loads(function.get("arguments") or "")
    except json.JSONDecodeError:
        return CheckResult(False, f"tool call arguments are not JSON: {function.get('arguments')!r}")
    ok = function.get("name") == "get_weather" and "paris" in str(arguments.get("city", "")).lower()
    return CheckResult(ok, f"tool call {function.get('name')}({json.dumps(arguments)})")


def load_json_text(text: str, what: str) -> Mapping[str, Any]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DeployError(f"{what}: not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise DeployError(f"{what}: not a JSON object")
    return doc
