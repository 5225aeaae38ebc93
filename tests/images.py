"""Shared builders for tests that need the real smoke images (built once per session).

Built for real on the hermetic base with the host's Docker engine; CI builds
them from a clean state (debootstrap, CUDA wheels, loopback registry).
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from qualify.config import targets
from qualify.host.engine import Engine
from qualify.host.registry import Registry
from qualify.imagebuild import image

_CACHE = {}
# The suites of several checkouts share this host's engine and registry and run at once: a test image under a
# fixed name was rebuilt and re-pushed by another checkout's suite between this suite's qualify (which pins the
# digest the tag named then) and its `verify --image TAG` (which then saw the other suite's image: exit 9,
# "image digest check failed", not the check the test looks for). Names of test images carry this checkout.
CHECKOUT = hashlib.sha256(str(Path(__file__).resolve().parent.parent).encode()).hexdigest()[:8]


def smoke(target: str) -> image.BuildRecord:
    """The smoke image of `target` on the hermetic base (built on first use)."""
    if target not in _CACHE:
        tf = targets.load()
        # The suite's many builds share their cache (a warm CI run takes minutes, not a quarter hour);
        # the clean-up a user's build does by default has its own test.
        opts = image.BuildOptions(target=target, base="hermetic", profile="smoke", engine="docker", keep_cache=True)
        _CACHE[target] = image.build(tf, opts, Engine("docker"), Registry.from_env())
    return _CACHE[target]


def variant(target: str, name: str, **changes) -> image.BuildRecord:
    """A deliberately changed build of `target` under another name (e.g. another arch list)."""
    key = (target, name)
    if key not in _CACHE:
        tf = targets.load()
        t = dataclasses.replace(tf.get(target), name=name, **changes)
        tf2 = dataclasses.replace(tf, targets={**tf.targets, name: t})
        opts = image.BuildOptions(target=name, base="hermetic", profile="smoke", engine="docker", keep_cache=True)
        _CACHE[key] = image.build(tf2, opts, Engine("docker"), Registry.from_env())
    return _CACHE[key]


def derived(docker: str, base_ref: str, tag: str, dockerfile_body: str, files: dict, tmp_dir, platform: str) -> str:
    """`FROM base_ref` + a few instructions: a broken image for the failure tests. They run as root (our
    images' USER is not), and the image keeps the base's user, as a user's own derived image would."""
    user = subprocess.run([docker, "image", "inspect", "--format", "{{.Config.User}}", base_ref], capture_output=True,
                          text=True, timeout=60).stdout.strip()
    if user:
        dockerfile_body = f"USER 0\n{dockerfile_body}\nUSER {user}"
    ctx = tmp_dir / tag.replace("/", "_").replace(":", "_")
    ctx.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        (ctx / rel).write_bytes(data)
        (ctx / rel).chmod(0o755)
    (ctx / "Dockerfile").write_text(f"FROM {base_ref}\n{dockerfile_body}\n")
    done = subprocess.run([docker, "build", "-q", "--platform", platform, "-t", tag, str(ctx)], capture_output=True,
                          text=True, env={"DOCKER_BUILDKIT": "1", "PATH": "/usr/bin:/bin"}, timeout=900)
    assert done.returncode == 0, f"building {tag} failed:\n{done.stderr[-3000:]}"
    return tag


def run(docker: str, image: str, script: str, platform: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([docker, "run", "--rm", "--network", "none", "--platform", platform, image, "bash", "-c",
                           script], capture_output=True, text=True, timeout=timeout)


# --- images built the way people commonly build them (issue 34) ------------------------------------------

PYPI = "https://pypi.org/simple"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
PYENV_38 = "/root/.pyenv/versions/3.8.18"  # a real CPython 3.8 on this machine kind (pyenv's), for the 3.8 image


def _triton_wheels(target, version: str, dest) -> Path:
    """The triton wheel for the target's platform: 3.8.0 from our own hash-checked smoke wheelhouse (the same
    wheel our build installs), another version straight from PyPI."""
    from qualify.imagebuild import wheelhouse

    tf = targets.load()
    t = tf.get(target)
    python = t.python_for("hermetic", tf.hermetic)
    if version == "3.8.0":
        return wheelhouse.prepare(t.lock_path("smoke", python), t.platform, python)
    dest.mkdir(parents=True, exist_ok=True)
    arch = t.uname_machine
    subprocess.run([sys.executable, "-m", "pip", "download", "--isolated", "--quiet", "--no-deps", "--only-binary=:all:",
                    "--platform", f"manylinux_2_27_{arch}", "--platform", f"manylinux_2_28_{arch}",
                    "--python-version", python, "--index-url", PYPI, "--cert", CA_BUNDLE, "-d", str(dest),
                    f"triton=={version}"], check=True, timeout=900, capture_output=True)
    return dest


def external(target: str, triton_version: str, tmp_dir, registry: str) -> str:
    """`pip install triton==VERSION` into a venv on the hermetic base, and nothing else: no TRITON_*_PATH, no
    TORCH_CUDA_ARCH_LIST, no allocator hook (what a plain Dockerfile does). Pushed to the loopback registry;
    returns its tag `REGISTRY/qualify-test/external-triton-<v>:<target>-<checkout>`."""
    key = ("external", target, triton_version)
    if key not in _CACHE:
        record = smoke(target)  # the hermetic base and the smoke wheelhouse exist after it
        ctx = tmp_dir / f"external-{target}-{triton_version}"
        wheels = _triton_wheels(target, triton_version, ctx / "download")
        ctx.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(ctx / "wheels", ignore_errors=True)
        shutil.copytree(wheels, ctx / "wheels", ignore=shutil.ignore_patterns(".*"))
        (ctx / "Dockerfile").write_text(
            f"FROM {record.base_image}\n"
            # bind-mounted, so the wheel itself is no layer of the image
            "RUN --mount=type=bind,source=wheels,target=/tmp/wheels python3 -m venv /opt/venv \\\n"
            f" && /opt/venv/bin/pip install --no-index --no-cache-dir --disable-pip-version-check "
            f"--find-links /tmp/wheels triton=={triton_version}\n"
            "ENV PATH=/opt/venv/bin:$PATH\n")
        tag = f"{registry}/qualify-test/external-triton-{triton_version.replace('.', '')}:{target}-{CHECKOUT}"
        _build_and_push(ctx, tag, target)
        _CACHE[key] = tag
    return _CACHE[key]


def _build_and_push(ctx, tag: str, target: str) -> None:
    """Build `ctx` for the target's platform with BuildKit (its bind mounts) and push it to the loopback registry."""
    platform = targets.load().get(target).platform
    subprocess.run(["/usr/bin/docker", "build", "-q", "--platform", platform, "-t", tag, str(ctx)], check=True,
                   capture_output=True, env={"DOCKER_BUILDKIT": "1", "PATH": "/usr/bin:/bin"}, timeout=1800)
    subprocess.run(["/usr/bin/docker", "push", tag], check=True, capture_output=True, timeout=900)


def python38_files(ctx) -> dict:
    """A real CPython 3.8 (pyenv's build on this host: bin/python3.8 and its libpython, rpath-linked, plus the
    standard library without its tests) for a `COPY` into an image."""
    import tarfile

    root = Path(PYENV_38)
    tar = ctx / "python38.tar"
    with tarfile.open(tar, "w") as out:
        out.add(root / "bin" / "python3.8", arcname=str(root / "bin" / "python3.8").lstrip("/"))
        out.add(root / "lib" / "libpython3.8.so.1.0", arcname=str(root / "lib" / "libpython3.8.so.1.0").lstrip("/"))
        out.add(root / "lib" / "python3.8", arcname=str(root / "lib" / "python3.8").lstrip("/"),
                filter=lambda m: None if ("/test/" in m.name + "/" or "site-packages/" in m.name
                                          or "__pycache__" in m.name) else m)
    return {"python38.tar": tar.read_bytes()}


# --- an SGLang image (issue 51 item 6) ---------------------------------------------------------------------

# sglang 0.5.23 and what it pins of the kernels the probe judges; the rest of its dependencies (torch,
# flashinfer, ...) are left out to keep the image small, and the probe says what their absence breaks.
SGLANG_PINS = ("sglang==0.5.23", "sglang-kernel==0.4.10", "sgl-deep-gemm==0.2.3.post2", "ninja==1.13.0")
SGLANG_SITE = "/opt/venv/lib/python{python}/site-packages"


def _sglang_wheels(target: str, dest: Path) -> Path:
    tf = targets.load()
    t = tf.get(target)
    arch = t.uname_machine
    dest.mkdir(parents=True, exist_ok=True)
    platforms = [f"manylinux2014_{arch}", f"manylinux_2_28_{arch}", f"manylinux_2_34_{arch}",
                 f"manylinux_2_5_{arch}", f"manylinux1_{arch}"]
    subprocess.run([sys.executable, "-m", "pip", "download", "--isolated", "--quiet", "--no-deps", "--only-binary=:all:",
                    *[a for p in platforms for a in ("--platform", p)], "--python-version",
                    t.python_for("hermetic", tf.hermetic), "--index-url", PYPI, "--cert", CA_BUNDLE, "-d", str(dest),
                    *SGLANG_PINS], check=True, timeout=1800, capture_output=True)
    return dest


def sglang(target: str, tmp_dir, registry: str) -> str:
    """`pip install --no-deps` of sglang, sglang-kernel and sgl-deep-gemm into the plain Triton 3.8.0 image
    (`external`: a venv on the hermetic base): the image someone gets by installing SGLang's own wheels.
    sgl_kernel's flash_ops.abi3.so (1.1 GB of FlashAttention 3 for sm_80/86/90a, on no Blackwell path) is
    removed in the same step, so the image stays ~300 MB above its base. Pushed to the loopback registry as
    `REGISTRY/qualify-test/external-sglang:<target>-<checkout>`."""
    key = ("sglang", target)
    if key not in _CACHE:
        base = external(target, "3.8.0", tmp_dir, registry)
        ctx = tmp_dir / f"sglang-{target}"
        _sglang_wheels(target, ctx / "wheels")
        tf = targets.load()
        site = SGLANG_SITE.format(python=tf.get(target).python_for("hermetic", tf.hermetic))
        (ctx / "Dockerfile").write_text(
            f"FROM {base}\n"
            "RUN --mount=type=bind,source=wheels,target=/tmp/wheels /opt/venv/bin/pip install --no-index --no-deps "
            "--no-cache-dir --disable-pip-version-check /tmp/wheels/*.whl \\\n"
            f" && rm {site}/sgl_kernel/flash_ops.abi3.so\n")
        tag = f"{registry}/qualify-test/external-sglang:{target}-{CHECKOUT}"
        _build_and_push(ctx, tag, target)
        _CACHE[key] = tag
    return _CACHE[key]
