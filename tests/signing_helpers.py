"""Helpers shared by the sign, verify and release tests (not a test module)."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Optional

from cryptography.hazmat.primitives import serialization

from qualify.core import manifest as mf
from qualify.probe import cosignkey
from qualify.signing import keys as cosign_keys

REPO = Path(__file__).resolve().parent.parent
PASSWORD = "correct horse battery staple 7Q!"
DIGEST_A = "sha256:" + "a1" * 32
DIGEST_B = "sha256:" + "b2" * 32
DIGEST_C = "sha256:" + "c3" * 32
REGISTRY = "127.0.0.1:5000"


def check(check_id: str, status: str = "pass", required: bool = True) -> dict:
    return {"id": check_id, "title": check_id.replace("-", " "), "status": status, "required": required,
            "reason": "" if status == "pass" else f"{check_id} {status}", "evidence": {"probe": check_id}}


def predicate(target: str, digest: str, statuses: Optional[Dict[str, str]] = None, level: str = "experimental",
              reference: Optional[str] = None, revision: str = "0" * 40, profile: str = "vllm",
              runtime: Optional[dict] = None, capability: str = "12.0") -> dict:
    """A realistic qualification predicate: target, image, base, checks, verdict, level, and the runtime
    section as the probe writes it for our images (`runtime={}` leaves it out: an older toolkit's manifest)."""
    statuses = statuses or {"fatbin-arch": "pass", "triton-compile": "pass", "allocator": "pass"}
    checks = [check(cid, st) for cid, st in statuses.items()]
    verdict = mf.verdict(checks)
    return {
        "schema_version": mf.SCHEMA_VERSION,
        "target": {"name": target, "capability": capability, "platform": "linux/amd64", "profile": profile},
        "image": {"reference": reference or f"{REGISTRY}/qualify/{target}@{digest}", "digest": digest},
        "base": {"image": "nvidia/cuda:13.0.1-devel-ubuntu24.04@sha256:" + "7d" * 32},
        "toolkit": {"version": "0.1.0", "source_revision": revision},
        "checks": checks,
        "verdict": verdict,
        "support_level": level,
        **({"runtime": RUNTIME if runtime is None else runtime} if runtime != {} else {}),
    }


# predicate.runtime as the probe wrote it in the sm120 smoke image (qualify/probe/runtime_env.py).
RUNTIME = {"user": {"uid": 1000, "gid": 1000, "name": "vllm", "home": "/home/vllm", "in_container": True},
           "cuda": {"version": "13.0", "from": "the toolkit's ptxas"},
           "libcuda": {"compat": [], "first": None,
                       "loader_path": ["/usr/local/lib", "/usr/local/lib/x86_64-linux-gnu"]}}


def runtime_with(cuda: str = "13.0", compat: Optional[str] = None) -> dict:
    """RUNTIME with another CUDA, or with CUDA's forward-compatibility libcuda `compat` first on the loader path
    (what an image that puts /usr/local/cuda/compat on LD_LIBRARY_PATH records)."""
    out = {**RUNTIME, "cuda": {"version": cuda, "from": "torch.version.cuda"}}
    if compat:
        path = f"/usr/local/cuda-13.0/compat/libcuda.so.{compat}"
        out["libcuda"] = {"compat": [{"path": path, "version": compat}],
                          "first": {"path": "/usr/local/cuda/compat/libcuda.so.1", "resolves_to": path,
                                    "named_by": "LD_LIBRARY_PATH", "compat": True, "stub": False, "version": compat},
                          "loader_path": ["/usr/local/cuda/compat"]}
    return out


def statement(target: str, digest: str, **kw) -> dict:
    return mf.statement(f"{REGISTRY}/qualify/{target}", digest, predicate(target, digest, **kw))


def write_manifest(path: Path, target: str, digest: str, **kw) -> Path:
    return mf.write(path, statement(target, digest, **kw))


def make_key_pair(folder: Path, prefix: str = "cosign", password: str = PASSWORD) -> tuple:
    """(private key file, public key file) made by our cosign-compatible writer."""
    pair = cosign_keys.generate_key_pair(password)
    key, pub = folder / f"{prefix}.key", folder / f"{prefix}.pub"
    key.write_bytes(pair.private_pem)
    pub.write_bytes(pair.public_pem)
    return key, pub


def secrets_of(key_file: Path, password: str = PASSWORD) -> List[str]:
    """Strings that must never appear in output: the password and the private key in every encoding."""
    key = cosign_keys.load_private_key(key_file.read_bytes(), password)
    der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    scalar = key.private_numbers().private_value.to_bytes(32, "big")
    _, encrypted_body = cosignkey.pem_decode(key_file.read_bytes(), "key")
    return [password, base64.b64encode(der).decode()[:40], base64.b64encode(scalar).decode()[:40],
            scalar.hex(), base64.b64encode(encrypted_body).decode()[:40]]


def assert_no_secrets(texts: Iterable[str], secrets: List[str]) -> None:
    for text in texts:
        for secret in secrets:
            assert secret not in text, f"a secret leaked: {secret[:6]}... found in output"


def tree_texts(root: Path) -> List[str]:
    """Every file under root (the .git folder included), decoded leniently."""
    return [p.read_bytes().decode("utf-8", errors="replace") for p in root.rglob("*") if p.is_file()]


def init_git_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for args in (["init", "-q", "-b", "main"], ["config", "user.name", "Release Test"],
                 ["config", "user.email", "release@example.invalid"], ["config", "commit.gpgsign", "false"],
                 ["config", "tag.gpgsign", "false"]):
        subprocess.run(["git", *args], cwd=path, check=True)
    (path / "README.md").write_text("test repository\n")
    (path / ".gitignore").write_text("build/\n")
    subprocess.run(["git", "add", "-A"], cwd=path, check=True)
    subprocess.run(["git", "commit", "-q", "-m", "initial"], cwd=path, check=True)
    return path


def write_script(path: Path, body: str) -> Path:
    path.write_text(body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


# A TEST DOUBLE for the cosign binary, which cannot be installed on this
# platform (not in Debian 12, GitHub unreachable). It records its argv and
# whether COSIGN_PASSWORD was in its environment, prints a version string in
# the real format, and writes the outputs the real sign-blob writes for that
# version (read in sigstore/cosign cmd/cosign/cli/sign/sign_blob.go at v2.6.1
# and v3.1.2): v3 only the bundle; v2 the --output-signature file, plus a
# Sigstore bundle with --new-bundle-format. It signs with our own key reader,
# so it proves our argument lists and file handling, NOT cosign compatibility;
# the tests marked `real_cosign` do that where cosign exists.
COSIGN_DOUBLE = r'''#!{python}
import json, os, sys
sys.path.insert(0, {repo!r})
log = os.environ["COSIGN_DOUBLE_LOG"]
with open(log, "a") as fh:
    fh.write(json.dumps({{"argv": sys.argv[1:], "password_in_env": "COSIGN_PASSWORD" in os.environ,
                          "token_in_env": "SIGSTORE_ID_TOKEN" in os.environ}}) + "\n")
args = sys.argv[1:]
if args[:1] == ["version"]:
    print("  ______   ______        _______. __    _______ .__   __.")
    print("cosign: A tool for Container Signing, Verification and Storage in an OCI registry.")
    print("")
    print("GitVersion:    " + os.environ["COSIGN_DOUBLE_VERSION"])
    print("GitCommit:     0000000000000000000000000000000000000000")
    print("GitTreeState:  clean")
    sys.exit(0)
if os.environ.get("COSIGN_DOUBLE_FAIL"):
    print("Error: " + os.environ["COSIGN_DOUBLE_FAIL"], file=sys.stderr)
    sys.exit(1)
if args[:1] == ["verify-blob"]:
    print("Verified OK", file=sys.stderr)
    sys.exit(0)
if args[:1] == ["sign-blob"]:
    from qualify.signing import keys as cosign_keys
    from qualify.signing import formats
    def opt(name):
        return args[args.index(name) + 1] if name in args else None
    blob = open(args[-1], "rb").read()
    if opt("--key"):
        key = cosign_keys.load_private_key(open(opt("--key"), "rb").read(), os.environ.get("COSIGN_PASSWORD", ""))
    else:
        from cryptography.hazmat.primitives.asymmetric import ec
        key = ec.generate_private_key(ec.SECP256R1())
    sig = formats.sign_bytes(key, blob)
    major = int(os.environ["COSIGN_DOUBLE_VERSION"].lstrip("v").split(".")[0])
    new_bundle = major >= 3 or "--new-bundle-format" in args
    if opt("--output-signature") and major < 3:
        open(opt("--output-signature"), "wb").write(formats.encode_signature(sig))
    if opt("--bundle"):
        doc = formats.make_bundle(blob, sig, key.public_key()) if new_bundle else {{"base64Signature": "x"}}
        open(opt("--bundle"), "w").write(json.dumps(doc))
    sys.exit(0)
print("unknown command", args, file=sys.stderr)
sys.exit(2)
'''


def install_cosign_double(bin_dir: Path) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    return write_script(bin_dir / "cosign", COSIGN_DOUBLE.format(python=sys.executable, repo=str(REPO)))


def read_log(path: Path) -> List[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def push_real_image(docker: str, base: str, registry: str, name: str, workdir: Path) -> tuple:
    """A real image (base + a label), pushed to the loopback registry: (repository, digest)."""
    ctx = workdir / name
    ctx.mkdir(parents=True, exist_ok=True)
    (ctx / "Dockerfile").write_text(f"FROM {base}\nLABEL qualify-test={name}\n")
    repository = f"{registry}/qualify-test/{name}"
    env = {"PATH": os.environ.get("PATH", ""), "DOCKER_BUILDKIT": "0"}
    subprocess.run([docker, "build", "-q", "-t", f"{repository}:test", str(ctx)], check=True, capture_output=True, env=env)
    out = subprocess.run([docker, "push", f"{repository}:test"], check=True, capture_output=True, text=True).stdout
    digest = next(line.split("digest: ", 1)[1].split()[0] for line in out.splitlines() if "digest: sha256:" in line)
    return repository, digest


def path_with(bin_dir: Path) -> str:
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"


def run_qualify(args: List[str], cwd: Path, env: Optional[Dict[str, str]] = None,
                unset: Iterable[str] = ()) -> subprocess.CompletedProcess:
    """`python -m qualify ARGS` in a subprocess, stdin closed, output captured."""
    full_env = {k: v for k, v in os.environ.items() if k not in set(unset)}
    full_env.update({"PYTHONPATH": str(REPO), **(env or {})})
    return subprocess.run([sys.executable, "-m", "qualify", *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=120)


def make_release(root: Path, tag: str, statements: Iterable[dict], key_file: Path, password: str = PASSWORD,
                 **options) -> Path:
    """A release folder exactly as `qualify release` writes it: `root` becomes (or stays) a git repository,
    the statements are qualified from its HEAD into build/manifests/, and the real release steps sign,
    write, commit and tag them (only the registry's digest check is injected: every digest is served).
    Returns root/manifests/<tag>."""
    from qualify.core.fsutil import canonical_json
    from qualify.release import release
    from qualify.signing import signer

    if not (root / ".git").exists():
        init_git_repo(root)
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, check=True, capture_output=True,
                         text=True).stdout.strip()
    out = root / "build" / "manifests"
    if out.exists():
        for old in out.glob("*.json"):
            old.unlink()
    out.mkdir(parents=True, exist_ok=True)
    promoted = []
    for stmt in statements:
        stmt = json.loads(json.dumps(stmt))
        stmt["predicate"].setdefault("toolkit", {})["source_revision"] = rev
        if stmt["predicate"].get("support_level") in ("baseline", "optimized"):
            # A release ships at most experimental; baseline comes only from promote (seven signed passes).
            stmt["predicate"]["support_level"] = "experimental"
            promoted.append(stmt["predicate"]["target"]["name"])
        (out / f"{stmt['predicate']['target']['name']}.json").write_bytes(canonical_json(stmt))
    opts = release.ReleaseOptions(**{"tag": tag, "repo": root, "source": out, "out_root": root / "manifests",
                                     "upload": False, **options})
    release.run_release(opts, lambda: signer.key_signer("builtin", key_file, password.encode()),
                        lambda reference: reference.partition("@")[2], progress=lambda m: None)
    if promoted and not opts.dry_run:
        promote_to_baseline(root / "manifests" / tag, key_file, password, promoted)
    return root / "manifests" / tag


def promote_to_baseline(folder: Path, key_file: Path, password: str, targets: List[str]) -> None:
    """What a release engineer does to reach baseline: a GPU host enrolled with its own key (`hosts add`, in a
    hosts file beside the repository so the work tree stays clean), seven passing runs it signed, `promote`.
    The runs are made as start.sh makes them (release/evidence.py); the GPU is the labelled stand-in's."""
    import datetime as dt

    from qualify.probe.gpu import REQUIRED_GPU_CHECKS
    from qualify.release import evidence as ev
    from qualify.release import promote, servecount, serving
    from qualify.signing import formats as fmt
    from qualify.signing import signer as sgn
    from qualify.trust import hosts
    from qualify.trust import records as rec
    from qualify.trust.folder import read_release
    from qualify.trust.verify import KeyAnchor, TrustedKey

    sign = sgn.key_signer("builtin", key_file, password.encode())
    key = TrustedKey.of_signer(sign, str(key_file))
    side = folder.parent.parent.parent / f".{folder.parent.parent.name}-gpu-host"
    side.mkdir(exist_ok=True)
    host_key, host_pub = side / "gpu-host.key", side / "gpu-host.pub"
    if not host_key.exists():
        host_key, host_pub = make_key_pair(side, prefix="gpu-host")
    hosts_file = side / rec.HOSTS_FILE
    host = TrustedKey.read(host_pub)
    hosts.change(hosts_file, sign, key, add=rec.EnrolledHost("stand-in-gpu-host", key_pem=host.pem.decode(),
                                                             fingerprint=host.fingerprint))
    release = read_release(folder, KeyAnchor(trusted=key))
    t0 = dt.datetime.strptime(release.index.time, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    runs = side / f"evidence-{folder.name}"
    runs.mkdir(exist_ok=True)
    host_signer = sgn.key_signer("builtin", host_key, PASSWORD.encode())  # once: its scrypt costs 0.75 s
    paths = []
    for target in targets:
        vt = release.target(target)
        cap = vt.entry.capability
        checks = tuple({"id": c, "title": c, "status": "pass", "required": True, "reason": f"{c} pass", "evidence": {}}
                       for c in REQUIRED_GPU_CHECKS)
        for n in range(1, release.rule(target).consecutive_passes + 1):
            out = ev.outcome_of(checks, cap, cap)
            record = ev.Evidence(folder.name, target, cap, vt.manifest.reference, vt.manifest.digest,
                                 vt.manifest.probe_sha256 or "sha256:" + "c" * 64,
                                 ev.Gpu("stand-in GPU", cap, ev.hashed(f"GPU-{target}"), "580.1"),
                                 ev.hashed("stand-in host"), rec.format_time(t0 + dt.timedelta(seconds=n)),
                                 out.outcome, out.reason, checks, {}, f"{n:032x}")
            path = ev.write(runs / f"{target}-{n}.json", record)
            ev.sign(path, host_signer)
            paths.append(path)
            if servecount.rule_for(vt.manifest, release.rule(target)).counts_serving:  # a vllm image: its matrix too
                served = serve_record(record, vt.manifest)
                path = serving.write(runs / f"{target}-{n}.serve-check.json", served)
                sgn.write_signature(host_signer, path, fmt.signature_path(path), fmt.bundle_path(path))
                paths.append(path)
    promote.promote(folder, folder.name, paths, sign, key, hosts_file,
                    now=t0 + dt.timedelta(days=1))


def serve_record(gpu, m):
    """The serve-check record of the deployment that gave GPU evidence `gpu` (every check passing), as
    `qualify serve-check` writes it after start.sh: the GPU run's identity copied in."""
    from test_serve_matrix import record

    from qualify.release import serving

    return record(release=gpu.release, target=gpu.target, capability=gpu.capability, image=m.reference,
                  subject_name=m.reference.partition("@")[0], subject_digest=m.digest, time=gpu.time,
                  run_id=gpu.run_id, host_id_sha256=gpu.host_id_sha256, probe_sources_digest=gpu.probe_sources_digest,
                  gpu_evidence=serving.GpuLink(gpu.run_id, gpu.time, gpu.host_id_sha256, gpu.outcome.value))
