"""`./start.sh`, in one process: preflight, release, trust gate, GPU checks here, compose, health, canary.

start.sh only finds a Python and hands over. Exit codes: 0 serving,
2 settings, 3 preflight, 4 trust gate, 5 deploy or health (or GB10's unified
memory short while the server started: startup.py), 6 canary.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

from qualify.config.imageref import ImageRef
from qualify.core import manifest as mf
from qualify.core import topology
from qualify.core.errors import QualifyError
from qualify.deploy import (
    allreduce,
    api,
    choice,
    collectives,
    compose,
    gate,
    hostload,
    ops,
    p2p,
    pathgate,
    preflight,
    ptxgate,
    signed,
    state,
)
from qualify.deploy.errors import DeployError
from qualify.deploy.servecheck import status as matrix_status
from qualify.deploy.settings import Settings
from qualify.deploy.startup import Startup
from qualify.deploy.ui import EX_DEPLOY, EX_TRUST, EX_USAGE, Stop, Ui
from qualify.host import cmd, paths
from qualify.release import evidence as ev
from qualify.trust import gpuconfig
from qualify.trust.policy import AllReduceFloor, PtxJitFloor
from qualify.trust.records import PUBLICATION_FILE


@dataclass(frozen=True)
class Options:
    dry_run: bool = False
    allow_unqualified: bool = False
    allow_no_gpu_runtime: bool = False
    probe: bool = False  # run the GPU checks here even when the level would skip them
    allow_downgrade: bool = False  # with RELEASE_TAG: deploy a release older than one this host accepted


@dataclass(frozen=True)
class Trust:
    """What the trust gate settled: the image, the verified manifest it rests on and why it may serve."""

    image: str
    manifest: Optional[mf.Manifest]  # None only for --allow-unqualified with no release at all
    folder: Optional[Path]  # the release folder the manifest was verified in (evidence is saved there)
    tag: str
    reason: str
    need_probe: bool
    accepted: Optional[state.Accepted] = None  # what this host remembers once it goes ahead
    # The all-reduce floors the verified release's policy signs; None where nothing signed any: a release from
    # before the signed policy, the registry-only path (a release statement carries no policy), no release.
    allreduce_floors: Optional[Tuple[AllReduceFloor, ...]] = None
    ptx_jit: Optional[Tuple[PtxJitFloor, ...]] = None  # the release's signed PTX JIT table (issue 51), as the floors
    level: str = ""  # the target's current level (its promotion record's, else release.json's); '' without one


class Deploy:
    def __init__(self, s: Settings, opts: Options, ui: Ui) -> None:
        self.s, self.opts, self.ui = s, opts, ui

    # --- trust gate ------------------------------------------------------------------

    def override(self, reason: str, image: str, fix: str = "") -> str:
        """Stop, unless --allow-unqualified, which is announced loudly; the reason for the label."""
        if not self.opts.allow_unqualified:
            raise Stop(EX_TRUST, f"trust gate: REFUSED: {reason}",
                       fix or f"deploy a release whose manifest passes for {self.target} (RELEASE_TAG in "
                       f"{self.s.env_file})", "or, at your own risk: ./start.sh --allow-unqualified")
        self.ui.banner(["--allow-unqualified: DEPLOYING AN IMAGE THE TRUST GATE REFUSED", f"reason: {reason}",
                        f"image: {image}", "Its qualification does not vouch for it on this host."])
        return f"UNQUALIFIED (--allow-unqualified): {reason}"

    def refuse(self, what: str, exc: QualifyError) -> Stop:
        return Stop.because(EX_TRUST, f"trust gate: REFUSED: {what}", exc,
                            "this refusal cannot be overridden: nothing vouches for what the image is")

    def fetch(self, tag: str) -> None:
        """RELEASE_TAG names a release this checkout lacks: its files from the GitHub release (verified as usual)."""
        try:
            fetched = choice.fetch_release(self.s.manifests_dir, tag, self.s.release_github_repo)
        except DeployError as exc:
            raise self.refuse(f"release {tag}", exc) from None
        if fetched is not None:
            self.ui.say(f"release {tag}: fetched its files from the GitHub release into {fetched}")

    def judge(self, accepted: state.Accepted) -> None:
        """Against what this host accepted before (anti-rollback, state.py)."""
        try:
            known = state.load(self.s.deploy_dir)
            note = state.judge(known.get(self.target), accepted, key_pinned=bool(self.s.release_key_fingerprint),
                               tag_pinned=bool(self.s.release_tag), allow_downgrade=self.opts.allow_downgrade,
                               known=known)
        except state.StateError as exc:
            raise Stop.because(EX_TRUST, "trust gate: REFUSED", exc, "--allow-unqualified does not override this") from None
        self.ui.say(f"trust gate: {note}")

    def checked(self, m: mf.Manifest, override: str, published: Optional[str]) -> str:
        """The image to deploy, after the verified manifest's target, capability and platform matched the GPU's."""
        t = self.plan.target
        try:
            choice.check_for_gpu(m, t.name, t.capability_text, t.platform)
            preflight.check_verified_image(mf.RuntimeFacts.of(m), self.plan, self.ui)
            return choice.image_to_deploy(m, override, published)
        except DeployError as exc:
            raise self.refuse(f"the manifest for {self.target}", exc) from None

    def trust_gate(self) -> Trust:
        """The release preflight chose and verified for this host's target (signed.py), before any target fact
        was used: its manifest for the target, judged."""
        pin = self.s.release_key_fingerprint
        release = self.plan.chosen.release
        self.ui.say(f"trust gate: release {release.tag} for {self.target} under {self.s.manifests_dir}")
        target = release.target(self.target)
        m = target.manifest
        published = None if self.s.image else release.published_reference(self.target)
        image = self.checked(m, self.s.image, published)
        accepted = state.of_release(release, self.target)
        self.ui.say(f"release {release.tag}: sequence {release.index.sequence}"
                    + (f", promotion {target.promotion_sequence} ({target.promotion.level})" if target.promotion else "")
                    + f"; verified in {release.path}")
        self.ui.say(f"release key: {release.key.fingerprint}" + (" (pinned)" if pin else
                    f", from the release folder (pin it: RELEASE_KEY_FINGERPRINT in {self.s.env_file})"))
        self.judge(accepted)
        if target.promotion and target.promotion.unsigned_evidence_allowed:
            self.ui.warn(f"{self.target}: its level {target.promotion.level} rests on evidence no enrolled host signed "
                         "(promote --allow-unsigned-evidence, recorded in the signed promotion record)")
        if published:
            self.ui.say(f"published: {published} (from {PUBLICATION_FILE}, signed with the release key)")
        self.ui.say(f"manifest: {release.path / target.entry.manifest_file}; image: {image}")
        for line in matrix_status.lines(target, release.path, release.rule(self.target)):
            self.ui.say(line)
        decision = gate.gate_decision(m, current=target.current)
        floors = release.index.policy.allreduce_floors if release.index.policy else None
        trust = Trust(image, m, release.path, release.tag, decision.reason, False, accepted, floors, ptxgate.signed(release),
                      target.current.level)
        return self.decide(trust, decision)

    def decide(self, trust: Trust, decision: gate.Decision) -> Trust:
        """Deploy, probe first, or refuse (unless --allow-unqualified), as the gate decided."""
        if decision.action == gate.Action.DEPLOY.value:
            if self.plan.target.is_cpu:
                self.ui.say(f"trust gate: passed: {decision.reason}" + ("; --probe has nothing to run" if self.opts.probe
                                                                          else ""))
                return trust
            if self.opts.probe:
                self.ui.say(f"trust gate: passed: {decision.reason}; --probe: the GPU checks run here first")
                return replace(trust, need_probe=True)
            self.ui.say(f"trust gate: passed: {decision.reason}; the GPU checks are skipped (--probe runs them)")
            return trust
        if decision.action == gate.Action.PROBE.value:
            self.ui.say(f"trust gate: {decision.reason}")
            return replace(trust, need_probe=True)
        self.ui.say(f"error: verdict check failed: {decision.reason}")
        return replace(trust, reason=self.override(decision.reason, trust.image))

    # --- GPU checks on this host ----------------------------------------------------

    def probe_here(self, trust: Trust, scope: str = "gpu") -> Tuple[Trust, Optional[Path]]:
        """The probe's GPU checks inside the image, on our GPUs; the evidence is saved beside the manifest.
        Several GPUs: the checks include the NCCL collectives, which the all-reduce gate then judges; scope
        `allreduce` runs only those (a level that skips the GPU checks still gets the gate)."""
        from qualify.host.engine import Engine
        from qualify.qualification import container

        rt, plan = self.plan.runtime, self.plan
        gpus, devices = rt.probe_gpus()  # exactly the deployment's GPUs
        what = f"{len(plan.gpus)} x {plan.gpu.name}" if plan.multi_gpu else plan.gpu.name
        where = f"with {what}" if gpus or devices else f"WITHOUT a GPU (GPU_RUNTIME={rt.kind}; this host's " \
            f"{what} is not given to the container)"
        self.ui.say(f"GPU checks: running the probe inside the image, {where}, before serving"
                    + (f" ({scope}: the NCCL collectives on {plan.tensor_parallel_size} GPUs)" if scope == "allreduce"
                       else ""))
        target = signed.probe_target(plan.chosen, trust.manifest.profile if trust.manifest else None,
                                     tensor_parallel_size=plan.tensor_parallel_size if plan.multi_gpu else 0,
                                     allreduce_floors=(self.floor,) if self.floor else (),
                                     collective_env=self.collectives.env.as_dict())  # the server's, exactly
        engine = Engine(self.plan.engine.kind, binary=self.plan.engine.cli)  # the client preflight found answering
        try:
            run = container.run_probe(engine, trust.image, target, scope=scope, gpus=gpus, devices=devices,
                                      options=self.collectives.run_args(plan.tensor_parallel_size))
            predicate, sources = run.predicate, run.probe_sha256  # the digest of the bytes that were mounted
            outcome = ev.probe_outcome(predicate, str(self.plan.target.capability))
        except QualifyError as exc:  # the probe did not complete: infrastructure, it proves nothing
            predicate, sources = {}, container.probe_sources_digest()
            outcome = ev.ProbeOutcome(ev.Outcome.INFRASTRUCTURE, f"the probe did not complete: {exc}", ())
        record = self.evidence_record(trust, outcome, predicate, sources)
        path = self.save_evidence(trust, record)
        self.probed = predicate
        if scope == "allreduce":
            return trust, path  # judged by allreduce_gate, whatever the single-GPU checks' outcome would be
        if outcome.outcome == ev.Outcome.PASS:
            self.ui.say(f"GPU checks: all passed on this host ({outcome.reason})")
            return replace(trust, reason=f"{trust.reason}; GPU checks passed here"), path
        if outcome.outcome == ev.Outcome.PRODUCT_FAILURE:
            reason = f"the GPU checks failed on this host: {outcome.reason} (evidence: {path})"
            return replace(trust, reason=self.override(reason, trust.image)), path
        reason = self.gpu_checks_refusal(trust, f"they did not run here: {outcome.reason} (evidence: {path})")
        return replace(trust, reason=self.override(reason, trust.image, self.gpu_checks_fix())), path

    def gpu_checks_refusal(self, trust: Trust, why: str) -> str:
        """The one wording of a refusal for want of GPU checks here, in a dry run and a real run alike."""
        level = trust.level or "unknown"
        return (f"the GPU checks did not run on this host: the manifest passes, but its level is {level}, and only "
                f"GPU checks passing on the target's own GPU can raise it; {why}")

    def gpu_checks_fix(self) -> str:
        if self.plan.runtime.kind == "none":
            return "give the container the GPU (GPU_RUNTIME=auto with the NVIDIA container toolkit or CDI), then run again"
        return "run again once the GPU checks can run (see above), or deploy a release that is baseline for " + self.target

    def evidence_record(self, trust: Trust, outcome: ev.ProbeOutcome, predicate: Mapping[str, Any],
                        sources: str) -> ev.Evidence:
        g = self.plan.gpu
        figures: Dict[str, float] = {}
        for c in outcome.checks:
            tflops = (c.get("evidence") or {}).get("tflops") if c.get("id") == "gpu.bf16-matmul" else None
            if isinstance(tflops, (int, float)):
                figures["bf16_matmul_tflops"] = float(tflops)
        busbw = gpuconfig.bus_bandwidth(outcome.checks)
        if busbw is not None:
            figures["allreduce_busbw_gbs"] = busbw
        return ev.Evidence(
            release=trust.tag, target=self.target, capability=str(self.plan.target.capability),
            image_reference=trust.image, image_digest=ImageRef.parse(trust.image).digest or "",
            probe_sources_digest=sources,
            gpu=ev.Gpu(name=g.name, capability=g.capability, uuid_sha256=ev.hashed(g.uuid), driver=g.driver),
            host_id_sha256=ev.host_id(), time=ev.now(), outcome=outcome.outcome, reason=outcome.reason,
            checks=tuple(outcome.checks), figures=figures, run_id=str(predicate.get("run_id") or ""),
            configuration=self.configuration())

    def configuration(self) -> gpuconfig.Configuration:
        """This deployment's row in the Blackwell support RFC's matrix: one GPU, or N joined by a topology."""
        p = self.plan
        return gpuconfig.Configuration(len(p.gpus), p.tensor_parallel_size, p.topology.kind) if p.multi_gpu else \
            gpuconfig.SINGLE_GPU

    def signed_floor(self, trust: Trust) -> Trust:
        """Several GPUs: the all-reduce floor for the topology and TP size preflight found, from the verified
        release's signed policy only (never this checkout's targets file, which anyone running start.sh may
        edit). No signed floor (a release signed before floors existed, the registry-only path, whose release
        statement carries no policy, or a policy without this topology) refuses: fail closed, since the gate
        could not judge what it measures. --allow-unqualified overrides it loudly, as every gate refusal."""
        p, self.floor = self.plan, None
        if not p.multi_gpu:
            return trust
        tp, kind = p.tensor_parallel_size, p.topology.kind
        if trust.allreduce_floors is not None:
            self.floor = topology.floor_for(trust.allreduce_floors, kind, tp)
            if self.floor is not None:
                self.ui.say(f"all-reduce floor: {self.floor.min_bus_gbps:g} GB/s bus bandwidth for {tp} GPUs joined by "
                            f"{kind} (signed in release {trust.tag}'s policy)")
                return trust
            signs = ", ".join(f"{f.topology} from {f.gpus} GPUs" for f in trust.allreduce_floors) or "none"
            why = f"release {trust.tag}'s signed policy has no all-reduce floor for {tp} GPUs joined by {kind} " \
                f"(it signs: {signs})"
        elif trust.manifest is None:
            why = "no release vouches for the image, so nothing signs an all-reduce floor"
        elif trust.folder is None:
            why = ("the image was trusted from its registry attestation alone, whose release statement signs no "
                   "policy and so no all-reduce floor")
        else:
            why = f"release {trust.tag or '(none)'} was signed without a policy, so it signs no all-reduce floor"
        reason = (f"a tensor-parallel deploy on {tp} GPUs is judged by the all-reduce floor its release signs, and "
                  f"{why}: the NCCL gate could not judge what it measures")
        fix = (f"deploy a release signed with [allreduce] floors for {kind} (RELEASE_TAG in {self.s.env_file}, and "
               "MANIFESTS_DIR with its release folder), or serve on one GPU (GPU_DEVICE=0)")
        return replace(trust, reason=self.override(reason, trust.image, fix))

    def allreduce_gate(self, trust: Trust) -> Trust:
        """Several GPUs: the NCCL collectives on exactly them, from the GPU checks just run or run now, judged
        against the single-GPU reference and the floor for their topology; refused (with the numbers) unless
        they hold."""
        plan = self.plan
        if not plan.multi_gpu:
            return trust
        if self.probed is None or not any(c.get("id") == "gpu.nccl-allreduce" for c in self.probed.get("checks") or []
                                          if isinstance(c, dict)):
            trust, _ = self.probe_here(trust, scope="allreduce")
        judged = allreduce.judge(self.probed or {}, plan.tensor_parallel_size, plan.topology, self.floor,
                                 self.collectives.env)
        peers = p2p.judge(self.probed or {}, self.collectives, plan.p2p_host)
        where = self.evidence[0] if self.evidence else "not saved"
        refused = f"the NCCL all-reduce gate refused {plan.tensor_parallel_size} x {plan.gpu.name} " \
            f"({plan.topology.describe()})"
        if not judged.ok:
            reason = f"{refused}: {judged.reason} (evidence: {where})"
            return replace(trust, reason=self.override(reason, trust.image, self.allreduce_fix()))
        self.ui.say(f"all-reduce gate: NCCL passed: {judged.reason}")
        if not peers.ok:
            reason = f"{refused}: P2P: {peers.reason} (evidence: {where})"
            return replace(trust, reason=self.override(reason, trust.image, peers.fix or self.allreduce_fix()))
        if peers.warning:
            self.ui.warn(peers.warning)
        self.ui.say(f"all-reduce gate: P2P passed: {peers.reason}")
        return replace(trust, reason=f"{trust.reason}; NCCL all-reduce passed on {plan.tensor_parallel_size} GPUs "
                       f"({plan.topology.kind}, busbw {judged.busbw_gbs:g} GB/s), P2P consistent")

    def allreduce_fix(self) -> str:
        if self.plan.runtime.kind == "none":
            return self.gpu_checks_fix()
        return ("check the GPUs' links (nvidia-smi topo -m; NCCL_DEBUG=INFO in CONTAINER_ENV_NCCL_DEBUG shows NCCL's "
                "transport), or serve on one GPU (GPU_DEVICE=0)")

    def save_evidence(self, trust: Trust, record: ev.Evidence) -> Optional[Path]:
        # Beside the manifest; trusted from the registry alone, in the deploy folder.
        folder = trust.folder or self.s.deploy_dir / "evidence"
        path = folder / ev.file_name(self.target, record.time, record.host_id_sha256)
        try:
            ev.write(path, record)
        except OSError as exc:
            self.ui.warn(f"cannot write {path}: {exc.strerror}")
            return None
        self.ui.say(f"GPU evidence saved: {path} ({record.outcome.value})")
        self.evidence = (path, record)
        self.sign_evidence()  # at once: a failure is evidence too, and must count as much as a pass
        return path

    def sign_evidence(self) -> None:
        """With EVIDENCE_SIGNING_KEY, this host's signature beside the record (what `promote` needs from an
        enrolled host); without it the record stays unsigned, and says so."""
        key = self.s.evidence_signing_key
        if self.evidence is None:
            return
        if key is None:
            self.ui.warn("the GPU evidence is not signed (EVIDENCE_SIGNING_KEY is empty): `qualify promote` counts "
                         "only evidence an enrolled host signed")
            return
        try:
            sig = ev.sign(self.evidence[0], ev.host_signer(key))
            self.ui.say(f"GPU evidence signed with this host's key: {sig}")
        except QualifyError as exc:
            self.ui.warn(f"the evidence is not signed: {exc}")

    # --- deploy ------------------------------------------------------------------------

    def compose_text(self, trust: Trust) -> str:
        s, plan = self.s, self.plan
        spec = compose.ComposeSpec(
            image=trust.image, target=self.target, model=s.model_id, revision=s.model_revision,
            model_path=str(plan.model.path) if plan.model else "",
            cpu_kv_cache_gib=plan.target.runtime.kv_cache_gib if plan.target.is_cpu else 0,
            served_model_name=s.served_model_name, gpu_memory_utilization=plan.fit.gpu_memory_utilization,
            max_model_len=s.max_model_len, gpu_runtime=plan.runtime.kind, tensor_parallel_size=plan.tensor_parallel_size,
            gpu_device=plan.runtime.container_gpu or "0", selinux_label_disable=plan.runtime.selinux_off,
            bind_address=s.bind_address, port=s.api_port, collectives=self.collectives,
            tool_call_parser=s.tool_call_parser, extra_args=s.extra_serve_args,
            extra_env=s.container_env, health_start_period_s=s.health_timeout_s,
            labels=((paths.label("image"), trust.image),
                    (paths.label("manifest"),
                     str(trust.folder / f"{self.target}.json") if trust.folder else "none"),
                    (paths.label("gate"), trust.reason), (paths.label("model"), self.model_source())))
        try:
            return compose.compose_json(spec)
        except DeployError as exc:
            raise Stop.because(EX_USAGE, "", exc) from None

    def engine_run(self, *args: str, timeout: float = 600) -> cmd.Result:
        return cmd.watched([self.plan.engine.cli, *args], timeout=timeout)

    def compose(self, *args: str, capture: bool = False) -> cmd.Result:
        argv = [*self.plan.engine.compose, "-p", self.s.compose_project, "-f", str(self.s.compose_file), *args]
        env = {"HF_TOKEN": self.s.hf_token}  # the compose file refers to ${HF_TOKEN:-}
        return (cmd.ask if capture else cmd.watched)(argv, timeout=900, env=env)

    def pull(self, image: str) -> None:
        self.ui.say(f"pulling {image}")
        if self.engine_run("pull", image).returncode != 0:
            raise Stop(EX_DEPLOY, f"cannot pull {image} (see above)",
                       f"check the network and the registry login ({self.plan.engine.cli} login {image.split('/', 1)[0]})")

    def compose_up(self, text: str) -> str:
        from qualify.core.fsutil import write_atomic

        write_atomic(self.s.compose_file, text)
        self.ui.say(f"starting compose project {self.s.compose_project} ({self.s.compose_file})")
        if self.compose("up", "-d", "--remove-orphans").returncode != 0:
            raise Stop(EX_DEPLOY, "compose could not start the project (see above)",
                       f"read the error above; {self.s.hint('stop')} removes what was started")
        cid = self.compose("ps", "-q", compose.SERVICE, capture=True).stdout.strip()
        if not cid:
            raise Stop(EX_DEPLOY, f"compose started no {compose.SERVICE} container",
                       f"see: {' '.join(self.plan.engine.compose)} -p {self.s.compose_project} logs")
        return cid

    def record_figures(self, figures: Optional[api.Throughput]) -> None:
        """The canary's figures join this run's GPU evidence: per-SKU performance, the Blackwell support RFC."""
        if figures is None or self.evidence is None:
            return
        path, record = self.evidence
        record = record.with_figures(canary_ttft_s=figures.ttft_s, canary_tokens_per_s=figures.tokens_per_s)
        ev.write(path, record)
        self.evidence = (path, record)
        self.sign_evidence()

    def model_source(self) -> str:
        """What is served: the local folder (MODEL_PATH wins), or the hub model at its revision."""
        if self.plan.model:
            return f"{self.plan.model.path} (MODEL_PATH, offline)"
        return f"{self.s.model_id} ({self.s.model_revision})"

    def record_deployment(self, trust: Trust, cid: str) -> None:
        """What this deployment serves, beside its compose file (status.sh reads it)."""
        from qualify.core.fsutil import write_json

        doc = {"target": self.target, "accelerator": self.plan.target.accelerator.value, "image": trust.image,
               "release": trust.tag, "trust": trust.reason, "container": cid,
               "model": {"path": str(self.plan.model.path), "files": self.plan.model.files,
                         "bytes": self.plan.model.size} if self.plan.model else
               {"id": self.s.model_id, "revision": self.s.model_revision},
               "served_model_name": self.s.served_model_name,
               "gpus": {"devices": [g.uuid for g in self.plan.gpus], "tensor_parallel_size": self.plan.tensor_parallel_size,
                        "topology": self.plan.topology.as_json()} if self.plan.gpus else None,
               "gpu_evidence": self.evidence_link()}
        write_json(self.s.compose_file.with_name(ops.DEPLOYMENT_FILE), doc)

    def evidence_link(self) -> Optional[Dict[str, Any]]:
        """The GPU evidence this run saved, by its run's identity: serve-check copies it into its record, so that
        promote counts the two together (release/servecount.py)."""
        if self.evidence is None:
            return None
        path, r = self.evidence
        return {"file": path.name, "run_id": r.run_id, "time": r.time, "host_id_sha256": r.host_id_sha256,
                "outcome": r.outcome.value, "gpu_uuid_sha256": r.gpu.uuid_sha256,
                "tensor_parallel_size": r.configuration.tensor_parallel_size}

    def summary(self, trust: Trust, url: str) -> str:
        s = self.s
        return (f"Serving {self.model_source()} as '{s.served_model_name}'\n"
                f"  API:      {url}/v1   (OpenAI-compatible)\n"
                f"  image:    {trust.image}\n"
                f"  target:   {self.target} on {self.gpus_text()}\n"
                f"  trust:    {trust.reason}\n"
                f"  manage:   {s.hint('status')}\n"
                f"            {s.hint('verify', '--full')}\n"
                f"            {s.hint('stop')} [--purge-cache]\n")

    def gpus_text(self) -> str:
        p = self.plan
        if not p.multi_gpu:
            return p.gpu.name + (f" ({p.gpu.uuid})" if p.gpu.uuid else "")
        return (f"{len(p.gpus)} x {p.gpu.name} ({', '.join(g.uuid for g in p.gpus)}), tensor parallel "
                f"{p.tensor_parallel_size}, {p.topology.describe()}")

    def dry_run_gate(self, trust: Trust) -> Trust:
        """Nothing runs in a dry run: say what the GPU checks would be, and refuse when they could not pass."""
        if self.plan.runtime.kind == "none":
            reason = self.gpu_checks_refusal(trust, "with GPU_RUNTIME=none the container gets no GPU, so they cannot "
                                             "run here (the real run would run them, and refuse after them)")
            return replace(trust, reason=self.override(reason, trust.image, self.gpu_checks_fix()))
        self.ui.say(f"dry run: would run the GPU checks first: {self.plan.engine.cli} run --rm "
                    f"{' '.join(self.plan.runtime.run_args)} ... {trust.image} python3 -m qualify.probe --only gpu")
        return trust

    def dry_run_allreduce(self, trust: Trust) -> Trust:
        p = self.plan
        if p.runtime.kind == "none":
            reason = (f"the NCCL all-reduce gate cannot run on {p.tensor_parallel_size} GPUs with GPU_RUNTIME=none "
                      "(the container gets no GPU; the real run would run it, and refuse after it)")
            return replace(trust, reason=self.override(reason, trust.image, self.allreduce_fix()))
        floor = f"floor {self.floor.min_bus_gbps:g} GB/s busbw" if self.floor else "no signed floor"
        options = " ".join((*p.runtime.run_args, *self.collectives.run_args(p.tensor_parallel_size)))
        self.ui.say(f"dry run: would run the NCCL all-reduce gate on {p.tensor_parallel_size} GPUs "
                    f"({p.topology.describe()}; {floor}; P2P and vLLM's custom all-reduce checked too, under the "
                    f"server's collectives): {p.engine.cli} run --rm {options} ... {trust.image} python3 -m "
                    f"qualify.probe --only {'gpu' if trust.need_probe else 'allreduce'}")
        return trust

    def server_collectives(self) -> collectives.ServerCollectives:
        """The one value the server's ranks and the all-reduce gate both run under (collectives.py)."""
        try:
            made = collectives.for_server(self.s.container_env, self.s.shm_size, self.s.extra_serve_args)
        except ValueError as exc:
            raise Stop(EX_USAGE, f"CONTAINER_ENV_ in {self.s.env_file}: {exc}", "correct it") from None
        if self.plan.multi_gpu:
            self.ui.say(f"collectives, for the server and the all-reduce gate alike: {made.describe()}")
        return made

    def main(self) -> int:
        load_before = hostload.sample()  # before anything of ours runs: the throughput line's "host busy"
        self.evidence: Optional[Tuple[Path, ev.Evidence]] = None
        self.probed: Optional[Dict[str, Any]] = None  # the predicate of the probe run here, if one ran
        self.floor: Optional[AllReduceFloor] = None  # the signed all-reduce floor for these GPUs (signed_floor)
        releases = signed.Releases(self.s, self.ui, self.fetch)  # the target's facts: only a verified release's
        self.plan = preflight.run(self.s, self.ui, self.opts.allow_no_gpu_runtime or self.opts.allow_unqualified,
                                  releases)
        self.target = self.plan.target.name
        self.collectives = self.server_collectives()
        trust = pathgate.check(self, ptxgate.check(self, self.signed_floor(self.trust_gate())))  # issues 51, 50
        url = api.api_url(self.s.bind_address, self.s.api_port)
        if self.opts.dry_run:
            if trust.need_probe:
                trust = self.dry_run_gate(trust)
            if self.plan.multi_gpu:
                trust = self.dry_run_allreduce(trust)
            text = self.compose_text(trust)
            self.ui.say(f"dry run: preflight and trust gate passed; the compose file start.sh would write to "
                        f"{self.s.compose_file}:")
            print(text, end="", flush=True)
            return 0
        self.compose_text(trust)  # settings that cannot make a compose file stop before anything is pulled
        if trust.accepted is not None:
            state.remember(self.s.deploy_dir, trust.accepted)
        trust = pathgate.pull_and_check(self, trust)  # a hub model's config, read after the pull
        if trust.need_probe:
            trust, _ = self.probe_here(trust)
        trust = self.allreduce_gate(trust)
        cid = self.compose_up(self.compose_text(trust))
        self.record_deployment(trust, cid)
        start = Startup(self.s, self.plan, self.ui, cid, url, load_before)
        with start.watching_memory():  # unified memory (GB10): stopped before the host stalls
            start.wait_healthy()
            figures = start.canary()
        self.record_figures(figures)
        print(self.summary(trust, url), end="", flush=True)
        return 0
