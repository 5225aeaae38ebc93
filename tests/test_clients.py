"""host/clients.py: the one place the engine's programs are found (house rule 'clients')."""

import os
from pathlib import Path

import pytest

from qualify.core.errors import EngineError
from qualify.host import clients


def _program(folder: Path, name: str, body: str = "exit 0") -> Path:
    p = folder / name
    p.write_text(f"#!/bin/sh\n{body}\n")
    p.chmod(0o755)
    return p


def test_one_list_in_one_order_each_client_once(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mine = _program(bin_dir, "docker")
    monkeypatch.setenv("PATH", str(bin_dir))
    found = clients.clients("docker")
    assert found[0] == str(mine)  # PATH's first: the deploy asks it first
    debian = os.path.exists(clients.DEBIAN_DOCKER)
    assert found[1:] == ([clients.DEBIAN_DOCKER] if debian else [])
    # A build prefers Debian's client when there is one (BuildKit), else the one on PATH.
    assert clients.build_client("docker") == (clients.DEBIAN_DOCKER if debian else str(mine))
    (bin_dir / "docker").unlink()
    if debian:  # PATH's docker being Debian's is listed once
        (bin_dir / "docker").symlink_to(clients.DEBIAN_DOCKER)
        assert clients.clients("docker") == [str(bin_dir / "docker")]
    assert clients.clients("podman") == []
    with pytest.raises(EngineError, match="podman is not installed"):
        clients.build_client("podman")
    with pytest.raises(EngineError, match="unknown container engine 'nerdctl'"):
        clients.clients("nerdctl")


def test_the_first_client_that_answers_and_compose_from_any(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _program(bin_dir, "podman", 'echo "cannot connect to podman" >&2; exit 125')
    monkeypatch.setenv("PATH", str(bin_dir))
    cli, error = clients.answering("podman")
    assert cli is None and "cannot connect to podman" in error
    assert clients.compose("podman") is None
    _program(bin_dir, "podman")
    _program(bin_dir, "podman-compose")
    assert clients.answering("podman") == (str(bin_dir / "podman"), "")
    assert clients.compose("podman") == ("podman-compose",)


def test_cdi_specs_that_name_nvidia_gpus_only(tmp_path):
    (tmp_path / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n")
    (tmp_path / "other.json").write_text('{"kind": "vendor.example/fpga"}')
    (tmp_path / "notes.txt").write_text("nvidia.com/gpu")  # not a spec's name
    assert clients.cdi_spec_files([tmp_path, tmp_path / "absent"]) == [tmp_path / "nvidia.yaml"]
