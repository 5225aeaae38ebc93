"""One serve-check run: the checks in order, the record, its signature, the table and the exit status."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from qualify import __version__
from qualify.config.imageref import ImageRef
from qualify.core.enums import CheckStatus
from qualify.core.errors import ConfigError, QualifyError, printable
from qualify.core.report import emit
from qualify.deploy import api
from qualify.deploy.errors import DeployError
from qualify.deploy.servecheck import accuracy, basic, needs, providers, soak
from qualify.deploy.servecheck.client import Client, ServerError
from qualify.deploy.servecheck.result import CheckResult, not_run, timed
from qualify.deploy.servecheck.server import Server, manifest_providers, serving_input, startup_log
from qualify.deploy.ui import EX_INCOMPLETE, Ui
from qualify.probe import identity, servematrix
from qualify.release import evidence as ev
from qualify.release import serving


@dataclass(frozen=True)
class Options:
    out: Optional[Path] = None
    sign_key: Optional[Path] = None
    reference: Optional[Path] = None
    reference_model: Optional[Path] = None
    reference_python: str = ""
    record_reference: Optional[Path] = None
    matrix_file: Optional[str] = None


@dataclass(frozen=True)
class Outcome:
    record: serving.ServeRecord
    path: Path
    results: Tuple[CheckResult, ...]

    @property
    def failed(self) -> bool:
        return any(r.status is CheckStatus.FAIL for r in self.results)


def _reachable(server: Server) -> None:
    health = api.health(server.url)
    if not health.ok:
        raise DeployError(f"no server answers at {server.url}: {health.detail}",
                          hint="start it (./start.sh) or give --url of a running OpenAI-compatible server")
    routed = api.models(server.url, server.model)
    if not routed.ok:
        raise DeployError(f"{server.url} does not serve {server.model!r}: {routed.detail}",
                          hint="SERVED_MODEL_NAME in the settings file, or --model")


def _memory(server: Server) -> Tuple[Optional[soak.Memory], str]:
    if server.container and server.engine_cli:
        return soak.container_memory(server.engine_cli, server.container), ""
    import urllib.parse

    port = urllib.parse.urlsplit(server.url).port or 80
    found = soak.process_memory(port)
    return (found, "") if found else (None, f"no process of this host that is not a proxy listens on port {port}")


def _reference(client: Client, server: Server, opts: Options, m: servematrix.Matrix, ids: List[List[int]],
               ui: Ui) -> Tuple[Optional[accuracy.Reference], str]:
    if opts.reference is not None:
        return accuracy.load_reference(opts.reference), ""
    folder = opts.reference_model or server.model_path
    if folder is None or not Path(folder).is_dir():
        return None, ("pass --reference FILE (recorded with --record-reference against the BF16 deployment of the "
                      "same model, on the same architecture) or --reference-model DIR (the model's folder on this host)")
    ui.say(f"serve.accuracy: computing the BF16 reference from {folder} with transformers (a child interpreter)")
    try:
        return accuracy.from_transformers(Path(folder), m.accuracy.prompts, ids, m.accuracy, m.sha256, ev.now(),
                                          opts.reference_python), ""
    except ConfigError as exc:
        return None, exc.message + (f" ({exc.hint})" if exc.hint else "")


def checks(client: Client, server: Server, opts: Options, m: servematrix.Matrix, ui: Ui) -> List[CheckResult]:
    max_len = client.max_model_len() or server.max_model_len
    memory, why = _memory(server)

    def logged() -> CheckResult:
        log, where = startup_log(server, providers.MAX_LOG_BYTES)
        predicted, source = manifest_providers(server)
        return providers.providers(log, where, predicted, source, m.providers, serving_input(server))

    def accurate() -> CheckResult:
        try:
            ids = [client.prompt_tokens(p) for p in m.accuracy.prompts]
        except ServerError as exc:
            return not_run(accuracy.ACCURACY, f"the server does not tokenize for us (/tokenize): {exc}")
        reference, why_none = _reference(client, server, opts, m, ids, ui)
        return accuracy.accuracy(client, m.accuracy, reference, why_none, ids)

    steps: List[Tuple[str, Callable[[], CheckResult]]] = [
        (basic.DETERMINISM, lambda: basic.determinism(client, m.determinism)),
        (basic.NIAH, lambda: basic.niah(client, m.niah, max_len)),
        (basic.TOOLS, lambda: basic.tools(client, m.tools, server.tool_call_parser
                                          if server.tool_call_parser is not None else "unknown")),
        (soak.SOAK, lambda: soak.soak(server.url, server.model, m.soak, memory, why)),
        (providers.PROVIDERS, logged),
        (accuracy.ACCURACY, accurate),
    ]
    out = []
    for check_id, step in steps:
        ui.say(f"{check_id}: {m.title(check_id)} ...")
        result = timed(step)
        ui.say(f"{check_id}: {result.status.value} ({result.seconds:.1f} s): {result.reason}")
        out.append(result)
    return out


def record_of(server: Server, m: servematrix.Matrix, results: List[CheckResult], max_model_len: int,
              release: str) -> serving.ServeRecord:
    # Every check judged decides the record's own outcome (and serve-check's exit status); which of them a level
    # needs is the release's signed policy (level_checks), applied by promote, not this record.
    listed = [r.as_check(m.title(r.id), True) for r in results]
    declared = serving.declared_outcome(listed)
    figures: Dict[str, float] = {}
    for r in results:
        figures.update({k: float(v) for k, v in r.figures.items()})
    if server.image:
        ref = ImageRef.parse(server.image)
        name, digest = ref.name, ref.digest or ""
    else:  # not bound to an image: named for the server (promote refuses it)
        name = f"server:{server.url}"
        digest = "sha256:" + ev.hashed(f"{server.url} {server.model}").split(":", 1)[1]
    return serving.ServeRecord(
        release=release, target=server.target, capability=server.capability, image=server.image,
        subject_name=name, subject_digest=digest, time=ev.now(), run_id=uuid.uuid4().hex, host_id_sha256=ev.host_id(),
        toolkit_version=__version__, probe_sources_digest=identity.sources_digest(), matrix_version=m.version,
        matrix_sha256=m.sha256,
        server={"url": server.url, "model": server.model, "loopback": soak.is_loopback(server.url),
                "max_model_len": max_model_len, "tool_call_parser": server.tool_call_parser or "",
                "found_by": server.found_by, **({"project": server.project} if server.project else {})},
        gpu_evidence=server.gpu_link, checks=tuple(listed), figures=figures, outcome=declared.outcome,
        reason=declared.reason)


def _where(server: Server, opts: Options, record: serving.ServeRecord) -> Path:
    name = serving.file_name(record.target, record.time, record.host_id_sha256)
    if opts.out is not None:
        return opts.out
    if server.release_dir is not None and server.release_dir.is_dir():
        return server.release_dir / name  # beside the manifest, as start.sh saves GPU evidence
    return (server.records_dir or Path(".")) / name


def sign(path: Path, key: Optional[Path], ui: Ui) -> None:
    if key is None:
        ui.warn("the record is not signed (--sign-key, or EVIDENCE_SIGNING_KEY in the settings file): `qualify "
                "promote` counts only records an enrolled host signed")
        return
    ui.say(f"signed with this host's key: {ev.sign(path, ev.host_signer(key))}")


def serve_check(server: Server, opts: Options, ui: Ui) -> Outcome:
    m = servematrix.load(opts.matrix_file)
    _reachable(server)
    client = Client(server.url, server.model)
    ui.say(f"serving matrix v{m.version} against {server.url} ({server.model}; found by {server.found_by}): "
           f"target {server.target}, image {server.image or 'not known'}, release {server.release or 'not known'}")
    results = checks(client, server, opts, m, ui)
    record = record_of(server, m, results, client.max_model_len() or server.max_model_len, server.release)
    path = _where(server, opts, record)
    path.parent.mkdir(parents=True, exist_ok=True)
    serving.write(path, record)
    ui.say(f"record: {path} ({record.outcome.value}: {record.reason})")
    sign(path, opts.sign_key or server.signing_key, ui)
    return Outcome(record, path, tuple(results))


def record_reference(server: Server, opts: Options, ui: Ui) -> Path:
    """`--record-reference FILE`: this server's answers (or, with --reference-model, transformers') as the
    reference later runs compare with."""
    m = servematrix.load(opts.matrix_file)
    _reachable(server)
    client = Client(server.url, server.model)
    ids = [client.prompt_tokens(p) for p in m.accuracy.prompts]
    if opts.reference_model is not None:
        ref = accuracy.from_transformers(opts.reference_model, m.accuracy.prompts, ids, m.accuracy, m.sha256,
                                         ev.now(), opts.reference_python)
    else:
        log, _ = startup_log(server, providers.MAX_LOG_BYTES)
        seen = providers.observe(log or "", m.providers)
        dtype = next((s.name for s in seen if s.kind == "dtype"), "")
        ref = accuracy.from_server(client, m.accuracy.prompts, ids, m.accuracy, m.sha256, ev.now(), dtype)
    from qualify.core.fsutil import write_atomic

    write_atomic(opts.record_reference, ref.to_bytes())
    ui.say(f"reference: {opts.record_reference} ({ref.source}, {ref.dtype}, {len(ref.prompts)} prompts, "
           f"sha256 {ref.sha256[:12]}...)")
    return opts.record_reference


def table(outcome: Outcome) -> str:
    """For people: one line per check, then the record."""
    width = max(len(r.id) for r in outcome.results)
    lines = [f"{r.id:<{width}}  {r.status.value:<8} {printable(r.reason)}" for r in outcome.results]
    lines.append(f"matrix: {outcome.record.outcome.value} ({outcome.record.reason}); record {outcome.path}")
    return "\n".join(lines)


def main(server_of: Callable[[], Server], opts: Options, ui: Ui, failure_code: int = 1) -> int:
    """`failure_code` when a check failed; EX_INCOMPLETE when none failed but one the release's signed policy
    requires for the target's intended level did not run (servecheck/needs.py); 0 otherwise."""
    try:
        server = server_of()
        if opts.record_reference is not None:
            record_reference(server, opts, ui)
            return 0
        outcome = serve_check(server, opts, ui)
    except QualifyError as exc:
        emit(f"[{ui.prog}] ERROR: {printable(exc.message)}" + (f"\n  fix: {printable(exc.hint)}" if exc.hint else ""),
             escape=False)
        return failure_code if isinstance(exc, DeployError) else exc.exit_code
    print(table(outcome), flush=True)
    if outcome.failed:
        return failure_code
    required = needs.needs(server.release_dir, server.key_pin, server.target)
    missing = required.missing(r.id for r in outcome.results if r.status is CheckStatus.NOT_RUN)
    if missing:
        ui.say(f"not complete: {', '.join(missing)} did not run, and {required.source}: exit {EX_INCOMPLETE}, "
               "never a pass (each check's reason above says what it needs)")
        return EX_INCOMPLETE
    return 0
