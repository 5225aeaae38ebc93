"""Which server a serve-check run is about, and what is known of it.

As scripts/verify.sh finds it: the settings file (API address, served model name, tool-call parser, the release
key pin) and what start.sh recorded beside the compose file (deployment.json: target, image, release, container,
MODEL_PATH, the GPU evidence of the run). Otherwise `--url URL --model NAME`, with what the caller knows
(`--image`, `--target`, `--release-dir`, `--tool-call-parser`, `--server-log`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Tuple

from qualify.config.imageref import ImageRef, try_parse
from qualify.core.errors import ConfigError, QualifyError
from qualify.core.manifest import Manifest
from qualify.core.servingpaths import ServingPaths
from qualify.deploy import api, heads, modelpaths, ops, preflight, settings
from qualify.deploy.servecheck.providers import ServingInput
from qualify.deploy.ui import Ui
from qualify.host import clients, cmd
from qualify.release import serving
from qualify.trust.folder import read_release
from qualify.trust.verify import KeyAnchor

UNKNOWN = "unknown"


@dataclass(frozen=True)
class Server:
    url: str
    model: str
    found_by: str  # "deployment" (the settings file and deployment.json) or "url"
    target: str
    image: Optional[str]  # name@sha256:...
    release: str
    release_dir: Optional[Path]
    key_pin: str
    tool_call_parser: Optional[str]  # "" the deployment has none; None not known
    max_model_len: int  # the settings' (the server's own /v1/models answer wins)
    project: str = ""
    container: str = ""
    engine_cli: str = ""
    model_path: Optional[Path] = None
    server_log: Optional[Path] = None
    signing_key: Optional[Path] = None
    records_dir: Optional[Path] = None  # where records go when there is no release folder
    gpu_link: Optional[serving.GpuLink] = None
    model_config: Optional[Path] = None  # the served model's config.json on this host (its serving paths)
    serve_args: Tuple[str, ...] = ()  # EXTRA_SERVE_ARGS: the KV cache dtype and backends they choose

    @property
    def capability(self) -> str:
        """As the verified release signs it for the target (release.json's entry), never a targets file."""
        if self.release_dir is None:
            return UNKNOWN
        try:
            release = read_release(self.release_dir, KeyAnchor(pinned=self.key_pin))
            return release.target(self.target).entry.capability or UNKNOWN
        except (QualifyError, KeyError, StopIteration):
            return UNKNOWN


def _gpu_link(record: Mapping[str, Any]) -> Optional[serving.GpuLink]:
    link = record.get("gpu_evidence")
    if not isinstance(link, dict) or not all(isinstance(link.get(k), str) for k in
                                             ("run_id", "time", "host_id_sha256", "outcome")):
        return None
    tp = link.get("tensor_parallel_size")
    uuid = link.get("gpu_uuid_sha256")
    return serving.GpuLink(link["run_id"], link["time"], link["host_id_sha256"], link["outcome"],
                           str(link.get("file") or ""), uuid if isinstance(uuid, str) else "",
                           tp if isinstance(tp, int) and not isinstance(tp, bool) and tp >= 1 else 0)


def from_settings(env_file: Path, ui: Ui, server_log: Optional[Path] = None) -> Server:
    s = settings.load(env_file, ui)
    record = ops.deployment(s)
    if not record:
        ui.warn(f"no deployment recorded beside {s.compose_file} (./start.sh writes it): the image, release and "
                "container are not known, so the record cannot count toward promotion")
    container = str(record.get("container") or "")
    engine = preflight.detect_engine(s).cli if container else ""
    release = str(record.get("release") or "")
    model = record.get("model") if isinstance(record.get("model"), dict) else {}
    pinned = try_parse(record.get("image")) if isinstance(record.get("image"), str) else None
    image = record["image"] if pinned is not None and pinned.digest else None
    folder = Path(model["path"]) if model.get("path") else s.model_path
    config = folder / "config.json" if folder else heads.cached_config(s, engine)
    return Server(
        url=api.api_url(s.bind_address, s.api_port), model=s.served_model_name, found_by="deployment",
        target=str(record.get("target") or s.deploy_target or UNKNOWN), image=image, release=release,
        release_dir=s.manifests_dir / release if release else None, key_pin=s.release_key_fingerprint,
        tool_call_parser=s.tool_call_parser, max_model_len=s.max_model_len, project=s.compose_project,
        container=container, engine_cli=engine, model_path=folder,
        server_log=server_log, signing_key=s.evidence_signing_key, records_dir=s.deploy_dir / "evidence",
        gpu_link=_gpu_link(record), model_config=config, serve_args=s.extra_serve_args)


def from_url(url: str, model: str, image: Optional[str], target: str, release_dir: Optional[Path],
             tool_call_parser: Optional[str], server_log: Optional[Path], max_model_len: int,
             model_path: Optional[Path], container: str = "") -> Server:
    """`container`: the server's container on this host (its log and memory), run by docker, else podman."""
    if image is not None and not getattr(try_parse(image), "digest", None):
        raise ConfigError(f"--image {image!r} is not pinned by digest", hint="give repository@sha256:<digest>")
    engine = (clients.any_client() or "") if container else ""
    if container and not engine:
        raise ConfigError(f"--container {container}: neither docker nor podman is on PATH")
    return Server(url=url.rstrip("/"), model=model, found_by="url", target=target or UNKNOWN, image=image,
                  release=release_dir.name if release_dir else "", release_dir=release_dir, key_pin="",
                  tool_call_parser=tool_call_parser, max_model_len=max_model_len, model_path=model_path,
                  server_log=server_log, records_dir=Path("build") / "serve-check", container=container,
                  engine_cli=str(engine), model_config=model_path / "config.json" if model_path else None)


def startup_log(server: Server, limit: int) -> Tuple[Optional[str], str]:
    """(the server's log or None, where it came from or why there is none)."""
    if server.server_log is not None:
        try:
            with open(server.server_log, "rb") as fh:
                return fh.read(limit).decode("utf-8", "replace"), str(server.server_log)
        except OSError as exc:
            return None, f"{server.server_log}: {exc.strerror or exc}"
    if server.container and server.engine_cli:
        out = cmd.ask([server.engine_cli, "logs", server.container], timeout=120)
        if out.returncode == 0:
            return (out.stdout + out.stderr)[:limit], f"{server.engine_cli} logs {server.container[:12]}"
        return None, f"{server.engine_cli} logs {server.container[:12]}: {out.stderr.strip()[:200]}"
    return None, "no container is recorded for this deployment; give the log with --server-log FILE"


def verified_manifest(server: Server) -> Tuple[Optional[Manifest], str]:
    """The verified release manifest of the served image, and where it is from; or None and why not."""
    if server.release_dir is None:
        return None, "the deployment names no release (give --release-dir manifests/TAG)"
    try:
        release = read_release(server.release_dir, KeyAnchor(pinned=server.key_pin))
        manifest = release.target(server.target).manifest
    except (QualifyError, KeyError, StopIteration) as exc:
        return None, f"release {server.release_dir}: {getattr(exc, 'message', exc)}"
    if server.image and manifest.digest != ImageRef.parse(server.image).digest:
        return None, f"the served image {server.image} is not the manifest's {manifest.subject}"
    return manifest, f"{server.release_dir / (server.target + '.json')} (release {release.tag}, verified)"


def manifest_providers(server: Server) -> Tuple[Optional[Sequence[Mapping[str, Any]]], str]:
    """The verified release manifest's providers, or None and why not."""
    manifest, source = verified_manifest(server)
    if manifest is None:
        return None, source
    providers = manifest.predicate.get("providers")
    return (list(providers) if isinstance(providers, list) else []), source


def serving_input(server: Server) -> ServingInput:
    """The model's serving paths (its config.json, as the deploy maps it) and the verified manifest's
    serving_paths, for serve.providers' evidence; each None with why where it is not known."""
    model, model_why = None, "the model's config.json is not on this host (MODEL_PATH, or a cached hub copy)"
    if server.model_config is not None and server.model_config.is_file():
        try:
            model, model_why = modelpaths.read(server.model_config, server.serve_args), ""
        except QualifyError as exc:
            model_why = exc.message
    manifest, source = verified_manifest(server)
    paths = ServingPaths.of(manifest) if manifest is not None else None
    if paths is not None and not paths.recorded:
        paths, source = None, f"{source}: qualified before serving paths were recorded (no predicate.serving_paths)"
    return ServingInput(model, model_why, paths, "" if paths else source)
