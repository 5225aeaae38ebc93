"""Nox sessions, generated from images/targets.toml. Logic lives in the `qualify` package."""

from __future__ import annotations

import sys
from pathlib import Path

import nox

sys.path.insert(0, str(Path(__file__).parent))
from qualify import toolenv as _toolenv  # noqa: E402
from qualify.config import targets as _targets  # noqa: E402  (stdlib only at import)

nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["tests"]

_TF = _targets.load()


def _module(session: nox.Session, module: str) -> None:
    """Run `python -m MODULE -- POSARGS` in the shared toolkit venv (developer tools, interop checks)."""
    session.run(str(_toolenv.ensure()), "-m", module, *session.posargs, external=True)


def _qualify(session: nox.Session, *args: str) -> None:
    """Run `python -m qualify ARGS -- POSARGS` in the shared toolkit venv."""
    py = _toolenv.ensure()
    session.run(str(py), "-m", "qualify", *args, *session.posargs, external=True)


for _name, _t in _TF.targets.items():

    def _build(session: nox.Session, _n: str = _name) -> None:
        _qualify(session, "build", _n)

    def _qual(session: nox.Session, _n: str = _name) -> None:
        _qualify(session, "qualify", _n)

    def _lock(session: nox.Session, _n: str = _name) -> None:
        _qualify(session, "lock", _n)

    def _repro(session: nox.Session, _n: str = _name) -> None:
        _qualify(session, "repro", _n)

    _desc = f"{_t.description} ({_t.platform}, {_t.capability})"
    _build.__doc__ = f"Build the {_name} image: {_desc}; options: --base pinned|hermetic --profile vllm|smoke"
    _qual.__doc__ = f"Qualify the {_name} image and write its manifest (builds it first if missing)"
    _lock.__doc__ = f"Regenerate the hash-locked requirements for {_name} ({_t.platform})"
    _repro.__doc__ = f"Build {_name} twice from clean state and compare digests"
    nox.session(name=f"build-{_name}", python=False)(_build)
    nox.session(name=f"qualify-{_name}", python=False)(_qual)
    nox.session(name=f"lock-{_name}", python=False)(_lock)
    nox.session(name=f"repro-{_name}", python=False)(_repro)


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite (needs a real Docker engine: scripts/setup-host.sh)."""
    session.install("-q", "-e", ".[test]", "--config-settings", f"editable_mode={_toolenv.EDITABLE_MODE}")
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the package, tests and noxfile; shellcheck over the scripts."""
    session.install("-q", "ruff==0.17.6")
    session.run("ruff", "check", "qualify", "tests", "noxfile.py")
    session.run("shellcheck", "start.sh", *[str(p) for p in Path("scripts").glob("*.sh")], external=True)


@nox.session(python=False)
def pin(session: nox.Session) -> None:
    """Re-resolve base image tags to digests and rewrite images/targets.toml (-- TARGET...)."""
    _qualify(session, "pin")


@nox.session(python=False)
def release(session: nox.Session) -> None:
    """Sign qualified manifests and release them to a tag (-- TAG [--min-level L] [--force])."""
    _qualify(session, "release")


@nox.session(python=False)
def sums(session: nox.Session) -> None:
    """Regenerate SHA256SUMS over the release inputs."""
    _qualify(session, "sums", "write")


@nox.session(python=False)
def clean(session: nox.Session) -> None:
    """Remove what the toolkit made on this host and say how much it freed (-- [--all] [--dry-run])."""
    _qualify(session, "clean")


@nox.session(python=False)
def bake(session: nox.Session) -> None:
    """Write docker-bake.json from images/targets.toml (-- --check, --env, --stage TARGET, ...)."""
    _qualify(session, "bake")


@nox.session(python=False)
def workflow(session: nox.Session) -> None:
    """Write .github/workflows/release.yml (and actionlint's config) from images/targets.toml (-- --check)."""
    _qualify(session, "workflow")


@nox.session(name="k8s-jobs", python=False)
def k8s_jobs(session: nox.Session) -> None:
    """A Kubernetes NetworkPolicy + Job running a published image's GPU checks (-- TARGET --image REPO@sha256:...)."""
    _qualify(session, "k8s")


@nox.session(python=False)
def merge(session: nox.Session) -> None:
    """Gather evidence from many hosts into `qualify promote`'s input (-- PATH... --out DIR)."""
    _qualify(session, "merge")


@nox.session(name="bench-inventory", python=False)
def bench_inventory(session: nox.Session) -> None:
    """Benchmark the census against cuobjdump: torch 2.14.1's CUDA 13 install, then a kernel-package corpus and start-up."""
    _module(session, "qualify.devtools.bench_corpus")


@nox.session(name="bench-build", python=False)
def bench_build(session: nox.Session) -> None:
    """Time builds and pushes: smoke first/no-change, vLLM download/build/export/push, second target, pull."""
    _module(session, "qualify.devtools.bench_build")


@nox.session(name="bench-cpu")
def bench_cpu(session: nox.Session) -> None:
    """The cpu target measured: image size, build time, server start to /health (cold, warm), memory."""
    session.install("-q", "-e", ".[test]", "--config-settings", f"editable_mode={_toolenv.EDITABLE_MODE}")
    session.run("python", "-m", "qualify.devtools.bench_cpu", *session.posargs)


@nox.session(name="tiny-model-remake")
def tiny_model_remake(session: nox.Session) -> None:
    """Train the tiny model again and compare it with the committed files (-- --write replaces them)."""
    session.install("-q", "-e", ".[test]", "--config-settings", f"editable_mode={_toolenv.EDITABLE_MODE}")
    session.run("python", "-m", "qualify.devtools.tiny_model_remake", *session.posargs)


@nox.session(python=False)
def reference(session: nox.Session) -> None:
    """Write docs/reference/ (commands, checks, settings, exit codes, formats) from the code (-- --check)."""
    _module(session, "qualify.devtools.reference")


@nox.session(name="vllm-rules", python=False)
def vllm_rules(session: nox.Session) -> None:
    """Check the provider tables against vLLM's own selectors, inside the built vLLM image."""
    _module(session, "qualify.devtools.vllm_rules")


@nox.session(name="cosign-interop", python=False)
def cosign_interop(session: nox.Session) -> None:
    """Where cosign is installed: it verifies our built-in signatures and its keys load in our signer."""
    _module(session, "qualify.devtools.cosign_interop")


@nox.session(python=False)
def publish(session: nox.Session) -> None:
    """nox -s publish -- TAG [--to REGISTRY/NAMESPACE]: images by digest + attestations to a registry."""
    _qualify(session, "publish")


@nox.session(name="attest-interop", python=False)
def attest_interop(session: nox.Session) -> None:
    """Our DSSE envelopes and bundles checked by sigstore-js (npm) and openssl over the PAE."""
    _module(session, "qualify.devtools.attest_interop")


@nox.session(name="fuzz", python=False)
def fuzz(session: nox.Session) -> None:
    """Bounded mutation campaign over the nvcc-built fixtures: `nox -s fuzz -- [--seconds N]`."""
    _module(session, "qualify.devtools.fuzz")


def _did_you_mean() -> None:
    """A mistyped session name gets the same "did you mean" as the CLI (nox only says it was not found)."""
    import difflib

    from nox import registry

    asked, argv = [], sys.argv[1:]
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg in ("-s", "-e", "--session", "--sessions"):
            for value in argv[i + 1:]:
                if value.startswith("-"):
                    break
                asked.append(value)
        elif arg.startswith(("--session=", "--sessions=")):
            asked += arg.split("=", 1)[1].split(",")
    known = list(registry.get())
    for name in asked:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {close[0]!r}?" if close else "nox -l lists the sessions"
            print(f"nox: no session named {name!r}; {hint}", file=sys.stderr)


_did_you_mean()
