"""TEST DOUBLE for huggingface_hub in the stand-in image (tests/standin/Dockerfile): hf_hub_download hands out
the files under /opt/standin/hub/<repo id>/ (tests/standin/hub/ here) instead of the Hugging Face Hub, which
this machine cannot reach. It answers only what the deploy's one-shot config read asks (deploy/pathgate.py)."""

import os

from huggingface_hub.errors import EntryNotFoundError

ROOT = "/opt/standin/hub"


def hf_hub_download(repo_id, filename, *, revision=None, **_):
    path = os.path.join(ROOT, repo_id, filename)
    if ".." in repo_id.split("/") or not os.path.isfile(path):
        raise EntryNotFoundError(f"stand-in hub: {repo_id}@{revision}: no {filename}")
    return path
