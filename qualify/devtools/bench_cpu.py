"""`nox -s bench-cpu`: the cpu target on this host, measured: image size, build time, server start to /health
(cold: an empty compile cache; warm: the cache the first start left), memory while serving.

The server runs with the compose file's own command and environment (deploy/compose.py), serving the tiny
model (`qualify tiny-model`) from a read-only bind, offline, on loopback; the container and its cache volume
are removed afterwards. The build figures are the newest build record's (`nox -s build-cpu -- --base
hermetic` writes it); `--build` builds first.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import List, Optional, Tuple

from qualify.config import targets
from qualify.core.report import emit
from qualify.deploy import api, compose
from qualify.host import tables
from qualify.host.engine import Engine
from qualify.imagebuild import image

HEALTH_LIMIT_S = 900


def _docker(engine: Engine, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([engine.binary, *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_once(engine: Engine, ref: str, model: Path, volume: str, target: targets.Target) -> Tuple[float, str, str]:
    """(seconds from `run` to /health, memory while serving, the canary's answer)."""
    port = _free_port()
    spec = compose.ComposeSpec(image=ref, target=target.name, model="", revision="", served_model_name="tiny",
                               gpu_memory_utilization=target.runtime.gpu_memory_utilization, max_model_len=8192,
                               gpu_runtime="cpu", port=port, tool_call_parser="hermes", model_path=str(model),
                               cpu_kv_cache_gib=target.runtime.kv_cache_gib)
    service = compose.compose_document(spec)["services"][compose.SERVICE]
    name = f"bench-cpu-{uuid.uuid4().hex[:8]}"
    argv = ["run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:{compose.CONTAINER_PORT}", "--shm-size",
            spec.shm_size, "-v", f"{volume}:{compose.VLLM_CACHE}", "-v", f"{model}:{compose.MODEL_DIR}:ro",
            "--entrypoint", service["entrypoint"][0]]
    for key, value in service["environment"].items():
        argv += ["-e", f"{key}={value}"]
    argv += [ref, *service["entrypoint"][1:], *service["command"]]
    began = time.monotonic()
    started = _docker(engine, *argv)
    if started.returncode != 0:
        raise SystemExit(f"bench-cpu: docker run failed: {started.stderr.strip()}")
    url = f"http://127.0.0.1:{port}"
    try:
        while not api.health(url).ok:
            if time.monotonic() - began > HEALTH_LIMIT_S:
                raise SystemExit(f"bench-cpu: no /health within {HEALTH_LIMIT_S} s")
            if _docker(engine, "inspect", "-f", "{{.State.Running}}", name).stdout.strip() != "true":
                raise SystemExit("bench-cpu: the server exited:\n" + _docker(engine, "logs", "--tail", "30", name).stderr)
            time.sleep(0.5)
        healthy = time.monotonic() - began
        answer = api.canary(url, "tiny").detail
        api.throughput(url, "tiny")
        memory = _docker(engine, "stats", "--no-stream", "--format", "{{.MemUsage}}", name).stdout.strip()
        return healthy, memory, answer
    finally:
        _docker(engine, "rm", "-f", name)


def model_folder(given: Optional[Path], tmp: Path) -> Path:
    if given:
        return given.absolute()
    from qualify.tinymodel import write

    out = tmp / "tiny-model"
    write.make(out, say=lambda line: print(f"[bench-cpu] {line}", flush=True))
    return out


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="nox -s bench-cpu --", description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a model folder (default: a tiny model made for the run)")
    parser.add_argument("--build", action="store_true", help="build the image first (nox -s build-cpu's build)")
    parser.add_argument("--engine", default="docker")
    args = parser.parse_args(argv)
    tf = targets.load()
    target = tf.get("cpu")
    if args.build:
        image.build(tf, image.BuildOptions(target="cpu", base="hermetic", engine=args.engine))
    record = image.load_record("cpu", "vllm", "hermetic")
    if record is None:
        emit("bench-cpu: no build of the cpu target here: run `nox -s build-cpu -- --base hermetic` (or --build)")
        return 2
    engine = Engine(args.engine).check()
    size = _docker(engine, "image", "inspect", "-f", "{{.Size}}", record.image_tag).stdout.strip()
    rows = [["image size", f"{int(size) / 1e9:.2f} GB" if size.isdigit() else "unknown", record.image_reference],
            ["build", f"{record.build_seconds:.0f} s", ", ".join(f"{k} {v:g} s" for k, v in record.steps.items())]]
    volume = f"bench-cpu-cache-{os.getpid()}"
    with tempfile.TemporaryDirectory(prefix="bench-cpu-") as tmp:
        model = model_folder(args.model, Path(tmp))
        os.chmod(tmp, 0o755)
        try:
            for run in ("cold", "warm"):
                seconds, memory, answer = start_once(engine, record.image_reference, model, volume, target)
                rows.append([f"start to /health ({run})", f"{seconds:.1f} s",
                             "empty compile cache" if run == "cold" else "the compile cache the cold start left"])
                rows.append([f"memory while serving ({run})", memory.split("/")[0].strip(), f"docker stats; {answer}"])
        finally:
            _docker(engine, "volume", "rm", "-f", volume)
    print(tables.table(rows, ["cpu target", "measured", "note"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
