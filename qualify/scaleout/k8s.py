"""A Kubernetes Job per target: the probe's GPU checks of a published image on a matching GPU node.

- The node is chosen by NVIDIA GPU feature discovery's labels: the exact
  compute capability (`nvidia.com/gpu.compute.major`/`.minor`) and the
  platform's `kubernetes.io/arch` are required; `nvidia.com/gpu.product`
  values made from the target's GPU names are only preferred (GFD's product
  strings carry memory sizes and suffixes that vary by board).
- One `nvidia.com/gpu` is requested; the device plugin hands the GPU in.
- No network for the probe: a NetworkPolicy selecting only this Job's pod
  with no ingress and no egress rule (deny all; it needs a CNI that enforces
  NetworkPolicy). Image pulls are the kubelet's and are not affected.
- The probe (image side + pyelftools, as qualification/container.py stages
  it) comes from an initContainer: a bundle image built FROM the target's own
  base digest (bake target `probe-<target>`), so the node pulls only the
  probe's small layer, copied into an emptyDir the probe container reads.
  Not a ConfigMap: the bundle is ~0.9 MB of sources against a ConfigMap's
  1 MiB limit (one more probe module and it no longer fits), and a ConfigMap
  is flat (keys hold no '/'), so its ~100-file tree needs an item per file.
- Evidence out: the in-toto Statement on the pod's log between two marker
  lines (after the probe exited, so no progress line interleaves), and a
  one-line verdict as the container's termination message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from qualify.config.imageref import parse_pinned
from qualify.config.targets import Target
from qualify.core.errors import ConfigError
from qualify.imagebuild.image import image_repository
from qualify.scaleout import yamlout
from qualify.scaleout.bake import PROBE_IMAGE, PROBE_ROOT, probe_tag

LABEL = "dev.blackwell-qualify"
BEGIN = "-----BEGIN BLACKWELL-QUALIFY EVIDENCE-----"
END = "-----END BLACKWELL-QUALIFY EVIDENCE-----"
SIG_BEGIN = "-----BEGIN BLACKWELL-QUALIFY SIGNATURE-----"  # right after an evidence block: its .sig
SIG_END = "-----END BLACKWELL-QUALIFY SIGNATURE-----"
SIGNING_MOUNT = "/signing"  # the node's evidence key, from the Secret SIGNING_SECRET (optional)
SIGNING_SECRET = "qualify-evidence-key"  # kubectl create secret generic qualify-evidence-key --from-file=key.pem
PROBE_MOUNT = "/probe"
EVIDENCE_MOUNT = "/evidence"
ARCH_LABEL = "kubernetes.io/arch"
DEADLINE_S = 1800  # the probe's GPU checks take minutes; a hung pod must not hold a GPU for ever

# The termination message: the verdict in one line (Kubernetes keeps at most 4 KiB of it).
_SUMMARY = ('import json, sys; p = json.load(open(sys.argv[1]))["predicate"]; '
            'print(json.dumps({"verdict": p["verdict"], "support_level": p["support_level"]}))')
# The probe container's command. Paths come from the environment so a test can run
# the same script on a host (tests/test_scaleout.py does).
POD_SCRIPT = f"""\
set -u
out="$EVIDENCE_DIR/statement.json"
python3 -m qualify.probe --target-json "$QUALIFY_TARGET_JSON" --only gpu --subject "$QUALIFY_SUBJECT" --out "$out"
rc=$?
if [ -s "$out" ]; then
  echo "{BEGIN}"
  cat "$out"
  echo "{END}"
  # Signed where it was made, with the key the Secret mounts (probe/sign.py); unsigned when there is none.
  if [ -r "$SIGNING_KEY" ] && python3 -m qualify.probe.sign --key "$SIGNING_KEY" "$out"; then
    echo "{SIG_BEGIN}"
    cat "$out.sig"; echo
    echo "{SIG_END}"
  fi
  python3 -c '{_SUMMARY}' "$out" > "$TERMINATION_LOG" || true
fi
exit "$rc"
"""


@dataclass(frozen=True)
class GpuJob:
    """What one Job is about; everything else in the manifests follows from it."""

    target: Target
    image: str  # repository@sha256:... of the published image
    probe_image: str
    probe_sha256: str
    profile: Optional[str] = None
    namespace: Optional[str] = None

    @property
    def name(self) -> str:
        return f"qualify-gpu-{self.target.name}"


def job_for(target: Target, image: str, probe_sha256: str, probe_image: Optional[str] = None,
            profile: Optional[str] = None, namespace: Optional[str] = None) -> GpuJob:
    if target.is_cpu:
        raise ConfigError(f"target {target.name}: cpu target: no GPU checks apply, so there is no GPU Job to run",
                          hint="a cpu image is qualified by `nox -s qualify-cpu`; deploy it with ./start.sh")
    ref = parse_pinned(image, "--image", ConfigError,
                       hint="give the published image as repository@sha256:<digest>: a Job must run what was released")
    if probe_image is None:
        suffix = "/" + image_repository(target)
        registry = ref.name[: -len(suffix)] if ref.name.endswith(suffix) else ref.name.rsplit("/", 1)[0]
        probe_image = f"{registry}/{PROBE_IMAGE}:{probe_tag(probe_sha256)}-{target.name}"
    return GpuJob(target, f"{ref.name}@{ref.digest}", probe_image, probe_sha256, profile, namespace)


def _product_label(gpu: str) -> str:
    """GFD writes the product name with spaces as dashes."""
    return gpu.replace(" ", "-")


def _metadata(job: GpuJob, name: str) -> Dict[str, Any]:
    meta: Dict[str, Any] = {"name": name}
    if job.namespace:
        meta["namespace"] = job.namespace
    meta["labels"] = _labels(job)
    return meta


def _labels(job: GpuJob) -> Dict[str, str]:
    return {"app.kubernetes.io/name": "blackwell-qualify", "app.kubernetes.io/component": "gpu-probe",
            f"{LABEL}/target": job.target.name, f"{LABEL}/job": job.name}


_LOCKED_DOWN = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _pod_spec(job: GpuJob) -> Dict[str, Any]:
    from qualify.qualification.container import probe_target

    t = job.target
    target_json = probe_target(t, job.profile).to_json()
    return {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "nodeSelector": {
            "nvidia.com/gpu.compute.major": str(t.capability.major),
            "nvidia.com/gpu.compute.minor": str(t.capability.minor),
            ARCH_LABEL: t.arch_tag,
        },
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 50,
            "preference": {"matchExpressions": [{
                "key": "nvidia.com/gpu.product", "operator": "In",
                "values": [_product_label(g) for g in t.gpus]}]},
        }]}},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "initContainers": [{
            "name": "stage-probe",
            "image": job.probe_image,
            "command": ["cp", "-R", f"{PROBE_ROOT}/.", f"{PROBE_MOUNT}/"],
            "volumeMounts": [{"name": "probe", "mountPath": PROBE_MOUNT}],
            "securityContext": {**_LOCKED_DOWN, "readOnlyRootFilesystem": True},
            "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}},
        }],
        "containers": [{
            "name": "probe",
            "image": job.image,
            "command": ["/bin/sh", "-c", POD_SCRIPT],
            "env": [
                {"name": "PYTHONPATH", "value": PROBE_MOUNT},
                {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
                # The decoders the bundle carries for the image's interpreter (probe/staged.py).
                {"name": "QUALIFY_STAGED", "value": f"{PROBE_MOUNT}/staged"},
                {"name": "QUALIFY_TARGET_JSON", "value": target_json},
                {"name": "QUALIFY_SUBJECT", "value": job.image},
                {"name": "EVIDENCE_DIR", "value": EVIDENCE_MOUNT},
                {"name": "TERMINATION_LOG", "value": "/dev/termination-log"},
                {"name": "SIGNING_KEY", "value": f"{SIGNING_MOUNT}/key.pem"},
            ],
            "resources": {"limits": {"nvidia.com/gpu": 1}},
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File",
            "volumeMounts": [
                {"name": "probe", "mountPath": PROBE_MOUNT, "readOnly": True},
                {"name": "evidence", "mountPath": EVIDENCE_MOUNT},
                {"name": "signing", "mountPath": SIGNING_MOUNT, "readOnly": True},
            ],
            "securityContext": _LOCKED_DOWN,
        }],
        "volumes": [{"name": "probe", "emptyDir": {}}, {"name": "evidence", "emptyDir": {}},
                    # optional: without the Secret the pod runs and its evidence is unsigned
                    {"name": "signing", "secret": {"secretName": SIGNING_SECRET, "optional": True,
                                                   "defaultMode": 0o400}}],
    }


def manifests(job: GpuJob) -> List[Dict[str, Any]]:
    """The NetworkPolicy first (it must exist before the pod starts), then the Job."""
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(job, f"{job.name}-no-network"),
        # No rules under either type: all ingress and all egress of the pod are denied.
        "spec": {"podSelector": {"matchLabels": {f"{LABEL}/job": job.name}}, "policyTypes": ["Ingress", "Egress"]},
    }
    meta = _metadata(job, job.name)
    meta["annotations"] = {f"{LABEL}/image": job.image, f"{LABEL}/probe-sha256": job.probe_sha256}
    spec = {
        "backoffLimit": 0,  # a failing check is evidence, not a flake to retry
        "activeDeadlineSeconds": DEADLINE_S,
        "ttlSecondsAfterFinished": 7 * 86400,
        "template": {"metadata": {"labels": _labels(job)}, "spec": _pod_spec(job)},
    }
    return [policy, {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec}]


def dumps(job: GpuJob) -> str:
    header = (f"Generated by `python -m qualify k8s {job.target.name}` from images/targets.toml.\n"
              f"kubectl apply -f this; the evidence: kubectl logs job/{job.name} > {job.target.name}.log")
    return yamlout.dumps_all(manifests(job), header)


def evidence_blocks(text: str, where: str) -> List[Tuple[bytes, Optional[bytes]]]:
    """Every Statement between the markers of a pod log, with the signature block that follows it, if any
    (what `qualify merge` reads from *.log). The Statement's bytes are the file the probe wrote and signed."""
    lines, blocks, start, sig_start = text.splitlines(), [], None, None
    for i, line in enumerate(lines):
        if line == BEGIN:
            start = i
        elif line == END and start is not None:
            blocks.append([("\n".join(lines[start + 1:i]) + "\n").encode(), None])
            start = None
        elif line == SIG_BEGIN and blocks and start is None:
            sig_start = i
        elif line == SIG_END and sig_start is not None:
            blocks[-1][1] = "".join(lines[sig_start + 1:i]).strip().encode()
            sig_start = None
    if not blocks:
        raise ConfigError(f"{where}: no evidence between {BEGIN!r} and {END!r}",
                          hint="the probe did not finish; the log's last lines say why")
    return [(data, sig) for data, sig in blocks]
