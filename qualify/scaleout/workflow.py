"""The release workflow for GitHub Actions, generated from the targets file.

On a version tag: per target (a matrix, each on a runner of the target's own
architecture: arm64 targets build natively, never under qemu) bake builds and
pushes the image, the CPU qualification runs on it, the manifest is signed
keyless with this workflow's own OIDC identity, the image gets the version
tag by digest, and the signed files are attached to the GitHub release. A GPU
job per target runs on a self-hosted runner labelled with the target's
capability and hands its evidence to `qualify merge` and `qualify promote`.
Commands are this toolkit's, so the workflow holds no build logic of its own.
"""

from __future__ import annotations

from typing import Any, Dict, List

from qualify.config.targets import REPO_ROOT, Target, TargetsFile
from qualify.core.errors import ConfigError
from qualify.scaleout import yamlout

WORKFLOW_FILE = REPO_ROOT / ".github" / "workflows" / "release.yml"
ACTIONLINT_CONFIG = REPO_ROOT / ".github" / "actionlint.yaml"
PROFILE = "vllm"  # what a release ships
# GitHub-hosted runners by platform: arm64 has native runners (no emulation).
HOSTED_RUNNERS = {"linux/amd64": "ubuntu-24.04", "linux/arm64": "ubuntu-24.04-arm"}
# Self-hosted runner labels for a platform (GitHub's own architecture labels).
SELF_HOSTED_ARCH = {"linux/amd64": "X64", "linux/arm64": "ARM64"}
ACTIONS = {  # major versions: the actions' own moving tags
    "checkout": "actions/checkout@v5",
    "python": "actions/setup-python@v6",
    "upload": "actions/upload-artifact@v6",
    "download": "actions/download-artifact@v7",
    "buildx": "docker/setup-buildx-action@v4",
    "login": "docker/login-action@v4",
    "cosign": "sigstore/cosign-installer@v4",
}
PYTHON = "3.11"
HEADER = ("Generated from images/targets.toml by `python -m qualify workflow` (nox -s workflow).\n"
          "Do not edit: tests/test_scaleout.py compares this file with a fresh generation.")


def _gpu_targets(tf: TargetsFile) -> List[Target]:
    """The targets a GPU runner proves: a cpu target has no GPU checks (its build job is the others')."""
    return [t for t in tf.targets.values() if not t.is_cpu]


def gpu_label(target: Target) -> str:
    """The label a self-hosted GPU runner carries for the capability it can prove."""
    return f"cuda-capability-{target.capability}"


def _runner(target: Target) -> str:
    try:
        return HOSTED_RUNNERS[target.platform]
    except KeyError:
        raise ConfigError(f"target {target.name!r}: no GitHub runner for platform {target.platform!r}",
                          hint=f"add it to HOSTED_RUNNERS in {__name__}") from None


def _checkout_and_install() -> List[Dict[str, Any]]:
    return [
        {"uses": ACTIONS["checkout"]},
        {"uses": ACTIONS["python"], "with": {"python-version": PYTHON}},
        {"name": "install the toolkit", "run": "python -m pip install -e ."},
    ]


def _login() -> Dict[str, Any]:
    return {"uses": ACTIONS["login"], "with": {"registry": "ghcr.io", "username": "${{ github.actor }}",
                                               "password": "${{ secrets.GITHUB_TOKEN }}"}}


_REGISTRY_ENV = (
    '# ghcr.io names are lower case\n'
    'echo "QUALIFY_REGISTRY=ghcr.io/${GITHUB_REPOSITORY_OWNER,,}" >> "$GITHUB_ENV"\n'
)
# The toolkit's state (build contexts, wheelhouse, the staged probe) defaults to
# /var/lib/blackwell-qualify, which a runner's user cannot write.
_STATE_ENV = {"name": "toolkit state in the runner's temp",
              "run": 'echo "QUALIFY_STATE_DIR=$RUNNER_TEMP/qualify" >> "$GITHUB_ENV"\n'}
# A vLLM image is ~12 GB and its wheelhouse several more: more than a hosted runner has free.
_MAKE_ROOM = {"name": "make room on the runner's disk",
              "run": "sudo rm -rf /usr/share/dotnet /usr/local/lib/android /opt/ghc /opt/hostedtoolcache/CodeQL\ndf -h /\n"}


def _build_job(tf: TargetsFile) -> Dict[str, Any]:
    include = [{"target": t.name, "platform": t.platform, "runner": _runner(t)} for t in tf.targets.values()]
    files = "build/manifests/${{ matrix.target }}.json"
    return {
        "name": "build, qualify, sign, publish ${{ matrix.target }}",
        "runs-on": "${{ matrix.runner }}",
        "permissions": {"contents": "read", "packages": "write", "id-token": "write"},
        "strategy": {"fail-fast": False, "matrix": {"include": include}},
        "env": {"TARGET": "${{ matrix.target }}", "PROFILE": PROFILE},
        "steps": [
            _MAKE_ROOM,
            *_checkout_and_install(),
            _STATE_ENV,
            {"uses": ACTIONS["buildx"]},
            _login(),
            {"name": "the bake file is the targets file's", "run": "python -m qualify bake --check\n"},
            {"name": "bake variables", "run": _REGISTRY_ENV + (
                'QUALIFY_REGISTRY="ghcr.io/${GITHUB_REPOSITORY_OWNER,,}" python -m qualify bake --env >> "$GITHUB_ENV"\n')},
            {"name": "stage the build context and the probe bundle",
             "run": 'python -m qualify bake --stage "$TARGET" --profile "$PROFILE"\n'},
            {"name": "build and push by digest (native runner, provenance and SBOM attached)",
             "run": 'docker buildx bake -f docker-bake.json --push --metadata-file bake-meta.json \\\n'
                    '  "$TARGET-$PROFILE" "probe-$TARGET"\n'},
            {"name": "CPU qualification",
             "run": 'ref="$(python -m qualify bake --record "$TARGET" --profile "$PROFILE" --metadata bake-meta.json)"\n'
                    'docker pull "$ref"\n'
                    'echo "$ref" > "build/manifests/$TARGET.image"\n'
                    'python -m qualify qualify "$TARGET" --profile "$PROFILE" --base pinned\n'},
            {"uses": ACTIONS["cosign"]},
            _keyless_sign("sign keyless with this workflow's OIDC identity", files),
            {"name": "publish: the version tag on the qualified digest",
             "run": 'ref="$(cat "build/manifests/$TARGET.image")"\n'
                    'docker buildx imagetools create -t "${ref%@*}:$GITHUB_REF_NAME-$PROFILE" "$ref"\n'},
            {"uses": ACTIONS["upload"], "with": {
                "name": "release-${{ matrix.target }}",
                "path": "build/manifests/${{ matrix.target }}.*\n",
                "if-no-files-found": "error"}},
        ],
    }


_OIDC = ('curl -sSf -H "Authorization: bearer $ACTIONS_ID_TOKEN_REQUEST_TOKEN" \\\n'
         '  "$ACTIONS_ID_TOKEN_REQUEST_URL&audience=sigstore" \\\n'
         '  | python -c \'import json, sys; print(json.load(sys.stdin)["value"])\' > "$RUNNER_TEMP/oidc-token"\n')


def _keyless_sign(name: str, files: str) -> Dict[str, Any]:
    """Sign FILES keyless with the workflow's OIDC identity (the identity hosts.json enrolls for the GPU job)."""
    return {"name": name,
            "run": _OIDC + f'python -m qualify sign "{files}" --keyless --identity-token "$RUNNER_TEMP/oidc-token"\n'
                   'rm -f "$RUNNER_TEMP/oidc-token"\n'}


def _gpu_job(target: Target) -> Dict[str, Any]:
    return {
        "name": f"GPU evidence {target.name} ({', '.join(target.gpus)})",
        "needs": "build",
        "runs-on": ["self-hosted", "linux", SELF_HOSTED_ARCH[target.platform], gpu_label(target)],
        # id-token: the evidence is signed keyless, with this job's identity (enrolled in manifests/hosts.json).
        "permissions": {"contents": "read", "packages": "read", "id-token": "write"},
        "env": {"TARGET": target.name, "PROFILE": PROFILE},
        "steps": [
            *_checkout_and_install(),
            _STATE_ENV,
            _login(),
            {"uses": ACTIONS["download"], "with": {"name": f"release-{target.name}", "path": "release"}},
            {"name": "the probe's GPU checks in the released image, on this runner's GPU",
             "run": 'ref="$(cat "release/$TARGET.image")"\n'
                    'docker pull "$ref"\n'
                    'mkdir -p evidence\n'
                    'python -m qualify gpu-evidence "$TARGET" --profile "$PROFILE" --image "$ref" \\\n'
                    '  --out "evidence/$TARGET.$RUNNER_NAME.json"\n'},
            {"uses": ACTIONS["cosign"]},
            _keyless_sign("sign the evidence keyless: promote counts it when this workflow's identity is enrolled",
                          "evidence/$TARGET.$RUNNER_NAME.json"),
            {"uses": ACTIONS["upload"], "with": {"name": f"evidence-{target.name}", "path": "evidence/",
                                                 "if-no-files-found": "error"}},
        ],
    }


def _release_job() -> Dict[str, Any]:
    return {
        "name": "attach the signed manifests to the tag",
        "needs": "build",
        "runs-on": "ubuntu-24.04",
        "permissions": {"contents": "write"},
        "env": {"GH_TOKEN": "${{ github.token }}"},
        "steps": [
            {"uses": ACTIONS["download"], "with": {"pattern": "release-*", "path": "release", "merge-multiple": True}},
            {"name": "GitHub release for the tag",
             "run": 'gh release view "$GITHUB_REF_NAME" --repo "$GITHUB_REPOSITORY" >/dev/null 2>&1 \\\n'
                    '  || gh release create "$GITHUB_REF_NAME" --repo "$GITHUB_REPOSITORY" --verify-tag \\\n'
                    '       --title "$GITHUB_REF_NAME" --notes "Signed qualification manifests, one per target."\n'
                    'gh release upload "$GITHUB_REF_NAME" --repo "$GITHUB_REPOSITORY" --clobber release/*\n'},
        ],
    }


def _promote_job(tf: TargetsFile) -> Dict[str, Any]:
    return {
        "name": "merge GPU evidence and promote",
        "needs": ["release", *[f"gpu-{t.name}" for t in _gpu_targets(tf)]],
        "runs-on": "ubuntu-24.04",
        "permissions": {"contents": "write"},
        "env": {"GH_TOKEN": "${{ github.token }}"},
        "steps": [
            *_checkout_and_install(),
            {"uses": ACTIONS["download"], "with": {"pattern": "evidence-*", "path": "evidence-in"}},
            {"name": "merge evidence from every GPU runner (same evidence once; mismatched digests refused)",
             "run": "python -m qualify merge evidence-in --out evidence\n"},
            {"uses": ACTIONS["cosign"]},
            {"name": "promote (the release key from the repository's secrets; the release folder from the tag)",
             "env": {"COSIGN_PASSWORD": "${{ secrets.RELEASE_KEY_PASSWORD }}",
                     "RELEASE_KEY": "${{ secrets.RELEASE_KEY }}"},
             "run": 'umask 077; printf \'%s\\n\' "$RELEASE_KEY" > "$RUNNER_TEMP/cosign.key"\n'
                    'python -m qualify promote "$GITHUB_REF_NAME" --key "$RUNNER_TEMP/cosign.key" \\\n'
                    '  --hosts manifests/hosts.json --evidence evidence/*.json\n'
                    'rm -f "$RUNNER_TEMP/cosign.key"\n'
                    'gh release upload "$GITHUB_REF_NAME" --repo "$GITHUB_REPOSITORY" --clobber evidence/*.json \\\n'
                    '  "manifests/$GITHUB_REF_NAME"/*.promotion*.json* "manifests/$GITHUB_REF_NAME"/*.json.sig\n'},
        ],
    }


def generate(tf: TargetsFile) -> Dict[str, Any]:
    jobs: Dict[str, Any] = {"build": _build_job(tf)}
    for t in _gpu_targets(tf):
        jobs[f"gpu-{t.name}"] = _gpu_job(t)
    jobs["release"] = _release_job()
    jobs["promote"] = _promote_job(tf)
    return {
        "name": "release",
        "on": {"push": {"tags": ["v[0-9]+.[0-9]+.[0-9]+*"]}},
        "permissions": {"contents": "read"},
        "concurrency": {"group": "release-${{ github.ref }}", "cancel-in-progress": False},
        "jobs": jobs,
    }


def actionlint_config(tf: TargetsFile) -> Dict[str, Any]:
    """actionlint must know the self-hosted labels, or it reports them as unknown."""
    labels = sorted({gpu_label(t) for t in _gpu_targets(tf)})
    return {"self-hosted-runner": {"labels": labels}}


def files(tf: TargetsFile) -> Dict[Any, str]:
    """Every file this module writes, with its text."""
    return {
        WORKFLOW_FILE: yamlout.dumps(generate(tf), HEADER),
        ACTIONLINT_CONFIG: yamlout.dumps(actionlint_config(tf), HEADER),
    }
